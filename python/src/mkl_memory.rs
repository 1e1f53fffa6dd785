//! `MKLMemory`: a bytes buffer in MKL memory, a `#[pyclass(frozen)]` over
//! `Arc<SharedMklVec<u8>>`.
//!
//! Every export (buffer protocol, DLPack) is an owned [`Export`] counted in
//! the buffer's one state word, so `realloc` (one exclusive claim,
//! `try_resize_exact`) is refused while any lives, on free-threaded CPython
//! as much as with the GIL: the count and the claim are the same word,
//! checked by the crate's loom models.
//!
//! `frozen` is essential: a non-frozen class would need a runtime borrow in
//! `__releasebuffer__`, which can fail, and PyO3 then leaks the export for
//! ever. No code here forms a `&[u8]` over the block: consumers (NumPy) write
//! it through the export's raw pointer, so reads go through raw pointers too.

use core::ffi::{c_int, c_void};
use core::ptr;
use std::sync::Arc;

use mkl_alloc::{Export, MAX_ALIGN, SharedMklVec, SharedVecError};
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyCapsule, PyDict, PyInt, PyTuple, PyType};

use crate::{dlpack, fork_gate};

/// MKL-allocated memory exported to Python through the buffer protocol and DLPack.
///
/// The constructor forms of the ``MKLMemory`` proposed for mkl-service (a
/// pull request never released: mkl-service 2.8.0 has no such class), with
/// the same meaning:
///
/// - ``MKLMemory(nbytes, *, alignment=64)``: ``nbytes`` >= 1 zero bytes;
/// - ``MKLMemory(num, size, *, alignment=64)``: ``num * size`` zero bytes
///   (``mkl_calloc``), large blocks zeroed lazily; a product beyond any
///   block is a ``MemoryError``;
/// - ``MKLMemory(other, *, alignment=other.alignment)``: a copy of another
///   ``MKLMemory`` in a new block;
///
/// and ``MKLMemory(buffer, *, alignment=64)``: a copy of any other object
/// exporting a buffer (its bytes in C order; the source stays exported
/// during the copy). Sizes and alignments may be any integer
/// (``numbers.Integral``). ``alignment`` is keyword-only, a power of two
/// from 1 to 2**30; the block's address is a multiple of it, across every
/// ``realloc``.
///
/// ``memoryview(m)``, ``np.frombuffer(m, dtype)``, ``np.asarray(m)`` and
/// ``np.from_dlpack(m)`` share the block (no copy). While any such export is
/// alive, ``realloc`` raises ``BufferError``; ``exports`` counts them.
#[pyclass(frozen, subclass, module = "mkl_alloc", name = "MKLMemory")]
pub struct MKLMemory {
    vec: Arc<SharedMklVec<u8>>,
}

/// `value` as a Python `int`, if it is an integer: an `int` (or `bool`), or
/// any other `numbers.Integral` (NumPy's integers: `np.prod(shape)` is an
/// `np.int64`), through `__index__`, as the seed takes its sizes. `None` for
/// anything else.
fn integral<'py>(value: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyInt>>> {
    if let Ok(int) = value.cast::<PyInt>() {
        return Ok(Some(int.clone()));
    }
    static INTEGRAL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = value.py();
    if !value.is_instance(INTEGRAL.import(py, "numbers", "Integral")?)? {
        return Ok(None);
    }
    static INDEX: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let index = INDEX.import(py, "operator", "index")?;
    Ok(Some(index.call1((value,))?.cast_into::<PyInt>()?))
}

/// A count from a Python integer (see [`integral`]): `TypeError` for
/// anything else, `ValueError` below 1, `MemoryError` beyond what any
/// allocation can be. `what` is the call (`MKLMemory(nbytes)`), `name` the
/// argument (`the size`, `num`), `unit` what it counts (`" byte"`, or empty).
fn count_arg(value: &Bound<'_, PyAny>, what: &str, name: &str, unit: &str) -> PyResult<usize> {
    let Some(int) = integral(value)? else {
        return Err(PyTypeError::new_err(format!(
            "{what}: {name} must be an int, not {}",
            value.get_type().name()?
        )));
    };
    match int.extract::<i64>() {
        Ok(n) if n < 1 => Err(PyValueError::new_err(format!(
            "{what}: {name} must be at least 1{unit}, got {n}"
        ))),
        Ok(n) => usize::try_from(n).map_err(|_| too_big(what, &int)),
        // Out of i64's range: a huge negative is still a ValueError.
        Err(_) if int.lt(0)? => Err(PyValueError::new_err(format!(
            "{what}: {name} must be at least 1{unit}, got {int}"
        ))),
        Err(_) => Err(too_big(what, &int)),
    }
}

