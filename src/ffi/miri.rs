//! MKL's service functions emulated over [`std::alloc::System`], for Miri only.
//!
//! Miri interprets Rust and cannot call into a C library, so under
//! `cfg(miri)` (and only there: `src/ffi.rs` declares the real bindings in
//! every other build, and this file is not compiled) [`ffi`](super) is
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
//!   `misaligned-realloc` mode, below) and its first `min(old, new)` bytes.
//!   It always moves a small block but in `in-place` mode (the real one
//!   moves every growth beyond the block MKL holds; always moving is the
//!   strict case for Miri: every stale pointer is caught), and resizes a
//!   large one through `i_realloc` (below). On failure null, the
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
//! **Large blocks, through MKL's pointers.** MKL takes its memory through
//! four pointers, `i_malloc`, `i_calloc`, `i_realloc` and `i_free` (see
//! `backing`), which the emulation defines (the statics below), defaulting
//! to stand-ins for the C runtime's functions (`c_malloc` & co., over the
//! emulated machine's memory: 16-aligned, a size header in front); the
//! crate's setup points them at the backing's hooks, as in the real build.
//! A block whose request with MKL's overhead, `size + align + 24` (`align`
//! being the block's, at least 64, and 24 MKL's header), is at least
//! [`MIN_CHUNK`](crate::backing::MIN_CHUNK) (1 MiB) is **large** and takes
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
//! `in-place` below): under Stacked Borrows an access past the block, into
//! the rest of its chunk, is reported.
//!
//! **Exact blocks.** Every small block is one `System` allocation of exactly `size`
//! bytes aligned to `align`: Miri therefore reports
//! any access outside the user's `size` bytes (one byte past the end, or
//! before the start). Every block aligned to 2^20 or more is large, so a
//! small block's alignment is at most 2^19, which `System` takes (it takes
//! up to 2^29). `exact-align` (below) allocates until an address fits,
//! holding the misses until then so that they are not handed out again;
//! after [`PLACEMENT_TRIES`] misses (not seen in practice) it falls back to
//! one larger allocation with the block at its first fitting address, the
//! bytes around it guarded only by the provenance rule of `in-place` below
//! (under Stacked Borrows).
//!
//! **Modes.** The environment variable `MKL_ALLOC_MIRI_MODE`, read once (with
//! libc's `getenv`, which does not allocate: the emulation may be serving a
//! `#[global_allocator]`), chooses how blocks are placed and resized, so that
//! Miri also walks the crate's branches that the default never takes. Miri
//! passes it to the program only with `-Zmiri-env-forward=MKL_ALLOC_MIRI_MODE`
//! (scripts/miri.sh does). Any other value aborts.
//!
//! | `MKL_ALLOC_MIRI_MODE` | `MKL_malloc` / `MKL_calloc` | `MKL_realloc` |
//! |---|---|---|
//! | unset, empty, `default` | exact blocks | always moves |
//! | `in-place` | `size` bytes handed out, with room behind them (below) | in place whenever the room allows: every shrink, and growth up to the room; else moves |
//! | `exact-align` | exact blocks at an address that is a multiple of the alignment and *not* of twice it | always moves, to an address aligned exactly to the block's alignment |
//! | `misaligned-realloc` | as `exact-align` | always moves, to an address aligned exactly to 64 whatever the block's alignment |
//!
//! For large blocks the memory `i_malloc` returns places them, in every
//! mode (in a chunk, up to 1 MiB, that is exactly the alignment, never
//! twice it). Their resizes: in the default mode and `exact-align`, every
//! `MKL_realloc` is an `i_realloc` (the strict case: the hooks' shrinks
//! run too, which MKL itself, keeping a shrunk block whole, never asks
//! for); in `in-place`, MKL's measured rule: a shrink, or a growth within
//! what MKL asked `i_malloc` for, stays without a call, anything else is
//! an `i_realloc`; in `misaligned-realloc`, an `i_realloc` after which a
//! block aligned above 64 is moved, within its memory, to the first address
//! aligned to exactly 64.
//!
//! `in-place` follows MKL (which keeps a shrunk block whole and grows it in
//! place while the new size fits what it holds), so that the crate's
//! "resized in place" branches run (`RawBuf`'s growth keeping its pointer
//! and its count). Growth in place needs room the caller may not touch, and
//! Miri bounds accesses by allocations, not by what the emulation said: a
//! fresh block is allocated with room for its size again (at most
//! [`MAX_SLACK`]) behind it. What keeps overruns visible anyway:
//! - the caller never gets the allocation's own pointer, but one made from a
//!   reference to the block's current `size` bytes (fresh at every resize).
//!   Under Stacked Borrows its provenance covers those bytes only, so an
//!   access past the block's size (into the room, or into the part a shrink
//!   gave up) is reported as a tag missing from the borrow stack, and a
//!   pointer kept from before the resize is invalid. Tree Borrows bounds a
//!   pointer by its allocation only: there an overrun into the room goes
//!   unseen (the default mode, under both models, sees it). So scripts/miri.sh
//!   runs this mode under Stacked Borrows.
//! - the bytes a growth in place adds are made uninitialised again (as C's
//!   `realloc` leaves them), so reading them before writing is reported.
//!
//! `exact-align` takes away accidental extra alignment (`System`, like
//! glibc, often returns addresses aligned to more than asked): a code path
//! that works only because a 64-aligned block happened to be 128-aligned
//! fails here. Blocks stay exact: the emulation allocates at the alignment
//! and retries while the address is also aligned to twice it (about every
//! second address is not).
//!
//! `misaligned-realloc` breaks MKL's contract on purpose: the measured MKL
//! keeps a block's alignment across `MKL_realloc` (see `raw_realloc` in
//! src/allocator.rs), but `MKL_realloc` takes no alignment, and the crate
//! does not rely on it: a block that comes back misaligned is moved into an
//! aligned one (`realign`). Here every block `MKL_realloc` moves comes back
//! at MKL's default alignment only (64, not 128), so that Miri walks that
//! path for every alignment above 64.
//!
//! **Freeing.** Unlike MKL, which keeps a header in front of the block, the
//! emulation records each live block in a table keyed by address, holding
//! the allocation's own pointer: the pointer a caller frees may carry a
//! narrower provenance (a `Box`'s covers its value only), through which
//! Rust code may not read a header. An exact block is freed through the
//! caller's pointer (a `Box` being dropped protects its pointer's tag, and
//! Miri lets only that tag's own deallocation through); any other (room
//! behind in `in-place`, bytes in front after the rare fallback) through the
//! allocation's own pointer, which Miri refuses while a `Box` of the block is
//! being dropped: std's `Box` over this emulation (the emulation as
//! `#[global_allocator]`) is for every mode but `in-place`, and for small
//! blocks (a large one is freed through `i_free` with its memory's pointer).
//! Freeing or reallocating an address that is not a live block panics. Any
//! size, alignment, order of frees and thread is served; the counters are
//! atomics.
#![allow(non_snake_case)]

