//! Controls of oneMKL's memory manager, as safe functions.
//!
//! MKL keeps freed blocks in per-thread caches (its "fast memory manager") and
//! counts what it holds. These functions read those counts and release or
//! disable the caches. They act on MKL's manager as a whole: blocks from
//! [`MklAllocator`](crate::MklAllocator), from `SharedMklVec` and from MKL's
//! own routines alike.
//!
//! The crate's settings in force (the block cache's budget and decay, the
//! huge-page threshold) and where each came from: [`settings`], whose
//! [`Settings`] prints one line per setting; set at run time with
//! [`set_block_cache`], [`set_decay_ms`] and [`set_huge_pages`].

use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::{ffi, fork_guard};

pub use crate::settings::{Settings, SizeValueError, Source, parse_size, set_huge_pages};
#[cfg(not(loom))]
pub use crate::settings::{set_block_cache, set_decay_ms, settings};

/// What MKL's memory manager holds right now, from `MKL_Mem_Stat`, and
/// what the [block cache](crate::block_cache) beneath MKL keeps besides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemStats {
    /// Bytes in blocks currently allocated through MKL and not freed, as
    /// MKL counts them (each block's size plus MKL's header and
    /// alignment): live blocks only, since freed ones leave MKL.
    pub bytes: u64,
    /// How many such blocks.
    pub buffers: u64,
    /// Bytes of freed chunks kept beneath MKL in the block cache, at their
    /// true (mapped) sizes: not part of `bytes`.
    pub cached_bytes: u64,
    /// How many chunks the block cache keeps.
    pub cached_buffers: u64,
    /// Bytes of live chunks beneath MKL beyond what MKL asked for: mostly
    /// what a growth kept of a larger cached chunk it moved onto, to grow
    /// within it later. Resident, and neither in `bytes` nor in
    /// `cached_bytes`; bounded with `cached_bytes` by the block cache's
    /// budget.
    ///
    /// ```
    /// let s = mkl_alloc::manager::stats();
    /// let kept_beneath_mkl = s.cached_bytes + s.slack_bytes;
    /// if let Some(budget) = mkl_alloc::block_cache::budget() {
    ///     assert!(kept_beneath_mkl <= budget as u64);
    /// }
    /// ```
    pub slack_bytes: u64,
    /// Bytes in live medium blocks beneath MKL (MKL's blocks of 4 KiB up
    /// to 1 MiB, on the crate's memory: see [`backing`](crate::backing)),
    /// at their size classes' sizes. MKL counts the same blocks in
    /// `bytes`, at the sizes asked; 0 where medium blocks are off
    /// (`MKL_ALLOC_MEDIUM=off`, Windows).
    ///
    /// ```
    /// use allocator_api2::vec::Vec;
    /// use mkl_alloc::{MklAllocator, backing, manager};
    ///
    /// let before = manager::stats().medium_live_bytes;
    /// let v: Vec<u8, _> = Vec::with_capacity_in(48 << 10, MklAllocator);
    /// let during = manager::stats().medium_live_bytes;
    /// if cfg!(target_os = "linux") && backing::state() == backing::Backing::Active {
    ///     assert!(during >= before + (48 << 10));
    /// }
    /// drop(v);
    /// ```
    pub medium_live_bytes: u64,
    /// Bytes of freed medium blocks held resident for reuse ("dirty"):
    /// given back to the kernel once unused for the block cache's decay
    /// time ([`block_cache::set_decay_ms`](crate::block_cache::set_decay_ms)),
    /// or at once by [`free_buffers`]. Counted with `cached_bytes` and
    /// `slack_bytes` under the block cache's budget.
    ///
    /// ```
    /// let s = mkl_alloc::manager::stats();
    /// if let Some(budget) = mkl_alloc::block_cache::budget() {
    ///     assert!(s.cached_bytes + s.slack_bytes + s.medium_dirty_bytes <= budget as u64);
    /// }
    /// mkl_alloc::manager::free_buffers();
    /// assert_eq!(mkl_alloc::manager::stats().medium_dirty_bytes, 0);
    /// ```
    pub medium_dirty_bytes: u64,
    /// Bytes of freed medium blocks whose pages went back to the kernel
    /// ("clean"): address space kept for reuse, not memory. They read as
    /// zero when reused.
    ///
    /// ```
    /// let s = mkl_alloc::manager::stats();
    /// println!("{} bytes of medium blocks given back", s.medium_clean_bytes);
    /// ```
    pub medium_clean_bytes: u64,
    /// How many of MKL's blocks of medium size (4 KiB to 1 MiB) went to
    /// the C runtime's heap because the medium heap had no room: its
    /// address space (128 GiB at most, taken 64 MiB at a time) full or
    /// refused (a `ulimit -v` reached, the mapping limit), or none
    /// reservable at all. Since the process started; 0 in any program
    /// that stays within its limits. Such blocks work as before but are
    /// not given back after the decay time (glibc keeps freed blocks in
    /// its heap); the first one also prints a line on stderr. Not counted
    /// where medium blocks are off by choice (`MKL_ALLOC_MEDIUM=off`) or
    /// not built (Windows).
    ///
    /// ```
    /// let s = mkl_alloc::manager::stats();
    /// assert_eq!(s.medium_fallbacks, 0, "{} bytes fell back", s.medium_fallback_bytes);
    /// ```
    pub medium_fallbacks: u64,
    /// The bytes those blocks asked for (as MKL asked: its header
    /// included), summed since the process started.
    pub medium_fallback_bytes: u64,
    /// Whether MKL allocates from the crate's memory: if MKL ran before the
    /// crate's setup ([`Backing::MklRanFirst`](crate::backing::Backing)),
    /// the block cache and huge pages do not apply.
    pub backing: crate::backing::Backing,
}

