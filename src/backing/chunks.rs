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
//! A slot's key is the chunk's address (0: empty); its size (the bytes
//! mapped) and the size MKL last asked for (at most the size: a chunk taken
//! from the cache for a growth may be larger than the request) are written
//! by the thread that claimed the slot before the chunk is handed to MKL, and
//! read only by a thread that MKL gave the pointer to afterwards (which
//! that hand-over orders). Removal stores 0 (release) and a claim is an
//! acquire: the claimer's record comes after the previous owner's in every
//! thread's view (with relaxed orderings the previous owner's size could
//! land last; the loom model found that). Lookups never stop at an empty
//! slot (they scan the whole window), so no tombstones are needed. A chunk
//! whose window is full is not registered: the caller then serves the
//! request from the C runtime instead.
//!
//! The table is a [`Table`]: the process has one (a static, behind the
//! free functions below); a loom model (`loom_tests/chunks.rs`) builds its
//! own, small, and races inserts, lookups of handed-over chunks and
//! removals.

use crate::sync::AtomicUsize;
use crate::sync::Ordering::{Acquire, Relaxed, Release};

/// Every chunk is aligned to this (one x86-64 huge page).
pub(crate) const CHUNK_ALIGN: usize = 2 << 20;

/// Slots in the table: 65 536 live chunks of 1 MiB or more (64 GiB at the
/// least), in 1.5 MiB of zero-initialised static memory, which costs
/// resident memory only where it is touched. Under loom: 8, so that
/// windows overlap and wrap.
const SLOTS: usize = if cfg!(loom) { 8 } else { 1 << 16 };
/// Slots probed per key.
const WINDOW: usize = if cfg!(loom) { 4 } else { 64 };

/// One slot: the key and its record side by side, so that a lookup (and
/// a process's first chunk) touches one cache line and one page.
struct Slot {
    key: AtomicUsize,
    size: AtomicUsize,
    asked: AtomicUsize,
}

/// A table of live chunks (see the module docs).
pub struct Table {
    slots: [Slot; SLOTS],
}

/// A live chunk's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Bytes mapped (a multiple of the page size).
    pub size: usize,
    /// The size MKL last asked for, rounded to pages (`<= size`).
    pub asked: usize,
}

/// The first slot of `addr`'s window (Fibonacci hashing of the chunk's
/// 2 MiB frame number).
#[inline]
pub fn home(addr: usize) -> usize {
    ((addr / CHUNK_ALIGN) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize
        >> (64 - SLOTS.trailing_zeros())
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

impl Table {
    /// An empty table.
    #[cfg(not(loom))]
    const fn new() -> Self {
        Table {
            slots: [const {
                Slot {
                    key: AtomicUsize::new(0),
                    size: AtomicUsize::new(0),
                    asked: AtomicUsize::new(0),
                }
            }; SLOTS],
        }
    }

    /// An empty table (loom's atomics have no `const` constructor).
    #[cfg(loom)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Table {
            slots: core::array::from_fn(|_| Slot {
                key: AtomicUsize::new(0),
                size: AtomicUsize::new(0),
                asked: AtomicUsize::new(0),
            }),
        }
    }

    /// Records the chunk `addr` of `size` bytes, asked for as `asked`;
    /// `false` if its window is full (the chunk is then not the crate's:
    /// the caller unmaps it).
    pub fn insert(&self, addr: usize, size: usize, asked: usize) -> bool {
        debug_assert!(may_be_chunk(addr) && asked <= size);
        for s in window(addr) {
            let slot = &self.slots[s];
            // A compare-and-swap without a load first: a slot's page, the
            // first time a process uses it, then costs one write fault, not
            // a read fault and a write fault (windows are mostly empty).
            if slot.key.compare_exchange(0, addr, Acquire, Relaxed).is_ok() {
                slot.size.store(size, Relaxed);
                slot.asked.store(asked, Relaxed);
                return true;
            }
        }
        false
    }

    /// The slot holding the chunk `addr`, if it is one.
    fn slot(&self, addr: usize) -> Option<&Slot> {
        if !may_be_chunk(addr) {
            return None;
        }
        window(addr)
            .map(|s| &self.slots[s])
            .find(|slot| slot.key.load(Relaxed) == addr)
    }

    /// The record of the chunk `addr`, or `None` if it is not one.
    #[inline]
    pub fn get(&self, addr: usize) -> Option<Chunk> {
        self.slot(addr).map(|slot| Chunk {
            size: slot.size.load(Relaxed),
            asked: slot.asked.load(Relaxed),
        })
    }

    /// Forgets the chunk `addr` and returns its size, or `None` (not a
    /// chunk).
    pub fn remove(&self, addr: usize) -> Option<usize> {
        self.remove_record(addr).map(|c| c.size)
    }

    /// Forgets the chunk `addr` and returns its record, or `None` (not a
    /// chunk).
    pub fn remove_record(&self, addr: usize) -> Option<Chunk> {
        let slot = self.slot(addr)?;
        let c = Chunk {
            size: slot.size.load(Relaxed),
            asked: slot.asked.load(Relaxed),
        };
        slot.key.store(0, Release);
        Some(c)
    }

    /// Records a new record for the live chunk `addr` (after a resize in
    /// place, or a request served within its size).
    pub fn resize(&self, addr: usize, c: Chunk) {
        debug_assert!(c.asked <= c.size);
        if let Some(slot) = self.slot(addr) {
            slot.size.store(c.size, Relaxed);
            slot.asked.store(c.asked, Relaxed);
        }
    }
}

