//! A bounded, decaying cache of the chunks beneath MKL that MKL freed.
//!
//! For a big numeric buffer the allocator's cost is page faults: a freed
//! large block goes back to the system, and the next block of that size is
//! faulted in again, 4 KiB at a time. Numerical programs allocate the same
//! big temporaries again and again (solver workspaces, per-iteration
//! buffers, NumPy expression temporaries, MKL's own workspaces), so with
//! this cache on, a chunk of at least [`MIN_BLOCK`] bytes that MKL frees
//! (see the crate's `backing`: every MKL block of 1 MiB or more lives in
//! one) is kept, already faulted in (and with any huge-page advice it had),
//! and the next request it fits takes it instead of a fresh mapping; a
//! growing chunk moves onto a cached one, whose pages are already there.
//! The idea is mimalloc's segment reuse and jemalloc's retained dirty
//! pages, bounded:
//!
//! - **Budget**: the bytes kept, counted at each chunk's true (mapped)
//!   size, never exceed the budget given to [`enable`] (a chunk that would
//!   exceed it is unmapped at once). The default budget is an eighth of the
//!   memory the process may use: physical memory, or the cgroup's limit
//!   where that is lower ([`default_budget`]).
//! - **Fit**: a request of `n` bytes is served whole by a chunk of
//!   `n ..= n + n/8` bytes, so at most 1/8 of a reused chunk is waste; a
//!   chunk that grows and cannot grow in place may take one of up to
//!   8 times its new size (`GROWTH_SLACK`), and grows within it; that
//!   slack counts against the budget too (`MemStats::slack_bytes`). A
//!   request no chunk fits so is served from the cache all the same
//!   (next point).
//! - **Peak** (issue 54; Linux): caching never raises the peak. A request
//!   no cached chunk fits takes the smallest larger one, cut down to it
//!   (the part from the next 2 MiB boundary on, if 1 MiB or more, stays
//!   cached as a chunk of its own, with its age and marking; the bytes
//!   between are unmapped; a growth takes it whole, as slack within the
//!   budget, so that it grows on in place: a `Vec` pushed again after a
//!   bigger one was freed), or else the largest smaller one, grown to it
//!   with `mremap` (in place, or its pages moved onto a fresh mapping:
//!   the pages it had are reused, only the rest is new; a chunk of two
//!   mappings is unmapped instead). And whenever the crate maps new
//!   memory for a chunk (a fresh one, such a growth, a live chunk grown in
//!   place or moved), the cache gives as many bytes back (or all it
//!   has): the tail of the smallest chunk that has them, or whole chunks,
//!   the largest first, where none has. The chunks' memory,
//!   live and cached, so rises only while the cache is empty: **peak RSS
//!   stays at the live set plus the live chunks' slack** (MKL's blocks of
//!   1 MiB and more at their chunks' sizes: the request and MKL's header
//!   rounded up to a page, plus `MemStats::slack_bytes`, the fit's eighth
//!   and growth slack, at most the budget and usually none), **plus, while
//!   threads allocate at once, the chunks they are mapping at that
//!   moment** (each maps before it evicts). A chunk cut down or grown
//!   keeps its huge-page advice, as a chunk reused whole does. Medium
//!   blocks' dirty pages
//!   (`medium`, under the same budget) are not evicted for chunks: they
//!   decay. Measured (tests/block_cache.rs, 2-core AMD EPYC VM): a
//!   64 MiB buffer freed, then 48 MiB written: RSS 2 MiB below the 64 MiB
//!   buffer's peak, against 48 MiB above it before; 64 and 32 MiB freed,
//!   then 80 MiB written: RSS at the 96 MiB's peak, against 80 MiB above
//!   it before. 400 blocks of 1-64 MiB, 2-5 live at a time, every byte
//!   written: peak RSS 316 MiB over the start with 315 MiB live at the
//!   peak, against 1,325-1,396 MiB before (321 MiB with the cache off),
//!   in 1.2-1.4 s against 2.5-3.9 s (3.3-3.6 s off). Elsewhere (Windows,
//!   Miri) a request no chunk fits maps a fresh one beside the cache, as
//!   before.
//! - **Decay**: a chunk unused for [`DECAY_MS`] (or what [`set_decay_ms`]
//!   set) is unmapped at the next large allocation or free, or at one of
//!   the program's small frees through any path (every thread checks the
//!   clock once per [`TICKS`] small frees: MKL's, `MklSplitAllocator`'s
//!   system side, `c_heap`'s bins), as jemalloc decays without its
//!   background thread; with [`background`](crate::background)'s thread
//!   running (opt-in in Rust, on by default in the Python package) the
//!   thread decays instead, without any further allocation, and the small
//!   frees skip their countdown. For a process that
//!   goes idle, cached chunks are marked `MADV_FREE` as they enter the
//!   cache, so the kernel takes their pages whenever it needs memory
//!   (jemalloc's "muzzy" state; on Windows `MEM_RESET`, which lets the
//!   system drop their contents rather than page them out): all of
//!   [`LAZY_FREE_MIN`] (12 MiB) and more, and smaller ones beyond an
//!   allowance of [`UNMARKED_MAX`] (12 MiB) of unmarked chunks, which
//!   spares a loop reusing a few temporaries up to an 8 MiB one the
//!   system call and its aftermath (a thread-local share of it: no shared
//!   write either). An idle process so keeps at most 12 MiB of its cache
//!   that the kernel cannot take back;
//!   [`manager::free_buffers`](crate::manager::free_buffers) empties the
//!   cache at once.
//! - **Accounting**: cached chunks are not MKL blocks any more, so
//!   `MKL_Mem_Stat` (and mkl-service's `mem_stat()`) count live blocks
//!   only; [`manager::stats`](crate::manager::stats) reports the cache
//!   apart (`cached_bytes`, `cached_buffers`).
//! - **Out of memory**: a chunk's mapping refused while the cache holds
//!   chunks (for lack of memory or address space, or at the crate's share
//!   of the kernel's mapping limit; rare on Linux, where the cache serves
//!   such a request itself) unmaps cached chunks one at a time, the
//!   largest first, until it is granted; a block of the C runtime's that
//!   fails empties the cache and is tried once more.
//!
//! It serves every MKL block of 1 MiB or more, whoever asked for it:
//! [`MklAllocator`](crate::MklAllocator), the MKL side of
//! [`MklSplitAllocator`](struct@crate::MklSplitAllocator),
//! [`SharedMklVec`](crate::SharedMklVec), the Python package, and MKL's
//! own routines.
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
//! model (`loom_tests/block_cache.rs`) checks it against the shards. The
//! cache's code runs inside MKL's calls (beneath MKL): it never allocates
//! and never calls MKL.
//!
//! **On by default**, as MKL's own fast memory manager keeps freed buffers
//! and jemalloc and mimalloc retain and decay theirs: with no configuration
//! a numerical program's big temporaries and growing buffers are not
//! faulted in again and again (docs/performance.md has the figures). The
//! budget bounds what is kept, and decay gives it back. Memory the program
//! holds is [`manager::stats`](crate::manager::stats)`().live_bytes()`:
//! MKL's own count. Turn the cache off with [`disable`] or the environment
//! variable `MKL_ALLOC_BLOCK_CACHE`:
//!
//! | `MKL_ALLOC_BLOCK_CACHE` | Cache |
//! |---|---|
//! | unset, empty or `on` | on (the default), with a budget of [`default_budget`]`()`: an eighth of physical memory or of the cgroup's limit |
//! | `off` or `0` | off: every chunk MKL frees is unmapped at once |
//! | a byte count (decimal digits) | on, with that budget |
//!
//! Read once, at the crate's setup (when the program loads, from an ELF
//! constructor on Linux or, in a Windows executable, a C runtime
//! initialiser; elsewhere at the first allocation or the first call of
//! [`budget`]),
//! with libc's `getenv` (`GetEnvironmentVariableW` on Windows); any other value keeps the default, with one line
//! on stderr. [`enable`] and [`disable`] override it.
//!
//! **Fork.** The shards' locks are taken by a `pthread_atfork` handler
//! before a `fork` and released after it in both processes, and the child
//! recounts the budget word, so a child forked from any thread while others
//! allocate finds a consistent cache (see the crate's `process` module).
//!
//! ```
//! use allocator_api2::vec::Vec;
//! use mkl_alloc::backing::{self, Backing};
//! use mkl_alloc::{MklAllocator, block_cache, manager};
//!
//! block_cache::enable(256 << 20);
//! let v: Vec<f64, MklAllocator> = Vec::with_capacity_in(1 << 20, MklAllocator); // 8 MiB
//! let first = v.as_ptr();
//! drop(v); // kept beneath MKL, not unmapped
//! let w: Vec<f64, MklAllocator> = Vec::with_capacity_in(1 << 20, MklAllocator);
//! if backing::state() == Backing::Active {
//!     // (Linux and Windows: where MKL is on the crate's chunks.)
//!     assert_eq!(w.as_ptr(), first); // the same, already faulted-in chunk
//! }
//! drop(w);
//! if backing::state() == Backing::Active {
//!     assert!(block_cache::cached_bytes() >= 8 << 20);
//! }
//! manager::free_buffers(); // empties the cache
//! assert_eq!(block_cache::cached_bytes(), 0);
//! block_cache::disable();
//! ```

