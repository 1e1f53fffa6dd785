//! A bounded, decaying cache of freed large MKL blocks.
//!
//! For a big numeric buffer the allocator's cost is page faults: `MKL_free`
//! hands a large block back to the system (glibc unmaps it), and the next
//! block of that size is faulted in again, 4 KiB at a time. Numerical
//! programs allocate the same big temporaries again and again (solver
//! workspaces, per-iteration buffers, NumPy expression temporaries), so
//! with this cache on, a freed MKL block of at least [`MIN_BLOCK`] bytes is
//! kept, already faulted in (and with any huge-page advice it had), and the
//! next request it fits takes it instead of a fresh block. The idea is
//! mimalloc's segment reuse and jemalloc's retained dirty pages, bounded:
//!
//! - **Budget**: the bytes kept never exceed the budget given to [`enable`]
//!   (a block that would exceed it is freed at once).
//! - **Fit**: a request of `n` bytes at alignment `a` is served only by a
//!   block of `n ..= n + n/8` bytes whose address is a multiple of `a`, so
//!   at most 1/8 of a reused block is waste.
//! - **Decay**: a block unused for [`DECAY_MS`] (or what [`set_decay_ms`]
//!   set) is given back to MKL at the
//!   next large allocation or free (as jemalloc decays without its
//!   background thread: no thread is started here), or by
//!   [`manager::free_buffers`](crate::manager::free_buffers), which empties
//!   the cache.
//! - **Accounting**: cached blocks are still MKL blocks, so `MKL_Mem_Stat`
//!   counts them; [`manager::stats`](crate::manager::stats) reports them
//!   apart (`cached_bytes`, `cached_buffers`).
//!
//! It serves every MKL block of the crate: [`MklAllocator`](crate::MklAllocator),
//! the MKL side of [`MklSplitAllocator`](crate::MklSplitAllocator),
//! [`SharedMklVec`](crate::SharedMklVec), and the Python package's NumPy
//! handler. A large block's growth with the cache on is allocate + copy +
//! free (the old block is then cached), instead of `MKL_realloc`.
//!
//! **Concurrency.** Blocks are kept in shards by size class (four classes
//! per power of two), each a short mutex-protected array: threads working
//! on different sizes never meet, and no lock is held across a system
//! call: blocks leaving the cache (evicted, decayed, emptied) are freed
//! after the lock is released. Nothing here allocates. The mutex also
//! orders the block's contents: whatever a thread wrote into a block before
//! caching it happens-before the reuse by another thread.
//!
//! The budget counter is one atomic word (see `Cache`'s fields); a loom
//! model (`loom_tests/block_cache.rs`) checks it against the shards.
//!
//! **On by default**, as MKL's own fast memory manager keeps freed buffers
//! and jemalloc and mimalloc retain and decay theirs: with no configuration
//! a numerical program's big temporaries and growing buffers are not
//! faulted in again and again (docs/performance.md has the figures). The
//! budget bounds what is kept, and decay gives it back: at the next large
//! allocation or free, or, for a program that carries on with small
//! blocks only, at one of its small frees (every thread checks the clock
//! once per [`TICKS`] small frees, and only while the cache holds blocks),
//! so an idle cache empties within a few decay periods. Memory the program
//! holds is [`manager::stats`](crate::manager::stats)`().live_bytes()`:
//! MKL's count less the cached bytes. Turn it off with [`disable`] or the
//! environment variable `MKL_ALLOC_BLOCK_CACHE`:
//!
//! | `MKL_ALLOC_BLOCK_CACHE` | Cache |
//! |---|---|
//! | unset, empty or `on` | on (the default), with a budget of [`default_budget`]`()`: an eighth of physical memory |
//! | `off` or `0` | off: every free goes to MKL at once |
//! | a byte count (decimal digits) | on, with that budget |
//!
//! Read once, at the first allocation (or the first call of [`budget`]),
//! with libc's `getenv`; any other value keeps the default, with one line
//! on stderr. [`enable`] and [`disable`] override it.
//!
//! **Fork.** The shards' locks are taken by a `pthread_atfork` handler
//! before a `fork` and released after it in both processes, and the child
//! recounts the budget word, so a child forked from any thread while others
//! allocate finds a consistent cache (see the crate's `process` module).
//!
//! ```
//! use allocator_api2::vec::Vec;
//! use mkl_alloc::{MklAllocator, block_cache, manager};
//!
//! block_cache::enable(256 << 20);
//! let v: Vec<f64, MklAllocator> = Vec::with_capacity_in(1 << 20, MklAllocator); // 8 MiB
//! let first = v.as_ptr();
//! drop(v); // kept, not freed
//! assert!(block_cache::cached_bytes() >= 8 << 20);
//! let w: Vec<f64, MklAllocator> = Vec::with_capacity_in(1 << 20, MklAllocator);
//! assert_eq!(w.as_ptr(), first); // the same, already faulted-in block
//! drop(w);
//! manager::free_buffers(); // empties the cache
//! assert_eq!(block_cache::cached_bytes(), 0);
//! block_cache::disable();
//! ```

