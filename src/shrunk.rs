//! The true sizes of large blocks shrunk in place.
//!
//! A large block that shrinks mildly keeps its address and its whole
//! memory (MKL's `MKL_realloc` keeps the whole block when it shrinks, so the
//! crate does not call it: the shrink is free), but its owner frees it later
//! with the smaller size. The block cache must count what MKL holds (its
//! budget bounds memory), and may hand the block to a request up to the
//! size it really has; so a shrink in place of a block of
//! [`MIN_BLOCK`](crate::block_cache::MIN_BLOCK) or more records the block's
//! true size here, and the free (or the next resize) of that block takes
//! the record back.
//!
//! A fixed table of [`SLOTS`] records, lock-free (so `fork` from any thread
//! leaves it usable: a record of a block that only a vanished thread could
//! free stays, and its block is never freed in the child, so its address
//! is never reused there). When the table is full the shrink moves the
//! block instead (a copy of the new size; the old memory is given back).
//!
//! A record is touched only by the block's owner (who shrinks, resizes or
//! frees it); other threads only skip it while scanning. The orderings:
//! a slot is claimed by a compare-and-swap of its address from null
//! (Acquire) and released by a store of null (Release), so the release of a
//! slot (after its owner read the size) happens-before the next claim (and
//! its write of the size): an owner never reads another block's size.

use core::ptr;

use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// How many shrunk blocks can be live at once before shrinks move.
pub(crate) const SLOTS: usize = 64;

#[cfg_attr(loom, allow(dead_code))]
struct Record {
    block: AtomicPtr<u8>,
    size: AtomicUsize,
}

/// The table, and how many records are in it (so that a free finds an
/// empty table with one load).
#[cfg_attr(loom, allow(dead_code))]
pub(crate) struct Shrunk {
    records: [Record; SLOTS],
    count: AtomicUsize,
}

#[cfg_attr(loom, allow(dead_code))]
impl Shrunk {
    /// An empty table.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        Shrunk {
            records: [const {
                Record {
                    block: AtomicPtr::new(ptr::null_mut()),
                    size: AtomicUsize::new(0),
                }
            }; SLOTS],
            count: AtomicUsize::new(0),
        }
    }

    /// Records that `block` (not recorded yet) holds `true_size` bytes;
    /// `false` if the table is full.
    pub(crate) fn record(&self, block: *mut u8, true_size: usize) -> bool {
        for r in &self.records {
            if r.block.load(Ordering::Relaxed).is_null()
                && r.block
                    .compare_exchange(ptr::null_mut(), block, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                r.size.store(true_size, Ordering::Relaxed);
                self.count.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// Takes the record of `block` back: its true size, or `None` if it has
    /// none. Only the block's owner calls this.
    #[inline]
    pub(crate) fn take(&self, block: *mut u8) -> Option<usize> {
        // The owner's own record, if any, was counted by the owner (or by a
        // thread that handed the block over with synchronisation): a zero
        // count means no record of this block.
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.find(block)
    }

    #[cold]
    fn find(&self, block: *mut u8) -> Option<usize> {
        let r = self
            .records
            .iter()
            .find(|r| r.block.load(Ordering::Relaxed) == block)?;
        let size = r.size.load(Ordering::Relaxed);
        self.count.fetch_sub(1, Ordering::Relaxed);
        r.block.store(ptr::null_mut(), Ordering::Release);
        Some(size)
    }
}

/// The process's table (none under loom, whose atomics cannot live in a
/// static: shrinks then always move).
#[cfg(not(loom))]
static SHRUNK: Shrunk = Shrunk::new();

/// [`Shrunk::record`] on the process's table.
#[inline]
pub(crate) fn record(block: *mut u8, true_size: usize) -> bool {
    #[cfg(not(loom))]
    return SHRUNK.record(block, true_size);
    #[cfg(loom)]
    {
        let _ = (block, true_size);
        false
    }
}

/// [`Shrunk::take`] on the process's table.
#[inline]
pub(crate) fn take(block: *mut u8) -> Option<usize> {
    #[cfg(not(loom))]
    return SHRUNK.take(block);
    #[cfg(loom)]
    {
        let _ = block;
        None
    }
}
