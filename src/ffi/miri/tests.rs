//! The emulation keeps the contract the crate relies on (each property
//! measured on the real MKL elsewhere: tests/binding.rs, tests/manager.rs,
//! tests/fast_mm.rs and the realloc notes in src/allocator.rs).

use core::ffi::c_int;
use core::ptr;

use super::blocks::{Block, table};
use super::large::HEADER;
use super::large::LARGE as MIN_CHUNK;
use super::machine::{MEMORY, c_calloc, c_free, c_malloc, c_realloc, system_free};
use super::malloc::{MKL_calloc, MKL_free, MKL_malloc, MKL_realloc, allocate, reallocate};
use super::mode::{Mode, mode};
use super::placement::{fits, padded};
use super::statistics::{
    MKL_Free_Buffers, MKL_Mem_Stat, MKL_Peak_Mem_Usage, MKL_Set_Memory_Limit,
    MKL_Thread_Free_Buffers,
};
use crate::ffi::{
    MKL_MEM_MCDRAM, MKL_PEAK_MEM, MKL_PEAK_MEM_DISABLE, MKL_PEAK_MEM_ENABLE, MKL_PEAK_MEM_RESET,
};

fn stats() -> (i64, c_int) {
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    let bytes = unsafe { MKL_Mem_Stat(&mut n) };
    (bytes, n)
}

#[test]
fn malloc_aligns_to_max_of_64_and_a_power_of_two() {
    for (asked, want) in [
        (0, 64),
        (1, 64),
        (3, 64),
        (64, 64),
        (128, 128),
        (1 << 16, 1 << 16),
    ] {
        // SAFETY: freed below.
        let p = unsafe { MKL_malloc(10, asked) };
        assert!(!p.is_null());
        assert_eq!(p.addr() % want, 0, "align {asked}");
        // SAFETY: a live block, freed once.
        unsafe { MKL_free(p) };
    }
}

/// The live block at `p` as the table holds it.
fn entry(p: *mut u8) -> Block {
    table().get(p.addr()).expect("a live block")
}

/// Whether MKL takes a block of `size` bytes at `align` from `i_malloc`.
fn large(size: usize, align: usize) -> bool {
    size + align + HEADER >= MIN_CHUNK
}

#[test]
fn every_alignment_up_to_2_pow_30_gets_an_exact_block_or_one_from_i_malloc() {
    for mode in [Mode::Default, Mode::ExactAlign] {
        for shift in [6, 12, 13, 19, 20, 29, 30] {
            let align = 1usize << shift;
            let large = large(200, align);
            // SAFETY: 100 bytes, realloc keeps the alignment and the
            // contents, freed once.
            unsafe {
                let p = allocate(100, align, false, mode);
                assert_eq!(p.addr() % align, 0, "{mode:?} 2^{shift}");
                assert_eq!(entry(p).large, large, "{mode:?} 2^{shift}: {:?}", entry(p));
                assert!(
                    large || entry(p).exact(),
                    "{mode:?} 2^{shift}: {:?}",
                    entry(p)
                );
                p.write_bytes(7, 100);
                let q = reallocate(p, 200, mode);
                assert_eq!(q.addr() % align, 0, "realloc, {mode:?} 2^{shift}");
                assert_eq!(entry(q).large, large, "{mode:?} 2^{shift}: {:?}", entry(q));
                assert!(
                    large || entry(q).exact(),
                    "{mode:?} 2^{shift}: {:?}",
                    entry(q)
                );
                assert_eq!(*q.add(99), 7);
                MKL_free(q.cast());
            }
        }
    }
}

#[test]
fn the_c_runtime_stand_ins_keep_malloc_s_contract() {
    // SAFETY: each block is the latest, used within its size, freed once.
    unsafe {
        let p = c_malloc(40).cast::<u8>();
        assert_eq!(p.addr() % 16, 0);
        p.write_bytes(1, 40);
        let q = c_realloc(p.cast(), 4000).cast::<u8>();
        assert!((0..40).all(|i| *q.add(i) == 1));
        assert!(c_realloc(q.cast(), MEMORY).is_null(), "no room: null");
        assert_eq!(*q.add(39), 1, "the block intact");
        assert!(c_realloc(q.cast(), 0).is_null(), "size 0 frees");
        let z = c_calloc(3, 100).cast::<u8>();
        assert!((0..300).all(|i| *z.add(i) == 0));
        c_free(z.cast());
        assert!(c_calloc(usize::MAX, 2).is_null());
        c_free(ptr::null_mut());
    }
}

