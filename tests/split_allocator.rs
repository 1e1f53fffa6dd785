//! `MklSplitAllocator` as a value, over each small side (System, mimalloc,
//! jemalloc): routing by layout, every threshold crossing of realloc / grow
//! / shrink (both ways), alignment, contents, zeroing, and which side holds
//! each block: MKL's own statistics (`MKL_Mem_Stat`) for MKL's, and the
//! small side's live blocks, recorded by a wrapper around it (`Checked`),
//! which also checks that every block it is handed back is one of its own,
//! with the layout it was allocated with.
//!
//! MKL's statistics and the wrapper's record are process-wide, so every
//! test holds `serial()`; the checks are deltas around the test's own
//! blocks. Under Miri (no foreign code) only the System side runs.

mod common;

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::alloc::System;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use allocator_api2::alloc::Allocator;
use mkl_alloc::{DEFAULT_SPLIT_THRESHOLD, MklSplitAllocator, manager};

const T: usize = DEFAULT_SPLIT_THRESHOLD;
/// A large block, filled and checked byte by byte: 64 KiB under Miri
/// (interpreted; still 16 times the threshold), else 1 MiB.
const BIG: usize = if cfg!(miri) { 1 << 16 } else { 1 << 20 };

/// A small side under test: the allocator and how to make its handle.
trait Side: GlobalAlloc + Sync + 'static {
    fn handle() -> Self;
}

impl Side for System {
    fn handle() -> Self {
        System
    }
}

#[cfg(not(miri))]
impl Side for ::mimalloc::MiMalloc {
    fn handle() -> Self {
        ::mimalloc::MiMalloc
    }
}

#[cfg(all(unix, not(miri)))]
impl Side for ::tikv_jemallocator::Jemalloc {
    fn handle() -> Self {
        ::tikv_jemallocator::Jemalloc
    }
}

/// What `Checked` knows of a live small block: its layout, and whether it
/// came from the small side's own `alloc_zeroed`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Small {
    layout: Layout,
    zeroed: bool,
}

/// The live blocks of every `Checked` side, by address (one side runs at
/// a time: `serial()`).
static LIVE: Mutex<Option<HashMap<usize, Small>>> = Mutex::new(None);

fn live() -> MutexGuard<'static, Option<HashMap<usize, Small>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The small side `X`, forwarding every call to `X` itself (its own
/// `alloc_zeroed` and `realloc` included) and recording its live blocks.
/// A zero-sized handle when `X` is one, as allocator-api2's impl needs.
struct Checked<X>(X);

// SAFETY: every call is forwarded to X with the caller's arguments; the
// record only observes (it allocates through the test's global allocator,
// System, never through X).
unsafe impl<X: GlobalAlloc> GlobalAlloc for Checked<X> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's alloc contract, forwarded.
        let p = unsafe { self.0.alloc(layout) };
        record(p, layout, false);
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's alloc contract, forwarded.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        record(p, layout, true);
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        forget(ptr, layout);
        // SAFETY: a live block of X allocated with `layout` (checked).
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        forget(ptr, layout);
        // SAFETY: a live block of X allocated with `layout` (checked);
        // new_size per the caller's contract.
        let q = unsafe { self.0.realloc(ptr, layout, new_size) };
        let new = Layout::from_size_align(new_size, layout.align()).unwrap();
        if q.is_null() {
            record(ptr, layout, false); // the old block is still live
        } else {
            record(q, new, false);
        }
        q
    }
}

fn record(p: *mut u8, layout: Layout, zeroed: bool) {
    if !p.is_null() {
        let old = live()
            .get_or_insert_with(HashMap::new)
            .insert(p as usize, Small { layout, zeroed });
        assert_eq!(old, None, "the small side handed out {p:?} twice");
    }
}