/// The smallest block the cache keeps (1 MiB). Below it the C library's
/// heap already keeps freed memory for reuse (glibc serves blocks under its
/// mmap threshold, 128 KiB rising to 32 MiB, from its heap), and the block
/// cache's lock and bookkeeping would be a larger share of the block's cost.
pub const MIN_BLOCK: usize = 1 << 20;

/// The budget `MKL_ALLOC_BLOCK_CACHE=on` sets: an eighth of the memory the
/// process may use, the smaller of physical memory and the limit of its
/// cgroup (v2's `memory.max`, or v1's `memory.limit_in_bytes`, of its
/// cgroup and every ancestor; "unlimited" is ignored), or 1 GiB where
/// neither can be read. 3 GiB on a 24 GiB machine, 64 MiB in a container
/// limited to 512 MiB. Proportional, because what a program can afford to
/// keep idle is a share of what it may use; an eighth holds a whole
/// doubling chain of buffers up to 1 GiB on a machine of 16 GiB or more
/// (see the README's rows for a push to 10^8).
///
/// ```
/// let b = mkl_alloc::block_cache::default_budget();
/// assert!(b >= mkl_alloc::block_cache::MIN_BLOCK);
/// ```
pub fn default_budget() -> usize {
    super::default_budget()
}

/// A cached chunk unused for this many milliseconds is unmapped (at the
/// next large allocation or free, or a small free's check), unless
/// [`set_decay_ms`] says otherwise. One second: a loop that allocates the
/// same temporaries again within a second keeps them (jemalloc's default
/// is ten seconds).
pub const DECAY_MS: usize = 1000;