#[test]
fn exact_align_blocks_are_not_aligned_to_twice_their_alignment() {
    // Up to 2^19: beyond, with MKL's overhead, every block is large,
    // placed where i_malloc's memory puts it.
    for shift in [6, 7, 12, 13, 19] {
        let align = 1usize << shift;
        let exactly = |p: *mut u8| p.addr() % align == 0 && p.addr() % (2 * align) != 0;
        // Several blocks live at once: each placed exactly.
        let blocks: Vec<*mut u8> = (0..4)
            .map(|i| allocate(64 << i, align, i % 2 == 1, Mode::ExactAlign))
            .collect();
        for (i, &p) in blocks.iter().enumerate() {
            assert!(exactly(p), "2^{shift}: {p:p}");
            assert!(entry(p).exact(), "2^{shift}: {:?}", entry(p));
            // SAFETY: a live block of 64 << i bytes; realloc moves it
            // (keeping its contents) and the result is freed once.
            unsafe {
                p.write_bytes(3, 64 << i);
                let q = reallocate(p, 100 << i, Mode::ExactAlign);
                assert!(exactly(q), "realloc, 2^{shift}: {q:p}");
                assert_ne!(q, p, "exact-align moves");
                assert_eq!(*q.add((64 << i) - 1), 3);
                MKL_free(q.cast());
            }
        }
    }
}

#[test]
fn misaligned_realloc_moves_blocks_to_exactly_64() {
    for align in [128, 4096, 1 << 30] {
        // SAFETY: 100 bytes, moved by realloc with their contents; the
        // result is freed once.
        unsafe {
            let p = allocate(100, align, false, Mode::MisalignedRealloc);
            assert_eq!(p.addr() % align, 0);
            if !large(300, align) {
                // Placed exactly; a large block is where its memory
                // puts it.
                assert_eq!(p.addr() % (2 * align), align);
            }
            p.write_bytes(4, 100);
            let q = reallocate(p, 300, Mode::MisalignedRealloc);
            assert_eq!((q.addr() % 64, q.addr() % 128), (0, 64), "align {align}");
            assert_eq!(entry(q).align, 64);
            assert!((0..100).all(|i| *q.add(i) == 4));
            MKL_free(q.cast());
        }
    }
}

#[test]
fn in_place_keeps_the_address_while_the_room_allows() {
    // SAFETY: each pointer is the block's latest, used within its
    // size, and the last one is freed once.
    unsafe {
        let p = allocate(100, 128, false, Mode::InPlace);
        assert_eq!(p.addr() % 128, 0);
        assert_eq!(entry(p).capacity(), 200);
        p.write_bytes(5, 100);
        // Growth into the room: same address, contents kept, MKL's
        // count unchanged (all that is held: as MKL's own for a block
        // resized in place).
        let q = reallocate(p, 200, Mode::InPlace);
        assert_eq!(q.addr(), p.addr(), "grown in place");
        assert!((0..100).all(|i| *q.add(i) == 5));
        assert_eq!((entry(q).size, entry(q).counted), (200, 200));
        q.write_bytes(6, 200);
        // Every shrink is in place; growing back too.
        let r = reallocate(q, 10, Mode::InPlace);
        assert_eq!(r.addr(), p.addr(), "shrunk in place");
        let s = reallocate(r, 150, Mode::InPlace);
        assert_eq!(s.addr(), p.addr(), "grown back in place");
        assert!((0..10).all(|i| *s.add(i) == 6));
        // Beyond the room: moved, contents and alignment kept, counted
        // afresh (the new size and its room).
        let t = reallocate(s, 1000, Mode::InPlace);
        assert_ne!(t.addr(), p.addr(), "moved");
        assert_eq!(t.addr() % 128, 0);
        assert!((0..10).all(|i| *t.add(i) == 6));
        assert_eq!((entry(t).size, entry(t).counted), (1000, 2000));
        MKL_free(t.cast());
    }
}

#[test]
fn in_place_calloc_zeroes_the_block_and_leaves_the_room() {
    // SAFETY: 64 zeroed bytes with 64 of room; freed once.
    unsafe {
        let p = allocate(64, 64, true, Mode::InPlace);
        assert!((0..64).all(|i| *p.add(i) == 0));
        MKL_free(p.cast());
    }
}

#[test]
fn the_fallback_placement_fits() {
    for (mode, shift) in [
        (Mode::Default, 30),
        (Mode::ExactAlign, 6),
        (Mode::ExactAlign, 29),
        (Mode::ExactAlign, 30),
    ] {
        let align = 1usize << shift;
        let (base, outer, pad) = padded(100, align, false, mode).expect("room");
        assert!(fits(base.addr() + pad, align, mode), "{mode:?} 2^{shift}");
        assert!(pad + 100 <= outer.size(), "{mode:?} 2^{shift}: inside");
        // SAFETY: allocated by `padded`, freed once.
        unsafe { system_free(base, outer) };
    }
}