impl MemStats {
    /// Bytes in blocks that are in use: MKL's own count, `bytes`. This is
    /// "memory the program holds"; the cache's chunks are apart, in
    /// `cached_bytes`.
    ///
    /// ```
    /// let s = mkl_alloc::manager::stats();
    /// assert_eq!(s.live_bytes(), s.bytes);
    /// ```
    pub fn live_bytes(&self) -> u64 {
        self.bytes
    }

    /// What MKL itself holds, `(bytes, buffers)`: the part of two
    /// snapshots to compare for "every block went back to MKL" (the cache
    /// beneath MKL may keep what MKL freed, and decays on its own).
    ///
    /// ```
    /// use mkl_alloc::{MklAllocator, manager};
    /// use allocator_api2::vec::Vec;
    ///
    /// let before = manager::stats();
    /// let v: Vec<f64, _> = Vec::with_capacity_in(1 << 20, MklAllocator);
    /// drop(v);
    /// assert_eq!(manager::stats().mkl_held(), before.mkl_held());
    /// ```
    pub fn mkl_held(&self) -> (u64, u64) {
        (self.bytes, self.buffers)
    }
}

/// Bytes and block count that MKL's memory manager currently has allocated.
///
/// ```
/// use mkl_alloc::{manager, MklAllocator};
/// use allocator_api2::vec::Vec;
///
/// let before = manager::stats();
/// let v: Vec<u8, _> = Vec::with_capacity_in(1 << 20, MklAllocator);
/// let during = manager::stats();
/// assert!(during.bytes >= before.bytes + (1 << 20));
/// drop(v);
/// ```
pub fn stats() -> MemStats {
    let mut buffers: c_int = 0;
    // Under the rare-call lock, which a fork's prepare handler takes
    // first: MKL_Mem_Stat takes every thread's account lock.
    // SAFETY: MKL_Mem_Stat writes one int through a valid pointer.
    let bytes = fork_guard::rare(|| unsafe { ffi::MKL_Mem_Stat(&mut buffers) });
    let (cached_bytes, cached_buffers) = crate::block_cache::held();
    let (medium_live, medium_dirty, medium_clean) = crate::backing::medium::figures();
    let (fallbacks, fallback_bytes) = crate::backing::medium::fallbacks();
    MemStats {
        bytes: bytes.max(0) as u64,
        buffers: buffers.max(0) as u64,
        cached_bytes: cached_bytes as u64,
        cached_buffers: cached_buffers as u64,
        slack_bytes: crate::backing::slack_bytes() as u64,
        medium_live_bytes: medium_live as u64,
        medium_dirty_bytes: medium_dirty as u64,
        medium_clean_bytes: medium_clean as u64,
        medium_fallbacks: fallbacks as u64,
        medium_fallback_bytes: fallback_bytes as u64,
        backing: crate::backing::state(),
    }
}

