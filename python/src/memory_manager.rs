//! MKL's memory manager as a whole, as mkl-service exposes it: the counts
//! (`_mem_stat`, wrapped by `mkl_alloc.mem_stat`), peak tracking and
//! `free_buffers`. They act on every MKL block of the process, `MKLMemory`'s,
//! the NumPy handler's and MKL's own routines' alike. `backing` says whether
//! MKL allocates from the crate's memory at all (`mkl_alloc::backing::state`).

use core::ffi::c_int;

use mkl_alloc::backing::{self as mkl_backing, Backing};
use mkl_alloc::{ffi as mkl_ffi, manager};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// _mem_stat() -> (bytes, buffers, cached_bytes, cached_buffers,
/// slack_bytes): what MKL's memory manager has allocated right now
/// (``MKL_Mem_Stat``, live blocks), what the crate's block cache keeps
/// beneath MKL, and the slack live chunks keep beyond what MKL asked for
/// (a growth onto a larger cached chunk). Wrapped by ``mkl_alloc.mem_stat``.
#[pyfunction]
pub fn _mem_stat() -> (u64, u64, u64, u64, u64) {
    let s = manager::stats();
    (
        s.bytes,
        s.buffers,
        s.cached_bytes,
        s.cached_buffers,
        s.slack_bytes,
    )
}

/// backing() -> str: whether MKL allocates from the crate's memory
/// (``mkl_alloc::backing::state()``), one of:
///
/// - ``"active"``: MKL's memory pointers (``i_malloc`` & co.) are the
///   crate's, so MKL's blocks of 1 MiB or more, ``MKLMemory``'s, the NumPy
///   handler's and MKL's own, are the crate's chunks: the block cache
///   (``mem_stat().cached_bytes``), huge pages and lazy zeroing apply.
/// - ``"mkl-ran-first"``: something called MKL before ``mkl_alloc`` was
///   imported (ctypes calling libmkl_rt, mkl-service's
///   ``mkl.get_max_threads()``, NumPy or SciPy built on MKL running a
///   routine). MKL copies its pointers at its first call, so it never used
///   the crate's: it runs on the C runtime's memory, as without this
///   package. Everything still works and ``mem_stat()``'s MKL counts are
///   still right, but nothing is cached beneath MKL (``cached_bytes`` stays
///   0) and MKL's blocks get no huge pages. To get the backing, import
///   ``mkl_alloc`` first (before any module that calls MKL); or accept
///   MKL on the C runtime's memory.
/// - ``"off"``: ``MKL_ALLOC_BACKING=off`` was set when the process started,
///   or the platform has no chunks (Windows, for now): MKL runs on the C
///   runtime's memory, by choice.
/// - ``"unset"``: the crate's setup has not run; not seen after the import,
///   which runs it.
///
/// The crate learns that MKL ran first when a block it asked MKL for (an
/// ``MKLMemory``, or an array under the NumPy handler) comes back without
/// a chunk although the backing would have served it with one: 1 MiB or
/// more, or 32 MiB or more with the block cache and huge pages both off
/// (``MKL_ALLOC_BLOCK_CACHE=off``, ``MKL_ALLOC_HUGE_PAGES=off``). Until the
/// process has allocated such a block, ``"active"`` means the pointers
/// were set, not yet that MKL took them.
#[pyfunction]
pub fn backing() -> &'static str {
    match mkl_backing::state() {
        Backing::Active => "active",
        Backing::MklRanFirst => "mkl-ran-first",
        Backing::Off => "off",
        Backing::Unset => "unset",
    }
}

/// MKL's peak-memory tracking (``MKL_Peak_Mem_Usage``), as mkl-service's
/// function of the same name: ``mem_const`` is ``"enable"`` (start
/// tracking), ``"disable"`` (stop), ``"peak_mem"`` (the peak growth in bytes
/// since tracking started or was reset) or ``"peak_mem_reset"`` (the peak,
/// then restart from 0). Returns MKL's answer, or ``None`` where MKL reports
/// an error (tracking off; mkl-service returns the string ``"error"`` there).
#[pyfunction]
pub fn peak_mem_usage(mem_const: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    const CONSTS: [(&str, c_int); 4] = [
        ("enable", mkl_ffi::MKL_PEAK_MEM_ENABLE),
        ("disable", mkl_ffi::MKL_PEAK_MEM_DISABLE),
        ("peak_mem", mkl_ffi::MKL_PEAK_MEM),
        ("peak_mem_reset", mkl_ffi::MKL_PEAK_MEM_RESET),
    ];
    let asked: Option<String> = mem_const.extract().ok();
    let Some(&(_, mode)) = CONSTS
        .iter()
        .find(|(name, _)| asked.as_deref() == Some(*name))
    else {
        return Err(PyValueError::new_err(format!(
            "peak_mem_usage({}): mem_const must be one of 'enable', 'disable', \
             'peak_mem', 'peak_mem_reset'",
            mem_const.repr()?
        )));
    };
    // SAFETY: MKL_Peak_Mem_Usage takes one of the MKL_PEAK_MEM* modes.
    let r = unsafe { mkl_ffi::MKL_Peak_Mem_Usage(mode) };
    Ok((r != -1).then_some(r))
}

/// Frees the memory MKL's memory manager keeps cached for reuse, in all
/// threads (``MKL_Free_Buffers``), as mkl-service's function of the same
/// name. Live blocks (every ``MKLMemory``) are not affected.
#[pyfunction]
pub fn free_buffers(py: Python<'_>) {
    py.detach(|| crate::fork_gate::pass(manager::free_buffers))
}
