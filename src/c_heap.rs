//! The C `malloc` contract over MKL blocks, for callers whose `free` does not
//! pass the size (NumPy's data-memory handler, C libraries, FFI callbacks).
//!
//! [`malloc`], [`calloc`], [`realloc`] and [`free`] follow C's contract,
//! with an alignment chosen at allocation, and one difference: the free
//! function [`realloc`] takes a live block only, never null (it would read
//! a header below address 0); C's `realloc(NULL, n)` is
//! [`CHeap::realloc`]'s, which knows the alignment to give. Every block is an MKL block whose size and alignment are kept in
//! a *header* in front of the returned pointer, so that `realloc` and
//! `free` need nothing but the pointer.
//!
//! - **Header cost.** The header takes one alignment unit,
//!   `max(64, align)` bytes, in front of the data so that the data stays
//!   aligned: 64 bytes for alignments up to 64, but a whole 2 MiB for a
//!   2 MiB alignment (and 1 GiB for 2^30). Large alignments are meant for
//!   few, large blocks.
//! - **Zero size.** A request for 0 bytes gets a real block of 1 byte: a
//!   unique pointer that [`free`] and [`realloc`] accept, never null.
//! - **Small blocks** (up to [`SMALL_MAX`] bytes, alignment up to
//!   [`BIN_MAX_ALIGN`]) are rounded up to a multiple of 64 bytes and, when
//!   freed, kept in small bounded bins (at most [`BIN_SLOTS`] per size and
//!   alignment class) for the next request of their class, as NumPy caches
//!   its blocks under 1024 bytes: a `malloc`/`free` pair then costs two
//!   atomic operations instead of MKL's ~35 ns per block. The bins are
//!   lock-free (one atomic pointer per slot; a loom model,
//!   `loom_tests/c_heap_bins.rs`, checks them), serve any thread and accept
//!   frees from any thread. Cached blocks are live MKL blocks (MKL's
//!   statistics count them); [`manager::free_buffers`](crate::manager::free_buffers)
//!   gives them back.
//! - **Huge pages.** A [`CHeap`] may advise its blocks of
//!   [`HUGE_PAGE_THRESHOLD`] (4 MiB) and more with `MADV_HUGEPAGE`, as
//!   NumPy's default allocator does. The advice goes through the crate's
//!   [`huge_pages`](crate::huge_pages) mechanism (a 2 MiB-aligned block,
//!   advised once before its first touch, whether or not the global policy
//!   covers it too). Large blocks go through the
//!   [`block_cache`](crate::block_cache) like every MKL block of the crate.
//!
//! Nothing here allocates outside MKL or needs Python's GIL. Small blocks
//! take no lock (the bins are lock-free); large ones go through the block
//! cache, whose short shard locks survive `fork` (see
//! [`block_cache`](crate::block_cache)).
//!
//! ```
//! use mkl_alloc::c_heap;
//!
//! let p = c_heap::malloc(100, 256);
//! assert!(!p.is_null() && p as usize % 256 == 0);
//! // SAFETY: p is a live c_heap block of 100 bytes.
//! unsafe {
//!     p.write_bytes(7, 100);
//!     let q = c_heap::realloc(p, 100_000); // contents and alignment kept
//!     assert!(!q.is_null() && q as usize % 256 == 0);
//!     assert_eq!(*q.add(99), 7);
//!     c_heap::free(q);
//! }
//! ```

use core::ptr;

use crate::allocator::{MAX_ALIGN, MIN_ALIGN, raw_alloc_headed, raw_free, raw_realloc};

/// Blocks of up to this many bytes are rounded up to a multiple of 64 and
/// cached in bins when freed (NumPy caches its blocks under 1024 bytes).
pub const SMALL_MAX: usize = 1024;

/// Small blocks are cached only for alignments up to this: above it the
/// header (one alignment unit per block) would make the bins hold far more
/// memory than the data they serve.
pub const BIN_MAX_ALIGN: usize = 4096;

/// How many freed blocks each bin (one size class at one alignment) keeps.
pub const BIN_SLOTS: usize = 8;

/// A [`CHeap`] with huge pages on advises its blocks of at least this many
/// bytes (NumPy's threshold for its own `madvise(MADV_HUGEPAGE)`).
pub const HUGE_PAGE_THRESHOLD: usize = crate::huge_pages::DEFAULT_THRESHOLD;

