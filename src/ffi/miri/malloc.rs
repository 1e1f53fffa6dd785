//! MKL's allocation entry points, `MKL_malloc`, `MKL_calloc`, `MKL_realloc`
//! and `MKL_free`: a small block placed by [`placement`](super::placement)
//! (and resized in place in `in-place` mode), a large one through MKL's
//! pointers ([`large`](super::large)), each recorded in the table of live
//! blocks ([`blocks`](super::blocks)).

use core::ffi::{c_int, c_void};
use core::mem::MaybeUninit;
use core::ptr;
use core::sync::atomic::Ordering;

use super::blocks::{live_block, not_a_block, release, table, take_block};
use super::large::{HEADER, LARGE, allocate_large, reallocate_large};
use super::mode::{Mode, mode};
use super::placement::{MAX_SLACK, place};
use super::statistics::{ANY_BLOCK, account};

/// MKL's default (and minimum) alignment.
pub(super) const DEFAULT_ALIGN: usize = 64;

/// The alignment a block gets for a requested `align`.
fn effective_align(align: c_int) -> usize {
    match usize::try_from(align) {
        Ok(a) if a.is_power_of_two() => a.max(DEFAULT_ALIGN),
        _ => DEFAULT_ALIGN,
    }
}

/// A fresh block of `size` bytes aligned to `align`, zeroed or not, as
/// `mode` places it.
pub(super) fn allocate(size: usize, align: usize, zeroed: bool, mode: Mode) -> *mut u8 {
    if size == 0 {
        return ptr::null_mut();
    }
    match size.checked_add(align + HEADER) {
        Some(total) if total >= LARGE => return allocate_large(size, total, align, zeroed),
        Some(_) => {}
        None => return ptr::null_mut(),
    }
    let capacity = match mode {
        Mode::InPlace => size.saturating_add(size.min(MAX_SLACK)),
        Mode::Default | Mode::ExactAlign | Mode::MisalignedRealloc => size,
    };
    let Some(block) = place(size, capacity, align, zeroed, mode) else {
        return ptr::null_mut();
    };
    table().insert(block);
    ANY_BLOCK.store(true, Ordering::Relaxed);
    account(block.counted, true);
    block.hand_out()
}

/// Makes `len` bytes at `p` uninitialised (what C's `realloc` leaves in the
/// part a block grows by): copies of uninitialised bytes, which Miri tracks
/// as such.
///
/// # Safety
/// `p` is valid for `len` bytes of writes.
unsafe fn forget(p: *mut u8, len: usize) {
    static UNINIT: [MaybeUninit<u8>; 1 << 16] = [MaybeUninit::uninit(); 1 << 16];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(UNINIT.len());
        // SAFETY: n bytes from the static into the caller's range.
        unsafe { ptr::copy_nonoverlapping(UNINIT.as_ptr().cast::<u8>(), p.add(done), n) };
        done += n;
    }
}

/// `MKL_realloc` in `mode`.
///
/// # Safety
/// `user` is null or a live block from this emulation.
pub(super) unsafe fn reallocate(user: *mut u8, size: usize, mode: Mode) -> *mut u8 {
    if user.is_null() {
        return allocate(size, DEFAULT_ALIGN, false, mode);
    }
    if size == 0 {
        let block = take_block(user);
        // SAFETY: taken out of the table: the caller gives the block up.
        unsafe { release(block, user) };
        return ptr::null_mut();
    }
    if mode == Mode::InPlace {
        if let Some(p) = resize_in_place(user, size) {
            return p;
        }
    }
    let block = live_block(user);
    if block.large {
        // SAFETY: the live large block at `user`.
        return unsafe { reallocate_large(user, block, size, mode) };
    }
    // A moved block keeps its alignment; in `misaligned-realloc` it gets
    // MKL's default only (and is recorded so).
    let align = match mode {
        Mode::MisalignedRealloc => DEFAULT_ALIGN,
        _ => block.align,
    };
    let new = allocate(size, align, false, mode);
    if !new.is_null() {
        let old = take_block(user);
        // SAFETY: two distinct blocks holding at least min(old, size) bytes,
        // the old one read through its allocation's own pointer; it is freed
        // once and the caller drops its pointer.
        unsafe {
            ptr::copy_nonoverlapping(old.user(), new, old.size.min(size));
            release(old, user);
        }
    }
    new
}

/// The block at `user` resized to `size` where it is, if its allocation
/// has room: its fresh pointer (the bytes it grew by uninitialised, MKL's
/// count unchanged). `None` (nothing changed) if it has not. Panics as
/// [`live_block`].
fn resize_in_place(user: *mut u8, size: usize) -> Option<*mut u8> {
    let mut table = table();
    let Ok(at) = table.find(user.addr()) else {
        drop(table);
        not_a_block(user)
    };
    let block = &mut table.entries_mut()[at];
    if size > block.capacity() {
        return None;
    }
    if size > block.size {
        // SAFETY: the bytes from the old size to the new one, inside the
        // allocation (size <= capacity).
        unsafe { forget(block.user().add(block.size), size - block.size) };
    }
    block.size = size;
    Some(block.hand_out())
}

/// `void* MKL_malloc(size_t size, int align)`.
///
/// # Safety
/// None beyond MKL's (kept for the bindings' signature).
pub unsafe fn MKL_malloc(size: usize, align: c_int) -> *mut c_void {
    allocate(size, effective_align(align), false, mode()).cast()
}

/// `void* MKL_calloc(size_t num, size_t size, int align)`: `num * size` wraps.
///
/// # Safety
/// None beyond MKL's.
pub unsafe fn MKL_calloc(num: usize, size: usize, align: c_int) -> *mut c_void {
    allocate(num.wrapping_mul(size), effective_align(align), true, mode()).cast()
}

/// `void* MKL_realloc(void *ptr, size_t size)`.
///
/// # Safety
/// `ptr` is null or a live block from this emulation.
pub unsafe fn MKL_realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller's contract, forwarded.
    unsafe { reallocate(ptr.cast(), size, mode()) }.cast()
}

/// `void MKL_free(void *ptr)`.
///
/// # Safety
/// `ptr` is null or a live block from this emulation, not used again.
pub unsafe fn MKL_free(ptr: *mut c_void) {
    let user = ptr.cast::<u8>();
    if user.is_null() {
        return;
    }
    let block = take_block(user);
    // SAFETY: taken out of the table: freed once.
    unsafe { release(block, user) };
}
