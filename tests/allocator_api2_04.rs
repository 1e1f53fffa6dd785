//! allocator-api2 0.4's `Allocator` (feature `allocator-api2-04`), beside 0.2's.
//!
//! MKL's counts are process-wide: the tests of this binary run one at a
//! time, or one test's blocks show up in another's count.
#![cfg(feature = "allocator-api2-04")]

use std::sync::{Mutex, MutexGuard};

use allocator_api2_04::{boxed::Box, vec::Vec};
use mkl_alloc::{MklAllocator, MklSplitAllocator, manager};

static MKL: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    MKL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn vec_and_box_in_mkl_memory() {
    let _one = one_at_a_time();
    let before = manager::stats();
    let mut v: Vec<f64, MklAllocator> = Vec::new_in(MklAllocator);
    v.extend((0..100_000).map(f64::from));
    assert_eq!(v.as_ptr() as usize % 64, 0);
    assert_eq!(v[99_999], 99_999.0);
    let during = manager::stats();
    assert!(
        during.bytes >= before.bytes + 800_000,
        "{before:?} -> {during:?}"
    );
    let b = Box::new_in([7u8; 100], MklAllocator);
    assert_eq!(b.as_ptr() as usize % 64, 0);
}

#[test]
fn failure_is_an_error_not_an_abort() {
    let _one = one_at_a_time();
    let mut v: Vec<u8, MklSplitAllocator> = Vec::new_in(MklSplitAllocator);
    assert!(v.try_reserve(isize::MAX as usize / 2).is_err());
    v.extend(std::iter::repeat_n(1u8, 10_000));
    assert!(v.try_reserve(isize::MAX as usize / 2).is_err());
    assert_eq!(v.len(), 10_000);
    assert!(v.iter().all(|&x| x == 1));
}