/// Size classes of the bins: 64, 128, ..., [`SMALL_MAX`] bytes.
const CLASSES: usize = SMALL_MAX / MIN_ALIGN;
/// Alignment classes of the bins: 64, 128, ..., [`BIN_MAX_ALIGN`].
#[cfg_attr(loom, allow(dead_code))]
const ALIGN_CLASSES: usize =
    (BIN_MAX_ALIGN.trailing_zeros() - MIN_ALIGN.trailing_zeros()) as usize + 1;

/// Where the header sits: the last 16 bytes before the data.
const HEADER_WORDS: usize = 2;
/// Low bit of the header's alignment word: the block's heap asked for huge
/// pages (followed again when `realloc` grows the block).
const HUGE_FLAG: usize = 1;

pub(crate) mod bin;
use bin::Bin;

/// The bins, one per size and alignment class (see [`bin`] for how a slot
/// is taken and filled). Under loom there are none: the allocation path
/// then caches nothing, and `loom_tests/c_heap_bins.rs` models a [`Bin`]
/// directly (loom's atomics cannot live in a static).
#[cfg(not(loom))]
static BINS: [[Bin; CLASSES]; ALIGN_CLASSES] =
    [const { [const { Bin::new() }; CLASSES] }; ALIGN_CLASSES];
#[cfg(loom)]
static BINS: [[Bin; CLASSES]; 0] = [];

/// An allocation policy: the alignment of every block, and whether blocks of
/// [`HUGE_PAGE_THRESHOLD`] bytes and more are advised onto huge pages.
/// Blocks from any `CHeap` (or from [`malloc`] / [`calloc`]) are reallocated
/// with [`realloc`] and freed with [`free`].
///
/// ```
/// use mkl_alloc::c_heap::{self, CHeap};
///
/// let heap = CHeap::new(4096).unwrap().with_huge_pages(true);
/// let p = heap.calloc(1000, 8);
/// assert!(!p.is_null() && p as usize % 4096 == 0);
/// // SAFETY: p is a live c_heap block of 8000 zeroed bytes.
/// unsafe {
///     assert_eq!(*p.add(7999), 0);
///     c_heap::free(p);
/// }
/// assert!(CHeap::new(3).is_none()); // not a power of two
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CHeap {
    /// The alignment MKL is asked for: `max(64, requested)`.
    align: usize,
    huge_pages: bool,
}