#[track_caller]
fn forget(p: *mut u8, layout: Layout) {
    let rec = live()
        .get_or_insert_with(HashMap::new)
        .remove(&(p as usize));
    match rec {
        Some(r) => assert_eq!(
            r.layout, layout,
            "small block {p:?} handed back with {layout:?}, allocated with {:?}",
            r.layout
        ),
        None => panic!("{p:?} ({layout:?}) handed to the small side: not one of its blocks"),
    }
}

/// The small side's live blocks.
fn small_blocks() -> usize {
    live().as_ref().map_or(0, HashMap::len)
}

/// The record of a live small block, if `p` is one.
fn small_block(p: *const u8) -> Option<Small> {
    live().as_ref().and_then(|m| m.get(&(p as usize)).copied())
}

type Split<X> = MklSplitAllocator<Checked<X>>;

fn split<X: Side>() -> Split<X> {
    MklSplitAllocator::over(Checked(X::handle()))
}

fn serial() -> MutexGuard<'static, ()> {
    // This binary pins MKL's own counts block for block; the block cache
    // (on by default) keeps freed large blocks, counted by MKL, so it is
    // off here (tests/block_cache.rs covers it).
    mkl_alloc::block_cache::disable();
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

/// Where the blocks are: MKL's live bytes and blocks, the small side's
/// live blocks.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Where {
    mkl_bytes: u64,
    mkl_blocks: u64,
    small: usize,
}

fn now() -> Where {
    let s = manager::stats();
    Where {
        mkl_bytes: s.bytes,
        mkl_blocks: s.buffers,
        small: small_blocks(),
    }
}

/// Asserts that `p` is one more live MKL block, of at least `size` bytes
/// and aligned to 64, than at `base`, and not the small side's.
#[track_caller]
fn assert_mkl_block(base: Where, p: *const u8, size: usize) {
    let now = now();
    assert_eq!(
        (now.mkl_blocks, now.small),
        (base.mkl_blocks + 1, base.small),
        "expected one more MKL block: {base:?} -> {now:?}"
    );
    assert!(
        now.mkl_bytes >= base.mkl_bytes + size as u64,
        "expected at least {size} more MKL bytes: {base:?} -> {now:?}"
    );
    assert_eq!(p as usize % 64, 0, "MKL block {p:?} not aligned to 64");
    assert_eq!(small_block(p), None, "{p:?} is the small side's");
}

/// Asserts that `p` is one more live block of the small side, of `layout`,
/// than at `base`, and that MKL's statistics did not move.
#[track_caller]
fn assert_small_block(base: Where, p: *const u8, layout: Layout) {
    let now = now();
    assert_eq!(
        (now.mkl_bytes, now.mkl_blocks, now.small),
        (base.mkl_bytes, base.mkl_blocks, base.small + 1),
        "expected one more small block and no MKL block: {base:?} -> {now:?}"
    );
    assert_eq!(small_block(p).map(|r| r.layout), Some(layout), "{p:?}");
    assert_eq!(p as usize % layout.align(), 0);
}

#[track_caller]
fn assert_back_to(base: Where) {
    assert_eq!(
        now(),
        base,
        "a block was not freed, or freed on the wrong side"
    );
}

fn pattern(seed: u8) -> impl Fn(u8) -> u8 {
    move |i| seed.wrapping_add(i).wrapping_mul(31)
}

fn fill(p: *mut u8, n: usize, seed: u8) {
    // SAFETY: the caller's block holds n bytes.
    unsafe { common::fill(p, n, pattern(seed)) };
}

#[track_caller]
fn check(p: *const u8, n: usize, seed: u8) {
    // SAFETY: the caller's block holds at least n initialised bytes.
    unsafe { common::check(p, n, pattern(seed)) };
}

fn small_layouts_go_to_the_small_side<X: Side>() {
    let _g = serial();
    let a = split::<X>();
    for size in [1, 7, 8, 16, 24, 100, 1000, T - 1] {
        for align in [1, 2, 4, 8, 16] {
            let l = layout(size, align);
            assert!(!a.is_mkl(l));
            let base = now();
            // SAFETY: non-zero size.
            let p = unsafe { a.alloc(l) };
            assert!(!p.is_null());
            assert_small_block(base, p, l);
            fill(p, size, 3);
            check(p, size, 3);
            // SAFETY: allocated above with `l`.
            unsafe { a.dealloc(p, l) };
            assert_back_to(base);
        }
    }
}

