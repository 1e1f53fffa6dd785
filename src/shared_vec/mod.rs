//! [`SharedMklVec`]: a growable buffer in MKL memory that can be shared by
//! reference between threads, read through counted views, and resized
//! through `&self` whenever no view is alive.
//!
//! The concurrency lives in one atomic word per buffer ([`flag`]): a view
//! counts itself in it, a resize or mutable view claims it exclusively, and
//! the two exclude each other. Nothing blocks; every conflict is an
//! immediate [`SharedVecError`].

mod error;
mod export;
mod flag;
mod raw;
mod views;

pub use error::SharedVecError;
pub use export::Export;
#[cfg(loom)]
#[doc(hidden)]
pub use flag::Mutant;
pub use views::{ArcView, View, ViewMut};

use core::alloc::Layout;
use core::fmt;
use core::mem::{align_of, size_of};
use core::ptr::NonNull;

use crate::allocator::{MAX_ALIGN, MIN_ALIGN};
use crate::sync::{Arc, AtomicPtr, AtomicUsize, Ordering, UnsafeCell};
use flag::BorrowFlag;
pub(crate) use raw::RawBuf;

/// A growable buffer of `T` in MKL memory, shareable across threads, whose
/// counted views make a resize through `&self` safe.
///
/// * **Reading** through `&self`: [`view`](Self::view) gives a [`View`]
///   (`Deref<Target = [T]>`); any number may coexist.
///   [`view_arc`](Self::view_arc) gives an owned, `'static` [`ArcView`] for
///   another thread or FFI.
/// * **Writing** through `&self`: [`try_view_mut`](Self::try_view_mut) gives
///   an exclusive [`ViewMut`]; `try_push`, `try_resize`, `try_reserve`,
///   `try_extend_from_slice`, `try_truncate`, `try_shrink_to_fit` resize.
///   Each is refused at once (never blocks) with
///   [`Exported { views }`](SharedVecError::Exported) while views are alive
///   (a resize may move the block they read) or [`Busy`](SharedVecError::Busy)
///   while another resize or mutable view holds the buffer, and then changes
///   nothing. A size that overflows (the current length plus the growth,
///   past `isize::MAX` bytes) is refused with
///   [`CapacityOverflow`](SharedVecError::CapacityOverflow) before the state
///   is even looked at, so also while views or a mutable view are alive.
///   If MKL cannot provide the memory the result is
///   [`AllocFailed`](SharedVecError::AllocFailed) and pointer, length,
///   capacity and contents are exactly as before.
/// * **With `&mut self`** the borrow checker already proves exclusivity:
///   [`as_mut_slice`](Self::as_mut_slice), [`push`](Self::push),
///   [`resize`](Self::resize), … touch no atomic. Like `Vec`'s they panic on
///   capacity overflow and call [`handle_alloc_error`](std::alloc::handle_alloc_error)
///   when MKL fails; use the `try_` methods to get the error instead.
///
/// The block is aligned to [`alignment()`](Self::alignment) (64 by default,
/// any power of two up to 2^30 on request) and keeps that alignment across
/// every reallocation. An empty buffer (or one of zero-sized `T`) holds no
/// MKL block.
///
/// ```
/// use mkl_alloc::{SharedMklVec, SharedVecError};
///
/// let v = SharedMklVec::from_slice(&[1.0f64, 2.0, 3.0]);
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         // The whole buffer before the push or after it, never a torn one;
///         // refused (not blocked) while the push holds the buffer.
///         match v.view() {
///             Ok(view) => assert!([6.0, 10.0].contains(&view.iter().sum::<f64>())),
///             Err(SharedVecError::Busy) => {}
///             Err(e) => panic!("{e}"),
///         }
///     });
///     s.spawn(|| {
///         // Refused while another thread holds a view, accepted otherwise.
///         match v.try_push(4.0) {
///             Ok(()) | Err(SharedVecError::Exported { .. }) => {}
///             Err(e) => panic!("{e}"),
///         }
///     });
/// });
/// assert!(v.len() == 3 || v.len() == 4);
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// ```
pub struct SharedMklVec<T: Copy> {
    flag: BorrowFlag,
    raw: UnsafeCell<RawBuf<T>>,
    /// Relaxed copies of the cell for `len()`, `capacity()`, `as_ptr()` and
    /// `Debug` through `&self`: stored by whoever writes the cell, never used
    /// to reach the elements.
    seen_ptr: AtomicPtr<T>,
    seen_len: AtomicUsize,
    seen_cap: AtomicUsize,
    /// The alignment asked for (a power of two ≤ 2^30). Immutable.
    align: usize,
    /// Relaxed copy of the bytes MKL counts for the block, for `heap_size`.
    seen_held: AtomicUsize,
}

