//! The block cache beneath MKL (`mkl_alloc::block_cache`): budget at true
//! chunk sizes, fit rule, decay through every path and when idle,
//! `free_buffers`, honest statistics, every allocation path it serves, the
//! environment variable and the cgroup's limit, out-of-memory retry, and a
//! model of alloc/grow/shrink/free sequences with the cache on.
//!
//! The cache and MKL's counts are process-wide: every test takes `serial()`
//! and leaves the cache off and empty.
//!
//! Linux and Windows: the cache keeps chunks beneath MKL, and chunks exist
//! where the crate sets MKL's memory pointers (on Windows those that
//! `libimalloc.dll` exports). The tests that read Linux's /proc, set an
//! rlimit or fake a cgroup are ignored elsewhere.
#![cfg(any(target_os = "linux", windows))]

mod common;

use core::alloc::{GlobalAlloc, Layout};
use std::process::Command;

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec, block_cache, huge_pages, manager};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

use common::serial; // `unused_blocks_decay` sets its own decay time

/// The chunk beneath MKL that serves `MKL_malloc(size, max(64, align))`:
/// MKL asks `i_malloc` for the size plus the alignment plus its 24-byte
/// header, and chunks are whole 4 KiB pages.
fn chunk(size: usize, align: usize) -> usize {
    (size + align.max(64) + 24).next_multiple_of(4096)
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
    // Kept beneath MKL: MKL_Mem_Stat is back where it was (it counts live
    // blocks only), and the cache reports the chunk at its true size.
    let cached = manager::stats();
    let c = chunk(8 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), c);
    assert_eq!((cached.cached_bytes, cached.cached_buffers), (c as u64, 1));
    assert_eq!(cached.mkl_held(), before.mkl_held());
    assert_eq!(cached.live_bytes(), cached.bytes);

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
    // Two 2 MiB chunks fit a 5 MiB budget; the other two were unmapped.
    assert_eq!(block_cache::cached_bytes(), 2 * chunk(2 * MIB, 64));
    assert_eq!(manager::stats().cached_buffers, 2);
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
    // A block larger than the whole budget is never kept. (On Linux it
    // grows one cached chunk, and the other makes room for the growth:
    // issue 54.)
    let big = block(6 * MIB, 64, 9);
    free(big, 6 * MIB, 64);
    if cfg!(all(target_os = "linux", not(miri))) {
        assert_eq!(block_cache::cached_bytes(), 0);
        for p in [block(2 * MIB, 64, 1), block(2 * MIB, 64, 2)] {
            free(p, 2 * MIB, 64);
        }
    }
    assert_eq!(block_cache::cached_bytes(), 2 * chunk(2 * MIB, 64));
    // Lowering the budget below what is held empties the cache.
    block_cache::enable(MIB);
    assert_eq!(block_cache::cached_bytes(), 0);
    assert_eq!(manager::stats().cached_buffers, 0);
    block_cache::disable();
}

/// A cached chunk serves, whole, a request it fits within an eighth; one
/// it does not fit is served from it all the same on Linux, cut down or
/// grown (see `a_smaller_request_...` below), and elsewhere by a fresh
/// chunk beside it.
#[test]
fn a_block_serves_whole_only_requests_it_fits_within_an_eighth() {
    let _s = serial();
    block_cache::enable(64 * MIB);
    let p = block(4 * MIB, 64, 3);
    free(p, 4 * MIB, 64);
    // A tenth less wastes less than an eighth: the cached chunk, whole.
    let fit = block(4 * MIB - 4 * MIB / 10, 64, 6);
    assert_eq!(fit, p);
    free(fit, 4 * MIB - 4 * MIB / 10, 64);
    assert_eq!(block_cache::cached_bytes(), chunk(4 * MIB, 64));
    // 3 MiB would waste a quarter of the 4 MiB chunk.
    let small = block(3 * MIB, 64, 4);
    // Larger than the chunk (or what is left of it).
    let large = block(4 * MIB + 8192, 64, 5);
    if cfg!(all(target_os = "linux", not(miri))) {
        // Cut down to 3 MiB (the 1 MiB past it unmapped); the larger
        // request, with nothing cached, is a fresh chunk.
        assert_eq!(small, p, "the cached chunk was not cut down");
        assert_ne!(large, p);
        assert_eq!(block_cache::cached_bytes(), 0);
    } else {
        assert_ne!(small, p);
        assert_ne!(large, p);
        assert_eq!(block_cache::cached_bytes(), chunk(4 * MIB, 64));
    }
    free(small, 3 * MIB, 64);
    free(large, 4 * MIB + 8192, 64);
    block_cache::disable();
    assert_eq!(block_cache::cached_bytes(), 0);
}

