//! Resizes that MKL may do in place or by moving, checked whichever it
//! does: natively against MKL (which shrinks in place and grows in place
//! within the block it holds), and under Miri against each mode of the
//! emulation (src/ffi/miri/mode.rs, `MKL_ALLOC_MIRI_MODE`), where what happens
//! is known and asserted: in `in-place` the in-place branches run (a
//! `SharedMklVec` keeping its pointer and MKL's count), in the other modes
//! every resize through `MKL_realloc` moves; in `misaligned-realloc` the
//! blocks it moves come back aligned to 64 only, and the crate re-aligns
//! them.

#![cfg(not(loom))]

use core::alloc::{GlobalAlloc, Layout};
use std::sync::{Mutex, MutexGuard};

use allocator_api2::alloc::Allocator;
use mkl_alloc::{MklAllocator, SharedMklVec};

/// What a resize through `MKL_realloc` must do here.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Native MKL: either, as it decides.
    Either,
    /// Miri's `in-place` mode: stay where the block has room.
    InPlace,
    /// Miri's other modes: move.
    Moves,
}

fn expect() -> Expect {
    if !cfg!(miri) {
        return Expect::Either;
    }
    match std::env::var("MKL_ALLOC_MIRI_MODE").as_deref() {
        Ok("in-place") => Expect::InPlace,
        _ => Expect::Moves,
    }
}

/// Checks a resize from `before` to `after`: `fits` says whether the block
/// had room for it (in `in-place`), and the result says whether it stayed.
#[track_caller]
fn check_resize(before: *const u8, after: *const u8, fits: bool) -> bool {
    let stayed = before == after;
    match expect() {
        Expect::Either => {}
        Expect::InPlace => assert_eq!(stayed, fits, "in-place mode: stays iff it fits"),
        Expect::Moves => assert!(!stayed, "this mode moves every resize"),
    }
    stayed
}

/// MKL's counters are process-wide; the block cache and huge pages (off
/// by default) stay off here, so every resize is `MKL_realloc`'s.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `heap_size` of a `SharedMklVec<u8>` whose block MKL counted at `bytes`
/// (64-byte alignment): the bytes, MKL's padding and header, the handle.
fn heap_size(bytes: usize) -> usize {
    bytes + 64 + 24 + size_of::<SharedMklVec<u8>>()
}

#[test]
fn shared_vec_resized_in_place_keeps_counting_what_mkl_holds() {
    let _g = serial();
    let v = SharedMklVec::<u8>::with_alignment(1000, 64).unwrap();
    v.try_extend_from_slice(&[7; 1000]).unwrap();
    assert_eq!(v.heap_size(), heap_size(1000));

    // A shrink (small: MKL_realloc, not a move to a fresh block).
    let p = v.as_ptr();
    v.try_truncate(10).unwrap();
    v.try_shrink_to_fit().unwrap();
    assert_eq!(v.capacity(), 10);
    let shrunk_in_place = check_resize(p.cast(), v.as_ptr().cast(), true);
    let held = if shrunk_in_place {
        heap_size(1000) // MKL still holds (and counts) it all
    } else {
        heap_size(10)
    };
    assert_eq!(v.heap_size(), held);
    assert_eq!(v.view().unwrap()[..], [7; 10]);

    // Growing back within what the block had (where the shrink kept it).
    let p = v.as_ptr();
    v.try_reserve_exact(490).unwrap();
    assert_eq!(v.capacity(), 500);
    // In place, MKL counts the larger of what it held and the new size
    // (a growth beyond what it holds goes through i_realloc, which may
    // keep the address: the C runtime's realloc or a chunk's mremap).
    let held = if check_resize(p.cast(), v.as_ptr().cast(), shrunk_in_place) {
        held.max(heap_size(500))
    } else {
        heap_size(500)
    };
    assert_eq!(v.heap_size(), held, "RawBuf's count after the growth");
    assert_eq!(v.view().unwrap()[..], [7; 10]);
    v.try_resize(500, 9).unwrap();

    // Far beyond: moved (the emulation's room is the first size again;
    // MKL moved every growth from 1000 B to 2000 B and beyond).
    let p = v.as_ptr();
    v.try_reserve_exact(4500).unwrap();
    let want = if check_resize(p.cast(), v.as_ptr().cast(), false) {
        held.max(heap_size(5000))
    } else {
        heap_size(5000)
    };
    assert_eq!(v.heap_size(), want);
    let c = v.view().unwrap().to_vec();
    assert_eq!(c[..10], [7; 10]);
    assert!(c[10..].iter().all(|&x| x == 9));
}

