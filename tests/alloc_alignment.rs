//! Alignment matrix: alignments 1 .. 2^20 x sizes 1 .. 2^22 (powers of two and
//! their ±1 neighbours), through `GlobalAlloc` and allocator-api2's
//! `Allocator`: every block is aligned to max(64, align), zeroed blocks are all
//! zero, grow / shrink keep contents and alignment, grow_zeroed zeroes only
//! the new tail, and a grow to a stricter alignment moves to an aligned block.
//!
//! Contents are written and compared with memcpy / memcmp against reference
//! buffers, so the debug build stays fast.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::sync::OnceLock;

use allocator_api2::alloc::Allocator;
use mkl_alloc::{MAX_ALIGN, MIN_ALIGN, MklAllocator};

const MAX_SIZE: usize = 1 << 22;
const MAX_ALIGN_LOG2: u32 = 20;

fn small() -> bool {
    std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small")
}

/// 3 * MAX_SIZE + 2 pseudo-random bytes; a block's expected contents are a
/// window of it, so different windows give different patterns.
fn pattern() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        (0..3 * MAX_SIZE + 2)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    })
}

fn zeros() -> &'static [u8] {
    static Z: OnceLock<Vec<u8>> = OnceLock::new();
    Z.get_or_init(|| vec![0; 2 * MAX_SIZE + 2])
}

/// Sizes 1 .. 2^22: each power of two and its ±1 neighbours (fewer in small mode).
fn sizes() -> Vec<usize> {
    let max_log2 = if small() { 14 } else { 22 };
    let mut s = Vec::new();
    for k in 0..=max_log2 {
        let p = 1usize << k;
        for n in [p - 1, p, p + 1] {
            if (1..=MAX_SIZE).contains(&n) && !s.contains(&n) {
                s.push(n);
            }
        }
    }
    s
}

fn aligns() -> Vec<usize> {
    let step = if small() { 4 } else { 1 };
    (0..=MAX_ALIGN_LOG2).step_by(step).map(|k| 1 << k).collect()
}

#[track_caller]
fn check_aligned(p: *const u8, align: usize, what: &str) {
    assert!(!p.is_null(), "{what}: null");
    let want = align.max(MIN_ALIGN);
    assert_eq!(
        p as usize % want,
        0,
        "{what}: {p:p} not aligned to {want} (align {align})"
    );
}

/// Fills `len` bytes at `p` with the pattern window starting at `tag`.
///
/// # Safety
/// `p` is valid for `len` bytes of writes.
unsafe fn fill(p: *mut u8, len: usize, tag: usize) {
    let src = &pattern()[tag % MAX_SIZE..][..len];
    // SAFETY: `p` is valid for `len` writes (caller); `src` is a distinct
    // Rust-owned buffer of exactly `len` bytes.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), p, len) }
}

/// # Safety
/// `p` is valid for `len` bytes of reads.
#[track_caller]
unsafe fn check(p: *const u8, len: usize, tag: usize, what: &str) {
    // SAFETY: `p` is valid for `len` initialised bytes (caller).
    let got = unsafe { core::slice::from_raw_parts(p, len) };
    assert!(
        got == &pattern()[tag % MAX_SIZE..][..len],
        "{what}: contents changed"
    );
}

/// # Safety
/// `p` is valid for `len` bytes of reads.
#[track_caller]
unsafe fn check_zero(p: *const u8, len: usize, what: &str) {
    // SAFETY: `p` is valid for `len` initialised bytes (caller).
    let got = unsafe { core::slice::from_raw_parts(p, len) };
    assert!(got == &zeros()[..len], "{what}: not all zero");
}

#[test]
fn constants() {
    assert_eq!(MIN_ALIGN, 64);
    assert_eq!(MAX_ALIGN, 1 << 30);
}

