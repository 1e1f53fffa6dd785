//! Bad layouts and impossible requests: alignments above 2^30, sizes near
//! `isize::MAX`, a calloc whose product overflows, a realloc / grow to a huge
//! size. Each gives null / `AllocError` (never an abort, never a misaligned
//! block) and leaves everything it was given unchanged.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr;
use std::sync::{Mutex, MutexGuard};

use allocator_api2::alloc::Allocator;
use mkl_alloc::{MAX_ALIGN, MklAllocator, ffi, manager};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A live 1000-byte block (64-aligned) filled with a known pattern.
fn live_block() -> (*mut u8, Layout) {
    let layout = Layout::from_size_align(1000, 64).unwrap();
    // SAFETY: size > 0.
    let p = unsafe { MklAllocator.alloc(layout) };
    assert!(!p.is_null());
    for i in 0..1000 {
        // SAFETY: i < 1000, inside the live block.
        unsafe { p.add(i).write(i as u8 ^ 0x5a) };
    }
    (p, layout)
}

#[track_caller]
fn check_block(p: *const u8) {
    // SAFETY: p is a live 1000-byte block from live_block().
    let s = unsafe { core::slice::from_raw_parts(p, 1000) };
    assert!(
        s.iter().enumerate().all(|(i, &b)| b == i as u8 ^ 0x5a),
        "the old block was modified by a failed call"
    );
}

#[test]
fn alignment_above_2_pow_30_is_refused() {
    let _g = serial();
    let before = manager::stats();
    for k in [31u32, 32, 40, 50, 62] {
        let align = 1usize << k;
        for size in [1usize, 64, 4096] {
            let l = Layout::from_size_align(size, align).unwrap();
            // SAFETY: size > 0; a null result is the expected outcome.
            unsafe {
                assert!(MklAllocator.alloc(l).is_null(), "alloc align 2^{k}");
                assert!(
                    MklAllocator.alloc_zeroed(l).is_null(),
                    "alloc_zeroed align 2^{k}"
                );
            }
            assert!(MklAllocator.allocate(l).is_err(), "allocate align 2^{k}");
            assert!(
                MklAllocator.allocate_zeroed(l).is_err(),
                "allocate_zeroed 2^{k}"
            );
        }
        // A zero-size layout never reaches MKL, whatever its alignment.
        let z = Layout::from_size_align(0, align).unwrap();
        let p = MklAllocator.allocate(z).expect("zero-size is always fine");
        assert_eq!(p.cast::<u8>().as_ptr() as usize % align, 0);
    }
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "a refused request reached MKL"
    );
}

#[test]
fn grow_to_alignment_above_2_pow_30_fails_and_keeps_the_block() {
    let _g = serial();
    let (p, layout) = live_block();
    let before = manager::stats();
    let new = Layout::from_size_align(2000, 1 << 31).unwrap();
    let nn = ptr::NonNull::new(p).unwrap();
    // SAFETY: nn is a live block of `layout`; on Err it stays ours and live.
    assert!(unsafe { MklAllocator.grow(nn, layout, new) }.is_err());
    // SAFETY: as above.
    assert!(unsafe { MklAllocator.grow_zeroed(nn, layout, new) }.is_err());
    let smaller = Layout::from_size_align(10, 1 << 31).unwrap();
    // SAFETY: as above.
    assert!(unsafe { MklAllocator.shrink(nn, layout, smaller) }.is_err());
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
    check_block(p);
    // SAFETY: the block is still live and ours.
    unsafe { MklAllocator.dealloc(p, layout) };
}

