//! MKL's service functions emulated over [`std::alloc::System`], for Miri only.
//!
//! Miri interprets Rust and cannot call into a C library, so under
//! `cfg(miri)` (and only there: `src/ffi.rs` declares the real bindings in
//! every other build, and this file is not compiled) [`ffi`](super) is
//! served by this emulation. It keeps MKL's contract as the crate relies on
//! it, so that Miri checks the crate's own code (aliasing, provenance,
//! initialisation, bounds) on top of an allocator that behaves like MKL's:
//!
//! - `MKL_malloc(size, align)`: a block aligned to `align` when `align` is a
//!   power of two, never less than 64 bytes (MKL's default alignment, also
//!   used for an `align` that is not a power of two); null for size 0 and on
//!   failure.
//! - `MKL_calloc(num, size, align)`: the same, zeroed; `num * size` wraps as
//!   in MKL, which does not check it.
//! - `MKL_realloc(ptr, size)`: keeps the block's alignment and its first
//!   `min(old, new)` bytes, always moving the block (the real one moves every
//!   growth beyond the block MKL holds; always moving is the strict case for
//!   Miri: every stale pointer is caught). On failure null, the old block
//!   intact. A null `ptr` is `MKL_malloc(size, 64)`; size 0 frees the block
//!   and returns null, as the C `realloc` MKL forwards to does.
//! - `MKL_free`: frees; null is a no-op.
//! - `MKL_Mem_Stat`: bytes (as requested) and number of live blocks;
//!   `MKL_Peak_Mem_Usage`: MKL's relative peak (growth since enabling,
//!   `-1` while off; reset sets the peak to the current growth).
//! - `MKL_Free_Buffers` / `MKL_Thread_Free_Buffers`: no-ops (nothing is cached).
//! - `MKL_Disable_Fast_MM`: 1 on a first call before any block was
//!   allocated, 0 afterwards (as measured with MKL 2026.2).
//! - `MKL_Set_Memory_Limit`: 0 (accepted, no effect) for `MKL_MEM_MCDRAM`,
//!   -1 for any other memory type.
//!
//! Failure: the emulated machine gives MKL [`MEMORY`] bytes in all (Miri
//! stops the program, rather than returning null, when its host cannot
//! allocate, so requests beyond a fixed budget fail here first, as MKL's
//! would on a machine that size).
//!
//! Each block is laid out as MKL lays out its own: `align` bytes in front of
//! the user's part, whose last 24 bytes hold a header (a mark, the user size and
//! the alignment, checked on free and realloc), all one `System` allocation. Miri therefore
//! reports any access past the user's `size` bytes. Any size, alignment,
//! order of frees and thread is served; the counters are atomics.
#![allow(non_snake_case)]

use core::ffi::{c_int, c_void};
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::alloc::{GlobalAlloc, Layout, System};

use super::{
    MKL_MEM_MCDRAM, MKL_PEAK_MEM, MKL_PEAK_MEM_DISABLE, MKL_PEAK_MEM_ENABLE, MKL_PEAK_MEM_RESET,
};

/// The memory the emulated MKL may hold at once: 4 GiB (blocks and their
/// alignment padding). Larger requests get null, as from a real MKL on a
/// machine that size.
pub const MEMORY: usize = 4 << 30;

/// MKL's default (and minimum) alignment.
const DEFAULT_ALIGN: usize = 64;

/// Marks a live block's header; cleared when the block is freed.
const MAGIC: usize = 0x6d6b_6c5f_6d69_7269; // "mkl_miri"

/// Bytes MKL holds for live blocks (as requested) and how many.
static BYTES: AtomicI64 = AtomicI64::new(0);
static BUFFERS: AtomicI64 = AtomicI64::new(0);
/// Everything `System` holds for the emulation (for the [`MEMORY`] budget).
static RESERVED: AtomicUsize = AtomicUsize::new(0);
/// Peak tracking: on/off, growth since enabling, highest growth.
static TRACKING: AtomicBool = AtomicBool::new(false);
static GROWTH: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);
/// `MKL_Disable_Fast_MM`'s answer depends on these.
static ANY_BLOCK: AtomicBool = AtomicBool::new(false);
static FAST_MM_OFF: AtomicBool = AtomicBool::new(false);