#[test]
fn global_alloc_matrix() {
    let a = MklAllocator;
    for align in aligns() {
        for size in sizes() {
            let what = format!("GlobalAlloc size {size} align {align}");
            let layout = Layout::from_size_align(size, align).unwrap();
            // alloc + fill, then free: leaves a dirty block in MKL's cache
            // that alloc_zeroed below may be served from.
            // SAFETY: size > 0.
            let p = unsafe { a.alloc(layout) };
            check_aligned(p, align, &format!("{what}: alloc"));
            // SAFETY: p is a live block of `size` bytes; freed once with its layout.
            unsafe {
                fill(p, size, size + align);
                check(p, size, size + align, &what);
                a.dealloc(p, layout);
            }

            // SAFETY: size > 0.
            let z = unsafe { a.alloc_zeroed(layout) };
            check_aligned(z, align, &format!("{what}: alloc_zeroed"));
            // SAFETY: z is a live block of `size` bytes.
            unsafe { check_zero(z, size, &format!("{what}: alloc_zeroed")) };

            // realloc grow: contents kept, alignment kept.
            let big = 2 * size + 1;
            // SAFETY: z is a live block of `layout`; every later use is of
            // the pointer realloc returned, with the matching layout.
            unsafe {
                fill(z, size, size);
                let g = a.realloc(z, layout, big);
                check_aligned(g, align, &format!("{what}: realloc grow to {big}"));
                check(g, size, size, &format!("{what}: realloc grow to {big}"));
                fill(g, big, big);
                // realloc shrink: prefix kept, alignment kept.
                let half = size.div_ceil(2);
                let big_layout = Layout::from_size_align(big, align).unwrap();
                let s = a.realloc(g, big_layout, half);
                check_aligned(s, align, &format!("{what}: realloc shrink to {half}"));
                check(s, half, big, &format!("{what}: realloc shrink to {half}"));
                a.dealloc(s, Layout::from_size_align(half, align).unwrap());
            }
        }
    }
}

#[test]
fn allocator_api_matrix() {
    let a = MklAllocator;
    for align in aligns() {
        for size in sizes() {
            let what = format!("Allocator size {size} align {align}");
            let layout = Layout::from_size_align(size, align).unwrap();
            let p = a.allocate(layout).expect("allocate");
            assert_eq!(p.len(), size, "{what}: allocate length");
            let p = p.cast::<u8>();
            check_aligned(p.as_ptr(), align, &format!("{what}: allocate"));
            // SAFETY: p is a live block of `size` bytes from `a`.
            unsafe { fill(p.as_ptr(), size, size + 3) };

            let z = a.allocate_zeroed(layout).expect("allocate_zeroed");
            assert_eq!(z.len(), size);
            let z = z.cast::<u8>();
            check_aligned(z.as_ptr(), align, &format!("{what}: allocate_zeroed"));
            // SAFETY: z is a live block of `size` bytes.
            unsafe { check_zero(z.as_ptr(), size, &format!("{what}: allocate_zeroed")) };

            // Make a dirty free block of the grown size, so that the tail
            // grow_zeroed hands out is likely to be recycled, dirty memory.
            let big = 2 * size + 1;
            let big_layout = Layout::from_size_align(big, align).unwrap();
            let d = a.allocate(big_layout).expect("allocate dirty").cast::<u8>();
            // SAFETY: d is a live block of `big` bytes from `a`, freed once.
            unsafe {
                fill(d.as_ptr(), big, 7);
                a.deallocate(d, big_layout);
            }

            // SAFETY: z and p are live blocks of `layout` from `a`; each
            // resize consumes its input and the result is used with its layout.
            unsafe {
                fill(z.as_ptr(), size, size + 5);
                let g = a.grow_zeroed(z, layout, big_layout).expect("grow_zeroed");
                assert_eq!(g.len(), big);
                let g = g.cast::<u8>();
                check_aligned(g.as_ptr(), align, &format!("{what}: grow_zeroed"));
                check(
                    g.as_ptr(),
                    size,
                    size + 5,
                    &format!("{what}: grow_zeroed head"),
                );
                check_zero(
                    g.as_ptr().add(size),
                    big - size,
                    &format!("{what}: grow_zeroed tail"),
                );

                let h = a.grow(p, layout, big_layout).expect("grow").cast::<u8>();
                check_aligned(h.as_ptr(), align, &format!("{what}: grow"));
                check(h.as_ptr(), size, size + 3, &format!("{what}: grow"));

                let half = size.div_ceil(2);
                let half_layout = Layout::from_size_align(half, align).unwrap();
                let s = a.shrink(g, big_layout, half_layout).expect("shrink");
                assert_eq!(s.len(), half);
                let s = s.cast::<u8>();
                check_aligned(s.as_ptr(), align, &format!("{what}: shrink"));
                check(s.as_ptr(), half, size + 5, &format!("{what}: shrink"));

                a.deallocate(s, half_layout);
                a.deallocate(h, big_layout);
            }
        }
    }
}

