//! The medium region: address space taken a segment at a time, as the
//! medium working set grows, kept for the process's life.
//!
//! **Where.** At the first medium request a place for the whole region
//! ([`REGION_MAX`], 128 GiB) is chosen far from where the kernel puts
//! mappings of its own choosing (from 1 TiB up, below 8 TiB, at a
//! randomized multiple of 128 GiB: the kernel fills the address space from
//! near 128 TiB down, the program and its `brk` heap sit near 94 TiB or
//! below 4 GiB), and only its first segment ([`SEG`], 64 MiB) is mapped
//! there, with `MAP_FIXED_NOREPLACE` (never over anything). Each growth
//! maps the next segment right after the last ([`grow`]): the region stays
//! one range, so telling whether a freed pointer is a medium block is
//! still one subtraction and a comparison. A growth the kernel refuses
//! (the place taken by then, an `RLIMIT_AS` reached, no memory to commit)
//! leaves the region as it is, and medium requests beyond it go to the
//! functions beneath the hooks.
//!
//! **What is charged.** Each segment is `mmap(PROT_READ | PROT_WRITE,
//! MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)`: under `ulimit -v`
//! (`RLIMIT_AS`) the segments mapped so far count, at most one segment
//! more than the medium blocks ever live at once need; under the default
//! overcommit heuristic nothing is charged until a page is written; under
//! strict overcommit (`vm.overcommit_memory=2`, where the kernel ignores
//! `MAP_NORESERVE`) every mapped segment is charged whole against the
//! commit limit, as glibc's arenas are.
//!
//! **Elsewhere.** Where no place can be had that way (a kernel without
//! `MAP_FIXED_NOREPLACE`, which maps elsewhere instead and is undone; an
//! address space below 8 TiB; valgrind's), the region is one reservation
//! made whole, as before segments: 128 GiB, halving down to 1 GiB where
//! the kernel refuses; it does not grow.
//!
//! Adjacent segments with the same protection and flags are one mapping
//! to the kernel (its VMAs merge), and `madvise(MADV_DONTNEED)` and
//! `MADV_NOHUGEPAGE` (given to each segment whole: with THP `always`, a
//! huge page over small blocks would make every written byte cost 2 MiB
//! and every purge split it) split none: the region counts as one mapping
//! against the crate's share of the kernel's mapping limit (`map_limit`).

#[cfg(not(miri))]
use core::ptr;

use super::heap::{REGION_MAX, SEG, SPAN};

/// The smallest region tried where it is reserved whole (1 GiB).
const REGION_MIN: usize = 1 << 30;

/// Where the places tried start (1 TiB) and how many there are (128 GiB
/// apart, up to 8 TiB).
#[cfg(not(miri))]
const HINT_BASE: usize = 1 << 40;
#[cfg(not(miri))]
const HINT_SLOTS: usize = (7 << 40) / REGION_MAX;

/// Places tried before the region is reserved whole instead.
#[cfg(not(miri))]
const HINT_TRIES: usize = 8;

/// A fresh region: its start, the length mapped, and whether it may grow;
/// `None` if the kernel refuses even [`REGION_MIN`], or the crate keeps as
/// many mappings as it may.
#[cfg(not(miri))]
pub(super) fn reserve() -> Option<(*mut u8, usize, bool)> {
    if !super::super::map_limit::claim() {
        return None;
    }
    // A seed that differs between processes and runs: the clock and where
    // the stack and this code lie (ASLR), mixed.
    let here = 0u8;
    let mut x = (crate::sys::now_ms() as u64)
        ^ (ptr::from_ref(&here).addr() as u64).rotate_left(17)
        ^ (reserve as fn() -> _ as usize as u64).rotate_left(41);
    for _ in 0..HINT_TRIES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = HINT_BASE + (x as usize % HINT_SLOTS) * REGION_MAX;
        // SAFETY: MAP_FIXED_NOREPLACE maps nothing over an existing
        // mapping; a kernel that ignores the flag maps elsewhere, undone.
        if unsafe { map_at(at as *mut u8) } {
            return Some((at as *mut u8, SEG, true));
        }
    }
    reserve_whole().map(|(p, len)| (p, len, false))
}

/// Maps the segment `[at, at + SEG)`, never over an existing mapping:
/// `true` if it is ours now (reading zero, every block span marked
/// inaccessible to memcheck).
///
/// # Safety
/// Nothing of the process relies on `[at, at + SEG)` being unmapped.
#[cfg(not(miri))]
unsafe fn map_at(at: *mut u8) -> bool {
    // SAFETY: an anonymous private mapping that replaces nothing.
    let p = unsafe {
        libc::mmap(
            at.cast(),
            SEG,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    if p.cast::<u8>() != at {
        // A kernel older than MAP_FIXED_NOREPLACE took the address as a
        // hint and mapped elsewhere: not the region's place.
        // SAFETY: the mapping just made, used by nobody.
        unsafe { libc::munmap(p, SEG) };
        return false;
    }
    // SAFETY: the whole mapping just made; advice changes no contents.
    // Refused (no THP in the kernel): nothing to avoid.
    unsafe { libc::madvise(p, SEG, libc::MADV_NOHUGEPAGE) };
    // To memcheck, no block is live past the segment's metadata yet.
    super::super::valgrind::mark_noaccess(p.addr() + SPAN, SEG - SPAN);
    true
}

/// The region reserved whole (see the module docs): its start and length.
#[cfg(not(miri))]
fn reserve_whole() -> Option<(*mut u8, usize)> {
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
            // SAFETY: as in `map_at`.
            unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
            // To memcheck, no block is live yet: each segment's metadata
            // span stays accessible.
            for seg in (0..len).step_by(SEG) {
                super::super::valgrind::mark_noaccess(p.addr() + seg + SPAN, SEG - SPAN);
            }
            debug_assert!(len % SEG == 0);
            return Some((p.cast(), len));
        }
        len /= 2;
    }
    super::super::map_limit::release();
    None
}

/// Maps the segment that follows the region's last, at `at`: `true` if
/// it is the region's now (see the module docs).
///
/// # Safety
/// `at` is the end of the region, which [`reserve`] placed there, and
/// the heap's growth is serialized (its rare lock).
#[cfg(not(miri))]
pub(super) unsafe fn grow(at: *mut u8) -> bool {
    // SAFETY: past the region's end; MAP_FIXED_NOREPLACE replaces nothing.
    unsafe { map_at(at) }
}

/// Under Miri there is no region: medium blocks stay off, and requests go
/// to the functions beneath the hooks (the heap's logic is tested on a
/// plain allocation instead).
#[cfg(miri)]
pub(super) fn reserve() -> Option<(*mut u8, usize, bool)> {
    let _ = (REGION_MIN, REGION_MAX, SEG, SPAN);
    None
}

#[cfg(miri)]
pub(super) unsafe fn grow(_at: *mut u8) -> bool {
    false
}

/// Gives back a region that lost the race to be the process's.
///
/// # Safety
/// `[p, p + len)` is a region [`reserve`] made, unused.
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