/// The alignment a block gets for a requested `align`.
fn effective_align(align: c_int) -> usize {
    match usize::try_from(align) {
        Ok(a) if a.is_power_of_two() => a.max(DEFAULT_ALIGN),
        _ => DEFAULT_ALIGN,
    }
}

/// The `System` layout of a block: `align` bytes of padding (header at its
/// end), then `size` bytes. `None` if it cannot exist.
fn outer_layout(size: usize, align: usize) -> Option<Layout> {
    let total = size.checked_add(align)?;
    Layout::from_size_align(total, align).ok()
}

/// Counts `size` bytes more (or fewer) in MKL's statistics.
fn account(size: usize, grow: bool) {
    let (delta, blocks) = if grow {
        (size as i64, 1)
    } else {
        (-(size as i64), -1)
    };
    BYTES.fetch_add(delta, Ordering::Relaxed);
    BUFFERS.fetch_add(blocks, Ordering::Relaxed);
    if TRACKING.load(Ordering::Relaxed) {
        let now = GROWTH.fetch_add(delta, Ordering::Relaxed) + delta;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

/// Takes `bytes` from the budget; false (nothing taken) if it is exhausted.
fn reserve(bytes: usize) -> bool {
    RESERVED
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            held.checked_add(bytes).filter(|&total| total <= MEMORY)
        })
        .is_ok()
}

/// A fresh block of `size` bytes aligned to `align`, zeroed or not.
fn allocate(size: usize, align: usize, zeroed: bool) -> *mut c_void {
    if size == 0 {
        return ptr::null_mut();
    }
    let Some(layout) = outer_layout(size, align) else {
        return ptr::null_mut();
    };
    if !reserve(layout.size()) {
        return ptr::null_mut();
    }
    // SAFETY: the layout's size is at least `align` ≥ 64 > 0.
    let base = unsafe {
        if zeroed {
            System.alloc_zeroed(layout)
        } else {
            System.alloc(layout)
        }
    };
    if base.is_null() {
        RESERVED.fetch_sub(layout.size(), Ordering::Relaxed);
        return ptr::null_mut();
    }
    // SAFETY: the block holds `align` ≥ 64 bytes of padding before the
    // user's part; the header's three words are the last 24 of them, and
    // `user` is aligned to `align`, so `user - 24` is aligned for usize.
    unsafe {
        let user = base.add(align);
        header(user).write([MAGIC, size, align]);
        ANY_BLOCK.store(true, Ordering::Relaxed);
        account(size, true);
        user.cast()
    }
}

/// The header of the block whose user part starts at `user`.
///
/// # Safety
/// `user` is a block from [`allocate`] (live or not, for reading it must be live).
unsafe fn header(user: *mut u8) -> *mut [usize; 3] {
    // SAFETY: the caller's block has `align` ≥ 64 bytes in front of `user`.
    unsafe { user.sub(3 * size_of::<usize>()).cast() }
}

/// The user size and alignment of a live block; aborts on a pointer that is
/// not one (a double free or a foreign pointer: Miri would otherwise report
/// it less clearly, or not at all).
///
/// # Safety
/// `user` points into memory Miri can read 24 bytes in front of.
unsafe fn live_block(user: *mut u8) -> (usize, usize) {
    // SAFETY: the caller's contract.
    let [magic, size, align] = unsafe { header(user).read() };
    if magic != MAGIC || !align.is_power_of_two() || user.addr() % align != 0 {
        panic!("MKL emulation (Miri): {user:p} is not a live MKL block (double free?)");
    }
    (size, align)
}

/// Frees the block at `user` of the given size and alignment.
///
/// # Safety
/// A live block from [`allocate`], not used again.
unsafe fn release(user: *mut u8, size: usize, align: usize) {
    let layout = outer_layout(size, align).expect("the layout the block was made with");
    // SAFETY: the header lies inside the block; the base is `align` bytes
    // in front of the user's part, and the layout the block was made with.
    unsafe {
        header(user).write([0, 0, 0]);
        System.dealloc(user.sub(align), layout);
    }
    RESERVED.fetch_sub(layout.size(), Ordering::Relaxed);
    account(size, false);
}

/// `void* MKL_malloc(size_t size, int align)`.
///
/// # Safety
/// None beyond MKL's (kept for the bindings' signature).
pub unsafe fn MKL_malloc(size: usize, align: c_int) -> *mut c_void {
    allocate(size, effective_align(align), false)
}

