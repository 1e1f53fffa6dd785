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
//! the buffer's state word); it touches no Python object, so it may run on
//! any thread, attached to the interpreter or not.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use mkl_alloc::Export;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `kDLUInt`.
const DTYPE_UINT: u8 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 1 << 1;
/// The ABI version this module writes into versioned tensors.
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

const LEGACY_NAME: &core::ffi::CStr = c"dltensor";
const VERSIONED_NAME: &core::ffi::CStr = c"dltensor_versioned";

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

/// A legacy tensor and what it points into, in one allocation. The tensor
/// comes first, so a pointer to it is a pointer to the whole.
#[repr(C)]
struct Legacy {
    managed: DLManagedTensor,
    shape: [i64; 1],
    strides: [i64; 1],
    export: Export<u8>,
}

/// A versioned tensor and what it points into, as [`Legacy`].
#[repr(C)]
struct Versioned {
    managed: DLManagedTensorVersioned,
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

/// The tensor's length, as DLPack's `int64_t` (an export never exceeds
/// `isize::MAX` bytes).
fn extent(export: &Export<u8>) -> i64 {
    i64::try_from(export.len()).expect("an MKL block is at most isize::MAX bytes")
}

/// Frees a legacy tensor and drops its export.
///
/// # Safety
/// `tensor` is null or came from [`legacy_capsule`] and is deleted once.
unsafe extern "C" fn delete_legacy(tensor: *mut DLManagedTensor) {
    if !tensor.is_null() {
        // SAFETY: the tensor is the first field of a boxed `Legacy` whose
        // pointer (with the whole box's provenance) we handed out; the
        // DLPack contract calls the deleter once.
        drop(unsafe { Box::from_raw(tensor.cast::<Legacy>()) });
    }
}

/// Frees a versioned tensor and drops its export.
///
/// # Safety
/// `tensor` is null or came from [`versioned_capsule`] and is deleted once.
unsafe extern "C" fn delete_versioned(tensor: *mut DLManagedTensorVersioned) {
    if !tensor.is_null() {
        // SAFETY: as in `delete_legacy`, for a boxed `Versioned`.
        drop(unsafe { Box::from_raw(tensor.cast::<Versioned>()) });
    }
}

/// Capsule destructor: deletes the tensor unless a consumer took it (and
/// renamed the capsule, so the name no longer matches).
///
/// # Safety
/// Called by CPython with a live capsule, attached to the interpreter.
unsafe extern "C" fn destroy_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: a live capsule; IsValid and GetPointer with a matching name
    // set no exception.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr());
            delete_legacy(tensor.cast());
        }
    }
}

/// As [`destroy_legacy_capsule`], for versioned capsules.
///
/// # Safety
/// Called by CPython with a live capsule, attached to the interpreter.
unsafe extern "C" fn destroy_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_legacy_capsule`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr());
            delete_versioned(tensor.cast());
        }
    }
}

/// A `"dltensor"` capsule owning `export`.
pub fn legacy_capsule(py: Python<'_>, export: Export<u8>) -> PyResult<Bound<'_, PyCapsule>> {
    let len = extent(&export);
    let boxed = Box::into_raw(Box::new(Legacy {
        managed: DLManagedTensor {
            dl_tensor: tensor(&export),
            manager_ctx: ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        shape: [len],
        strides: [1],
        export,
    }));
    // SAFETY: `boxed` is a fresh, exclusively owned allocation: pointing the
    // tensor at its own shape/strides and itself is sound, and they stay put
    // (the box is never moved, only freed by the deleter).
    unsafe {
        (*boxed).managed.dl_tensor.shape = ptr::addr_of_mut!((*boxed).shape).cast();
        (*boxed).managed.dl_tensor.strides = ptr::addr_of_mut!((*boxed).strides).cast();
        (*boxed).managed.manager_ctx = boxed.cast();
    }
    let pointer = NonNull::new(boxed.cast::<c_void>()).expect("Box::into_raw is non-null");
    // SAFETY: the pointer is a live `Legacy` that the capsule owns until a
    // consumer renames it; the destructor deletes it otherwise and may run
    // on any thread (it touches no Python object beyond the capsule).
    let capsule = unsafe {
        PyCapsule::new_with_pointer_and_destructor(
            py,
            pointer,
            LEGACY_NAME,
            Some(destroy_legacy_capsule),
        )
    };
    if capsule.is_err() {
        // SAFETY: the capsule was not created, so we still own the tensor.
        unsafe { delete_legacy(boxed.cast()) };
    }
    capsule
}

/// A `"dltensor_versioned"` capsule owning `export`; `copied` sets
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
pub fn versioned_capsule(
    py: Python<'_>,
    export: Export<u8>,
    copied: bool,
) -> PyResult<Bound<'_, PyCapsule>> {
    let len = extent(&export);
    let boxed = Box::into_raw(Box::new(Versioned {
        managed: DLManagedTensorVersioned {
            version: VERSION,
            manager_ctx: ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: if copied { FLAG_IS_COPIED } else { 0 },
            dl_tensor: tensor(&export),
        },
        shape: [len],
        strides: [1],
        export,
    }));
    // SAFETY: as in `legacy_capsule`.
    unsafe {
        (*boxed).managed.dl_tensor.shape = ptr::addr_of_mut!((*boxed).shape).cast();
        (*boxed).managed.dl_tensor.strides = ptr::addr_of_mut!((*boxed).strides).cast();
        (*boxed).managed.manager_ctx = boxed.cast();
    }
    let pointer = NonNull::new(boxed.cast::<c_void>()).expect("Box::into_raw is non-null");
    // SAFETY: as in `legacy_capsule`, for a `Versioned`.
    let capsule = unsafe {
        PyCapsule::new_with_pointer_and_destructor(
            py,
            pointer,
            VERSIONED_NAME,
            Some(destroy_versioned_capsule),
        )
    };
    if capsule.is_err() {
        // SAFETY: the capsule was not created, so we still own the tensor.
        unsafe { delete_versioned(boxed.cast()) };
    }
    capsule
}
