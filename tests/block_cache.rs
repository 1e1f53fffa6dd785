//! The block cache (`mkl_alloc::block_cache`): budget, fit and alignment
//! rules, decay, `free_buffers`, the statistics, every allocation path it
//! serves, the environment variable, and a model of alloc/grow/shrink/free
//! sequences with the cache on.
//!
//! The cache and MKL's counts are process-wide: every test takes `serial()`
//! and leaves the cache off and empty.

mod common;

use core::alloc::{GlobalAlloc, Layout};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec, block_cache, huge_pages, manager};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time, starting with the cache and huge pages off and empty,
/// and a decay time no test reaches (a slow run, under valgrind say, must not
/// see blocks decay); `unused_blocks_decay` sets its own.
fn serial() -> MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    block_cache::disable();
    huge_pages::disable();
    block_cache::set_decay_ms(3_600_000);
    g
}

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

/// A fresh MKL block (through the allocator) with a pattern written in.
fn block(size: usize, align: usize, seed: u8) -> *mut u8 {
    // SAFETY: a non-zero size.
    let p = unsafe { MklAllocator.alloc(layout(size, align)) };
    assert!(!p.is_null(), "allocating {size} B at {align} failed");
    assert_eq!(p as usize % align.max(64), 0);
    fill(p, size, seed);
    p
}

/// Bytes between the probes `fill` writes and `check` reads: a prime, so
/// that they fall on every offset within a page. Under Miri a larger one:
/// each scattered write splits Miri's per-allocation bookkeeping, and a
/// thousand probes in a 4 MiB block took a second.
const STRIDE: usize = if cfg!(miri) { 65_521 } else { 4093 };

fn fill(p: *mut u8, size: usize, seed: u8) {
    for i in (0..size).step_by(STRIDE) {
        // SAFETY: i < size, inside the block.
        unsafe { p.add(i).write((i as u8).wrapping_add(seed)) };
    }
}

fn check(p: *const u8, size: usize, seed: u8) {
    for i in (0..size).step_by(STRIDE) {
        // SAFETY: i < size, inside the block.
        assert_eq!(
            unsafe { p.add(i).read() },
            (i as u8).wrapping_add(seed),
            "byte {i}"
        );
    }
}

fn free(p: *mut u8, size: usize, align: usize) {
    // SAFETY: p is a live block of this layout from MklAllocator.
    unsafe { MklAllocator.dealloc(p, layout(size, align)) };
}

#[test]
fn a_freed_block_is_reused_and_free_buffers_gives_it_back() {
    let _s = serial();
    let before = manager::stats();
    block_cache::enable(64 * MIB);
    let p = block(8 * MIB, 64, 1);
    free(p, 8 * MIB, 64);
    // Still MKL's, counted by MKL_Mem_Stat, reported as cached.
    let cached = manager::stats();
    assert_eq!(block_cache::cached_bytes(), 8 * MIB);
    assert_eq!(
        (cached.cached_bytes, cached.cached_buffers),
        (8 * MIB as u64, 1)
    );
    assert!(cached.bytes >= before.bytes + 8 * MIB as u64);
    assert_eq!(cached.buffers, before.buffers + 1);
    assert_eq!(cached.live_bytes(), cached.bytes - 8 * MIB as u64);

    let q = block(8 * MIB, 64, 2);
    assert_eq!(q, p, "the cached block serves the same request");
    assert_eq!(block_cache::cached_bytes(), 0);
    free(q, 8 * MIB, 64);

    manager::free_buffers();
    assert_eq!(block_cache::cached_bytes(), 0);
    let after = manager::stats();
    assert_eq!((after.bytes, after.buffers), (before.bytes, before.buffers));
    assert_eq!((after.cached_bytes, after.cached_buffers), (0, 0));
    block_cache::disable();
}