// SAFETY: the vector owns its block (as `Vec<T>` does) and the state word
// and mirrors are atomics; moving it moves `T`s, hence `T: Send`.
unsafe impl<T: Copy + Send> Send for SharedMklVec<T> {}
// SAFETY: through `&self` other threads read `T`s (views: `T: Sync`) and
// write or move them in (mutable views, `try_push`: `T: Send`), always under
// the state word's protocol, which keeps readers and the one writer apart.
unsafe impl<T: Copy + Send + Sync> Sync for SharedMklVec<T> {}

/// Checks an alignment: a power of two no larger than [`MAX_ALIGN`].
fn check_alignment(align: usize) -> Result<(), SharedVecError> {
    if align.is_power_of_two() && align <= MAX_ALIGN {
        Ok(())
    } else {
        Err(SharedVecError::InvalidAlignment(align))
    }
}

/// `Ok` or the `Vec`-like reaction: panic on overflow, `handle_alloc_error`
/// when MKL fails.
#[track_caller]
fn or_abort<R>(result: Result<R, SharedVecError>) -> R {
    match result {
        Ok(value) => value,
        Err(SharedVecError::AllocFailed { bytes, align }) => std::alloc::handle_alloc_error(
            Layout::from_size_align(bytes, align).unwrap_or(Layout::new::<u8>()),
        ),
        Err(e) => panic!("{e}"),
    }
}

/// Gives an exclusive claim back, also when the holder panics.
struct Claim<'a>(&'a BorrowFlag);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0.release_exclusive();
    }
}

impl<T: Copy> SharedMklVec<T> {
    fn from_raw(raw: RawBuf<T>, align: usize) -> Self {
        Self {
            flag: BorrowFlag::new(),
            seen_ptr: AtomicPtr::new(raw.ptr().as_ptr()),
            seen_len: AtomicUsize::new(raw.len()),
            seen_cap: AtomicUsize::new(raw.cap()),
            seen_held: AtomicUsize::new(raw.held()),
            raw: UnsafeCell::new(raw),
            align,
        }
    }

    /// The alignment of every block and of the dangling pointer: what was
    /// asked, raised to `T`'s own alignment and to MKL's 64.
    #[inline]
    fn block_align_for(align: usize) -> usize {
        align.max(align_of::<T>()).max(MIN_ALIGN)
    }

    /// Stores the mirrors after the cell changed (writer only).
    #[inline]
    fn publish(&self, raw: &RawBuf<T>) {
        // Relaxed: the mirrors are reports; whoever needs the real values
        // reads the cell under the protocol.
        self.seen_ptr.store(raw.ptr().as_ptr(), Ordering::Relaxed);
        self.seen_len.store(raw.len(), Ordering::Relaxed);
        self.seen_cap.store(raw.cap(), Ordering::Relaxed);
        self.seen_held.store(raw.held(), Ordering::Relaxed);
    }

    /// Runs `f` on the cell under an exclusive claim (refused while views or
    /// another holder exist), then publishes the mirrors and releases.
    fn exclusive<R>(
        &self,
        f: impl FnOnce(&mut RawBuf<T>) -> Result<R, SharedVecError>,
    ) -> Result<R, SharedVecError> {
        self.flag.try_claim()?;
        let _claim = Claim(&self.flag);
        // SAFETY: the exclusive claim keeps every view and every other
        // writer away from the cell until `_claim` is dropped.
        unsafe { self.write_raw(f) }
    }

    /// Refuses with `CapacityOverflow`, before the state word is looked at,
    /// a growth by `additional` elements past `isize::MAX` bytes (or, for
    /// zero-sized `T`, past `usize::MAX` elements), so that the overflow is
    /// reported even while views or a mutable view are alive.
    ///
    /// The length is read from the `seen_len` mirror, an atomic: the read
    /// never races, and needs no view or claim. It is exact whenever no
    /// resize runs concurrently (in particular while any view or mutable
    /// view is alive, since those keep resizes out, and the mirror was
    /// stored before the claim that wrote it was released). If a resize does
    /// run concurrently, the mirror still holds a length the buffer had (a
    /// snapshot, as [`len`](Self::len) says), never a torn or invented one,
    /// and the verdict is the right one for that length: the call behaves as
    /// if it had run at that moment. Either way this check can only refuse
    /// early, never let an overflow through: the resize itself checks again,
    /// exactly, under its claim.
    #[inline]
    fn check_growth(&self, additional: usize) -> Result<(), SharedVecError> {
        let required = self
            .len()
            .checked_add(additional)
            .ok_or(SharedVecError::CapacityOverflow)?;
        RawBuf::<T>::bytes_for(required).map(drop)
    }

