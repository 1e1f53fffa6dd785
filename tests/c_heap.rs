//! `mkl_alloc::c_heap`: C's malloc contract over MKL blocks (size and
//! alignment in a header; small blocks in bins). Every test takes one lock:
//! MKL's statistics are process-wide, and one test checks them exactly.

mod common;

use std::sync::{Mutex, MutexGuard};
use std::thread;

use mkl_alloc::c_heap::{self, BIN_SLOTS, CHeap, SMALL_MAX};
use mkl_alloc::manager;

static SERIAL: Mutex<()> = Mutex::new(());

/// Valgrind's scale (`MKL_ALLOC_TEST_SCALE=small`): fewer blocks, and
/// alignments up to 2^22 only (a 2^30 alignment is a 1 GiB header).
fn small() -> bool {
    std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small")
}

/// Under Miri (which also runs at the small scale) byte-wise fills and
/// checks are interpreted: sizes stop at a few KiB and fewer alignments and
/// blocks are tried, through the same paths (bins, large blocks, headers).
fn miri() -> bool {
    cfg!(miri)
}

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn pattern(seed: u8) -> impl Fn(u8) -> u8 {
    move |i| i.wrapping_mul(31).wrapping_add(seed)
}

fn fill(p: *mut u8, len: usize, seed: u8) {
    // SAFETY: the caller's block holds `len` bytes.
    unsafe { common::fill(p, len, pattern(seed)) };
}

#[track_caller]
fn check(p: *const u8, len: usize, seed: u8) {
    // SAFETY: the caller's block holds at least `len` initialised bytes.
    unsafe { common::check(p, len, pattern(seed)) };
}

#[test]
fn alignment_rules_from_1_to_2_pow_30() {
    let _g = serial();
    let shifts: Vec<u32> = if miri() {
        vec![0, 1, 6, 7, 12, 13, 16, 21, 22]
    } else {
        (0..=if small() { 22 } else { 30 }).collect()
    };
    for shift in shifts {
        let align = 1usize << shift;
        let heap = CHeap::new(align).expect("a power of two up to 2^30");
        assert_eq!(heap.align(), align.max(64));
        // Small sizes for every alignment; a larger one where the header is small.
        let sizes: &[usize] = if shift <= 22 {
            &[
                0,
                1,
                63,
                64,
                65,
                1000,
                1024,
                1025,
                if miri() { 5000 } else { 100_000 },
            ]
        } else {
            &[1, 4096]
        };
        for &size in sizes {
            let p = heap.malloc(size);
            assert!(!p.is_null(), "malloc({size}) at alignment {align}");
            assert_eq!(p as usize % align.max(64), 0, "malloc({size}) at {align}");
            fill(p, size, 3);
            check(p, size, 3);
            // SAFETY: live block, freed once.
            unsafe { c_heap::free(p) };
            let z = c_heap::calloc(size, 1, align);
            assert!(!z.is_null() && z as usize % align.max(64) == 0);
            // SAFETY: z holds `size` zeroed bytes.
            unsafe { common::check(z, size, |_| 0) };
            // SAFETY: live block, freed once.
            unsafe { c_heap::free(z) };
        }
    }
    for bad in [0, 3, 48, 100, (1 << 30) + 1, 1 << 31, usize::MAX] {
        assert!(CHeap::new(bad).is_none(), "alignment {bad} accepted");
        assert!(c_heap::malloc(8, bad).is_null());
        assert!(c_heap::calloc(1, 8, bad).is_null());
    }
}

#[test]
fn zero_size_gets_a_real_unique_block() {
    let _g = serial();
    let a = c_heap::malloc(0, 64);
    let b = c_heap::malloc(0, 64);
    assert!(!a.is_null() && !b.is_null() && a != b);
    // SAFETY: a real block of at least one byte each.
    unsafe {
        a.write(1);
        b.write(2);
        assert_eq!((a.read(), b.read()), (1, 2));
        let c = c_heap::realloc(a, 0);
        assert_eq!(c.read(), 1);
        c_heap::free(c);
        c_heap::free(b);
    }
}

