//! **Large blocks, through MKL's pointers.** MKL takes its memory through
//! four pointers, `i_malloc`, `i_calloc`, `i_realloc` and `i_free` (see
//! `backing`), which the emulation defines (the statics below), defaulting
//! to stand-ins for the C runtime's functions (`c_malloc` & co., over the
//! emulated machine's memory: 16-aligned, a size header in front); the
//! crate's setup points them at the backing's hooks, as in the real build.
//! A block whose request with MKL's overhead, `size + align + 24` (`align`
//! being the block's, at least 64, and 24 MKL's header), is at least
//! [`LARGE`] (1 MiB, the backing's `MIN_CHUNK`) is **large** and takes
//! that path exactly as MKL does: `i_malloc(size + align + 24)`, the block
//! at the first multiple of `align` at or after the memory's start + 24 (a
//! chunk of the backing's is 2 MiB-aligned: the block is `align` bytes in,
//! up to 1 MiB); `MKL_calloc` is `i_malloc` and then zeros written (MKL's
//! never calls `i_calloc`); `MKL_realloc` is `i_realloc(memory, size +
//! align + 24)`, the block at the same offset in the memory it returns
//! (always aligned for a chunk; for other memory, such as the stand-ins',
//! the contents move within it to the first aligned address, as the
//! measured MKL keeps the alignment); `MKL_free` is `i_free(memory)`. The
//! pointers are read at each call, so a block allocated before the setup
//! is freed and resized through the hooks after it (they give it to the
//! previous functions). A large block stays large whatever it is resized
//! to; a small one growing past the floor moves into a large one. The
//! pointer handed out covers the block's `size` bytes only (as in
//! `in-place`, see [`mode`](super::mode)): under Stacked Borrows an access past the block, into
//! the rest of its chunk, is reported.

use core::ptr;
use core::sync::atomic::Ordering;
use std::alloc::Layout;

use super::blocks::{Block, table};
use super::machine::{c_calloc, c_free, c_malloc, c_realloc};
use super::malloc::DEFAULT_ALIGN;
use super::mode::Mode;
use super::statistics::{ANY_BLOCK, account};
use crate::ffi::{ICalloc, IFree, IMalloc, IRealloc};

/// A block whose request with MKL's overhead is at least this (1 MiB) is
/// large: MKL's model takes it through `i_malloc`, where the backing
/// serves requests of `backing::MIN_CHUNK` and more with chunks (the
/// backing checks that the two agree).
pub(crate) const LARGE: usize = 1 << 20;
/// MKL's header in front of a block it places in memory from `i_malloc`.
pub(super) const HEADER: usize = 24;

// MKL's memory pointers (see src/ffi.rs), which the emulation takes its
// large blocks through, as MKL takes all of its: the C runtime's
// functions by default, here the stand-ins in machine.rs; the crate's setup points
// them at the backing's hooks (`backing::install`). Read at each large
// call, so that blocks from before the setup are freed and resized through
// the hooks after it, as in a process where MKL ran first.

/// MKL's `malloc`.
#[allow(non_upper_case_globals)]
pub static mut i_malloc: Option<IMalloc> = Some(c_malloc);
/// MKL's `calloc` (MKL's `MKL_calloc` does not call it, nor does the
/// emulation: it is here for the backing to chain to).
#[allow(non_upper_case_globals)]
pub static mut i_calloc: Option<ICalloc> = Some(c_calloc);
/// MKL's `realloc`.
#[allow(non_upper_case_globals)]
pub static mut i_realloc: Option<IRealloc> = Some(c_realloc);
/// MKL's `free`.
#[allow(non_upper_case_globals)]
pub static mut i_free: Option<IFree> = Some(c_free);

