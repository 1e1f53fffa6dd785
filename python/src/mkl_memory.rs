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
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyInt, PyTuple};

use crate::{dlpack, fork_gate};

/// MKL-allocated memory exported to Python through the buffer protocol and DLPack.
///
/// ``source`` is an ``int`` n >= 1 (n zero bytes) or any object exporting a
/// buffer (its bytes copied in C order; the source stays exported during the
/// copy). ``alignment`` is a power of two up to 2**30; the block's address is
/// a multiple of it, across every ``realloc``.
///
/// ``memoryview(m)``, ``np.frombuffer(m, dtype)``, ``np.asarray(m)`` and
/// ``np.from_dlpack(m)`` share the block (no copy). While any such export is
/// alive, ``realloc`` raises ``BufferError``; ``exports`` counts them.
#[pyclass(frozen, subclass, module = "mkl_alloc", name = "MKLMemory")]
pub struct MKLMemory {
    vec: Arc<SharedMklVec<u8>>,
}

/// What a size argument means, for error messages.
#[derive(Clone, Copy)]
enum SizeOf {
    New,
    Realloc,
}

impl SizeOf {
    fn what(self) -> &'static str {
        match self {
            Self::New => "MKLMemory(nbytes)",
            Self::Realloc => "MKLMemory.realloc(new_nbytes)",
        }
    }
}

/// A byte count from a Python int: `TypeError` for a non-int, `ValueError`
/// below 1, `MemoryError` beyond what any allocation can be.
fn size_arg(value: &Bound<'_, PyAny>, of: SizeOf) -> PyResult<usize> {
    let what = of.what();
    if !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what}: the size must be an int, not {}",
            value.get_type().name()?
        )));
    }
    match value.extract::<i64>() {
        Ok(n) if n < 1 => Err(PyValueError::new_err(format!(
            "{what}: the size must be at least 1 byte, got {n}"
        ))),
        Ok(n) => usize::try_from(n).map_err(|_| too_big(what, value)),
        // Out of i64's range: a huge negative is still a ValueError.
        Err(_) if value.lt(0)? => Err(PyValueError::new_err(format!(
            "{what}: the size must be at least 1 byte, got {value}"
        ))),
        Err(_) => Err(too_big(what, value)),
    }
}

fn too_big(what: &str, value: &Bound<'_, PyAny>) -> PyErr {
    PyMemoryError::new_err(format!(
        "{what}: cannot allocate {value} bytes: more than any block can hold (isize::MAX)"
    ))
}

/// An alignment from a Python int: a power of two in 1 ..= 2**30, else
/// `ValueError` (`TypeError` for a non-int). `what` names the callable in
/// the message (`MKLMemory`, `numpy_handler`), which takes it as its
/// `alignment` argument.
pub(crate) fn alignment_arg(what: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    if !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what}(alignment=...): the alignment must be an int, not {}",
            value.get_type().name()?
        )));
    }
    match value.extract::<i64>() {
        Ok(a) if a > 0 && (a as u64).is_power_of_two() && a as u64 <= MAX_ALIGN as u64 => {
            Ok(a as usize)
        }
        _ => Err(PyValueError::new_err(format!(
            "{what}(alignment={value}): the alignment must be a power of two \
             from 1 to 2**30 ({MAX_ALIGN}); MKL cannot honour other values"
        ))),
    }
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
                    "MKLMemory(source): source must be an int (a size in bytes) or an \
                     object exporting a buffer, not {}",
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
    #[new]
    #[pyo3(signature = (source, alignment = None), text_signature = "(source, alignment=64)")]
    fn py_new(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        alignment: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // Validate the alignment before anything is allocated.
        let align = match alignment {
            Some(a) => alignment_arg("MKLMemory", a)?,
            None => 64,
        };
        if source.is_instance_of::<PyInt>() {
            let n = size_arg(source, SizeOf::New)?;
            let vec = py
                .detach(|| fork_gate::pass(|| SharedMklVec::<u8>::zeroed_with_alignment(n, align)))
                .map_err(|e| vec_error(&format!("MKLMemory({n})"), e))?;
            Ok(Self { vec: Arc::new(vec) })
        } else {
            Self::from_buffer(py, source, align)
        }
    }

    /// Size of the block in bytes (``len(m)`` is the same).
    #[getter]
    fn nbytes(&self) -> usize {
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
    /// Raises ``ValueError`` for ``new_nbytes < 1`` (checked first),
    /// ``BufferError`` while exports are alive (naming how many) or another
    /// thread reallocates, ``MemoryError`` if MKL cannot provide the block.
    /// On any failure the pointer, size, alignment and contents are
    /// unchanged. The copy runs without holding the interpreter.
    fn realloc(&self, py: Python<'_>, new_nbytes: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = size_arg(new_nbytes, SizeOf::Realloc)?;
        py.detach(|| fork_gate::pass(|| self.vec.try_resize_exact(n, 0)))
            .map_err(|e| vec_error(&format!("MKLMemory.realloc({n})"), e))
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
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let py = slf.py();
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