#[test]
fn alignment_2_pow_30_is_served_and_aligned() {
    let _g = serial();
    let before = manager::stats();
    let align = MAX_ALIGN;
    assert_eq!(align, 1 << 30);
    for size in [2usize, 4096] {
        let l = Layout::from_size_align(size, align).unwrap();
        // SAFETY: size > 0.
        let p = unsafe { MklAllocator.alloc(l) };
        assert!(!p.is_null(), "align 2^30 is within MKL's range (C int)");
        assert_eq!(p as usize % align, 0, "align 2^30 served misaligned: {p:p}");
        // SAFETY: p is a live block of `size` bytes; both ends are writable.
        unsafe {
            p.write(1);
            p.add(size - 1).write(2);
            // realloc keeps the 2^30 alignment (or moves to a block that has it).
            let q = MklAllocator.realloc(p, l, size * 2);
            assert!(!q.is_null());
            assert_eq!(q as usize % align, 0, "realloc lost the 2^30 alignment");
            assert_eq!(q.read(), 1);
            assert_eq!(q.add(size - 1).read(), 2);
            MklAllocator.dealloc(q, Layout::from_size_align(size * 2, align).unwrap());
        }
        let z = MklAllocator
            .allocate_zeroed(l)
            .expect("allocate_zeroed 2^30");
        let zp = z.cast::<u8>().as_ptr();
        assert_eq!(zp as usize % align, 0);
        // SAFETY: z is a live zeroed block of `size` bytes, freed once below.
        unsafe {
            assert!(
                core::slice::from_raw_parts(zp, size)
                    .iter()
                    .all(|&b| b == 0)
            );
            MklAllocator.deallocate(z.cast(), l);
        }
    }
    // Grow a 64-aligned block to the 2^30 edge.
    let (p, layout) = live_block();
    let new = Layout::from_size_align(1000, align).unwrap();
    // SAFETY: p is a live block of `layout`, consumed by grow on success.
    let g = unsafe { MklAllocator.grow(ptr::NonNull::new(p).unwrap(), layout, new) }
        .expect("grow to align 2^30");
    let gp = g.cast::<u8>().as_ptr();
    assert_eq!(gp as usize % align, 0);
    check_block(gp);
    // SAFETY: g is a live block of `new`.
    unsafe { MklAllocator.deallocate(g.cast(), new) };
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "a 2^30-aligned block leaked"
    );
}

