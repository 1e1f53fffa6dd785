//! MKL's memory manager as a whole, as mkl-service exposes it: the counts
//! (`_mem_stat`, wrapped by `mkl_alloc.mem_stat`), peak tracking and
//! `free_buffers`. They act on every MKL block of the process, `MKLMemory`'s,
//! the NumPy handler's and MKL's own routines' alike. `backing` says whether
//! MKL allocates from the crate's memory at all (`mkl_alloc::backing::state`).
//! `_settings` and `_mkl_info` are what `mkl_alloc.show_config()` reports.

use core::ffi::{c_char, c_int};

use mkl_alloc::backing::{self as mkl_backing, Backing};
use mkl_alloc::huge_pages::{self, Status};
use mkl_alloc::{block_cache, ffi as mkl_ffi, manager};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};

// libmkl_rt's service functions for the report (`_mkl_info`): the crate's
// `ffi` binds only the memory functions. The extension links libmkl_rt
// (the crate's `mkl-rt` mode), which exports these.
unsafe extern "C" {
    fn MKL_Get_Version_String(buf: *mut c_char, len: c_int);
    fn MKL_Set_Interface_Layer(code: c_int) -> c_int;
    fn MKL_Set_Threading_Layer(code: c_int) -> c_int;
    fn MKL_Get_Max_Threads() -> c_int;
}

