//! MKL called before the crate's setup (issue 30's "MKL may run first": a
//! library or a constructor that calls MKL before the crate's own ELF
//! constructor). MKL copies its memory pointers at its first call, so the
//! hooks set afterwards are never called: the crate must say so
//! (`Backing::MklRanFirst`), keep none of MKL's blocks (no chunk, nothing
//! cached), and every block, from before the setup or after it, must be
//! freed and resized correctly.
//!
//! A constructor of this test binary, with a priority (`.init_array.00101`)
//! that runs it before the crate's unprioritised one, makes MKL's first
//! calls: one block below the chunk size and one above, both written.
#![cfg(all(target_os = "linux", not(miri)))]

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use mkl_alloc::backing::{self, Backing};
use mkl_alloc::{MklAllocator, block_cache, ffi, manager};

const MIB: usize = 1 << 20;
/// The blocks MKL served before the setup: (address, size).
static BEFORE: [(AtomicUsize, usize); 2] =
    [(AtomicUsize::new(0), 4096), (AtomicUsize::new(0), 8 * MIB)];

fn pattern(i: usize, seed: usize) -> u8 {
    (i.wrapping_mul(31) ^ seed) as u8
}

#[used]
#[unsafe(link_section = ".init_array.00101")]
static MKL_BEFORE_THE_SETUP: extern "C" fn() = {
    extern "C" fn first() {
        for (seed, (addr, size)) in BEFORE.iter().enumerate() {
            // SAFETY: MKL_malloc with a valid size and alignment; the block
            // is written within its size only.
            unsafe {
                let p = ffi::MKL_malloc(*size, 64).cast::<u8>();
                assert!(!p.is_null());
                for i in (0..*size).step_by(509) {
                    p.add(i).write(pattern(i, seed));
                }
                addr.store(p as usize, Relaxed);
            }
        }
    }
    first
};

fn check(p: *const u8, size: usize, seed: usize) {
    for i in (0..size).step_by(509) {
        // SAFETY: i < size, inside the live block.
        assert_eq!(unsafe { p.add(i).read() }, pattern(i, seed), "byte {i}");
    }
}

/// One test: the process-wide state is what it checks.
#[test]
fn mkl_first_then_the_setup() {
    manager::init();
    block_cache::enable(256 * MIB);
    // The setup ran (at load, after the constructor above): it set the
    // pointers, which MKL no longer reads. The first large block MKL
    // serves without a chunk shows it.
    let big = Layout::from_size_align(16 * MIB, 64).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { MklAllocator.alloc(big) };
    assert!(!p.is_null());
    assert_eq!(backing::state(), Backing::MklRanFirst);
    assert_eq!(manager::stats().backing, Backing::MklRanFirst);
    // SAFETY: p is a live block of this layout.
    unsafe { MklAllocator.dealloc(p, big) };
    // No chunk: MKL's blocks go back to the C runtime, nothing is cached,
    // and MKL's count drops with the free.
    assert_eq!(block_cache::cached_bytes(), 0);

    // The blocks from before the setup: resized (grown across the chunk
    // size, shrunk) with their contents, then freed.
    let (small, large) = (
        BEFORE[0].0.load(Relaxed) as *mut c_void,
        BEFORE[1].0.load(Relaxed) as *mut c_void,
    );
    check(small.cast(), 4096, 0);
    check(large.cast(), 8 * MIB, 1);
    let mut n = 0;
    let live_before = manager::stats().bytes;
    // SAFETY: blocks MKL_malloc returned, each resized and freed once.
    unsafe {
        let small = ffi::MKL_realloc(small, 4 * MIB);
        assert!(!small.is_null());
        check(small.cast(), 4096, 0);
        let large = ffi::MKL_realloc(large, 32 * MIB);
        assert!(!large.is_null());
        check(large.cast(), 8 * MIB, 1);
        let large = ffi::MKL_realloc(large, MIB);
        assert!(!large.is_null());
        check(large.cast(), MIB, 1);
        ffi::MKL_free(small);
        ffi::MKL_free(large);
        assert_eq!(ffi::MKL_Mem_Stat(&mut n) as u64, manager::stats().bytes);
    }
    assert_eq!(block_cache::cached_bytes(), 0);
    assert!(manager::stats().bytes + 8 * MIB as u64 <= live_before);
    block_cache::disable();
}
