//! `mkl_alloc._native`: the extension module behind the Python package
//! `mkl_alloc` (see python/README.md). This file is its table of contents;
//! each part lives in its own module:
//!
//! | Module | Python names |
//! |---|---|
//! | [`mkl_memory`] | `MKLMemory`: MKL memory exported through the buffer protocol and DLPack, with a `realloc` refused while exports live |
//! | [`dlpack`] | the DLPack capsules `MKLMemory.__dlpack__` returns; `_is_mkl_dlpack` |
//! | [`memory_manager`] | `_mem_stat` (behind `mkl_alloc.mem_stat`), `peak_mem_usage`, `free_buffers`: MKL's memory manager as mkl-service exposes it; `backing`: whether MKL allocates from the crate's memory; `_settings`, `_mkl_info`: what `mkl_alloc.show_config()` reports; `_configure`: `mkl_alloc.configure()`'s settings |
//! | [`numpy_handler`] | `numpy_handler`, `set_numpy_handler`: NumPy's data on MKL memory (NEP 49) |
//! | [`fork_gate`] | none: keeps `fork` from landing inside the MKL calls made with the interpreter detached |
//! | this file | `_background_start`, `_background_stop`, `background_running`: the crate's background decay thread (`mkl_alloc::background`), behind `mkl_alloc.background_start()` & co. |
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
    m.add_function(wrap_pyfunction!(memory_manager::_settings, m)?)?;
    m.add_function(wrap_pyfunction!(memory_manager::_mkl_info, m)?)?;
    m.add_function(wrap_pyfunction!(memory_manager::_configure, m)?)?;
    m.add_function(wrap_pyfunction!(_background_start, m)?)?;
    m.add_function(wrap_pyfunction!(_background_stop, m)?)?;
    m.add_function(wrap_pyfunction!(background_running, m)?)?;
    Ok(())
}

/// _background_start() -> None: starts the crate's background decay thread
/// unless it runs (``mkl_alloc::background::start``); raises ``OSError``
/// saying why if the system refuses a thread. Wrapped by
/// ``mkl_alloc.background_start``, which the import calls unless
/// ``MKL_ALLOC_BACKGROUND=off``.
#[pyfunction]
fn _background_start(py: Python<'_>) -> PyResult<()> {
    // Detached: spawning waits for no Python object, and a thread that
    // forks meanwhile is not kept out by the interpreter's lock.
    py.detach(mkl_alloc::background::start)
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("mkl_alloc: {e}")))
}

/// _background_stop() -> None: stops the background decay thread and joins
/// it (``mkl_alloc::background::stop``); nothing to do if it is not
/// running. Wrapped by ``mkl_alloc.background_stop``.
#[pyfunction]
fn _background_stop(py: Python<'_>) {
    // Detached: the join waits for the thread's current sweep.
    py.detach(mkl_alloc::background::stop);
}

/// background_running() -> bool: whether mkl-alloc's background decay
/// thread runs in this process. It unmaps cached memory unused for the
/// decay time (``settings().decay_ms``) without any further allocation;
/// the package starts it at import unless ``MKL_ALLOC_BACKGROUND=off``.
#[pyfunction]
fn background_running() -> bool {
    mkl_alloc::background::is_running()
}