#[test]
fn the_budget_is_never_exceeded() {
    let _s = serial();
    let before = manager::stats();
    block_cache::enable(5 * MIB);
    let blocks: Vec<*mut u8> = (0..4).map(|i| block(2 * MIB, 64, i)).collect();
    for &p in &blocks {
        free(p, 2 * MIB, 64);
        assert!(block_cache::cached_bytes() <= 5 * MIB);
    }
    // Two 2 MiB blocks fit a 5 MiB budget; the other two went back to MKL.
    assert_eq!(block_cache::cached_bytes(), 4 * MIB);
    assert_eq!(manager::stats().buffers, before.buffers + 2);
    // A block larger than the whole budget is never kept.
    let big = block(6 * MIB, 64, 9);
    free(big, 6 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), 4 * MIB);
    // Lowering the budget below what is held empties the cache.
    block_cache::enable(MIB);
    assert_eq!(block_cache::cached_bytes(), 0);
    assert_eq!(manager::stats().buffers, before.buffers);
    block_cache::disable();
}

#[test]
fn a_block_serves_only_requests_it_fits_within_an_eighth() {
    let _s = serial();
    block_cache::enable(64 * MIB);
    let p = block(4 * MIB, 64, 3);
    free(p, 4 * MIB, 64);
    // 3 MiB would waste a quarter of the 4 MiB block: a fresh block.
    let small = block(3 * MIB, 64, 4);
    assert_ne!(small, p);
    // Larger than the block: never.
    let large = block(4 * MIB + 64, 64, 5);
    assert_ne!(large, p);
    // 4 MiB - 1/9 of it wastes less than an eighth: the cached block.
    let fit = block(4 * MIB - 4 * MIB / 9, 64, 6);
    assert_eq!(fit, p);
    free(fit, 4 * MIB - 4 * MIB / 9, 64);
    free(small, 3 * MIB, 64);
    free(large, 4 * MIB + 64, 64);
    block_cache::disable();
    assert_eq!(block_cache::cached_bytes(), 0);
}

#[test]
fn a_block_serves_only_alignments_its_address_meets() {
    let _s = serial();
    block_cache::enable(64 * MIB);
    let p = block(2 * MIB, 64, 7);
    // The smallest power of two the address is *not* a multiple of.
    let unmet = 2 * (1usize << (p as usize).trailing_zeros());
    free(p, 2 * MIB, 64);
    let q = block(2 * MIB, unmet, 8);
    assert_ne!(q, p, "a block at {p:p} cannot serve alignment {unmet}");
    assert_eq!(q as usize % unmet, 0);
    free(q, 2 * MIB, unmet);
    // An alignment the address meets takes it (the most recent first when
    // sizes tie, so q, then p).
    let r = block(2 * MIB, unmet / 2, 9);
    assert!(r == p || r == q);
    free(r, 2 * MIB, unmet / 2);
    block_cache::disable();
}

#[test]
fn unused_blocks_decay() {
    let _s = serial();
    let before = manager::stats();
    block_cache::enable(64 * MIB);
    let p = block(2 * MIB, 64, 1);
    free(p, 2 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), 2 * MIB);
    block_cache::set_decay_ms(200);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The next large operation sweeps: the idle block goes back to MKL.
    let q = block(3 * MIB, 64, 2);
    assert_eq!(block_cache::cached_bytes(), 0);
    assert_eq!(manager::stats().buffers, before.buffers + 1);
    free(q, 3 * MIB, 64);
    block_cache::disable();
    assert_eq!(manager::stats().buffers, before.buffers);
}

#[test]
fn small_blocks_and_a_disabled_cache_go_straight_back_to_mkl() {
    let _s = serial();
    let before = manager::stats();
    block_cache::enable(64 * MIB);
    let p = block(block_cache::MIN_BLOCK - 64, 64, 1);
    free(p, block_cache::MIN_BLOCK - 64, 64);
    assert_eq!(block_cache::cached_bytes(), 0);
    block_cache::disable();
    let p = block(8 * MIB, 64, 1);
    free(p, 8 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), 0);
    assert_eq!(manager::stats().buffers, before.buffers);
}

