//! MKL's statistics, `MKL_Mem_Stat` and `MKL_Peak_Mem_Usage`, as the
//! emulation counts its blocks, and its other service calls:
//! `MKL_Free_Buffers`, `MKL_Thread_Free_Buffers`, `MKL_Disable_Fast_MM` and
//! `MKL_Set_Memory_Limit`.

use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::ffi::{
    MKL_MEM_MCDRAM, MKL_PEAK_MEM, MKL_PEAK_MEM_DISABLE, MKL_PEAK_MEM_ENABLE, MKL_PEAK_MEM_RESET,
};

/// Bytes MKL holds for live blocks (as counted) and how many.
static BYTES: AtomicI64 = AtomicI64::new(0);
static BUFFERS: AtomicI64 = AtomicI64::new(0);

/// Peak tracking: on/off, growth since enabling, highest growth.
static TRACKING: AtomicBool = AtomicBool::new(false);
static GROWTH: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);
/// `MKL_Disable_Fast_MM`'s answer depends on these.
pub(super) static ANY_BLOCK: AtomicBool = AtomicBool::new(false);
static FAST_MM_OFF: AtomicBool = AtomicBool::new(false);

/// Counts `size` bytes more (or fewer) in MKL's statistics.
pub(super) fn account(size: usize, grow: bool) {
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