impl CHeap {
    /// A heap whose blocks are aligned to `align` (a power of two from 1 to
    /// [`MAX_ALIGN`], 2^30), huge pages off; `None` for any other alignment.
    /// Alignments under 64 are served at 64.
    ///
    /// ```
    /// use mkl_alloc::c_heap::CHeap;
    /// assert_eq!(CHeap::new(1).unwrap().align(), 64);
    /// assert_eq!(CHeap::new(1 << 21).unwrap().align(), 1 << 21);
    /// assert!(CHeap::new(0).is_none() && CHeap::new(1 << 31).is_none());
    /// ```
    pub const fn new(align: usize) -> Option<CHeap> {
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return None;
        }
        Some(CHeap {
            align: if align > MIN_ALIGN { align } else { MIN_ALIGN },
            huge_pages: false,
        })
    }

    /// This heap, advising (`on`) or not its blocks of
    /// [`HUGE_PAGE_THRESHOLD`] bytes and more onto huge pages. Blocks the
    /// crate's global [`huge_pages`](crate::huge_pages) policy covers are
    /// advised by that policy either way.
    ///
    /// ```
    /// use mkl_alloc::c_heap::CHeap;
    /// let heap = CHeap::new(64).unwrap().with_huge_pages(true);
    /// assert!(heap.huge_pages());
    /// ```
    pub const fn with_huge_pages(self, on: bool) -> CHeap {
        CHeap {
            huge_pages: on,
            ..self
        }
    }

    /// The alignment of every block: `max(64, align)`.
    ///
    /// ```
    /// assert_eq!(mkl_alloc::c_heap::CHeap::new(128).unwrap().align(), 128);
    /// ```
    pub const fn align(self) -> usize {
        self.align
    }

    /// Whether blocks of [`HUGE_PAGE_THRESHOLD`] bytes and more are advised.
    ///
    /// ```
    /// assert!(!mkl_alloc::c_heap::CHeap::new(64).unwrap().huge_pages());
    /// ```
    pub const fn huge_pages(self) -> bool {
        self.huge_pages
    }

    /// A block of `size` bytes (0 counts as 1), aligned to [`align`](Self::align);
    /// null if MKL fails or the size with its header exceeds `isize::MAX`.
    /// Free it with [`free`].
    ///
    /// ```
    /// use mkl_alloc::c_heap::{self, CHeap};
    /// let p = CHeap::new(64).unwrap().malloc(0); // a real, unique block
    /// assert!(!p.is_null());
    /// // SAFETY: a live c_heap block.
    /// unsafe { c_heap::free(p) };
    /// ```
    pub fn malloc(self, size: usize) -> *mut u8 {
        self.alloc(size, false)
    }

    /// A zeroed block of `nelem * elsize` bytes, aligned to
    /// [`align`](Self::align); null if the product overflows (never a
    /// shorter block), if MKL fails, or if the size with its header exceeds
    /// `isize::MAX`. Free it with [`free`].
    ///
    /// ```
    /// use mkl_alloc::c_heap::CHeap;
    /// let heap = CHeap::new(64).unwrap();
    /// assert!(heap.calloc(usize::MAX / 2, 3).is_null());
    /// ```
    pub fn calloc(self, nelem: usize, elsize: usize) -> *mut u8 {
        match nelem.checked_mul(elsize) {
            Some(size) => self.alloc(size, true),
            None => ptr::null_mut(),
        }
    }

    /// `realloc` for a heap: [`realloc`], or a fresh block from this heap
    /// when `ptr` is null (C's `realloc(NULL, n)`).
    ///
    /// # Safety
    /// As [`realloc`], except that `ptr` may also be null.
    ///
    /// ```
    /// use mkl_alloc::c_heap::{self, CHeap};
    /// // SAFETY: a null pointer asks for a new block; the result is freed once.
    /// unsafe {
    ///     let p = CHeap::new(512).unwrap().realloc(core::ptr::null_mut(), 10);
    ///     assert!(p as usize % 512 == 0);
    ///     c_heap::free(p);
    /// }
    /// ```
    pub unsafe fn realloc(self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        if ptr.is_null() {
            return self.malloc(new_size);
        }
        // SAFETY: the caller's contract.
        unsafe { realloc(ptr, new_size) }
    }

    /// The header of a new block (the alignment word with the huge flag).
    fn tag(self) -> usize {
        self.align | if self.huge_pages { HUGE_FLAG } else { 0 }
    }

    fn alloc(self, size: usize, zeroed: bool) -> *mut u8 {
        let cap = capacity(size);
        if let Some(bin) = bin(cap, self.align) {
            if let Some(data) = bin.take() {
                // SAFETY: a cached block of `cap` bytes at this alignment,
                // now exclusively ours.
                unsafe {
                    if zeroed {
                        data.write_bytes(0, cap);
                    }
                    write_header(data, cap, self.tag());
                }
                return data;
            }
        }
        let Some(total) = total_size(cap, self.align) else {
            return ptr::null_mut();
        };
        // SAFETY: total > 0 and the header (one alignment unit) is less
        // than it; the alignment is a power of two ≤ MAX_ALIGN.
        let block =
            unsafe { raw_alloc_headed(total, self.align, self.align, self.advises(total), zeroed) };
        if block.is_null() {
            return block;
        }
        // SAFETY: `block` is an MKL block of `total` bytes (zeroed if asked):
        // the header goes inside it, in front of the data.
        unsafe {
            let data = block.add(self.align);
            write_header(data, cap, self.tag());
            data
        }
    }

    /// Whether this heap wants a block of `total` bytes advised: its option
    /// is on and the block is large enough (`raw_alloc_headed` then advises
    /// it once, whether or not the global policy covers it too).
    fn advises(self, total: usize) -> bool {
        self.huge_pages && total >= HUGE_PAGE_THRESHOLD
    }
}