fn large_or_over_aligned_layouts_go_to_mkl_aligned_to_64<X: Side>() {
    let _g = serial();
    let a = split::<X>();
    let cases = [
        (T, 1),
        (T, 16),
        (T + 1, 8),
        (BIG, 8),
        (1, 32),
        (24, 64),
        (100, 128),
        (T - 1, 4096),
        (T, 1 << 16),
    ];
    for (size, align) in cases {
        let l = layout(size, align);
        assert!(a.is_mkl(l), "{l:?}");
        let base = now();
        // SAFETY: non-zero size.
        let p = unsafe { a.alloc(l) };
        assert!(!p.is_null());
        assert_mkl_block(base, p, size);
        assert_eq!(p as usize % align, 0, "{l:?} not aligned to its alignment");
        fill(p, size, 5);
        check(p, size, 5);
        // SAFETY: allocated above with `l`.
        unsafe { a.dealloc(p, l) };
        assert_eq!(
            now().mkl_blocks,
            base.mkl_blocks,
            "{l:?}: the MKL block was not freed"
        );
        assert_eq!(now().small, base.small);
    }
}

/// Both sides' zeroing, through both interfaces; a small block's zeroing is
/// the small side's own `alloc_zeroed` (calloc, mimalloc's zeroed pages),
/// not an allocation written over by the split.
fn alloc_zeroed_is_zeroed_on_both_sides_by_each_side<X: Side>() {
    let _g = serial();
    let a = split::<X>();
    for (size, align) in [(100, 8), (T - 1, 16), (T, 8), (BIG, 64), (48, 32)] {
        let l = layout(size, align);
        // Dirty the small side's free lists with this size first, so that
        // a block that comes back unzeroed is seen.
        // SAFETY: non-zero size; the block is filled and freed with `l`.
        unsafe {
            let d = a.alloc(l);
            fill(d, size, 0xa5);
            a.dealloc(d, l);
        }
        for api in [false, true] {
            let base = now();
            let p: *mut u8 = if api {
                a.allocate_zeroed(l).unwrap().cast().as_ptr()
            } else {
                // SAFETY: non-zero size.
                unsafe { a.alloc_zeroed(l) }
            };
            assert!(!p.is_null());
            if a.is_mkl(l) {
                assert_mkl_block(base, p, size);
            } else {
                assert_small_block(base, p, l);
                assert!(
                    small_block(p).unwrap().zeroed,
                    "{l:?}: not the small side's own alloc_zeroed"
                );
            }
            // SAFETY: p holds `size` bytes.
            let bytes = unsafe { core::slice::from_raw_parts(p, size) };
            assert!(bytes.iter().all(|&b| b == 0), "{l:?}: not zeroed");
            // SAFETY: allocated above with `l`.
            unsafe { a.dealloc(p, l) };
            assert_back_to(base);
        }
    }
}