/// A size in bytes: [`count_arg`] for `the size`.
fn size_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    count_arg(value, what, "the size", " byte")
}

/// A size past `Py_ssize_t` (2**63 and above): [`SizeOverflowError`], both
/// the `OverflowError` mkl-service raises there (its `Py_ssize_t` argument
/// conversion) and the `MemoryError` this package raised before, so code
/// catching either goes on working.
fn too_big(what: &str, value: &Bound<'_, PyAny>) -> PyErr {
    let message =
        format!("{what}: cannot allocate {value} bytes: more than any block can hold (isize::MAX)");
    match size_overflow_error(value.py()) {
        Ok(ty) => PyErr::from_type(ty.clone(), message),
        Err(e) => e,
    }
}

/// `mkl_alloc.SizeOverflowError`, made once: a class with two built-in
/// bases cannot be declared with PyO3's `create_exception!` (one base), so
/// it is `type(name, (OverflowError, MemoryError), namespace)`, whose
/// instances have BaseException's layout, which both bases share.
pub(crate) fn size_overflow_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        let builtins = py.import("builtins")?;
        let bases = PyTuple::new(
            py,
            [
                builtins.getattr("OverflowError")?,
                builtins.getattr("MemoryError")?,
            ],
        )?;
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "mkl_alloc")?;
        namespace.set_item(
            "__doc__",
            "A size past Py_ssize_t (2**63 bytes or more) asked of MKLMemory or its \
             realloc: an OverflowError, as mkl-service raises for it, and a MemoryError, \
             as no block can be that large.",
        )?;
        let ty = builtins
            .getattr("type")?
            .call1(("SizeOverflowError", bases, namespace))?
            .cast_into::<PyType>()?;
        Ok(ty.unbind())
    })
    .map(|ty| ty.bind(py))
}

/// An alignment from a Python integer (see [`integral`]): a power of two in
/// 1 ..= 2**30, else `ValueError` saying which rule it breaks, in the seed's
/// words for the first two ("must be positive", "must not exceed"), then
/// the power-of-two rule the seed's review found MKL needs; `TypeError` for
/// a non-integer. `what` names the callable in the message (`MKLMemory`,
/// `numpy_handler`), which takes it as its `alignment` argument.
pub(crate) fn alignment_arg(what: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    let Some(int) = integral(value)? else {
        return Err(PyTypeError::new_err(format!(
            "{what}(alignment=...): the alignment must be an int, not {}",
            value.get_type().name()?
        )));
    };
    let rule = "MKL honours a power of two from 1 to 2**30";
    let max = MAX_ALIGN as u64;
    let broken = match int.extract::<i64>() {
        Ok(a) if a > 0 && (a as u64).is_power_of_two() && a as u64 <= max => {
            return Ok(a as usize);
        }
        Ok(a) if a <= 0 => format!("must be positive; {rule}"),
        Err(_) if int.lt(0)? => format!("must be positive; {rule}"),
        Ok(a) if a as u64 <= max => format!(
            "must be a power of two from 1 to 2**30 ({MAX_ALIGN}); MKL cannot honour other values"
        ),
        _ => format!("must not exceed 2**30 ({MAX_ALIGN}); {rule}"),
    };
    Err(PyValueError::new_err(format!(
        "{what}(alignment={int}): the alignment {broken}"
    )))
}

/// The `TypeError` for a keyword argument of the wrong type, naming the
/// call, the argument, the value and what it must be: `what` is the
/// callable (`MKLMemory.realloc`), `name` the keyword, `expected` the
/// accepted values in words.
fn keyword_type_error(what: &str, name: &str, expected: &str, value: &Bound<'_, PyAny>) -> PyErr {
    let repr = value
        .repr()
        .map_or_else(|_| "...".to_owned(), |r| r.to_string());
    let ty = value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string());
    PyTypeError::new_err(format!(
        "{what}({name}={repr}): {name} must be {expected}, not {ty}"
    ))
}

