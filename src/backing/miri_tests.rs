//! The backing under Miri's model of MKL (`ffi/miri`): large blocks are
//! placed in chunks exactly as MKL places them, and resized in them.
//! (Beside the backing, not the model: the test drives the hooks.)

use core::ffi::c_int;

use super::MIN_CHUNK;
use crate::ffi::{MKL_calloc, MKL_free, MKL_malloc, MKL_realloc, placement_of, realloc_alignment};

#[test]
fn large_blocks_are_placed_in_chunks_as_mkl_places_them() {
    // The hooks in MKL's pointers, as the setup puts them (unless
    // MKL_ALLOC_BACKING=off, which the tests under Miri do not set).
    super::install();
    assert_eq!(super::state(), super::Backing::Active);
    for (size, align) in [(1 << 20, 64), (3 << 20, 4096), (MIN_CHUNK - 88, 64)] {
        super::clear_last();
        // SAFETY: each pointer is the block's latest, used within its
        // size; the last one is freed once.
        unsafe {
            let p = MKL_calloc(1, size, align as c_int).cast::<u8>();
            let (chunk, _) = super::last_chunk().expect("served by a chunk");
            assert_eq!(
                p.addr(),
                chunk + align,
                "MKL's header and alignment in front"
            );
            assert_eq!(placement_of(p).0, chunk);
            assert!(placement_of(p).1);
            assert_eq!((*p, *p.add(size - 1)), (0, 0), "MKL_calloc zeroes");
            p.write_bytes(5, size);
            // Growth and shrink through i_realloc: the offset kept
            // (but where misaligned-realloc moves the block to 64).
            let after = realloc_alignment(align);
            let q = MKL_realloc(p.cast(), 2 * size).cast::<u8>();
            let chunk = super::last_chunk().expect("a chunk").0;
            assert_eq!(q.addr(), chunk + after);
            assert!((0..size).step_by(4093).all(|i| *q.add(i) == 5));
            assert_eq!(*q.add(size - 1), 5);
            let r = MKL_realloc(q.cast(), 100).cast::<u8>();
            assert_eq!(r.addr() % after, 0);
            assert!(placement_of(r).1, "a large block stays in its chunk");
            assert!((0..100).all(|i| *r.add(i) == 5));
            MKL_free(r.cast());
        }
    }
    // Below the floor with MKL's overhead: an exact block.
    super::clear_last();
    // SAFETY: freed once.
    unsafe {
        let p = MKL_malloc(MIN_CHUNK - 89, 64).cast::<u8>();
        assert!(super::last_chunk().is_none());
        assert!(!placement_of(p).1);
        MKL_free(p.cast());
    }
}