/// The process's table.
#[cfg(not(loom))]
static TABLE: Table = Table::new();

/// Records the chunk `addr` in the process's table (see [`Table::insert`]).
#[cfg(not(loom))]
pub(crate) fn insert(addr: usize, size: usize, asked: usize) -> bool {
    TABLE.insert(addr, size, asked)
}

/// The record of the chunk `addr` (see [`Table::get`]).
#[cfg(not(loom))]
#[inline]
pub(crate) fn get(addr: usize) -> Option<Chunk> {
    TABLE.get(addr)
}

/// Forgets the chunk `addr` (see [`Table::remove`]).
#[cfg(not(loom))]
pub(crate) fn remove(addr: usize) -> Option<usize> {
    TABLE.remove(addr)
}

/// Forgets the chunk `addr`, returning its record (see
/// [`Table::remove_record`]).
#[cfg(not(loom))]
pub(crate) fn remove_record(addr: usize) -> Option<Chunk> {
    TABLE.remove_record(addr)
}

/// A new record for the live chunk `addr` (see [`Table::resize`]).
#[cfg(not(loom))]
pub(crate) fn resize(addr: usize, c: Chunk) {
    TABLE.resize(addr, c)
}

#[cfg(all(test, not(miri), not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn unaligned_and_null_are_never_chunks() {
        assert!(!may_be_chunk(0));
        assert!(!may_be_chunk(CHUNK_ALIGN + 16));
        assert_eq!(get(CHUNK_ALIGN * 3 + 64), None);
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
            assert!(insert(a, (i + 1) << 20, (i + 1) << 20), "slot {i}");
        }
        assert!(
            !insert(addrs[WINDOW], 1 << 20, 1 << 20),
            "the window is full"
        );
        let c = |size, asked| Chunk { size, asked };
        assert_eq!(get(addrs[7]), Some(c(8 << 20, 8 << 20)));
        resize(addrs[7], c(9 << 20, 5 << 20));
        assert_eq!(get(addrs[7]), Some(c(9 << 20, 5 << 20)));
        assert_eq!(remove(addrs[7]), Some(9 << 20));
        assert_eq!(get(addrs[7]), None);
        // The freed slot takes the next chunk; the others are still found.
        assert!(insert(addrs[WINDOW], 1 << 20, 1 << 20));
        for &a in addrs.iter().filter(|&&a| a != addrs[7]) {
            assert!(remove(a).is_some());
        }
    }
}