    /// Runs `f` on the cell through `&mut self`: no atomic protocol needed.
    fn exclusive_mut<R>(&mut self, f: impl FnOnce(&mut RawBuf<T>) -> R) -> R {
        // SAFETY: `&mut self` proves no view, guard or other reference to
        // the vector exists.
        unsafe { self.write_raw(f) }
    }

    /// Runs `f` on the cell, then publishes the mirrors.
    ///
    /// # Safety
    /// Nothing else reads or writes the cell meanwhile (an exclusive claim or
    /// `&mut self`).
    #[inline]
    unsafe fn write_raw<R>(&self, f: impl FnOnce(&mut RawBuf<T>) -> R) -> R {
        self.raw.with_mut(|raw| {
            // SAFETY: exclusive access to the cell (the caller's contract).
            let raw = unsafe { &mut *raw };
            let result = f(raw);
            self.publish(raw);
            result
        })
    }

    /// The block's address and length, read from the cell (a plain pair: the
    /// block stays owned by the cell).
    ///
    /// # Safety
    /// The caller holds a view or an exclusive claim (taken before this
    /// call), or `&mut self`: no writer can touch the cell during the read.
    /// The pair stays valid only as long as that view or claim.
    #[inline]
    unsafe fn read_raw(&self) -> (NonNull<T>, usize) {
        self.raw.with(|raw| {
            // SAFETY: no writer meanwhile (the caller's contract), so the
            // shared read of the cell does not race.
            let raw = unsafe { &*raw };
            (raw.ptr(), raw.len())
        })
    }

    /// An empty buffer aligned to 64 bytes; allocates nothing.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::<f32>::new();
    /// assert!(v.is_empty());
    /// assert_eq!(v.capacity(), 0);
    /// assert_eq!(v.alignment(), 64);
    /// ```
    pub fn new() -> Self {
        Self::from_raw(RawBuf::empty(Self::block_align_for(MIN_ALIGN)), MIN_ALIGN)
    }

    /// An empty buffer with room for `capacity` elements, aligned to 64.
    ///
    /// # Panics
    /// If `capacity` elements exceed `isize::MAX` bytes; calls
    /// [`handle_alloc_error`](std::alloc::handle_alloc_error) if MKL fails.
    /// [`with_alignment`](Self::with_alignment) returns these as errors.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::<f64>::with_capacity(100);
    /// assert!(v.capacity() >= 100);
    /// assert_eq!(v.len(), 0);
    /// ```
    #[track_caller]
    pub fn with_capacity(capacity: usize) -> Self {
        or_abort(Self::with_alignment(capacity, MIN_ALIGN))
    }

    /// An empty buffer with room for `capacity` elements whose block is
    /// aligned to `align`: any power of two up to [`MAX_ALIGN`] (2^30).
    ///
    /// Errors: [`InvalidAlignment`](SharedVecError::InvalidAlignment) for
    /// anything else (MKL would silently hand out misaligned memory for a
    /// non-power of two), `CapacityOverflow`, `AllocFailed`.
    ///
    /// ```
    /// use mkl_alloc::{SharedMklVec, SharedVecError};
    ///
    /// let v = SharedMklVec::<u8>::with_alignment(10, 4096).unwrap();
    /// assert_eq!(v.alignment(), 4096);
    /// assert_eq!(v.as_ptr() as usize % 4096, 0);
    /// assert_eq!(
    ///     SharedMklVec::<u8>::with_alignment(10, 100).unwrap_err(),
    ///     SharedVecError::InvalidAlignment(100)
    /// );
    /// ```
    pub fn with_alignment(capacity: usize, align: usize) -> Result<Self, SharedVecError> {
        check_alignment(align)?;
        let raw = RawBuf::allocate(capacity, Self::block_align_for(align), false)?;
        Ok(Self::from_raw(raw, align))
    }

    /// A buffer holding a copy of `items`, aligned to 64.
    ///
    /// # Panics
    /// Calls [`handle_alloc_error`](std::alloc::handle_alloc_error) if MKL
    /// fails; [`from_slice_with_alignment`](Self::from_slice_with_alignment)
    /// returns the error instead.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::from_slice(&[1, 2, 3]);
    /// assert_eq!(&*v.view().unwrap(), &[1, 2, 3]);
    /// ```
    #[track_caller]
    pub fn from_slice(items: &[T]) -> Self {
        or_abort(Self::from_slice_with_alignment(items, MIN_ALIGN))
    }

