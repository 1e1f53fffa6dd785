//! MKL's memory manager as a whole, as mkl-service exposes it: the counts
//! (`_mem_stat`, wrapped by `mkl_alloc.mem_stat`), peak tracking and
//! `free_buffers`. They act on every MKL block of the process, `MKLMemory`'s,
//! the NumPy handler's and MKL's own routines' alike.

use core::ffi::c_int;

use mkl_alloc::{ffi as mkl_ffi, manager};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// _mem_stat() -> (bytes, buffers, cached_bytes, cached_buffers): what
/// MKL's memory manager has allocated right now (``MKL_Mem_Stat``), and how
/// much of it is freed blocks the crate's block cache keeps for reuse (MKL
/// still counts them). Wrapped by ``mkl_alloc.mem_stat``.
#[pyfunction]
pub fn _mem_stat() -> (u64, u64, u64, u64) {
    let s = manager::stats();
    (s.bytes, s.buffers, s.cached_bytes, s.cached_buffers)
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