/// `CHeap::new(align)` with huge pages off, then [`CHeap::malloc`]: a block
/// of `size` bytes (0 counts as 1) aligned to `max(64, align)`; null if
/// `align` is not a power of two up to 2^30 or the allocation fails.
///
/// ```
/// use mkl_alloc::c_heap;
/// let p = c_heap::malloc(24, 1 << 12);
/// assert!(p as usize % 4096 == 0);
/// assert!(c_heap::malloc(24, 3).is_null());
/// // SAFETY: p is a live c_heap block.
/// unsafe { c_heap::free(p) };
/// ```
pub fn malloc(size: usize, align: usize) -> *mut u8 {
    match CHeap::new(align) {
        Some(heap) => heap.malloc(size),
        None => ptr::null_mut(),
    }
}

/// `CHeap::new(align)` with huge pages off, then [`CHeap::calloc`]: zeroed,
/// and null (never a short block) when `nelem * elsize` overflows.
///
/// ```
/// use mkl_alloc::c_heap;
/// assert!(c_heap::calloc(1 << 40, 1 << 40, 64).is_null()); // 2^80 bytes
/// let p = c_heap::calloc(10, 8, 64);
/// // SAFETY: p is a live c_heap block of 80 zeroed bytes.
/// unsafe {
///     assert_eq!(*p.add(79), 0);
///     c_heap::free(p);
/// }
/// ```
pub fn calloc(nelem: usize, elsize: usize, align: usize) -> *mut u8 {
    match CHeap::new(align) {
        Some(heap) => heap.calloc(nelem, elsize),
        None => ptr::null_mut(),
    }
}

/// Resizes a block to `new_size` bytes (0 counts as 1), keeping its first
/// `min(old, new)` bytes and its alignment. Returns the block (perhaps
/// moved), or null if the allocation failed, and then the old block is
/// untouched and still owned by the caller. A growth to
/// [`HUGE_PAGE_THRESHOLD`] bytes or more of a block from a heap with huge
/// pages on lands on advised memory.
///
/// # Safety
/// `ptr` was returned by this module (and not freed since), so never null
/// (use [`CHeap::realloc`] for C's `realloc(NULL, n)`); after a non-null
/// return only the returned pointer may be used.
///
/// ```
/// use mkl_alloc::c_heap;
/// let p = c_heap::malloc(8, 1 << 16);
/// // SAFETY: p is a live c_heap block of 8 bytes, replaced by q.
/// unsafe {
///     p.write_bytes(9, 8);
///     let q = c_heap::realloc(p, 1 << 20);
///     assert_eq!((q as usize % (1 << 16), *q.add(7)), (0, 9));
///     c_heap::free(q);
/// }
/// ```
pub unsafe fn realloc(ptr: *mut u8, new_size: usize) -> *mut u8 {
    // SAFETY: a live block of this module (caller's contract).
    let (old_cap, tag) = unsafe { read_header(ptr) };
    let align = tag & !HUGE_FLAG;
    let heap = CHeap {
        align,
        huge_pages: tag & HUGE_FLAG != 0,
    };
    let new_cap = capacity(new_size);
    if new_cap == old_cap || (new_cap < old_cap && bin(old_cap, align).is_some()) {
        // Same class, or a cached class shrinking: the block already fits.
        return ptr;
    }
    let Some(new_total) = total_size(new_cap, align) else {
        return ptr::null_mut();
    };
    let cached = bin(old_cap, align).is_some() || bin(new_cap, align).is_some();
    if cached || (new_cap > old_cap && heap.advises(new_total)) {
        // A cached class on either side, or a growth onto advised memory: a
        // fresh block (advised before its first touch), the contents copied,
        // the old block freed (into its bin if it has one).
        let fresh = heap.malloc(new_cap);
        if !fresh.is_null() {
            // SAFETY: distinct live blocks holding old_cap and new_cap bytes;
            // the old one is freed once and not used again.
            unsafe {
                ptr::copy_nonoverlapping(ptr, fresh, old_cap.min(new_cap));
                free(ptr);
            }
        }
        return fresh;
    }
    // SAFETY: the header gives the block's start and size: a live MKL block
    // of align + old_cap bytes at `align`; new_total > 0. The header moves
    // with the contents (it is inside the block).
    let new_block = unsafe { raw_realloc(ptr.sub(align), align + old_cap, new_total, align) };
    if new_block.is_null() {
        return new_block;
    }
    // SAFETY: the resized block holds new_total = align + new_cap bytes.
    unsafe {
        let data = new_block.add(align);
        write_header(data, new_cap, tag);
        data
    }
}