/// Starts (or restarts) recording peak usage (off by default;
/// `MKL_Peak_Mem_Usage(MKL_PEAK_MEM_ENABLE)`).
///
/// MKL's peak is relative: it counts the growth of MKL's allocated bytes
/// from this moment, starting at 0. Blocks already live are not counted, and
/// freeing them lowers the running total below 0 (reported as 0). Avoid
/// that: after such a free MKL's peak was measured to stay wrong for the
/// rest of the process (an 8 MiB block allocated and freed afterwards read
/// as a peak of 0, also after disabling, re-enabling and resetting).
///
/// ```standalone_crate
/// use mkl_alloc::manager;
///
/// manager::enable_peak_tracking();
/// let v: allocator_api2::vec::Vec<u8, _> =
///     allocator_api2::vec::Vec::with_capacity_in(1 << 20, mkl_alloc::MklAllocator);
/// assert!(manager::peak_bytes().unwrap() >= 1 << 20);
/// drop(v);
/// manager::disable_peak_tracking();
/// ```
pub fn enable_peak_tracking() {
    peak(ffi::MKL_PEAK_MEM_ENABLE);
}

/// Stops recording the peak; [`peak_bytes`] then returns `None`.
///
/// ```
/// mkl_alloc::manager::disable_peak_tracking();
/// assert_eq!(mkl_alloc::manager::peak_bytes(), None);
/// ```
pub fn disable_peak_tracking() {
    peak(ffi::MKL_PEAK_MEM_DISABLE);
}

/// The highest growth of MKL's allocated bytes since tracking was enabled or
/// last reset (see [`enable_peak_tracking`]); `None` while tracking is off.
///
/// ```standalone_crate
/// use mkl_alloc::manager;
///
/// manager::enable_peak_tracking();
/// assert!(manager::peak_bytes().is_some());
/// manager::disable_peak_tracking();
/// ```
pub fn peak_bytes() -> Option<u64> {
    peak(ffi::MKL_PEAK_MEM)
}

/// Returns the peak (as [`peak_bytes`]) and starts counting again from 0.
///
/// ```standalone_crate
/// use mkl_alloc::manager;
///
/// manager::enable_peak_tracking();
/// let big: allocator_api2::vec::Vec<u8, _> =
///     allocator_api2::vec::Vec::with_capacity_in(1 << 22, mkl_alloc::MklAllocator);
/// drop(big);
/// manager::free_buffers(); // the block cache kept the freed block: give it back
/// let old_peak = manager::reset_peak().unwrap();
/// assert!(old_peak >= 1 << 22);
/// assert!(manager::peak_bytes().unwrap() < old_peak);
/// manager::disable_peak_tracking();
/// ```
pub fn reset_peak() -> Option<u64> {
    peak(ffi::MKL_PEAK_MEM_RESET)
}

/// MKL answers -1 while tracking is off; any other negative value is a peak
/// below the starting point (pre-existing blocks were freed), i.e. no growth.
fn peak(mode: c_int) -> Option<u64> {
    // Rare-call lock: MKL takes every thread's account lock.
    // SAFETY: MKL_Peak_Mem_Usage takes one of the MKL_PEAK_MEM* modes by value.
    let r = fork_guard::rare(|| unsafe { ffi::MKL_Peak_Mem_Usage(mode) });
    match r {
        -1 => None,
        r => Some(r.max(0) as u64),
    }
}