/// This process's resident memory, in bytes (`/proc/self/statm`).
#[cfg(all(target_os = "linux", not(miri)))]
fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
}

/// A block of `size` bytes with every byte written (resident).
#[cfg(all(target_os = "linux", not(miri)))]
fn written(size: usize, byte: u8) -> *mut u8 {
    let p = block(size, 64, byte);
    // SAFETY: `size` bytes of the block.
    unsafe { p.write_bytes(byte, size) };
    p
}

/// Issue 54, point 10: caching never raises the peak. A cached 64 MiB
/// chunk serves a 48 MiB request, cut down (the 14 MiB past the next
/// 2 MiB boundary stays cached), so the 48 MiB written take no memory
/// beyond what the 64 MiB block held while it was live. Before, the
/// request mapped 48 MiB beside the cached chunk: 48 MiB more resident
/// (measured: +48 MiB over the live peak; the check below failed so,
/// and fails again with `take_cut` answering null).
///
/// Resident memory is compared with the peak of the live block, never
/// with what the cache holds: the kernel may take back cached pages
/// (they are `MADV_FREE`), which only lowers what is measured.
#[test]
#[cfg(all(target_os = "linux", not(miri)))]
fn a_smaller_request_takes_a_larger_cached_chunk_not_new_memory() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    let p = written(64 * MIB, 1);
    let live_peak = rss();
    free(p, 64 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), chunk(64 * MIB, 64));
    let q = written(48 * MIB, 2);
    let rise = rss().saturating_sub(live_peak);
    assert!(rise < 2 * MIB, "48 MiB mapped beside the cache: +{rise} B");
    assert_eq!(q, p, "the cached chunk serves the request, cut down");
    // The remainder from the 2 MiB boundary after the block on.
    let rest = chunk(64 * MIB, 64) - chunk(48 * MIB, 64).next_multiple_of(2 * MIB);
    assert_eq!(block_cache::cached_bytes(), rest);
    // SAFETY: 48 MiB written above.
    unsafe { common::check(q, 48 * MIB, |_| 2) };
    free(q, 48 * MIB, 64);
    // Both pieces are cached chunks of their own, each served whole.
    assert_eq!(block_cache::cached_bytes(), rest + chunk(48 * MIB, 64));
    assert_eq!(block(48 * MIB, 64, 3), p);
    free(p, 48 * MIB, 64);
    block_cache::disable();
}

/// Whether this process runs under valgrind (its preload is mapped).
#[cfg(all(target_os = "linux", not(miri)))]
fn under_valgrind() -> bool {
    std::fs::read_to_string("/proc/self/maps").is_ok_and(|m| m.contains("vgpreload"))
}

