//! Chunks from the kernel: anonymous private mappings on 2 MiB
//! boundaries, grown and shrunk with `mremap` (page tables move, bytes are
//! never copied), and given back with `munmap`.
//!
//! A fresh mapping reads as zero: the caller is told, so that a zeroed
//! allocation served by one writes nothing (glibc's `calloc` of a fresh
//! `mmap` chunk does the same).
//!
//! Under Miri, which has no `mremap` or `madvise` and maps no pages, a
//! chunk is one zeroed allocation of the emulated machine's memory
//! (`ffi::kernel_map`, src/ffi/miri/machine.rs) at [`CHUNK_ALIGN`]: nothing is
//! resized in place or moved (the callers then copy), and `lazy_free` keeps
//! the contents. A chunk thus never changes size under Miri, and `unmap`
//! frees it with the layout it was made with.

#[cfg(not(miri))]
use core::ffi::c_void;
use core::ptr;

use super::chunks::CHUNK_ALIGN;
#[cfg(not(miri))]
use super::map_limit;

use super::PAGE;

/// `size` rounded up to whole pages; `None` past what can be mapped.
#[inline]
pub(crate) fn round(size: usize) -> Option<usize> {
    let s = size.checked_add(PAGE - 1)? & !(PAGE - 1);
    (s <= isize::MAX as usize / 2).then_some(s)
}

/// A fresh chunk of `size` bytes (a multiple of [`PAGE`]) on a
/// [`CHUNK_ALIGN`] boundary, or null: also where the crate keeps as many
/// chunks as the kernel's mapping limit allows it (`map_limit`). Its pages
/// read as zero.
#[cfg(not(miri))]
pub(crate) fn map(size: usize) -> *mut u8 {
    let Some(span) = size.checked_add(CHUNK_ALIGN - PAGE) else {
        return ptr::null_mut();
    };
    if !map_limit::claim() {
        return ptr::null_mut();
    }
    let base = raw_map(span);
    if base.is_null() {
        map_limit::release();
        return base;
    }
    let addr = base as usize;
    let start = addr.next_multiple_of(CHUNK_ALIGN);
    let head = start - addr;
    let tail = span - head - size;
    // SAFETY: [addr, addr + head) and [start + size, addr + span) lie in the
    // mapping just made, which nothing else knows of yet.
    unsafe {
        if head != 0 {
            libc::munmap(base.cast(), head);
        }
        if tail != 0 {
            libc::munmap((start + size) as *mut c_void, tail);
        }
    }
    start as *mut u8
}

#[cfg(not(miri))]
fn raw_map(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choice touches no existing memory.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        p.cast()
    }
}

/// Large-page chunks exist on Windows only (see `map_windows.rs`): on
/// Linux huge pages are advised instead, so there is never one here.
#[inline(always)]
pub(crate) fn map_large(_size: usize) -> (*mut u8, usize) {
    (ptr::null_mut(), 0)
}

/// Gives the chunk back to the kernel.
///
/// # Safety
/// `[p, p + size)` is a chunk of the crate's that nothing uses any more.
#[cfg(not(miri))]
pub(crate) unsafe fn unmap(p: *mut u8, size: usize) {
    // SAFETY: the caller's contract: the whole range is ours and unused.
    unsafe { libc::munmap(p.cast(), size) };
    map_limit::release();
}

/// Resizes the chunk `p` of `old` bytes to `new` bytes (multiples of
/// [`PAGE`]) in place: shrinking always works; growing works where the
/// address space after the chunk is free. Returns whether it did.
///
/// # Safety
/// `[p, p + old)` is a live chunk of the crate's.
#[cfg(not(miri))]
pub(crate) unsafe fn resize_in_place(p: *mut u8, old: usize, new: usize) -> bool {
    // SAFETY: without MREMAP_MAYMOVE the mapping keeps its address; a
    // shrink unmaps only the chunk's own tail, a growth takes only free
    // address space (or fails and changes nothing).
    let q = unsafe { libc::mremap(p.cast(), old, new, 0) };
    q != libc::MAP_FAILED
}

