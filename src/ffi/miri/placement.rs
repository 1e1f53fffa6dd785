//! **Exact blocks.** Every small block is one `System` allocation of exactly `size`
//! bytes aligned to `align`: Miri therefore reports
//! any access outside the user's `size` bytes (one byte past the end, or
//! before the start). Every block aligned to 2^20 or more is large, so a
//! small block's alignment is at most 2^19, which `System` takes (it takes
//! up to 2^29). `exact-align` (see [`mode`](super::mode)) allocates until an address fits,
//! holding the misses until then so that they are not handed out again;
//! after [`PLACEMENT_TRIES`] misses (not seen in practice) it falls back to
//! one larger allocation with the block at its first fitting address, the
//! bytes around it guarded only by the provenance rule of `in-place`
//! (under Stacked Borrows).

use core::ptr;
use std::alloc::Layout;

use super::blocks::Block;
use super::machine::{SYSTEM_MAX_ALIGN, system_alloc, system_free};
use super::mode::Mode;

/// Allocations tried for a block whose address must be more than `System`
/// can be asked for (2^30, or `exact-align`'s "not twice"), before the
/// fallback. Each fits with a probability of about 1/2 (1/4 for
/// `exact-align` at 2^30).
const PLACEMENT_TRIES: usize = 32;

/// In `in-place` mode the room behind a fresh block: its own size, at most
/// this (1 MiB), so that a doubling stays in place once in two.
pub(super) const MAX_SLACK: usize = 1 << 20;

/// Whether a block aligned to `align` may start at `addr` in `mode`: a
/// multiple of `align`, and in `exact-align` (and `misaligned-realloc`) not
/// of twice it.
pub(super) fn fits(addr: usize, align: usize, mode: Mode) -> bool {
    addr % align == 0 && (!mode.exact_align() || addr % (2 * align) != 0)
}

/// A fresh block of `size` bytes (room for `capacity >= size` where it is)
/// aligned to `align` as `mode` places it, its first `size` bytes zeroed or
/// not; `None` if the budget or `System` has no room.
pub(super) fn place(
    size: usize,
    capacity: usize,
    align: usize,
    zeroed: bool,
    mode: Mode,
) -> Option<Block> {
    let layout = Layout::from_size_align(capacity, align.min(SYSTEM_MAX_ALIGN)).ok()?;
    // With room behind, only the user's part is zeroed (the room is what a
    // growth adds, uninitialised).
    let zero_all = zeroed && capacity == size;
    // Misses are held until a placement fits, so that `System` does not
    // hand the same address out again.
    let mut missed = [ptr::null_mut::<u8>(); PLACEMENT_TRIES];
    let mut placed = None;
    for slot in &mut missed {
        let Some(base) = system_alloc(layout, zero_all) else {
            break;
        };
        if fits(base.addr(), align, mode) {
            placed = Some(base);
            break;
        }
        *slot = base;
    }
    let all_missed = !missed[PLACEMENT_TRIES - 1].is_null();
    for &p in missed.iter().filter(|p| !p.is_null()) {
        // SAFETY: allocated above with `layout`, never handed out.
        unsafe { system_free(p, layout) };
    }
    let (base, outer, pad) = match placed {
        Some(base) => (base, layout, 0),
        None if all_missed => padded(capacity, align, zero_all, mode)?,
        None => return None, // no room
    };
    let block = Block {
        base,
        outer,
        pad,
        size,
        align,
        counted: capacity,
        large: false,
    };
    if zeroed && !zero_all {
        // SAFETY: the user's `size` bytes, inside the allocation.
        unsafe { block.user().write_bytes(0, size) };
    }
    Some(block)
}

/// The fallback placement: one allocation with room to start the user's
/// part at a fitting address, `pad` bytes in (the block is then not
/// [`exact`](Block::exact): the bytes around it are guarded by the
/// provenance of the pointer handed out).
pub(super) fn padded(
    capacity: usize,
    align: usize,
    zeroed: bool,
    mode: Mode,
) -> Option<(*mut u8, Layout, usize)> {
    let sys_align = align.min(SYSTEM_MAX_ALIGN);
    // Fitting addresses are `want` modulo `period`, and multiples of
    // sys_align (as `want` and `period` are), so the first one from the
    // base is at most `period - sys_align` bytes in.
    let (period, want) = if mode.exact_align() {
        (2 * align, align)
    } else {
        (align, 0)
    };
    let size = capacity.checked_add(period - sys_align)?;
    let layout = Layout::from_size_align(size, sys_align).ok()?;
    let base = system_alloc(layout, zeroed)?;
    let pad = (want + period - base.addr() % period) % period;
    Some((base, layout, pad))
}
