//! The concurrency primitives `SharedMklVec` and the block cache are written against: std's in
//! normal builds, loom's under `--cfg loom` so that `loom_tests/` can explore
//! every interleaving of the very same code.
//!
//! [`UnsafeCell`] offers loom's closure API (`with` / `with_mut`, as tokio's
//! facade does) in both configurations, plus access *tracks*: a guard a view
//! holds for its whole life. Under loom the track is one of loom's checked
//! pointers, so a `with_mut` (a resize) that overlaps a live view is reported
//! by the model; in normal builds it is a zero-sized no-op.

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
use core::marker::PhantomData;

/// True only under loom while a model that already failed is unwinding:
/// destructors then skip loom-tracked accesses, which would panic again
/// (loom leaves its cell state mid-access) and abort the whole test binary.
#[inline(always)]
pub(crate) fn loom_unwinding() -> bool {
    cfg!(loom) && std::thread::panicking()
}

/// `std::cell::UnsafeCell` (or loom's checked one) behind one API.
pub(crate) struct UnsafeCell<T> {
    #[cfg(not(loom))]
    inner: core::cell::UnsafeCell<T>,
    #[cfg(loom)]
    inner: loom::cell::UnsafeCell<T>,
}

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    #[inline(always)]
    pub(crate) const fn new(value: T) -> Self {
        Self {
            inner: core::cell::UnsafeCell::new(value),
        }
    }

    /// Immutable access; the caller guarantees no concurrent `with_mut`.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.inner.get())
    }

    /// Mutable access; the caller guarantees no concurrent access at all.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.inner.get())
    }

    /// Starts an immutable access that lasts until the track is released.
    #[inline(always)]
    pub(crate) fn track_read(&self) -> ReadTrack<T> {
        ReadTrack { _cell: PhantomData }
    }

    /// Starts a mutable access that lasts until the track is released.
    #[inline(always)]
    pub(crate) fn track_write(&self) -> WriteTrack<T> {
        WriteTrack { _cell: PhantomData }
    }
}

#[cfg(loom)]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            inner: loom::cell::UnsafeCell::new(value),
        }
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        self.inner.with(f)
    }

    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        self.inner.with_mut(f)
    }

    pub(crate) fn track_read(&self) -> ReadTrack<T> {
        ReadTrack {
            ptr: Some(self.inner.get()),
        }
    }

    pub(crate) fn track_write(&self) -> WriteTrack<T> {
        WriteTrack {
            ptr: Some(self.inner.get_mut()),
        }
    }
}

/// An immutable access held by a view (zero-sized outside loom).
pub(crate) struct ReadTrack<T> {
    #[cfg(loom)]
    ptr: Option<loom::cell::ConstPtr<T>>,
    #[cfg(not(loom))]
    _cell: PhantomData<fn() -> T>,
}

/// A mutable access held by a mutable view (zero-sized outside loom).
pub(crate) struct WriteTrack<T> {
    #[cfg(loom)]
    ptr: Option<loom::cell::MutPtr<T>>,
    #[cfg(not(loom))]
    _cell: PhantomData<fn() -> T>,
}

impl<T> ReadTrack<T> {
    /// Ends the access. Called before the view gives its count back, so the
    /// model sees the access end before the word says the buffer is free.
    #[inline(always)]
    pub(crate) fn release(&mut self) {
        #[cfg(loom)]
        drop(self.ptr.take());
    }
}

impl<T> WriteTrack<T> {
    /// Ends the access, before the exclusive claim is given back.
    #[inline(always)]
    pub(crate) fn release(&mut self) {
        #[cfg(loom)]
        drop(self.ptr.take());
    }
}
