//! The medium region: one reservation of address space, made at the first
//! medium request, kept for the process's life.
//!
//! `mmap(PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
//! MAP_NORESERVE)` of 64 GiB, halving down to 1 GiB where the kernel
//! refuses (an `RLIMIT_AS`, strict overcommit, valgrind): address space
//! only, no page is resident until a block is written. One mapping, and it
//! stays one: `madvise(MADV_DONTNEED)` and `MADV_NOHUGEPAGE` over the
//! whole region split no mapping (the advice is given once, whole: with
//! THP `always`, a huge page over small blocks would make every written
//! byte cost 2 MiB and every purge split it). It counts as one against the
//! crate's share of the kernel's mapping limit (`map_limit`).

#[cfg(not(miri))]
use core::ptr;

use super::heap::{REGION_MAX, SPAN, meta_spans};

/// The smallest region tried (1 GiB).
const REGION_MIN: usize = 1 << 30;

/// A fresh reservation and its length; `None` if the kernel refuses even
/// [`REGION_MIN`], or the crate keeps as many mappings as it may.
#[cfg(not(miri))]
pub(super) fn reserve() -> Option<(*mut u8, usize)> {
    if !super::super::map_limit::claim() {
        return None;
    }
    let mut len = REGION_MAX;
    while len >= REGION_MIN {
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choice touches no existing memory.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            // SAFETY: the whole mapping just made; advice changes no
            // contents. Refused (no THP in the kernel): nothing to avoid.
            unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
            // To memcheck, no block is live past the metadata yet.
            let meta = meta_spans(len) * SPAN;
            super::super::valgrind::mark_noaccess(p.addr() + meta, len - meta);
            debug_assert!(len % SPAN == 0);
            return Some((p.cast(), len));
        }
        len /= 2;
    }
    super::super::map_limit::release();
    None
}

/// Under Miri there is no region: medium blocks stay off, and requests go
/// to the functions beneath the hooks (the heap's logic is tested on a
/// plain allocation instead).
#[cfg(miri)]
pub(super) fn reserve() -> Option<(*mut u8, usize)> {
    let _ = (REGION_MIN, REGION_MAX, SPAN, meta_spans);
    None
}

/// Gives back a reservation that lost the race to be the region.
///
/// # Safety
/// `[p, p + len)` is a reservation [`reserve`] made, unused.
#[cfg(not(miri))]
pub(super) unsafe fn unreserve(p: *mut u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { libc::munmap(p.cast(), len) };
    super::super::map_limit::release();
}

#[cfg(miri)]
pub(super) unsafe fn unreserve(_p: *mut u8, _len: usize) {}

/// Returns the pages of `[p, p + len)` to the kernel (`MADV_DONTNEED`: the
/// resident set drops at once, and the pages read as zero afterwards).
///
/// # Safety
/// The range is page-aligned free blocks of the region, unused.
#[cfg(not(miri))]
pub(super) unsafe fn purge(p: *mut u8, len: usize) {
    // SAFETY: the caller's contract: private anonymous memory of ours
    // whose contents nobody needs.
    // (Free blocks stay inaccessible to memcheck: the block that reuses
    // them is handed out as reading zero, see `medium::alloc`.)
    let r = unsafe { libc::madvise(p.cast(), len, libc::MADV_DONTNEED) };
    if r != 0 {
        // Never expected; zero the block so that "clean" stays true.
        super::super::valgrind::mark_defined(p.addr(), len);
        // SAFETY: as above, ours to write.
        unsafe { p.write_bytes(0, len) };
        super::super::valgrind::mark_noaccess(p.addr(), len);
    }
}

#[cfg(miri)]
pub(super) unsafe fn purge(p: *mut u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { p.write_bytes(0, len) };
}