/// The Python exception for a refused or failed operation on the buffer.
fn vec_error(what: &str, e: SharedVecError) -> PyErr {
    match e {
        SharedVecError::Exported { views } => PyBufferError::new_err(format!(
            "{what}: refused while {views} export(s) of the MKLMemory are alive \
             (memoryviews, NumPy arrays, DLPack capsules); release them first"
        )),
        SharedVecError::Busy => PyBufferError::new_err(format!(
            "{what}: refused because another thread is reallocating the MKLMemory right now"
        )),
        SharedVecError::TooManyViews { max } => PyBufferError::new_err(format!(
            "{what}: the MKLMemory already has the maximum of {max} exports"
        )),
        SharedVecError::AllocFailed { bytes, align } => PyMemoryError::new_err(format!(
            "{what}: MKL could not allocate {bytes} bytes aligned to {align}"
        )),
        SharedVecError::CapacityOverflow => PyMemoryError::new_err(format!(
            "{what}: the size exceeds the largest possible block (isize::MAX bytes)"
        )),
        other => PyRuntimeError::new_err(format!("{what}: {other}")),
    }
}

/// A raw pointer that may cross into `py.detach` (it is only dereferenced
/// there under the guarantees stated at each use).
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: a plain address; every dereference is justified where it happens.
unsafe impl<T> Send for SendPtr<T> {}

/// A buffer held from a source object; released on drop (attached).
struct SourceBuffer(ffi::Py_buffer);

impl SourceBuffer {
    fn get(source: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut view = core::mem::MaybeUninit::<ffi::Py_buffer>::zeroed();
        // SAFETY: `view` is writable Py_buffer storage; attached to the
        // interpreter (we hold `source`'s Bound).
        let rc = unsafe {
            ffi::PyObject_GetBuffer(source.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_FULL_RO)
        };
        if rc != 0 {
            let err = PyErr::fetch(source.py());
            if err.is_instance_of::<PyTypeError>(source.py()) {
                return Err(PyTypeError::new_err(format!(
                    "MKLMemory(x): a single argument must be an int (a size in bytes), an \
                     MKLMemory or another object exporting a buffer (both copied), not {}",
                    source.get_type().name()?
                )));
            }
            return Err(err);
        }
        // SAFETY: PyObject_GetBuffer succeeded, so it filled the view.
        Ok(Self(unsafe { view.assume_init() }))
    }
}

impl Drop for SourceBuffer {
    fn drop(&mut self) {
        // SAFETY: a view filled by PyObject_GetBuffer, released once; every
        // SourceBuffer lives and dies attached to the interpreter.
        unsafe { ffi::PyBuffer_Release(&mut self.0) };
    }
}

impl MKLMemory {
    /// An export of the block, or `BufferError` saying why not.
    fn export(&self, what: &str) -> PyResult<Export<u8>> {
        SharedMklVec::export(&self.vec).map_err(|e| vec_error(what, e))
    }

    /// `n` zero bytes aligned to `align`: `MKL_calloc`'s, so a large block is
    /// zeroed lazily (its pages are the kernel's zero pages until written).
    fn zeroed(py: Python<'_>, n: usize, align: usize, what: &str) -> PyResult<Self> {
        let vec = py
            .detach(|| fork_gate::pass(|| SharedMklVec::<u8>::zeroed_with_alignment(n, align)))
            .map_err(|e| vec_error(what, e))?;
        Ok(Self { vec: Arc::new(vec) })
    }

    /// The seed's `MKLMemory(num, size)`: `num * size` zero bytes, the
    /// product refused (`MemoryError`) where it exceeds any block.
    fn zeroed_product(
        py: Python<'_>,
        num: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        align: usize,
    ) -> PyResult<Self> {
        const WHAT: &str = "MKLMemory(num, size)";
        if integral(num)?.is_none() {
            // Most likely the old positional alignment, MKLMemory(b"...", 128).
            let hint = if integral(size)?.is_some() {
                " (to copy a buffer at an alignment, pass it by keyword: \
                 MKLMemory(source, alignment=...))"
            } else {
                ""
            };
            return Err(PyTypeError::new_err(format!(
                "{WHAT}: num (the first of two arguments) must be an int, not {}{hint}",
                num.get_type().name()?
            )));
        }
        if integral(size)?.is_none() {
            return Err(PyTypeError::new_err(format!(
                "{WHAT}: size (the second of two arguments) must be an int, not {}",
                size.get_type().name()?
            )));
        }
        let n = count_arg(num, WHAT, "num", "")?;
        let s = count_arg(size, WHAT, "size", " byte")?;
        let total = n
            .checked_mul(s)
            .filter(|&t| isize::try_from(t).is_ok())
            .ok_or_else(|| {
                PyMemoryError::new_err(format!(
                    "MKLMemory({n}, {s}): num * size = {} bytes is more than any block can \
                     hold (isize::MAX = {})",
                    n as u128 * s as u128,
                    isize::MAX
                ))
            })?;
        Self::zeroed(py, total, align, &format!("MKLMemory({n}, {s})"))
    }

