//! `mkl_alloc._native`: the extension module behind the Python package
//! `mkl_alloc` (see python/README.md). This file is its table of contents;
//! each part lives in its own module:
//!
//! | Module | Python names |
//! |---|---|
//! | [`mkl_memory`] | `MKLMemory`: MKL memory exported through the buffer protocol and DLPack, with a `realloc` refused while exports live |
//! | [`dlpack`] | the DLPack capsules `MKLMemory.__dlpack__` returns; `_is_mkl_dlpack` |
//! | [`memory_manager`] | `_mem_stat` (behind `mkl_alloc.mem_stat`), `peak_mem_usage`, `free_buffers`: MKL's memory manager as mkl-service exposes it; `backing`: whether MKL allocates from the crate's memory |
//! | [`numpy_handler`] | `numpy_handler`, `set_numpy_handler`: NumPy's data on MKL memory (NEP 49) |
//! | [`fork_gate`] | none: keeps `fork` from landing inside the MKL calls made with the interpreter detached |
//!
//! The Python part (`mkl_alloc/__init__.py`) wraps these; the stub
//! `mkl_alloc/_native.pyi` types them.
#![deny(unsafe_op_in_unsafe_fn)]

mod dlpack;
mod fork_gate;
mod memory_manager;
mod mkl_memory;
mod numpy_handler;

use mkl_alloc::MAX_ALIGN;
use pyo3::prelude::*;

/// The extension module. The names are added in the order of the stub's
/// `__all__` (PyO3 lists them in `_native.__all__` as they are added).
#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Before any user code can start threads or fork: read the crate's
    // policies, register its fork handlers, and have libmkl_rt resolve every
    // MKL entry point the crate calls. libmkl_rt resolves an entry at its
    // first call under an internal spin lock; a process forked while another
    // thread held it (making its first MKLMemory, say) hangs in the child.
    mkl_alloc::manager::init();
    // MKL's own memory manager has per-thread locks and no fork handler: a
    // fork waits until no thread is inside an MKL call made detached.
    fork_gate::register().map_err(|rc| {
        pyo3::exceptions::PyOSError::new_err(format!(
            "mkl_alloc: pthread_atfork(), registering the handlers that keep fork out of \
             MKL's memory manager, failed with error {rc}"
        ))
    })?;
    m.add_class::<mkl_memory::MKLMemory>()?;
    m.add_function(wrap_pyfunction!(memory_manager::_mem_stat, m)?)?;
    m.add_function(wrap_pyfunction!(memory_manager::peak_mem_usage, m)?)?;
    m.add_function(wrap_pyfunction!(memory_manager::free_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(memory_manager::backing, m)?)?;
    m.add("MAX_ALIGNMENT", MAX_ALIGN)?;
    m.add_function(wrap_pyfunction!(numpy_handler::numpy_handler, m)?)?;
    m.add_function(wrap_pyfunction!(numpy_handler::set_numpy_handler, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::_is_mkl_dlpack, m)?)?;
    m.add(
        "SizeOverflowError",
        mkl_memory::size_overflow_error(m.py())?,
    )?;
    Ok(())
}