    /// A buffer holding a copy of `items`, its block aligned to `align`.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::from_slice_with_alignment(&[1u16, 2], 256).unwrap();
    /// assert_eq!(v.as_ptr() as usize % 256, 0);
    /// assert_eq!(&*v.view().unwrap(), &[1, 2]);
    /// ```
    pub fn from_slice_with_alignment(items: &[T], align: usize) -> Result<Self, SharedVecError> {
        check_alignment(align)?;
        let block_align = Self::block_align_for(align);
        let mut raw = RawBuf::allocate(items.len(), block_align, false)?;
        raw.extend_from_slice(items)?;
        Ok(Self::from_raw(raw, align))
    }

    /// A copy: a distinct block with equal contents and the same alignment.
    ///
    /// It holds a view of `self` for the whole copy, so a concurrent resize
    /// of `self` is refused rather than racing the copy. Errors: `Busy` if
    /// `self` is held exclusively right now, `AllocFailed`.
    /// (There is no `Clone`: a copy can be refused, and `clone` cannot say so.)
    ///
    /// ```
    /// let a = mkl_alloc::SharedMklVec::from_slice(&[1u32, 2, 3]);
    /// let b = a.try_clone().unwrap();
    /// assert_eq!(&*a.view().unwrap(), &*b.view().unwrap());
    /// assert_ne!(a.as_ptr(), b.as_ptr());
    /// ```
    pub fn try_clone(&self) -> Result<Self, SharedVecError> {
        self.try_clone_with_alignment(self.align)
    }

    /// A copy as [`try_clone`](Self::try_clone), its block aligned to
    /// `align` instead.
    ///
    /// ```
    /// let a = mkl_alloc::SharedMklVec::from_slice(&[1u32, 2, 3]);
    /// let b = a.try_clone_with_alignment(1 << 12).unwrap();
    /// assert_eq!(b.alignment(), 4096);
    /// assert_eq!(b.as_ptr() as usize % 4096, 0);
    /// ```
    pub fn try_clone_with_alignment(&self, align: usize) -> Result<Self, SharedVecError> {
        check_alignment(align)?;
        let source = self.view()?;
        let block_align = Self::block_align_for(align);
        let mut raw = RawBuf::allocate(source.len, block_align, false)?;
        // Read through the raw pointer, never a `&[T]`: an `Export` may be
        // writing these elements meanwhile (see export.rs for what a copy
        // racing such a writer guarantees).
        // SAFETY: the view keeps `source.ptr` live with `source.len`
        // initialised elements for the whole copy; the fresh block has room
        // for `source.len` and is a distinct allocation. set_len comes after
        // the copy: `source.len` ≤ the capacity, and that many elements are
        // now initialised.
        unsafe {
            core::ptr::copy_nonoverlapping(source.ptr.as_ptr(), raw.ptr().as_ptr(), source.len);
            raw.set_len(source.len);
        }
        Ok(Self::from_raw(raw, align))
    }

    /// Elements in the buffer.
    ///
    /// Through `&self` this is a snapshot: another thread may resize right
    /// after. For a length that stays true, take a [`view`](Self::view).
    ///
    /// ```
    /// assert_eq!(mkl_alloc::SharedMklVec::from_slice(&[1, 2]).len(), 2);
    /// ```
    #[inline]
    pub fn len(&self) -> usize {
        self.seen_len.load(Ordering::Relaxed)
    }

