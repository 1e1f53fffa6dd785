//! A large block shrunk well below its size gives its memory back to MKL:
//! `MKL_Mem_Stat` drops by at least three quarters of the block, through
//! every path that shrinks (issue 18). `MKL_realloc` alone shrinks in place
//! and keeps counting the whole block, so each test fails without the move.
//!
//! MKL's counts are process-wide: the tests of this binary run one at a time.

mod common;

use core::alloc::{GlobalAlloc, Layout};
use std::sync::Mutex;

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec, manager};

static MKL: Mutex<()> = Mutex::new(());

const BLOCK: usize = 16 << 20;
const KEPT: usize = 1 << 20;

/// MKL's byte count once its caches are dropped (a block cache may keep a
/// freed block; `free_buffers` must give it back).
fn mkl_bytes() -> u64 {
    manager::free_buffers();
    manager::stats().bytes
}

/// Asserts the count fell by at least three quarters of `BLOCK` since `held`.
#[track_caller]
fn assert_gave_back(what: &str, held: u64) {
    let now = mkl_bytes();
    let back = held.saturating_sub(now);
    assert!(
        back >= (BLOCK as u64) * 3 / 4,
        "{what}: shrinking a {BLOCK}-byte block to {KEPT} gave back {back} bytes \
         (MKL_Mem_Stat {held} -> {now}); at least {} expected",
        BLOCK * 3 / 4
    );
}

/// The pattern: byte `i` is `pat(i as u8)`.
fn pat(i: u8) -> u8 {
    i.wrapping_mul(7).wrapping_add(3)
}

#[track_caller]
fn assert_kept(bytes: &[u8]) {
    assert_eq!(bytes.len(), KEPT);
    common::check_slice(bytes, pat);
}

#[test]
fn global_alloc_realloc_gives_memory_back() {
    let _one = MKL.lock().unwrap_or_else(|e| e.into_inner());
    let layout = Layout::from_size_align(BLOCK, 64).unwrap();
    // SAFETY: non-zero layout; the block is written within its size, then
    // reallocated and freed once with the matching layouts.
    unsafe {
        let p = MklAllocator.alloc(layout);
        assert!(!p.is_null());
        common::fill(p, BLOCK, pat);
        let held = mkl_bytes();
        let q = MklAllocator.realloc(p, layout, KEPT);
        assert!(!q.is_null());
        assert_gave_back("GlobalAlloc::realloc", held);
        assert_eq!(q as usize % 64, 0);
        common::check(q, KEPT, pat);
        MklAllocator.dealloc(q, Layout::from_size_align(KEPT, 64).unwrap());
    }
}

/// `Vec<u8, A>::shrink_to_fit` from `BLOCK` to `KEPT` bytes: MKL's count
/// drops and the kept bytes survive.
fn vec_shrink_gives_memory_back<A: allocator_api2::alloc::Allocator>(a: A, what: &str) {
    let _one = MKL.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: AVec<u8, A> = AVec::with_capacity_in(BLOCK, a);
    v.extend_from_slice(&common::pattern_vec(KEPT, pat));
    let held = mkl_bytes();
    v.shrink_to_fit();
    assert_gave_back(what, held);
    assert_kept(&v);
}

#[test]
fn allocator_shrink_gives_memory_back() {
    vec_shrink_gives_memory_back(MklAllocator, "Vec<_, MklAllocator>::shrink_to_fit");
}

#[test]
fn split_allocator_shrink_gives_memory_back() {
    vec_shrink_gives_memory_back(
        MklSplitAllocator,
        "Vec<_, MklSplitAllocator>::shrink_to_fit",
    );
}

#[test]
fn shared_vec_shrinks_give_memory_back() {
    let _one = MKL.lock().unwrap_or_else(|e| e.into_inner());
    let filled = || {
        let v = SharedMklVec::<u8>::with_capacity(BLOCK);
        v.try_extend_from_slice(&common::pattern_vec(BLOCK, pat))
            .unwrap();
        v
    };

    let v = filled();
    v.try_truncate(KEPT).unwrap();
    let held = mkl_bytes();
    v.try_shrink_to_fit().unwrap();
    assert_gave_back("SharedMklVec::try_shrink_to_fit", held);
    assert_eq!(v.capacity(), KEPT);
    assert_kept(&v.view().unwrap());
    drop(v);

    let v = filled();
    let held = mkl_bytes();
    v.try_resize_exact(KEPT, 0).unwrap();
    assert_gave_back("SharedMklVec::try_resize_exact", held);
    assert_kept(&v.view().unwrap());
    drop(v);

    let mut v = filled();
    v.truncate(KEPT);
    let held = mkl_bytes();
    v.shrink_to_fit();
    assert_gave_back("SharedMklVec::shrink_to_fit", held);
    drop(v);
}

/// Below the rule (a mild shrink) the block stays where it is: no copy.
#[test]
fn a_mild_shrink_stays_in_place() {
    let _one = MKL.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: AVec<u8, MklAllocator> = AVec::with_capacity_in(BLOCK, MklAllocator);
    v.extend_from_slice(&common::pattern_vec(BLOCK * 3 / 4, pat));
    let before = v.as_ptr();
    v.shrink_to_fit();
    assert_eq!(v.as_ptr(), before, "a shrink to 3/4 moved the block");
}