#[test]
fn calloc_overflow_is_null_never_a_short_block() {
    let _g = serial();
    let before = manager::stats();
    for (n, s) in [
        (usize::MAX, 2),
        (2, usize::MAX),
        (1 << 32, 1 << 32),
        (usize::MAX / 8 + 1, 8),
    ] {
        assert!(c_heap::calloc(n, s, 64).is_null(), "calloc({n}, {s})");
    }
    // Fits usize but not isize with the header: refused before MKL.
    assert!(c_heap::malloc(isize::MAX as usize, 64).is_null());
    assert!(c_heap::malloc(usize::MAX - 10, 64).is_null());
    assert_eq!(
        manager::stats().buffers,
        before.buffers,
        "nothing allocated"
    );
}

#[test]
fn calloc_zeroes_reused_small_blocks() {
    let _g = serial();
    // Dirty a small block and free it into its bin; calloc must not hand
    // the dirt back.
    let p = c_heap::malloc(500, 64);
    fill(p, 500, 1);
    // SAFETY: live block, freed once.
    unsafe { c_heap::free(p) };
    let z = c_heap::calloc(50, 10, 64);
    // SAFETY: z holds 500 zeroed bytes.
    assert!((0..500).all(|i| unsafe { z.add(i).read() } == 0));
    // SAFETY: live block, freed once.
    unsafe { c_heap::free(z) };
}

#[test]
fn realloc_keeps_contents_and_alignment() {
    let _g = serial();
    for align in [1, 64, 128, 4096, 8192, 1 << 16, 1 << 21] {
        let mut len = 1;
        let p = c_heap::malloc(len, align);
        fill(p, len, 7);
        let mut p = p;
        // Growth through the bins, past them, to large blocks; then shrinks
        // back down into the small classes.
        // (Valgrind's scale stops short of the MiB sizes: byte-wise checks.)
        let steps = [10, 100, 1000, 1024, 1025, 5000, 70_000, 3 << 20, 5 << 20];
        let (steps, down): (&[usize], &[usize]) = if miri() {
            (&steps[..6], &[2000, 1000, 64, 1])
        } else if small() {
            (&steps[..7], &[100_000, 2000, 1000, 64, 1])
        } else {
            (&steps[..], &[100_000, 2000, 1000, 64, 1])
        };
        for &new in steps.iter().chain(down) {
            // SAFETY: p is the live block; q replaces it.
            let q = unsafe { c_heap::realloc(p, new) };
            assert!(!q.is_null(), "realloc to {new} at {align}");
            assert_eq!(q as usize % align.max(64), 0, "realloc to {new} at {align}");
            check(q, len.min(new), 7);
            fill(q, new, 7);
            p = q;
            len = new;
        }
        // SAFETY: live block, freed once.
        unsafe { c_heap::free(p) };
    }
    // The heap's realloc takes null as a malloc from that heap.
    let heap = CHeap::new(1 << 13).unwrap();
    // SAFETY: null asks for a fresh block; freed once.
    unsafe {
        let p = heap.realloc(core::ptr::null_mut(), 100);
        assert!(!p.is_null() && p as usize % (1 << 13) == 0);
        c_heap::free(p);
    }
}

#[test]
fn failed_realloc_leaves_the_block_intact() {
    let _g = serial();
    let p = c_heap::malloc(3000, 256);
    fill(p, 3000, 5);
    // SAFETY: p is live; a failed realloc leaves it so.
    let q = unsafe { c_heap::realloc(p, isize::MAX as usize) };
    assert!(q.is_null());
    check(p, 3000, 5);
    // SAFETY: live block, freed once.
    unsafe { c_heap::free(p) };
}

