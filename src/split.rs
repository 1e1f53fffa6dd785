//! [`MklSplitAllocator`]: small blocks from another allocator (the system
//! allocator by default, or any `GlobalAlloc`: mimalloc, jemalloc), large
//! or over-aligned blocks from MKL.
//!
//! MKL's memory manager is built for numeric buffers. For the small objects
//! most programs are made of it is the wrong tool: measured on the 2-core
//! machine this crate is developed on, `MKL_malloc`+`MKL_free` costs 4-7x
//! glibc's `malloc`+`free` for small blocks at alignment 8, and every live
//! MKL block carries about 100 B more bookkeeping than glibc's, while for
//! large buffers the difference is small next to using them.
//! The split allocator routes each layout to the allocator that serves it
//! best, so it can be the whole program's `#[global_allocator]` without the
//! small-object tax, and every large buffer still comes from MKL aligned to
//! 64 bytes. The small side is a type parameter: a program that already
//! runs on mimalloc or jemalloc keeps their speed on its small objects.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;
use std::alloc::System;

use crate::MklAllocator;
use crate::allocator::{Blocks, allocator_impls, raw_alloc, raw_free};

/// The largest alignment a layout may ask for and still be served by the
/// small side: what glibc's `malloc` gives every block on 64-bit targets,
/// so `System` serves such blocks with plain `malloc` (it falls back to
/// `posix_memalign` only for a block smaller than its alignment). The rule
/// is the same whatever the small side: which blocks are MKL's depends on
/// the layout alone.
///
/// ```
/// use core::alloc::Layout;
/// use mkl_alloc::{MklSplitAllocator, SPLIT_MAX_SMALL_ALIGN};
///
/// let a = MklSplitAllocator;
/// assert!(!a.is_mkl(Layout::from_size_align(64, SPLIT_MAX_SMALL_ALIGN).unwrap()));
/// assert!(a.is_mkl(Layout::from_size_align(64, 2 * SPLIT_MAX_SMALL_ALIGN).unwrap()));
/// ```
pub const SPLIT_MAX_SMALL_ALIGN: usize = 16;

/// The default threshold of [`MklSplitAllocator`](struct@MklSplitAllocator): layouts of at least this
/// many bytes go to MKL.
///
/// Chosen from measurements on the development machine (2-core Xeon, glibc;
/// `cargo run --release --example split_threshold` reproduces them): at
/// alignment 8, one alloc + free costs the system allocator about 9 ns up to
/// 1 KiB and 30 ns above, MKL 40-70 ns at every size; a live block costs
/// about 24 B of bookkeeping with the system allocator and 124 B with MKL.
/// Below 4 KiB, MKL's extra 100 B per block is 2.5 % (at 4 KiB) to 40 %
/// (at 256 B) of the block and its extra ~35 ns per call is a large part of
/// what a program does with a small object; from 4 KiB (512 `f64`s, the
/// size from which 64-byte alignment matters to vectorised code) both are
/// small next to filling the block once, and numeric buffers stay MKL's. On
/// the allocation-heavy workload of `examples/perf/` the split allocator
/// with this threshold runs within a few per cent of `System` in time and
/// peak RSS, where pure MKL is about 1.6x slower and 2.5x larger
/// (docs/performance.md: 1.58x glibc's CPU time).
///
/// ```
/// use core::alloc::Layout;
/// use mkl_alloc::{DEFAULT_SPLIT_THRESHOLD, MklSplitAllocator};
///
/// assert_eq!(DEFAULT_SPLIT_THRESHOLD, 4096);
/// let a: MklSplitAllocator = MklSplitAllocator; // THRESHOLD = DEFAULT_SPLIT_THRESHOLD
/// let below = Layout::from_size_align(DEFAULT_SPLIT_THRESHOLD - 1, 8).unwrap();
/// let at = Layout::from_size_align(DEFAULT_SPLIT_THRESHOLD, 8).unwrap();
/// assert!(!a.is_mkl(below) && a.is_mkl(at));
/// ```
pub const DEFAULT_SPLIT_THRESHOLD: usize = 4096;

