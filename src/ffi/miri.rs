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
//! Each block is one `System` allocation of exactly `size` bytes aligned to
//! `align`: Miri therefore reports any access outside the user's `size`
//! bytes. Above 4096 (Miri's allocator takes at most 2^29) the allocation
//! is `size + align` bytes aligned to 4096, the user's part placed at its
//! first multiple of `align`. Unlike MKL, which keeps a header in front of
//! the block, the emulation records each live block in a
//! table keyed by address, holding the allocation's own pointer: the
//! pointer a caller frees may carry a narrower provenance (a `Box`'s covers
//! its value only), through which Rust code may not read a header. Freeing
//! or reallocating an address that is not a live block panics. Any size, alignment,
//! order of frees and thread is served; the counters are atomics.
#![allow(non_snake_case)]

use core::ffi::{c_int, c_void};
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::{Mutex, MutexGuard};

use super::{
    MKL_MEM_MCDRAM, MKL_PEAK_MEM, MKL_PEAK_MEM_DISABLE, MKL_PEAK_MEM_ENABLE, MKL_PEAK_MEM_RESET,
};

/// The memory the emulated MKL may hold at once: 16 GiB (blocks and their
/// alignment padding). Larger requests get null, as from a real MKL on a
/// machine that size.
pub const MEMORY: usize = 16 << 30;

/// MKL's default (and minimum) alignment.
const DEFAULT_ALIGN: usize = 64;

/// The most alignment asked of `System`: larger alignments are reached by
/// placing the user's part inside a larger allocation.
const BASE_ALIGN: usize = 4096;

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

/// The `System` layout of a block of `size` bytes aligned to `align`:
/// exactly that up to [`BASE_ALIGN`], else room for `align` bytes of
/// padding in front. `None` if it cannot exist.
fn outer_layout(size: usize, align: usize) -> Option<Layout> {
    if align <= BASE_ALIGN {
        Layout::from_size_align(size, align).ok()
    } else {
        Layout::from_size_align(size.checked_add(align)?, BASE_ALIGN).ok()
    }
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
    // SAFETY: the layout's size is at least `size` > 0.
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
    // The user's part starts at the first multiple of `align` from the
    // base: the base itself up to BASE_ALIGN, else pad < align bytes in,
    // leaving `size` bytes (the allocation has `align` extra).
    let pad = (align - base.addr() % align) % align;
    // SAFETY: pad = 0, or pad < align with `size + align` bytes allocated.
    let user = unsafe { base.add(pad) };
    table().insert(Block {
        base,
        size,
        align,
        pad,
    });
    ANY_BLOCK.store(true, Ordering::Relaxed);
    account(size, true);
    user.cast()
}

/// A live block: the allocation's own pointer (full provenance), the
/// user's size and alignment, and where the user's part starts.
#[derive(Clone, Copy)]
struct Block {
    base: *mut u8,
    size: usize,
    align: usize,
    pad: usize,
}

impl Block {
    fn user_addr(&self) -> usize {
        self.base.addr() + self.pad
    }

    /// The user's part, with the allocation's provenance.
    fn user(&self) -> *mut u8 {
        // SAFETY: pad < align: inside the allocation (see `allocate`).
        unsafe { self.base.add(self.pad) }
    }
}

/// The live blocks, sorted by user address, in memory from `System` (so
/// that the emulation also serves a `#[global_allocator]` without
/// recursion). std's `Mutex` does not allocate.
struct Table {
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

fn table() -> MutexGuard<'static, Table> {
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

    fn find(&self, addr: usize) -> Result<usize, usize> {
        self.entries().binary_search_by_key(&addr, Block::user_addr)
    }

