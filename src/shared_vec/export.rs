//! [`Export`]: an owned, counted export of a [`SharedMklVec`] for code that
//! writes the elements through a raw pointer (FFI: Python's buffer protocol,
//! DLPack, a C library filling the buffer).
//!
//! A [`View`](super::View) hands out `&[T]`, and Rust assumes nobody writes
//! under a live `&[T]`: a foreign writer behind one would be undefined
//! behaviour. An export instead yields a `*mut T` with the block's own
//! provenance (the pointer MKL returned, never derived from a reference) and
//! the length read from the buffer itself. It counts in the same state word
//! as views, so while it lives every resize is refused with
//! [`Exported`](super::SharedVecError::Exported) and the block is neither
//! moved nor freed.

use core::fmt;

use super::{ArcView, SharedMklVec, SharedVecError};
use crate::sync::Arc;

/// An owned, counted export of a [`SharedMklVec`] held in an `Arc`: `'static`
/// and `Send`, it keeps the vector alive and its block in place, and gives a
/// raw pointer through which the elements may be written.
///
/// Taken with [`SharedMklVec::export`]; it counts as a view (resizes are
/// refused with `Exported` while it lives) and gives its count back on drop.
///
/// # Writing through an export
///
/// [`as_mut_ptr`](Self::as_mut_ptr) points at [`len`](Self::len) initialised
/// elements, valid for reads and writes until the export is dropped. Writing
/// through it is `unsafe` and the caller guarantees:
///
/// * no Rust reference to the written elements is alive meanwhile: no
///   [`View`](super::View) or [`ArcView`](super::ArcView) of the same vector
///   (whose `&[T]` promises the elements do not change) is dereferenced while
///   the write may happen;
/// * concurrent writers (other exports, other threads) are synchronised with
///   each other and with concurrent readers by the caller, as in C.
///
/// The crate's own copy paths ([`try_clone`](SharedMklVec::try_clone), `serde`
/// serialisation) never form a `&[T]`: they read through the raw pointer, so
/// an export's writer does not invalidate a Rust reference under them. But a
/// copy that runs while a writer writes the same bytes, unsynchronised, is a
/// **data race**, undefined behaviour in Rust's memory model (as C's
/// `memcpy` racing a writer is in C's); it is not "unspecified bytes".
/// What is promised: the copy holds a view, so the block is neither resized
/// nor freed under it, and it never reads outside the block. What is not: any
/// value of bytes written during the copy, or anything about a program that
/// lets a write race a copy. Order the writer's last write before the copy
/// (join the thread, a lock, a channel), as for any shared memory;
/// Python's `bytearray` is no different (`bytes(b)` racing a NumPy writer
/// on another thread is the same race, and Python promises nothing there).
///
/// ```
/// use std::sync::Arc;
/// use mkl_alloc::{SharedMklVec, SharedVecError};
///
/// let v = Arc::new(SharedMklVec::from_slice(&[0u8; 4]));
/// let export = SharedMklVec::export(&v).unwrap();
/// assert_eq!(v.try_push(1), Err(SharedVecError::Exported { views: 1 }));
/// let written = std::thread::spawn(move || {
///     // SAFETY: 4 elements, no View of `v` is alive, and this thread is the
///     // only writer.
///     unsafe { export.as_mut_ptr().add(3).write(7) };
///     drop(export);
/// });
/// written.join().unwrap();
/// assert_eq!(&*v.view().unwrap(), &[0, 0, 0, 7]);
/// v.try_push(1).unwrap();
/// ```
pub struct Export<T: Copy> {
    /// The count, the `Arc` and the pointer: an [`ArcView`] that is never
    /// dereferenced, so no `&[T]` is ever formed over the elements.
    view: ArcView<T>,
}

