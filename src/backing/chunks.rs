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
//! A slot's key also carries a `HELD` bit: a chunk's owner takes it to
//! resize or free the chunk ([`Table::lock`]), and a trim giving slack
//! back takes it without waiting ([`Table::try_lock_slot`]), so that the
//! two never act on one chunk at once (issue 41: the slack of live chunks
//! is given back when the budget is lowered or the buffers are freed).
//!
//! The table is a [`Table`]: the process has one (a static, behind the
//! free functions below); a loom model (`loom_tests/chunks.rs`) builds its
//! own, small, and races inserts, lookups of handed-over chunks and
//! removals.

use crate::sync::AtomicUsize;
use crate::sync::Ordering::{Acquire, Relaxed, Release};

/// Bit 0 of a slot's key: the chunk is held, by its owner resizing or
/// freeing it, or by a trim giving its slack back (`hooks::trim_slack`).
/// An owner waits for a trim (one `munmap`); a trim never waits, it skips
/// a held chunk. So a trim cannot unmap a tail that a growth within the
/// chunk is handing to MKL, nor one that a free is handing to the cache.
const HELD: usize = 1;

/// One wait of a spin on a held slot.
fn spin(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    if *spins < 64 {
        core::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Every chunk is aligned to this (one x86-64 huge page).
pub(crate) const CHUNK_ALIGN: usize = 2 << 20;

/// Slots in the table: 65 536 live chunks of 1 MiB or more (64 GiB at the
/// least), in 1.5 MiB of zero-initialised static memory, which costs
/// resident memory only where it is touched. Under loom: 8, so that
/// windows overlap and wrap. Under Miri: 512, since Miri's borrow tracker
/// visits every atomic of the table at each `&Table` it retags (196,608 of
/// them at full size: 30 % of Miri's time went to those ranges, and every
/// chunk operation took seconds); the tests there hold a few chunks.
const SLOTS: usize = if cfg!(loom) {
    8
} else if cfg!(miri) {
    1 << 9
} else {
    1 << 16
};
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
    /// Whether the chunk is two mappings (a growth moved a chunk's pages
    /// onto the start of a cached one: see `hooks::grow_chunk`), not one.
    /// Stored as bit 0 of the size word (sizes are whole pages).
    pub split: bool,
}

impl Chunk {
    /// A chunk of one mapping.
    pub fn new(size: usize, asked: usize) -> Chunk {
        Chunk {
            size,
            asked,
            split: false,
        }
    }

    /// The record of a slot's size and asked words.
    fn from_words(size: usize, asked: usize) -> Chunk {
        Chunk {
            size: size & !1,
            asked,
            split: size & 1 != 0,
        }
    }

    /// The slot's size word.
    fn size_word(self) -> usize {
        self.size | usize::from(self.split)
    }
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
    #[cfg_attr(not(loom), allow(dead_code))] // the loom models' way in
    pub fn insert(&self, addr: usize, size: usize, asked: usize) -> bool {
        self.insert_chunk(addr, Chunk::new(size, asked))
    }

    /// Records the chunk `addr` as `c` (see [`insert`](Self::insert)).
    pub fn insert_chunk(&self, addr: usize, c: Chunk) -> bool {
        self.insert_as(addr, c, false)
    }

    /// Records the chunk `addr` as `c`, held (see [`lock`](Self::lock)) if
    /// `locked`: its inserter then ends with [`resize`](Self::resize) or
    /// [`remove`](Self::remove).
    pub fn insert_as(&self, addr: usize, c: Chunk, locked: bool) -> bool {
        debug_assert!(may_be_chunk(addr) && c.asked <= c.size);
        let key = addr | usize::from(locked);
        for s in window(addr) {
            let slot = &self.slots[s];
            // A compare-and-swap without a load first: a slot's page, the
            // first time a process uses it, then costs one write fault, not
            // a read fault and a write fault (windows are mostly empty).
            if slot.key.compare_exchange(0, key, Acquire, Relaxed).is_ok() {
                slot.size.store(c.size_word(), Relaxed);
                slot.asked.store(c.asked, Relaxed);
                return true;
            }
        }
        false
    }

    /// The slot holding the chunk `addr` (held or not), if it is one.
    fn slot(&self, addr: usize) -> Option<&Slot> {
        if !may_be_chunk(addr) {
            return None;
        }
        window(addr)
            .map(|s| &self.slots[s])
            .find(|slot| slot.key.load(Relaxed) & !HELD == addr)
    }

    /// Takes the chunk `addr` for its owner's resize or free and returns
    /// its record (`None`: not a chunk): sets the slot's `HELD` bit,
    /// waiting while a trim holds it (one `munmap`). The owner then ends
    /// with [`resize`](Self::resize) (the new record, released) or
    /// [`remove`](Self::remove).
    pub fn lock(&self, addr: usize) -> Option<Chunk> {
        let slot = self.slot(addr)?;
        let mut spins = 0u32;
        loop {
            match slot
                .key
                .compare_exchange_weak(addr, addr | HELD, Acquire, Relaxed)
            {
                Ok(_) => break,
                // Only its owner frees a chunk, and a trim holds it briefly.
                Err(k) if k & !HELD == addr => spin(&mut spins),
                Err(_) => return None,
            }
        }
        Some(Chunk::from_words(
            slot.size.load(Relaxed),
            slot.asked.load(Relaxed),
        ))
    }

    /// Takes the slot `i` if it holds a chunk nobody holds, for a trim:
    /// the chunk's address and record (never waits).
    pub fn try_lock_slot(&self, i: usize) -> Option<(usize, Chunk)> {
        let slot = &self.slots[i];
        let k = slot.key.load(Relaxed);
        if k == 0 || k & HELD != 0 {
            return None;
        }
        slot.key
            .compare_exchange(k, k | HELD, Acquire, Relaxed)
            .ok()?;
        Some((
            k,
            Chunk::from_words(slot.size.load(Relaxed), slot.asked.load(Relaxed)),
        ))
    }

    /// Slots in the table (for a trim's scan).
    pub fn slots(&self) -> usize {
        SLOTS
    }

    /// The record of the chunk `addr`, or `None` if it is not one (a read
    /// that takes nothing: for the models and tests).
    #[cfg_attr(not(any(loom, test)), allow(dead_code))]
    #[inline]
    pub fn get(&self, addr: usize) -> Option<Chunk> {
        self.slot(addr)
            .map(|slot| Chunk::from_words(slot.size.load(Relaxed), slot.asked.load(Relaxed)))
    }

    /// Forgets the chunk `addr`, which the caller holds
    /// ([`lock`](Self::lock), [`insert_as`](Self::insert_as)), and returns
    /// its size, or `None` (not a chunk).
    pub fn remove(&self, addr: usize) -> Option<usize> {
        let slot = self.slot(addr)?;
        let size = Chunk::from_words(slot.size.load(Relaxed), 0).size;
        slot.key.store(0, Release);
        Some(size)
    }

    /// Forgets the chunk `addr` (its owner's free: taken first, as by
    /// [`lock`](Self::lock)) and returns its record, or `None` (not a
    /// chunk).
    pub fn remove_record(&self, addr: usize) -> Option<Chunk> {
        let c = self.lock(addr)?;
        self.remove(addr);
        Some(c)
    }

    /// Records a new record for the live chunk `addr` and releases it:
    /// its holder's last step (after a resize in place, a request served
    /// within its size, or a trim). Release: the record is stored before
    /// the slot is free to take again.
    pub fn resize(&self, addr: usize, c: Chunk) {
        debug_assert!(c.asked <= c.size);
        if let Some(slot) = self.slot(addr) {
            slot.size.store(c.size_word(), Relaxed);
            slot.asked.store(c.asked, Relaxed);
            slot.key.store(addr, Release);
        }
    }
}

/// The process's table.
#[cfg(not(loom))]
static TABLE: Table = Table::new();

/// Records the chunk `addr` in the process's table (see
/// [`Table::insert_chunk`]).
#[cfg(not(loom))]
pub(crate) fn insert(addr: usize, c: Chunk) -> bool {
    TABLE.insert_chunk(addr, c)
}

/// The record of the chunk `addr` (see [`Table::get`]).
#[cfg(all(test, not(loom)))]
#[inline]
pub(crate) fn get(addr: usize) -> Option<Chunk> {
    TABLE.get(addr)
}

/// Takes the chunk `addr` for its owner (see [`Table::lock`]).
#[cfg(not(loom))]
pub(crate) fn lock(addr: usize) -> Option<Chunk> {
    TABLE.lock(addr)
}

/// Records the chunk `addr`, held if `locked` (see [`Table::insert_as`]).
#[cfg(not(loom))]
pub(crate) fn insert_as(addr: usize, c: Chunk, locked: bool) -> bool {
    TABLE.insert_as(addr, c, locked)
}

/// Calls `f` with each live chunk nobody holds, held for the call: its
/// address and record; `f` returns the record to keep (see
/// [`Table::try_lock_slot`]).
#[cfg(not(loom))]
pub(crate) fn for_each_unheld(mut f: impl FnMut(usize, Chunk) -> Chunk) {
    for i in 0..TABLE.slots() {
        if let Some((addr, c)) = TABLE.try_lock_slot(i) {
            let kept = f(addr, c);
            TABLE.resize(addr, kept);
        }
    }
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
            assert!(
                insert(a, Chunk::new((i + 1) << 20, (i + 1) << 20)),
                "slot {i}"
            );
        }
        assert!(
            !insert(addrs[WINDOW], Chunk::new(1 << 20, 1 << 20)),
            "the window is full"
        );
        let c = Chunk::new;
        assert_eq!(get(addrs[7]), Some(c(8 << 20, 8 << 20)));
        resize(addrs[7], c(9 << 20, 5 << 20));
        assert_eq!(get(addrs[7]), Some(c(9 << 20, 5 << 20)));
        assert_eq!(remove(addrs[7]), Some(9 << 20));
        assert_eq!(get(addrs[7]), None);
        // The freed slot takes the next chunk; the others are still found.
        assert!(insert(addrs[WINDOW], Chunk::new(1 << 20, 1 << 20)));
        let split = Chunk {
            split: true,
            ..Chunk::new(4 << 20, 3 << 20)
        };
        resize(addrs[WINDOW], split);
        assert_eq!(get(addrs[WINDOW]), Some(split), "the split bit kept apart");
        for &a in addrs.iter().filter(|&&a| a != addrs[7]) {
            assert!(remove(a).is_some());
        }
    }
}