    /// A copy of `source`'s bytes in a fresh block aligned to `align`.
    fn from_buffer(py: Python<'_>, source: &Bound<'_, PyAny>, align: usize) -> PyResult<Self> {
        let buffer = SourceBuffer::get(source)?;
        let len = usize::try_from(buffer.0.len).unwrap_or(0);
        if len == 0 {
            return Err(PyValueError::new_err(format!(
                "MKLMemory(source): the {} source holds 0 bytes; MKLMemory needs at least 1",
                source.get_type().name()?
            )));
        }
        let mut vec = py
            .detach(|| fork_gate::pass(|| SharedMklVec::<u8>::zeroed_with_alignment(len, align)))
            .map_err(|e| vec_error("MKLMemory(source)", e))?;
        let dst = vec.as_mut_ptr();
        // SAFETY: `buffer` stays held (exported) for the whole copy, so its
        // exporter cannot resize or free it; `dst` is a fresh block of `len`
        // bytes nobody else can see yet.
        let contiguous = unsafe { ffi::PyBuffer_IsContiguous(&buffer.0, b'C' as _) } == 1;
        if contiguous {
            let (src, dst) = (SendPtr(buffer.0.buf.cast::<u8>()), SendPtr(dst));
            py.detach(move || {
                let (src, dst) = (src, dst);
                // SAFETY: as above: `len` readable bytes at src (C-contiguous),
                // `len` writable bytes at dst, distinct allocations.
                unsafe { ptr::copy_nonoverlapping(src.0, dst.0, len) }
            });
        } else {
            // CPython 3.10 declares the source view `Py_buffer *` (3.11+:
            // `const Py_buffer *`) but only reads it: a *mut that builds on both.
            let src = ptr::from_ref(&buffer.0).cast_mut();
            // SAFETY: as above; ToContiguous copies the view's `len` bytes in
            // C order into `dst` (it needs the interpreter: we are attached)
            // and does not write through `src`.
            let rc = unsafe {
                ffi::PyBuffer_ToContiguous(dst.cast::<c_void>(), src, len as isize, b'C' as _)
            };
            if rc != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        drop(buffer);
        Ok(Self { vec: Arc::new(vec) })
    }

    /// `mkl_alloc._rebuild`, the pickling/copy constructor (a Python function,
    /// so that pickles name it by an importable path).
    fn rebuild<'py>(
        slf: &Bound<'py, Self>,
        data: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let rebuild = py.import("mkl_alloc")?.getattr("_rebuild")?;
        rebuild.call1((slf.get_type(), data, slf.get().vec.alignment()))
    }

    /// The instance `__dict__` of a Python subclass, if it has one.
    fn instance_dict<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match slf.getattr_opt("__dict__")? {
            Some(d) => Ok(Some(d.cast_into::<PyDict>()?)),
            None => Ok(None),
        }
    }
}