/// Gives back the tail `[p + new, p + old)` of the chunk `p` of `old`
/// bytes (both multiples of [`PAGE`]): unmapped, across both mappings of a
/// split chunk (where `mremap` would refuse). Returns whether it did.
///
/// # Safety
/// `[p, p + old)` is a live chunk of the crate's, whose tail past `new`
/// nothing uses.
#[cfg(not(miri))]
pub(crate) unsafe fn trim_tail(p: *mut u8, old: usize, new: usize) -> bool {
    // SAFETY: the caller's contract: the tail is the chunk's own, unused.
    new < old && unsafe { libc::munmap(p.add(new).cast(), old - new) } == 0
}

/// Moves the chunk `p` of `old` bytes onto `target` (2 MiB-aligned), as
/// its first `new >= old` bytes: whatever `target` held there is
/// discarded; pages of `target` past `new` are untouched. Null on failure
/// (the chunk untouched).
///
/// # Safety
/// `[p, p + old)` is a live chunk; `[target, target + new)` is memory of
/// the crate's that nothing uses (a fresh mapping or a cached chunk).
#[cfg(not(miri))]
pub(crate) unsafe fn move_onto(p: *mut u8, old: usize, new: usize, target: *mut u8) -> *mut u8 {
    // SAFETY: the caller's contract: both ranges are the crate's, unused
    // but by this call.
    let q = unsafe {
        libc::mremap(
            p.cast(),
            old,
            new,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            target.cast::<c_void>(),
        )
    };
    if q == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        // The chunk `p` is now part of the chunk at `target`.
        map_limit::release();
        if new > old {
            // Mapped, zero-filled: what memcheck's emulation of this call
            // can miss (see `valgrind`).
            super::valgrind::mark_defined(q.addr() + old, new - old);
        }
        q.cast()
    }
}

/// Tells the kernel it may take the pages of `[p, p + size)` whenever it
/// needs memory (`MADV_FREE`): until it does, they stay mapped and a
/// write reuses them without a fault; once it has, they read as zero.
///
/// # Safety
/// `[p, p + size)` is a chunk of the crate's whose contents nobody needs.
#[cfg(not(miri))]
pub(crate) unsafe fn lazy_free(p: *mut u8, size: usize) {
    // SAFETY: the caller's contract; MADV_FREE changes only what an
    // unused range may read back.
    unsafe { libc::madvise(p.cast(), size, libc::MADV_FREE) };
}

// Under Miri (see the module docs): the emulated machine's memory, and no
// resizing. `resize_in_place` never succeeds, so a registered chunk's size
// is always the size it was allocated with, which `unmap` needs.

#[cfg(miri)]
fn layout(size: usize) -> Option<std::alloc::Layout> {
    std::alloc::Layout::from_size_align(size, CHUNK_ALIGN).ok()
}

#[cfg(miri)]
pub(crate) fn map(size: usize) -> *mut u8 {
    layout(size).map_or(ptr::null_mut(), crate::ffi::kernel_map)
}

#[cfg(miri)]
pub(crate) unsafe fn unmap(p: *mut u8, size: usize) {
    let layout = layout(size).expect("the layout `map` made");
    // SAFETY: the caller's contract: `p` is a chunk `map` made with this
    // layout (chunks never change size under Miri), unused from now on.
    unsafe { crate::ffi::kernel_unmap(p, layout) };
}

#[cfg(miri)]
pub(crate) unsafe fn trim_tail(_p: *mut u8, _old: usize, _new: usize) -> bool {
    false
}

#[cfg(miri)]
pub(crate) unsafe fn resize_in_place(_p: *mut u8, _old: usize, _new: usize) -> bool {
    false
}

#[cfg(miri)]
pub(crate) unsafe fn move_onto(_p: *mut u8, _old: usize, _new: usize, _target: *mut u8) -> *mut u8 {
    ptr::null_mut()
}

#[cfg(miri)]
pub(crate) unsafe fn lazy_free(_p: *mut u8, _size: usize) {}