/// _mem_stat() -> (bytes, buffers, cached_bytes, cached_buffers,
/// slack_bytes, medium_dirty_bytes, medium_clean_bytes): what MKL's memory
/// manager has allocated right now (``MKL_Mem_Stat``, live blocks), what
/// the crate's block cache keeps beneath MKL, the slack live chunks keep
/// beyond what MKL asked for (a growth onto a larger cached chunk), and the
/// freed medium blocks kept for reuse and given back. Wrapped by
/// ``mkl_alloc.mem_stat``.
#[pyfunction]
pub fn _mem_stat() -> (u64, u64, u64, u64, u64, u64, u64) {
    let s = manager::stats();
    (
        s.bytes,
        s.buffers,
        s.cached_bytes,
        s.cached_buffers,
        s.slack_bytes,
        s.medium_dirty_bytes,
        s.medium_clean_bytes,
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

/// _settings() -> dict: the crate's settings in force, for
/// ``mkl_alloc.show_config()``: ``block_cache_budget`` (bytes, or ``None``
/// while the cache is off), ``block_cache_default_budget`` (what
/// ``MKL_ALLOC_BLOCK_CACHE=on`` or unset gives), ``block_cache_decay_ms``,
/// ``huge_pages_threshold`` (bytes, or ``None`` while off),
/// ``huge_pages_default_threshold``, ``huge_pages_kernel`` (the kernel's
/// transparent-huge-page mode: ``"always"``, ``"madvise"``, ``"never"``,
/// ``"unavailable"``, or ``"large-pages"`` on Windows),
/// ``huge_pages_unavailable`` (why blocks get no huge pages, or ``None``),
/// ``huge_pages_advised_bytes``, ``fast_mm_disabled`` (whether this
/// process turned MKL's own caches off through the crate),
/// ``fork_holds_mkl_locks`` (whether a fork holds MKL's own memory-manager
/// locks, so that children of threads calling MKL without the crate never
/// inherit one taken), and where the
/// budget, the decay and the threshold came from (``mkl_alloc::manager::
/// settings()``): ``block_cache_source``, ``block_cache_decay_source`` and
/// ``huge_pages_source``, each ``"default"``, ``"environment"`` or
/// ``"program"`` (``_configure``, or the crate's setters); and the medium
/// blocks: ``medium_blocks`` (whether MKL's blocks of 4 KiB-1 MiB are the
/// crate's), ``medium_source`` (``"environment"`` where
/// ``MKL_ALLOC_MEDIUM=off`` turned them off, else ``"default"``),
/// ``medium_fallbacks`` and ``medium_fallback_bytes`` (medium-size blocks
/// the C runtime served because the medium heap had no room, since the
/// process started).
#[pyfunction]
pub fn _settings(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("block_cache_budget", block_cache::budget())?;
    d.set_item("block_cache_default_budget", block_cache::default_budget())?;
    d.set_item("block_cache_decay_ms", block_cache::decay_ms())?;
    d.set_item("block_cache_default_decay_ms", block_cache::DECAY_MS)?;
    d.set_item("huge_pages_threshold", huge_pages::threshold())?;
    d.set_item(
        "huge_pages_default_threshold",
        huge_pages::DEFAULT_THRESHOLD,
    )?;
    let kernel = match huge_pages::status() {
        Status::Always => "always",
        Status::Madvise => "madvise",
        Status::Never => "never",
        Status::LargePages => "large-pages",
        Status::Unavailable => "unavailable",
    };
    d.set_item("huge_pages_kernel", kernel)?;
    d.set_item(
        "huge_pages_unavailable",
        huge_pages::unavailable_reason().map(|r| r.to_string()),
    )?;
    d.set_item("huge_pages_advised_bytes", huge_pages::advised_bytes())?;
    d.set_item("fast_mm_disabled", manager::fast_mm_disabled())?;
    let s = manager::settings();
    d.set_item("fork_holds_mkl_locks", s.fork_holds_mkl_locks)?;
    d.set_item("block_cache_source", source_name(s.block_cache_source))?;
    d.set_item("block_cache_decay_source", source_name(s.decay_source))?;
    d.set_item("huge_pages_source", source_name(s.huge_pages_source))?;
    d.set_item("medium_blocks", s.medium_blocks)?;
    d.set_item("medium_source", source_name(s.medium_source))?;
    let m = manager::stats();
    d.set_item("medium_fallbacks", m.medium_fallbacks)?;
    d.set_item("medium_fallback_bytes", m.medium_fallback_bytes)?;
    Ok(d)
}

/// A setting's source as `_settings` names it.
fn source_name(s: manager::Source) -> &'static str {
    match s {
        manager::Source::Default => "default",
        manager::Source::Environment => "environment",
        manager::Source::Program => "program",
    }
}

/// What `_configure` refuses: the message, and whether the value was of a
/// wrong type (`TypeError`) rather than a wrong value (`ValueError`).
struct Refusal {
    type_error: bool,
    why: String,
}

/// A non-negative whole number that fits a `usize`, from a Python int (or
/// any object with `__index__`, NumPy's integers among them; not a bool).
fn byte_count(value: &Bound<'_, PyAny>, what: &str) -> Result<usize, Refusal> {
    let n: i128 = match value.extract() {
        Ok(n) => n,
        Err(e) if e.is_instance_of::<PyOverflowError>(value.py()) => {
            let negative = value.lt(0).unwrap_or(false);
            return Err(Refusal {
                type_error: false,
                why: if negative {
                    format!("{what} cannot be negative")
                } else {
                    format!("{what} must be at most {} (usize::MAX)", usize::MAX)
                },
            });
        }
        Err(_) => {
            return Err(Refusal {
                type_error: true,
                why: format!("{what} must be an int"),
            });
        }
    };
    if n < 0 {
        return Err(Refusal {
            type_error: false,
            why: format!("{what} cannot be negative"),
        });
    }
    usize::try_from(n).map_err(|_| Refusal {
        type_error: false,
        why: format!("{what} must be at most {} (usize::MAX)", usize::MAX),
    })
}

/// A size setting (`block_cache`, `huge_pages`) by the environment's rules
/// (`manager::parse_size`): `None` (off) or the bytes; `on` is `on_bytes`.
fn size_setting(value: &Bound<'_, PyAny>, on_bytes: usize) -> Result<Option<usize>, Refusal> {
    const TAKES: &str =
        "it takes a byte count (an int, 0 for off), 'on', 'off', True, False or None";
    if value.is_none() {
        return Ok(None);
    }
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(b.is_true().then_some(on_bytes));
    }
    if let Ok(s) = value.cast::<PyString>() {
        let s = s.to_cow().map_err(|_| Refusal {
            type_error: false,
            why: format!("the string is not valid text; {TAKES}"),
        })?;
        return manager::parse_size(&s, on_bytes).map_err(|e| Refusal {
            type_error: false,
            why: format!("{e}; {TAKES}"),
        });
    }
    let n = byte_count(value, "a byte count").map_err(|r| Refusal {
        why: format!("{}; {TAKES}", r.why),
        ..r
    })?;
    Ok((n != 0).then_some(n))
}