/// The other half of point 10: a request larger than every cached chunk
/// grows the largest (its pages carried over by `mremap`), and the cache
/// gives back as much as the growth maps, so that resident memory stays
/// at the live peak. With 64 and 32 MiB cached, an 80 MiB block grows the
/// 64 MiB chunk by 16 MiB, and the 32 MiB chunk gives its last 16 MiB. Before, 80 MiB were
/// mapped beside the 96 MiB cached (measured: +80 MiB over the live
/// peak; the check failed so, and fails again with `take_grown` and
/// `evict_for` doing nothing).
#[test]
#[cfg(all(target_os = "linux", not(miri)))]
fn a_larger_request_grows_a_cached_chunk_and_evicts_the_rest() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    let a = written(64 * MIB, 1);
    let b = written(32 * MIB, 2);
    let live_peak = rss();
    free(a, 64 * MIB, 64);
    free(b, 32 * MIB, 64);
    assert_eq!(
        block_cache::cached_bytes(),
        chunk(64 * MIB, 64) + chunk(32 * MIB, 64)
    );
    let q = written(80 * MIB, 3);
    let rise = rss().saturating_sub(live_peak);
    // Under valgrind, whose own mremap keeps the grown range's old pages
    // counted (measured: +16 MiB, the growth), the figure is not the
    // kernel's: checked natively only; the cache's count below holds
    // either way.
    if !under_valgrind() {
        assert!(rise < 2 * MIB, "80 MiB mapped beside the cache: +{rise} B");
    }
    // The 32 MiB chunk, the smallest that can, gave the 16 MiB.
    let left = chunk(32 * MIB, 64) - 16 * MIB;
    assert_eq!(block_cache::cached_bytes(), left, "the cache made room");
    // SAFETY: 80 MiB written above.
    unsafe { common::check(q, 80 * MIB, |_| 3) };
    free(q, 80 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), left + chunk(80 * MIB, 64));
    block_cache::disable();
}

/// A zeroed request served by a chunk cut down or grown reads zero, the
/// bytes the chunk held before included.
#[test]
#[cfg(all(target_os = "linux", not(miri)))]
fn zeroed_blocks_from_cut_or_grown_chunks_are_zero() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    let p = written(16 * MIB, 0xAB);
    free(p, 16 * MIB, 64);
    for size in [6 * MIB, 24 * MIB] {
        // SAFETY: a non-zero size.
        let z = unsafe { MklAllocator.alloc_zeroed(layout(size, 64)) };
        assert!(!z.is_null());
        // SAFETY: `size` initialised (zeroed) bytes.
        unsafe { common::check(z, size, |_| 0) };
        // SAFETY: written over, then freed dirty for the next round.
        unsafe { z.write_bytes(0xCD, size) };
        free(z, size, 64);
    }
    block_cache::disable();
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
    assert_eq!(block_cache::cached_bytes(), chunk(2 * MIB, 64));
    block_cache::set_decay_ms(200);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The next large operation sweeps: the idle chunk is unmapped.
    let q = block(3 * MIB, 64, 2);
    assert_eq!(block_cache::cached_bytes(), 0);
    assert_eq!(manager::stats().buffers, before.buffers + 1);
    free(q, 3 * MIB, 64);
    block_cache::disable();
    assert_eq!(manager::stats().buffers, before.buffers);
}

/// Decay goes on while the program frees only small blocks, through any
/// path: the split allocator's system side and c_heap's bins never call
/// MKL (on main before the backing, 219 MiB stayed cached through 41.7
/// million small allocations of the split allocator).
#[test]
fn decay_goes_on_through_small_frees_of_every_path() {
    let _s = serial();
    let split = MklSplitAllocator;
    let paths: [(&str, &dyn Fn()); 3] = [
        ("MklSplitAllocator's system side", &|| {
            // SAFETY: a small layout, freed at once with the same layout.
            unsafe { split.dealloc(split.alloc(layout(48, 8)), layout(48, 8)) }
        }),
        ("c_heap's bins", &|| {
            let p = mkl_alloc::c_heap::malloc(100, 64);
            // SAFETY: a live c_heap block, freed once.
            unsafe { mkl_alloc::c_heap::free(p) }
        }),
        ("MKL's small blocks", &|| free(block(100, 64, 0), 100, 64)),
    ];
    for (name, small_free) in paths {
        if cfg!(miri) && name == "MKL's small blocks" {
            // Miri's emulated MKL keeps its small blocks off MKL's memory
            // pointers (exact System blocks, src/ffi/miri/placement.rs): their frees
            // never reach the hooks, which is where MKL's small frees tick.
            continue;
        }
        block_cache::enable(64 * MIB);
        block_cache::set_decay_ms(3_600_000);
        free(block(8 * MIB, 64, 1), 8 * MIB, 64);
        assert_eq!(block_cache::cached_bytes(), chunk(8 * MIB, 64));
        block_cache::set_decay_ms(100);
        std::thread::sleep(std::time::Duration::from_millis(200));
        for _ in 0..4 * block_cache::TICKS {
            small_free();
        }
        assert_eq!(block_cache::cached_bytes(), 0, "{name}: nothing decayed");
    }
    manager::free_buffers(); // c_heap's bins keep a block
    block_cache::disable();
}

