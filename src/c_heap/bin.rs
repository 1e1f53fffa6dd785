//! One bin of cached small blocks (see the parent module for the policy;
//! `loom_tests/c_heap_bins.rs` models it).
//!
//! A bin is [`BIN_SLOTS`] atomic pointers, null when empty. A block is taken
//! by `swap(null)`: whoever gets a non-null pointer owns that block, so no
//! block is handed out twice, and there is no pointer chain for an ABA to
//! corrupt. A block is cached by `compare_exchange(null, block)`: it lands
//! in an empty slot or nowhere (the caller then still owns it).
//!
//! Orderings: the `compare_exchange` that caches a block is `Release` and
//! the `swap` that takes it is `Acquire`, so everything written to the block
//! before it was cached (its header, the previous owner's data) happens
//! before anything the taker does with it. The loads that skip slots are
//! `Relaxed`: they only choose which slot to try; the `swap` or
//! `compare_exchange` decides.

use core::ptr;

use super::BIN_SLOTS;
use crate::sync::{AtomicPtr, Ordering};

/// [`BIN_SLOTS`] slots for blocks of one size and alignment class.
pub struct Bin {
    slots: [AtomicPtr<u8>; BIN_SLOTS],
}

impl Bin {
    /// An empty bin.
    #[cfg(not(loom))]
    pub const fn new() -> Bin {
        Bin {
            slots: [const { AtomicPtr::new(ptr::null_mut()) }; BIN_SLOTS],
        }
    }

    /// An empty bin (loom's atomics have no `const` constructor).
    #[cfg(loom)]
    pub fn new() -> Bin {
        Bin {
            slots: core::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
        }
    }

    /// A cached block, now owned by the caller; `None` if the bin is empty.
    #[inline(always)]
    pub fn take(&self) -> Option<*mut u8> {
        for slot in &self.slots {
            if !slot.load(Ordering::Relaxed).is_null() {
                // Acquire: the header and contents written before the `put`.
                let p = slot.swap(ptr::null_mut(), Ordering::Acquire);
                if !p.is_null() {
                    return Some(p);
                }
            }
        }
        None
    }

    /// Caches `data` (not null); false if every slot is taken, and the
    /// caller still owns it.
    #[inline(always)]
    pub fn put(&self, data: *mut u8) -> bool {
        debug_assert!(!data.is_null());
        self.slots.iter().any(|slot| {
            slot.load(Ordering::Relaxed).is_null()
                && slot
                    // Release: publishes what was written to the block.
                    .compare_exchange(ptr::null_mut(), data, Ordering::Release, Ordering::Relaxed)
                    .is_ok()
        })
    }
}

impl Default for Bin {
    fn default() -> Bin {
        Bin::new()
    }
}
