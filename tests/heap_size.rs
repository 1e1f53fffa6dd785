//! `SharedMklVec::heap_size` against what MKL counts (`MKL_Mem_Stat`): the
//! block part of `heap_size` is exactly the growth of MKL's byte count when
//! the block is allocated, alignment padding included, for every size and
//! alignment tried (issue 18).
//!
//! MKL's counts are process-wide: the tests of this binary run one at a time.

use std::sync::Mutex;

use mkl_alloc::{SharedMklVec, manager};

static MKL: Mutex<()> = Mutex::new(());

const SIZES: [usize; 9] = [1, 7, 63, 64, 100, 4095, 4096, 100_000, 1 << 20];
const ALIGNS: [usize; 8] = [1, 64, 128, 256, 4096, 1 << 16, 1 << 20, 1 << 24];

#[test]
fn heap_size_is_what_mkl_counts() {
    let _one = MKL.lock().unwrap_or_else(|e| e.into_inner());
    // heap_size is what MKL counts for the block; a freed block the cache
    // kept would still be counted, so the cache is off here.
    mkl_alloc::block_cache::disable();
    let handle = size_of::<SharedMklVec<u8>>();
    for align in ALIGNS {
        for n in SIZES {
            let before = manager::stats().bytes;
            let v = SharedMklVec::<u8>::with_alignment(n, align).unwrap();
            let counted = (manager::stats().bytes - before) as usize;
            assert_eq!(
                v.heap_size(),
                counted + handle,
                "a block of {n} bytes aligned to {align}: MKL counts {counted} bytes, \
                 heap_size says {} (the handle is {handle})",
                v.heap_size()
            );
            drop(v);
        }
    }
}

#[test]
fn heap_size_follows_reallocation() {
    let _one = MKL.lock().unwrap_or_else(|e| e.into_inner());
    // heap_size is what MKL counts for the block; a freed block the cache
    // kept would still be counted, so the cache is off here.
    mkl_alloc::block_cache::disable();
    let handle = size_of::<SharedMklVec<f64>>();
    let before = manager::stats().bytes;
    let v = SharedMklVec::<f64>::with_alignment(10, 4096).unwrap();
    for len in [1000, 3, 1 << 17, 5] {
        v.try_resize_exact(len, 1.0).unwrap();
        let counted = (manager::stats().bytes - before) as usize;
        assert_eq!(
            v.heap_size(),
            counted + handle,
            "after a resize to {len} elements"
        );
    }
    drop(v);
    assert_eq!(manager::stats().bytes, before);
}