/// This process's pages given `MADV_FREE` and not yet reclaimed, in bytes
/// (`LazyFree` in Linux's `/proc/self/smaps_rollup`).
fn lazy_free_bytes() -> usize {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    let line = s.lines().find(|l| l.starts_with("LazyFree:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<usize>()
        .unwrap()
        << 10
}

/// A cached chunk is marked `MADV_FREE`: an idle process's cache is memory
/// the kernel may take back whenever it needs it (`LazyFree` in smaps).
#[test]
#[cfg_attr(miri, ignore = "reads /proc")]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "reads Linux's /proc/self/smaps_rollup (Windows: MEM_RESET, not counted anywhere)"
)]
fn cached_chunks_are_lazily_freed_for_an_idle_process() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    let before = lazy_free_bytes();
    let p = block(64 * MIB, 64, 1);
    // SAFETY: 64 MiB of the block, all of it written (resident).
    unsafe { p.write_bytes(1, 64 * MIB) };
    free(p, 64 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), chunk(64 * MIB, 64));
    assert!(
        lazy_free_bytes() >= before + 60 * MIB,
        "the cached chunk is not lazily freed"
    );
    // Reused, it is the program's memory again, its contents whatever
    // they were (zeroed requests are zeroed: see zeroed_blocks_...).
    let q = block(64 * MIB, 64, 2);
    assert_eq!(q, p);
    free(q, 64 * MIB, 64);
    block_cache::disable();
}

/// An 8 MiB temporary (a chunk of 8 MiB and a page: MKL's header) enters
/// the cache unmarked, within the allowance (`UNMARKED_MAX`): a loop that
/// frees and makes it again pays no `MADV_FREE`, whose cost is not the call
/// but the pages' dirty bits set again on every reuse (200 such temporaries
/// took 1.2-1.5x the time of glibc's or mimalloc's, marked; issue 36).
#[test]
#[cfg_attr(miri, ignore = "reads /proc")]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "reads Linux's /proc/self/smaps_rollup"
)]
fn an_8_mib_temporary_is_cached_unmarked() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    assert!(chunk(8 * MIB, 64) <= block_cache::UNMARKED_MAX);
    let p = block(8 * MIB, 64, 1);
    // SAFETY: 8 MiB of the block, all of it written (resident).
    unsafe { p.write_bytes(1, 8 * MIB) };
    let before = lazy_free_bytes();
    free(p, 8 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), chunk(8 * MIB, 64));
    assert!(
        lazy_free_bytes() < before + MIB,
        "the 8 MiB chunk was marked MADV_FREE"
    );
    let q = block(8 * MIB, 64, 2);
    assert_eq!(q, p);
    free(q, 8 * MIB, 64);
    block_cache::disable();
}