use core::ffi::{CStr, c_int, c_void};
use core::mem::MaybeUninit;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicUsize, Ordering};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::{Mutex, MutexGuard};

use super::{
    ICalloc, IFree, IMalloc, IRealloc, MKL_MEM_MCDRAM, MKL_PEAK_MEM, MKL_PEAK_MEM_DISABLE,
    MKL_PEAK_MEM_ENABLE, MKL_PEAK_MEM_RESET,
};
use crate::backing::MIN_CHUNK;

/// The memory the emulated MKL may hold at once: 16 GiB (blocks, the room
/// behind them in `in-place` mode, and placements being retried). Larger
/// requests get null, as from a real MKL on a machine that size.
pub const MEMORY: usize = 16 << 30;

/// MKL's default (and minimum) alignment.
const DEFAULT_ALIGN: usize = 64;

/// MKL's header in front of a block it places in memory from `i_malloc`.
const HEADER: usize = 24;

/// The header of the C runtime's stand-ins (their blocks' size), which
/// also keeps their blocks 16-aligned, as glibc's are.
const C_HEADER: usize = 16;

/// The largest alignment `System` takes under Miri (rustc's largest
/// alignment; Miri stops with an internal error beyond it).
const SYSTEM_MAX_ALIGN: usize = 1 << 29;

/// Allocations tried for a block whose address must be more than `System`
/// can be asked for (2^30, or `exact-align`'s "not twice"), before the
/// fallback. Each fits with a probability of about 1/2 (1/4 for
/// `exact-align` at 2^30).
const PLACEMENT_TRIES: usize = 32;

/// In `in-place` mode the room behind a fresh block: its own size, at most
/// this (1 MiB), so that a doubling stays in place once in two.
const MAX_SLACK: usize = 1 << 20;

/// Bytes MKL holds for live blocks (as counted) and how many.
static BYTES: AtomicI64 = AtomicI64::new(0);
static BUFFERS: AtomicI64 = AtomicI64::new(0);
/// Everything `System` holds for the emulation (for the [`MEMORY`] budget).
static RESERVED: AtomicUsize = AtomicUsize::new(0);
/// Peak tracking: on/off, growth since enabling, highest growth.
static TRACKING: AtomicBool = AtomicBool::new(false);
static GROWTH: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);
/// `MKL_Disable_Fast_MM`'s answer depends on these.
static ANY_BLOCK: AtomicBool = AtomicBool::new(false);
static FAST_MM_OFF: AtomicBool = AtomicBool::new(false);

/// How blocks are placed and resized (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Default,
    InPlace,
    ExactAlign,
    MisalignedRealloc,
}

/// The variable that chooses the [`Mode`].
const MODE_VAR: &CStr = c"MKL_ALLOC_MIRI_MODE";

/// The mode once read: 0 before, else its index in [`Mode::ALL`] plus one.
static MODE: AtomicU8 = AtomicU8::new(0);

impl Mode {
    const ALL: [Mode; 4] = [
        Mode::Default,
        Mode::InPlace,
        Mode::ExactAlign,
        Mode::MisalignedRealloc,
    ];

    /// The mode a value of [`MODE_VAR`] names (`None`: unset); `None` if
    /// it names none.
    fn parse(value: Option<&[u8]>) -> Option<Mode> {
        match value {
            None | Some(b"" | b"default") => Some(Mode::Default),
            Some(b"in-place") => Some(Mode::InPlace),
            Some(b"exact-align") => Some(Mode::ExactAlign),
            Some(b"misaligned-realloc") => Some(Mode::MisalignedRealloc),
            Some(_) => None,
        }
    }

    /// Whether blocks are placed at exactly their alignment.
    fn exact_align(self) -> bool {
        matches!(self, Mode::ExactAlign | Mode::MisalignedRealloc)
    }
}

