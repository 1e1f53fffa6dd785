//! The backing with the block cache and huge pages both off (issue 30): the
//! hooks are MKL's, but they leave requests under 32 MiB to the C runtime
//! (an uncached chunk would cost a mapping per allocation). Such a block
//! comes back without a chunk, and must not be taken for MKL having run
//! before the setup (`Backing::MklRanFirst`): the state stays `Active`.
//!
//! One test: the state is process-wide.
#![cfg(all(target_os = "linux", not(miri)))]

use core::alloc::{GlobalAlloc, Layout};

use mkl_alloc::backing::{self, Backing};
use mkl_alloc::{MklAllocator, block_cache, huge_pages, manager};

const MIB: usize = 1 << 20;

#[test]
fn blocks_left_to_the_c_runtime_are_not_mkl_ran_first() {
    manager::init();
    block_cache::disable();
    huge_pages::disable();
    assert_eq!(backing::state(), Backing::Active);
    // Under 32 MiB: the C runtime's blocks, by the hooks' own rule.
    for size in [MIB, 16 * MIB, 31 * MIB] {
        let layout = Layout::from_size_align(size, 64).unwrap();
        // SAFETY: a non-zero size.
        let p = unsafe { MklAllocator.alloc(layout) };
        assert!(!p.is_null(), "{size} bytes");
        assert_eq!(
            backing::state(),
            Backing::Active,
            "after a block of {size} bytes"
        );
        // SAFETY: p is a live block of this layout.
        unsafe { MklAllocator.dealloc(p, layout) };
    }
    // From 32 MiB on a chunk serves it, cache or not; freed, it is not kept.
    let layout = Layout::from_size_align(32 * MIB, 64).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { MklAllocator.alloc(layout) };
    assert!(!p.is_null());
    assert_eq!(manager::stats().backing, Backing::Active);
    // SAFETY: p is a live block of this layout.
    unsafe { MklAllocator.dealloc(p, layout) };
    assert_eq!(block_cache::cached_bytes(), 0);
    assert_eq!(backing::state(), Backing::Active);
}