/// A chunk that grows and cannot grow in place may take a cached chunk of
/// up to this many times its new size: the growths after it are then
/// served in place, on pages the cache kept resident (a `Vec` pushed again
/// after a first push reuses the first push's pages from an eighth of its
/// final size on, instead of faulting in all but the last doubling). The
/// slack is the cached chunk's own, memory already held; it leaves
/// `cached_bytes` for `MemStats::slack_bytes`, is bounded with the cache by
/// the one budget (a freed chunk is cached only while both fit), and
/// leaves with the chunk when MKL frees it or shrinks it by a quarter or
/// more (or less, where the budget has no room for the slack).
pub(crate) const GROWTH_SLACK: usize = 8;

/// Chunks of at least this many bytes are marked `MADV_FREE` as they enter
/// the cache (12 MiB: above an 8 MiB block's chunk, 8 MiB and a page for
/// MKL's header). The call costs about a microsecond, 35 times a 1 MiB
/// allocation's whole cost (measured: 1.4 µs with the call, 40 ns for
/// glibc's heap), and a reuse pays again: the kernel cleared the pages'
/// dirty bits, which every page's first write sets again (200 temporaries
/// of 8 MiB, marked, took 1.2-1.5x glibc's and mimalloc's time, with
/// 4 ms of system time; unmarked, the same as theirs). Smaller chunks are
/// marked only beyond [`UNMARKED_MAX`].
pub const LAZY_FREE_MIN: usize = 12 << 20;

/// Cached chunks under [`LAZY_FREE_MIN`] enter the cache unmarked while
/// the unmarked ones total at most this (12 MiB), and are marked
/// `MADV_FREE` beyond it: a loop reusing a few temporaries (one of 8 MiB,
/// or several smaller) pays no system call, and a process that stops
/// calling the allocator keeps at most this much of its cache resident
/// that the kernel cannot take back (48 chunks of 1-8 MiB freed, then
/// asleep: 10 MiB; before issue 35, every cached chunk under 8 MiB,
/// 161 MiB).
///
/// ```
/// assert!(mkl_alloc::block_cache::UNMARKED_MAX <= mkl_alloc::block_cache::LAZY_FREE_MIN);
/// ```
pub const UNMARKED_MAX: usize = 12 << 20;

/// A thread checks whether cached chunks are due to decay once per this
/// many of its small frees (MKL's, the split allocator's system side,
/// c_heap's bins) (a countdown in a thread-local word; the clock
/// is read only then, and only while the cache holds blocks). The decay
/// points are chosen in one place, `backing/decay.rs`.
///
/// ```
/// assert_eq!(mkl_alloc::block_cache::TICKS, 1024);
/// ```
pub use super::decay::TICKS;

pub(crate) mod shards;

#[cfg(not(loom))]
pub use instance::*;