#[test]
fn growth_takes_a_cached_block_and_caches_the_old_one() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    let target = block(16 * MIB, 64, 0);
    free(target, 16 * MIB, 64);
    let mut v: AVec<u8, MklAllocator> = AVec::with_capacity_in(8 * MIB, MklAllocator);
    // SAFETY: 8 MiB of capacity, all written before they count as elements
    // (one memset: a `resize` is a loop of 8 million steps under Miri).
    unsafe {
        v.as_mut_ptr().write_bytes(7, 8 * MIB);
        v.set_len(8 * MIB);
    }
    let old = v.as_ptr();
    v.reserve_exact(16 * MIB - v.len());
    assert_eq!(
        v.as_ptr(),
        target.cast_const(),
        "the growth took the cached block"
    );
    common::check_slice(&v, |_| 7);
    assert_eq!(
        block_cache::cached_bytes(),
        8 * MIB,
        "the old block is cached"
    );
    let again: AVec<u8, MklAllocator> = AVec::with_capacity_in(8 * MIB, MklAllocator);
    assert_eq!(again.as_ptr(), old);
    drop((v, again));
    block_cache::disable();
}

#[test]
fn zeroed_blocks_from_the_cache_are_zero() {
    let _s = serial();
    block_cache::enable(64 * MIB);
    let p = block(4 * MIB, 64, 0xAB);
    free(p, 4 * MIB, 64);
    // SAFETY: a non-zero size.
    let z = unsafe { MklAllocator.alloc_zeroed(layout(4 * MIB, 64)) };
    assert_eq!(z, p);
    // SAFETY: 4 MiB of initialised (zeroed) bytes.
    unsafe { common::check(z, 4 * MIB, |_| 0) };
    free(z, 4 * MIB, 64);
    block_cache::disable();
}

#[test]
fn shared_vec_and_the_split_allocator_use_the_cache() {
    let _s = serial();
    block_cache::enable(64 * MIB);
    let v = SharedMklVec::<f64>::with_capacity(MIB); // 8 MiB
    let p = v.view().unwrap().as_ptr();
    drop(v);
    assert_eq!(block_cache::cached_bytes(), 8 * MIB);
    let split = MklSplitAllocator::<4096>;
    // SAFETY: a non-zero size.
    let q = unsafe { split.alloc(layout(8 * MIB, 64)) };
    assert_eq!(q.cast_const(), p.cast::<u8>());
    // SAFETY: allocated just above with this layout.
    unsafe { split.dealloc(q, layout(8 * MIB, 64)) };
    assert_eq!(block_cache::cached_bytes(), 8 * MIB);
    let w = SharedMklVec::<f64>::with_capacity(MIB);
    assert_eq!(w.view().unwrap().as_ptr(), p);
    drop(w);
    block_cache::disable();
}

#[test]
#[cfg_attr(miri, ignore = "madvise: Miri has no pages to advise")]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "THP advice is Linux's: on Windows no block is advised"
)]
fn cached_blocks_keep_their_huge_page_advice() {
    let _s = serial();
    block_cache::enable(64 * MIB);
    huge_pages::enable(huge_pages::HUGE_PAGE_SIZE);
    let advised = huge_pages::advised_bytes();
    let p = block(8 * MIB, 64, 1);
    let first = huge_pages::advised_bytes() - advised;
    free(p, 8 * MIB, 64);
    let q = block(8 * MIB, 64, 2);
    assert_eq!(q, p);
    // Reuse advises the block again (one system call; the range keeps the
    // advice it had), so that a block cached while the policy was off
    // gets it too.
    assert_eq!(huge_pages::advised_bytes() - advised, 2 * first);
    free(q, 8 * MIB, 64);
    huge_pages::disable();
    let r = block(8 * MIB, 64, 3);
    free(r, 8 * MIB, 64);
    huge_pages::enable(huge_pages::HUGE_PAGE_SIZE);
    let before = huge_pages::advised_bytes();
    let s = block(8 * MIB, 64, 4);
    assert_eq!(s, r, "the block cached while the policy was off");
    assert!(huge_pages::advised_bytes() - before >= (6 * MIB) as u64);
    free(s, 8 * MIB, 64);
    huge_pages::disable();
    block_cache::disable();
}