/// The smallest block the cache keeps (1 MiB). Below it the C library's
/// heap already keeps freed memory for reuse (glibc serves blocks under its
/// mmap threshold, 128 KiB rising to 32 MiB, from its heap), and the block
/// cache's lock and bookkeeping would be a larger share of the block's cost.
pub const MIN_BLOCK: usize = 1 << 20;

/// The budget `MKL_ALLOC_BLOCK_CACHE=on` sets: an eighth of the machine's
/// physical memory (3 GiB on a 24 GiB machine), or 1 GiB where that cannot
/// be read. Proportional, because what a program can afford to keep idle is
/// a share of the machine; an eighth holds a whole doubling chain of
/// buffers up to 1 GiB on a machine of 16 GiB or more (see the README's
/// rows for a push to 10^8).
///
/// ```
/// let b = mkl_alloc::block_cache::default_budget();
/// assert!(b >= mkl_alloc::block_cache::MIN_BLOCK);
/// ```
pub fn default_budget() -> usize {
    #[cfg(not(miri))]
    {
        // SAFETY: sysconf takes any name and returns -1 for one it does not
        // know; it allocates nothing.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && page > 0 {
            return ((pages as usize).saturating_mul(page as usize) / 8).max(MIN_BLOCK);
        }
    }
    1 << 30
}

/// A cached block unused for this many milliseconds is given back to MKL
/// (at the next large allocation or free), unless [`set_decay_ms`] says
/// otherwise. One second: a loop that allocates the same temporaries again
/// within a second keeps them; an idle program's large freed memory goes
/// back within a second of its next large allocation (jemalloc's default is
/// ten seconds).
pub const DECAY_MS: usize = 1000;

/// A thread checks whether cached blocks are due to decay once per this
/// many of its small frees (a countdown in a thread-local word; the clock
/// is read only then, and only while the cache holds blocks).
pub const TICKS: u32 = 1024;

pub(crate) mod shards;

#[cfg(not(loom))]
pub use instance::*;

#[cfg(not(loom))]
mod instance {
    use core::ffi::CStr;

    use super::shards::Cache;
    use super::{MIN_BLOCK, default_budget};
    use crate::env::SizePolicy;
    use crate::ffi;

    static CACHE: Cache = Cache::new();

    /// `MIN_BLOCK` while the cache is on, `OFF` while it is off (see
    /// `SizePolicy`): a free or allocation below the word pays one relaxed
    /// load and a comparison.
    static POLICY: SizePolicy = SizePolicy::new();
    const OFF: usize = SizePolicy::OFF;

    const ENV: &CStr = c"MKL_ALLOC_BLOCK_CACHE";