#[test]
fn global_alloc_realloc_keeps_contents_in_place_or_moved() {
    let _g = serial();
    let a = MklAllocator;
    let layout = Layout::from_size_align(1000, 8).unwrap();
    // SAFETY: each pointer is the block's latest, used within its size and
    // layout; the last one is freed once with its layout.
    unsafe {
        let p = a.alloc(layout);
        assert!(!p.is_null());
        for i in 0..1000 {
            p.add(i).write(i as u8);
        }
        let q = a.realloc(p, layout, 10);
        check_resize(p, q, true);
        assert!((0..10).all(|i| *q.add(i) == i as u8));
        let r = a.realloc(q, Layout::from_size_align(10, 8).unwrap(), 700);
        check_resize(q, r, p == q);
        assert!((0..10).all(|i| *r.add(i) == i as u8));
        r.add(10).write_bytes(1, 690);
        let s = a.realloc(r, Layout::from_size_align(700, 8).unwrap(), 9000);
        check_resize(r, s, false);
        assert!((0..10).all(|i| *s.add(i) == i as u8));
        assert!((10..700).all(|i| *s.add(i) == 1));
        assert_eq!(s.addr() % 64, 0);
        a.dealloc(s, Layout::from_size_align(9000, 8).unwrap());
    }
}

#[test]
fn allocator_grow_zeroed_in_place_zeroes_the_new_tail() {
    let _g = serial();
    let a = MklAllocator;
    let big = Layout::from_size_align(400, 64).unwrap();
    let small = Layout::from_size_align(16, 64).unwrap();
    let grown = Layout::from_size_align(300, 64).unwrap();
    // SAFETY: each block is the latest, with its layout; freed once.
    unsafe {
        let p = a.allocate(big).unwrap().cast::<u8>();
        p.as_ptr().write_bytes(0xAB, 400);
        let q = a.shrink(p, big, small).unwrap().cast::<u8>();
        check_resize(p.as_ptr(), q.as_ptr(), true);
        // The bytes the growth adds were 0xAB once (where it stays in
        // place): grow_zeroed must zero them.
        let r = a.grow_zeroed(q, small, grown).unwrap().cast::<u8>();
        check_resize(q.as_ptr(), r.as_ptr(), p == q);
        let bytes = core::slice::from_raw_parts(r.as_ptr(), 300);
        assert!(bytes[..16].iter().all(|&b| b == 0xAB));
        assert!(
            bytes[16..].iter().all(|&b| b == 0),
            "the new tail is zeroed"
        );
        a.deallocate(r, grown);
    }
}

#[test]
fn realloc_keeps_4096_alignment_even_where_mkl_realloc_would_not() {
    // In Miri's `misaligned-realloc` mode MKL_realloc returns every moved
    // block aligned to 64 only: the alignment below holds there only
    // because raw_realloc moves such a block into an aligned one (realign).
    // Where the blocks go is not checked: how a block aligned above 64
    // grows is the allocator's choice.
    let _g = serial();
    let a = MklAllocator;
    let layout = |size| Layout::from_size_align(size, 4096).unwrap();
    // SAFETY: each pointer is the block's latest, used within its size and
    // layout; the last one is freed once with its layout.
    unsafe {
        let p = a.alloc(layout(1000));
        assert!(!p.is_null());
        p.write_bytes(3, 1000);
        let q = a.realloc(p, layout(1000), 10);
        assert_eq!(q.addr() % 4096, 0, "shrink");
        let r = a.realloc(q, layout(10), 5000);
        assert_eq!(r.addr() % 4096, 0, "growth");
        assert!((0..10).all(|i| *r.add(i) == 3));
        a.dealloc(r, layout(5000));
    }
}