/// Gives back every block kept for reuse: this crate's
/// [block cache](crate::block_cache), the dirty medium blocks beneath MKL
/// (see [`MemStats::medium_dirty_bytes`]), the small-block bins of
/// [`c_heap`](crate::c_heap) are emptied, the growth slack of live chunks
/// (their tails past what MKL last asked for) is unmapped, then MKL
/// releases the blocks its
/// own manager caches, in all threads (`MKL_Free_Buffers`). Live blocks are
/// not affected. (With MKL 2026.2 blocks served through `MKL_malloc` were
/// observed going back to libc at once, so MKL itself may have nothing
/// cached to release.)
///
/// ```
/// mkl_alloc::manager::free_buffers();
/// ```
pub fn free_buffers() {
    crate::c_heap::release_cached();
    crate::block_cache::empty();
    crate::backing::trim_slack(0);
    // Rare-call lock: MKL takes every thread's account lock.
    // SAFETY: no arguments; MKL frees only cached (not live) blocks.
    fork_guard::rare(|| unsafe { ffi::MKL_Free_Buffers() });
    // What MKL just freed of its own (medium blocks, kept dirty).
    crate::backing::medium::empty();
}

/// Releases the calling thread's cached blocks (`MKL_Thread_Free_Buffers`).
///
/// ```
/// mkl_alloc::manager::thread_free_buffers();
/// ```
pub fn thread_free_buffers() {
    // Rare-call lock: MKL takes this thread's account lock.
    // SAFETY: no arguments; MKL frees only this thread's cached blocks.
    fork_guard::rare(|| unsafe { ffi::MKL_Thread_Free_Buffers() })
}

/// Turns MKL's caching ("fast") memory manager off for the rest of the
/// process (`MKL_Disable_Fast_MM`): every later MKL block is a plain heap
/// block, freed at once. Same as running with `MKL_DISABLE_FAST_MM=1`.
/// It cannot be turned back on, and it must come before MKL allocates
/// anything.
///
/// Returns MKL's answer, which is *not* "is the manager off now". Measured
/// with oneMKL 2026.2, each case in a fresh process (`tests/fast_mm.rs`):
///
/// | Call | Returns |
/// |---|---|
/// | the first call, before any MKL allocation (`MKL_Mem_Stat` does not count) | `true`: the manager is off from now on |
/// | the same, with `MKL_DISABLE_FAST_MM=1` in the environment | `true` |
/// | any later call, after a first call returned `true` | `false`, although the manager stays off |
/// | a first call after MKL has allocated a block | `false`: too late, MKL's documentation calls it a failure and the manager stays as it was |
///
/// So `true` means "this call turned the manager off", and `false` means
/// "this call changed nothing", for either reason. [`fast_mm_disabled`]
/// remembers a `true`.
///
/// ```no_run
/// use mkl_alloc::manager;
///
/// // First thing in main, before any MKL block exists:
/// assert!(manager::disable_fast_mm());
/// assert!(!manager::disable_fast_mm()); // already off: nothing to change
/// assert!(manager::fast_mm_disabled());
/// ```
pub fn disable_fast_mm() -> bool {
    // Rare-call lock: MKL takes its manager's locks.
    // SAFETY: no arguments; only changes how later blocks are served.
    let turned_off = fork_guard::rare(|| unsafe { ffi::MKL_Disable_Fast_MM() }) != 0;
    if turned_off {
        // Relaxed: a record, read by fast_mm_disabled; MKL's own state
        // needs no ordering from us.
        DISABLED_HERE.store(true, Ordering::Relaxed);
    }
    turned_off
}

