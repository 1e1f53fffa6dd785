//! [`MklAllocator`]: `GlobalAlloc` and allocator-api2's `Allocator` on
//! `MKL_malloc` / `MKL_calloc` / `MKL_realloc` / `MKL_free`.
//!
//! Every method is a thin wrapper: compute MKL's alignment, call MKL, return.
//! The rules live in the `raw_*` functions below, which `SharedMklVec` uses too.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_int;
use core::ptr::{self, NonNull};

use allocator_api2::alloc::AllocError;

use crate::backing::zeroing::{self, LAZY_ZERO_MIN};
use crate::backing::{self, huge_pages};
use crate::{ffi, fork_guard, process};

/// Every block [`MklAllocator`] hands out is aligned to at least this many
/// bytes (MKL's recommended alignment: a cache line, one AVX-512 vector).
pub const MIN_ALIGN: usize = 64;

/// The largest alignment MKL can honour: its `align` parameter is a C `int`,
/// so 2^30 is the largest power of two it can express. Larger alignments are
/// refused (null / `AllocError`), never served misaligned.
pub const MAX_ALIGN: usize = 1 << 30;

/// The alignment MKL is asked for: `max(MIN_ALIGN, align)`, or `None` where
/// MKL cannot express it. `align` is a power of two (a `Layout`'s).
#[inline(always)]
pub(crate) fn mkl_align(align: usize) -> Option<c_int> {
    let align = if align > MIN_ALIGN { align } else { MIN_ALIGN };
    if align <= MAX_ALIGN {
        Some(align as c_int)
    } else {
        None
    }
}

/// What MKL adds to the size of every block it counts, besides the
/// alignment: measured with oneMKL 2026.2 (static and `libmkl_rt`, fast
/// memory manager on or off), `MKL_Mem_Stat` grows by exactly
/// `size + max(align, 64) + 24` for `MKL_malloc(size, align)`, for every
/// size from 1 B to 1 MiB and every power-of-two alignment from 1 to 2^24
/// (and MKL asks `i_malloc` for exactly that many bytes).
const MKL_BLOCK_HEADER: usize = 24;

/// The largest size the crate passes to MKL: MKL adds its header and the
/// alignment to a size without checking for overflow (an allocation of
/// `isize::MAX - 4096` bytes reached the C runtime as a negative size), so
/// a request beyond any machine's memory is refused before MKL sees it.
pub(crate) const MAX_SIZE: usize = isize::MAX as usize / 2;

/// The bytes `MKL_Mem_Stat` counts for a block of `bytes` that
/// [`raw_alloc`] allocates now at `align`: the alignment MKL is asked for
/// plus MKL's header.
///
/// A block that `MKL_realloc` resizes *in place* keeps being counted at its
/// old size (measured: 8000 B shrunk to 24 B still counts 8088; 64 B grown
/// in place to 65 B still counts 152); one it moves is counted afresh.
pub(crate) fn mkl_counts(bytes: usize, align: usize) -> usize {
    bytes + align.max(MIN_ALIGN) + MKL_BLOCK_HEADER
}

/// `MKL_malloc(size, max(64, align))`; null if MKL fails or cannot express
/// `align`. Below the process's slow-path word (see `process`) that is all;
/// a larger block takes [`alloc_slow`].
///
/// # Safety
/// `size > 0`, `align` a power of two.
#[inline(always)]
pub(crate) unsafe fn raw_alloc(size: usize, align: usize) -> *mut u8 {
    // SAFETY: the caller's contract, forwarded; no header.
    unsafe { raw_alloc_headed(size, align, 0, false, false) }
}

/// `MKL_calloc(1, size, max(64, align))`: zeroed; null on failure. A large
/// block is zeroed lazily instead (see `zeroing`: its pages read as zero
/// without being written), and a block fresh from the kernel not at all.
///
/// # Safety
/// As [`raw_alloc`].
#[inline(always)]
pub(crate) unsafe fn raw_alloc_zeroed(size: usize, align: usize) -> *mut u8 {
    // SAFETY: the caller's contract, forwarded; no header.
    unsafe { raw_alloc_headed(size, align, 0, false, true) }
}