/// A size-split allocator: layouts smaller than `THRESHOLD` bytes with an
/// alignment of at most 16 ([`SPLIT_MAX_SMALL_ALIGN`]) are served by the
/// small side `S`, any `GlobalAlloc` ([`std::alloc::System`] by default;
/// mimalloc's `MiMalloc` or jemalloc's `Jemalloc` with
/// [`over`](Self::over)); every other layout is served by MKL exactly as
/// [`MklAllocator`] serves it (aligned to `max(64, align)`).
///
/// `THRESHOLD` defaults to [`DEFAULT_SPLIT_THRESHOLD`] (4 KiB;
/// [`with_threshold`](Self::with_threshold) sets another). Which allocator
/// owns a block is decided from its layout alone, so freeing and resizing
/// route correctly without any bookkeeping. A resize that crosses the
/// threshold moves the block to the other allocator, keeps its contents
/// and frees the old block on its own side. Zeroed blocks are zeroed by
/// the side that serves them (the small side's own `alloc_zeroed`: calloc,
/// mimalloc's zeroed pages). Zero-sized layouts (allocator-api2) reach
/// neither allocator. The small side's frees drive the block cache's decay
/// ([`block_cache`](crate::block_cache)), as MKL's do; the small side is
/// never called inside the crate's fork gates, so its own fork handling
/// (jemalloc's `pthread_atfork` handlers) is its own business.
///
/// The name `MklSplitAllocator` is also a value, as a unit struct's name
/// is: the split over `System` at the default threshold, zero-sized, so
/// `static GLOBAL: MklSplitAllocator = MklSplitAllocator;` and
/// `MklSplitAllocator.with_threshold()` read as for a unit struct. (A
/// struct with a field and type parameters cannot be a unit struct; a
/// constant of the same name, in the value namespace, stands in for one,
/// and is hidden from these docs.)
///
/// As the whole program's allocator:
///
/// ```
/// use mkl_alloc::MklSplitAllocator;
///
/// #[global_allocator]
/// static GLOBAL: MklSplitAllocator = MklSplitAllocator;
///
/// // A large buffer: MKL's, aligned to 64 bytes.
/// let big = vec![0.0f64; 1 << 16];
/// assert_eq!(big.as_ptr() as usize % 64, 0);
/// // Small objects: the system allocator's.
/// let words: Vec<String> = (0..100).map(|i| i.to_string()).collect();
/// assert_eq!(words[42], "42");
/// ```
///
/// Over mimalloc (small objects at mimalloc's speed, numeric buffers on
/// MKL):
///
/// ```
/// use mkl_alloc::MklSplitAllocator;
///
/// #[global_allocator]
/// static GLOBAL: MklSplitAllocator<mimalloc::MiMalloc> =
///     MklSplitAllocator::over(mimalloc::MiMalloc);
///
/// let big = vec![1.0f64; 1 << 16];
/// assert_eq!(big.as_ptr() as usize % 64, 0); // MKL's
/// let words: Vec<String> = (0..100).map(|i| i.to_string()).collect();
/// assert_eq!(words[42], "42");
/// ```
///
/// With another threshold, and for chosen collections through allocator-api2:
///
/// ```
/// use allocator_api2::vec::Vec;
/// use mkl_alloc::MklSplitAllocator;
///
/// type Split64K = MklSplitAllocator<std::alloc::System, 65536>;
/// let mut v: Vec<f64, Split64K> = Vec::new_in(MklSplitAllocator.with_threshold());
/// v.extend((0..100_000).map(f64::from)); // grows from System into MKL
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// assert_eq!(v[99_999], 99_999.0);
/// ```
///
/// allocator-api2's `Allocator` is implemented for every small side that
/// is a zero-sized handle (`System`, `MiMalloc`, `Jemalloc`): an allocator
/// stored inside the value would move with it, and an `Allocator` must not
/// invalidate its blocks when moved. Any other small side is refused when
/// the program is built:
///
/// ```compile_fail,E0080
/// use allocator_api2::alloc::{Allocator, Layout};
/// use core::alloc::GlobalAlloc;
/// use mkl_alloc::MklSplitAllocator;
///
/// struct Tagged(u8); // not zero-sized
/// unsafe impl GlobalAlloc for Tagged {
///     unsafe fn alloc(&self, l: Layout) -> *mut u8 {
///         unsafe { std::alloc::System.alloc(l) }
///     }
///     unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
///         unsafe { std::alloc::System.dealloc(p, l) }
///     }
/// }
/// let a = MklSplitAllocator::over(Tagged(1));
/// let _ = a.allocate(Layout::new::<u64>());
/// ```
#[derive(Clone, Copy, Default)]
pub struct MklSplitAllocator<S = System, const THRESHOLD: usize = DEFAULT_SPLIT_THRESHOLD> {
    /// The allocator of small blocks.
    small: S,
}