/// Frees a block (into its bin, if it is small and the bin has room);
/// null is ignored, as C's `free`.
///
/// # Safety
/// `ptr` is null or was returned by this module and not freed since; it is
/// not used again.
///
/// ```
/// // SAFETY: null is accepted; the other block is live and freed once.
/// unsafe {
///     mkl_alloc::c_heap::free(core::ptr::null_mut());
///     mkl_alloc::c_heap::free(mkl_alloc::c_heap::malloc(1, 1));
/// }
/// ```
pub unsafe fn free(ptr: *mut u8) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: a live block of this module (caller's contract).
    let (cap, tag) = unsafe { read_header(ptr) };
    let align = tag & !HUGE_FLAG;
    if let Some(bin) = bin(cap, align) {
        if bin.put(ptr) {
            // A free that reaches no MKL call still counts towards the
            // block cache's decay (see `block_cache::TICKS`).
            crate::backing::decay::tick();
            return;
        }
    }
    // SAFETY: the header gives the block's start, size and alignment.
    unsafe { free_block(ptr.sub(align), align + cap) }
}

/// Gives every cached small block back to MKL, from any thread. Blocks
/// freed meanwhile may land in the bins again.
pub(crate) fn release_cached() {
    for bin in BINS.iter().flatten() {
        while let Some(data) = bin.take() {
            // SAFETY: a cached block, now exclusively ours; its header is intact.
            unsafe {
                let (cap, tag) = read_header(data);
                let align = tag & !HUGE_FLAG;
                free_block(data.sub(align), align + cap);
            }
        }
    }
}

/// Frees an MKL block of `total` bytes (a large one's chunk goes to the
/// block cache beneath MKL).
///
/// # Safety
/// A live MKL block from `raw_alloc*`/`raw_realloc` of that size, not used
/// again.
#[inline(always)]
unsafe fn free_block(block: *mut u8, total: usize) {
    // SAFETY: the caller's contract.
    unsafe { raw_free(block, total) }
}

/// The data capacity a request gets: small requests round up to their size
/// class (a multiple of 64), zero counts as one byte.
#[inline(always)]
fn capacity(size: usize) -> usize {
    if size <= SMALL_MAX {
        size.max(1).next_multiple_of(MIN_ALIGN)
    } else {
        size
    }
}

/// Header and data together, or `None` past `isize::MAX`.
#[inline(always)]
fn total_size(cap: usize, align: usize) -> Option<usize> {
    cap.checked_add(align).filter(|&t| t <= isize::MAX as usize)
}

/// The bin of a block with `cap` bytes at `align`, if such blocks are cached.
#[inline(always)]
fn bin(cap: usize, align: usize) -> Option<&'static Bin> {
    if cap > SMALL_MAX || align > BIN_MAX_ALIGN || cap % MIN_ALIGN != 0 {
        return None;
    }
    let a = (align.trailing_zeros() - MIN_ALIGN.trailing_zeros()) as usize;
    BINS.get(a).map(|classes| &classes[cap / MIN_ALIGN - 1])
}

/// # Safety
/// `data` is preceded by at least 16 bytes of its own block.
#[inline(always)]
unsafe fn write_header(data: *mut u8, cap: usize, tag: usize) {
    // SAFETY: the header words lie inside the block, before the data, and
    // are usize-aligned (the data is 64-aligned).
    unsafe {
        let h = data.cast::<usize>().sub(HEADER_WORDS);
        h.write(cap);
        h.add(1).write(tag);
    }
}

/// `(capacity, alignment | flags)` of a block of this module.
///
/// # Safety
/// `data` is a live block of this module.
#[inline(always)]
unsafe fn read_header(data: *mut u8) -> (usize, usize) {
    // SAFETY: as write_header; written when the block was handed out.
    unsafe {
        let h = data.cast::<usize>().sub(HEADER_WORDS);
        (h.read(), h.add(1).read())
    }
}
