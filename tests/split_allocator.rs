//! `MklSplitAllocator` as a value: routing by layout, every threshold
//! crossing of realloc / grow / shrink (both ways), alignment, contents, and
//! MKL's own statistics (`MKL_Mem_Stat`) showing which blocks are MKL's.
//!
//! MKL's statistics are process-wide, so every test that reads them holds
//! `serial()`; the checks are deltas around the test's own blocks.

mod common;

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use allocator_api2::alloc::Allocator;
use mkl_alloc::{DEFAULT_SPLIT_THRESHOLD, MklSplitAllocator, manager};

type Split = MklSplitAllocator;
const T: usize = DEFAULT_SPLIT_THRESHOLD;
/// A large block, filled and checked byte by byte: 64 KiB under Miri
/// (interpreted; still 16 times the threshold), else 1 MiB.
const BIG: usize = if cfg!(miri) { 1 << 16 } else { 1 << 20 };

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

/// MKL's live bytes and blocks.
fn mkl() -> (u64, u64) {
    let s = manager::stats();
    (s.bytes, s.buffers)
}

/// Asserts that exactly one more MKL block of at least `size` bytes is live
/// than at `base`.
#[track_caller]
fn assert_one_mkl_block(base: (u64, u64), size: usize) {
    let now = mkl();
    assert_eq!(
        now.1,
        base.1 + 1,
        "expected one more MKL block: {base:?} -> {now:?}"
    );
    assert!(
        now.0 >= base.0 + size as u64,
        "expected at least {size} more MKL bytes: {base:?} -> {now:?}"
    );
}

#[track_caller]
fn assert_no_mkl_block(base: (u64, u64)) {
    assert_eq!(mkl(), base, "MKL's statistics changed: the block is MKL's");
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

#[test]
fn small_layouts_go_to_the_system_allocator() {
    let _g = serial();
    for size in [1, 7, 8, 16, 24, 100, 1000, T - 1] {
        for align in [1, 2, 4, 8, 16] {
            let l = layout(size, align);
            assert!(!Split::default().is_mkl(l));
            let base = mkl();
            // SAFETY: non-zero size.
            let p = unsafe { Split::default().alloc(l) };
            assert!(!p.is_null());
            assert_eq!(p as usize % align, 0);
            assert_no_mkl_block(base);
            fill(p, size, 3);
            check(p, size, 3);
            // SAFETY: allocated above with `l`.
            unsafe { Split::default().dealloc(p, l) };
            assert_no_mkl_block(base);
        }
    }
}

#[test]
fn large_or_over_aligned_layouts_go_to_mkl_aligned_to_64() {
    let _g = serial();
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
        assert!(Split::default().is_mkl(l), "{l:?}");
        let base = mkl();
        // SAFETY: non-zero size.
        let p = unsafe { Split::default().alloc(l) };
        assert!(!p.is_null());
        assert_eq!(
            p as usize % align.max(64),
            0,
            "{l:?} not aligned to max(64, align)"
        );
        assert_one_mkl_block(base, size);
        fill(p, size, 5);
        check(p, size, 5);
        // SAFETY: allocated above with `l`.
        unsafe { Split::default().dealloc(p, l) };
        assert_eq!(mkl().1, base.1, "{l:?}: the MKL block was not freed");
    }
}

#[test]
fn alloc_zeroed_is_zeroed_on_both_sides() {
    let _g = serial();
    for (size, align) in [(100, 8), (T - 1, 16), (T, 8), (BIG, 64), (48, 32)] {
        let l = layout(size, align);
        let base = mkl();
        // SAFETY: non-zero size.
        let p = unsafe { Split::default().alloc_zeroed(l) };
        assert!(!p.is_null());
        if Split::default().is_mkl(l) {
            assert_one_mkl_block(base, size);
        } else {
            assert_no_mkl_block(base);
        }
        // SAFETY: p holds `size` bytes.
        assert!(
            unsafe { core::slice::from_raw_parts(p, size) }
                .iter()
                .all(|&b| b == 0)
        );
        // SAFETY: allocated above with `l`.
        unsafe { Split::default().dealloc(p, l) };
        assert_eq!(mkl().1, base.1);
    }
}

/// GlobalAlloc::realloc through every pair of sides, growing and shrinking.
#[test]
fn global_realloc_crosses_the_threshold_both_ways_keeping_contents() {
    let _g = serial();
    let a = Split::default();
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
        let base = mkl();
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
            if a.is_mkl(l) {
                assert_eq!(
                    q as usize % 64,
                    0,
                    "{from} -> {to}: MKL block not aligned to 64"
                );
                assert_one_mkl_block(base, to);
            } else {
                assert_eq!(q as usize % align, 0);
                assert_no_mkl_block(base);
            }
            // Refill so the next step checks bytes written on this side.
            fill(q, to, 9);
            p = q;
        }
        // SAFETY: live block of `l`.
        unsafe { a.dealloc(p, l) };
        assert_eq!(mkl().1, base.1);
    }
}

