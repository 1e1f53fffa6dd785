//! [`RawBuf`]: the MKL block behind a [`SharedMklVec`](super::SharedMklVec),
//! with its length, capacity and alignment.
//!
//! A `RawBuf` *owns* its block: it is neither `Copy` nor `Clone`, and its
//! `Drop` frees the block, so no copy of it can free the block a second
//! time. Its fields are private to this file and every method keeps the
//! invariant below, so the methods are safe; the one operation that cannot
//! check what it relies on, [`set_len`](RawBuf::set_len), is an `unsafe fn`.
//!
//! Invariant: `align` is a power of two, at least `align_of::<T>()` and at
//! most [`MAX_ALIGN`]; `ptr` is aligned to `align`; `len <= cap`; the first
//! `len` elements are initialised; if `T` is not zero-sized and `cap > 0`,
//! `ptr` is a live MKL block of `cap * size_of::<T>()` bytes (at most
//! `isize::MAX`) allocated at `align`, owned by this `RawBuf` alone;
//! otherwise `ptr` is dangling and there is no block (`cap` is 0, or
//! `usize::MAX` for zero-sized `T`).
//!
//! Sharing (who may call `&mut self` methods while views read the block) is
//! not this type's business: [`SharedMklVec`](super::SharedMklVec) keeps it
//! in a cell guarded by the state word.

use core::mem::{align_of, size_of};
use core::ptr::{self, NonNull};

use super::SharedVecError;
use crate::allocator::{MAX_ALIGN, mkl_counts, raw_alloc, raw_alloc_zeroed, raw_free, raw_realloc};

/// Pointer, length, capacity and alignment of one buffer; owns its block.
pub(crate) struct RawBuf<T> {
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
    align: usize,
    /// The bytes MKL counts for the block (`MKL_Mem_Stat`): see `allocator::mkl_counts`.
    held: usize,
}

impl<T: Copy> RawBuf<T> {
    pub(super) const IS_ZST: bool = size_of::<T>() == 0;

    /// Bytes for `cap` elements, or `CapacityOverflow` past `isize::MAX`.
    pub(super) fn bytes_for(cap: usize) -> Result<usize, SharedVecError> {
        cap.checked_mul(size_of::<T>())
            .filter(|&bytes| bytes <= isize::MAX as usize)
            .ok_or(SharedVecError::CapacityOverflow)
    }

    /// The alignment rule of the invariant, checked: a wrong `align` is a
    /// bug in this crate, never a caller's input (constructors validate
    /// user alignments first), so it panics rather than returning an error.
    #[inline]
    fn check_align(align: usize) {
        assert!(
            align.is_power_of_two() && align >= align_of::<T>() && align <= MAX_ALIGN,
            "RawBuf: block alignment {align} is not a power of two in {}..={MAX_ALIGN}",
            align_of::<T>()
        );
    }

    /// No block: a dangling pointer aligned to `align`, capacity 0 (or
    /// unbounded for zero-sized `T`, which never needs a block).
    ///
    /// # Panics
    /// If `align` breaks the invariant (see the module docs).
    pub(super) fn empty(align: usize) -> Self {
        Self::check_align(align);
        // SAFETY: align is a power of two, hence non-zero.
        let ptr = unsafe { NonNull::new_unchecked(ptr::without_provenance_mut::<T>(align)) };
        let cap = if Self::IS_ZST { usize::MAX } else { 0 };
        Self {
            ptr,
            len: 0,
            cap,
            align,
            held: 0,
        }
    }

    /// A fresh block for `cap` elements (length 0), zeroed if asked.
    ///
    /// # Panics
    /// As [`empty`](Self::empty).
    pub(super) fn allocate(cap: usize, align: usize, zeroed: bool) -> Result<Self, SharedVecError> {
        Self::check_align(align);
        let bytes = Self::bytes_for(cap)?;
        if bytes == 0 {
            return Ok(Self::empty(align));
        }
        // SAFETY: bytes > 0 and align is a power of two (checked above).
        let p = unsafe {
            if zeroed {
                raw_alloc_zeroed(bytes, align)
            } else {
                raw_alloc(bytes, align)
            }
        };
        match NonNull::new(p.cast::<T>()) {
            Some(ptr) => Ok(Self {
                ptr,
                len: 0,
                cap,
                align,
                held: mkl_counts(bytes, align),
            }),
            None => Err(SharedVecError::AllocFailed { bytes, align }),
        }
    }

    /// The block's address (dangling but aligned when there is no block).
    #[inline]
    pub(super) fn ptr(&self) -> NonNull<T> {
        self.ptr
    }

