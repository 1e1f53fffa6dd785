//! The guards: [`View`] and [`ArcView`] (shared, counted in the state word)
//! and [`ViewMut`] (exclusive, the state word's EXCLUSIVE bit).

use core::fmt;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;

use super::{RawBuf, SharedMklVec};
use crate::sync::{Arc, ReadTrack, WriteTrack};

/// A shared, read-only view of a [`SharedMklVec`]: derefs to `[T]`.
///
/// While any view is alive the buffer cannot be resized (the resize is
/// refused with [`SharedVecError::Exported`](super::SharedVecError::Exported)),
/// so the slice can never be freed or moved under the view. Many views may
/// coexist. Dropping the view gives its count back.
///
/// ```
/// use mkl_alloc::SharedMklVec;
///
/// let v = SharedMklVec::from_slice(&[1.0f64, 2.0, 3.0]);
/// let a = v.view().unwrap();
/// let b = v.view().unwrap();
/// assert_eq!(a.iter().sum::<f64>(), 6.0);
/// assert_eq!(&*a, &*b);
/// assert_eq!(v.view_count(), 2);
/// ```
pub struct View<'a, T: Copy> {
    pub(super) vec: &'a SharedMklVec<T>,
    pub(super) ptr: NonNull<T>,
    pub(super) len: usize,
    pub(super) track: ReadTrack<RawBuf<T>>,
}

impl<T: Copy> Deref for View<'_, T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: the view's count in the state word keeps every writer out
        // for its whole life, and `ptr`/`len` were read after the count was
        // taken: `ptr` is aligned, holds `len` initialised elements (or is
        // dangling with elements of size 0 / len 0), and is not freed.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> Drop for View<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.track.release();
        self.vec.flag.release_view();
    }
}

impl<T: Copy + fmt::Debug> fmt::Debug for View<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

// SAFETY: a `View` is a `&[T]` plus a `&SharedMklVec<T>` whose state word it
// decrements on drop. Sending it to another thread shares both: `&[T]` needs
// `T: Sync`, and `&SharedMklVec<T>` is `Send` when the vector is `Sync`,
// i.e. when `T: Send + Sync`.
unsafe impl<T: Copy + Send + Sync> Send for View<'_, T> {}
// SAFETY: `&View` only gives `&[T]`, which is `Sync` when `T` is.
unsafe impl<T: Copy + Sync> Sync for View<'_, T> {}

/// An exclusive, mutable view of a [`SharedMklVec`]: derefs to `&mut [T]`.
///
/// Taken with [`SharedMklVec::try_view_mut`]; while it lives every other view,
/// mutable view and resize is refused with
/// [`SharedVecError::Busy`](super::SharedVecError::Busy).
///
/// ```
/// use mkl_alloc::{SharedMklVec, SharedVecError};
///
/// let v = SharedMklVec::from_slice(&[1u8, 2, 3]);
/// {
///     let mut m = v.try_view_mut().unwrap();
///     m[0] = 10;
///     assert_eq!(v.view().unwrap_err(), SharedVecError::Busy);
/// }
/// assert_eq!(&*v.view().unwrap(), &[10, 2, 3]);
/// ```
pub struct ViewMut<'a, T: Copy> {
    pub(super) vec: &'a SharedMklVec<T>,
    pub(super) ptr: NonNull<T>,
    pub(super) len: usize,
    pub(super) track: WriteTrack<RawBuf<T>>,
}

impl<T: Copy> Deref for ViewMut<'_, T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: the exclusive claim keeps every other view and writer out
        // for the guard's life; `ptr`/`len` were read under the claim.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> DerefMut for ViewMut<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access
        // through the guard.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> Drop for ViewMut<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.track.release();
        self.vec.flag.release_exclusive();
    }
}

impl<T: Copy + fmt::Debug> fmt::Debug for ViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

// SAFETY: a `ViewMut` is a `&mut [T]` (needs `T: Send` to move) plus a
// `&SharedMklVec<T>` (needs the vector `Sync`: `T: Send + Sync`).
unsafe impl<T: Copy + Send + Sync> Send for ViewMut<'_, T> {}
// SAFETY: `&ViewMut` only gives `&[T]`, which is `Sync` when `T` is.
unsafe impl<T: Copy + Sync> Sync for ViewMut<'_, T> {}

/// An owned view of a [`SharedMklVec`] held in an `Arc`: `'static` and `Send`
/// (when `T: Send + Sync`), for handing to another thread or to FFI.
///
/// It keeps the vector alive and counts as a view exactly like [`View`].
/// Taken with [`SharedMklVec::view_arc`].
///
/// ```
/// use std::sync::Arc;
/// use mkl_alloc::SharedMklVec;
///
/// let v = Arc::new(SharedMklVec::from_slice(&[1u64, 2, 3]));
/// let owned = SharedMklVec::view_arc(&v).unwrap();
/// let sum = std::thread::spawn(move || owned.iter().sum::<u64>()).join().unwrap();
/// assert_eq!(sum, 6);
/// assert_eq!(v.view_count(), 0);
/// ```
pub struct ArcView<T: Copy> {
    pub(super) vec: Arc<SharedMklVec<T>>,
    pub(super) ptr: NonNull<T>,
    pub(super) len: usize,
    pub(super) track: ReadTrack<RawBuf<T>>,
}

impl<T: Copy> ArcView<T> {
    /// The vector this view belongs to.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mkl_alloc::SharedMklVec;
    ///
    /// let v = Arc::new(SharedMklVec::from_slice(&[1u8]));
    /// let owned = SharedMklVec::view_arc(&v).unwrap();
    /// assert!(Arc::ptr_eq(ArcView::owner(&owned), &v));
    /// # use mkl_alloc::ArcView;
    /// ```
    pub fn owner(this: &Self) -> &Arc<SharedMklVec<T>> {
        &this.vec
    }
}

impl<T: Copy> Deref for ArcView<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: as for `View`: our count keeps writers out, and the `Arc`
        // keeps the vector (and so its block) alive.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> Drop for ArcView<T> {
    #[inline]
    fn drop(&mut self) {
        self.track.release();
        self.vec.flag.release_view();
    }
}

impl<T: Copy + fmt::Debug> fmt::Debug for ArcView<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

// SAFETY: an `ArcView` shares `&[T]` (needs `T: Sync`) and an
// `Arc<SharedMklVec<T>>` (needs the vector `Send + Sync`: `T: Send + Sync`).
unsafe impl<T: Copy + Send + Sync> Send for ArcView<T> {}
// SAFETY: `&ArcView` only gives `&[T]` and `&Arc<..>`; both `Sync` as above.
unsafe impl<T: Copy + Send + Sync> Sync for ArcView<T> {}