/// GlobalAlloc::realloc through every pair of sides, growing and shrinking.
fn global_realloc_crosses_the_threshold_both_ways_keeping_contents<X: Side>() {
    let _g = serial();
    let a = split::<X>();
    // (from, to): small->small up, small->small down, small->large,
    // large->large up, large->large down, large->small, and the exact edges.
    let steps = [
        (10, 100),
        (100, 50),
        (50, T),
        (T, 3 * T),
        (3 * T, 2 * T),
        (2 * T, T - 1),
        (T - 1, T),
        (T, T - 1),
        (T - 1, BIG),
        (BIG, 1),
    ];
    for align in [1, 8, 16] {
        let base = now();
        let mut l = layout(steps[0].0, align);
        // SAFETY: non-zero size.
        let mut p = unsafe { a.alloc(l) };
        assert!(!p.is_null());
        fill(p, l.size(), 9);
        for (from, to) in steps {
            assert_eq!(l.size(), from);
            let kept = from.min(to);
            // SAFETY: p is a live block of `l` from `a`; `to` > 0.
            let q = unsafe { a.realloc(p, l, to) };
            assert!(!q.is_null(), "realloc {from} -> {to} failed");
            l = layout(to, align);
            check(q, kept, 9);
            // The old block is gone from its own side: one block is live.
            if a.is_mkl(l) {
                assert_mkl_block(base, q, to);
            } else {
                assert_small_block(base, q, l);
            }
            // Refill so the next step checks bytes written on this side.
            fill(q, to, 9);
            p = q;
        }
        // SAFETY: live block of `l`.
        unsafe { a.dealloc(p, l) };
        assert_back_to(base);
    }
}

/// allocator-api2 grow / grow_zeroed / shrink through every pair of sides,
/// including a change of alignment that alone moves a small block to MKL.
fn grow_and_shrink_cross_the_threshold_both_ways_keeping_contents<X: Side>() {
    let _g = serial();
    let a = split::<X>();
    let steps: [(Layout, Layout); 12] = [
        (layout(16, 8), layout(200, 8)),       // small -> small, grow
        (layout(200, 8), layout(T + 8, 8)),    // small -> large, grow
        (layout(T + 8, 8), layout(4 * T, 8)),  // large -> large, grow
        (layout(4 * T, 8), layout(2 * T, 8)),  // large -> large, shrink
        (layout(2 * T, 8), layout(300, 8)),    // large -> small, shrink
        (layout(300, 8), layout(300, 64)),     // small -> MKL by alignment
        (layout(300, 64), layout(300, 8)),     // MKL -> small by alignment
        (layout(300, 8), layout(100, 8)),      // small -> small, shrink
        (layout(100, 8), layout(200, 16)),     // small -> small, stricter align
        (layout(200, 16), layout(150, 4)),     // small -> small, looser align
        (layout(150, 4), layout(T, 128)),      // small -> large, stricter align
        (layout(T, 128), layout(2 * T, 4096)), // large -> large, stricter align
    ];
    let base = now();
    let first = steps[0].0;
    let mut p: NonNull<u8> = a.allocate(first).unwrap().cast();
    fill(p.as_ptr(), first.size(), 11);
    for (old, new) in steps {
        let kept = old.size().min(new.size());
        let q = if new.size() >= old.size() {
            // SAFETY: p is a live block of `old`; new is at least as large.
            unsafe { a.grow(p, old, new) }
        } else {
            // SAFETY: p is a live block of `old`; new is smaller.
            unsafe { a.shrink(p, old, new) }
        }
        .unwrap_or_else(|_| panic!("{old:?} -> {new:?} failed"));
        assert_eq!(q.len(), new.size());
        let q: NonNull<u8> = q.cast();
        check(q.as_ptr(), kept, 11);
        assert_eq!(q.as_ptr() as usize % new.align(), 0, "{old:?} -> {new:?}");
        if a.is_mkl(new) {
            assert_mkl_block(base, q.as_ptr(), new.size());
        } else {
            assert_small_block(base, q.as_ptr(), new);
        }
        fill(q.as_ptr(), new.size(), 11);
        p = q;
    }
    // SAFETY: live block of the last step's new layout.
    unsafe { a.deallocate(p, steps[steps.len() - 1].1) };
    assert_back_to(base);

    // grow_zeroed across the threshold zeroes exactly the tail.
    for (old, new) in [
        (layout(100, 8), layout(200, 8)),
        (layout(100, 8), layout(T * 2, 8)),
        (layout(T, 8), layout(T * 2, 8)),
    ] {
        let p: NonNull<u8> = a.allocate(old).unwrap().cast();
        fill(p.as_ptr(), old.size(), 13);
        // SAFETY: live block of `old`; new is larger.
        let q: NonNull<u8> = unsafe { a.grow_zeroed(p, old, new) }.unwrap().cast();
        check(q.as_ptr(), old.size(), 13);
        // SAFETY: q holds new.size() bytes.
        let tail = unsafe { core::slice::from_raw_parts(q.as_ptr(), new.size()) };
        assert!(tail[old.size()..].iter().all(|&b| b == 0));
        // SAFETY: live block of `new`.
        unsafe { a.deallocate(q, new) };
    }
    assert_back_to(base);
}