    /// Turns the cache on with a budget of `max_bytes` (0 keeps nothing).
    /// Overrides `MKL_ALLOC_BLOCK_CACHE`. If the cache already holds more
    /// than the new budget, it is emptied first.
    ///
    /// ```
    /// use mkl_alloc::block_cache;
    ///
    /// block_cache::enable(512 << 20);
    /// assert_eq!(block_cache::budget(), Some(512 << 20));
    /// block_cache::disable();
    /// ```
    pub fn enable(max_bytes: usize) {
        CACHE.set_budget(max_bytes, free_to_mkl);
        POLICY.set(MIN_BLOCK);
    }

    /// Turns the cache off and gives every cached block back to MKL.
    /// Overrides `MKL_ALLOC_BLOCK_CACHE`.
    ///
    /// ```
    /// use mkl_alloc::block_cache;
    ///
    /// block_cache::disable();
    /// assert_eq!(block_cache::budget(), None);
    /// assert_eq!(block_cache::cached_bytes(), 0);
    /// ```
    pub fn disable() {
        POLICY.set(OFF);
        // A budget of 0, and a drain after it: a free racing this call
        // either is drained or sees the budget and keeps nothing (see
        // `Cache::set_budget`).
        CACHE.set_budget(0, free_to_mkl);
    }

    /// The budget while the cache is on, `None` while it is off. Reads
    /// `MKL_ALLOC_BLOCK_CACHE` if nothing did yet.
    ///
    /// ```
    /// use mkl_alloc::block_cache;
    ///
    /// block_cache::enable(block_cache::default_budget());
    /// assert_eq!(block_cache::budget(), Some(block_cache::default_budget()));
    /// block_cache::disable();
    /// ```
    pub fn budget() -> Option<usize> {
        match POLICY.get(read_env) {
            OFF => None,
            _ => Some(CACHE.budget()),
        }
    }

    /// Sets the decay time: a block unused for `ms` milliseconds is given
    /// back to MKL at the next large allocation or free (default
    /// [`DECAY_MS`](super::DECAY_MS)).
    ///
    /// ```
    /// use mkl_alloc::block_cache;
    ///
    /// block_cache::set_decay_ms(10_000); // jemalloc's default
    /// assert_eq!(block_cache::decay_ms(), 10_000);
    /// block_cache::set_decay_ms(block_cache::DECAY_MS);
    /// ```
    pub fn set_decay_ms(ms: usize) {
        CACHE.set_decay_ms(ms);
    }

    /// The decay time in force, in milliseconds.
    ///
    /// ```
    /// assert!(mkl_alloc::block_cache::decay_ms() > 0);
    /// ```
    pub fn decay_ms() -> usize {
        CACHE.decay_ms()
    }

    /// Bytes held in the cache: freed by their users, still allocated from
    /// MKL (and counted by `MKL_Mem_Stat`).
    ///
    /// ```
    /// let idle: usize = mkl_alloc::block_cache::cached_bytes();
    /// println!("{idle} bytes of freed MKL blocks kept for reuse");
    /// ```
    pub fn cached_bytes() -> usize {
        CACHE.bytes()
    }

    /// Bytes and blocks in the cache (for `manager::stats`).
    pub(crate) fn held() -> (usize, usize) {
        CACHE.held()
    }

    /// Gives every cached block back to MKL (`manager::free_buffers`).
    pub(crate) fn empty() {
        CACHE.drain(free_to_mkl);
    }

    fn free_to_mkl(ptr: *mut u8, _size: usize) {
        // SAFETY: every block in the cache is a live MKL block that its
        // user freed into the cache; it left the cache, so this is its one
        // free.
        crate::fork_guard::mkl(|| unsafe { ffi::MKL_free(ptr.cast()) })
    }