    /// Initialised elements.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Elements the block can hold.
    #[inline]
    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    /// The bytes MKL counts for the block (0 without one): its size when it
    /// was last allocated or moved, plus MKL's alignment padding and header.
    #[inline]
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Sets the length without touching the elements.
    ///
    /// # Safety
    /// `len <= self.cap()`, and the first `len` elements are initialised
    /// (valid values of `T`).
    #[inline]
    pub(super) unsafe fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.cap);
        self.len = len;
    }

    /// Moves the elements into a block of exactly `max(new_cap, len)`
    /// elements (never fewer than the length: no element is dropped). On any
    /// error nothing has changed (MKL_realloc leaves the old block intact
    /// when it fails). A shrink goes through `raw_realloc`, which moves a
    /// large block shrinking to half or less to a new one, so that MKL
    /// gives the difference back (see `allocator::shrink_moves`).
    fn set_capacity(&mut self, new_cap: usize) -> Result<(), SharedVecError> {
        let new_cap = new_cap.max(self.len);
        if Self::IS_ZST || new_cap == self.cap {
            return Ok(());
        }
        let new_bytes = Self::bytes_for(new_cap)?;
        if new_bytes == 0 {
            // Dropping the old value frees its block (cap > 0: it differs
            // from new_cap = 0).
            *self = Self::empty(self.align);
            return Ok(());
        }
        let align = self.align;
        let p = if self.cap == 0 {
            // SAFETY: new_bytes > 0, align a power of two (invariant).
            unsafe { raw_alloc(new_bytes, align) }
        } else {
            // SAFETY: ptr is a live MKL block of cap elements allocated at
            // `align` (invariant); new_bytes > 0.
            unsafe {
                raw_realloc(
                    self.ptr.as_ptr().cast(),
                    self.cap * size_of::<T>(),
                    new_bytes,
                    align,
                )
            }
        };
        let ptr = NonNull::new(p.cast::<T>()).ok_or(SharedVecError::AllocFailed {
            bytes: new_bytes,
            align,
        })?;
        // A fresh or moved block (always at a new address: the old block
        // is live until the new one exists) is counted at its new size. One
        // resized in place is counted at the larger of the two: MKL keeps
        // its count where it resized the block itself (every shrink, and a
        // growth within what it holds), and counts the new size where it
        // grew the block through `i_realloc` (the C runtime's realloc, or a
        // chunk's mremap, which may keep the address).
        if self.cap == 0 || ptr != self.ptr {
            self.held = mkl_counts(new_bytes, align);
        } else {
            self.held = self.held.max(mkl_counts(new_bytes, align));
        }
        self.ptr = ptr;
        self.cap = new_cap;
        Ok(())
    }

    /// The capacity `additional` more elements need.
    fn required(&self, additional: usize) -> Result<usize, SharedVecError> {
        self.len
            .checked_add(additional)
            .ok_or(SharedVecError::CapacityOverflow)
    }

    /// Room for `additional` more elements, growing geometrically like `Vec`.
    pub(super) fn reserve(&mut self, additional: usize) -> Result<(), SharedVecError> {
        let required = self.required(additional)?;
        if required <= self.cap {
            return Ok(());
        }
        let min_cap = match size_of::<T>() {
            1 => 8,
            n if n <= 1024 => 4,
            _ => 1,
        };
        let amortized = required.max(self.cap.saturating_mul(2)).max(min_cap);
        let new_cap = if Self::bytes_for(amortized).is_ok() {
            amortized
        } else {
            required
        };
        self.set_capacity(new_cap)
    }

    /// Room for exactly `additional` more elements.
    pub(super) fn reserve_exact(&mut self, additional: usize) -> Result<(), SharedVecError> {
        let required = self.required(additional)?;
        if required <= self.cap {
            return Ok(());
        }
        self.set_capacity(required)
    }

    pub(super) fn extend_from_slice(&mut self, items: &[T]) -> Result<(), SharedVecError> {
        self.reserve(items.len())?;
        // SAFETY: the block has room for len + items.len() elements; `items`
        // cannot overlap the spare capacity (it is borrowed, initialised
        // memory; the spare part is neither).
        unsafe {
            ptr::copy_nonoverlapping(items.as_ptr(), self.ptr.as_ptr().add(self.len), items.len());
        }
        self.len += items.len();
        Ok(())
    }

    pub(super) fn push(&mut self, value: T) -> Result<(), SharedVecError> {
        if self.len == self.cap {
            self.reserve(1)?;
        }
        // SAFETY: len < cap after the reserve.
        unsafe { self.ptr.as_ptr().add(self.len).write(value) };
        self.len += 1;
        Ok(())
    }

    pub(super) fn resize(&mut self, new_len: usize, value: T) -> Result<(), SharedVecError> {
        if new_len > self.len {
            self.reserve(new_len - self.len)?;
            // Zero-sized values need no writes (and there may be usize::MAX).
            let filled = if Self::IS_ZST { new_len } else { self.len };
            for i in filled..new_len {
                // SAFETY: i < new_len ≤ cap after the reserve.
                unsafe { self.ptr.as_ptr().add(i).write(value) };
            }
        }
        self.len = new_len;
        Ok(())
    }

    /// Exactly `new_len` elements in a block of exactly `new_len` (the new
    /// elements are `value`): one reallocation at most. On any error nothing
    /// has changed.
    pub(super) fn resize_exact(&mut self, new_len: usize, value: T) -> Result<(), SharedVecError> {
        let old_len = self.len;
        self.truncate(new_len);
        if let Err(e) = self.set_capacity(new_len) {
            // Truncating touched no element and set_capacity changed nothing:
            // restoring the length restores the buffer.
            self.len = old_len;
            return Err(e);
        }
        // The capacity is new_len now: this only writes the new elements.
        self.resize(new_len, value)
    }

    pub(super) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub(super) fn shrink_to_fit(&mut self) -> Result<(), SharedVecError> {
        self.set_capacity(self.len)
    }
}