/// A chunk handed out for a smaller request is cached again at its true
/// size: the budget and `cached_bytes` count what is really kept (on main
/// before the backing, seven 32 MiB blocks read as 22 MiB cached while MKL
/// held 238 MiB more).
#[test]
fn a_reused_chunk_is_counted_at_its_true_size() {
    let _s = serial();
    let before = manager::stats();
    block_cache::enable(64 * MIB);
    let c = chunk(32 * MIB, 64);
    let mut size = 32 * MIB;
    let first = block(size, 64, 0);
    free(first, size, 64);
    // Ever smaller requests, each within an eighth of the chunk.
    for k in 1..18u8 {
        size -= size / 200;
        let p = block(size, 64, k);
        assert_eq!(p, first, "request of {size} B");
        free(p, size, 64);
        assert_eq!(block_cache::cached_bytes(), c, "step {k}");
        assert_eq!(manager::stats().mkl_held(), before.mkl_held());
    }
    block_cache::disable();
}

#[test]
fn small_blocks_and_a_disabled_cache_go_straight_back_to_mkl() {
    let _s = serial();
    let before = manager::stats();
    block_cache::enable(64 * MIB);
    // MKL adds 88 bytes: this request stays below the 1 MiB chunk floor.
    let p = block(block_cache::MIN_BLOCK - 200, 64, 1);
    free(p, block_cache::MIN_BLOCK - 200, 64);
    assert_eq!(block_cache::cached_bytes(), 0);
    block_cache::disable();
    let p = block(8 * MIB, 64, 1);
    free(p, 8 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), 0);
    assert_eq!(manager::stats().buffers, before.buffers);
}

#[test]
fn growth_moves_onto_a_cached_chunk_without_a_copy_of_its_tail() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    // The vector first: made after the cached chunk, it would be served
    // from it, cut down (issue 54).
    let mut v: AVec<u8, MklAllocator> = AVec::with_capacity_in(8 * MIB, MklAllocator);
    let target = block(16 * MIB, 64, 0);
    free(target, 16 * MIB, 64);
    // SAFETY: 8 MiB of capacity, all written before they count as elements
    // (one memset: a `resize` is a loop of 8 million steps under Miri).
    unsafe {
        v.as_mut_ptr().write_bytes(7, 8 * MIB);
        v.set_len(8 * MIB);
    }
    let old = v.as_ptr();
    v.reserve_exact(16 * MIB - v.len());
    // In place where the address space after the chunk is free, else onto
    // the cached chunk: the old pages move there (mremap), its own pages
    // past them are the growth. Either way nothing is left cached.
    assert!(
        v.as_ptr() == target.cast_const() || v.as_ptr() == old,
        "the growth went elsewhere"
    );
    common::check_slice(&v, |_| 7);
    if v.as_ptr() == target.cast_const() {
        assert_eq!(block_cache::cached_bytes(), 0, "the cached chunk was used");
    }
    drop(v);
    block_cache::disable();
}

/// A block of the C runtime's (MKL's blocks under 1 MiB come from it)
/// growing into a chunk's size is a growth: it takes a cached chunk of up to
/// `GROWTH_SLACK` times its size, and its next growths stay there, on pages
/// the cache kept resident, where a fresh chunk would be faulted in page by
/// page each time (a `Vec` pushed to 8 MiB again and again faulted 257
/// pages a round so; issue 36). Linux: the C runtime's block is measured
/// with glibc's `malloc_usable_size` (Miri's emulation has none).
#[test]
#[cfg(all(target_os = "linux", not(miri)))]
fn a_block_of_the_c_runtime_growing_into_a_chunk_takes_a_cached_one() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    let target = block(8 * MIB, 64, 0);
    free(target, 8 * MIB, 64);
    assert_eq!(block_cache::cached_bytes(), chunk(8 * MIB, 64));
    let mut v: AVec<u8, MklAllocator> = AVec::with_capacity_in(256 << 10, MklAllocator);
    v.extend((0..256 << 10).map(|i: usize| i as u8));
    v.reserve_exact(MIB + 1 - v.len());
    assert_eq!(
        v.as_ptr(),
        target.cast_const(),
        "the growth took a fresh chunk"
    );
    assert_eq!(block_cache::cached_bytes(), 0, "the cached chunk was used");
    for mib in [2, 4, 7] {
        v.reserve_exact(mib * MIB - v.len());
        assert_eq!(v.as_ptr(), target.cast_const(), "moved at {mib} MiB");
    }
    common::check_slice(&v, |i| i);
    drop(v);
    assert_eq!(block_cache::cached_bytes(), chunk(8 * MIB, 64));
    block_cache::disable();
}

