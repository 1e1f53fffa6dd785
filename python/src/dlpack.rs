//! DLPack's C structures (dlpack.h, ABI 1.x) and the capsules that carry an
//! [`Export`] of an `MKLMemory` to a DLPack consumer (`np.from_dlpack`, …).
//!
//! Two capsule kinds, as the Python array API specifies:
//! * legacy: name `"dltensor"`, a `DLManagedTensor`;
//! * versioned (asked for with `max_version >= (1, 0)`): name
//!   `"dltensor_versioned"`, a `DLManagedTensorVersioned`.
//!
//! Ownership: the capsule owns the tensor until a consumer takes it and
//! renames the capsule (`"used_dltensor"` / `"used_dltensor_versioned"`);
//! from then on the consumer calls the tensor's `deleter` when done. If the
//! capsule dies unconsumed, its destructor calls the deleter itself. The
//! deleter frees the tensor and drops the export (giving back its count in
//! the buffer's state word, and freeing the MKL block if it was the last
//! holder, inside the fork gate); it touches no Python object, so it may
//! run on any thread, attached to the interpreter or not.

use core::ffi::{CStr, c_void};
use core::ptr::{self, NonNull};

use mkl_alloc::Export;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::fork_gate;

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `kDLUInt`.
const DTYPE_UINT: u8 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 1 << 1;
/// The ABI version this module writes into versioned tensors.
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// A DLPack tensor header (legacy or versioned) and how its capsule is named.
trait Managed: Sized {
    /// The capsule's name while unconsumed.
    const NAME: &'static CStr;
    /// A header over `tensor` whose deleter is `delete`.
    fn new(tensor: DLTensor, copied: bool, delete: unsafe extern "C" fn(*mut Self)) -> Self;
    fn tensor(&mut self) -> &mut DLTensor;
    fn manager_ctx(&mut self) -> &mut *mut c_void;
    /// The header's deleter as an address.
    ///
    /// # Safety
    /// `this` points to a live header of this layout.
    unsafe fn deleter(this: *const Self) -> Option<usize>;
}

impl Managed for DLManagedTensor {
    const NAME: &'static CStr = c"dltensor";
    fn new(dl_tensor: DLTensor, _copied: bool, delete: unsafe extern "C" fn(*mut Self)) -> Self {
        Self {
            dl_tensor,
            manager_ctx: ptr::null_mut(),
            deleter: Some(delete),
        }
    }
    fn tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn manager_ctx(&mut self) -> &mut *mut c_void {
        &mut self.manager_ctx
    }
    unsafe fn deleter(this: *const Self) -> Option<usize> {
        // SAFETY: the caller's contract.
        unsafe { (*this).deleter }.map(|d| d as usize)
    }
}

impl Managed for DLManagedTensorVersioned {
    const NAME: &'static CStr = c"dltensor_versioned";
    fn new(dl_tensor: DLTensor, copied: bool, delete: unsafe extern "C" fn(*mut Self)) -> Self {
        Self {
            version: VERSION,
            manager_ctx: ptr::null_mut(),
            deleter: Some(delete),
            flags: if copied { FLAG_IS_COPIED } else { 0 },
            dl_tensor,
        }
    }
    fn tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn manager_ctx(&mut self) -> &mut *mut c_void {
        &mut self.manager_ctx
    }
    unsafe fn deleter(this: *const Self) -> Option<usize> {
        // SAFETY: the caller's contract.
        unsafe { (*this).deleter }.map(|d| d as usize)
    }
}

/// A tensor header and what it points into, in one allocation. The header
/// comes first, so a pointer to it is a pointer to the whole.
#[repr(C)]
struct Owned<M> {
    managed: M,
    shape: [i64; 1],
    strides: [i64; 1],
    export: Export<u8>,
}

/// A 1-D uint8 CPU tensor over the export (shape and strides filled in once
/// the tensor has its final address).
fn tensor(export: &Export<u8>) -> DLTensor {
    DLTensor {
        data: export.as_mut_ptr().cast(),
        device: DLDevice {
            device_type: DEVICE_CPU,
            device_id: 0,
        },
        ndim: 1,
        dtype: DLDataType {
            code: DTYPE_UINT,
            bits: 8,
            lanes: 1,
        },
        shape: ptr::null_mut(),
        strides: ptr::null_mut(),
        byte_offset: 0,
    }
}

/// The tensor's deleter: frees the allocation and drops its export.
///
/// Dropping the export may free MKL memory (`MKL_free`): always for a
/// `copy=True` export, which holds the only reference to its block, and for
/// any export that outlives its `MKLMemory`. A consumer may call this on any
/// thread, without the interpreter (a JAX runtime thread, say), so while
/// another thread forks: it passes the fork gate, like every MKL call made
/// detached (see `fork_gate`).
///
/// # Safety
/// `managed` is null or the header of an `Owned<M>` made by [`capsule`],
/// deleted once (the DLPack contract).
unsafe extern "C" fn delete<M: Managed>(managed: *mut M) {
    if !managed.is_null() {
        // SAFETY: the header is the first field of a boxed `Owned<M>` whose
        // pointer (with the whole box's provenance) we handed out.
        let owned = unsafe { Box::from_raw(managed.cast::<Owned<M>>()) };
        fork_gate::pass(|| drop(owned));
    }
}