/// The split allocator over [`System`] at [`DEFAULT_SPLIT_THRESHOLD`]: the
/// value of the type `MklSplitAllocator` with its defaults, so that
/// `static GLOBAL: MklSplitAllocator = MklSplitAllocator;` reads as it does
/// for a unit struct. It exists only for that, so rustdoc shows one item
/// named `MklSplitAllocator`, the struct, whose docs say so: hidden here.
///
/// ```
/// use mkl_alloc::MklSplitAllocator;
///
/// let a: MklSplitAllocator = MklSplitAllocator;
/// assert_eq!(a, MklSplitAllocator::over(std::alloc::System));
/// assert_eq!(size_of_val(&a), 0);
/// ```
#[allow(non_upper_case_globals)]
#[doc(hidden)]
pub const MklSplitAllocator: MklSplitAllocator = MklSplitAllocator::over(System);

/// Names the small side by its type and the threshold (a small side need
/// not be `Debug`: mimalloc's `MiMalloc` is not).
///
/// ```
/// use mkl_alloc::MklSplitAllocator;
///
/// let s = format!("{:?}", MklSplitAllocator);
/// assert_eq!(s, "MklSplitAllocator { small: \"std::alloc::System\", threshold: 4096 }");
/// ```
impl<S, const THRESHOLD: usize> core::fmt::Debug for MklSplitAllocator<S, THRESHOLD> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MklSplitAllocator")
            .field("small", &core::any::type_name::<S>())
            .field("threshold", &THRESHOLD)
            .finish()
    }
}

/// Every split over `System` at one threshold is the same allocator, so
/// all its values are equal (and hash alike), as for a unit struct.
///
/// ```
/// use mkl_alloc::MklSplitAllocator;
///
/// assert_eq!(MklSplitAllocator, MklSplitAllocator::over(std::alloc::System));
/// ```
impl<const THRESHOLD: usize> PartialEq for MklSplitAllocator<System, THRESHOLD> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<const THRESHOLD: usize> Eq for MklSplitAllocator<System, THRESHOLD> {}

impl<const THRESHOLD: usize> core::hash::Hash for MklSplitAllocator<System, THRESHOLD> {
    fn hash<H: core::hash::Hasher>(&self, _: &mut H) {}
}

impl<S: GlobalAlloc> MklSplitAllocator<S> {
    /// The split allocator whose small blocks come from `small`, at the
    /// default threshold ([`DEFAULT_SPLIT_THRESHOLD`]). A `const fn`, for
    /// `#[global_allocator]` statics.
    ///
    /// ```
    /// use mkl_alloc::MklSplitAllocator;
    ///
    /// #[global_allocator]
    /// static GLOBAL: MklSplitAllocator<mimalloc::MiMalloc> =
    ///     MklSplitAllocator::over(mimalloc::MiMalloc);
    ///
    /// let mut v: Vec<u32> = (0..10).collect(); // mimalloc's
    /// v.extend(0..100_000); // grows into MKL, contents kept
    /// assert_eq!(v.as_ptr() as usize % 64, 0);
    /// assert_eq!(v[9], 9);
    /// ```
    #[inline(always)]
    pub const fn over(small: S) -> Self {
        MklSplitAllocator { small }
    }
}

impl<S, const THRESHOLD: usize> MklSplitAllocator<S, THRESHOLD> {
    /// The threshold in bytes: layouts at least this large go to MKL.
    ///
    /// ```
    /// use mkl_alloc::MklSplitAllocator;
    ///
    /// assert_eq!(MklSplitAllocator::<std::alloc::System, 8192>::THRESHOLD, 8192);
    /// assert_eq!(<MklSplitAllocator>::THRESHOLD, mkl_alloc::DEFAULT_SPLIT_THRESHOLD);
    /// ```
    pub const THRESHOLD: usize = THRESHOLD;