#[test]
fn grow_and_shrink_to_a_stricter_alignment_move_to_an_aligned_block() {
    let a = MklAllocator;
    let sizes = [1usize, 63, 64, 100, 4096, 65_537];
    for size in sizes {
        for (from, to) in [(1usize, 128usize), (64, 4096), (8, 1 << 16), (128, 1 << 20)] {
            let what = format!("size {size}: align {from} -> {to}");
            let old = Layout::from_size_align(size, from).unwrap();
            let p = a.allocate(old).expect("allocate").cast::<u8>();
            check_aligned(p.as_ptr(), from, &what);
            // SAFETY: p is a live block of `old`; each resize consumes its
            // input, and the result is used and freed with its own layout.
            unsafe {
                fill(p.as_ptr(), size, size + to);
                let new = Layout::from_size_align(size * 2, to).unwrap();
                let g = a.grow(p, old, new).expect("grow").cast::<u8>();
                check_aligned(g.as_ptr(), to, &format!("{what}: grow"));
                check(g.as_ptr(), size, size + to, &format!("{what}: grow"));

                let new_z = Layout::from_size_align(size * 3, to * 2).unwrap();
                fill(g.as_ptr(), size * 2, 11);
                let z = a
                    .grow_zeroed(g, new, new_z)
                    .expect("grow_zeroed")
                    .cast::<u8>();
                check_aligned(z.as_ptr(), to * 2, &format!("{what}: grow_zeroed"));
                check(z.as_ptr(), size * 2, 11, &format!("{what}: grow_zeroed"));
                check_zero(z.as_ptr().add(size * 2), size, &format!("{what}: tail"));

                let new_s = Layout::from_size_align(size, to * 4).unwrap();
                let s = a.shrink(z, new_z, new_s).expect("shrink").cast::<u8>();
                check_aligned(s.as_ptr(), to * 4, &format!("{what}: shrink"));
                check(s.as_ptr(), size, 11, &format!("{what}: shrink"));
                a.deallocate(s, new_s);
            }
        }
    }
}

#[test]
fn looser_alignment_on_resize_still_gives_the_minimum() {
    // Going from a 4096-aligned block to an align-1 layout: the result only
    // has to be 64-aligned, and contents must survive.
    let a = MklAllocator;
    let old = Layout::from_size_align(1000, 4096).unwrap();
    let p = a.allocate(old).unwrap().cast::<u8>();
    // SAFETY: p is a live block of `old`; the resize consumes it and the
    // result is freed with its layout.
    unsafe {
        fill(p.as_ptr(), 1000, 99);
        let new = Layout::from_size_align(300_000, 1).unwrap();
        let g: NonNull<u8> = a.grow(p, old, new).unwrap().cast();
        check_aligned(g.as_ptr(), 1, "grow to align 1");
        check(g.as_ptr(), 1000, 99, "grow to align 1");
        a.deallocate(g, new);
    }
}