/// Capsule destructor: deletes the tensor unless a consumer took it (and
/// renamed the capsule, so the name no longer matches).
///
/// # Safety
/// Called by CPython with a live capsule made by [`capsule`], attached to
/// the interpreter.
unsafe extern "C" fn destroy_capsule<M: Managed>(capsule: *mut ffi::PyObject) {
    // SAFETY: a live capsule; IsValid and GetPointer with a matching name
    // set no exception, and an unconsumed capsule still owns its tensor.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr());
            delete::<M>(managed.cast());
        }
    }
}

/// A capsule named `M::NAME` owning a tensor over `export`.
fn capsule<M: Managed>(
    py: Python<'_>,
    export: Export<u8>,
    copied: bool,
) -> PyResult<Bound<'_, PyCapsule>> {
    let len = i64::try_from(export.len()).expect("an MKL block is at most isize::MAX bytes");
    let boxed = Box::into_raw(Box::new(Owned {
        managed: M::new(tensor(&export), copied, delete::<M>),
        shape: [len],
        strides: [1],
        export,
    }));
    // SAFETY: `boxed` is a fresh, exclusively owned allocation: pointing the
    // tensor at its own shape/strides and itself is sound, and they stay put
    // (the box is never moved, only freed by the deleter). Shape and strides
    // are reached through `boxed` itself, not through a reference, so the
    // pointers a consumer reads keep the box's provenance.
    unsafe {
        let shape = ptr::addr_of_mut!((*boxed).shape).cast::<i64>();
        let strides = ptr::addr_of_mut!((*boxed).strides).cast::<i64>();
        let managed = &mut (*boxed).managed;
        managed.tensor().shape = shape;
        managed.tensor().strides = strides;
        *managed.manager_ctx() = boxed.cast();
    }
    let pointer = NonNull::new(boxed.cast::<c_void>()).expect("Box::into_raw is non-null");
    // SAFETY: the pointer is a live `Owned<M>` that the capsule owns until a
    // consumer renames it; the destructor deletes it otherwise and touches
    // no Python object beyond the capsule.
    let made = unsafe {
        PyCapsule::new_with_pointer_and_destructor(py, pointer, M::NAME, Some(destroy_capsule::<M>))
    };
    if made.is_err() {
        // SAFETY: the capsule was not created, so we still own the tensor.
        unsafe { delete::<M>(boxed.cast()) };
    }
    made
}

/// A `"dltensor"` capsule owning `export`.
pub fn legacy_capsule(py: Python<'_>, export: Export<u8>) -> PyResult<Bound<'_, PyCapsule>> {
    capsule::<DLManagedTensor>(py, export, false)
}

/// A `"dltensor_versioned"` capsule owning `export`; `copied` sets
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
pub fn versioned_capsule(
    py: Python<'_>,
    export: Export<u8>,
    copied: bool,
) -> PyResult<Bound<'_, PyCapsule>> {
    capsule::<DLManagedTensorVersioned>(py, export, copied)
}

/// The tensor header of a DLPack capsule of this module (consumed or not),
/// if `obj` is one: its deleter is ours.
fn ours<M: Managed>(obj: *mut ffi::PyObject, names: [&CStr; 3]) -> bool {
    let ours = delete::<M> as unsafe extern "C" fn(*mut M) as usize;
    names.iter().any(|name| {
        // SAFETY: `obj` is a live object; IsValid checks it is a capsule of
        // that name with a non-null pointer and sets no exception; such a
        // capsule holds an `M` header (DLPack's layout, whoever made it),
        // whose deleter field is read, not called.
        unsafe {
            ffi::PyCapsule_IsValid(obj, name.as_ptr()) == 1 && {
                let m = ffi::PyCapsule_GetPointer(obj, name.as_ptr()).cast::<M>();
                M::deleter(m).is_some_and(|d| d == ours)
            }
        }
    })
}

/// _is_mkl_dlpack(obj) -> bool: whether ``obj`` is a DLPack capsule made by
/// ``MKLMemory.__dlpack__``, unconsumed or consumed: renamed
/// ``used_dltensor*`` by the consumer, or (NumPy 2) the
/// ``numpy_dltensor*`` capsule over the same tensor that NumPy keeps as the
/// base of an array from ``np.from_dlpack``. Used by ``is_mkl_array``.
#[pyfunction]
pub fn _is_mkl_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    let p = obj.as_ptr();
    ours::<DLManagedTensor>(p, [c"dltensor", c"used_dltensor", c"numpy_dltensor"])
        || ours::<DLManagedTensorVersioned>(
            p,
            [
                c"dltensor_versioned",
                c"used_dltensor_versioned",
                c"numpy_dltensor_versioned",
            ],
        )
}
