//! Controls of oneMKL's memory manager, as safe functions.
//!
//! MKL keeps freed blocks in per-thread caches (its "fast memory manager") and
//! counts what it holds. These functions read those counts and release or
//! disable the caches. They act on MKL's manager as a whole: blocks from
//! [`MklAllocator`](crate::MklAllocator), from `SharedMklVec` and from MKL's
//! own routines alike.

use core::ffi::c_int;

use crate::ffi;

/// What MKL's memory manager holds right now, from `MKL_Mem_Stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemStats {
    /// Bytes in blocks currently allocated through MKL (and not freed).
    pub bytes: u64,
    /// How many such blocks.
    pub buffers: u64,
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
    // SAFETY: MKL_Mem_Stat writes one int through a valid pointer.
    let bytes = unsafe { ffi::MKL_Mem_Stat(&mut buffers) };
    MemStats {
        bytes: bytes.max(0) as u64,
        buffers: buffers.max(0) as u64,
    }
}

/// Starts (or restarts) recording peak usage (off by default;
/// `MKL_Peak_Mem_Usage(MKL_PEAK_MEM_ENABLE)`).
///
/// MKL's peak is relative: it counts the growth of MKL's allocated bytes
/// from this moment, starting at 0. Blocks already live are not counted, and
/// freeing them lowers the running total below 0 (reported as 0).
///
/// ```
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
/// ```
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
/// ```
/// use mkl_alloc::manager;
///
/// manager::enable_peak_tracking();
/// let big: allocator_api2::vec::Vec<u8, _> =
///     allocator_api2::vec::Vec::with_capacity_in(1 << 22, mkl_alloc::MklAllocator);
/// drop(big);
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
    // SAFETY: MKL_Peak_Mem_Usage takes one of the MKL_PEAK_MEM* modes by value.
    let r = unsafe { ffi::MKL_Peak_Mem_Usage(mode) };
    match r {
        -1 => None,
        r => Some(r.max(0) as u64),
    }
}

/// Asks MKL to release the blocks its manager keeps cached for reuse, in all
/// threads (`MKL_Free_Buffers`). Live blocks are not affected. (With MKL
/// 2026.2 blocks served through `MKL_malloc` were observed going back to libc
/// at once, so there may be nothing cached to release.)
///
/// ```
/// mkl_alloc::manager::free_buffers();
/// ```
pub fn free_buffers() {
    // SAFETY: no arguments; MKL frees only cached (not live) blocks.
    unsafe { ffi::MKL_Free_Buffers() }
}

/// Releases the calling thread's cached blocks (`MKL_Thread_Free_Buffers`).
///
/// ```
/// mkl_alloc::manager::thread_free_buffers();
/// ```
pub fn thread_free_buffers() {
    // SAFETY: no arguments; MKL frees only this thread's cached blocks.
    unsafe { ffi::MKL_Thread_Free_Buffers() }
}

/// Turns MKL's caching ("fast") memory manager off for the rest of the
/// process (`MKL_Disable_Fast_MM`): every later MKL block is a plain heap
/// block, freed at once. Same as running with `MKL_DISABLE_FAST_MM=1`.
/// Call it before MKL allocates anything (it cannot be turned back on).
/// Returns whether MKL reports the manager as now disabled.
///
/// ```no_run
/// mkl_alloc::manager::disable_fast_mm();
/// ```
pub fn disable_fast_mm() -> bool {
    // SAFETY: no arguments; only changes how later blocks are served.
    unsafe { ffi::MKL_Disable_Fast_MM() != 0 }
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
    // SAFETY: memory type and limit are passed by value.
    let status = unsafe { ffi::MKL_Set_Memory_Limit(ffi::MKL_MEM_MCDRAM, bytes) };
    if status == 0 {
        Ok(())
    } else {
        Err(LimitError { bytes, status })
    }
}
