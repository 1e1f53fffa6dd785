//! MKL's service functions emulated over [`std::alloc::System`], for Miri only.
//!
//! Miri interprets Rust and cannot call into a C library, so under
//! `cfg(miri)` (and only there: `src/ffi.rs` declares the real bindings in
//! every other build, and this module is not compiled) [`ffi`](super) is
//! served by this emulation. It keeps MKL's contract as the crate relies on
//! it, so that Miri checks the crate's own code (aliasing, provenance,
//! initialisation, bounds) on top of an allocator that behaves like MKL's:
//!
//! - `MKL_malloc(size, align)`: a block aligned to `align` when `align` is a
//!   power of two, never less than 64 bytes (MKL's default alignment, also
//!   used for an `align` that is not a power of two); null for size 0 and on
//!   failure.
//! - `MKL_calloc(num, size, align)`: the same, zeroed; `num * size` wraps as
//!   in MKL, which does not check it.
//! - `MKL_realloc(ptr, size)`: keeps the block's alignment (but in
//!   `misaligned-realloc` mode, see [`mode`]) and its first `min(old, new)` bytes.
//!   It always moves a small block but in `in-place` mode (the real one
//!   moves every growth beyond the block MKL holds; always moving is the
//!   strict case for Miri: every stale pointer is caught), and resizes a
//!   large one through `i_realloc` (see [`large`]). On failure null, the
//!   old block intact. A null `ptr` is `MKL_malloc(size, 64)`; size 0 frees
//!   the block and returns null, as the C `realloc` MKL forwards to does.
//! - `MKL_free`: frees; null is a no-op.
//! - `MKL_Mem_Stat`: bytes and number of live blocks. A block counts the
//!   bytes held for it when it was allocated or last moved: its size, and
//!   for a small block in `in-place` mode the room behind it too (MKL counts what it holds,
//!   size, alignment and header, and keeps counting a block resized in
//!   place at that: its in-place growth stays within it).
//! - `MKL_Peak_Mem_Usage`: MKL's relative peak (growth since enabling, `-1`
//!   while off; reset sets the peak to the current growth).
//! - `MKL_Free_Buffers` / `MKL_Thread_Free_Buffers`: no-ops (nothing is cached).
//! - `MKL_Disable_Fast_MM`: 1 on a first call before any block was
//!   allocated, 0 afterwards (as measured with MKL 2026.2).
//! - `MKL_Set_Memory_Limit`: 0 (accepted, no effect) for `MKL_MEM_MCDRAM`,
//!   -1 for any other memory type.
//!
//! Failure: the emulated machine has [`MEMORY`] bytes in all, for MKL's
//! small blocks, the C runtime's stand-ins and the kernel's chunks (`kernel_map`,
//! which `backing::map` takes under Miri); Miri stops the program, rather
//! than returning null, when its host cannot allocate, so requests beyond
//! a fixed budget fail here first, as MKL's would on a machine that size.
//!
//! The emulation, a file for each thing it emulates:
//! - [`machine`]: the emulated machine's memory (the [`MEMORY`] budget),
//!   the kernel's maps for the backing's chunks, and the C runtime's
//!   `malloc` & co., which MKL's memory pointers point at by default.
//! - [`large`]: **large blocks, through MKL's pointers** (`i_malloc` & co.,
//!   the statics the emulation defines).
//! - [`placement`]: **exact blocks**, where a small block is placed.
//! - [`mode`]: the **modes** (`MKL_ALLOC_MIRI_MODE`): exact blocks, blocks
//!   resized in place, at exactly their alignment, moved misaligned.
//! - [`blocks`]: the live blocks, their table and **freeing**.
//! - [`malloc`]: the entry points `MKL_malloc`, `MKL_calloc`, `MKL_realloc`
//!   and `MKL_free`.
//! - [`statistics`]: `MKL_Mem_Stat`, `MKL_Peak_Mem_Usage`, and the other
//!   service calls (`MKL_Free_Buffers`, `MKL_Disable_Fast_MM`,
//!   `MKL_Set_Memory_Limit`).
//! - `tests`: the emulation's own unit tests.
#![allow(non_snake_case)]

mod blocks;
mod large;
mod machine;
mod malloc;
mod mode;
mod placement;
mod statistics;
#[cfg(test)]
mod tests;

pub(crate) use large::LARGE;
pub use large::{i_calloc, i_free, i_malloc, i_realloc};
pub use machine::MEMORY;
pub(crate) use machine::{kernel_map, kernel_unmap};
pub use malloc::{MKL_calloc, MKL_free, MKL_malloc, MKL_realloc};
pub use statistics::{
    MKL_Disable_Fast_MM, MKL_Free_Buffers, MKL_Mem_Stat, MKL_Peak_Mem_Usage, MKL_Set_Memory_Limit,
    MKL_Thread_Free_Buffers,
};

/// For the backing's tests under Miri: the start of the memory the model
/// placed the live block `user` in, and whether MKL took it from
/// `i_malloc` (a large block).
#[cfg(test)]
pub(crate) fn placement_of(user: *mut u8) -> (usize, bool) {
    let b = blocks::live_block(user);
    (b.base.addr(), b.large)
}

/// For the backing's tests under Miri: the alignment a block of `align`
/// keeps across `MKL_realloc` in the model's current mode (the
/// misaligned-realloc mode moves it to MKL's default, 64).
#[cfg(test)]
pub(crate) fn realloc_alignment(align: usize) -> usize {
    if mode::mode() == mode::Mode::MisalignedRealloc {
        malloc::DEFAULT_ALIGN
    } else {
        align
    }
}