    fn insert(&mut self, block: Block) {
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

    fn get(&self, addr: usize) -> Option<Block> {
        self.find(addr).ok().map(|i| self.entries()[i])
    }

    fn remove(&mut self, addr: usize) -> Option<Block> {
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
fn live_block(user: *mut u8) -> Block {
    table()
        .get(user.addr())
        .unwrap_or_else(|| not_a_block(user))
}

/// Takes the live block at `user` out of the table (it is then the caller's
/// to release); panics as [`live_block`].
fn take_block(user: *mut u8) -> Block {
    table()
        .remove(user.addr())
        .unwrap_or_else(|| not_a_block(user))
}

fn not_a_block(user: *mut u8) -> ! {
    panic!("MKL emulation (Miri): {user:p} is not a live MKL block (double free?)")
}

/// Frees a live block (taken out of the table by the caller) through
/// `via`, the caller's pointer to it, where that is the allocation's start:
/// a `Box` being dropped protects its pointer's tag, and Miri lets only
/// that tag's own deallocation through (MKL, in C, is outside the model).
///
/// # Safety
/// `block` was live until the caller removed it; `via` points at its user
/// part; not used again.
unsafe fn release(block: Block, via: *mut u8) {
    let layout = outer_layout(block.size, block.align).expect("the layout the block was made with");
    let start = if block.pad == 0 { via } else { block.base };
    // SAFETY: the allocation's start, and the layout it was made with.
    unsafe { System.dealloc(start, layout) };
    RESERVED.fetch_sub(layout.size(), Ordering::Relaxed);
    account(block.size, false);
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
    let align = live_block(user).align;
    if size == 0 {
        let block = take_block(user);
        // SAFETY: taken out of the table: the caller gives the block up.
        unsafe { release(block, user) };
        return ptr::null_mut();
    }
    let new = allocate(size, align, false).cast::<u8>();
    if !new.is_null() {
        let old = take_block(user);
        // SAFETY: two distinct blocks holding at least min(old, size) bytes,
        // the old one read through its allocation's own pointer; it is freed
        // once and the caller drops its pointer.
        unsafe {
            ptr::copy_nonoverlapping(old.user(), new, old.size.min(size));
            release(old, user);
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
    let block = take_block(user);
    // SAFETY: taken out of the table: freed once.
    unsafe { release(block, user) };
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

/// The emulation keeps the contract the crate relies on (each property
/// measured on the real MKL elsewhere: tests/binding.rs, tests/manager.rs,
/// tests/fast_mm.rs and the realloc notes in src/allocator.rs).
#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> (i64, c_int) {
        let mut n = 0;
        // SAFETY: a valid out-pointer.
        let bytes = unsafe { MKL_Mem_Stat(&mut n) };
        (bytes, n)
    }

    #[test]
    fn malloc_aligns_to_max_of_64_and_a_power_of_two() {
        for (asked, want) in [
            (0, 64),
            (1, 64),
            (3, 64),
            (64, 64),
            (128, 128),
            (1 << 16, 1 << 16),
        ] {
            // SAFETY: freed below.
            let p = unsafe { MKL_malloc(10, asked) };
            assert!(!p.is_null());
            assert_eq!(p.addr() % want, 0, "align {asked}");
            // SAFETY: a live block, freed once.
            unsafe { MKL_free(p) };
        }
    }

    #[test]
    fn alignments_beyond_the_systems_are_placed_inside_a_larger_block() {
        // SAFETY: freed below.
        let p = unsafe { MKL_malloc(100, 1 << 20) }.cast::<u8>();
        assert_eq!(p.addr() % (1 << 20), 0);
        // SAFETY: 100 bytes, realloc keeps the alignment and the contents.
        unsafe {
            p.write_bytes(7, 100);
            let q = MKL_realloc(p.cast(), 200).cast::<u8>();
            assert_eq!(q.addr() % (1 << 20), 0);
            assert_eq!(*q.add(99), 7);
            MKL_free(q.cast());
        }
    }

    #[test]
    fn size_zero_and_impossible_sizes_are_null() {
        // SAFETY: no block is returned.
        unsafe {
            assert!(MKL_malloc(0, 64).is_null());
            assert!(MKL_calloc(1, 0, 64).is_null());
            assert!(MKL_malloc(MEMORY + 1, 64).is_null());
            assert!(MKL_malloc(usize::MAX, 64).is_null());
        }
    }

    #[test]
    fn calloc_zeroes_and_realloc_keeps_the_prefix() {
        // SAFETY: 64 zeroed bytes, grown then shrunk, freed once.
        unsafe {
            let p = MKL_calloc(1, 64, 128).cast::<u8>();
            assert!((0..64).all(|i| *p.add(i) == 0));
            p.write_bytes(5, 64);
            let q = MKL_realloc(p.cast(), 1000).cast::<u8>();
            assert_eq!(q.addr() % 128, 0, "realloc keeps the block's alignment");
            assert!((0..64).all(|i| *q.add(i) == 5));
            let r = MKL_realloc(q.cast(), 10).cast::<u8>();
            assert!((0..10).all(|i| *r.add(i) == 5));
            MKL_free(r.cast());
        }
    }

    #[test]
    fn a_failed_realloc_leaves_the_block_intact() {
        // SAFETY: the block stays live after the failed realloc; freed once.
        unsafe {
            let p = MKL_malloc(16, 64).cast::<u8>();
            p.write_bytes(9, 16);
            assert!(MKL_realloc(p.cast(), MEMORY).is_null());
            assert!((0..16).all(|i| *p.add(i) == 9));
            MKL_free(p.cast());
        }
    }

    #[test]
    fn mem_stat_counts_live_bytes_and_blocks() {
        // Other tests allocate concurrently: check with a margin that only
        // this test's blocks can explain.
        let (b0, n0) = stats();
        // SAFETY: freed below.
        let p = unsafe { MKL_malloc(1 << 20, 64) };
        let (b1, n1) = stats();
        assert!(b1 >= b0 + (1 << 20) - (1 << 16), "{b0} -> {b1}");
        assert!(n1 >= 1, "{n0} -> {n1} blocks");
        // SAFETY: a live block, freed once.
        unsafe { MKL_free(p) };
        let (b2, _) = stats();
        assert!(b2 <= b1 - (1 << 20) + (1 << 16), "{b1} -> {b2}");
    }

    #[test]
    fn peak_is_relative_to_enabling_and_minus_one_while_off() {
        // SAFETY: the peak calls take a mode by value; the block is freed once.
        unsafe {
            assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_DISABLE), 0);
            assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM), -1);
            assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_ENABLE), 0);
            let p = MKL_malloc(1 << 20, 64);
            assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM) >= 1 << 20);
            MKL_free(p);
            assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_RESET) >= 1 << 20);
            assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM) < 1 << 20);
            assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_DISABLE), 0);
        }
    }

    #[test]
    fn free_of_null_and_the_buffer_and_limit_calls_are_accepted() {
        // SAFETY: null is accepted; the buffer calls take no arguments.
        unsafe {
            MKL_free(ptr::null_mut());
            MKL_Free_Buffers();
            MKL_Thread_Free_Buffers();
            assert_eq!(MKL_Set_Memory_Limit(MKL_MEM_MCDRAM, 1 << 30), 0);
            assert_eq!(MKL_Set_Memory_Limit(7, 1 << 30), -1);
        }
    }
}
