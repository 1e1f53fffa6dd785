//! **Freeing.** Unlike MKL, which keeps a header in front of the block, the
//! emulation records each live block in a table keyed by address, holding
//! the allocation's own pointer: the pointer a caller frees may carry a
//! narrower provenance (a `Box`'s covers its value only), through which
//! Rust code may not read a header. An exact block is freed through the
//! caller's pointer (a `Box` being dropped protects its pointer's tag, and
//! Miri lets only that tag's own deallocation through); any other (room
//! behind in `in-place`, bytes in front after the rare fallback) through the
//! allocation's own pointer, which Miri refuses while a `Box` of the block is
//! being dropped: std's `Box` over this emulation (the emulation as
//! `#[global_allocator]`) is for every mode but `in-place`, and for small
//! blocks (a large one is freed through `i_free` with its memory's pointer).
//! Freeing or reallocating an address that is not a live block panics. Any
//! size, alignment, order of frees and thread is served; the counters are
//! atomics.

use core::mem::MaybeUninit;
use core::ptr;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::{Mutex, MutexGuard};

use super::large::i_free;
use super::machine::{c_free, system_free};
use super::statistics::account;

/// A live block: the allocation (its own pointer, with full provenance,
/// and its layout), where in it the user's part starts, the user's size and
/// alignment, and what MKL's statistics count for it. A `large` block lives
/// in memory from `i_malloc` instead: `base` is what `i_malloc` (or
/// `i_realloc`) returned, `outer`'s size what was asked of it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    pub(super) base: *mut u8,
    pub(super) outer: Layout,
    pub(super) pad: usize,
    pub(super) size: usize,
    pub(super) align: usize,
    pub(super) counted: usize,
    pub(super) large: bool,
}

impl Block {
    pub(super) fn user_addr(&self) -> usize {
        self.base.addr() + self.pad
    }

    /// The user's part, with the allocation's provenance.
    pub(super) fn user(&self) -> *mut u8 {
        // SAFETY: pad < outer.size(): inside the allocation (see `place`).
        unsafe { self.base.add(self.pad) }
    }

    /// The bytes the block may grow to where it is.
    pub(super) fn capacity(&self) -> usize {
        self.outer.size() - self.pad
    }

    /// Whether the user's part is the whole allocation.
    pub(super) fn exact(&self) -> bool {
        !self.large && self.pad == 0 && self.outer.size() == self.size
    }

    /// The pointer the caller gets: for an exact block the allocation's own;
    /// otherwise one made from a reference to the user's `size` bytes, whose
    /// provenance (under Stacked Borrows) covers those only (see `in-place`
    /// in [`mode`](super::mode)). Making it invalidates every pointer made before for the block.
    pub(super) fn hand_out(&self) -> *mut u8 {
        if self.exact() {
            return self.user();
        }
        // SAFETY: `size` bytes inside the allocation, which only the caller
        // (getting this pointer, and giving up any older one) may use.
        let part = unsafe {
            core::slice::from_raw_parts_mut(self.user().cast::<MaybeUninit<u8>>(), self.size)
        };
        ptr::from_mut(part).cast()
    }
}

/// The live blocks, sorted by user address, in memory from `System` (so
/// that the emulation also serves a `#[global_allocator]` without
/// recursion). std's `Mutex` does not allocate.
pub(super) struct Table {
    ptr: *mut Block,
    len: usize,
    cap: usize,
}

// SAFETY: the table owns its array; the pointers it holds are addresses of
// blocks, used only by the thread holding the lock.
unsafe impl Send for Table {}

static TABLE: Mutex<Table> = Mutex::new(Table {
    ptr: ptr::null_mut(),
    len: 0,
    cap: 0,
});

pub(super) fn table() -> MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Table {
    fn entries(&self) -> &[Block] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: `len` initialised entries at `ptr`.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(super) fn entries_mut(&mut self) -> &mut [Block] {
        if self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: `len` initialised entries at `ptr`, borrowed with the table.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub(super) fn find(&self, addr: usize) -> Result<usize, usize> {
        self.entries().binary_search_by_key(&addr, Block::user_addr)
    }

    pub(super) fn insert(&mut self, block: Block) {
        let at = match self.find(block.user_addr()) {
            Err(at) => at,
            Ok(_) => panic!("MKL emulation (Miri): address handed out twice"),
        };
        if self.len == self.cap {
            let cap = (self.cap * 2).max(64);
            let layout = Layout::array::<Block>(cap).expect("a small table");
            // SAFETY: a non-zero layout; the old array (if any) is copied
            // and freed with the layout it was made with.
            unsafe {
                let new = System.alloc(layout).cast::<Block>();
                assert!(
                    !new.is_null(),
                    "MKL emulation (Miri): no memory for the block table"
                );
                if !self.ptr.is_null() {
                    ptr::copy_nonoverlapping(self.ptr, new, self.len);
                    let old = Layout::array::<Block>(self.cap).expect("a small table");
                    System.dealloc(self.ptr.cast(), old);
                }
                self.ptr = new;
            }
            self.cap = cap;
        }
        // SAFETY: at <= len < cap: shift the tail up one, write the entry.
        unsafe {
            ptr::copy(self.ptr.add(at), self.ptr.add(at + 1), self.len - at);
            self.ptr.add(at).write(block);
        }
        self.len += 1;
    }

    pub(super) fn get(&self, addr: usize) -> Option<Block> {
        self.find(addr).ok().map(|i| self.entries()[i])
    }

    pub(super) fn remove(&mut self, addr: usize) -> Option<Block> {
        let at = self.find(addr).ok()?;
        let block = self.entries()[at];
        // SAFETY: at < len: shift the tail down one.
        unsafe { ptr::copy(self.ptr.add(at + 1), self.ptr.add(at), self.len - at - 1) };
        self.len -= 1;
        Some(block)
    }
}

/// The live block at `user`; panics if there is none (a double free or a
/// foreign pointer).
pub(super) fn live_block(user: *mut u8) -> Block {
    table()
        .get(user.addr())
        .unwrap_or_else(|| not_a_block(user))
}

/// Takes the live block at `user` out of the table (it is then the caller's
/// to release); panics as [`live_block`].
pub(super) fn take_block(user: *mut u8) -> Block {
    table()
        .remove(user.addr())
        .unwrap_or_else(|| not_a_block(user))
}

pub(super) fn not_a_block(user: *mut u8) -> ! {
    panic!("MKL emulation (Miri): {user:p} is not a live MKL block (double free?)")
}

/// Frees a live block (taken out of the table by the caller): an exact one
/// through `via`, the caller's pointer to it (a `Box` being dropped protects
/// its pointer's tag, and Miri lets only that tag's own deallocation
/// through; MKL, in C, is outside the model), any other through the
/// allocation's own pointer (see the module docs).
///
/// # Safety
/// `block` was live until the caller removed it; `via` points at its user
/// part; not used again.
pub(super) unsafe fn release(block: Block, via: *mut u8) {
    if block.large {
        // SAFETY: a copy of the pointer (see allocate_large), given the
        // memory from i_malloc or i_realloc, freed once.
        unsafe { i_free.unwrap_or(c_free)(block.base.cast()) };
        account(block.counted, false);
        return;
    }
    let start = if block.exact() { via } else { block.base };
    // SAFETY: the allocation's start, and the layout it was made with.
    unsafe { system_free(start, block.outer) };
    account(block.counted, false);
}