/// The mode [`MODE_VAR`] chooses, read at the first call; aborts on a value
/// that names no mode.
fn mode() -> Mode {
    if let Some(i) = MODE.load(Ordering::Relaxed).checked_sub(1) {
        return Mode::ALL[usize::from(i)];
    }
    // SAFETY: a NUL-terminated name; getenv returns null or a NUL-terminated
    // string, read at once (the tests under Miri set no variables).
    let value = unsafe {
        let v = libc::getenv(MODE_VAR.as_ptr());
        (!v.is_null()).then(|| CStr::from_ptr(v).to_bytes())
    };
    let Some(m) = Mode::parse(value) else {
        const MSG: &[u8] =
            b"MKL emulation (Miri): MKL_ALLOC_MIRI_MODE is default, in-place, exact-align or misaligned-realloc\n";
        // SAFETY: writes a static buffer to stderr (no allocation: this may
        // be the global allocator).
        unsafe { libc::write(2, MSG.as_ptr().cast::<c_void>(), MSG.len()) };
        std::process::abort();
    };
    let i = Mode::ALL.iter().position(|&x| x == m).expect("one of ALL");
    MODE.store(i as u8 + 1, Ordering::Relaxed);
    m
}

/// The alignment a block gets for a requested `align`.
fn effective_align(align: c_int) -> usize {
    match usize::try_from(align) {
        Ok(a) if a.is_power_of_two() => a.max(DEFAULT_ALIGN),
        _ => DEFAULT_ALIGN,
    }
}

/// Whether a block aligned to `align` may start at `addr` in `mode`: a
/// multiple of `align`, and in `exact-align` (and `misaligned-realloc`) not
/// of twice it.
fn fits(addr: usize, align: usize, mode: Mode) -> bool {
    addr % align == 0 && (!mode.exact_align() || addr % (2 * align) != 0)
}

/// Counts `size` bytes more (or fewer) in MKL's statistics.
fn account(size: usize, grow: bool) {
    let (delta, blocks) = if grow {
        (size as i64, 1)
    } else {
        (-(size as i64), -1)
    };
    BYTES.fetch_add(delta, Ordering::Relaxed);
    BUFFERS.fetch_add(blocks, Ordering::Relaxed);
    if TRACKING.load(Ordering::Relaxed) {
        let now = GROWTH.fetch_add(delta, Ordering::Relaxed) + delta;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

/// Takes `bytes` from the budget; false (nothing taken) if it is exhausted.
fn reserve(bytes: usize) -> bool {
    RESERVED
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            held.checked_add(bytes).filter(|&total| total <= MEMORY)
        })
        .is_ok()
}

/// One `System` allocation of `layout` (non-zero size) within the budget,
/// zeroed or not; `None` if the budget or `System` has no room.
fn system_alloc(layout: Layout, zeroed: bool) -> Option<*mut u8> {
    if !reserve(layout.size()) {
        return None;
    }
    // SAFETY: a non-zero size (the caller's), an alignment Miri takes.
    let p = unsafe {
        if zeroed {
            System.alloc_zeroed(layout)
        } else {
            System.alloc(layout)
        }
    };
    if p.is_null() {
        RESERVED.fetch_sub(layout.size(), Ordering::Relaxed);
        return None;
    }
    Some(p)
}

/// Frees what [`system_alloc`] returned, through `via` (a pointer to its
/// start whose provenance may free it), and gives the bytes back to the
/// budget.
///
/// # Safety
/// `via` points at the start of a live allocation of `layout` from
/// [`system_alloc`], not used again.
unsafe fn system_free(via: *mut u8, layout: Layout) {
    // SAFETY: the caller's contract.
    unsafe { System.dealloc(via, layout) };
    RESERVED.fetch_sub(layout.size(), Ordering::Relaxed);
}

// MKL's memory pointers (see src/ffi.rs), which the emulation takes its
// large blocks through, as MKL takes all of its: the C runtime's
// functions by default, here the stand-ins below; the crate's setup points
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

/// The C runtime's `malloc` (or `calloc`: `zeroed`), in the emulated
/// machine's memory: 16-aligned, uninitialised, the allocation's size in a
/// header in front; null when the memory is exhausted.
fn c_alloc(n: usize, zeroed: bool) -> *mut c_void {
    let Some(layout) = n
        .checked_add(C_HEADER)
        .and_then(|total| Layout::from_size_align(total, C_HEADER).ok())
    else {
        return ptr::null_mut();
    };
    let Some(base) = system_alloc(layout, zeroed) else {
        return ptr::null_mut();
    };
    // SAFETY: the allocation holds C_HEADER + n bytes, 16-aligned: the
    // header is a usize at its start, the block follows.
    unsafe {
        base.cast::<usize>().write(layout.size());
        base.add(C_HEADER).cast()
    }
}

/// The layout of the stand-ins' allocation behind the block `p`, and its
/// start.
///
/// # Safety
/// `p` is a live block of [`c_alloc`] (its pointer, with the
/// allocation's provenance).
unsafe fn c_block(p: *mut c_void) -> (*mut u8, Layout) {
    // SAFETY: the caller's contract: the header is C_HEADER bytes before
    // `p`, in the same allocation, written by c_alloc.
    unsafe {
        let base = p.cast::<u8>().sub(C_HEADER);
        let total = base.cast::<usize>().read();
        (base, Layout::from_size_align_unchecked(total, C_HEADER))
    }
}

/// `malloc`: the stand-in [`i_malloc`] points at by default.
unsafe extern "C" fn c_malloc(n: usize) -> *mut c_void {
    c_alloc(n, false)
}

/// `calloc`.
unsafe extern "C" fn c_calloc(num: usize, size: usize) -> *mut c_void {
    num.checked_mul(size)
        .map_or(ptr::null_mut(), |n| c_alloc(n, true))
}