/// [`raw_alloc`] or [`raw_alloc_zeroed`] for a block whose first `head`
/// bytes are its owner's header (`c_heap`'s): huge-page advice and lazy
/// zeroing start after them, so that writing the header faults in one
/// 4 KiB page, not a whole huge page (2 MiB zeroed by the kernel: 0.2 ms
/// for NumPy's `zeros(2**26)`, measured). `advise` asks for huge-page
/// advice whatever the crate's policy says (the NumPy handler follows
/// NumPy's own switch).
///
/// # Safety
/// `size > 0`, `align` a power of two, `head < size`.
#[inline(always)]
pub(crate) unsafe fn raw_alloc_headed(
    size: usize,
    align: usize,
    head: usize,
    advise: bool,
    zeroed: bool,
) -> *mut u8 {
    if advise || process::slow(size) {
        // SAFETY: the caller's contract, forwarded.
        return unsafe { alloc_slow(size, align, head, advise, zeroed) };
    }
    if zeroed {
        mkl_calloc(size, align)
    } else {
        mkl_malloc(size, align)
    }
}

#[inline(always)]
fn mkl_malloc(size: usize, align: usize) -> *mut u8 {
    match mkl_align(align) {
        // SAFETY: MKL_malloc takes any size up to MAX_SIZE and a positive
        // power-of-two alignment (mkl_align's result); null on failure.
        Some(a) if size <= MAX_SIZE => {
            fork_guard::mkl(|| unsafe { ffi::MKL_malloc(size, a).cast() })
        }
        _ => ptr::null_mut(),
    }
}

#[inline(always)]
fn mkl_calloc(size: usize, align: usize) -> *mut u8 {
    match mkl_align(align) {
        // SAFETY: as in mkl_malloc; num = 1 so the product cannot overflow.
        Some(a) if size <= MAX_SIZE => {
            fork_guard::mkl(|| unsafe { ffi::MKL_calloc(1, size, a).cast() })
        }
        _ => ptr::null_mut(),
    }
}

/// The slow path of an allocation: the first call of the process (which
/// runs the setup) and every block of the slow-path word's size or more.
/// MKL serves it (from a chunk beneath MKL where it is large: see
/// `backing`); a zeroed one is zeroed lazily, or not at all where the
/// chunk is fresh from the kernel; `advise` adds huge-page advice where
/// the crate's policy gave none. Advice and zeroing skip the first `head`
/// bytes (see [`raw_alloc_headed`]).
///
/// # Safety
/// As [`raw_alloc`], and `head < size`.
#[inline(never)]
unsafe fn alloc_slow(
    size: usize,
    align: usize,
    head: usize,
    advise: bool,
    zeroed: bool,
) -> *mut u8 {
    process::ensure_ready();
    // A program that let go of its medium blocks: this allocation is a
    // decay point (see `backing::medium`).
    crate::backing::medium::at_allocation();
    if zeroed && !advise && size < LAZY_ZERO_MIN {
        return mkl_calloc(size, align);
    }
    backing::clear_last();
    let p = mkl_malloc(size, align);
    if p.is_null() {
        return p;
    }
    let chunk = backing::last_chunk();
    if chunk.is_none() {
        backing::note_unserved(size);
    }
    if advise && !(chunk.is_some() && huge_pages::applies(size)) {
        // SAFETY: p is the fresh block of `size` bytes just allocated.
        unsafe { huge_pages::advise(p.add(head), size - head) };
    }
    if zeroed {
        let granule = match chunk {
            // Fresh from the kernel: every byte MKL did not write reads 0.
            Some((_, true)) => return p,
            Some(_) => zeroing::chunk_granule(size),
            None => zeroing::foreign_granule(),
        };
        // SAFETY: p is a block of at least `size` bytes that we own,
        // private anonymous memory (a chunk, or the C runtime's).
        unsafe { zeroing::zero(p.add(head), size - head, granule) };
    }
    p
}