fn zero_sized_layouts_reach_neither_allocator<X: Side>() {
    let _g = serial();
    let a = split::<X>();
    let base = now();
    for align in [1, 8, 64, 4096] {
        let z = layout(0, align);
        let p = a.allocate(z).unwrap();
        assert_eq!(p.len(), 0);
        assert_eq!(p.cast::<u8>().as_ptr() as usize % align, 0);
        let p = a.allocate_zeroed(z).unwrap();
        // SAFETY: a zero-sized block of `z`; never passed to either side.
        unsafe { a.deallocate(p.cast(), z) };
    }
    assert_back_to(base);
    // Growing from zero allocates; shrinking to zero frees.
    let z = layout(0, 8);
    let p = a.allocate(z).unwrap().cast();
    // SAFETY: zero-sized block of `z`; grows to a non-zero MKL layout.
    let q = unsafe { a.grow(p, z, layout(T, 8)) }.unwrap().cast::<u8>();
    assert_mkl_block(base, q.as_ptr(), T);
    // SAFETY: live block of (T, 8), shrunk to zero.
    let r = unsafe { a.shrink(q, layout(T, 8), layout(0, 8)) }.unwrap();
    assert_eq!(r.len(), 0);
    assert_back_to(base);
    // The same on the small side.
    let p = a.allocate(z).unwrap().cast();
    // SAFETY: zero-sized block of `z`; grows to a non-zero small layout.
    let q = unsafe { a.grow(p, z, layout(24, 8)) }.unwrap().cast::<u8>();
    assert_small_block(base, q.as_ptr(), layout(24, 8));
    // SAFETY: live block of (24, 8), shrunk to zero.
    unsafe { a.shrink(q, layout(24, 8), layout(0, 8)) }.unwrap();
    assert_back_to(base);
}

fn the_threshold_is_a_parameter<X: Side>() {
    let _g = serial();
    let l = layout(10_000, 8);
    let high: MklSplitAllocator<Checked<X>, 65536> = split::<X>().with_threshold();
    let zero = split::<X>().with_threshold::<0>();
    assert!(split::<X>().is_mkl(l));
    assert!(!high.is_mkl(l));
    assert!(zero.is_mkl(layout(1, 1)));
    let base = now();
    // SAFETY: non-zero size.
    let p = unsafe { high.alloc(l) };
    assert_small_block(base, p, l);
    // SAFETY: allocated above with `l`.
    unsafe { high.dealloc(p, l) };
    // SAFETY: non-zero size.
    let p = unsafe { zero.alloc(layout(1, 1)) };
    assert_mkl_block(base, p, 1);
    // SAFETY: allocated above with the same layout.
    unsafe { zero.dealloc(p, layout(1, 1)) };
    assert_back_to(base);
}