/// `free`.
///
/// # Safety
/// `p` is null or a live block of the stand-ins, not used again.
unsafe extern "C" fn c_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: the caller's contract; the allocation is freed once.
    unsafe {
        let (base, layout) = c_block(p);
        system_free(base, layout);
    }
}

/// `realloc`: always moves (the strict case); null on failure, the block
/// then intact; size 0 frees and returns null, as glibc's.
///
/// # Safety
/// `p` is null or a live block of the stand-ins.
unsafe extern "C" fn c_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        return c_alloc(n, false);
    }
    // SAFETY: the caller's contract.
    let (_, old) = unsafe { c_block(p) };
    if n == 0 {
        // SAFETY: as in c_free.
        unsafe { c_free(p) };
        return ptr::null_mut();
    }
    let q = c_alloc(n, false);
    if !q.is_null() {
        // SAFETY: distinct live blocks of at least min(old, n) bytes; the
        // old one is freed once, after the copy.
        unsafe {
            ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast(), (old.size() - C_HEADER).min(n));
            c_free(p);
        }
    }
    q
}

/// The kernel's memory for the crate's chunks under Miri (`backing::map`):
/// one zeroed allocation of `layout` from the emulated machine's memory
/// (the [`MEMORY`] budget), or null.
pub(crate) fn kernel_map(layout: Layout) -> *mut u8 {
    if layout.size() == 0 {
        return ptr::null_mut();
    }
    system_alloc(layout, true).unwrap_or(ptr::null_mut())
}

/// Gives back what [`kernel_map`] returned.
///
/// # Safety
/// `p` is a live allocation of `kernel_map` made with `layout` (its
/// pointer), not used again.
pub(crate) unsafe fn kernel_unmap(p: *mut u8, layout: Layout) {
    // SAFETY: the caller's contract.
    unsafe { system_free(p, layout) };
}

/// A live block: the allocation (its own pointer, with full provenance,
/// and its layout), where in it the user's part starts, the user's size and
/// alignment, and what MKL's statistics count for it. A `large` block lives
/// in memory from `i_malloc` instead: `base` is what `i_malloc` (or
/// `i_realloc`) returned, `outer`'s size what was asked of it.
#[derive(Clone, Copy, Debug)]
struct Block {
    base: *mut u8,
    outer: Layout,
    pad: usize,
    size: usize,
    align: usize,
    counted: usize,
    large: bool,
}

impl Block {
    fn user_addr(&self) -> usize {
        self.base.addr() + self.pad
    }

    /// The user's part, with the allocation's provenance.
    fn user(&self) -> *mut u8 {
        // SAFETY: pad < outer.size(): inside the allocation (see `place`).
        unsafe { self.base.add(self.pad) }
    }

    /// The bytes the block may grow to where it is.
    fn capacity(&self) -> usize {
        self.outer.size() - self.pad
    }

    /// Whether the user's part is the whole allocation.
    fn exact(&self) -> bool {
        !self.large && self.pad == 0 && self.outer.size() == self.size
    }

    /// The pointer the caller gets: for an exact block the allocation's own;
    /// otherwise one made from a reference to the user's `size` bytes, whose
    /// provenance (under Stacked Borrows) covers those only (see the module
    /// docs). Making it invalidates every pointer made before for the block.
    fn hand_out(&self) -> *mut u8 {
        if self.exact() {
            return self.user();
        }
        // SAFETY: `size` bytes inside the allocation, which only the caller
        // (getting this pointer, and giving up any older one) may use.
        let part = unsafe {
            core::slice::from_raw_parts_mut(self.user().cast::<MaybeUninit<u8>>(), self.size)
        };
        ptr::from_mut(part).cast()
    }
}