/// `MKL_free(ptr)`: a large block's chunk goes to the block cache beneath
/// MKL (see `backing`).
///
/// # Safety
/// `ptr` came from `raw_alloc*`/`raw_realloc` with a size of `size` bytes
/// (its latest), and is not used again.
#[inline(always)]
pub(crate) unsafe fn raw_free(ptr: *mut u8, size: usize) {
    let _ = size;
    // SAFETY: the caller passes a live MKL block, freed exactly once.
    fork_guard::mkl(|| unsafe { ffi::MKL_free(ptr.cast()) })
}

/// The block `ptr` of `old_size` bytes resized to `new_size`, aligned to
/// `max(64, align)`, its first `min(old_size, new_size)` bytes kept. On
/// failure null, and the old block untouched.
///
/// `MKL_realloc` keeps a block's alignment (measured for every power of
/// two 1 .. 2^24), and every block of the crate was asked of MKL at
/// `max(64, align)` or more. Beneath MKL a large block's chunk grows with
/// `mremap` (no copy; see `backing`). What MKL does above that (measured
/// with oneMKL 2026.2, `cargo run --release --example realloc_in_place`):
/// every shrink keeps the address and the whole old block, without asking
/// `i_realloc`; a growth stays in place while the new size fits the block
/// MKL holds, and otherwise asks `i_realloc`. So a shrink to half or less
/// of a block of [`SHRINK_MOVE_MIN`] or more moves instead
/// ([`shrink_moved`]): only a move gives the memory back.
///
/// # Safety
/// `ptr` is a live MKL block of `old_size` bytes (its latest size)
/// allocated with an alignment of at least `align`; `new_size > 0`.
#[inline(always)]
pub(crate) unsafe fn raw_realloc(
    ptr: *mut u8,
    old_size: usize,
    new_size: usize,
    align: usize,
) -> *mut u8 {
    if shrink_moves(old_size, new_size) {
        // SAFETY: a live block of `old_size` bytes; new_size < old_size.
        let moved = unsafe { shrink_moved(ptr, old_size, new_size, align) };
        if !moved.is_null() {
            return moved;
        }
        // No memory for the smaller block: it stays in place.
    }
    // SAFETY: the caller's contract.
    unsafe { mkl_realloc(ptr, old_size, new_size, align) }
}

/// `MKL_realloc` of a block MKL holds at `max(64, align)` (MKL keeps that).
///
/// # Safety
/// `ptr` is a live MKL block of `old_size` bytes, allocated at
/// `max(64, align)` or more; `new_size > 0`.
#[inline(always)]
unsafe fn mkl_realloc(ptr: *mut u8, old_size: usize, new_size: usize, align: usize) -> *mut u8 {
    if new_size > MAX_SIZE {
        return ptr::null_mut();
    }
    // SAFETY: ptr is a live MKL block (caller's contract); MKL_realloc returns
    // null and leaves it intact, or frees it and returns the new block.
    let new: *mut u8 = fork_guard::mkl(|| unsafe { ffi::MKL_realloc(ptr.cast(), new_size).cast() });
    let align = align.max(MIN_ALIGN);
    if new as usize & (align - 1) == 0 {
        return new; // also the null case
    }
    // SAFETY: `new` is a live MKL block of new_size bytes holding the
    // first min(old_size, new_size) bytes of the old one.
    unsafe { realign(new, old_size.min(new_size), new_size, align) }
}

/// Blocks at least this large are moved by a shrink to a [`SHRINK_MOVE_RATIO`]
/// of their size or less (see [`shrink_moves`]).
pub(crate) const SHRINK_MOVE_MIN: usize = 256 << 10;

/// A shrink moves when the new size is at most `old / SHRINK_MOVE_RATIO`.
pub(crate) const SHRINK_MOVE_RATIO: usize = 2;