fn collections_grow_from_the_small_side_into_mkl_and_back<X: Side>() {
    let _g = serial();
    let base = now();
    let mut v: allocator_api2::vec::Vec<u32, Split<X>> =
        allocator_api2::vec::Vec::new_in(split::<X>());
    // Under Miri fewer pushes, still twice past the threshold.
    let pushes = if cfg!(miri) { T as u32 / 2 } else { 100_000 };
    // Each block is checked when the vector grows into it (a check per push
    // cost Miri most of this binary's time, for the same blocks).
    let mut checked = 0;
    for i in 0..pushes {
        v.push(i.wrapping_mul(2_654_435_761));
        if v.capacity() == checked {
            continue;
        }
        checked = v.capacity();
        let bytes = checked * 4;
        if bytes < T {
            assert_small_block(base, v.as_ptr().cast(), layout(bytes, 4));
        } else {
            assert_mkl_block(base, v.as_ptr().cast(), bytes);
        }
    }
    v.truncate(10);
    v.shrink_to_fit();
    assert_small_block(base, v.as_ptr().cast(), layout(40, 4));
    assert!(
        v.iter()
            .enumerate()
            .all(|(i, &x)| x == (i as u32).wrapping_mul(2_654_435_761))
    );
    drop(v);
    assert_back_to(base);

    let mut m: hashbrown::HashMap<u64, u64, hashbrown::DefaultHashBuilder, Split<X>> =
        hashbrown::HashMap::with_hasher_in(Default::default(), split::<X>());
    let entries = if cfg!(miri) { 1_000 } else { 10_000 };
    for i in 0..entries {
        m.insert(i, i * i);
    }
    assert!((0..entries).all(|i| m[&i] == i * i));
    assert_eq!(now().mkl_blocks, base.mkl_blocks + 1);
    drop(m);
    assert_back_to(base);
}

/// The checks above, one `#[test]` each, in one module per small side.
macro_rules! over {
    ($side:ident: $ty:ty) => {
        mod $side {
            #[test]
            fn small_layouts_go_to_the_small_side() {
                super::small_layouts_go_to_the_small_side::<$ty>();
            }
            #[test]
            fn large_or_over_aligned_layouts_go_to_mkl_aligned_to_64() {
                super::large_or_over_aligned_layouts_go_to_mkl_aligned_to_64::<$ty>();
            }
            #[test]
            fn alloc_zeroed_is_zeroed_on_both_sides_by_each_side() {
                super::alloc_zeroed_is_zeroed_on_both_sides_by_each_side::<$ty>();
            }
            #[test]
            fn global_realloc_crosses_the_threshold_both_ways_keeping_contents() {
                super::global_realloc_crosses_the_threshold_both_ways_keeping_contents::<$ty>();
            }
            #[test]
            fn grow_and_shrink_cross_the_threshold_both_ways_keeping_contents() {
                super::grow_and_shrink_cross_the_threshold_both_ways_keeping_contents::<$ty>();
            }
            #[test]
            fn zero_sized_layouts_reach_neither_allocator() {
                super::zero_sized_layouts_reach_neither_allocator::<$ty>();
            }
            #[test]
            fn the_threshold_is_a_parameter() {
                super::the_threshold_is_a_parameter::<$ty>();
            }
            #[test]
            fn collections_grow_from_the_small_side_into_mkl_and_back() {
                super::collections_grow_from_the_small_side_into_mkl_and_back::<$ty>();
            }
        }
    };
}

over!(system: std::alloc::System);
#[cfg(not(miri))]
over!(mimalloc: ::mimalloc::MiMalloc);
#[cfg(all(unix, not(miri)))]
over!(jemalloc: ::tikv_jemallocator::Jemalloc);

/// The default value is the split over System, a zero-sized handle, and
/// `over` and `with_threshold` are usable in statics.
#[test]
fn the_default_value_is_the_split_over_system() {
    static OVER: MklSplitAllocator<System, 65536> =
        MklSplitAllocator::over(System).with_threshold();
    let d: MklSplitAllocator = MklSplitAllocator;
    assert_eq!(d, MklSplitAllocator::over(System));
    assert_eq!(d, MklSplitAllocator::default());
    assert_eq!(size_of_val(&d), 0);
    assert_eq!(<MklSplitAllocator>::THRESHOLD, T);
    assert_eq!(MklSplitAllocator::<System, 65536>::THRESHOLD, 65536);
    assert!(!OVER.is_mkl(layout(10_000, 8)));
    assert!(d.is_mkl(layout(10_000, 8)));
}