/// A fresh block of `size` bytes aligned to `align` in memory from
/// `i_malloc`, as MKL places it: `i_malloc(total)` (`total` being `size +
/// align + HEADER`), the block at the first multiple of `align` at or after
/// its header (for a chunk of the backing's, 2 MiB-aligned, `align` bytes
/// in up to 1 MiB); `MKL_calloc` writes its zeros, as MKL's does. The mode
/// does not place it: the memory `i_malloc` returns does.
pub(super) fn allocate_large(size: usize, total: usize, align: usize, zeroed: bool) -> *mut u8 {
    let Ok(outer) = Layout::from_size_align(total, 1) else {
        return ptr::null_mut();
    };
    // SAFETY: a copy of the pointer (see the statics: MKL's pointers are
    // set by the crate's setup, before the setting thread calls MKL), a
    // malloc-compatible function.
    let base = unsafe { i_malloc.unwrap_or(c_malloc)(total) }.cast::<u8>();
    if base.is_null() {
        return base;
    }
    let pad = (base.addr() + HEADER).next_multiple_of(align) - base.addr();
    let block = Block {
        base,
        outer,
        pad,
        size,
        align,
        counted: size,
        large: true,
    };
    if zeroed {
        // SAFETY: the user's `size` bytes, inside the `total` bytes from
        // i_malloc (pad <= HEADER + align - 1, so pad + size < total).
        unsafe { block.user().write_bytes(0, size) };
    }
    table().insert(block);
    ANY_BLOCK.store(true, Ordering::Relaxed);
    account(block.counted, true);
    block.hand_out()
}

/// `MKL_realloc` of a large block, as MKL's: `i_realloc` of its memory for
/// `size` and the same overhead; the block keeps its offset in the memory
/// where that keeps its alignment (always for a chunk of the backing's up
/// to 2 MiB), else its contents move within the memory to the first address
/// that has it (as the measured MKL keeps every block's alignment); in
/// `misaligned-realloc` to the first address aligned to exactly 64 (for a
/// block aligned above 64; recorded so). Null on failure, the block intact.
///
/// # Safety
/// `user` is the live large block `old`.
pub(super) unsafe fn reallocate_large(
    user: *mut u8,
    old: Block,
    size: usize,
    mode: Mode,
) -> *mut u8 {
    let Some(outer) = size
        .checked_add(old.align + HEADER)
        .and_then(|total| Layout::from_size_align(total, 1).ok())
    else {
        return ptr::null_mut();
    };
    // SAFETY: a copy of the pointer (see allocate_large), called with the
    // memory `i_malloc` or `i_realloc` gave the block: realloc's contract.
    let base =
        unsafe { i_realloc.unwrap_or(c_realloc)(old.base.cast(), outer.size()) }.cast::<u8>();
    if base.is_null() {
        return base;
    }
    let (align, exactly) = match mode {
        Mode::MisalignedRealloc => (DEFAULT_ALIGN, old.align > DEFAULT_ALIGN),
        _ => (old.align, false),
    };
    let fits_at = |pad: usize| {
        let a = base.addr() + pad;
        a % align == 0 && !(exactly && a % (2 * align) == 0)
    };
    let pad = if fits_at(old.pad) {
        old.pad
    } else {
        let first = (base.addr() + HEADER).next_multiple_of(align);
        let first = if fits_at(first - base.addr()) {
            first
        } else {
            first + align
        };
        first - base.addr()
    };
    let kept = old.size.min(size);
    debug_assert!(pad + size <= outer.size() && old.pad + kept <= outer.size());
    if pad != old.pad {
        // SAFETY: both ranges lie in the `outer.size()` bytes from
        // i_realloc (pad <= align + HEADER - 1, or below 2 * 64 + HEADER for
        // an `exactly` block aligned to 128 or more), which kept the old
        // memory's contents up to old.pad + kept.
        unsafe { ptr::copy(base.add(old.pad), base.add(pad), kept) };
    }
    let block = Block {
        base,
        outer,
        pad,
        size,
        align,
        counted: size,
        large: true,
    };
    {
        let mut table = table();
        table.remove(user.addr());
        table.insert(block);
    }
    account(old.counted, false);
    account(block.counted, true);
    block.hand_out()
}