    /// Whether [`len`](Self::len) is 0 (a snapshot, as `len`).
    ///
    /// ```
    /// assert!(mkl_alloc::SharedMklVec::<u8>::new().is_empty());
    /// ```
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements the block can hold without reallocating (a snapshot, as
    /// [`len`](Self::len)); `usize::MAX` for zero-sized `T`.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::<u8>::with_capacity(8);
    /// assert!(v.capacity() >= 8);
    /// ```
    #[inline]
    pub fn capacity(&self) -> usize {
        self.seen_cap.load(Ordering::Relaxed)
    }

    /// The alignment asked for at construction (64 by default). The block,
    /// and so [`as_ptr`](Self::as_ptr), is always a multiple of it, across
    /// every reallocation.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::<u8>::with_alignment(1, 128).unwrap();
    /// assert_eq!(v.alignment(), 128);
    /// ```
    #[inline]
    pub fn alignment(&self) -> usize {
        self.align
    }

    /// The block's address (a snapshot, as [`len`](Self::len)): it stays
    /// valid only while a view, a mutable view or `&mut self` keeps resizes
    /// out. Dangling (but aligned) when no block is held.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::from_slice(&[1.0f32; 16]);
    /// let view = v.view().unwrap();
    /// assert_eq!(v.as_ptr(), view.as_ptr());
    /// assert_eq!(v.as_ptr() as usize % 64, 0);
    /// ```
    #[inline]
    pub fn as_ptr(&self) -> *const T {
        self.seen_ptr.load(Ordering::Relaxed)
    }

    /// A shared view of the elements; many may coexist, and while any lives
    /// every resize is refused with `Exported`.
    ///
    /// Errors: [`Busy`](SharedVecError::Busy) while a resize or mutable view
    /// holds the buffer, [`TooManyViews`](SharedVecError::TooManyViews) at
    /// the (astronomical) limit.
    ///
    /// ```
    /// use mkl_alloc::{SharedMklVec, SharedVecError};
    ///
    /// let v = SharedMklVec::from_slice(&[1, 2, 3]);
    /// let view = v.view().unwrap();
    /// assert_eq!(view[1], 2);
    /// assert_eq!(v.try_push(4), Err(SharedVecError::Exported { views: 1 }));
    /// ```
    #[inline]
    pub fn view(&self) -> Result<View<'_, T>, SharedVecError> {
        self.flag.try_view()?;
        // From here the count keeps writers out; read only after taking it.
        let track = self.raw.track_read();
        // SAFETY: our view, counted just above, keeps writers out.
        let (ptr, len) = unsafe { self.read_raw() };
        Ok(View {
            vec: self,
            ptr,
            len,
            track,
        })
    }

    /// An owned view of a vector held in an `Arc`: `'static` and `Send` when
    /// `T: Send + Sync`, so it can go to another thread or be held by FFI
    /// code. It keeps the vector alive and counts as a view like
    /// [`view`](Self::view)'s.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use mkl_alloc::SharedMklVec;
    ///
    /// let v = Arc::new(SharedMklVec::from_slice(&[1u8, 2, 3]));
    /// let owned = SharedMklVec::view_arc(&v).unwrap();
    /// assert!(v.try_push(4).is_err());
    /// let handle = std::thread::spawn(move || owned.len());
    /// assert_eq!(handle.join().unwrap(), 3);
    /// v.try_push(4).unwrap();
    /// ```
    pub fn view_arc(this: &Arc<Self>) -> Result<ArcView<T>, SharedVecError> {
        this.flag.try_view()?;
        let track = this.raw.track_read();
        // SAFETY: our view, counted just above, keeps writers out.
        let (ptr, len) = unsafe { this.read_raw() };
        Ok(ArcView {
            vec: Arc::clone(this),
            ptr,
            len,
            track,
        })
    }