    /// The same split with the threshold `N` (a `const fn`; `N` is usually
    /// inferred from the type asked for).
    ///
    /// ```
    /// use core::alloc::Layout;
    /// use mkl_alloc::MklSplitAllocator;
    ///
    /// static GLOBAL64K: MklSplitAllocator<std::alloc::System, 65536> =
    ///     MklSplitAllocator.with_threshold();
    /// assert!(!GLOBAL64K.is_mkl(Layout::from_size_align(10_000, 8).unwrap()));
    /// assert!(MklSplitAllocator.is_mkl(Layout::from_size_align(10_000, 8).unwrap()));
    /// ```
    #[inline(always)]
    pub const fn with_threshold<const N: usize>(self) -> MklSplitAllocator<S, N> {
        // A const fn cannot drop `self` (S may have a destructor), even
        // once its one field is moved out: move the field out of a
        // ManuallyDrop instead.
        let this = core::mem::ManuallyDrop::new(self);
        let this: *const Self = (&raw const this).cast();
        // SAFETY: `this` points to a live value that is never dropped nor
        // used again, so its field is moved out exactly once.
        let small = unsafe { ptr::read(&raw const (*this).small) };
        MklSplitAllocator { small }
    }

    /// Whether a block of `layout` is (or would be) served by MKL rather
    /// than the small side. Zero-sized layouts report what their size and
    /// alignment say, but are never passed to either allocator.
    ///
    /// ```
    /// use core::alloc::Layout;
    /// use mkl_alloc::MklSplitAllocator;
    ///
    /// let a = MklSplitAllocator; // threshold 4096
    /// assert!(!a.is_mkl(Layout::from_size_align(4095, 16).unwrap()));
    /// assert!(a.is_mkl(Layout::from_size_align(4096, 8).unwrap()));
    /// assert!(a.is_mkl(Layout::from_size_align(8, 32).unwrap()));
    /// ```
    #[inline(always)]
    pub const fn is_mkl(&self, layout: Layout) -> bool {
        is_mkl::<THRESHOLD>(layout)
    }

    /// Stops the build where allocator-api2's `Allocator` is used with a
    /// small side that is not zero-sized (see the type's documentation).
    const SMALL_SIDE_IS_A_HANDLE: () = assert!(
        size_of::<S>() == 0,
        "MklSplitAllocator's allocator-api2 Allocator needs a zero-sized small side \
         (a handle such as System, MiMalloc or Jemalloc): an allocator stored in the \
         value would move with it, and an Allocator's blocks must outlive its moves"
    );
}

#[inline(always)]
const fn is_mkl<const THRESHOLD: usize>(layout: Layout) -> bool {
    layout.size() >= THRESHOLD || layout.align() > SPLIT_MAX_SMALL_ALIGN
}

/// Moves a block between the two allocators: allocate `new` from the other
/// one (through `alloc_new`), copy `min(old, new)` bytes, free the old block
/// (through `free_old`). On failure returns null with the old block intact.
///
/// # Safety
/// `ptr` is a live block of `old_size` bytes that `free_old` may free;
/// `alloc_new` returns null or a live block of at least `new_size` bytes.
#[inline(always)]
unsafe fn move_block(
    ptr: *mut u8,
    old_size: usize,
    new_size: usize,
    alloc_new: impl FnOnce() -> *mut u8,
    free_old: impl FnOnce(*mut u8),
) -> *mut u8 {
    let fresh = alloc_new();
    if !fresh.is_null() {
        // SAFETY: both blocks are live, distinct (the new one was allocated
        // while the old one is still live) and hold at least
        // min(old_size, new_size) bytes.
        unsafe { ptr::copy_nonoverlapping(ptr, fresh, old_size.min(new_size)) };
        free_old(ptr);
    }
    fresh
}