#[test]
fn threads_trading_large_blocks_keep_their_contents() {
    let _s = serial();
    let before = manager::stats();
    block_cache::enable(32 * MIB);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                // Under Miri (interpreted) fewer rounds of the same trades.
                for i in 0..if cfg!(miri) { 12 } else { 200usize } {
                    let size = MIB + ((i * 7919 + t as usize * 104_729) % (3 * MIB));
                    let align = 64 << (i % 7);
                    let p = block(size, align, t.wrapping_add(i as u8));
                    check(p, size, t.wrapping_add(i as u8));
                    free(p, size, align);
                    assert!(block_cache::cached_bytes() <= 32 * MIB);
                }
            });
        }
    });
    manager::free_buffers();
    let after = manager::stats();
    assert_eq!((after.bytes, after.buffers), (before.bytes, before.buffers));
    block_cache::disable();
}

/// Runs `env_child` in a fresh process with `MKL_ALLOC_BLOCK_CACHE=value`.
fn run_child(value: Option<&str>, expect: &str) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "env_child", "--ignored", "--test-threads=1"]);
    match value {
        Some(v) => cmd.env("MKL_ALLOC_BLOCK_CACHE", v),
        None => cmd.env_remove("MKL_ALLOC_BLOCK_CACHE"),
    };
    let out = cmd.env("MKL_ALLOC_BC_EXPECT", expect).output().unwrap();
    assert!(
        out.status.success(),
        "MKL_ALLOC_BLOCK_CACHE={value:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn the_environment_variable_sets_the_budget() {
    let _s = serial();
    let default = block_cache::default_budget().to_string();
    run_child(None, &default); // on by default
    run_child(Some(""), &default);
    run_child(Some("off"), "off");
    run_child(Some("0"), "off");
    run_child(Some("on"), &default);
    run_child(Some("67108864"), "67108864");
    run_child(Some("lots"), &default); // a typo keeps the default
}

/// The child half of `the_environment_variable_sets_the_budget`.
#[test]
#[ignore = "run by the_environment_variable_sets_the_budget in a child process"]
fn env_child() {
    let expect = std::env::var("MKL_ALLOC_BC_EXPECT").expect("run as a child");
    // The first large free reads the variable.
    let p = block(2 * MIB, 64, 0);
    free(p, 2 * MIB, 64);
    let budget = block_cache::budget();
    match expect.as_str() {
        "off" => assert_eq!((budget, block_cache::cached_bytes()), (None, 0)),
        n => {
            assert_eq!(budget, Some(n.parse().unwrap()));
            assert_eq!(block_cache::cached_bytes(), 2 * MIB);
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: usize, align_log: u32 },
    Resize { which: usize, size: usize },
    Free { which: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1usize..4096, MIB / 2..6 * MIB];
    prop_oneof![
        (size.clone(), 0u32..13).prop_map(|(size, align_log)| Op::Alloc { size, align_log }),
        (any::<usize>(), size).prop_map(|(which, size)| Op::Resize { which, size }),
        any::<usize>().prop_map(|which| Op::Free { which }),
    ]
}

proptest! {
    // Under Miri (interpreted) 4 shorter sequences.
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 64 }))]

    /// Alloc / realloc / free sequences with the cache on (a small budget,
    /// so blocks are refused and evicted too): every live block keeps its
    /// contents and alignment, the cache stays within its budget, and
    /// `free_buffers` brings MKL's counts back to where they were.
    #[test]
    fn sequences_with_the_cache_on(
        ops in proptest::collection::vec(op(), 1..if cfg!(miri) { 12 } else { 40 })
    ) {
        let _s = serial();
        let before = manager::stats();
        block_cache::enable(12 * MIB);
        let mut live: Vec<(*mut u8, usize, usize, u8)> = Vec::new();
        for (k, op) in ops.into_iter().enumerate() {
            let seed = k as u8;
            match op {
                Op::Alloc { size, align_log } => {
                    let align = 1usize << align_log;
                    live.push((block(size, align, seed), size, align, seed));
                }
                Op::Resize { which, size } if !live.is_empty() => {
                    let i = which % live.len();
                    let (p, old, align, s) = live[i];
                    // SAFETY: a live block of (old, align); size > 0.
                    let q = unsafe { MklAllocator.realloc(p, layout(old, align), size) };
                    prop_assert!(!q.is_null());
                    prop_assert_eq!(q as usize % align.max(64), 0);
                    check(q, old.min(size), s);
                    fill(q, size, seed);
                    live[i] = (q, size, align, seed);
                }
                Op::Free { which } if !live.is_empty() => {
                    let (p, size, align, s) = live.swap_remove(which % live.len());
                    check(p, size, s);
                    free(p, size, align);
                }
                _ => {}
            }
            prop_assert!(block_cache::cached_bytes() <= 12 * MIB);
            for &(p, size, _, s) in &live {
                check(p, size, s);
            }
        }
        for (p, size, align, _) in live {
            free(p, size, align);
        }
        manager::free_buffers();
        let after = manager::stats();
        prop_assert_eq!((after.bytes, after.buffers), (before.bytes, before.buffers));
        block_cache::disable();
    }
}