    /// An exclusive mutable view. Errors: `Exported { views }` while shared
    /// views are alive, `Busy` while a resize or another mutable view holds
    /// the buffer.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::from_slice(&[1, 2, 3]);
    /// v.try_view_mut().unwrap().reverse();
    /// assert_eq!(&*v.view().unwrap(), &[3, 2, 1]);
    /// ```
    pub fn try_view_mut(&self) -> Result<ViewMut<'_, T>, SharedVecError> {
        self.flag.try_claim()?;
        // From here the claim keeps everyone else away from the cell.
        // SAFETY: our claim, taken just above, keeps every writer out.
        let (ptr, len) = unsafe { self.read_raw() };
        let track = self.raw.track_write();
        Ok(ViewMut {
            vec: self,
            ptr,
            len,
            track,
        })
    }

    /// The most shared views that may be alive at once:
    /// `1 << (usize::BITS - 2)`, i.e. 2^62 on 64-bit targets (half of what
    /// the state word's count bits hold, so that the increments of refused
    /// views can never reach the exclusive bit). One more is refused with
    /// [`TooManyViews { max: MAX_VIEWS }`](SharedVecError::TooManyViews).
    ///
    /// ```
    /// use mkl_alloc::SharedMklVec;
    ///
    /// assert_eq!(SharedMklVec::<f64>::MAX_VIEWS, 1 << (usize::BITS - 2));
    /// ```
    pub const MAX_VIEWS: usize = flag::MAX_VIEWS;

    /// Live shared views right now (a snapshot; 0 while the buffer is held
    /// exclusively).
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::from_slice(&[1]);
    /// let a = v.view().unwrap();
    /// let b = v.view().unwrap();
    /// assert_eq!(v.view_count(), 2);
    /// drop((a, b));
    /// assert_eq!(v.view_count(), 0);
    /// ```
    #[inline]
    pub fn view_count(&self) -> usize {
        self.flag.views()
    }

    /// Resizes to `new_len` elements, filling new ones with `value` (like
    /// `Vec::resize`: capacity grows geometrically and is kept on shrink).
    ///
    /// Errors: `CapacityOverflow` (checked first, even while views live),
    /// then `Exported` / `Busy`, then `AllocFailed`; on error nothing changed.
    ///
    /// ```
    /// use mkl_alloc::{SharedMklVec, SharedVecError};
    ///
    /// let v = SharedMklVec::from_slice(&[1u8, 2]);
    /// v.try_resize(4, 9).unwrap();
    /// assert_eq!(&*v.view().unwrap(), &[1, 2, 9, 9]);
    /// let view = v.view().unwrap();
    /// assert_eq!(v.try_resize(usize::MAX, 0), Err(SharedVecError::CapacityOverflow));
    /// assert_eq!(v.try_resize(1, 0), Err(SharedVecError::Exported { views: 1 }));
    /// ```
    pub fn try_resize(&self, new_len: usize, value: T) -> Result<(), SharedVecError> {
        RawBuf::<T>::bytes_for(new_len)?;
        self.exclusive(|raw| raw.resize(new_len, value))
    }

    /// Resizes to exactly `new_len` elements under one exclusive claim:
    /// elements up to `min(len, new_len)` are kept, new ones are `value`, and
    /// on success the capacity is exactly `new_len` (one reallocation, or
    /// none if it already was; the block is freed for `new_len == 0`). For
    /// zero-sized `T` the capacity stays unbounded.
    ///
    /// A shrink gives the memory back where it matters: a block of 256 KiB
    /// or more shrunk to half its size or less moves to a new block of the
    /// new size (allocate, copy, free), because `MKL_realloc` shrinks in
    /// place and keeps holding the whole old block. Smaller shrinks stay in
    /// place, and MKL then still holds (and counts) the old block's size;
    /// see [`heap_size`](Self::heap_size).
    ///
    /// Errors: `CapacityOverflow` (checked first, even while views live),
    /// then `Exported` / `Busy`, then `AllocFailed`; on error the pointer,
    /// length, capacity and contents are exactly as before.
    ///
    /// ```
    /// use mkl_alloc::{SharedMklVec, SharedVecError};
    ///
    /// let v = SharedMklVec::from_slice(&[1u8, 2, 3]);
    /// v.try_resize_exact(5, 0).unwrap();
    /// assert_eq!((v.len(), v.capacity()), (5, 5));
    /// assert_eq!(&*v.view().unwrap(), &[1, 2, 3, 0, 0]);
    /// v.try_resize_exact(2, 0).unwrap();
    /// assert_eq!((v.len(), v.capacity()), (2, 2));
    /// let view = v.view().unwrap();
    /// assert_eq!(v.try_resize_exact(8, 0), Err(SharedVecError::Exported { views: 1 }));
    /// ```
    pub fn try_resize_exact(&self, new_len: usize, value: T) -> Result<(), SharedVecError> {
        RawBuf::<T>::bytes_for(new_len)?;
        self.exclusive(|raw| raw.resize_exact(new_len, value))
    }

    /// Makes room for at least `additional` more elements (geometric growth).
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::<f64>::new();
    /// v.try_reserve(10).unwrap();
    /// assert!(v.capacity() >= 10);
    /// ```
    pub fn try_reserve(&self, additional: usize) -> Result<(), SharedVecError> {
        self.check_growth(additional)?;
        self.exclusive(|raw| raw.reserve(additional))
    }

    /// Makes room for exactly `additional` more elements.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::<f64>::new();
    /// v.try_reserve_exact(10).unwrap();
    /// assert_eq!(v.capacity(), 10);
    /// ```
    pub fn try_reserve_exact(&self, additional: usize) -> Result<(), SharedVecError> {
        self.check_growth(additional)?;
        self.exclusive(|raw| raw.reserve_exact(additional))
    }

    /// Appends one element.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::new();
    /// v.try_push(1.5f32).unwrap();
    /// assert_eq!(&*v.view().unwrap(), &[1.5]);
    /// ```
    pub fn try_push(&self, value: T) -> Result<(), SharedVecError> {
        self.check_growth(1)?;
        self.exclusive(|raw| raw.push(value))
    }

    /// Appends a copy of `items`. A slice borrowed from a view of this very
    /// buffer is refused with `Exported` (that view is alive).
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::from_slice(&[1, 2]);
    /// v.try_extend_from_slice(&[3, 4]).unwrap();
    /// assert_eq!(&*v.view().unwrap(), &[1, 2, 3, 4]);
    /// ```
    pub fn try_extend_from_slice(&self, items: &[T]) -> Result<(), SharedVecError> {
        self.check_growth(items.len())?;
        self.exclusive(|raw| raw.extend_from_slice(items))
    }

    /// Shortens to `len` elements (no effect if already shorter); the
    /// capacity is kept.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::from_slice(&[1, 2, 3]);
    /// v.try_truncate(1).unwrap();
    /// assert_eq!(&*v.view().unwrap(), &[1]);
    /// ```
    pub fn try_truncate(&self, len: usize) -> Result<(), SharedVecError> {
        self.exclusive(|raw| {
            raw.truncate(len);
            Ok(())
        })
    }

    /// Removes every element; the capacity is kept.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::from_slice(&[1, 2, 3]);
    /// v.try_clear().unwrap();
    /// assert!(v.is_empty());
    /// ```
    pub fn try_clear(&self) -> Result<(), SharedVecError> {
        self.try_truncate(0)
    }

    /// Shrinks the block to the length (frees it if empty). A large block
    /// that shrinks to half or less gives its memory back to MKL, as in
    /// [`try_resize_exact`](Self::try_resize_exact).
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::<u64>::with_capacity(100);
    /// v.try_push(7).unwrap();
    /// v.try_shrink_to_fit().unwrap();
    /// assert_eq!(v.capacity(), 1);
    /// ```
    pub fn try_shrink_to_fit(&self) -> Result<(), SharedVecError> {
        self.exclusive(|raw| raw.shrink_to_fit())
    }

    /// Bytes this buffer holds: the MKL block as MKL counts it
    /// (`MKL_Mem_Stat`: the block's size when it was last allocated or moved,
    /// MKL's alignment padding of `max(alignment, 64)` bytes and its 24-byte
    /// header, measured with oneMKL 2026.2) plus the handle itself
    /// (`size_of::<Self>()`). A block that MKL resized in place is counted,
    /// by MKL and here, at the size MKL still holds. In an `Arc`, add the
    /// `Arc`'s counters, padded to the handle's 64-byte alignment: 64 bytes.
    /// With the huge-page policy covering the block, MKL's padding is the
    /// 2 MiB it was asked for; with the [block cache](crate::block_cache)
    /// on, a reused block may be up to 1/8 larger than counted here.
    ///
    /// ```
    /// use mkl_alloc::SharedMklVec;
    ///
    /// let v = SharedMklVec::<f64>::with_alignment(1000, 4096).unwrap();
    /// // 8000 bytes, 4096 of alignment padding, MKL's 24-byte header.
    /// assert_eq!(v.heap_size(), 8000 + 4096 + 24 + size_of::<SharedMklVec<f64>>());
    /// ```
    pub fn heap_size(&self) -> usize {
        self.seen_held.load(Ordering::Relaxed) + size_of::<Self>()
    }

    /// The elements, through `&mut self` (no atomics: the borrow proves
    /// exclusivity). Through `&self`, take a [`view`](Self::view).
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::from_slice(&[1, 2]);
    /// assert_eq!(v.as_slice(), &[1, 2]);
    /// ```
    pub fn as_slice(&mut self) -> &[T] {
        self.as_mut_slice()
    }

    /// The elements, mutably, through `&mut self`.
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::from_slice(&[1, 2]);
    /// v.as_mut_slice()[0] = 5;
    /// assert_eq!(v.as_slice(), &[5, 2]);
    /// ```
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        let (ptr, len) = self.exclusive_mut(|raw| (raw.ptr(), raw.len()));
        // SAFETY: `&mut self` excludes every other access for the returned
        // borrow's life; ptr holds len initialised, aligned elements.
        unsafe { core::slice::from_raw_parts_mut(ptr.as_ptr(), len) }
    }

    /// The block's address, mutably, through `&mut self`.
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::from_slice(&[1u8]);
    /// // SAFETY: the buffer holds one element and `&mut v` excludes every other access.
    /// unsafe { *v.as_mut_ptr() = 2 };
    /// assert_eq!(v.as_slice(), &[2]);
    /// ```
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.exclusive_mut(|raw| raw.ptr().as_ptr())
    }

    /// Appends one element (`&mut self`, no atomics).
    ///
    /// # Panics
    /// On capacity overflow; calls [`handle_alloc_error`](std::alloc::handle_alloc_error)
    /// if MKL fails (as `Vec` does). [`try_push`](Self::try_push) returns these.
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::new();
    /// v.push(1u8);
    /// assert_eq!(v.as_slice(), &[1]);
    /// ```
    #[track_caller]
    pub fn push(&mut self, value: T) {
        or_abort(self.exclusive_mut(|raw| raw.push(value)))
    }

    /// Resizes to `new_len`, filling with `value` (`&mut self`; panics as
    /// [`push`](Self::push)).
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::new();
    /// v.resize(3, 7u32);
    /// assert_eq!(v.as_slice(), &[7, 7, 7]);
    /// ```
    #[track_caller]
    pub fn resize(&mut self, new_len: usize, value: T) {
        or_abort(self.exclusive_mut(|raw| raw.resize(new_len, value)))
    }

    /// Makes room for `additional` more elements (`&mut self`; panics as
    /// [`push`](Self::push)).
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::<u8>::new();
    /// v.reserve(100);
    /// assert!(v.capacity() >= 100);
    /// ```
    #[track_caller]
    pub fn reserve(&mut self, additional: usize) {
        or_abort(self.exclusive_mut(|raw| raw.reserve(additional)))
    }

    /// Appends a copy of `items` (`&mut self`; panics as [`push`](Self::push)).
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::new();
    /// v.extend_from_slice(&[1, 2, 3]);
    /// assert_eq!(v.as_slice(), &[1, 2, 3]);
    /// ```
    #[track_caller]
    pub fn extend_from_slice(&mut self, items: &[T]) {
        or_abort(self.exclusive_mut(|raw| raw.extend_from_slice(items)))
    }

    /// Shortens to `len` elements (`&mut self`).
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::from_slice(&[1, 2, 3]);
    /// v.truncate(2);
    /// assert_eq!(v.as_slice(), &[1, 2]);
    /// ```
    pub fn truncate(&mut self, len: usize) {
        self.exclusive_mut(|raw| raw.truncate(len))
    }

    /// Removes every element (`&mut self`); the capacity is kept.
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::from_slice(&[1, 2, 3]);
    /// v.clear();
    /// assert!(v.is_empty());
    /// ```
    pub fn clear(&mut self) {
        self.truncate(0)
    }

    /// Shrinks the block to the length (`&mut self`; panics as
    /// [`push`](Self::push)).
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::<u8>::with_capacity(64);
    /// v.push(1);
    /// v.shrink_to_fit();
    /// assert_eq!(v.capacity(), 1);
    /// ```
    #[track_caller]
    pub fn shrink_to_fit(&mut self) {
        or_abort(self.exclusive_mut(|raw| raw.shrink_to_fit()))
    }

    /// Loom only: the same vector running a deliberately broken protocol.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn with_mutant(mut self, mutant: Mutant) -> Self {
        self.flag.set_mutant(mutant);
        self
    }

    /// Loom only: the raw state word.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn loom_state(&self) -> usize {
        self.flag.raw()
    }
}