#[test]
fn huge_pages_heap_advises_large_blocks_once() {
    let _g = serial();
    // The global policy is off in this test binary (no MKL_ALLOC_HUGE_PAGES),
    // so the heap's own option is what advises.
    if mkl_alloc::huge_pages::threshold().is_some()
        || !mkl_alloc::huge_pages::status().is_available()
    {
        return;
    }
    let heap = CHeap::new(64).unwrap().with_huge_pages(true);
    let before = mkl_alloc::huge_pages::advised_bytes();
    let p = heap.malloc(8 << 20);
    let advised = mkl_alloc::huge_pages::advised_bytes() - before;
    assert!(
        advised >= 6 << 20,
        "an 8 MiB block gets its 2 MiB-aligned interior advised, got {advised}"
    );
    // Contents across the growth: the first and last 64 KiB (byte-wise
    // checks of the whole block are slow under valgrind).
    let edges = |p: *mut u8, f: fn(*mut u8, usize, u8)| {
        f(p, 64 << 10, 1);
        // SAFETY: the block holds 8 MiB.
        f(unsafe { p.add((8 << 20) - (64 << 10)) }, 64 << 10, 2);
    };
    edges(p, fill);
    // Growth of an advised-heap block: the new block is advised too.
    let before = mkl_alloc::huge_pages::advised_bytes();
    // SAFETY: p is live; q replaces it.
    let q = unsafe { c_heap::realloc(p, 16 << 20) };
    assert!(mkl_alloc::huge_pages::advised_bytes() - before >= 14 << 20);
    edges(q, |p, n, s| check(p, n, s));
    // Below the threshold, and without the option: no advice.
    let before = mkl_alloc::huge_pages::advised_bytes();
    let small = heap.calloc(1, 3 << 20);
    let plain = c_heap::malloc(8 << 20, 64);
    assert_eq!(mkl_alloc::huge_pages::advised_bytes(), before);
    // SAFETY: live blocks, freed once.
    unsafe {
        c_heap::free(q);
        c_heap::free(small);
        c_heap::free(plain);
    }
}

#[test]
fn frees_on_other_threads_and_concurrent_bins() {
    /// A block handed to another thread (its pointer, provenance and all:
    /// Miri checks with strict provenance).
    struct Owned(*mut u8);
    // SAFETY: c_heap blocks may be used and freed on any thread; each
    // `Owned` is the block's only handle.
    unsafe impl Send for Owned {}

    let _g = serial();
    // Blocks made on 4 threads, freed on 4 others, while those also allocate.
    let made: Vec<Vec<Owned>> = thread::scope(|s| {
        let hs: Vec<_> = (0..4u8)
            .map(|t| {
                s.spawn(move || {
                    (0..if miri() {
                        16
                    } else if small() {
                        200
                    } else {
                        2000
                    })
                        .map(|i| {
                            let size = [0, 16, 200, 1000, 5000][i % 5];
                            let p = c_heap::malloc(size, [1, 64, 256][i % 3]);
                            assert!(!p.is_null());
                            fill(p, size, t);
                            Owned(p)
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    thread::scope(|s| {
        for (t, ptrs) in made.into_iter().enumerate() {
            s.spawn(move || {
                for (i, Owned(p)) in ptrs.into_iter().enumerate() {
                    let size = [0, 16, 200, 1000, 5000][i % 5];
                    check(p, size, t as u8);
                    // SAFETY: a live block made on another thread, freed once.
                    unsafe { c_heap::free(p) };
                    // Churn through the bins meanwhile.
                    let q = c_heap::malloc(i % 900, 64);
                    fill(q, i % 900, 9);
                    check(q, i % 900, 9);
                    // SAFETY: live block, freed once.
                    unsafe { c_heap::free(q) };
                }
            });
        }
    });
}

#[test]
fn release_cached_gives_mkl_its_bytes_back() {
    let _g = serial();
    manager::free_buffers();
    let before = manager::stats();
    // Fill every bin of one class and more: BIN_SLOTS blocks are cached,
    // the rest go back to MKL at once.
    let ptrs: Vec<*mut u8> = (0..BIN_SLOTS + 5)
        .map(|_| c_heap::malloc(100, 64))
        .collect();
    let big: Vec<*mut u8> = (0..3).map(|_| c_heap::malloc(SMALL_MAX + 1, 64)).collect();
    let live = manager::stats();
    assert_eq!(live.buffers, before.buffers + BIN_SLOTS as u64 + 8);
    for p in ptrs.into_iter().chain(big) {
        // SAFETY: live blocks, freed once.
        unsafe { c_heap::free(p) };
    }
    let cached = manager::stats();
    assert_eq!(
        cached.buffers,
        before.buffers + BIN_SLOTS as u64,
        "a full bin keeps BIN_SLOTS blocks and frees the rest; large blocks are not cached"
    );
    // A cached block is reused: no new MKL block for the next request.
    let again = c_heap::malloc(120, 64); // the 128-byte class, as 100
    assert_eq!(manager::stats().buffers, cached.buffers);
    // SAFETY: live block, freed once.
    unsafe { c_heap::free(again) };
    // Drained from another thread.
    thread::spawn(manager::free_buffers).join().unwrap();
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "MKL's bytes back to where they were"
    );
}