#[pymethods]
impl MKLMemory {
    /// The seed's three forms, and this package's copy of any buffer:
    /// ``(nbytes)``, ``(num, size)`` (zeroed ``num * size`` bytes),
    /// ``(other_mklmemory)`` (a copy at ``other``'s alignment) and
    /// ``(buffer)`` (a copy at 64). ``alignment`` is keyword-only: a second
    /// positional int is ``size``.
    #[new]
    #[pyo3(signature = (*args, alignment = None), text_signature = "(*args, alignment=None)")]
    fn py_new(
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        alignment: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if !(1..=2).contains(&args.len()) {
            return Err(PyTypeError::new_err(format!(
                "MKLMemory() takes 1 or 2 positional arguments (nbytes; num, size; or a source \
                 to copy) and alignment by keyword, but {} positional argument(s) were given",
                args.len()
            )));
        }
        // Validate the alignment before anything is allocated.
        let align = match alignment {
            Some(a) => Some(alignment_arg("MKLMemory", a)?),
            None => None,
        };
        let first = args.get_item(0)?;
        if args.len() == 2 {
            let second = args.get_item(1)?;
            return Self::zeroed_product(py, &first, &second, align.unwrap_or(64));
        }
        if let Some(int) = integral(&first)? {
            let n = size_arg(int.as_any(), "MKLMemory(nbytes)")?;
            return Self::zeroed(py, n, align.unwrap_or(64), &format!("MKLMemory({n})"));
        }
        if let Ok(other) = first.cast::<Self>() {
            // The seed's copy keeps the source's alignment unless asked.
            let align = align.unwrap_or_else(|| other.get().vec.alignment());
            return Self::from_buffer(py, &first, align);
        }
        Self::from_buffer(py, &first, align.unwrap_or(64))
    }

    /// Size of the block in bytes (``len(m)`` and ``size`` are the same).
    #[getter]
    fn nbytes(&self) -> usize {
        self.vec.len()
    }

    /// Size of the block in bytes: ``nbytes``, by mkl-service's name.
    #[getter]
    fn size(&self) -> usize {
        self.vec.len()
    }

    /// The alignment asked for at construction: the block's address is a
    /// multiple of it, across every ``realloc``.
    #[getter]
    fn alignment(&self) -> usize {
        self.vec.alignment()
    }

    /// The block's address, as an int (it changes on ``realloc``).
    #[getter]
    fn _pointer(&self) -> usize {
        self.vec.as_ptr() as usize
    }

    /// Live exports: buffers (memoryviews, NumPy arrays, ...) and DLPack
    /// capsules or tensors not yet released. ``realloc`` needs 0.
    #[getter]
    fn exports(&self) -> usize {
        self.vec.view_count()
    }

    fn __len__(&self) -> usize {
        self.vec.len()
    }