#[cfg(feature = "bytemuck")]
#[cfg_attr(docsrs, doc(cfg(feature = "bytemuck")))]
impl<T: Copy + bytemuck::Zeroable> SharedMklVec<T> {
    /// `len` all-zero elements straight from `MKL_calloc`, aligned to 64
    /// (for element types whose all-zero bytes are a valid value).
    ///
    /// # Panics
    /// As [`with_capacity`](Self::with_capacity).
    ///
    /// ```
    /// let mut v = mkl_alloc::SharedMklVec::<f64>::zeroed(1000);
    /// assert!(v.as_slice().iter().all(|&x| x == 0.0));
    /// ```
    #[track_caller]
    pub fn zeroed(len: usize) -> Self {
        or_abort(Self::zeroed_with_alignment(len, MIN_ALIGN))
    }

    /// `len` all-zero elements from `MKL_calloc`, the block aligned to `align`.
    ///
    /// ```
    /// let v = mkl_alloc::SharedMklVec::<u32>::zeroed_with_alignment(8, 512).unwrap();
    /// assert_eq!(&*v.view().unwrap(), &[0; 8]);
    /// assert_eq!(v.as_ptr() as usize % 512, 0);
    /// ```
    pub fn zeroed_with_alignment(len: usize, align: usize) -> Result<Self, SharedVecError> {
        check_alignment(align)?;
        let mut raw = RawBuf::allocate(len, Self::block_align_for(align), true)?;
        // SAFETY: the block holds `len` zeroed elements (capacity `len`),
        // valid values by `Zeroable`.
        unsafe { raw.set_len(len) };
        Ok(Self::from_raw(raw, align))
    }
}

impl<T: Copy> Default for SharedMklVec<T> {
    /// [`SharedMklVec::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy> fmt::Debug for SharedMklVec<T> {
    /// Length, capacity, alignment, pointer and live views (snapshots).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMklVec")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("alignment", &self.align)
            .field("ptr", &self.as_ptr())
            .field("views", &self.view_count())
            .field("exclusive", &self.flag.is_exclusive())
            .finish()
    }
}

#[cfg(feature = "serde")]
mod serde_impl;
