//! allocator-api2 0.4's `Allocator`, beside 0.2's (both always implemented).
//!
//! MKL's counts are process-wide: the tests of this binary run one at a
//! time, or one test's blocks show up in another's count.

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
    // Under Miri fewer elements (each push is interpreted).
    let n: u32 = if cfg!(miri) { 1_000 } else { 100_000 };
    let mut v: Vec<f64, MklAllocator> = Vec::new_in(MklAllocator);
    v.extend((0..n).map(f64::from));
    assert_eq!(v.as_ptr() as usize % 64, 0);
    assert_eq!(v[n as usize - 1], f64::from(n - 1));
    let during = manager::stats();
    assert!(
        during.bytes >= before.bytes + u64::from(n) * 8,
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
    let n = if cfg!(miri) { 1_000 } else { 10_000 };
    v.extend(std::iter::repeat_n(1u8, n));
    assert!(v.try_reserve(isize::MAX as usize / 2).is_err());
    assert_eq!(v.len(), n);
    assert!(v.iter().all(|&x| x == 1));
}
