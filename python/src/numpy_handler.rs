//! NumPy arrays on MKL memory: a NEP 49 data-memory handler.
//!
//! `numpy_handler(alignment)` is a `"mem_handler"` capsule over a version-1
//! `PyDataMem_Handler` whose four functions are the crate's
//! [`c_heap`](mkl_alloc::c_heap): MKL blocks with their size and alignment
//! in a header (NumPy's `free` size is not reliable, so it is never used),
//! small blocks reused from lock-free bins, and blocks of 4 MiB and more
//! advised onto huge pages when NumPy's own switch
//! (`numpy._core.multiarray._get_madvise_hugepage()`) is on: the switch is
//! read each time the handler is installed (`set_numpy_handler`,
//! `numpy_memory`) and applies to that alignment's handler from then on.
//! (The crate's global huge-page policy, on by default from 4 MiB, advises
//! large blocks whatever the switch; the switch matters where it is off.)
//!
//! One handler (a static struct) and one capsule (kept for ever) per
//! alignment 2^0 ..= 2^30, so `numpy_handler(a)` is the same object on every
//! call, and arrays that outlive any context still free through a live
//! handler. The functions are `extern "C"`, never need the GIL, never
//! panic, and return NULL on failure (NumPy raises `MemoryError`).
//!
//! `PyDataMem_SetHandler` is not bound by rust-numpy 0.30 (it is commented
//! out there), so it is called through NumPy's C-API table (`_ARRAY_API`,
//! slot 304), after checking the table's feature version (NEP 49: NumPy 1.22).

use core::ffi::{c_char, c_uint, c_void};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

use mkl_alloc::MAX_ALIGN;
use mkl_alloc::c_heap::{self, CHeap};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyCapsule;

use crate::mkl_memory::alignment_arg;

/// The handler's name, as `numpy._core.multiarray.get_handler_name` reports it.
const NAME: &[u8] = b"mkl_alloc";
/// The capsule name NumPy requires.
const CAPSULE_NAME: &core::ffi::CStr = c"mem_handler";
/// One handler per power of two 2^0 ..= 2^30.
const N: usize = MAX_ALIGN.trailing_zeros() as usize + 1;
/// `NPY_1_22_API_VERSION`: the C-API feature version that has NEP 49.
const NEP49_FEATURE_VERSION: c_uint = 0x0f;
/// Slots of NumPy's C-API table (stable since NumPy 1.22, same in 2.x).
const SLOT_FEATURE_VERSION: usize = 211;
const SLOT_SET_HANDLER: usize = 304;

/// NumPy's `PyDataMemAllocator` (ndarraytypes.h).
#[repr(C)]
struct PyDataMemAllocator {
    ctx: *mut c_void,
    malloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    calloc: unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    realloc: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize),
}

/// NumPy's `PyDataMem_Handler`, version 1.
#[repr(C)]
struct PyDataMemHandler {
    name: [c_char; 127],
    version: u8,
    allocator: PyDataMemAllocator,
}

/// A handler in a static: NumPy only reads it, from any thread.
struct Handler(PyDataMemHandler);

// SAFETY: never written after compile time; `ctx` is an alignment stored as
// an address-free pointer, not a reference to shared data.
unsafe impl Sync for Handler {}

const fn handler(shift: usize) -> Handler {
    let mut name = [0 as c_char; 127];
    let mut i = 0;
    while i < NAME.len() {
        name[i] = NAME[i] as c_char;
        i += 1;
    }
    Handler(PyDataMemHandler {
        name,
        version: 1,
        allocator: PyDataMemAllocator {
            // The alignment itself, as the context: no provenance, never dereferenced.
            ctx: ptr::without_provenance_mut(1 << shift),
            malloc: h_malloc,
            calloc: h_calloc,
            realloc: h_realloc,
            free: h_free,
        },
    })
}

static HANDLERS: [Handler; N] = {
    let mut h = [const { handler(0) }; N];
    let mut s = 1;
    while s < N {
        h[s] = handler(s);
        s += 1;
    }
    h
};