impl<T> Drop for RawBuf<T> {
    fn drop(&mut self) {
        if crate::sync::loom_unwinding() {
            return; // a failed loom model; leaking its block is harmless
        }
        if size_of::<T>() != 0 && self.cap != 0 {
            // SAFETY: a live MKL block owned by this RawBuf alone
            // (invariant), freed once: `self` is going away.
            unsafe { raw_free(self.ptr.as_ptr().cast(), self.cap * size_of::<T>()) };
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// MKL's live bytes and blocks (`MKL_Mem_Stat`), the block cache's
    /// bytes, the slack and the backing's state.
    fn figures() -> (i64, i32, usize, usize, crate::backing::Backing) {
        let mut blocks = 0;
        // SAFETY: MKL_Mem_Stat writes one int through a valid pointer.
        let bytes = unsafe { crate::ffi::MKL_Mem_Stat(&mut blocks) };
        (
            bytes,
            blocks,
            crate::block_cache::cached_bytes(),
            crate::backing::slack_bytes(),
            crate::backing::state(),
        )
    }

    /// The MKL-allocating tests of this binary run one at a time, so that
    /// MKL's process-wide counts are exact.
    static MKL: Mutex<()> = Mutex::new(());

    /// Fails to compile if `RawBuf` is `Copy` (or `Clone`): the impl for
    /// `u8` would make the `_` below ambiguous.
    trait AmbiguousIfCopyOrClone<A> {
        fn check() {}
    }
    impl<T> AmbiguousIfCopyOrClone<()> for T {}
    impl<T: Copy> AmbiguousIfCopyOrClone<u8> for T {}
    impl<T: Clone> AmbiguousIfCopyOrClone<u16> for T {}

    #[test]
    fn raw_buf_owns_its_block() {
        <RawBuf<u64> as AmbiguousIfCopyOrClone<_>>::check();

        // Dropping the RawBuf frees the block; no other copy of it exists.
        let _one_at_a_time = MKL.lock().unwrap_or_else(|e| e.into_inner());
        crate::process::ensure_ready(); // the backing's state is part of the figures
        let before = figures();
        let mut raw = RawBuf::<u64>::allocate(1000, 64, false).unwrap();
        raw.extend_from_slice(&[1, 2, 3]).unwrap();
        assert_eq!(figures().1, before.1 + 1);
        drop(raw);
        // Freed to MKL; beneath it the block (8 KiB) may stay a dirty
        // medium block, and MKL's first block brings MKL's own: the
        // medium figures are not compared.
        assert_eq!(figures(), before);
    }

    #[test]
    fn shrinking_never_drops_below_the_length() {
        let _one_at_a_time = MKL.lock().unwrap_or_else(|e| e.into_inner());
        let mut raw = RawBuf::<u32>::allocate(100, 128, false).unwrap();
        raw.extend_from_slice(&[1, 2, 3]).unwrap();
        raw.set_capacity(0).unwrap();
        assert_eq!((raw.len(), raw.cap()), (3, 3));
        // SAFETY: three initialised elements (len 3), no other access.
        let kept = unsafe { core::slice::from_raw_parts(raw.ptr().as_ptr(), raw.len()) };
        assert_eq!(kept, [1, 2, 3]);
        assert_eq!(raw.ptr().as_ptr() as usize % 128, 0);
        raw.truncate(0);
        raw.shrink_to_fit().unwrap();
        assert_eq!(raw.cap(), 0);
    }

    #[test]
    #[should_panic(expected = "block alignment 8 is not a power of two in 16..=")]
    fn an_alignment_below_the_element_is_a_bug_caught_at_construction() {
        #[derive(Clone, Copy)]
        #[repr(align(16))]
        struct Wide(#[allow(dead_code)] u8);
        let _ = RawBuf::<Wide>::empty(8);
    }
}