#[cfg(not(loom))]
mod instance {
    use core::ffi::CStr;

    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    use super::shards::Cache;
    use super::{MIN_BLOCK, default_budget};
    use crate::backing::medium;
    use crate::env::SizePolicy;

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
        // A lower budget: the slack of live chunks beyond it goes back too
        // (issue 41: only the cache was drained), and dirty medium blocks.
        if CACHE.bytes() > max_bytes {
            medium::empty();
            crate::backing::trim_slack(max_bytes);
        }
    }

    /// Turns the cache off and unmaps every cached chunk.
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
        // Nothing kept: dirty medium blocks and the slack of live chunks
        // go back too.
        medium::empty();
        crate::backing::trim_slack(0);
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

    /// Sets the decay time: a chunk unused for `ms` milliseconds is
    /// unmapped at the next large allocation or free (default
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
        crate::backing::decay::changed();
    }

    /// The decay time in force, in milliseconds.
    ///
    /// ```
    /// assert!(mkl_alloc::block_cache::decay_ms() > 0);
    /// ```
    pub fn decay_ms() -> usize {
        CACHE.decay_ms()
    }

    /// Bytes held in the cache, at the chunks' true sizes: freed by MKL,
    /// kept mapped for reuse, not counted by `MKL_Mem_Stat`.
    ///
    /// ```
    /// let idle: usize = mkl_alloc::block_cache::cached_bytes();
    /// println!("{idle} bytes of freed chunks kept for reuse");
    /// ```
    pub fn cached_bytes() -> usize {
        CACHE.cached()
    }

    /// Bytes and blocks in the cache (for `manager::stats`).
    pub(crate) fn held() -> (usize, usize) {
        CACHE.held()
    }

    /// Unmaps every cached chunk and gives back every dirty medium block
    /// (`manager::free_buffers`, and an allocation that failed).
    pub(crate) fn empty() {
        CACHE.drain(free_to_mkl);
        medium::empty();
    }

    /// Unmaps one cached chunk, the largest: `false` if the cache is empty
    /// (a mapping refused at the mapping limit, or for lack of memory).
    pub(crate) fn evict_one() -> bool {
        CACHE.cached() != 0 && CACHE.evict_largest(free_to_mkl)
    }

    fn free_to_mkl(ptr: *mut u8, size: usize) {
        let (ptr, _) = untag(ptr, size);
        // SAFETY: every entry of the cache is a chunk of `size` bytes that
        // MKL freed into it; it left the cache, so nothing else has it.
        unsafe { crate::backing::unmap_chunk(ptr, size) }
    }

    /// The unmarked allowance (see [`UNMARKED_MAX`](super::UNMARKED_MAX))
    /// that no thread and no cached chunk holds. At every moment `POOL`,
    /// the threads' `CREDIT` (Linux) and the sizes of the unmarked chunks in the
    /// cache (or on their way in or out) add up to `UNMARKED_MAX`, so the
    /// unmarked chunks never exceed it. A thread that vanishes in a `fork`
    /// takes its share with it: the child then marks more, never less.
    static POOL: AtomicUsize = AtomicUsize::new(super::UNMARKED_MAX);

    /// The most allowance a thread keeps for itself ([`CREDIT`]); beyond it
    /// the surplus goes back to [`POOL`].
    #[cfg(all(target_os = "linux", not(miri)))]
    const LOCAL_MAX: usize = super::UNMARKED_MAX / 2;

    /// A thread's share of the allowance, given back when the thread ends.
    #[cfg(all(target_os = "linux", not(miri)))]
    struct Credit(core::cell::Cell<usize>);

    #[cfg(all(target_os = "linux", not(miri)))]
    impl Drop for Credit {
        fn drop(&mut self) {
            POOL.fetch_add(self.0.get(), Relaxed);
        }
    }

    // Linux only: there std registers a thread-local's destructor with
    // glibc's `__cxa_thread_atexit_impl` (which takes its node from the C
    // library's own `calloc`, never the global allocator); elsewhere it
    // pushes onto a `Vec`, an allocation through the global allocator,
    // which the hooks must not make: there every chunk takes its share
    // from `POOL` directly.
    #[cfg(all(target_os = "linux", not(miri)))]
    std::thread_local! {
        /// This thread's allowance: a loop that frees and reuses the same
        /// small chunk on one thread takes and gives it back here, with no
        /// shared write (an atomic add and subtract per cycle cost 14 ns,
        /// measured, on a 115 ns `MKL_malloc` + `MKL_free` of 1 MiB).
        static CREDIT: Credit = const { Credit(core::cell::Cell::new(0)) };
    }

    /// Takes `size` bytes of the allowance for a chunk entering the cache
    /// unmarked; `false` if there is not that much left.
    #[cfg(all(target_os = "linux", not(miri)))]
    fn take_credit(size: usize) -> bool {
        CREDIT
            .try_with(|c| {
                let have = c.0.get();
                if have >= size {
                    c.0.set(have - size);
                    return true;
                }
                let took = take_from_pool(size - have);
                if took {
                    c.0.set(0);
                }
                took
            })
            .unwrap_or(false)
    }

    /// Gives back the allowance of an unmarked chunk of `size` bytes that
    /// left the cache.
    #[cfg(all(target_os = "linux", not(miri)))]
    fn return_credit(size: usize) {
        let surplus = CREDIT
            .try_with(|c| {
                let have = c.0.get() + size;
                c.0.set(have.min(LOCAL_MAX));
                have - have.min(LOCAL_MAX)
            })
            .unwrap_or(size);
        if surplus != 0 {
            POOL.fetch_add(surplus, Relaxed);
        }
    }

    #[cfg(not(all(target_os = "linux", not(miri))))]
    fn take_credit(size: usize) -> bool {
        take_from_pool(size)
    }

    #[cfg(not(all(target_os = "linux", not(miri))))]
    fn return_credit(size: usize) {
        POOL.fetch_add(size, Relaxed);
    }

    /// Takes `need` bytes from [`POOL`] if it has them.
    fn take_from_pool(need: usize) -> bool {
        POOL.fetch_update(Relaxed, Relaxed, |pool| pool.checked_sub(need))
            .is_ok()
    }

    /// A cached chunk not marked `MADV_FREE` is kept with bit 0 of its
    /// address set, and a chunk of two mappings (`chunks::Chunk::split`)
    /// with bit 1 (chunks are aligned to pages, so the bits are free): the
    /// shards only store, compare sizes of and test the alignment of
    /// their entries, and every caller takes them with an alignment of 1.
    const UNMARKED: usize = 1;
    const SPLIT: usize = 2;

    /// The chunk `ptr` (maybe tagged) of `size` bytes, out of the cache:
    /// its address untagged and whether it is split; if it was not
    /// marked, its allowance given back.
    fn untag(ptr: *mut u8, size: usize) -> (*mut u8, bool) {
        if ptr.addr() & UNMARKED != 0 {
            return_credit(size);
        }
        (
            ptr.map_addr(|a| a & !(UNMARKED | SPLIT)),
            ptr.addr() & SPLIT != 0,
        )
    }

    /// Milliseconds of the coarse monotonic clock: a vDSO read of the
    /// last tick (a few ns, no system call, no hardware clock read); its
    /// resolution (one kernel tick, 1-10 ms) is plenty for a decay of 1 s.
    fn now_ms() -> usize {
        crate::sys::now_ms()
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
            b"mkl-alloc: MKL_ALLOC_BLOCK_CACHE must be off, on or a byte count (268435456, 256M, 256MiB); the cache keeps its default (on)\n";
        match crate::env::read(ENV, default_budget(), WARNING) {
            Some(budget) => {
                CACHE.set_budget(budget, free_to_mkl);
                MIN_BLOCK
            }
            None => OFF,
        }
    }

    /// A cached chunk for a request of `size` bytes, its true size and
    /// whether it is two mappings; null if there is none. (The caller, the hooks, makes the call a decay point first: `backing::decay::point`.)
    #[inline(never)]
    pub(crate) fn take(size: usize) -> (*mut u8, usize, bool) {
        let (p, got) = CACHE.take(size, 1);
        let (p, split) = untag(p, got);
        (p, got, split)
    }

    /// A cached chunk for a chunk growing to `size` bytes: as [`take`], up
    /// to [`GROWTH_SLACK`] times `size` (the grown chunk then serves the
    /// next growths in place, on pages already resident), or null.
    #[inline(never)]
    pub(crate) fn take_for_growth(size: usize) -> (*mut u8, usize, bool) {
        let (p, got) = CACHE.take_within(size, size.saturating_mul(super::GROWTH_SLACK), 1);
        let (p, split) = untag(p, got);
        (p, got, split)
    }

    /// A cached chunk larger than `size` bytes, of any size (the smallest),
    /// cut down to `keep` (`size`, or more for a growth: see the caller)
    /// for a request no chunk fits (see the module docs, "Peak"): the part
    /// past the next 2 MiB boundary after `keep`, if it is at least
    /// [`MIN_BLOCK`], goes back to the cache as a chunk of its own (with
    /// its age and marking), the bytes between are unmapped; a smaller
    /// remainder is unmapped whole. Returns the chunk, its size now
    /// (`keep`, or the whole chunk where it is not larger, or the kernel
    /// would not cut it) and whether it may be two mappings; null if the
    /// cache holds no chunk of `size` bytes or more. No lock is held
    /// across the system calls.
    #[cfg(all(target_os = "linux", not(miri)))]
    pub(crate) fn take_cut(size: usize, keep: usize) -> (*mut u8, usize, bool) {
        use crate::backing::{chunks::CHUNK_ALIGN, map, map_limit};
        if CACHE.cached() == 0 {
            return (core::ptr::null_mut(), 0, false);
        }
        let (e, got, since) = CACHE.take_within_since(size, usize::MAX, 1);
        if e.is_null() {
            return (e, 0, false);
        }
        let unmarked = e.addr() & UNMARKED != 0;
        let (p, split) = untag(e, got);
        let keep = keep.max(size);
        if got <= keep {
            return (p, got, split);
        }
        let rest = keep.next_multiple_of(CHUNK_ALIGN);
        // A chunk of its own starts on a 2 MiB boundary, and counts as
        // one more against the mapping limit (`map_limit`).
        if got >= rest.saturating_add(MIN_BLOCK) && map_limit::claim() {
            // SAFETY: the chunk left the cache: it is ours alone, and
            // [p + keep, p + rest) is inside it (keep <= rest < got).
            if rest == keep || unsafe { map::trim_tail(p, rest, keep) } {
                // SAFETY: [p + rest, p + got) is the chunk's own, nobody's.
                unsafe { put_back(p.add(rest), got - rest, split, unmarked, since) };
                return (p, keep, split);
            }
            map_limit::release();
        }
        // SAFETY: as above; the tail past `keep` is unused.
        if unsafe { map::trim_tail(p, got, keep) } {
            return (p, keep, split);
        }
        (p, got, split)
    }

    /// The remainder `[p, p + size)` of a cached chunk that [`take_cut`]
    /// cut, back into the cache as it was: marked `MADV_FREE` if the whole
    /// was (no second call), unmarked if the whole was and the allowance
    /// covers it; unmapped if the budget has no room for it now.
    ///
    /// # Safety
    /// `[p, p + size)` is a chunk of the crate's (2 MiB-aligned, counted
    /// by `map_limit`) that nothing uses.
    #[cfg(all(target_os = "linux", not(miri)))]
    unsafe fn put_back(p: *mut u8, size: usize, split: bool, unmarked: bool, since: usize) {
        let stays_unmarked = unmarked && size < super::LAZY_FREE_MIN && take_credit(size);
        if unmarked && !stays_unmarked {
            // SAFETY: the caller's contract: the contents are nobody's.
            unsafe { crate::backing::lazy_free(p, size) };
        }
        let tags = if stays_unmarked { UNMARKED } else { 0 } | if split { SPLIT } else { 0 };
        if !CACHE.give(p.map_addr(|a| a | tags), size, since, free_to_mkl) {
            if stays_unmarked {
                return_credit(size);
            }
            // SAFETY: the caller's contract; the cache did not keep it.
            unsafe { crate::backing::unmap_chunk(p, size) };
        }
    }

    /// The largest cached chunk smaller than `size` bytes, grown to `size`
    /// for a request no chunk fits (see the module docs, "Peak"): in place
    /// where the address space after it is free, else its pages moved
    /// (`mremap`, page tables only) onto the start of a fresh mapping of
    /// `size` bytes; the rest reads as zero. Returns the chunk (one
    /// mapping, not fresh: its first bytes hold what they held) and the
    /// bytes carried over. Null if the cache holds no smaller chunk, or it
    /// could not be grown: then it is unmapped (as is a chunk of two
    /// mappings, which `mremap` cannot move at once), and the bytes are
    /// those unmapped, which count towards the caller's [`evict_for`].
    #[cfg(all(target_os = "linux", not(miri)))]
    pub(crate) fn take_grown(size: usize) -> (*mut u8, usize) {
        use crate::backing::map;
        let none = (core::ptr::null_mut(), 0);
        if CACHE.cached() == 0 {
            return none;
        }
        let (e, got) = CACHE.take_below(size);
        if e.is_null() {
            return none;
        }
        let (p, split) = untag(e, got);
        // SAFETY (all three): the chunk left the cache and is ours alone;
        // a failed resize or move leaves it as it was.
        if !split && unsafe { map::resize_in_place(p, got, size) } {
            return (p, got);
        }
        let target = if split {
            core::ptr::null_mut()
        } else {
            map::map(size)
        };
        if !target.is_null() {
            // SAFETY: `target` is a fresh mapping of `size >= got` bytes
            // that nothing else knows of.
            let q = unsafe { map::move_onto(p, got, size, target) };
            if !q.is_null() {
                return (q, got);
            }
            // SAFETY: the fresh mapping, unused.
            unsafe { map::unmap(target, size) };
        }
        // SAFETY: as above.
        unsafe { crate::backing::unmap_chunk(p, got) };
        (core::ptr::null_mut(), got)
    }

    /// Gives `bytes` of cached chunks back to the system (or all there are,
    /// if fewer): called as the crate maps `bytes` of new memory for a
    /// chunk (a fresh one, a growth), so that cached memory makes room for
    /// it rather than sit beside it (see the module docs, "Peak"). The
    /// smallest chunk of at least `bytes` gives its tail (the whole chunk
    /// where less than [`MIN_BLOCK`] would stay); with none that large,
    /// the largest goes whole, and so on. A big cached chunk so loses what
    /// a small growth needs, not itself. One relaxed load while the cache
    /// is empty; no lock held across a system call.
    #[cfg(all(target_os = "linux", not(miri)))]
    pub(crate) fn evict_for(bytes: usize) {
        use crate::backing::{PAGE, map};
        let mut left = bytes.next_multiple_of(PAGE);
        while left != 0 && CACHE.cached() != 0 {
            let (e, got, since) = CACHE.take_within_since(left, usize::MAX, 1);
            if !e.is_null() {
                let unmarked = e.addr() & UNMARKED != 0;
                let (p, split) = untag(e, got);
                let keep = got - left;
                // SAFETY: the chunk left the cache: ours alone, unused.
                if keep >= MIN_BLOCK && unsafe { map::trim_tail(p, got, keep) } {
                    // SAFETY: its head, still ours and unused.
                    unsafe { put_back(p, keep, split, unmarked, since) };
                } else {
                    // SAFETY: as above.
                    unsafe { crate::backing::unmap_chunk(p, got) };
                }
                return;
            }
            let mut size = 0;
            let evicted = CACHE.evict_largest(|p, s| {
                size = s;
                free_to_mkl(p, s);
            });
            if !evicted {
                break;
            }
            left = left.saturating_sub(size);
        }
    }

    /// Elsewhere (Windows, Miri) a request the cache cannot fit maps
    /// fresh memory beside the cache, as before issue 54.
    #[cfg(not(all(target_os = "linux", not(miri))))]
    pub(crate) fn take_cut(_size: usize, _keep: usize) -> (*mut u8, usize, bool) {
        (core::ptr::null_mut(), 0, false)
    }

    #[cfg(not(all(target_os = "linux", not(miri))))]
    pub(crate) fn take_grown(_size: usize) -> (*mut u8, usize) {
        (core::ptr::null_mut(), 0)
    }

    #[cfg(not(all(target_os = "linux", not(miri))))]
    pub(crate) fn evict_for(_bytes: usize) {}

    /// Reserves `extra` more bytes of growth slack (see `backing::slack`)
    /// under the budget, by the compare-and-swap that a chunk entering the
    /// cache takes: `false` (nothing reserved) if they do not fit beside
    /// the cache and the slack there is. Always `true` while the cache is
    /// off: then slack is only a mild shrink's tail, at most a quarter of
    /// a live chunk.
    pub(crate) fn reserve_slack(extra: usize) -> bool {
        if POLICY.get(read_env) == OFF {
            CACHE.reserve_anyway(extra);
            return true;
        }
        CACHE.reserve(extra)
    }

    /// Counts `extra` bytes of slack that cannot be given back (a mapping
    /// the system rounded up, a tail the kernel would not trim).
    pub(crate) fn reserve_slack_anyway(extra: usize) {
        CACHE.reserve_anyway(extra);
    }

    /// Gives back `n` bytes of slack reserved before.
    pub(crate) fn unreserve_slack(n: usize) {
        CACHE.unreserve(n);
    }

    /// Bytes of growth slack reserved (what is reserved outside the
    /// shards, less the dirty medium blocks').
    pub(crate) fn slack_bytes() -> usize {
        CACHE.outside().saturating_sub(medium::figures().1)
    }

    /// Reserves `n` bytes under the budget for a medium block going dirty
    /// (see `backing::medium`), by the compare-and-swap that a chunk
    /// entering the cache takes: `false` (nothing reserved) if they do not
    /// fit, or the cache is off; the block is then given back at once.
    #[inline(always)]
    pub(crate) fn reserve_medium(n: usize) -> bool {
        POLICY.get(read_env) != OFF && CACHE.reserve(n)
    }

    /// Gives back `n` bytes [`reserve_medium`] reserved.
    #[inline(always)]
    pub(crate) fn unreserve_medium(n: usize) {
        CACHE.unreserve(n);
    }

    /// Whether the cache holds any chunk (a snapshot: one relaxed load).
    #[inline]
    pub(crate) fn holds_any() -> bool {
        CACHE.cached() != 0
    }

    /// Unmaps the chunks unused for the decay time at `now` (ms of
    /// `sys::now_ms`): the cache's part of a decay point (see
    /// `backing::decay`, which chooses them). A shard lock is held only
    /// while its slots are copied; nothing allocated.
    #[inline]
    pub(crate) fn decay(now: usize) {
        CACHE.decay(now, free_to_mkl);
    }

    /// `pthread_atfork`'s prepare handler: holds every shard's lock.
    #[cfg_attr(windows, allow(dead_code))] // no fork on Windows
    pub(crate) fn lock_for_fork() {
        CACHE.lock_for_fork();
        // After the shards: the medium heap's locks (outermost first).
        medium::lock_for_fork();
    }

    /// The parent's and the child's handler (`child`: recount the budget
    /// word first), releasing what [`lock_for_fork`] took.
    #[cfg_attr(windows, allow(dead_code))] // no fork on Windows
    pub(crate) fn unlock_after_fork(child: bool) {
        medium::unlock_after_fork(child);
        // SAFETY: called by the fork handlers, in the thread that ran
        // lock_for_fork (or its copy in the child), once after it.
        unsafe { CACHE.unlock_after_fork(child) }
    }

    /// Offers a freed chunk to the cache; `false`: not kept, the caller
    /// unmaps it. A kept chunk is marked `MADV_FREE` first unless it is
    /// small and the unmarked allowance covers it (see the module docs:
    /// the kernel may take its pages if it needs them).
    ///
    /// # Safety
    /// `ptr` is a chunk of exactly `size` bytes (two mappings if `split`)
    /// that nothing uses any more.
    #[inline(never)]
    pub(crate) unsafe fn give(ptr: *mut u8, size: usize, split: bool) -> bool {
        let now = now_ms();
        // The budget bounds the cache and the live chunks' slack together
        // (see `backing::slack`): one word holds both. Checked here before
        // the `MADV_FREE` below; `CACHE.give` reserves by compare-and-swap.
        if size > CACHE.budget().saturating_sub(CACHE.bytes()) {
            // Dirty medium blocks (counted at their classes' sizes, most of
            // whose pages may never have been touched) never keep a big
            // temporary out: the oldest are given back to make room.
            let short = size - CACHE.budget().saturating_sub(CACHE.bytes());
            if size > CACHE.budget() || !medium::any_dirty() || medium::trim(short) < short {
                return false;
            }
            if size > CACHE.budget().saturating_sub(CACHE.bytes()) {
                return false;
            }
        }
        // Marked unless it is small and the unmarked chunks, with it, stay
        // within UNMARKED_MAX: what an idle process leaves resident.
        let unmarked = size < super::LAZY_FREE_MIN && take_credit(size);
        if !unmarked {
            // SAFETY: the caller's contract: the contents are nobody's.
            unsafe { crate::backing::lazy_free(ptr, size) };
        }
        let tags = if unmarked { UNMARKED } else { 0 } | if split { SPLIT } else { 0 };
        let entry = ptr.map_addr(|a| a | tags);
        if CACHE.give(entry, size, now, free_to_mkl) {
            return true;
        }
        if unmarked {
            return_credit(size);
        }
        false
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
    pub(crate) fn take(_size: usize) -> (*mut u8, usize, bool) {
        (core::ptr::null_mut(), 0, false)
    }
    pub(crate) fn take_for_growth(_size: usize) -> (*mut u8, usize, bool) {
        (core::ptr::null_mut(), 0, false)
    }
    pub(crate) fn take_cut(_size: usize, _keep: usize) -> (*mut u8, usize, bool) {
        (core::ptr::null_mut(), 0, false)
    }
    pub(crate) fn take_grown(_size: usize) -> (*mut u8, usize) {
        (core::ptr::null_mut(), 0)
    }
    pub(crate) fn evict_for(_bytes: usize) {}
    pub(crate) unsafe fn give(_ptr: *mut u8, _size: usize, _split: bool) -> bool {
        false
    }
    pub(crate) fn held() -> (usize, usize) {
        (0, 0)
    }
    /// Slack under loom: counted, never refused (loom models the budget
    /// word in `loom_tests/block_cache.rs`).
    static SLACK: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
    pub(crate) fn reserve_slack(extra: usize) -> bool {
        SLACK.fetch_add(extra, core::sync::atomic::Ordering::Relaxed);
        true
    }
    pub(crate) fn reserve_slack_anyway(extra: usize) {
        SLACK.fetch_add(extra, core::sync::atomic::Ordering::Relaxed);
    }
    pub(crate) fn unreserve_slack(n: usize) {
        SLACK.fetch_sub(n, core::sync::atomic::Ordering::Relaxed);
    }
    pub(crate) fn slack_bytes() -> usize {
        SLACK.load(core::sync::atomic::Ordering::Relaxed)
    }
    pub(crate) fn empty() {}
    pub(crate) fn evict_one() -> bool {
        false
    }
    pub(crate) fn cached_bytes() -> usize {
        0
    }
}
#[cfg(loom)]
pub(crate) use instance::*;
