//! The emulated machine: its memory (the [`MEMORY`] budget every
//! allocation of the emulation is taken from, over `System`), the kernel's
//! maps for the backing's chunks (`kernel_map`, which `backing::map` takes
//! under Miri), and stand-ins for the C runtime's `malloc` & co., which
//! MKL's memory pointers point at by default (see [`large`](super::large)).

use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::alloc::{GlobalAlloc, Layout, System};

/// The memory the emulated MKL may hold at once: 16 GiB (blocks, the room
/// behind them in `in-place` mode, and placements being retried). Larger
/// requests get null, as from a real MKL on a machine that size.
pub const MEMORY: usize = 16 << 30;

/// The header of the C runtime's stand-ins (their blocks' size), which
/// also keeps their blocks 16-aligned, as glibc's are.
pub(super) const C_HEADER: usize = 16;

/// The largest alignment `System` takes under Miri (rustc's largest
/// alignment; Miri stops with an internal error beyond it).
pub(super) const SYSTEM_MAX_ALIGN: usize = 1 << 29;

/// Everything `System` holds for the emulation (for the [`MEMORY`] budget).
static RESERVED: AtomicUsize = AtomicUsize::new(0);

/// Takes `bytes` from the budget; false (nothing taken) if it is exhausted.
fn reserve(bytes: usize) -> bool {
    RESERVED
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            held.checked_add(bytes).filter(|&total| total <= MEMORY)
        })
        .is_ok()
}

/// One `System` allocation of `layout` (non-zero size) within the budget,
/// zeroed or not; `None` if the budget or `System` has no room.
pub(super) fn system_alloc(layout: Layout, zeroed: bool) -> Option<*mut u8> {
    if !reserve(layout.size()) {
        return None;
    }
    // SAFETY: a non-zero size (the caller's), an alignment Miri takes.
    let p = unsafe {
        if zeroed {
            System.alloc_zeroed(layout)
        } else {
            System.alloc(layout)
        }
    };
    if p.is_null() {
        RESERVED.fetch_sub(layout.size(), Ordering::Relaxed);
        return None;
    }
    Some(p)
}

/// Frees what [`system_alloc`] returned, through `via` (a pointer to its
/// start whose provenance may free it), and gives the bytes back to the
/// budget.
///
/// # Safety
/// `via` points at the start of a live allocation of `layout` from
/// [`system_alloc`], not used again.
pub(super) unsafe fn system_free(via: *mut u8, layout: Layout) {
    // SAFETY: the caller's contract.
    unsafe { System.dealloc(via, layout) };
    RESERVED.fetch_sub(layout.size(), Ordering::Relaxed);
}

/// The C runtime's `malloc` (or `calloc`: `zeroed`), in the emulated
/// machine's memory: 16-aligned, uninitialised, the allocation's size in a
/// header in front; null when the memory is exhausted.
fn c_alloc(n: usize, zeroed: bool) -> *mut c_void {
    let Some(layout) = n
        .checked_add(C_HEADER)
        .and_then(|total| Layout::from_size_align(total, C_HEADER).ok())
    else {
        return ptr::null_mut();
    };
    let Some(base) = system_alloc(layout, zeroed) else {
        return ptr::null_mut();
    };
    // SAFETY: the allocation holds C_HEADER + n bytes, 16-aligned: the
    // header is a usize at its start, the block follows.
    unsafe {
        base.cast::<usize>().write(layout.size());
        base.add(C_HEADER).cast()
    }
}

/// The layout of the stand-ins' allocation behind the block `p`, and its
/// start.
///
/// # Safety
/// `p` is a live block of [`c_alloc`] (its pointer, with the
/// allocation's provenance).
unsafe fn c_block(p: *mut c_void) -> (*mut u8, Layout) {
    // SAFETY: the caller's contract: the header is C_HEADER bytes before
    // `p`, in the same allocation, written by c_alloc.
    unsafe {
        let base = p.cast::<u8>().sub(C_HEADER);
        let total = base.cast::<usize>().read();
        (base, Layout::from_size_align_unchecked(total, C_HEADER))
    }
}

/// `malloc`: the stand-in [`i_malloc`](super::i_malloc) points at by default.
pub(super) unsafe extern "C" fn c_malloc(n: usize) -> *mut c_void {
    c_alloc(n, false)
}

/// `calloc`.
pub(super) unsafe extern "C" fn c_calloc(num: usize, size: usize) -> *mut c_void {
    num.checked_mul(size)
        .map_or(ptr::null_mut(), |n| c_alloc(n, true))
}

/// `free`.
///
/// # Safety
/// `p` is null or a live block of the stand-ins, not used again.
pub(super) unsafe extern "C" fn c_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: the caller's contract; the allocation is freed once.
    unsafe {
        let (base, layout) = c_block(p);
        system_free(base, layout);
    }
}

/// `realloc`: always moves (the strict case); null on failure, the block
/// then intact; size 0 frees and returns null, as glibc's.
///
/// # Safety
/// `p` is null or a live block of the stand-ins.
pub(super) unsafe extern "C" fn c_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        return c_alloc(n, false);
    }
    // SAFETY: the caller's contract.
    let (_, old) = unsafe { c_block(p) };
    if n == 0 {
        // SAFETY: as in c_free.
        unsafe { c_free(p) };
        return ptr::null_mut();
    }
    let q = c_alloc(n, false);
    if !q.is_null() {
        // SAFETY: distinct live blocks of at least min(old, n) bytes; the
        // old one is freed once, after the copy.
        unsafe {
            ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast(), (old.size() - C_HEADER).min(n));
            c_free(p);
        }
    }
    q
}

/// The kernel's memory for the crate's chunks under Miri (`backing::map`):
/// one zeroed allocation of `layout` from the emulated machine's memory
/// (the [`MEMORY`] budget), or null.
pub(crate) fn kernel_map(layout: Layout) -> *mut u8 {
    if layout.size() == 0 {
        return ptr::null_mut();
    }
    system_alloc(layout, true).unwrap_or(ptr::null_mut())
}

/// Gives back what [`kernel_map`] returned.
///
/// # Safety
/// `p` is a live allocation of `kernel_map` made with `layout` (its
/// pointer), not used again.
pub(crate) unsafe fn kernel_unmap(p: *mut u8, layout: Layout) {
    // SAFETY: the caller's contract.
    unsafe { system_free(p, layout) };
}