    /// Milliseconds of the coarse monotonic clock: a vDSO read of the
    /// last tick (a few ns, no system call, no hardware clock read); its
    /// resolution (one kernel tick, 1-10 ms) is plenty for a decay of 1 s.
    fn now_ms() -> usize {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec through a valid pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        (ts.tv_sec as usize)
            .wrapping_mul(1000)
            .wrapping_add(ts.tv_nsec as usize / 1_000_000)
    }

    /// Whether blocks of `size` bytes go through the cache: one relaxed
    /// load and a comparison below the policy word.
    #[inline(always)]
    pub(crate) fn covers(size: usize) -> bool {
        POLICY.covers(size, read_env)
    }

    /// Reads `MKL_ALLOC_BLOCK_CACHE` (once, without allocating) and sets
    /// the budget it asks for.
    fn read_env() -> usize {
        const WARNING: &[u8] =
            b"mkl-alloc: MKL_ALLOC_BLOCK_CACHE must be off, on or a byte count; the cache keeps its default (on)\n";
        match crate::env::read(ENV, default_budget(), WARNING) {
            Some(budget) => {
                CACHE.set_budget(budget, free_to_mkl);
                MIN_BLOCK
            }
            None => OFF,
        }
    }

    /// A cached block for `size` bytes at `align`, or null. Decays first.
    #[inline(never)]
    pub(crate) fn take(size: usize, align: usize) -> *mut u8 {
        CACHE.decay(now_ms(), free_to_mkl);
        CACHE.take(size, align)
    }

    /// Counts one small free of this thread; every [`TICKS`](super::TICKS)th
    /// checks the cache's decay (a thread-local countdown: no shared write,
    /// no clock read on the way).
    #[inline(always)]
    pub(crate) fn tick() {
        use core::cell::Cell;
        thread_local! {
            static COUNTDOWN: Cell<u32> = const { Cell::new(super::TICKS) };
        }
        COUNTDOWN.with(|c| match c.get() {
            0 => {
                c.set(super::TICKS);
                idle_decay();
            }
            n => c.set(n - 1),
        });
    }

    /// Decays the cache if it holds anything (the small path's check).
    #[cold]
    #[inline(never)]
    fn idle_decay() {
        if CACHE.bytes() != 0 {
            CACHE.decay(now_ms(), free_to_mkl);
        }
    }

    /// `pthread_atfork`'s prepare handler: holds every shard's lock.
    pub(crate) fn lock_for_fork() {
        CACHE.lock_for_fork();
    }

    /// The parent's and the child's handler (`child`: recount the budget
    /// word first), releasing what [`lock_for_fork`] took.
    pub(crate) fn unlock_after_fork(child: bool) {
        // SAFETY: called by the fork handlers, in the thread that ran
        // lock_for_fork (or its copy in the child), once after it.
        unsafe { CACHE.unlock_after_fork(child) }
    }

    /// Offers a freed block to the cache; `false`: not kept, the caller
    /// frees it.
    ///
    /// # Safety
    /// `ptr` is a live MKL block of at least `size` bytes that its owner
    /// gives up (it is not used again).
    #[inline(never)]
    pub(crate) unsafe fn give(ptr: *mut u8, size: usize) -> bool {
        let now = now_ms();
        CACHE.decay(now, free_to_mkl);
        CACHE.give(ptr, size, now, free_to_mkl)
    }
}

/// Under loom the allocation path has no cache (loom models the shards
/// directly, in `loom_tests/block_cache.rs`).
#[cfg(loom)]
mod instance {
    #[inline(always)]
    pub(crate) fn covers(_size: usize) -> bool {
        false
    }
    pub(crate) fn take(_size: usize, _align: usize) -> *mut u8 {
        core::ptr::null_mut()
    }
    pub(crate) unsafe fn give(_ptr: *mut u8, _size: usize) -> bool {
        false
    }
    pub(crate) fn held() -> (usize, usize) {
        (0, 0)
    }
    pub(crate) fn empty() {}
    #[inline(always)]
    pub(crate) fn tick() {}
}
#[cfg(loom)]
pub(crate) use instance::*;