#[test]
fn the_mode_is_the_environments() {
    assert_eq!(Mode::parse(None), Some(Mode::Default));
    assert_eq!(Mode::parse(Some(b"")), Some(Mode::Default));
    assert_eq!(Mode::parse(Some(b"default")), Some(Mode::Default));
    assert_eq!(Mode::parse(Some(b"in-place")), Some(Mode::InPlace));
    assert_eq!(Mode::parse(Some(b"exact-align")), Some(Mode::ExactAlign));
    assert_eq!(
        Mode::parse(Some(b"misaligned-realloc")),
        Some(Mode::MisalignedRealloc)
    );
    assert_eq!(Mode::parse(Some(b"exact")), None);
    let var = std::env::var_os("MKL_ALLOC_MIRI_MODE");
    let want = Mode::parse(var.as_ref().map(|v| v.as_encoded_bytes()));
    assert_eq!(Some(mode()), want, "MKL_ALLOC_MIRI_MODE={var:?}");
}

#[test]
fn size_zero_and_impossible_sizes_are_null() {
    // SAFETY: no block is returned.
    unsafe {
        assert!(MKL_malloc(0, 64).is_null());
        assert!(MKL_calloc(1, 0, 64).is_null());
        assert!(MKL_malloc(MEMORY + 1, 64).is_null());
        assert!(MKL_malloc(usize::MAX, 64).is_null());
    }
}

#[test]
fn calloc_zeroes_and_realloc_keeps_the_prefix() {
    // SAFETY: 64 zeroed bytes, grown then shrunk, freed once.
    unsafe {
        let p = MKL_calloc(1, 64, 128).cast::<u8>();
        assert!((0..64).all(|i| *p.add(i) == 0));
        p.write_bytes(5, 64);
        let q = MKL_realloc(p.cast(), 1000).cast::<u8>();
        // Except where the mode breaks that on purpose.
        let kept = if mode() == Mode::MisalignedRealloc {
            64
        } else {
            128
        };
        assert_eq!(q.addr() % kept, 0, "realloc keeps the block's alignment");
        assert!((0..64).all(|i| *q.add(i) == 5));
        let r = MKL_realloc(q.cast(), 10).cast::<u8>();
        assert!((0..10).all(|i| *r.add(i) == 5));
        MKL_free(r.cast());
    }
}

#[test]
fn a_failed_realloc_leaves_the_block_intact() {
    // SAFETY: the block stays live after the failed realloc; freed once.
    unsafe {
        let p = MKL_malloc(16, 64).cast::<u8>();
        p.write_bytes(9, 16);
        assert!(MKL_realloc(p.cast(), MEMORY).is_null());
        assert!((0..16).all(|i| *p.add(i) == 9));
        MKL_free(p.cast());
    }
}

#[test]
fn mem_stat_counts_live_bytes_and_blocks() {
    // Other tests allocate concurrently: check with a margin that only
    // this test's blocks can explain.
    let (b0, n0) = stats();
    // SAFETY: freed below.
    let p = unsafe { MKL_malloc(1 << 20, 64) };
    let (b1, n1) = stats();
    assert!(b1 >= b0 + (1 << 20) - (1 << 16), "{b0} -> {b1}");
    assert!(n1 >= 1, "{n0} -> {n1} blocks");
    // SAFETY: a live block, freed once.
    unsafe { MKL_free(p) };
    let (b2, _) = stats();
    assert!(b2 <= b1 - (1 << 20) + (1 << 16), "{b1} -> {b2}");
}

#[test]
fn peak_is_relative_to_enabling_and_minus_one_while_off() {
    // SAFETY: the peak calls take a mode by value; the block is freed once.
    unsafe {
        assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_DISABLE), 0);
        assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM), -1);
        assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_ENABLE), 0);
        let p = MKL_malloc(1 << 20, 64);
        assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM) >= 1 << 20);
        MKL_free(p);
        assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_RESET) >= 1 << 20);
        assert!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM) < 1 << 20);
        assert_eq!(MKL_Peak_Mem_Usage(MKL_PEAK_MEM_DISABLE), 0);
    }
}

#[test]
fn free_of_null_and_the_buffer_and_limit_calls_are_accepted() {
    // SAFETY: null is accepted; the buffer calls take no arguments.
    unsafe {
        MKL_free(ptr::null_mut());
        MKL_Free_Buffers();
        MKL_Thread_Free_Buffers();
        assert_eq!(MKL_Set_Memory_Limit(MKL_MEM_MCDRAM, 1 << 30), 0);
        assert_eq!(MKL_Set_Memory_Limit(7, 1 << 30), -1);
    }
}