/// Blocks the address space right after the chunk that serves `p` (a
/// block of `size` bytes at 64), so that it cannot grow in place.
#[cfg(all(unix, not(miri)))]
fn block_growth_in_place(p: *const u8, size: usize) {
    let end = (p as usize & !(2 * MIB - 1)) + chunk(size, 64);
    // SAFETY: MAP_FIXED_NOREPLACE maps one page at `end` only if nothing is
    // there (else it fails, and something already blocks the growth); the
    // page is never unmapped, so nothing else is ever placed there.
    let q = unsafe {
        libc::mmap(
            end as *mut libc::c_void,
            4096,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert!(
        q == libc::MAP_FAILED || q as usize == end,
        "the guard page went elsewhere"
    );
}

#[test]
fn a_growth_takes_a_larger_cached_chunk_and_grows_within_it() {
    let _s = serial();
    block_cache::enable(256 * MIB);
    // The vector first (see `growth_moves_onto_...`).
    let mut v: AVec<u8, MklAllocator> = AVec::with_capacity_in(8 * MIB, MklAllocator);
    let target = block(64 * MIB, 64, 0);
    free(target, 64 * MIB, 64);
    let held = block_cache::cached_bytes();
    assert_eq!(held, chunk(64 * MIB, 64));
    // SAFETY: 8 MiB of capacity, all written before they count as elements.
    unsafe {
        v.as_mut_ptr().write_bytes(7, 8 * MIB);
        v.set_len(8 * MIB);
    }
    // (Under Miri no chunk is ever resized in place, and on Windows a chunk
    // grows in place only into a reserved tail, which a fresh one lacks:
    // no guard needed there.)
    #[cfg(all(unix, not(miri)))]
    block_growth_in_place(v.as_ptr(), 8 * MIB);
    // 16 MiB cannot be had in place: the cached 64 MiB chunk (within
    // GROWTH_SLACK = 8 times the request) takes the growth, whole.
    v.reserve_exact(16 * MIB - v.len());
    assert_eq!(v.as_ptr(), target.cast_const(), "the growth went elsewhere");
    assert_eq!(block_cache::cached_bytes(), 0, "the cached chunk was used");
    // The next growths are served within it, and no shrink rule trims it
    // (each request is larger than the one before).
    for mib in [24, 32, 48] {
        v.reserve_exact(mib * MIB - v.len());
        assert_eq!(v.as_ptr(), target.cast_const(), "moved at {mib} MiB");
        // SAFETY: the capacity covers `mib` MiB; the new bytes are written
        // (one memset each) before they count as elements.
        unsafe {
            let len = v.len();
            v.as_mut_ptr()
                .add(len)
                .write_bytes(mib as u8, mib * MIB - len);
            v.set_len(mib * MIB);
        }
    }
    common::check_slice(&v[..8 * MIB], |_| 7);
    common::check_slice(&v[32 * MIB..], |_| 48);
    // Freed, the chunk is cached at its true size: the whole 64 MiB.
    drop(v);
    assert_eq!(block_cache::cached_bytes(), held);
    // Taken again whole for a request it fits within an eighth, then
    // shrunk to an eighth: MKL keeps a shrunk block whole, so the
    // allocator moves it (see `raw_realloc`), and the chunk comes back to
    // the cache at its true size.
    let mut v: AVec<u8, MklAllocator> = AVec::with_capacity_in(60 * MIB, MklAllocator);
    assert_eq!(
        v.as_ptr(),
        target.cast_const(),
        "the cached chunk was reused"
    );
    assert_eq!(block_cache::cached_bytes(), 0);
    v.push(1);
    v.shrink_to(8 * MIB);
    assert_eq!(block_cache::cached_bytes(), held);
    drop(v);
    assert_eq!(block_cache::cached_bytes(), held + chunk(8 * MIB, 64));
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
    assert_eq!(block_cache::cached_bytes(), chunk(8 * MIB, 64));
    let split = MklSplitAllocator;
    // SAFETY: a non-zero size.
    let q = unsafe { split.alloc(layout(8 * MIB, 64)) };
    assert_eq!(q.cast_const(), p.cast::<u8>());
    // SAFETY: allocated just above with this layout.
    unsafe { split.dealloc(q, layout(8 * MIB, 64)) };
    assert_eq!(block_cache::cached_bytes(), chunk(8 * MIB, 64));
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
            assert_eq!(block_cache::cached_bytes(), chunk(2 * MIB, 64));
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
            chunk(8 * MIB, align),
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
    assert_eq!(block_cache::cached_bytes(), chunk(8 * MIB, 64));
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

/// Runs the ignored test `name` alone in a fresh process, through
/// `wrapper` (a command line to put before it, e.g. `unshare`), with
/// `env`; returns whether it passed, and its output.
fn run_alone(name: &str, wrapper: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::child_passed(&cmd.output().unwrap())
}

/// A block that needs more address space than is left while the cache
/// holds memory takes it from the cache, as far as it needs (on main
/// before the backing, `MKL_malloc` returned null under `RLIMIT_AS` while
/// the cache held 400 MiB; until issue 41 the whole cache went for it).
/// Since issue 54 the block is served from a cached chunk, grown, and the
/// cache unmaps as much as the growth maps: a mapping refused for lack of
/// room (`map_evicting`) is then rare, but the bound is the same.
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "limits the address space with Linux's RLIMIT_AS"
)]
fn a_refused_mapping_unmaps_cached_chunks_until_it_fits() {
    let (ok, out) = run_alone("rlimit_child", &[], &[]);
    assert!(ok, "{out}");
}

#[test]
#[cfg(target_os = "linux")]
#[ignore = "run by a_refused_mapping_unmaps_cached_chunks_until_it_fits in a child process"]
fn rlimit_child() {
    block_cache::enable(1 << 30);
    block_cache::set_decay_ms(3_600_000);
    let held: Vec<*mut u8> = (0..4).map(|i| block(100 * MIB, 64, i)).collect();
    for p in held {
        free(p, 100 * MIB, 64);
    }
    assert_eq!(block_cache::cached_bytes(), 4 * chunk(100 * MIB, 64));
    // Room for 300 MiB more address space. A 150 MiB block grows one of
    // the cache's 100 MiB chunks (in place, or moved onto a fresh
    // mapping), another gives its last 50 MiB to make room for the 50 MiB
    // grown, and the other two stay whole (issue 41: a refusal emptied
    // the cache).
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let limit = (vm_kib << 10) + 300 * MIB as u64;
    let lim = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: sets this process's own soft limit from a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
    // SAFETY: a non-zero size.
    let p = unsafe { MklAllocator.alloc(layout(150 * MIB, 64)) };
    assert!(!p.is_null(), "150 MiB refused while the cache held 400 MiB");
    assert_eq!(
        block_cache::cached_bytes(),
        3 * chunk(100 * MIB, 64) - 50 * MIB
    );
    free(p, 150 * MIB, 64);
}

/// The default budget inside a container: an eighth of the cgroup's limit,
/// not of the host (on main before the backing, a cgroup limited to
/// 512 MiB got a 3,013 MiB budget and was OOM-killed). The limit file is
/// faked with a bind mount in a private mount namespace (root and
/// `unshare` needed; skipped with a message otherwise).
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "fakes a Linux cgroup limit (under wine /proc would be the host's)"
)]
fn the_default_budget_follows_the_cgroup_limit() {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let file = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_end_matches('/');
        let f = if ctl.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else if ctl.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else {
            return None;
        };
        std::path::Path::new(&f).exists().then_some(f)
    });
    let Some(file) = file else {
        eprintln!("skipped: no memory cgroup limit file for this process");
        return;
    };
    let fake = std::env::temp_dir().join(format!("mkl-alloc-cgroup-{}", std::process::id()));
    std::fs::write(&fake, "536870912\n").unwrap();
    let script = format!(
        "mount --bind {} {file} && exec \"$0\" \"$@\"",
        fake.display()
    );
    let (ok, out) = run_alone(
        "cgroup_child",
        &["unshare", "-m", "sh", "-c", &script],
        &[("MKL_ALLOC_EXPECT_BUDGET", &(64 * MIB).to_string())],
    );
    std::fs::remove_file(&fake).ok();
    if !ok && (out.contains("Operation not permitted") || out.contains("No such file")) {
        eprintln!("skipped: cannot fake a cgroup limit here: {out}");
        return;
    }
    assert!(ok, "{out}");
}