#[test]
#[cfg_attr(
    mkl_alloc_wine,
    ignore = "wine reserves 2^45+ bytes that Windows refuses; touching them gets the process killed"
)]
fn sizes_near_isize_max_are_refused() {
    let _g = serial();
    let before = manager::stats();
    let max = isize::MAX as usize;
    let cases = [
        (max, 1usize),
        (max - 63, 64),
        (max - 4095, 4096),
        (max - (MAX_ALIGN - 1), MAX_ALIGN),
        (max / 2, 64),
        (1 << 45, 64),
        (1 << 62, 1),
    ];
    for (size, align) in cases {
        let l = Layout::from_size_align(size, align).unwrap();
        // SAFETY: size > 0; null is the expected result.
        unsafe {
            assert!(MklAllocator.alloc(l).is_null(), "alloc {size} / {align}");
            assert!(
                MklAllocator.alloc_zeroed(l).is_null(),
                "alloc_zeroed {size} / {align}"
            );
        }
        assert!(
            MklAllocator.allocate(l).is_err(),
            "allocate {size} / {align}"
        );
        assert!(
            MklAllocator.allocate_zeroed(l).is_err(),
            "allocate_zeroed {size}"
        );
    }
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

#[test]
#[cfg_attr(
    mkl_alloc_wine,
    ignore = "wine reserves 2^45+ bytes that Windows refuses; touching them gets the process killed"
)]
fn realloc_to_a_huge_size_fails_and_keeps_the_block() {
    let _g = serial();
    for huge in [isize::MAX as usize - 63, 1 << 45] {
        let (p, layout) = live_block();
        let before = manager::stats();
        // SAFETY: p is a live block of `layout`; new_size > 0 and rounds up
        // to at most isize::MAX with align 64. On null, p stays live and ours.
        let q = unsafe { MklAllocator.realloc(p, layout, huge) };
        assert!(q.is_null(), "realloc to {huge} succeeded?");
        assert_eq!(
            manager::stats().mkl_held(),
            before.mkl_held(),
            "a failed realloc changed MKL's holdings"
        );
        check_block(p);

        let nn = ptr::NonNull::new(p).unwrap();
        let new = Layout::from_size_align(huge, 64).unwrap();
        // SAFETY: nn is a live block of `layout`; on Err it stays live and ours.
        assert!(unsafe { MklAllocator.grow(nn, layout, new) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { MklAllocator.grow_zeroed(nn, layout, new) }.is_err());
        // A grow that must also move to a stricter alignment fails the same way.
        let strict = Layout::from_size_align(huge & !4095, 4096).unwrap();
        // SAFETY: as above.
        assert!(unsafe { MklAllocator.grow(nn, layout, strict) }.is_err());
        assert_eq!(manager::stats().mkl_held(), before.mkl_held());
        check_block(p);
        // The block still works: a normal realloc afterwards keeps the contents.
        // SAFETY: p is live; the result replaces it and is freed once.
        unsafe {
            let r = MklAllocator.realloc(p, layout, 5000);
            assert!(!r.is_null());
            check_block(r);
            MklAllocator.dealloc(r, Layout::from_size_align(5000, 64).unwrap());
        }
    }
}

#[test]
fn calloc_with_an_overflowing_product_is_null() {
    let _g = serial();
    let before = manager::stats();
    // Products that wrap to zero or stay above isize::MAX: MKL returns null.
    let cases = [
        (usize::MAX, 2usize),    // wraps to usize::MAX - 1
        (usize::MAX / 2 + 1, 2), // wraps to 0
        (1 << 32, 1 << 32),      // wraps to 0
        (2, usize::MAX),         // wraps to usize::MAX - 1
        (1 << 40, 1 << 30),      // 2^70 wraps to 0
    ];
    for (num, size) in cases {
        // SAFETY: MKL_calloc takes any counts and a positive power-of-two
        // alignment; every case here gives null (measured), and a non-null
        // block would be freed before the assertion fails.
        let p = unsafe { ffi::MKL_calloc(num, size, 64) };
        if !p.is_null() {
            // SAFETY: freeing what MKL returned, once.
            unsafe { ffi::MKL_free(p) };
        }
        assert!(
            p.is_null(),
            "MKL_calloc({num:#x}, {size:#x}) returned a block"
        );
    }
    // Non-overflowing but impossible: also null.
    // SAFETY: as above.
    let p = unsafe { ffi::MKL_calloc(1 << 22, 1 << 22, 64) };
    assert!(p.is_null(), "2^44 bytes");
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

/// Known MKL defect (oneMKL 2026.2): MKL_calloc does not check `num * size`
/// for overflow. A product that wraps to a small number gives a small block,
/// and a single size within ~100 bytes of usize::MAX crashes inside MKL.
/// MklAllocator never passes num != 1 nor a size above isize::MAX, so it is
/// not affected; raw `ffi::MKL_calloc` callers are. This test pins the
/// behaviour: if a later MKL checks the product, it fails, and the README's
/// failure table and the ffi docs should then be updated.
#[test]
fn known_mkl_defect_calloc_does_not_check_the_product() {
    let _g = serial();
    let before = manager::stats();
    for (num, size) in [
        (3usize, 0x5555_5555_5555_5556usize),
        (usize::MAX, usize::MAX),
    ] {
        let wrapped = num.wrapping_mul(size);
        assert!(wrapped <= 2);
        // SAFETY: the product wraps to 1 or 2 bytes, which is all MKL
        // allocates and zeroes; the block is freed at once and not accessed.
        let p = unsafe { ffi::MKL_calloc(num, size, 64) };
        let during = manager::stats();
        if !p.is_null() {
            // SAFETY: the block MKL returned, freed once.
            unsafe { ffi::MKL_free(p) };
        }
        assert!(
            !p.is_null(),
            "MKL_calloc({num:#x}, {size:#x}) now returns null: MKL checks the product; update the docs"
        );
        assert!(
            during.bytes < before.bytes + 4096,
            "a tiny block: {during:?}"
        );
    }
    // MklAllocator's zeroed path takes num = 1, so the same byte counts as
    // layouts are refused or served correctly.
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

#[test]
fn the_allocator_works_after_every_failure() {
    let _g = serial();
    let l = Layout::from_size_align(isize::MAX as usize - 63, 64).unwrap();
    for _ in 0..100 {
        assert!(MklAllocator.allocate(l).is_err());
    }
    let ok = Layout::from_size_align(1 << 20, 4096).unwrap();
    let p = MklAllocator
        .allocate_zeroed(ok)
        .expect("a normal request still works");
    assert_eq!(p.cast::<u8>().as_ptr() as usize % 4096, 0);
    // SAFETY: p is a live block of `ok`.
    unsafe { MklAllocator.deallocate(p.cast(), ok) };
}