/// A fresh block of `size` bytes (room for `capacity >= size` where it is)
/// aligned to `align` as `mode` places it, its first `size` bytes zeroed or
/// not; `None` if the budget or `System` has no room.
fn place(size: usize, capacity: usize, align: usize, zeroed: bool, mode: Mode) -> Option<Block> {
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
fn padded(
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

/// A fresh block of `size` bytes aligned to `align`, zeroed or not, as
/// `mode` places it.
fn allocate(size: usize, align: usize, zeroed: bool, mode: Mode) -> *mut u8 {
    if size == 0 {
        return ptr::null_mut();
    }
    match size.checked_add(align + HEADER) {
        Some(total) if total >= MIN_CHUNK => return allocate_large(size, total, align, zeroed),
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

/// A fresh block of `size` bytes aligned to `align` in memory from
/// `i_malloc`, as MKL places it: `i_malloc(total)` (`total` being `size +
/// align + HEADER`), the block at the first multiple of `align` at or after
/// its header (for a chunk of the backing's, 2 MiB-aligned, `align` bytes
/// in up to 1 MiB); `MKL_calloc` writes its zeros, as MKL's does. The mode
/// does not place it: the memory `i_malloc` returns does.
fn allocate_large(size: usize, total: usize, align: usize, zeroed: bool) -> *mut u8 {
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
unsafe fn reallocate_large(user: *mut u8, old: Block, size: usize, mode: Mode) -> *mut u8 {
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
unsafe fn reallocate(user: *mut u8, size: usize, mode: Mode) -> *mut u8 {
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

/// The live blocks, sorted by user address, in memory from `System` (so
/// that the emulation also serves a `#[global_allocator]` without
/// recursion). std's `Mutex` does not allocate.
struct Table {
    ptr: *mut Block,
    len: usize,
    cap: usize,
}

// SAFETY: the table owns its array; the pointers it holds are addresses of
// blocks, used only by the thread holding the lock.
unsafe impl Send for Table {}

static TABLE: Mutex<Table> = Mutex::new(Table {
    ptr: ptr::null_mut(),
    len: 0,
    cap: 0,
});

fn table() -> MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Table {
    fn entries(&self) -> &[Block] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: `len` initialised entries at `ptr`.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn entries_mut(&mut self) -> &mut [Block] {
        if self.ptr.is_null() {
            return &mut [];
        }
        // SAFETY: `len` initialised entries at `ptr`, borrowed with the table.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn find(&self, addr: usize) -> Result<usize, usize> {
        self.entries().binary_search_by_key(&addr, Block::user_addr)
    }

    fn insert(&mut self, block: Block) {
        let at = match self.find(block.user_addr()) {
            Err(at) => at,
            Ok(_) => panic!("MKL emulation (Miri): address handed out twice"),
        };
        if self.len == self.cap {
            let cap = (self.cap * 2).max(64);
            let layout = Layout::array::<Block>(cap).expect("a small table");
            // SAFETY: a non-zero layout; the old array (if any) is copied
            // and freed with the layout it was made with.
            unsafe {
                let new = System.alloc(layout).cast::<Block>();
                assert!(
                    !new.is_null(),
                    "MKL emulation (Miri): no memory for the block table"
                );
                if !self.ptr.is_null() {
                    ptr::copy_nonoverlapping(self.ptr, new, self.len);
                    let old = Layout::array::<Block>(self.cap).expect("a small table");
                    System.dealloc(self.ptr.cast(), old);
                }
                self.ptr = new;
            }
            self.cap = cap;
        }
        // SAFETY: at <= len < cap: shift the tail up one, write the entry.
        unsafe {
            ptr::copy(self.ptr.add(at), self.ptr.add(at + 1), self.len - at);
            self.ptr.add(at).write(block);
        }
        self.len += 1;
    }

    fn get(&self, addr: usize) -> Option<Block> {
        self.find(addr).ok().map(|i| self.entries()[i])
    }

    fn remove(&mut self, addr: usize) -> Option<Block> {
        let at = self.find(addr).ok()?;
        let block = self.entries()[at];
        // SAFETY: at < len: shift the tail down one.
        unsafe { ptr::copy(self.ptr.add(at + 1), self.ptr.add(at), self.len - at - 1) };
        self.len -= 1;
        Some(block)
    }
}

/// The live block at `user`; panics if there is none (a double free or a
/// foreign pointer).
fn live_block(user: *mut u8) -> Block {
    table()
        .get(user.addr())
        .unwrap_or_else(|| not_a_block(user))
}

/// Takes the live block at `user` out of the table (it is then the caller's
/// to release); panics as [`live_block`].
fn take_block(user: *mut u8) -> Block {
    table()
        .remove(user.addr())
        .unwrap_or_else(|| not_a_block(user))
}

fn not_a_block(user: *mut u8) -> ! {
    panic!("MKL emulation (Miri): {user:p} is not a live MKL block (double free?)")
}

/// Frees a live block (taken out of the table by the caller): an exact one
/// through `via`, the caller's pointer to it (a `Box` being dropped protects
/// its pointer's tag, and Miri lets only that tag's own deallocation
/// through; MKL, in C, is outside the model), any other through the
/// allocation's own pointer (see the module docs).
///
/// # Safety
/// `block` was live until the caller removed it; `via` points at its user
/// part; not used again.
unsafe fn release(block: Block, via: *mut u8) {
    if block.large {
        // SAFETY: a copy of the pointer (see allocate_large), given the
        // memory from i_malloc or i_realloc, freed once.
        unsafe { i_free.unwrap_or(c_free)(block.base.cast()) };
        account(block.counted, false);
        return;
    }
    let start = if block.exact() { via } else { block.base };
    // SAFETY: the allocation's start, and the layout it was made with.
    unsafe { system_free(start, block.outer) };
    account(block.counted, false);
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

/// `MKL_INT64 MKL_Mem_Stat(int* nbuffers)`.
///
/// # Safety
/// `nbuffers` is valid for one write.
pub unsafe fn MKL_Mem_Stat(nbuffers: *mut c_int) -> i64 {
    let buffers = BUFFERS.load(Ordering::Relaxed);
    // SAFETY: the caller's contract.
    unsafe { nbuffers.write(buffers.clamp(0, c_int::MAX as i64) as c_int) };
    BYTES.load(Ordering::Relaxed)
}

/// `MKL_INT64 MKL_Peak_Mem_Usage(int reset)`.
///
/// # Safety
/// None.
pub unsafe fn MKL_Peak_Mem_Usage(reset: c_int) -> i64 {
    match reset {
        MKL_PEAK_MEM_ENABLE => {
            GROWTH.store(0, Ordering::Relaxed);
            PEAK.store(0, Ordering::Relaxed);
            TRACKING.store(true, Ordering::Relaxed);
            0
        }
        MKL_PEAK_MEM_DISABLE => {
            TRACKING.store(false, Ordering::Relaxed);
            0
        }
        _ if !TRACKING.load(Ordering::Relaxed) => -1,
        MKL_PEAK_MEM => PEAK.load(Ordering::Relaxed),
        MKL_PEAK_MEM_RESET => PEAK.swap(GROWTH.load(Ordering::Relaxed), Ordering::Relaxed),
        _ => -1,
    }
}

/// `void MKL_Free_Buffers(void)`: nothing is cached, nothing to do.
///
/// # Safety
/// None.
pub unsafe fn MKL_Free_Buffers() {}

/// `void MKL_Thread_Free_Buffers(void)`: nothing is cached, nothing to do.
///
/// # Safety
/// None.
pub unsafe fn MKL_Thread_Free_Buffers() {}

/// `int MKL_Disable_Fast_MM(void)`: 1 only for a first call before any block.
///
/// # Safety
/// None.
pub unsafe fn MKL_Disable_Fast_MM() -> c_int {
    let first = !ANY_BLOCK.load(Ordering::Relaxed) && !FAST_MM_OFF.swap(true, Ordering::Relaxed);
    c_int::from(first)
}

/// `int MKL_Set_Memory_Limit(int mem_type, size_t limit)`: accepted for MCDRAM.
///
/// # Safety
/// None.
pub unsafe fn MKL_Set_Memory_Limit(mem_type: c_int, _limit: usize) -> c_int {
    if mem_type == MKL_MEM_MCDRAM { 0 } else { -1 }
}

/// The emulation keeps the contract the crate relies on (each property
/// measured on the real MKL elsewhere: tests/binding.rs, tests/manager.rs,
/// tests/fast_mm.rs and the realloc notes in src/allocator.rs).
#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> (i64, c_int) {
        let mut n = 0;
        // SAFETY: a valid out-pointer.
        let bytes = unsafe { MKL_Mem_Stat(&mut n) };
        (bytes, n)
    }

    #[test]
    fn malloc_aligns_to_max_of_64_and_a_power_of_two() {
        for (asked, want) in [
            (0, 64),
            (1, 64),
            (3, 64),
            (64, 64),
            (128, 128),
            (1 << 16, 1 << 16),
        ] {
            // SAFETY: freed below.
            let p = unsafe { MKL_malloc(10, asked) };
            assert!(!p.is_null());
            assert_eq!(p.addr() % want, 0, "align {asked}");
            // SAFETY: a live block, freed once.
            unsafe { MKL_free(p) };
        }
    }

    /// The live block at `p` as the table holds it.
    fn entry(p: *mut u8) -> Block {
        table().get(p.addr()).expect("a live block")
    }

    /// Whether MKL takes a block of `size` bytes at `align` from `i_malloc`.
    fn large(size: usize, align: usize) -> bool {
        size + align + HEADER >= MIN_CHUNK
    }

    #[test]
    fn every_alignment_up_to_2_pow_30_gets_an_exact_block_or_one_from_i_malloc() {
        for mode in [Mode::Default, Mode::ExactAlign] {
            for shift in [6, 12, 13, 19, 20, 29, 30] {
                let align = 1usize << shift;
                let large = large(200, align);
                // SAFETY: 100 bytes, realloc keeps the alignment and the
                // contents, freed once.
                unsafe {
                    let p = allocate(100, align, false, mode);
                    assert_eq!(p.addr() % align, 0, "{mode:?} 2^{shift}");
                    assert_eq!(entry(p).large, large, "{mode:?} 2^{shift}: {:?}", entry(p));
                    assert!(
                        large || entry(p).exact(),
                        "{mode:?} 2^{shift}: {:?}",
                        entry(p)
                    );
                    p.write_bytes(7, 100);
                    let q = reallocate(p, 200, mode);
                    assert_eq!(q.addr() % align, 0, "realloc, {mode:?} 2^{shift}");
                    assert_eq!(entry(q).large, large, "{mode:?} 2^{shift}: {:?}", entry(q));
                    assert!(
                        large || entry(q).exact(),
                        "{mode:?} 2^{shift}: {:?}",
                        entry(q)
                    );
                    assert_eq!(*q.add(99), 7);
                    MKL_free(q.cast());
                }
            }
        }
    }

    #[test]
    fn large_blocks_are_placed_in_chunks_as_mkl_places_them() {
        // The setup points MKL's pointers at the backing's hooks (unless
        // MKL_ALLOC_BACKING=off, which the tests under Miri do not set).
        crate::process::ensure_ready();
        assert_eq!(crate::backing::state(), crate::backing::Backing::Active);
        for (size, align) in [(1 << 20, 64), (3 << 20, 4096), (MIN_CHUNK - 88, 64)] {
            crate::backing::clear_last();
            // SAFETY: each pointer is the block's latest, used within its
            // size; the last one is freed once.
            unsafe {
                let p = MKL_calloc(1, size, align as c_int).cast::<u8>();
                let (chunk, _) = crate::backing::last_chunk().expect("served by a chunk");
                assert_eq!(
                    p.addr(),
                    chunk + align,
                    "MKL's header and alignment in front"
                );
                assert_eq!(entry(p).base.addr(), chunk);
                assert!(entry(p).large);
                assert_eq!((*p, *p.add(size - 1)), (0, 0), "MKL_calloc zeroes");
                p.write_bytes(5, size);
                // Growth and shrink through i_realloc: the offset kept
                // (but where misaligned-realloc moves the block to 64).
                let after = if mode() == Mode::MisalignedRealloc {
                    DEFAULT_ALIGN
                } else {
                    align
                };
                let q = MKL_realloc(p.cast(), 2 * size).cast::<u8>();
                let chunk = crate::backing::last_chunk().expect("a chunk").0;
                assert_eq!(q.addr(), chunk + after);
                assert!((0..size).step_by(4093).all(|i| *q.add(i) == 5));
                assert_eq!(*q.add(size - 1), 5);
                let r = MKL_realloc(q.cast(), 100).cast::<u8>();
                assert_eq!(r.addr() % after, 0);
                assert!(entry(r).large, "a large block stays in its chunk");
                assert!((0..100).all(|i| *r.add(i) == 5));
                MKL_free(r.cast());
            }
        }
        // Below the floor with MKL's overhead: an exact block.
        crate::backing::clear_last();
        // SAFETY: freed once.
        unsafe {
            let p = MKL_malloc(MIN_CHUNK - 89, 64).cast::<u8>();
            assert!(crate::backing::last_chunk().is_none());
            assert!(!entry(p).large);
            MKL_free(p.cast());
        }
    }

    #[test]
    fn the_c_runtime_stand_ins_keep_malloc_s_contract() {
        // SAFETY: each block is the latest, used within its size, freed once.
        unsafe {
            let p = c_malloc(40).cast::<u8>();
            assert_eq!(p.addr() % 16, 0);
            p.write_bytes(1, 40);
            let q = c_realloc(p.cast(), 4000).cast::<u8>();
            assert!((0..40).all(|i| *q.add(i) == 1));
            assert!(c_realloc(q.cast(), MEMORY).is_null(), "no room: null");
            assert_eq!(*q.add(39), 1, "the block intact");
            assert!(c_realloc(q.cast(), 0).is_null(), "size 0 frees");
            let z = c_calloc(3, 100).cast::<u8>();
            assert!((0..300).all(|i| *z.add(i) == 0));
            c_free(z.cast());
            assert!(c_calloc(usize::MAX, 2).is_null());
            c_free(ptr::null_mut());
        }
    }

    #[test]
    fn exact_align_blocks_are_not_aligned_to_twice_their_alignment() {
        // Up to 2^19: beyond, with MKL's overhead, every block is large,
        // placed where i_malloc's memory puts it.
        for shift in [6, 7, 12, 13, 19] {
            let align = 1usize << shift;
            let exactly = |p: *mut u8| p.addr() % align == 0 && p.addr() % (2 * align) != 0;
            // Several blocks live at once: each placed exactly.
            let blocks: Vec<*mut u8> = (0..4)
                .map(|i| allocate(64 << i, align, i % 2 == 1, Mode::ExactAlign))
                .collect();
            for (i, &p) in blocks.iter().enumerate() {
                assert!(exactly(p), "2^{shift}: {p:p}");
                assert!(entry(p).exact(), "2^{shift}: {:?}", entry(p));
                // SAFETY: a live block of 64 << i bytes; realloc moves it
                // (keeping its contents) and the result is freed once.
                unsafe {
                    p.write_bytes(3, 64 << i);
                    let q = reallocate(p, 100 << i, Mode::ExactAlign);
                    assert!(exactly(q), "realloc, 2^{shift}: {q:p}");
                    assert_ne!(q, p, "exact-align moves");
                    assert_eq!(*q.add((64 << i) - 1), 3);
                    MKL_free(q.cast());
                }
            }
        }
    }

    #[test]
    fn misaligned_realloc_moves_blocks_to_exactly_64() {
        for align in [128, 4096, 1 << 30] {
            // SAFETY: 100 bytes, moved by realloc with their contents; the
            // result is freed once.
            unsafe {
                let p = allocate(100, align, false, Mode::MisalignedRealloc);
                assert_eq!(p.addr() % align, 0);
                if !large(300, align) {
                    // Placed exactly; a large block is where its memory
                    // puts it.
                    assert_eq!(p.addr() % (2 * align), align);
                }
                p.write_bytes(4, 100);
                let q = reallocate(p, 300, Mode::MisalignedRealloc);
                assert_eq!((q.addr() % 64, q.addr() % 128), (0, 64), "align {align}");
                assert_eq!(entry(q).align, 64);
                assert!((0..100).all(|i| *q.add(i) == 4));
                MKL_free(q.cast());
            }
        }
    }

    #[test]
    fn in_place_keeps_the_address_while_the_room_allows() {
        // SAFETY: each pointer is the block's latest, used within its
        // size, and the last one is freed once.
        unsafe {
            let p = allocate(100, 128, false, Mode::InPlace);
            assert_eq!(p.addr() % 128, 0);
            assert_eq!(entry(p).capacity(), 200);
            p.write_bytes(5, 100);
            // Growth into the room: same address, contents kept, MKL's
            // count unchanged (all that is held: as MKL's own for a block
            // resized in place).
            let q = reallocate(p, 200, Mode::InPlace);
            assert_eq!(q.addr(), p.addr(), "grown in place");
            assert!((0..100).all(|i| *q.add(i) == 5));
            assert_eq!((entry(q).size, entry(q).counted), (200, 200));
            q.write_bytes(6, 200);
            // Every shrink is in place; growing back too.
            let r = reallocate(q, 10, Mode::InPlace);
            assert_eq!(r.addr(), p.addr(), "shrunk in place");
            let s = reallocate(r, 150, Mode::InPlace);
            assert_eq!(s.addr(), p.addr(), "grown back in place");
            assert!((0..10).all(|i| *s.add(i) == 6));
            // Beyond the room: moved, contents and alignment kept, counted
            // afresh (the new size and its room).
            let t = reallocate(s, 1000, Mode::InPlace);
            assert_ne!(t.addr(), p.addr(), "moved");
            assert_eq!(t.addr() % 128, 0);
            assert!((0..10).all(|i| *t.add(i) == 6));
            assert_eq!((entry(t).size, entry(t).counted), (1000, 2000));
            MKL_free(t.cast());
        }
    }

    #[test]
    fn in_place_calloc_zeroes_the_block_and_leaves_the_room() {
        // SAFETY: 64 zeroed bytes with 64 of room; freed once.
        unsafe {
            let p = allocate(64, 64, true, Mode::InPlace);
            assert!((0..64).all(|i| *p.add(i) == 0));
            MKL_free(p.cast());
        }
    }

    #[test]
    fn the_fallback_placement_fits() {
        for (mode, shift) in [
            (Mode::Default, 30),
            (Mode::ExactAlign, 6),
            (Mode::ExactAlign, 29),
            (Mode::ExactAlign, 30),
        ] {
            let align = 1usize << shift;
            let (base, outer, pad) = padded(100, align, false, mode).expect("room");
            assert!(fits(base.addr() + pad, align, mode), "{mode:?} 2^{shift}");
            assert!(pad + 100 <= outer.size(), "{mode:?} 2^{shift}: inside");
            // SAFETY: allocated by `padded`, freed once.
            unsafe { system_free(base, outer) };
        }
    }

    #[test]
    fn the_mode_is_the_environments() {
        assert_eq!(Mode::parse(None), Some(Mode::Default));
        assert_eq!(Mode::parse(Some(b"")), Some(Mode::Default));
        assert_eq!(Mode::parse(Some(b"default")), Some(Mode::Default));
        assert_eq!(Mode::parse(Some(b"in-place")), Some(Mode::InPlace));
        assert_eq!(Mode::parse(Some(b"exact-align")), Some(Mode::ExactAlign));
        assert_eq!(
            Mode::parse(Some(b"misaligned-realloc")),
            Some(Mode::MisalignedRealloc)
        );
        assert_eq!(Mode::parse(Some(b"exact")), None);
        let var = std::env::var_os("MKL_ALLOC_MIRI_MODE");
        let want = Mode::parse(var.as_ref().map(|v| v.as_encoded_bytes()));
        assert_eq!(Some(mode()), want, "MKL_ALLOC_MIRI_MODE={var:?}");
    }

    #[test]
    fn size_zero_and_impossible_sizes_are_null() {
        // SAFETY: no block is returned.
        unsafe {
            assert!(MKL_malloc(0, 64).is_null());
            assert!(MKL_calloc(1, 0, 64).is_null());
            assert!(MKL_malloc(MEMORY + 1, 64).is_null());
            assert!(MKL_malloc(usize::MAX, 64).is_null());
        }
    }

    #[test]
    fn calloc_zeroes_and_realloc_keeps_the_prefix() {
        // SAFETY: 64 zeroed bytes, grown then shrunk, freed once.
        unsafe {
            let p = MKL_calloc(1, 64, 128).cast::<u8>();
            assert!((0..64).all(|i| *p.add(i) == 0));
            p.write_bytes(5, 64);
            let q = MKL_realloc(p.cast(), 1000).cast::<u8>();
            // Except where the mode breaks that on purpose.
            let kept = if mode() == Mode::MisalignedRealloc {
                64
            } else {
                128
            };
            assert_eq!(q.addr() % kept, 0, "realloc keeps the block's alignment");
            assert!((0..64).all(|i| *q.add(i) == 5));
            let r = MKL_realloc(q.cast(), 10).cast::<u8>();
            assert!((0..10).all(|i| *r.add(i) == 5));
            MKL_free(r.cast());
        }
    }

    #[test]
    fn a_failed_realloc_leaves_the_block_intact() {
        // SAFETY: the block stays live after the failed realloc; freed once.
        unsafe {
            let p = MKL_malloc(16, 64).cast::<u8>();
            p.write_bytes(9, 16);
            assert!(MKL_realloc(p.cast(), MEMORY).is_null());
            assert!((0..16).all(|i| *p.add(i) == 9));
            MKL_free(p.cast());
        }
    }

    #[test]
    fn mem_stat_counts_live_bytes_and_blocks() {
        // Other tests allocate concurrently: check with a margin that only
        // this test's blocks can explain.
        let (b0, n0) = stats();
        // SAFETY: freed below.
        let p = unsafe { MKL_malloc(1 << 20, 64) };
        let (b1, n1) = stats();
        assert!(b1 >= b0 + (1 << 20) - (1 << 16), "{b0} -> {b1}");
        assert!(n1 >= 1, "{n0} -> {n1} blocks");
        // SAFETY: a live block, freed once.
        unsafe { MKL_free(p) };
        let (b2, _) = stats();
        assert!(b2 <= b1 - (1 << 20) + (1 << 16), "{b1} -> {b2}");
    }

    #[test]
    fn peak_is_relative_to_enabling_and_minus_one_while_off() {
        // SAFETY: the peak calls take a mode by value; the block is freed once.
        unsafe {
            assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_DISABLE), 0);
            assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM), -1);
            assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_ENABLE), 0);
            let p = MKL_malloc(1 << 20, 64);
            assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM) >= 1 << 20);
            MKL_free(p);
            assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_RESET) >= 1 << 20);
            assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM) < 1 << 20);
            assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_DISABLE), 0);
        }
    }

    #[test]
    fn free_of_null_and_the_buffer_and_limit_calls_are_accepted() {
        // SAFETY: null is accepted; the buffer calls take no arguments.
        unsafe {
            MKL_free(ptr::null_mut());
            MKL_Free_Buffers();
            MKL_Thread_Free_Buffers();
            assert_eq!(MKL_Set_Memory_Limit(MKL_MEM_MCDRAM, 1 << 30), 0);
            assert_eq!(MKL_Set_Memory_Limit(7, 1 << 30), -1);
        }
    }
}