// SAFETY: each block is allocated and freed by the same allocator, because
// the route is a pure function of the layout and GlobalAlloc's contract hands
// dealloc/realloc the layout the block was allocated with. The small side is
// a GlobalAlloc and gets only layouts it must honour (any GlobalAlloc honours
// every layout), each block freed or resized with the layout it allocated it
// with (see resize_split); MKL blocks are aligned to max(64, align) or null.
// A realloc crossing the threshold allocates the new block from the other
// allocator, copies, and frees the old one only on success, so null always
// leaves the old block intact. No crate lock or fork gate is held while the
// small side runs.
unsafe impl<S: GlobalAlloc, const THRESHOLD: usize> GlobalAlloc
    for MklSplitAllocator<S, THRESHOLD>
{
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_mkl::<THRESHOLD>(layout) {
            // SAFETY: layout.size() > 0 (GlobalAlloc's contract); the
            // alignment of a Layout is a power of two.
            unsafe { mkl_side::alloc(layout.size(), layout.align()) }
        } else {
            // SAFETY: layout.size() > 0 (GlobalAlloc's contract).
            unsafe { small_side::alloc(&self.small, layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_mkl::<THRESHOLD>(layout) {
            // SAFETY: as in alloc.
            unsafe { mkl_side::alloc_zeroed(layout.size(), layout.align()) }
        } else {
            // SAFETY: as in alloc.
            unsafe { small_side::alloc_zeroed(&self.small, layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_mkl::<THRESHOLD>(layout) {
            // SAFETY: the block was allocated with this layout (caller's
            // contract), hence by MKL, and is freed once.
            unsafe { mkl_side::free(ptr, layout.size()) }
        } else {
            // SAFETY: the block was allocated with this layout, hence by
            // the small side with this same layout; freed once.
            unsafe { small_side::free(&self.small, ptr, layout) }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // The alignment is kept, so a small block that stays under the
        // threshold stays small: the small side's own realloc, tail-called.
        if !is_mkl::<THRESHOLD>(layout) && new_size < THRESHOLD {
            // SAFETY: a live block of `layout`, hence `self.small`'s;
            // new_size > 0 (GlobalAlloc::realloc's contract).
            return unsafe { self.small.realloc(ptr, layout, new_size) };
        }
        // SAFETY: new_size > 0 and, rounded up to the alignment, does not
        // overflow isize (GlobalAlloc::realloc's contract).
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a live block of `layout` from this allocator, whose small
        // blocks are `self.small`'s; both sizes > 0.
        unsafe { resize_mkl_or_across::<THRESHOLD, S>(&self.small, ptr, layout, new) }
    }
}

/// The MKL side of [`MklSplitAllocator`]'s `GlobalAlloc` methods, out of
/// line. Inlined, MKL's path (the fork gate, the block cache, the call
/// through MKL's entry) makes every call of the split save registers on
/// entry, on the small side's path too: out of line, a small block costs
/// the split its routing test and a tail call, and an MKL block one direct
/// call more next to MKL's tens of nanoseconds. The split's instructions
/// over its small side alone on the service workload
/// (`scripts/instructions.sh`): +3.8 % to +2.8 % over jemalloc, +5.3 % to
/// +2.9 % over mimalloc, with the decay countdown's own trim.
mod mkl_side {
    use crate::allocator::{raw_alloc, raw_alloc_zeroed, raw_free};

    /// # Safety
    /// As [`raw_alloc`]: `size > 0`, `align` a power of two.
    #[inline(never)]
    pub(super) unsafe fn alloc(size: usize, align: usize) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        unsafe { raw_alloc(size, align) }
    }

    /// # Safety
    /// As [`raw_alloc_zeroed`]: `size > 0`, `align` a power of two.
    #[inline(never)]
    pub(super) unsafe fn alloc_zeroed(size: usize, align: usize) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        unsafe { raw_alloc_zeroed(size, align) }
    }

    /// # Safety
    /// As [`raw_free`]: a live MKL block of `size` bytes, freed once.
    #[inline(never)]
    pub(super) unsafe fn free(ptr: *mut u8, size: usize) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { raw_free(ptr, size) }
    }
}

/// The small side's free, out of line: the block cache's decay check, then
/// the small side's own free, tail-called.
///
/// Why out of line: `dealloc` is inlined into every place a program frees
/// (it is generic), so whatever it holds makes each of those callers
/// bigger. With the check inlined there, callers that LLVM inlined before
/// stopped being inlined into theirs: on the service workload, BTreeMap's
/// `deallocating_next` became a call returning its 48-byte result through
/// memory, whose reload stalled (a store forwarded to a wider load), and
/// the split over mimalloc took 1.15-1.18x mimalloc's user time for a
/// handful of instructions. Inlined now is what the split needs anyway
/// (the routing test and one call on either side); the check costs one
/// direct call and a jump here (docs/performance.md, "The small free's
/// check, out of line").
mod small_side {
    use core::alloc::{GlobalAlloc, Layout};

    use crate::backing::medium;

    /// A small block: the small side's `alloc`, tail-called, after the
    /// decay if the program let go of its medium blocks (one relaxed load;
    /// see `backing::medium`): so that one allocation after an idle pause
    /// gives them back, whichever side it goes to.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`: `layout.size() > 0`.
    ///
    /// The decay is a call of its own ([`alloc_after_let_go`]), so that
    /// this path holds nothing across a call: no registers saved on entry
    /// (with the decay inline, `layout` was kept in two saved registers
    /// across it: three pushes and two pops on every small allocation).
    #[inline(never)]
    pub(super) unsafe fn alloc<S: GlobalAlloc>(small: &S, layout: Layout) -> *mut u8 {
        if medium::let_go_pending() {
            // SAFETY: the caller's contract.
            return unsafe { alloc_after_let_go(small, layout, false) };
        }
        // SAFETY: the caller's contract.
        unsafe { small.alloc(layout) }
    }

    /// As [`alloc`], zeroed.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc_zeroed`: `layout.size() > 0`.
    #[inline(never)]
    pub(super) unsafe fn alloc_zeroed<S: GlobalAlloc>(small: &S, layout: Layout) -> *mut u8 {
        if medium::let_go_pending() {
            // SAFETY: the caller's contract.
            return unsafe { alloc_after_let_go(small, layout, true) };
        }
        // SAFETY: the caller's contract.
        unsafe { small.alloc_zeroed(layout) }
    }

    /// A small allocation while the program has let go of its medium
    /// blocks: the decay point first (see `backing::medium`), then the
    /// small side's allocation.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`: `layout.size() > 0`.
    #[cold]
    #[inline(never)]
    unsafe fn alloc_after_let_go<S: GlobalAlloc>(
        small: &S,
        layout: Layout,
        zeroed: bool,
    ) -> *mut u8 {
        medium::at_allocation();
        if zeroed {
            // SAFETY: the caller's contract.
            unsafe { small.alloc_zeroed(layout) }
        } else {
            // SAFETY: the caller's contract.
            unsafe { small.alloc(layout) }
        }
    }

    /// Frees a small block: the small side's `dealloc`, and every
    /// [`TICKS`](crate::block_cache::TICKS)th small free of a thread
    /// without the background thread the block cache's decay first.
    ///
    /// # Safety
    /// `ptr` is a live block that `small` allocated with `layout`, freed
    /// once.
    #[inline(never)]
    pub(super) unsafe fn free<S: GlobalAlloc>(small: &S, ptr: *mut u8, layout: Layout) {
        if crate::backing::decay::tick_due() {
            // The small side's frees count towards the block cache's decay
            // too (a thread-local countdown; see `block_cache::TICKS`); the
            // decay returns before the small side is called, holding
            // nothing. With the background decay thread running the
            // countdown is skipped: one relaxed load.
            // SAFETY: the caller's contract.
            unsafe { free_after_decay(small, ptr, layout) }
        } else {
            // SAFETY: the caller's contract.
            unsafe { small.dealloc(ptr, layout) }
        }
    }

    /// Every [`TICKS`](crate::block_cache::TICKS)th small free of a
    /// thread: the block cache's decay, then the free.
    ///
    /// # Safety
    /// As [`free`].
    #[cold]
    #[inline(never)]
    unsafe fn free_after_decay<S: GlobalAlloc>(small: &S, ptr: *mut u8, layout: Layout) {
        // A child whose parent ran the background thread starts its own
        // here (outside every lock; spawning allocates, re-entering this
        // allocator, which is fine: nothing is held).
        crate::background::resume();
        crate::backing::decay::idle();
        // SAFETY: the caller's contract.
        unsafe { small.dealloc(ptr, layout) }
    }
}

/// [`resize_split`] out of line, for `GlobalAlloc::realloc` once a resize
/// within the small side has been ruled out (see [`mkl_side`]).
///
/// # Safety
/// As [`resize_split`].
#[inline(never)]
unsafe fn resize_mkl_or_across<const THRESHOLD: usize, S: GlobalAlloc>(
    small: &S,
    p: *mut u8,
    old: Layout,
    new: Layout,
) -> *mut u8 {
    // SAFETY: the caller's contract, forwarded.
    unsafe { resize_split::<THRESHOLD, S>(small, p, old, new) }
}

// SAFETY: each block is allocated, resized and freed by the allocator its
// layout routes to (a pure function of the layout; allocator-api2 hands back
// a layout that fits the block, and the size returned is the size asked);
// the small side honours every layout it gets (a GlobalAlloc), MKL blocks
// are aligned to max(64, align); a block moving across the threshold is
// copied and the old one freed only once the new one exists. A small block
// is handed to the small side with the very layout it was allocated with
// (`resize_split` reallocates in place only at an unchanged alignment).
// Copies and moves are the same allocator: every method first evaluates
// SMALL_SIDE_IS_A_HANDLE, which stops the build unless the small side is
// zero-sized, so no block lives in the value (a zero-sized GlobalAlloc's
// state is outside it: System, mimalloc and jemalloc keep theirs
// process-wide).
unsafe impl<S: GlobalAlloc, const THRESHOLD: usize> Blocks for MklSplitAllocator<S, THRESHOLD> {
    #[inline(always)]
    unsafe fn alloc_block(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let () = Self::SMALL_SIDE_IS_A_HANDLE;
        // SAFETY: layout.size() > 0 (trait contract).
        unsafe {
            if zeroed {
                GlobalAlloc::alloc_zeroed(self, layout)
            } else {
                GlobalAlloc::alloc(self, layout)
            }
        }
    }

    #[inline(always)]
    unsafe fn free_block(&self, ptr: *mut u8, layout: Layout) {
        let () = Self::SMALL_SIDE_IS_A_HANDLE;
        // SAFETY: a live block of `layout` from this allocator (trait contract).
        unsafe { GlobalAlloc::dealloc(self, ptr, layout) }
    }

    #[inline(always)]
    unsafe fn resize_block(&self, p: *mut u8, old: Layout, new: Layout) -> *mut u8 {
        let () = Self::SMALL_SIDE_IS_A_HANDLE;
        // SAFETY: the trait's contract, forwarded; small blocks are
        // `self.small`'s.
        unsafe { resize_split::<THRESHOLD, S>(&self.small, p, old, new) }
    }
}

/// [`MklSplitAllocator`]'s resize, with the allocator of small blocks as a
/// parameter (the small side in the allocator; a layout-checking wrapper
/// around `System` in the unit tests below).
///
/// Every small block is freed with the layout it was allocated with:
/// `GlobalAlloc::realloc` keeps the old alignment, so it is used only when
/// the new layout has the same alignment (the block is then exactly a block
/// of `new`); any other change of alignment moves the block to a fresh one
/// allocated with `new`.
///
/// # Safety
/// `p` is a live block of `old` from the split allocator whose small blocks
/// come from `small`; both sizes > 0.
#[inline(always)]
unsafe fn resize_split<const THRESHOLD: usize, S: GlobalAlloc>(
    small: &S,
    p: *mut u8,
    old: Layout,
    new: Layout,
) -> *mut u8 {
    match (is_mkl::<THRESHOLD>(old), is_mkl::<THRESHOLD>(new)) {
        // SAFETY: a live, non-zero-sized MKL block of `old`, allocated
        // exactly as MklAllocator allocates (which also handles a stricter
        // new alignment); new.size() > 0.
        (true, true) => unsafe { MklAllocator.resize_block(p, old, new) },
        // Both small, same alignment: realloc gives a block of
        // (new.size(), old.align()) = `new`, the layout it is later freed with.
        (false, false) if new.align() == old.align() => {
            // SAFETY: a live `small` block of `old`; new.size() > 0.
            unsafe { small.realloc(p, old, new.size()) }
        }
        // Both small, another alignment (stricter, or looser: freeing a
        // realloc'd block with the looser `new` would break GlobalAlloc's
        // same-layout rule): move to a fresh block of `new`.
        // SAFETY: a live `small` block of `old` moves to a fresh block of
        // `new` (non-zero size), freed once with `old` after the copy.
        (false, false) => unsafe {
            move_block(
                p,
                old.size(),
                new.size(),
                || small.alloc(new),
                |q| small.dealloc(q, old),
            )
        },
        // SAFETY: a live MKL block moves to `small` (non-zero `new`), freed
        // once after the copy.
        (true, false) => unsafe {
            move_block(
                p,
                old.size(),
                new.size(),
                || small.alloc(new),
                |q| raw_free(q, old.size()),
            )
        },
        // SAFETY: a live `small` block of `old` moves to MKL (non-zero
        // size, power-of-two alignment), freed once with `old` after the copy.
        (false, true) => unsafe {
            move_block(
                p,
                old.size(),
                new.size(),
                || raw_alloc(new.size(), new.align()),
                |q| small.dealloc(q, old),
            )
        },
    }
}

allocator_impls!([S: GlobalAlloc, const THRESHOLD: usize] MklSplitAllocator<S, THRESHOLD>);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// `System`, checking GlobalAlloc's rule that a block is freed (or
    /// reallocated) with the layout it was allocated with. `realloc` is the
    /// trait's default (alloc, copy, dealloc), so a reallocated block is
    /// recorded with the layout `realloc` really gives it: the new size at
    /// the *old* alignment.
    struct LayoutChecked {
        live: Mutex<HashMap<usize, Layout>>,
    }

    impl LayoutChecked {
        fn new() -> Self {
            Self {
                live: Mutex::new(HashMap::new()),
            }
        }

        fn live_blocks(&self) -> usize {
            self.live.lock().unwrap().len()
        }
    }

    // SAFETY: forwards to System; the map only records and checks layouts.
    unsafe impl GlobalAlloc for LayoutChecked {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's alloc contract, forwarded.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                self.live.lock().unwrap().insert(p as usize, layout);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            let recorded = self.live.lock().unwrap().remove(&(ptr as usize));
            assert_eq!(
                recorded,
                Some(layout),
                "block {ptr:?} freed with {layout:?}, allocated with {recorded:?}"
            );
            // SAFETY: a live System block of this very layout (checked).
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// A small block resized to a smaller alignment (and to the same, and a
    /// stricter one) is freed, at the end, with the layout it was
    /// allocated with, and keeps its contents.
    #[test]
    fn small_blocks_keep_their_layout_through_a_change_of_alignment() {
        const T: usize = DEFAULT_SPLIT_THRESHOLD;
        let small = LayoutChecked::new();
        let l = |size, align| Layout::from_size_align(size, align).unwrap();
        for (old, new) in [
            (l(64, 16), l(32, 8)),  // shrink, looser alignment
            (l(64, 16), l(128, 1)), // grow, looser alignment
            (l(64, 8), l(100, 8)),  // same alignment: realloc
            (l(64, 4), l(48, 16)),  // stricter alignment
        ] {
            // SAFETY: old.size() > 0; the block is written within its size,
            // resized as a live block of `old`, and freed once with `new`,
            // the layout the split allocator's caller would hand back.
            unsafe {
                let p = small.alloc(old);
                assert!(!p.is_null());
                for i in 0..old.size() {
                    p.add(i).write(i as u8);
                }
                let q = resize_split::<T, _>(&small, p, old, new);
                assert!(!q.is_null());
                assert_eq!(q as usize % new.align(), 0, "{old:?} -> {new:?}");
                for i in 0..old.size().min(new.size()) {
                    assert_eq!(q.add(i).read(), i as u8, "{old:?} -> {new:?}");
                }
                small.dealloc(q, new);
            }
        }
        assert_eq!(small.live_blocks(), 0);
    }
}