/// Per alignment: advise blocks of 4 MiB and more onto huge pages (NumPy's
/// switch, read when the handler is installed).
static HUGE: [AtomicBool; N] = [const { AtomicBool::new(false) }; N];

/// The capsules, made once and kept for ever (immortal).
static CAPSULES: [PyOnceLock<Py<PyCapsule>>; N] = [const { PyOnceLock::new() }; N];

/// The heap behind a handler context (its alignment) in force now.
#[inline(always)]
fn heap(ctx: *mut c_void) -> Option<CHeap> {
    let align = ctx.addr();
    let huge = HUGE[align.trailing_zeros() as usize % N].load(Relaxed);
    Some(CHeap::new(align)?.with_huge_pages(huge))
}

unsafe extern "C" fn h_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    heap(ctx).map_or(ptr::null_mut(), |h| h.malloc(size).cast())
}

unsafe extern "C" fn h_calloc(ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    heap(ctx).map_or(ptr::null_mut(), |h| h.calloc(nelem, elsize).cast())
}

/// # Safety
/// NumPy's contract: `ptr` is null or a live block this handler returned.
unsafe extern "C" fn h_realloc(ctx: *mut c_void, ptr: *mut c_void, new_size: usize) -> *mut c_void {
    match heap(ctx) {
        // SAFETY: NumPy reallocates only blocks of the handler stored in
        // the array, which is this one (any alignment: all are c_heap's).
        Some(h) => unsafe { h.realloc(ptr.cast(), new_size).cast() },
        None => ptr::null_mut(),
    }
}

/// `size` is ignored: NumPy's is not reliable; the block's header knows.
///
/// # Safety
/// NumPy's contract: `ptr` is null or a live block of this handler, freed once.
unsafe extern "C" fn h_free(_ctx: *mut c_void, ptr: *mut c_void, _size: usize) {
    // SAFETY: as above.
    unsafe { c_heap::free(ptr.cast()) }
}

/// The capsule of the handler for `align` (a valid alignment).
fn capsule(py: Python<'_>, align: usize) -> PyResult<&'static Py<PyCapsule>> {
    let shift = align.trailing_zeros() as usize;
    CAPSULES[shift].get_or_try_init(py, || {
        let h = NonNull::from(&HANDLERS[shift].0).cast::<c_void>();
        // SAFETY: a static handler, valid for ever; NumPy only reads it
        // (the capsule API's `*mut` is not a licence to write here).
        unsafe { PyCapsule::new_with_pointer(py, h, CAPSULE_NAME) }.map(Bound::unbind)
    })
}

/// numpy_handler(alignment=64) -> capsule
///
/// The NEP 49 data-memory handler that puts NumPy's array data on MKL
/// memory aligned to ``alignment`` (a power of two from 1 to 2**30; under
/// 64 means 64), as a ``"mem_handler"`` capsule for ``set_numpy_handler``.
/// NumPy reports its name as ``"mkl_alloc"``. There is one handler per
/// alignment, the same object on every call, never freed.
#[pyfunction]
#[pyo3(signature = (alignment = None), text_signature = "(alignment=64)")]
pub fn numpy_handler(
    py: Python<'_>,
    alignment: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyCapsule>> {
    let align = match alignment {
        Some(a) => alignment_arg("numpy_handler", a)?,
        None => 64,
    };
    Ok(capsule(py, align)?.clone_ref(py))
}

/// NumPy's C-API table, checked to have NEP 49.
fn api(py: Python<'_>) -> PyResult<usize> {
    static API: PyOnceLock<usize> = PyOnceLock::new();
    API.get_or_try_init(py, || {
        let module = py
            .import("numpy._core._multiarray_umath")
            .or_else(|_| py.import("numpy.core._multiarray_umath"))?;
        let cap = module.getattr("_ARRAY_API")?;
        let cap = cap.cast::<PyCapsule>()?;
        // SAFETY: a live capsule; NumPy's table capsule has no name (NULL),
        // as NumPy's own import_array reads it.
        let table = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), ptr::null()) };
        if table.is_null() {
            return Err(PyErr::fetch(py));
        }
        let table = table.cast::<*const c_void>();
        // SAFETY: slot 211 is PyArray_GetNDArrayCFeatureVersion,
        // `unsigned int (void)`, in every NumPy that has the table.
        let version = unsafe {
            let f: unsafe extern "C" fn() -> c_uint =
                core::mem::transmute(*table.add(SLOT_FEATURE_VERSION));
            f()
        };
        if version < NEP49_FEATURE_VERSION {
            return Err(PyRuntimeError::new_err(format!(
                "set_numpy_handler: this NumPy's C-API feature version is {version:#x}; \
                 data-memory handlers (NEP 49) need NumPy 1.22 or later ({NEP49_FEATURE_VERSION:#x})"
            )));
        }
        Ok(table as usize)
    })
    .copied()
}