#[test]
#[ignore = "run by the_default_budget_follows_the_cgroup_limit in a child process"]
fn cgroup_child() {
    let expect: usize = std::env::var("MKL_ALLOC_EXPECT_BUDGET")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(block_cache::default_budget(), expect);
    assert_eq!(block_cache::budget(), Some(expect), "the default in force");
}

/// Fresh memory for a chunk is mapped only after the C runtime's heap has
/// given back its free pages (`backing::heap_trim`): a program whose
/// other allocations (pandas' hash tables) lie freed in glibc's heap does
/// not carry them resident beside its new arrays (issue 54: pandas' peak
/// was 22 MiB over NumPy's default's, 17.8 MiB of it glibc's free heap).
/// In a fresh process (the trim is process-wide, and at most 1 % of the
/// time): 64 MiB freed inside glibc's heap (a live block above keeps it
/// from the top, which glibc would trim itself) go back when a 4 MiB MKL
/// block maps a chunk. Without the trim they stay: the check fails.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
fn a_fresh_chunk_first_trims_the_c_runtime_heap() {
    let (ok, out) = run_alone("heap_trim_child", &[], &[]);
    assert!(ok, "{out}");
}

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
#[ignore = "run by a_fresh_chunk_first_trims_the_c_runtime_heap in a child process"]
fn heap_trim_child() {
    const BLOCK: usize = 32 << 10; // under glibc's mmap threshold: its heap
    let blocks: Vec<*mut u8> = (0..64 * MIB / BLOCK)
        .map(|_| {
            // SAFETY: malloc takes any size.
            let p = unsafe { libc::malloc(BLOCK) }.cast::<u8>();
            assert!(!p.is_null());
            // SAFETY: BLOCK bytes of a live block: resident now.
            unsafe { p.write_bytes(1, BLOCK) };
            p
        })
        .collect();
    // SAFETY: malloc takes any size.
    let pin = unsafe { libc::malloc(64) };
    for p in blocks {
        // SAFETY: each a live malloc block, freed once.
        unsafe { libc::free(p.cast()) };
    }
    let before = rss();
    // A trim made by an earlier fresh chunk of this process lets the next
    // wait at least a millisecond.
    std::thread::sleep(std::time::Duration::from_millis(20));
    // SAFETY: a non-zero size.
    let p = unsafe { MklAllocator.alloc(layout(4 * MIB, 64)) };
    assert!(!p.is_null());
    let after = rss();
    free(p, 4 * MIB, 64);
    // SAFETY: the live block above, freed once.
    unsafe { libc::free(pin) };
    // Valgrind's malloc replaces glibc's: nothing of it to trim.
    if !under_valgrind() {
        let given = before.saturating_sub(after);
        assert!(
            given >= 48 * MIB,
            "glibc's heap kept its free 64 MiB: {before} B resident before the chunk, {after} B after"
        );
    }
}