    /// A copy of the contents, as ``bytes``. Raises ``BufferError`` if
    /// another thread is reallocating right now.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let export = self.export("MKLMemory.tobytes()")?;
        // SAFETY: the export keeps `len` bytes in place; PyBytes copies them
        // through the raw pointer (no `&[u8]` is formed over the block).
        Ok(unsafe { PyBytes::from_ptr(py, export.as_ptr(), export.len()) })
    }

    /// Resizes the block to ``new_nbytes`` (>= 1), keeping the contents up to
    /// the smaller size, zero-filling new bytes and keeping the alignment.
    /// The checks, in this order:
    ///
    /// 1. ``ValueError`` for ``new_nbytes < 1`` (``TypeError`` for a
    ///    non-integer);
    /// 2. ``BufferError`` while exports are alive (memoryviews, NumPy arrays,
    ///    DLPack capsules: the message names how many) or another thread is
    ///    reallocating;
    /// 3. with ``refcheck`` (the default), mkl-service's reference rule, which
    ///    is NumPy's for ``ndarray.resize``: ``ValueError`` if other Python
    ///    objects reference this one (an alias, a container, a bound method),
    ///    as they would see its size change under them. Before CPython 3.14
    ///    it refuses a reference count above 2 (the caller's variable and
    ///    the call's own); from 3.14, whose interpreter often borrows the
    ///    caller's reference, any object not uniquely referenced, with
    ///    "may be referenced" where the count is 2 (a false positive for a
    ///    global or a closure's variable).
    ///
    /// ``refcheck=False`` skips only step 3, as ``ndarray.resize(refcheck=False)``
    /// does, for an object that threads share on purpose. That stays memory
    /// safe: every reader of the block (the buffer protocol, DLPack,
    /// ``tobytes``, pickling, copies) holds an export counted in the same
    /// atomic word that ``realloc`` must claim, exclusively and with no
    /// export alive, before it moves the block. So a reader and a
    /// ``realloc`` never overlap, and of two racing ``realloc`` calls one
    /// wins and the other gets ``BufferError``. What it gives up is the
    /// warning that another holder may see the size change.
    ///
    /// ``MemoryError`` if MKL cannot provide the block. On any failure the
    /// pointer, size, alignment and contents are unchanged. The copy runs
    /// without holding the interpreter.
    #[pyo3(
        signature = (
            new_nbytes,
            *,
            refcheck = Python::attach(|py| PyBool::new(py, true).to_owned().into_any().unbind())
        ),
        text_signature = "($self, new_nbytes, *, refcheck=True)"
    )]
    fn realloc(
        slf: &Bound<'_, Self>,
        new_nbytes: &Bound<'_, PyAny>,
        refcheck: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        // Taken as any object (True when omitted; None is refused, not
        // taken for the default) and converted here, so that a wrong type
        // is refused naming the call: PyO3's own message names only the
        // argument.
        let refcheck = refcheck.bind(py);
        let refcheck = refcheck.extract::<bool>().map_err(|_| {
            keyword_type_error("MKLMemory.realloc", "refcheck", "True or False", refcheck)
        })?;
        let n = size_arg(new_nbytes, "MKLMemory.realloc(new_nbytes)")?;
        let what = format!("MKLMemory.realloc({n})");
        let vec = &slf.get().vec;
        // Exports before references, as the issue orders them; the resize
        // below checks the exports again, in the same atomic claim.
        let views = vec.view_count();
        if views > 0 {
            return Err(vec_error(&what, SharedVecError::Exported { views }));
        }
        if refcheck {
            refcheck::check(slf.as_any(), &what)?;
        }
        py.detach(|| fork_gate::pass(|| vec.try_resize_exact(n, 0)))
            .map_err(|e| vec_error(&what, e))
    }

    /// Buffer protocol: a 1-D, writable, format ``"B"`` view of the block,
    /// counted as an export until released.
    ///
    /// # Safety
    /// Called by CPython with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // CPython's contract: on failure view->obj is NULL (callers may
        // inspect or release it), and a NULL view is never written through.
        let failed = |e: PyErr| -> PyResult<()> {
            if !view.is_null() {
                // SAFETY: a non-null `view` is the caller's Py_buffer.
                unsafe { (*view).obj = ptr::null_mut() };
            }
            Err(e)
        };
        let export = match slf.get().export("memoryview(MKLMemory)") {
            Ok(export) => export,
            Err(e) => return failed(e),
        };
        if view.is_null() {
            return failed(PyBufferError::new_err(
                "MKLMemory.__getbuffer__: called with a NULL Py_buffer (view); nothing to fill",
            ));
        }
        // Writable (readonly = 0) whatever was asked: a request without
        // PyBUF_WRITABLE may get a writable buffer (as bytearray's does).
        // SAFETY: `view` is the caller's Py_buffer; FillInfo takes a new
        // reference to `slf` into view->obj and points shape/strides at the
        // view's own len/itemsize. The export keeps the block in place until
        // __releasebuffer__ drops it.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                export.as_mut_ptr().cast(),
                export.len() as isize,
                0,
                flags,
            )
        };
        if rc != 0 {
            // FillInfo refuses some flags (3.12+: PyBUF_READ, PyBUF_WRITE)
            // before it sets view->obj; the export is dropped here.
            return failed(PyErr::fetch(slf.py()));
        }
        // SAFETY: filled above; `internal` is ours until release.
        unsafe { (*view).internal = Box::into_raw(Box::new(export)).cast() };
        Ok(())
    }

    /// # Safety
    /// Called by CPython once per successful `__getbuffer__`, with its view.
    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `internal` holds the boxed export __getbuffer__ stored;
        // taken once (CPython releases each view once).
        unsafe {
            let internal = (*view).internal;
            if !internal.is_null() {
                (*view).internal = ptr::null_mut();
                drop(Box::from_raw(internal.cast::<Export<u8>>()));
            }
        }
    }

    /// A DLPack capsule of a 1-D uint8 CPU tensor over the block (no copy
    /// unless ``copy=True``, which copies into a fresh block without holding
    /// the interpreter, as ``realloc`` does). A versioned capsule is returned when
    /// ``max_version >= (1, 0)``, a legacy one otherwise. The capsule counts
    /// as an export until its tensor's deleter runs (or the capsule dies
    /// unconsumed).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        const WHAT: &str = "MKLMemory.__dlpack__";
        let py = slf.py();
        // Converted here rather than by PyO3, so that a wrong type is
        // refused naming the call.
        let max_version = max_version
            .map(|v| {
                v.extract::<(u32, u32)>().map_err(|_| {
                    keyword_type_error(WHAT, "max_version", "a (major, minor) tuple or None", v)
                })
            })
            .transpose()?;
        let dl_device = dl_device
            .map(|v| {
                v.extract::<(i32, i32)>().map_err(|_| {
                    keyword_type_error(
                        WHAT,
                        "dl_device",
                        "a (device_type, device_id) tuple or None",
                        v,
                    )
                })
            })
            .transpose()?;
        let copy = copy
            .map(|v| {
                v.extract::<bool>()
                    .map_err(|_| keyword_type_error(WHAT, "copy", "True, False or None", v))
            })
            .transpose()?;
        if let Some(stream) = stream {
            return Err(PyValueError::new_err(format!(
                "MKLMemory.__dlpack__(stream={stream}): MKLMemory is CPU memory; stream must be None"
            )));
        }
        if let Some(device) = dl_device {
            if device != (dlpack::DEVICE_CPU, 0) {
                return Err(PyBufferError::new_err(format!(
                    "MKLMemory.__dlpack__(dl_device={device:?}): MKLMemory is CPU memory, \
                     device {:?}",
                    (dlpack::DEVICE_CPU, 0)
                )));
            }
        }
        let copied = copy == Some(true);
        let export = if copied {
            // Copied without holding the interpreter, as `realloc` and
            // `MKLMemory(source)` copy: the clone holds a view of the block
            // for the whole copy, so a realloc from another thread is
            // refused rather than racing it.
            let vec = &slf.get().vec;
            let clone = py
                .detach(|| fork_gate::pass(|| vec.try_clone()))
                .map_err(|e| vec_error("MKLMemory.__dlpack__(copy=True)", e))?;
            SharedMklVec::export(&Arc::new(clone))
                .map_err(|e| vec_error("MKLMemory.__dlpack__(copy=True)", e))?
        } else {
            slf.get().export("MKLMemory.__dlpack__()")?
        };
        match max_version {
            Some((major, _)) if major >= 1 => dlpack::versioned_capsule(py, export, copied),
            _ => dlpack::legacy_capsule(py, export),
        }
    }

    /// ``(1, 0)``: the block is CPU memory (kDLCPU), device 0.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::DEVICE_CPU, 0)
    }

    /// Pickling (protocols 2 to 5): the exact type (a subclass stays a
    /// subclass, its ``__dict__`` kept), the alignment and the contents.
    /// Protocol 5 passes the contents as a ``PickleBuffer``, so they may go
    /// out of band.
    fn __reduce_ex__<'py>(slf: &Bound<'py, Self>, protocol: i32) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let data = if protocol >= 5 {
            py.import("pickle")?
                .getattr("PickleBuffer")?
                .call1((slf,))?
        } else {
            slf.get().tobytes(py)?.into_any()
        };
        let rebuild = py.import("mkl_alloc")?.getattr("_rebuild")?;
        let args = (slf.get_type(), data, slf.get().vec.alignment());
        let state = match Self::instance_dict(slf)? {
            Some(d) if !d.is_empty() => d.into_any(),
            _ => py.None().into_bound(py),
        };
        PyTuple::new(py, [rebuild, args.into_pyobject(py)?.into_any(), state])
    }

    /// copy.copy(m): a distinct block with equal contents and alignment, of
    /// the same type (its ``__dict__`` copied shallowly).
    fn __copy__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let new = Self::rebuild(slf, slf.clone().into_any())?;
        if let Some(d) = Self::instance_dict(slf)? {
            if !d.is_empty() {
                new.getattr("__dict__")?.call_method1("update", (d,))?;
            }
        }
        Ok(new)
    }

    /// copy.deepcopy(m): as ``copy.copy``, its ``__dict__`` deep-copied.
    fn __deepcopy__<'py>(
        slf: &Bound<'py, Self>,
        memo: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let new = Self::rebuild(slf, slf.clone().into_any())?;
        memo.set_item(slf.as_ptr() as usize, &new)?;
        if let Some(d) = Self::instance_dict(slf)? {
            if !d.is_empty() {
                let copied = py.import("copy")?.getattr("deepcopy")?.call1((d, memo))?;
                new.getattr("__dict__")?.call_method1("update", (copied,))?;
            }
        }
        Ok(new)
    }

    /// What the object holds, in bytes: the object itself, the shared
    /// handle with its ``Arc`` header, and the MKL block as MKL counts it
    /// (``mem_stat()``: alignment padding and MKL's header included).
    fn __sizeof__(slf: &Bound<'_, Self>) -> PyResult<usize> {
        let py = slf.py();
        let object = py.import("builtins")?.getattr("object")?;
        let base: usize = object.call_method1("__sizeof__", (slf,))?.extract()?;
        // The Arc's two counters, padded to the handle's alignment (64).
        let arc_header = (2 * core::mem::size_of::<usize>())
            .next_multiple_of(core::mem::align_of::<SharedMklVec<u8>>());
        Ok(base + arc_header + slf.get().vec.heap_size())
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let m = slf.get();
        Ok(format!(
            "{}(nbytes={}, alignment={}, exports={})",
            slf.get_type().qualname()?,
            m.vec.len(),
            m.vec.alignment(),
            m.vec.view_count()
        ))
    }
}