/// Whether a shrink from `old_size` to `new_size` moves to a new block
/// rather than staying in place, which keeps the whole old block (MKL
/// counts and holds all of it until it is freed, and asks nothing of
/// `i_realloc`).
///
/// Measured with oneMKL 2026.2 on the 2-core AMD EPYC machine (`cargo run
/// --release --example shrink_threshold`: filled blocks, medians of 5
/// interleaved rounds, one run under load). In place: 30-40 ns below 1 MiB,
/// up to 1.7 µs at 256 MiB, and `MKL_Mem_Stat` keeps the old size. Moved:
/// MKL's count drops to the new size at every size; the time is the copy of
/// the new size plus an allocation and a free: 0.13-0.3 µs for 4-16 KiB,
/// 4.3 µs for 256 KiB -> 128 KiB, 22 µs for 1 MiB -> 512 KiB, 0.95 ms for
/// 16 MiB -> 8 MiB, 0.2 µs-1.5 µs to 1 byte.
///
/// Hence the rule: blocks of 256 KiB or more move when they shrink to half
/// or less, so that the copy is never larger than what is freed; smaller
/// blocks (at most 128 KiB of slack each) and mild shrinks (a `Vec`
/// trimming the spare capacity of its last doubling) stay in place at tens
/// of nanoseconds.
#[inline(always)]
pub(crate) fn shrink_moves(old_size: usize, new_size: usize) -> bool {
    old_size >= SHRINK_MOVE_MIN && new_size <= old_size / SHRINK_MOVE_RATIO
}

/// A shrink that gives memory back: a fresh block of `new_size` bytes, the
/// first `new_size` bytes copied into it, the old block (of `held` bytes)
/// freed. Null if MKL has no fresh block, the old block then untouched.
///
/// # Safety
/// `ptr` is a live MKL block of `held > new_size` bytes, allocated with an
/// alignment of at least `align` (a power of two); `new_size > 0`.
#[cold]
#[inline(never)]
unsafe fn shrink_moved(ptr: *mut u8, held: usize, new_size: usize, align: usize) -> *mut u8 {
    debug_assert!(0 < new_size && new_size < held);
    // SAFETY: new_size > 0 and align is a power of two (caller's contract).
    let fresh = unsafe { raw_alloc(new_size, align) };
    if !fresh.is_null() {
        // SAFETY: distinct live blocks, the old one holding more than
        // new_size bytes; the old one is freed once and not used again.
        unsafe {
            ptr::copy_nonoverlapping(ptr, fresh, new_size);
            raw_free(ptr, held);
        }
    }
    fresh
}

/// Moves a block that `MKL_realloc` returned below `align` into an aligned
/// one. MKL keeps the alignment it recorded, and every block reaching
/// `MKL_realloc` was asked of MKL at `align` or more, so this would take
/// MKL breaking its own contract (never observed). The caller's old
/// pointer is already gone then, so a failure here cannot be reported as
/// "old block intact": the process aborts.
#[cold]
#[inline(never)]
unsafe fn realign(block: *mut u8, keep: usize, size: usize, align: usize) -> *mut u8 {
    // SAFETY: size > 0 and align is a power of two.
    let fresh = unsafe { raw_alloc(size, align) };
    if fresh.is_null() {
        const MSG: &[u8] = b"mkl-alloc: MKL_realloc returned a block below its alignment and no aligned block could replace it\n";
        crate::sys::write_stderr(MSG);
        std::process::abort();
    }
    // SAFETY: both blocks hold at least `keep` bytes and are distinct; `block`
    // is a live MKL block freed exactly once.
    unsafe {
        ptr::copy_nonoverlapping(block, fresh, keep);
        raw_free(block, size);
    }
    fresh
}

/// The oneMKL memory manager as a Rust allocator.
///
/// A zero-sized handle: every instance is the same allocator. Blocks are
/// aligned to `max(64, layout.align())`; alignments above [`MAX_ALIGN`] and
/// sizes MKL cannot serve give null (`GlobalAlloc`) or [`AllocError`]
/// (`Allocator`), never a misaligned block or an abort.
///
/// As the whole program's allocator:
///
/// ```
/// use mkl_alloc::MklAllocator;
///
/// #[global_allocator]
/// static GLOBAL: MklAllocator = MklAllocator;
///
/// let v = vec![1.0f64; 1000];
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// ```
///
/// For chosen collections, through allocator-api2. Both of its lines'
/// `Allocator` are implemented, 0.2's (hashbrown's and bumpalo's) and 0.4's
/// (what `cargo add allocator-api2` picks today), so the collections of
/// either take it:
///
/// ```
/// use allocator_api2::vec::Vec;
/// use mkl_alloc::MklAllocator;
///
/// let mut v: Vec<f64, MklAllocator> = Vec::new_in(MklAllocator);
/// v.extend((0..1000).map(f64::from));
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// assert_eq!(v[999], 999.0);
///
/// // allocator-api2 0.4 (renamed here, as this crate depends on both):
/// let b = allocator_api2_04::boxed::Box::new_in([7u8; 100], MklAllocator);
/// assert_eq!(b.as_ptr() as usize % 64, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MklAllocator;

