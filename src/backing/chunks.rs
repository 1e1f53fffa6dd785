//! Which pointers MKL hands back are the crate's chunks, and their sizes.
//!
//! The hooks beneath MKL see every block MKL frees or resizes, most of them
//! the C runtime's (small blocks, and blocks MKL had before the hooks were
//! set). Ownership is decided without reading memory outside the crate's
//! own chunks, in two steps:
//!
//! 1. Every chunk starts on a 2 MiB boundary ([`CHUNK_ALIGN`]). A pointer
//!    that does not is not a chunk: one `and` and a comparison, which is
//!    all that almost every free of a small block pays.
//! 2. An aligned pointer is looked up in a fixed table of live chunks:
//!    open addressing over atomic words, each key probed in a window of
//!    [`WINDOW`] slots from its hash. No lock, no allocation, nothing to
//!    repair after a `fork` (a slot is claimed by one compare-and-swap).
//!
//! A slot's key is the chunk's address (0: empty); its size is written by
//! the thread that claimed the slot before the chunk is handed to MKL, and
//! read only by a thread that MKL gave the pointer to afterwards (which
//! that hand-over orders). Removal stores 0; lookups never stop at an empty
//! slot (they scan the whole window), so no tombstones are needed. A chunk
//! whose window is full is not registered: the caller then serves the
//! request from the C runtime instead.

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Every chunk is aligned to this (one x86-64 huge page).
pub(crate) const CHUNK_ALIGN: usize = 2 << 20;

/// Slots in the table: 65 536 live chunks of 1 MiB or more (64 GiB at the
/// least), in 1 MiB of zero-initialised static memory, which costs
/// resident memory only where it is touched.
const SLOTS: usize = 1 << 16;
/// Slots probed per key.
const WINDOW: usize = 64;

struct Table {
    keys: [AtomicUsize; SLOTS],
    sizes: [AtomicUsize; SLOTS],
}

static TABLE: Table = Table {
    keys: [const { AtomicUsize::new(0) }; SLOTS],
    sizes: [const { AtomicUsize::new(0) }; SLOTS],
};

/// The first slot of `addr`'s window (Fibonacci hashing of the chunk's
/// 2 MiB frame number).
#[inline]
fn home(addr: usize) -> usize {
    ((addr / CHUNK_ALIGN) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> (64 - 16)
}

#[inline]
fn window(addr: usize) -> impl Iterator<Item = usize> {
    let h = home(addr);
    (0..WINDOW).map(move |i| (h + i) & (SLOTS - 1))
}

/// Whether `addr` can be a chunk at all (step 1): no memory is read.
#[inline(always)]
pub(crate) fn may_be_chunk(addr: usize) -> bool {
    addr & (CHUNK_ALIGN - 1) == 0 && addr != 0
}

/// Records the chunk `addr` of `size` bytes; `false` if its window is
/// full (the chunk is then not the crate's: the caller unmaps it).
pub(crate) fn insert(addr: usize, size: usize) -> bool {
    debug_assert!(may_be_chunk(addr));
    for s in window(addr) {
        if TABLE.keys[s].load(Relaxed) == 0
            && TABLE.keys[s]
                .compare_exchange(0, addr, Relaxed, Relaxed)
                .is_ok()
        {
            TABLE.sizes[s].store(size, Relaxed);
            return true;
        }
    }
    false
}

/// The slot holding the chunk `addr`, if it is one.
fn slot(addr: usize) -> Option<usize> {
    if !may_be_chunk(addr) {
        return None;
    }
    window(addr).find(|&s| TABLE.keys[s].load(Relaxed) == addr)
}

/// The size of the chunk `addr`, or `None` if it is not one of the crate's.
#[inline]
pub(crate) fn size_of(addr: usize) -> Option<usize> {
    slot(addr).map(|s| TABLE.sizes[s].load(Relaxed))
}

/// Forgets the chunk `addr` and returns its size, or `None` (not a chunk).
pub(crate) fn remove(addr: usize) -> Option<usize> {
    let s = slot(addr)?;
    let size = TABLE.sizes[s].load(Relaxed);
    TABLE.keys[s].store(0, Relaxed);
    Some(size)
}

/// Records a new size for the live chunk `addr` (after a resize in place).
pub(crate) fn resize(addr: usize, size: usize) {
    if let Some(s) = slot(addr) {
        TABLE.sizes[s].store(size, Relaxed);
    }
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    #[test]
    fn unaligned_and_null_are_never_chunks() {
        assert!(!may_be_chunk(0));
        assert!(!may_be_chunk(CHUNK_ALIGN + 16));
        assert_eq!(size_of(CHUNK_ALIGN * 3 + 64), None);
    }

    #[test]
    fn insert_find_remove_and_a_full_window() {
        // Addresses beyond the user address space (no real chunk is
        // there) that share one home slot.
        let base = 1usize << 48;
        let h = home(base);
        let addrs: Vec<usize> = (0..)
            .map(|i| base + i * CHUNK_ALIGN)
            .filter(|&a| home(a) == h)
            .take(WINDOW + 1)
            .collect();
        for (i, &a) in addrs[..WINDOW].iter().enumerate() {
            assert!(insert(a, (i + 1) << 20), "slot {i}");
        }
        assert!(!insert(addrs[WINDOW], 1 << 20), "the window is full");
        assert_eq!(size_of(addrs[7]), Some(8 << 20));
        resize(addrs[7], 9 << 20);
        assert_eq!(remove(addrs[7]), Some(9 << 20));
        assert_eq!(size_of(addrs[7]), None);
        // The freed slot takes the next chunk; the others are still found.
        assert!(insert(addrs[WINDOW], 1 << 20));
        for &a in addrs.iter().filter(|&&a| a != addrs[7]) {
            assert!(remove(a).is_some());
        }
    }
}