/// `realloc`'s reference rule, mkl-service's (`_MKLMemory_MayBeShared`),
/// which is NumPy's for `ndarray.resize` (`PyArray_Resize`).
///
/// A method here receives `self` borrowed from the caller, as a Cython
/// method does: `m.realloc(n)` sees the caller's reference (`m`) plus the
/// one on the interpreter's stack, 2; an alias, a container or a bound
/// method adds one. CPython 3.14 often pushes a borrowed reference instead
/// (`LOAD_FAST_BORROW`), so there the rule is "uniquely referenced", with 2
/// counted as "may be referenced" (a global, a closure's variable).
mod refcheck {
    use pyo3::exceptions::PyValueError;
    use pyo3::ffi;
    use pyo3::prelude::*;

    /// `ValueError` in the seed's words if other objects (may) reference `obj`.
    pub(super) fn check(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
        // SAFETY: `obj` is a live object and we are attached.
        let count = unsafe { ffi::Py_REFCNT(obj.as_ptr()) };
        let how = if unique_rule(obj.py()) {
            if is_uniquely_referenced(obj, count) {
                return Ok(());
            }
            if count == 2 {
                "may be referenced by another object. It is possible that this is a false \
                 positive"
            } else {
                "is referenced by other objects"
            }
        } else if count > 2 {
            "is referenced by other objects"
        } else {
            return Ok(());
        };
        Err(PyValueError::new_err(format!(
            "{what}: Cannot realloc MKLMemory that {how} (reference count {count}); drop the \
             other references, or pass refcheck=False for an object shared on purpose"
        )))
    }