/// NumPy's huge-page switch (`_get_madvise_hugepage()`).
fn numpy_madvise_hugepage(py: Python<'_>) -> PyResult<bool> {
    let m = py
        .import("numpy._core.multiarray")
        .or_else(|_| py.import("numpy.core.multiarray"))?;
    m.getattr("_get_madvise_hugepage")?.call0()?.is_truthy()
}

/// The shift of one of our handlers, if `capsule_ptr` points at one.
fn ours(handler: *const c_void) -> Option<usize> {
    HANDLERS
        .iter()
        .position(|h| ptr::eq(ptr::from_ref(&h.0).cast::<c_void>(), handler))
}

/// set_numpy_handler(handler) -> previous handler
///
/// Installs ``handler`` (a ``"mem_handler"`` capsule, such as
/// ``numpy_handler()``'s, or ``None`` for NumPy's default) as NumPy's
/// data-memory handler for the current context (NumPy's ContextVar: this
/// thread or asyncio task) and returns the handler it replaces. Anything
/// else is refused (``TypeError`` for a non-capsule, ``ValueError`` for a
/// capsule of another kind) and nothing changes. Installing an mkl_alloc
/// handler reads NumPy's huge-page switch
/// (``numpy._core.multiarray._get_madvise_hugepage()``): while it is on,
/// that handler advises its blocks of 4 MiB and more onto huge pages, as
/// NumPy's default does. The library's own huge-page policy
/// (``MKL_ALLOC_HUGE_PAGES``, on by default from 4 MiB) advises large MKL
/// blocks, the handler's included, whatever NumPy's switch says.
#[pyfunction]
pub fn set_numpy_handler<'py>(
    py: Python<'py>,
    handler: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let raw = if handler.is_none() {
        ptr::null_mut()
    } else if !handler.is_instance_of::<PyCapsule>() {
        return Err(PyTypeError::new_err(format!(
            "set_numpy_handler(handler): the handler must be a \"mem_handler\" capsule \
             (numpy_handler()) or None, not {}",
            handler.get_type().name()?
        )));
    } else {
        // SAFETY: a live capsule; IsValid sets no exception.
        if unsafe { ffi::PyCapsule_IsValid(handler.as_ptr(), CAPSULE_NAME.as_ptr()) } != 1 {
            return Err(PyValueError::new_err(format!(
                "set_numpy_handler(handler): {} is not a \"mem_handler\" capsule \
                 (a NEP 49 data-memory handler)",
                handler.repr()?
            )));
        }
        handler.as_ptr()
    };
    let table = api(py)? as *const *const c_void;
    if !raw.is_null() {
        // SAFETY: a valid "mem_handler" capsule (checked above).
        let h = unsafe { ffi::PyCapsule_GetPointer(raw, CAPSULE_NAME.as_ptr()) };
        if let Some(shift) = ours(h) {
            HUGE[shift].store(numpy_madvise_hugepage(py)?, Relaxed);
        }
    }
    // SAFETY: slot 304 is `PyObject *PyDataMem_SetHandler(PyObject *)`
    // (feature version checked by `api`); it takes a "mem_handler" capsule
    // or NULL (the default) without stealing it and returns a new reference
    // to the previous handler, or NULL with an exception set.
    unsafe {
        let set: unsafe extern "C" fn(*mut ffi::PyObject) -> *mut ffi::PyObject =
            core::mem::transmute(*table.add(SLOT_SET_HANDLER));
        Bound::from_owned_ptr_or_err(py, set(raw))
    }
}