// SAFETY: every method upholds GlobalAlloc's contract: blocks fit the layout
// (size, and alignment max(64, align) or null), null reports failure with the
// old block intact (realloc), and dealloc frees exactly what alloc returned.
// MKL's own bookkeeping uses libc's allocator, so it never re-enters this one.
unsafe impl GlobalAlloc for MklAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: layout.size() > 0 (GlobalAlloc's contract); the align of a
        // Layout is a power of two.
        unsafe { raw_alloc(layout.size(), layout.align()) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in alloc.
        unsafe { raw_alloc_zeroed(layout.size(), layout.align()) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from this allocator with `layout` (caller's contract).
        unsafe { raw_free(ptr, layout.size()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: ptr is a live block of `layout` from this allocator, so it
        // is aligned to max(64, layout.align()); new_size > 0 (contract).
        unsafe { raw_realloc(ptr, layout.size(), new_size, layout.align()) }
    }
}

/// The three block operations an allocator-api2
/// [`Allocator`](allocator_api2::alloc::Allocator) is assembled
/// from by the `api_*` functions below and [`allocator_via_blocks!`]:
/// [`MklAllocator`] and `MklSplitAllocator` differ only in these, so the
/// zero-size, grow-zeroed and error rules of the `Allocator` trait are
/// written once.
///
/// # Safety
/// An implementor promises what `Allocator` needs of a block: one returned
/// by `alloc_block` / `resize_block` fits its layout (size, alignment) and
/// stays valid until it is passed to `free_block` or `resize_block`; every
/// copy of the implementor is the same allocator.
pub(crate) unsafe trait Blocks {
    /// A block of `layout` (zeroed if `zeroed`), or null.
    ///
    /// # Safety
    /// `layout.size() > 0`.
    unsafe fn alloc_block(&self, layout: Layout, zeroed: bool) -> *mut u8;

    /// Frees a block.
    ///
    /// # Safety
    /// `ptr` is a live block of `layout` (non-zero size) from this allocator.
    unsafe fn free_block(&self, ptr: *mut u8, layout: Layout);

    /// The block of `old` as a block of `new`, its first
    /// `min(old.size(), new.size())` bytes kept; null on failure, the old block
    /// then intact.
    ///
    /// # Safety
    /// `ptr` is a live block of `old` from this allocator; both sizes > 0.
    unsafe fn resize_block(&self, ptr: *mut u8, old: Layout, new: Layout) -> *mut u8;
}

/// A dangling, aligned, non-null pointer for zero-sized blocks: they never
/// reach an allocator.
#[inline(always)]
fn dangling(align: usize) -> NonNull<[u8]> {
    // SAFETY: a Layout's alignment is never zero.
    let ptr = unsafe { NonNull::new_unchecked(ptr::without_provenance_mut::<u8>(align)) };
    NonNull::slice_from_raw_parts(ptr, 0)
}

#[inline(always)]
fn block(ptr: *mut u8, size: usize) -> Result<NonNull<[u8]>, AllocError> {
    match NonNull::new(ptr) {
        Some(p) => Ok(NonNull::slice_from_raw_parts(p, size)),
        None => Err(AllocError),
    }
}

/// `Allocator::allocate` / `allocate_zeroed`.
#[inline(always)]
pub(crate) fn api_allocate<B: Blocks>(
    b: &B,
    layout: Layout,
    zeroed: bool,
) -> Result<NonNull<[u8]>, AllocError> {
    if layout.size() == 0 {
        return Ok(dangling(layout.align()));
    }
    // SAFETY: layout.size() > 0.
    block(unsafe { b.alloc_block(layout, zeroed) }, layout.size())
}

/// `Allocator::deallocate`.
///
/// # Safety
/// `Allocator::deallocate`'s contract.
#[inline(always)]
pub(crate) unsafe fn api_deallocate<B: Blocks>(b: &B, ptr: NonNull<u8>, layout: Layout) {
    if layout.size() != 0 {
        // SAFETY: a live non-zero-sized block of `layout` (caller's contract).
        unsafe { b.free_block(ptr.as_ptr(), layout) }
    }
}

/// `Allocator::grow` / `grow_zeroed` (which zeroes only the new tail).
///
/// # Safety
/// `Allocator::grow`'s contract.
#[inline(always)]
pub(crate) unsafe fn api_grow<B: Blocks>(
    b: &B,
    ptr: NonNull<u8>,
    old: Layout,
    new: Layout,
    zeroed: bool,
) -> Result<NonNull<[u8]>, AllocError> {
    if old.size() == 0 {
        return api_allocate(b, new, zeroed);
    }
    backing::clear_last();
    // SAFETY: a live non-empty block of `old`; new.size() >= old.size() > 0.
    let grown = block(
        unsafe { b.resize_block(ptr.as_ptr(), old, new) },
        new.size(),
    )?;
    if zeroed {
        // A chunk's pages are 4 KiB or its own huge pages; anything else
        // may be on the C runtime's huge pages.
        let granule = match backing::last_chunk() {
            Some(_) => zeroing::chunk_granule(new.size()),
            None => zeroing::foreign_granule(),
        };
        // SAFETY: the block holds new.size() >= old.size() bytes; only the
        // tail beyond the old contents is zeroed (lazily where large).
        unsafe {
            let tail = grown.cast::<u8>().as_ptr().add(old.size());
            zeroing::zero(tail, new.size() - old.size(), granule);
        }
    }
    Ok(grown)
}

/// `Allocator::shrink`.
///
/// # Safety
/// `Allocator::shrink`'s contract.
#[inline(always)]
pub(crate) unsafe fn api_shrink<B: Blocks>(
    b: &B,
    ptr: NonNull<u8>,
    old: Layout,
    new: Layout,
) -> Result<NonNull<[u8]>, AllocError> {
    if new.size() == 0 {
        // SAFETY: a live block of `old`, not used again.
        unsafe { api_deallocate(b, ptr, old) };
        return Ok(dangling(new.align()));
    }
    // SAFETY: a live block of `old`; old.size() >= new.size() > 0.
    block(
        unsafe { b.resize_block(ptr.as_ptr(), old, new) },
        new.size(),
    )
}

// SAFETY: MKL blocks are aligned to max(64, align) (raw_* functions), hold
// at least the layout's size, and live until MKL_free / MKL_realloc; the
// handle is zero-sized, so every copy is the same allocator.
unsafe impl Blocks for MklAllocator {
    #[inline(always)]
    unsafe fn alloc_block(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        // SAFETY: layout.size() > 0 (trait contract); a Layout's alignment
        // is a power of two.
        unsafe {
            if zeroed {
                raw_alloc_zeroed(layout.size(), layout.align())
            } else {
                raw_alloc(layout.size(), layout.align())
            }
        }
    }

    #[inline(always)]
    unsafe fn free_block(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: a live MKL block of `layout` (trait contract), freed once.
        unsafe { raw_free(ptr, layout.size()) }
    }

    #[inline(always)]
    unsafe fn resize_block(&self, ptr: *mut u8, old: Layout, new: Layout) -> *mut u8 {
        if new.align() <= old.align().max(MIN_ALIGN) {
            // SAFETY: the block is aligned to max(64, old.align()) >= new.align().
            return unsafe { raw_realloc(ptr, old.size(), new.size(), new.align()) };
        }
        // A stricter alignment than the block has: MKL_realloc would keep the
        // old one, so move by hand (what MKL_realloc does for a growth anyway;
        // see raw_realloc for what was measured).
        // SAFETY: new.size() > 0, power-of-two alignment.
        let fresh = unsafe { raw_alloc(new.size(), new.align()) };
        if !fresh.is_null() {
            // SAFETY: distinct live blocks, each at least min(old, new) bytes;
            // the old one is freed once and not used again.
            unsafe {
                ptr::copy_nonoverlapping(ptr, fresh, old.size().min(new.size()));
                raw_free(ptr, old.size());
            }
        }
        fresh
    }
}

/// Implements the `Allocator` trait of one allocator-api line (the module
/// path in the first brackets: `allocator_api2::alloc` or
/// `allocator_api2_04::alloc`) for a type
/// implementing [`Blocks`], forwarding each method to the `api_*` functions.
/// The traits have the same shape; only the error type's path differs.
macro_rules! allocator_via_blocks {
    ([$($api:tt)*] [$($generics:tt)*] $ty:ty $(, #[$attr:meta])*) => {
        // SAFETY: the `unsafe impl Blocks` for this type promises valid,
        // fitting blocks from one allocator; the api_* functions add
        // Allocator's remaining rules (zero-sized layouts never reach it,
        // grow_zeroed zeroes the tail, failure leaves the old block intact).
        $(#[$attr])*
        unsafe impl<$($generics)*> $($api)*::Allocator for $ty {
            #[inline]
            fn allocate(
                &self,
                layout: core::alloc::Layout,
            ) -> Result<core::ptr::NonNull<[u8]>, $($api)*::AllocError> {
                $crate::allocator::api_allocate(self, layout, false)
                    .map_err(|_| $($api)*::AllocError)
            }

            #[inline]
            fn allocate_zeroed(
                &self,
                layout: core::alloc::Layout,
            ) -> Result<core::ptr::NonNull<[u8]>, $($api)*::AllocError> {
                $crate::allocator::api_allocate(self, layout, true)
                    .map_err(|_| $($api)*::AllocError)
            }

            #[inline]
            unsafe fn deallocate(&self, ptr: core::ptr::NonNull<u8>, layout: core::alloc::Layout) {
                // SAFETY: the caller's deallocate contract, forwarded.
                unsafe { $crate::allocator::api_deallocate(self, ptr, layout) }
            }

            #[inline]
            unsafe fn grow(
                &self,
                ptr: core::ptr::NonNull<u8>,
                old: core::alloc::Layout,
                new: core::alloc::Layout,
            ) -> Result<core::ptr::NonNull<[u8]>, $($api)*::AllocError> {
                // SAFETY: the caller's grow contract, forwarded.
                unsafe { $crate::allocator::api_grow(self, ptr, old, new, false) }
                    .map_err(|_| $($api)*::AllocError)
            }

            #[inline]
            unsafe fn grow_zeroed(
                &self,
                ptr: core::ptr::NonNull<u8>,
                old: core::alloc::Layout,
                new: core::alloc::Layout,
            ) -> Result<core::ptr::NonNull<[u8]>, $($api)*::AllocError> {
                // SAFETY: the caller's grow contract, forwarded.
                unsafe { $crate::allocator::api_grow(self, ptr, old, new, true) }
                    .map_err(|_| $($api)*::AllocError)
            }

            #[inline]
            unsafe fn shrink(
                &self,
                ptr: core::ptr::NonNull<u8>,
                old: core::alloc::Layout,
                new: core::alloc::Layout,
            ) -> Result<core::ptr::NonNull<[u8]>, $($api)*::AllocError> {
                // SAFETY: the caller's shrink contract, forwarded.
                unsafe { $crate::allocator::api_shrink(self, ptr, old, new) }
                    .map_err(|_| $($api)*::AllocError)
            }
        }
    };
}
pub(crate) use allocator_via_blocks;

/// Implements both allocator-api lines' `Allocator` for a type implementing
/// [`Blocks`]: allocator-api2 0.2 (under the `nightly` feature its trait is
/// `core::alloc::Allocator` itself) and 0.4 (which has no `nightly` feature,
/// so the two impls never name one trait).
macro_rules! allocator_impls {
    ([$($generics:tt)*] $ty:ty) => {
        $crate::allocator::allocator_via_blocks!([allocator_api2::alloc] [$($generics)*] $ty);
        $crate::allocator::allocator_via_blocks!([allocator_api2_04::alloc] [$($generics)*] $ty);
    };
}
pub(crate) use allocator_impls;

allocator_impls!([] MklAllocator);