impl<T: Copy> SharedMklVec<T> {
    /// An owned export of a vector held in an `Arc`, for raw (foreign)
    /// readers and writers: see [`Export`] for the write contract.
    ///
    /// Errors: [`Busy`](SharedVecError::Busy) while a resize or mutable view
    /// holds the buffer, [`TooManyViews`](SharedVecError::TooManyViews) at
    /// the limit. While the export lives, resizes are refused with
    /// [`Exported`](SharedVecError::Exported) (it counts as a view).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mkl_alloc::SharedMklVec;
    ///
    /// let v = Arc::new(SharedMklVec::from_slice(&[1.0f64, 2.0]));
    /// let export = SharedMklVec::export(&v).unwrap();
    /// assert_eq!(export.len(), 2);
    /// assert_eq!(v.view_count(), 1);
    /// drop(export);
    /// assert_eq!(v.view_count(), 0);
    /// ```
    pub fn export(this: &Arc<Self>) -> Result<Export<T>, SharedVecError> {
        Self::view_arc(this).map(|view| Export { view })
    }
}

impl<T: Copy> Export<T> {
    /// The first element, with the block's provenance: valid for reads and
    /// writes of [`len`](Self::len) elements while the export lives (writes
    /// under the contract in [`Export`]'s documentation). Dangling but
    /// aligned when the buffer holds no block.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mkl_alloc::SharedMklVec;
    ///
    /// let v = Arc::new(SharedMklVec::<u32>::with_alignment(4, 256).unwrap());
    /// v.try_resize(4, 0).unwrap();
    /// let export = SharedMklVec::export(&v).unwrap();
    /// assert_eq!(export.as_mut_ptr() as usize % 256, 0);
    /// // SAFETY: 4 elements; no View of `v` is alive; one writer.
    /// unsafe { export.as_mut_ptr().write_bytes(0xff, 4) };
    /// drop(export);
    /// assert_eq!(&*v.view().unwrap(), &[u32::MAX; 4]);
    /// ```
    #[inline]
    pub fn as_mut_ptr(&self) -> *mut T {
        self.view.ptr.as_ptr()
    }

    /// The first element, for reading (the same pointer as
    /// [`as_mut_ptr`](Self::as_mut_ptr)).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mkl_alloc::SharedMklVec;
    ///
    /// let v = Arc::new(SharedMklVec::from_slice(&[5u16, 6]));
    /// let export = SharedMklVec::export(&v).unwrap();
    /// // SAFETY: two initialised elements, no concurrent writer.
    /// assert_eq!(unsafe { export.as_ptr().add(1).read() }, 6);
    /// ```
    #[inline]
    pub fn as_ptr(&self) -> *const T {
        self.view.ptr.as_ptr()
    }

    /// Elements in the exported buffer, read from the buffer itself when the
    /// export was taken; it stays true while the export lives.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mkl_alloc::SharedMklVec;
    ///
    /// let v = Arc::new(SharedMklVec::from_slice(&[0u8; 10]));
    /// assert_eq!(SharedMklVec::export(&v).unwrap().len(), 10);
    /// ```
    #[inline]
    pub fn len(&self) -> usize {
        self.view.len
    }

    /// Whether [`len`](Self::len) is 0.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mkl_alloc::SharedMklVec;
    ///
    /// let v = Arc::new(SharedMklVec::<u8>::new());
    /// assert!(SharedMklVec::export(&v).unwrap().is_empty());
    /// ```
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.view.len == 0
    }

    /// The vector this export belongs to.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mkl_alloc::{Export, SharedMklVec};
    ///
    /// let v = Arc::new(SharedMklVec::from_slice(&[1u8]));
    /// let export = SharedMklVec::export(&v).unwrap();
    /// assert!(Arc::ptr_eq(Export::owner(&export), &v));
    /// ```
    pub fn owner(this: &Self) -> &Arc<SharedMklVec<T>> {
        &this.view.vec
    }
}

impl<T: Copy> fmt::Debug for Export<T> {
    /// Pointer and length (the elements are not read: a foreign writer may
    /// be writing them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("ptr", &self.view.ptr)
            .field("len", &self.view.len)
            .finish()
    }
}

// `Send` and `Sync` come from the `ArcView` inside, under the same bounds:
// the elements reached through the pointer are read (`T: Sync`) or written
// (`T: Send`) only in the caller's `unsafe` code.