/// _configure(changes: dict) -> None: sets the settings named in
/// ``changes`` (``block_cache``, ``huge_pages``, ``decay_ms``), for
/// ``mkl_alloc.configure``, with the environment variables' rules
/// (``mkl_alloc::manager::parse_size``) and the crate's setters
/// (``manager::set_block_cache``, ``set_huge_pages``, ``set_decay_ms``),
/// which record the program as each one's source. Every value is checked
/// before any is set: a refused one (``ValueError`` for a wrong value,
/// ``TypeError`` for a wrong type, each naming the call and saying why)
/// leaves every setting as it was.
#[pyfunction]
pub fn _configure(py: Python<'_>, changes: &Bound<'_, PyDict>) -> PyResult<()> {
    let mut block_cache = None;
    let mut huge_pages = None;
    let mut decay_ms = None;
    for (key, value) in changes.iter() {
        let name: String = key.extract()?;
        let checked = match name.as_str() {
            "block_cache" => {
                size_setting(&value, block_cache::default_budget()).map(|v| block_cache = Some(v))
            }
            "huge_pages" => {
                size_setting(&value, huge_pages::DEFAULT_THRESHOLD).map(|v| huge_pages = Some(v))
            }
            "decay_ms" => {
                let bool_or_str =
                    value.is_instance_of::<PyBool>() || value.is_instance_of::<PyString>();
                if bool_or_str {
                    Err(Refusal {
                        type_error: true,
                        why: "the decay time must be an int (milliseconds)".to_owned(),
                    })
                } else {
                    byte_count(&value, "the decay time (milliseconds)").map(|v| decay_ms = Some(v))
                }
            }
            _ => Err(Refusal {
                type_error: true,
                why: "no such setting: configure takes block_cache, huge_pages and decay_ms"
                    .to_owned(),
            }),
        };
        if let Err(r) = checked {
            let msg = format!(
                "mkl_alloc.configure({name}={}) refused: {}; nothing was changed",
                value.repr()?,
                r.why
            );
            return Err(if r.type_error {
                PyTypeError::new_err(msg)
            } else {
                PyValueError::new_err(msg)
            });
        }
    }
    // A disabled cache unmaps its chunks: MKL calls, with the interpreter
    // detached and behind the fork gate, as `free_buffers`.
    py.detach(|| {
        crate::fork_gate::pass(|| {
            if let Some(b) = block_cache {
                manager::set_block_cache(b);
            }
            if let Some(ms) = decay_ms {
                manager::set_decay_ms(ms);
            }
            if let Some(t) = huge_pages {
                manager::set_huge_pages(t);
            }
        })
    });
    Ok(())
}

/// _mkl_info() -> (version, interface, threading, max_threads): libmkl_rt's
/// version string (``MKL_Get_Version_String``), its interface and threading
/// layers as codes (``MKL_Set_Interface_Layer(-1)`` and
/// ``MKL_Set_Threading_Layer(-1)``: an invalid code changes nothing and
/// returns the layer in force, as threadpoolctl asks it; -1 where MKL does
/// not say) and ``MKL_Get_Max_Threads()``.
#[pyfunction]
pub fn _mkl_info() -> (String, i32, i32, i32) {
    let mut buf = [0 as c_char; 256];
    // SAFETY: MKL writes at most `len` bytes, NUL-terminated, into `buf`.
    unsafe { MKL_Get_Version_String(buf.as_mut_ptr(), buf.len() as c_int) };
    // Terminated within the buffer whatever MKL wrote: the last byte is
    // forced to NUL before reading.
    buf[buf.len() - 1] = 0;
    // SAFETY: `buf` holds a NUL-terminated string (the last byte at least).
    let version = unsafe { core::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .trim()
        .to_owned();
    // SAFETY: -1 is no layer: MKL returns the one in force and sets nothing.
    let interface = unsafe { MKL_Set_Interface_Layer(-1) };
    // SAFETY: as above.
    let threading = unsafe { MKL_Set_Threading_Layer(-1) };
    // SAFETY: no arguments; reads MKL's thread setting.
    let threads = unsafe { MKL_Get_Max_Threads() };
    (version, interface, threading, threads)
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