/// Set once a call of [`disable_fast_mm`] was answered with 1.
/// Sets up the crate's process-wide state now instead of at the first
/// allocation: reads `MKL_ALLOC_BLOCK_CACHE` and `MKL_ALLOC_HUGE_PAGES`,
/// registers the `fork` handlers (which wait until no other thread is
/// inside one of the crate's MKL calls, and keep the block cache
/// consistent in a child) and `membarrier` for them, creates the key that
/// marks a thread's exit across MKL's clean-up of it (it must come before
/// MKL's own keys, which MKL creates at its first call), and, in `mkl-rt`
/// builds, calls each MKL entry point the crate uses once, so that
/// libmkl_rt has resolved them (it resolves an entry at its first call
/// under an internal spin lock; a child forked while another thread held
/// it would hang at its first MKL call). Idempotent and cheap after the
/// first call.
///
/// A program that uses the crate's allocators from its first allocation
/// on (a `#[global_allocator]`) needs no call; one that forks from threads
/// and meets MKL memory later (a Python extension, a plugin) calls it
/// early, before it starts threads and before anything else calls MKL:
/// the Python package calls it at import.
///
/// ```
/// mkl_alloc::manager::init();
/// // A child forked from here on, from any thread, finds every MKL entry
/// // resolved, the crate's own locks free and no MKL lock held by the
/// // crate's calls (MKL calls made outside the crate are not covered:
/// // see docs/reliability.md, "Fork").
/// ```
pub fn init() {
    crate::process::setup();
}

static DISABLED_HERE: AtomicBool = AtomicBool::new(false);

/// Whether MKL's fast memory manager is known to be off in this process:
/// `true` if a call of [`disable_fast_mm`] returned `true` earlier, or if
/// the environment variable `MKL_DISABLE_FAST_MM` is set (to anything but
/// the empty string) right now.
///
/// What it can see, and what it cannot: MKL offers no query of its own, and
/// the manager's state has no effect this crate could observe (blocks from
/// `MKL_malloc` went to and from libc's heap identically with the manager on
/// and off, measured with oneMKL 2026.2). So this function reports only
/// what this crate knows: its own successful call, and the variable as the
/// process environment holds it now. It does not see a call made directly
/// through [`ffi::MKL_Disable_Fast_MM`] or by other code linked into the
/// process, nor whether MKL read the variable before it was set or changed
/// (MKL reads it itself, when it initialises), nor which values MKL honours
/// (its documentation names `1`). A `false` therefore means "not known to
/// be off", not "on".
///
/// ```
/// use mkl_alloc::manager;
///
/// let known_off = manager::fast_mm_disabled();
/// if std::env::var_os("MKL_DISABLE_FAST_MM").is_some_and(|v| !v.is_empty()) {
///     assert!(known_off);
/// }
/// ```
pub fn fast_mm_disabled() -> bool {
    DISABLED_HERE.load(Ordering::Relaxed)
        || std::env::var_os("MKL_DISABLE_FAST_MM").is_some_and(|v| !v.is_empty())
}

/// Why [`set_mcdram_limit`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitError {
    /// The limit that was asked for, in bytes.
    pub bytes: usize,
    /// MKL's status code.
    pub status: i32,
}

impl core::fmt::Display for LimitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "MKL refused a memory limit of {} bytes (MKL_Set_Memory_Limit returned {})",
            self.bytes, self.status
        )
    }
}

impl std::error::Error for LimitError {}

/// Limits how much high-bandwidth memory (MCDRAM) MKL's manager may use
/// (`MKL_Set_Memory_Limit(MKL_MEM_MCDRAM, bytes)`). MKL's only memory limit
/// is this one; on machines without MCDRAM it has no effect on ordinary RAM.
/// MKL 2026 marks the call deprecated and prints a warning on stdout when it
/// is made.
///
/// ```
/// assert!(mkl_alloc::manager::set_mcdram_limit(1 << 30).is_ok());
/// ```
pub fn set_mcdram_limit(bytes: usize) -> Result<(), LimitError> {
    // Rare-call lock: MKL takes its manager's locks.
    // SAFETY: memory type and limit are passed by value.
    let status =
        fork_guard::rare(|| unsafe { ffi::MKL_Set_Memory_Limit(ffi::MKL_MEM_MCDRAM, bytes) });
    if status == 0 {
        Ok(())
    } else {
        Err(LimitError { bytes, status })
    }
}