    /// Built for CPython 3.14 or later (not the stable ABI): its rule.
    #[cfg(all(Py_3_14, not(Py_LIMITED_API)))]
    fn unique_rule(_py: Python<'_>) -> bool {
        true
    }

    #[cfg(all(Py_3_14, not(Py_LIMITED_API)))]
    fn is_uniquely_referenced(obj: &Bound<'_, PyAny>, _count: isize) -> bool {
        // SAFETY: a live object, attached. On free-threaded builds it also
        // checks that this thread owns the object and no other thread holds
        // a reference.
        unsafe { ffi::PyUnstable_Object_IsUniquelyReferenced(obj.as_ptr()) != 0 }
    }

    /// The stable ABI (the abi3 wheel) may run on 3.14 and later, whose rule
    /// it needs; it has no `PyUnstable_*` API, but only builds with the GIL,
    /// where `PyUnstable_Object_IsUniquelyReferenced` is a count of 1.
    #[cfg(Py_LIMITED_API)]
    fn unique_rule(py: Python<'_>) -> bool {
        static FROM_3_14: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *FROM_3_14.get_or_init(|| py.version_info() >= (3, 14))
    }

    #[cfg(Py_LIMITED_API)]
    fn is_uniquely_referenced(_obj: &Bound<'_, PyAny>, count: isize) -> bool {
        count == 1
    }

    /// Built for a CPython before 3.14: the count rule.
    #[cfg(not(any(Py_3_14, Py_LIMITED_API)))]
    fn unique_rule(_py: Python<'_>) -> bool {
        false
    }

    #[cfg(not(any(Py_3_14, Py_LIMITED_API)))]
    fn is_uniquely_referenced(_obj: &Bound<'_, PyAny>, count: isize) -> bool {
        count == 1
    }
}