/// allocator-api2 grow / grow_zeroed / shrink through every pair of sides,
/// including a change of alignment that alone moves a small block to MKL.
#[test]
fn grow_and_shrink_cross_the_threshold_both_ways_keeping_contents() {
    let _g = serial();
    let a = Split::default();
    let steps: [(Layout, Layout); 10] = [
        (layout(16, 8), layout(200, 8)),       // small -> small, grow
        (layout(200, 8), layout(T + 8, 8)),    // small -> large, grow
        (layout(T + 8, 8), layout(4 * T, 8)),  // large -> large, grow
        (layout(4 * T, 8), layout(2 * T, 8)),  // large -> large, shrink
        (layout(2 * T, 8), layout(300, 8)),    // large -> small, shrink
        (layout(300, 8), layout(300, 64)),     // small -> MKL by alignment
        (layout(300, 64), layout(300, 8)),     // MKL -> small by alignment
        (layout(300, 8), layout(100, 8)),      // small -> small, shrink
        (layout(100, 8), layout(T, 128)),      // small -> large, stricter align
        (layout(T, 128), layout(2 * T, 4096)), // large -> large, stricter align
    ];
    let base = mkl();
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
            assert_eq!(q.as_ptr() as usize % 64, 0);
            assert_one_mkl_block(base, new.size());
        } else {
            assert_no_mkl_block(base);
        }
        fill(q.as_ptr(), new.size(), 11);
        p = q;
    }
    // SAFETY: live block of the last step's new layout.
    unsafe { a.deallocate(p, steps[steps.len() - 1].1) };
    assert_eq!(mkl().1, base.1);

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
    assert_eq!(mkl().1, base.1);
}

#[test]
fn zero_sized_layouts_reach_neither_allocator() {
    let _g = serial();
    let a = Split::default();
    let base = mkl();
    for align in [1, 8, 64, 4096] {
        let z = layout(0, align);
        let p = a.allocate(z).unwrap();
        assert_eq!(p.len(), 0);
        assert_eq!(p.cast::<u8>().as_ptr() as usize % align, 0);
        let p = a.allocate_zeroed(z).unwrap();
        // SAFETY: a zero-sized block of `z`; never passed to System or MKL.
        unsafe { a.deallocate(p.cast(), z) };
    }
    assert_no_mkl_block(base);
    // Growing from zero allocates; shrinking to zero frees.
    let z = layout(0, 8);
    let p = a.allocate(z).unwrap().cast();
    // SAFETY: zero-sized block of `z`; grows to a non-zero MKL layout.
    let q = unsafe { a.grow(p, z, layout(T, 8)) }.unwrap().cast::<u8>();
    assert_one_mkl_block(base, T);
    // SAFETY: live block of (T, 8), shrunk to zero.
    let r = unsafe { a.shrink(q, layout(T, 8), layout(0, 8)) }.unwrap();
    assert_eq!(r.len(), 0);
    assert_eq!(
        mkl().1,
        base.1,
        "shrinking to zero did not free the MKL block"
    );
}

#[test]
fn the_threshold_is_a_parameter() {
    let _g = serial();
    let l = layout(10_000, 8);
    assert!(MklSplitAllocator::<4096>.is_mkl(l));
    assert!(!MklSplitAllocator::<65536>.is_mkl(l));
    assert!(MklSplitAllocator::<0>.is_mkl(layout(1, 1)));
    let base = mkl();
    // SAFETY: non-zero size.
    let p = unsafe { MklSplitAllocator::<65536>.alloc(l) };
    assert_no_mkl_block(base);
    // SAFETY: allocated above with `l`.
    unsafe { MklSplitAllocator::<65536>.dealloc(p, l) };
    // SAFETY: non-zero size.
    let p = unsafe { MklSplitAllocator::<0>.alloc(layout(1, 1)) };
    assert_one_mkl_block(base, 1);
    // SAFETY: allocated above with the same layout.
    unsafe { MklSplitAllocator::<0>.dealloc(p, layout(1, 1)) };
    assert_eq!(mkl().1, base.1);
}

#[test]
fn collections_grow_from_system_into_mkl_and_back() {
    let _g = serial();
    let base = mkl();
    let mut v: allocator_api2::vec::Vec<u32, Split> =
        allocator_api2::vec::Vec::new_in(Split::default());
    // Under Miri fewer pushes, still twice past the threshold.
    let pushes = if cfg!(miri) { T as u32 / 2 } else { 100_000 };
    for i in 0..pushes {
        v.push(i.wrapping_mul(2_654_435_761));
        let bytes = v.capacity() * 4;
        if bytes < T {
            assert_no_mkl_block(base);
        } else {
            assert_eq!(v.as_ptr() as usize % 64, 0);
            assert_one_mkl_block(base, bytes);
        }
    }
    v.truncate(10);
    v.shrink_to_fit();
    assert_no_mkl_block(base);
    assert!(
        v.iter()
            .enumerate()
            .all(|(i, &x)| x == (i as u32).wrapping_mul(2_654_435_761))
    );

    let mut m: hashbrown::HashMap<u64, u64, hashbrown::DefaultHashBuilder, Split> =
        hashbrown::HashMap::with_hasher_in(Default::default(), Split::default());
    let entries = if cfg!(miri) { 1_000 } else { 10_000 };
    for i in 0..entries {
        m.insert(i, i * i);
    }
    assert!((0..entries).all(|i| m[&i] == i * i));
    assert_one_mkl_block(base, entries as usize * 16);
    drop(m);
    drop(v);
    assert_eq!(mkl().1, base.1);
}