/// A block shrunk in place still holds its whole size in MKL: the cache
/// counts (and bounds) that, not the smaller size its owner frees it with
/// (an independent review found memory held reaching twice the budget).
#[test]
fn a_block_shrunk_in_place_counts_its_true_size() {
    let _s = serial();
    block_cache::enable(64 * MIB);
    for align in [64, 4096] {
        let p = block(8 * MIB, align, 3);
        // SAFETY: a live block of 8 MiB at `align`, shrunk to 5 MiB (more
        // than half: in place).
        let q = unsafe { MklAllocator.realloc(p, layout(8 * MIB, align), 5 * MIB) };
        assert_eq!(q, p, "a mild shrink stays in place");
        check(q, 5 * MIB, 3);
        free(q, 5 * MIB, align);
        assert_eq!(
            block_cache::cached_bytes(),
            8 * MIB,
            "cached at its true size"
        );
        // A request for 8 MiB may take it: it really holds 8 MiB.
        let r = block(8 * MIB, align, 4);
        assert_eq!(r, p);
        free(r, 8 * MIB, align);
        manager::free_buffers();
    }
    // Under a budget between the two sizes the shrunk block is not kept.
    block_cache::enable(6 * MIB);
    let p = block(8 * MIB, 64, 5);
    // SAFETY: as above.
    let q = unsafe { MklAllocator.realloc(p, layout(8 * MIB, 64), 5 * MIB) };
    free(q, 5 * MIB, 64);
    assert_eq!(
        block_cache::cached_bytes(),
        0,
        "8 MiB held under a 6 MiB budget"
    );
    // Shrunk twice, grown back within its true size: in place, and freed
    // at its true size.
    block_cache::enable(64 * MIB);
    let p = block(8 * MIB, 64, 6);
    // SAFETY: a live block, resized through its latest layout each time.
    unsafe {
        let q = MklAllocator.realloc(p, layout(8 * MIB, 64), 6 * MIB);
        let q = MklAllocator.realloc(q, layout(6 * MIB, 64), 5 * MIB);
        let q = MklAllocator.realloc(q, layout(5 * MIB, 64), 7 * MIB);
        assert_eq!(q, p, "growth within the true size stays in place");
        check(q, 5 * MIB, 6);
        free(q, 7 * MIB, 64);
    }
    assert_eq!(block_cache::cached_bytes(), 8 * MIB);
    manager::free_buffers();
    block_cache::disable();
}

/// `disable()` leaves nothing cached even while other threads free large
/// blocks (the loom model checks the protocol; this checks the process's
/// cache end to end).
#[test]
fn disable_racing_frees_leaves_nothing_cached() {
    let _s = serial();
    for _ in 0..20 {
        block_cache::enable(256 * MIB);
        let go = std::sync::Barrier::new(3);
        std::thread::scope(|s| {
            for t in 0..2 {
                let go = &go;
                s.spawn(move || {
                    let blocks: Vec<_> = (0..8).map(|i| block((2 + i % 3) * MIB, 64, t)).collect();
                    go.wait();
                    for (i, p) in blocks.into_iter().enumerate() {
                        free(p, (2 + i % 3) * MIB, 64);
                    }
                });
            }
            go.wait();
            block_cache::disable();
        });
        assert_eq!(block_cache::cached_bytes(), 0);
        assert_eq!(manager::stats().cached_buffers, 0);
    }
}