/// `void* MKL_calloc(size_t num, size_t size, int align)`: `num * size` wraps.
///
/// # Safety
/// None beyond MKL's.
pub unsafe fn MKL_calloc(num: usize, size: usize, align: c_int) -> *mut c_void {
    allocate(num.wrapping_mul(size), effective_align(align), true)
}

/// `void* MKL_realloc(void *ptr, size_t size)`.
///
/// # Safety
/// `ptr` is null or a live block from this emulation.
pub unsafe fn MKL_realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    let user = ptr.cast::<u8>();
    if user.is_null() {
        return allocate(size, DEFAULT_ALIGN, false);
    }
    // SAFETY: a live block (caller's contract).
    let (old, align) = unsafe { live_block(user) };
    if size == 0 {
        // SAFETY: as above; the caller gives the block up.
        unsafe { release(user, old, align) };
        return ptr::null_mut();
    }
    let new = allocate(size, align, false).cast::<u8>();
    if !new.is_null() {
        // SAFETY: two distinct blocks holding at least min(old, size) bytes;
        // the old one is freed once and the caller drops its pointer.
        unsafe {
            ptr::copy_nonoverlapping(user, new, old.min(size));
            release(user, old, align);
        }
    }
    new.cast()
}

/// `void MKL_free(void *ptr)`.
///
/// # Safety
/// `ptr` is null or a live block from this emulation, not used again.
pub unsafe fn MKL_free(ptr: *mut c_void) {
    let user = ptr.cast::<u8>();
    if user.is_null() {
        return;
    }
    // SAFETY: a live block (caller's contract).
    unsafe {
        let (size, align) = live_block(user);
        release(user, size, align);
    }
}

/// `MKL_INT64 MKL_Mem_Stat(int* nbuffers)`.
///
/// # Safety
/// `nbuffers` is valid for one write.
pub unsafe fn MKL_Mem_Stat(nbuffers: *mut c_int) -> i64 {
    let buffers = BUFFERS.load(Ordering::Relaxed);
    // SAFETY: the caller's contract.
    unsafe { nbuffers.write(buffers.clamp(0, c_int::MAX as i64) as c_int) };
    BYTES.load(Ordering::Relaxed)
}

/// `MKL_INT64 MKL_Peak_Mem_Usage(int reset)`.
///
/// # Safety
/// None.
pub unsafe fn MKL_Peak_Mem_Usage(reset: c_int) -> i64 {
    match reset {
        MKL_PEAK_MEM_ENABLE => {
            GROWTH.store(0, Ordering::Relaxed);
            PEAK.store(0, Ordering::Relaxed);
            TRACKING.store(true, Ordering::Relaxed);
            0
        }
        MKL_PEAK_MEM_DISABLE => {
            TRACKING.store(false, Ordering::Relaxed);
            0
        }
        _ if !TRACKING.load(Ordering::Relaxed) => -1,
        MKL_PEAK_MEM => PEAK.load(Ordering::Relaxed),
        MKL_PEAK_MEM_RESET => PEAK.swap(GROWTH.load(Ordering::Relaxed), Ordering::Relaxed),
        _ => -1,
    }
}

/// `void MKL_Free_Buffers(void)`: nothing is cached, nothing to do.
///
/// # Safety
/// None.
pub unsafe fn MKL_Free_Buffers() {}

/// `void MKL_Thread_Free_Buffers(void)`: nothing is cached, nothing to do.
///
/// # Safety
/// None.
pub unsafe fn MKL_Thread_Free_Buffers() {}

/// `int MKL_Disable_Fast_MM(void)`: 1 only for a first call before any block.
///
/// # Safety
/// None.
pub unsafe fn MKL_Disable_Fast_MM() -> c_int {
    let first = !ANY_BLOCK.load(Ordering::Relaxed) && !FAST_MM_OFF.swap(true, Ordering::Relaxed);
    c_int::from(first)
}

/// `int MKL_Set_Memory_Limit(int mem_type, size_t limit)`: accepted for MCDRAM.
///
/// # Safety
/// None.
pub unsafe fn MKL_Set_Memory_Limit(mem_type: c_int, _limit: usize) -> c_int {
    if mem_type == MKL_MEM_MCDRAM { 0 } else { -1 }
}
