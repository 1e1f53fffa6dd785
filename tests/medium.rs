//! Medium blocks beneath MKL (issue 42): every MKL block of 4 KiB up to
//! 1 MiB is the crate's (`src/backing/medium.rs`), reused while dirty and
//! given back to the kernel after the decay time.
//!
//! Each check runs alone in a fresh process (the medium heap and its
//! figures are process-wide, and `MKL_ALLOC_MEDIUM` is read once, at the
//! crate's setup): the `#[ignore]`d `*_child` tests are the children, run
//! by the test of the same name without the suffix.

mod common;

use std::alloc::{GlobalAlloc, Layout};

use mkl_alloc::backing::{self, Backing};
use mkl_alloc::{MklAllocator, MklSplitAllocator, block_cache, manager};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Runs the ignored test `name` alone in a fresh process with `env`.
fn run_alone(name: &str, env: &[(&str, &str)]) {
    common::run_ignored_alone(name, "MKL_ALLOC_MEDIUM", env);
}

/// Whether medium blocks can be on here: Linux, MKL on the crate's memory.
/// Warms MKL up first: its first block in a thread brings MKL's own
/// blocks (80 KiB, medium too), which the figures below must not see.
fn medium_here() -> bool {
    manager::init();
    let layout = Layout::from_size_align(16 * KIB, 64).unwrap();
    // SAFETY: a non-zero layout, freed once.
    unsafe { MklAllocator.dealloc(MklAllocator.alloc(layout), layout) };
    cfg!(target_os = "linux") && backing::state() == Backing::Active
}

fn medium() -> (u64, u64, u64) {
    let s = manager::stats();
    (
        s.medium_live_bytes,
        s.medium_dirty_bytes,
        s.medium_clean_bytes,
    )
}

/// Resident bytes of this process (`/proc/self/statm`).
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn pattern(seed: usize) -> impl Fn(u8) -> u8 {
    move |i| i.wrapping_mul(31).wrapping_add(seed as u8)
}

/// Sizes across the classes, with MKL's header either side of a class.
const SIZES: [usize; 10] = [
    4 * KIB,
    4 * KIB + 1,
    8 * KIB,
    48 * KIB,
    48 * KIB + 100,
    100 * KIB,
    300 * KIB,
    512 * KIB,
    900 * KIB,
    MIB - 200,
];

#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn blocks_of_4k_to_1m_are_medium() {
    run_alone("blocks_of_4k_to_1m_are_medium_child", &[]);
}

#[test]
#[ignore = "run by blocks_of_4k_to_1m_are_medium in a child process"]
fn blocks_of_4k_to_1m_are_medium_child() {
    if !medium_here() {
        return;
    }
    let start = medium();
    let mut blocks = Vec::new();
    for (i, &size) in SIZES.iter().enumerate() {
        let layout = Layout::from_size_align(size, 64).unwrap();
        let live = medium().0;
        // SAFETY: a non-zero layout.
        let p = unsafe { MklAllocator.alloc(layout) };
        assert!(!p.is_null());
        assert!(medium().0 >= live + size as u64, "{size} B is not medium");
        // SAFETY: a live block of `size` bytes.
        unsafe { common::fill(p, size, pattern(i)) };
        blocks.push((p, layout, i));
    }
    // The split allocator: its MKL side's blocks are medium, its small
    // side's are not.
    let split: MklSplitAllocator = MklSplitAllocator;
    let live = medium().0;
    let big = Layout::from_size_align(48 * KIB, 8).unwrap();
    let small = Layout::from_size_align(100, 8).unwrap();
    // SAFETY: non-zero layouts.
    let (b, s) = unsafe { (split.alloc(big), split.alloc(small)) };
    assert!(medium().0 >= live + big.size() as u64);
    assert!(medium().0 < live + big.size() as u64 + 64 * KIB as u64);
    for &(p, layout, i) in &blocks {
        // SAFETY: live blocks, written above.
        unsafe { common::check(p, layout.size(), pattern(i)) };
    }
    // SAFETY: live blocks of these layouts, freed once.
    unsafe {
        split.dealloc(b, big);
        split.dealloc(s, small);
        for (p, layout, _) in blocks {
            MklAllocator.dealloc(p, layout);
        }
    }
    let end = medium();
    assert_eq!(end.0, start.0, "every medium block went back");
    assert!(end.1 > start.1, "freed blocks are kept dirty for reuse");
}

#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn reallocs_cross_classes_chunks_and_back() {
    run_alone("reallocs_cross_classes_chunks_and_back_child", &[]);
}

#[test]
#[ignore = "run by reallocs_cross_classes_chunks_and_back in a child process"]
fn reallocs_cross_classes_chunks_and_back_child() {
    if !medium_here() {
        return;
    }
    block_cache::enable(256 * MIB);
    let start = medium().0;
    let steps = [
        5 * KIB,
        9 * KIB,
        9 * KIB + 64,
        50 * KIB,
        300 * KIB,
        3 * MIB,
        700 * KIB,
        20 * KIB,
        2 * KIB,
        60 * KIB,
    ];
    let mut layout = Layout::from_size_align(4 * KIB, 64).unwrap();
    // SAFETY: a non-zero layout.
    let mut p = unsafe { MklAllocator.alloc(layout) };
    // SAFETY: a live block of layout.size() bytes.
    unsafe { common::fill(p, layout.size(), pattern(7)) };
    for &n in &steps {
        // SAFETY: a live block of `layout`, resized to a non-zero size.
        let q = unsafe { MklAllocator.realloc(p, layout, n) };
        assert!(!q.is_null());
        let kept = layout.size().min(n);
        // SAFETY: q holds at least `n` bytes; the first `kept` were kept.
        unsafe {
            common::check(q, kept, pattern(7));
            common::fill(q, n, pattern(7));
        }
        let medium_size = (4 * KIB..MIB - 128).contains(&n);
        if medium_size {
            assert!(medium().0 > start, "{n} B after realloc is medium");
        } else if n >= MIB {
            assert_eq!(medium().0, start, "{n} B is a chunk: no medium block left");
        }
        (p, layout) = (q, Layout::from_size_align(n, 64).unwrap());
    }
    // SAFETY: the live block, freed once.
    unsafe { MklAllocator.dealloc(p, layout) };
    assert_eq!(medium().0, start);
}

/// The length of the mapping that holds `p` (`/proc/self/maps`; adjacent
/// mappings alike merge into one there, as the region's segments do).
fn mapping_len(p: *const u8) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let range = line.split_whitespace().next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        if (a..b).contains(&p.addr()) {
            return b - a;
        }
    }
    panic!("{p:?} is in no mapping");
}

/// The region takes address space as the medium working set grows, a
/// segment (64 MiB) at a time, not 64 GiB (or half of a `ulimit -v`) at
/// the first medium block: what a program under a limit could allocate
/// stays its own.
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn the_region_takes_address_space_as_it_grows() {
    run_alone("region_growth_child", &[]);
}

#[test]
#[ignore = "run by the_region_takes_address_space_as_it_grows in a child process"]
fn region_growth_child() {
    if !medium_here() || !cfg!(target_os = "linux") {
        return;
    }
    let layout = Layout::from_size_align(48 * KIB, 64).unwrap();
    // SAFETY: a non-zero layout; the blocks are freed once, below.
    let alloc = || unsafe { MklAllocator.alloc(layout) };
    let live = medium().0;
    let first = alloc();
    assert!(medium().0 > live, "not medium");
    let region = mapping_len(first);
    assert!(region <= 64 * MIB, "{} MiB of address space", region >> 20);
    // 200 MiB of blocks: the region grows past its first segments.
    let mut blocks: Vec<*mut u8> = (0..(200 * MIB / layout.size())).map(|_| alloc()).collect();
    assert!(
        medium().0 >= live + 200 * MIB as u64,
        "the region stopped growing"
    );
    let grown = mapping_len(first);
    assert!(
        (200 * MIB..400 * MIB).contains(&grown),
        "{} MiB",
        grown >> 20
    );
    for &p in &blocks {
        // SAFETY: each a live block of 48 KiB.
        unsafe { common::fill(p, 64, pattern(p.addr())) };
    }
    blocks.push(first);
    for p in blocks {
        // SAFETY: live blocks of `layout`, freed once.
        unsafe { MklAllocator.dealloc(p, layout) };
    }
    assert_eq!(medium().0, live);
}

/// A region that cannot grow (a `ulimit -v` reached) sends medium-size
/// requests to the C runtime, which serves them; each is counted in
/// `MemStats` (planted: without the count this fails, `medium_fallbacks`
/// 0 with blocks on glibc's heap).
// Linux only: medium blocks and `setrlimit` (the test reads libc, a
// dependency on Unix only).
#[cfg(target_os = "linux")]
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn a_region_that_cannot_grow_is_counted_not_silent() {
    run_alone("fallback_child", &[]);
}

#[cfg(target_os = "linux")]
#[test]
#[ignore = "run by a_region_that_cannot_grow_is_counted_not_silent in a child process"]
fn fallback_child() {
    if !medium_here() || !cfg!(target_os = "linux") {
        return;
    }
    assert_eq!(manager::stats().medium_fallbacks, 0);
    let layout = Layout::from_size_align(48 * KIB, 64).unwrap();
    // At most 72 MiB of blocks: past the first segment's 60, and within
    // the 32 MiB the C runtime may take (this list itself allocated now).
    let most = 72 * MIB / layout.size();
    let mut blocks = Vec::with_capacity(most);
    // Room for glibc's heap to grow by 32 MiB, not for a 64 MiB segment.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let limit = vm_kib * 1024 + (32 * MIB) as u64;
    let rlim = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit, read by the call only.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rlim) }, 0);
    while manager::stats().medium_fallbacks == 0 && blocks.len() < most {
        // SAFETY: a non-zero layout; freed once, below.
        let p = unsafe { MklAllocator.alloc(layout) };
        assert!(!p.is_null(), "block {} refused", blocks.len());
        // SAFETY: a live block of 48 KiB.
        unsafe { common::fill(p, 64, pattern(p.addr())) };
        blocks.push(p);
    }
    let s = manager::stats();
    assert!(
        s.medium_fallbacks >= 1 && s.medium_fallback_bytes >= layout.size() as u64,
        "after {} blocks: {} fallbacks, {} bytes",
        blocks.len(),
        s.medium_fallbacks,
        s.medium_fallback_bytes
    );
    assert!(
        blocks.len() > 500,
        "fell back after {} blocks",
        blocks.len()
    );
    for p in blocks {
        // SAFETY: live blocks of `layout`, freed once.
        unsafe { MklAllocator.dealloc(p, layout) };
    }
}

/// A program that changes phase (many blocks of one size, freed, then
/// blocks of another) reuses the first phase's spans: once its blocks are
/// given back, a span leaves its class for a pool any class takes from,
/// so the region does not grow for the second phase.
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn a_phase_change_reuses_the_first_phases_spans() {
    run_alone("phase_change_child", &[]);
}

#[test]
#[ignore = "run by a_phase_change_reuses_the_first_phases_spans in a child process"]
fn phase_change_child() {
    if !medium_here() || !cfg!(target_os = "linux") {
        return;
    }
    let big = Layout::from_size_align(1_000_000, 64).unwrap();
    let small = Layout::from_size_align(48 * KIB, 64).unwrap();
    // SAFETY: non-zero layouts; every block is freed once, below.
    let phase = |l: Layout, n: usize| -> Vec<*mut u8> {
        (0..n)
            .map(|_| unsafe {
                let p = MklAllocator.alloc(l);
                assert!(!p.is_null());
                p.write(1);
                p
            })
            .collect()
    };
    let free = |l: Layout, ps: Vec<*mut u8>| {
        for p in ps {
            // SAFETY: live blocks of `l`, freed once.
            unsafe { MklAllocator.dealloc(p, l) };
        }
    };
    let first = phase(big, 300);
    let anchor = first[0];
    free(big, first);
    manager::free_buffers();
    let (live, dirty, _) = medium();
    assert_eq!(dirty, 0);
    let region = mapping_len(anchor);
    let second = phase(small, 200 * MIB / small.size());
    assert!(medium().0 >= live + 200 * MIB as u64);
    assert_eq!(
        mapping_len(anchor) >> 20,
        region >> 20,
        "the region grew for the second phase (MiB)"
    );
    free(small, second);
}

/// Dirty medium blocks share the block cache's budget, counted at their
/// classes' sizes (pages never touched included): they never keep a big
/// temporary out of the cache. Freed 1 MB blocks fill the budget; a
/// 64 MiB temporary freed after them is cached all the same, the oldest
/// dirty blocks given back to make room.
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn dirty_medium_blocks_never_keep_a_temporary_out_of_the_cache() {
    run_alone("budget_child", &[]);
}

#[test]
#[ignore = "run by dirty_medium_blocks_never_keep_a_temporary_out_of_the_cache in a child process"]
fn budget_child() {
    if !medium_here() || !cfg!(target_os = "linux") {
        return;
    }
    block_cache::enable(256 * MIB);
    let big = Layout::from_size_align(1_000_000, 64).unwrap();
    let blocks: Vec<*mut u8> = (0..300)
        .map(|_| {
            // SAFETY: a non-zero layout; one byte written inside it.
            unsafe {
                let p = MklAllocator.alloc(big);
                assert!(!p.is_null());
                p.write(1);
                p
            }
        })
        .collect();
    for p in blocks {
        // SAFETY: live blocks of `big`, freed once.
        unsafe { MklAllocator.dealloc(p, big) };
    }
    assert!(
        medium().1 >= 200 * MIB as u64,
        "the budget is full of dirty blocks"
    );
    let t = Layout::from_size_align(64 * MIB, 64).unwrap();
    // SAFETY: a non-zero layout, freed once.
    unsafe {
        let p = MklAllocator.alloc(t);
        assert!(!p.is_null());
        p.write(1);
        MklAllocator.dealloc(p, t);
    }
    assert!(
        manager::stats().cached_bytes >= 64 * MIB as u64,
        "the temporary was not cached: {:?}",
        manager::stats()
    );
}

/// A block grown from below 4 KiB, as `Vec::push` grows one (doubling
/// from a few bytes), becomes medium once it reaches a medium size: MKL
/// serves the small sizes from the C runtime beneath the hooks, and its
/// `i_realloc` of such a block is moved onto a medium block, so that it is
/// given back when freed rather than left in glibc's heap.
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn a_block_grown_from_small_sizes_becomes_medium() {
    run_alone("a_block_grown_from_small_sizes_becomes_medium_child", &[]);
}

#[test]
#[ignore = "run by a_block_grown_from_small_sizes_becomes_medium in a child process"]
fn a_block_grown_from_small_sizes_becomes_medium_child() {
    if !medium_here() {
        return;
    }
    let start = medium().0;
    let mut layout = Layout::from_size_align(8, 8).unwrap();
    // SAFETY: a non-zero layout.
    let mut p = unsafe { MklAllocator.alloc(layout) };
    assert!(!p.is_null());
    // SAFETY: a live block of 8 bytes.
    unsafe { common::fill(p, 8, pattern(3)) };
    while layout.size() < 64 * KIB {
        let n = layout.size() * 2;
        // SAFETY: a live block of `layout`, grown to a non-zero size.
        let q = unsafe { MklAllocator.realloc(p, layout, n) };
        assert!(!q.is_null());
        // SAFETY: q holds `n` bytes, the first `layout.size()` kept.
        unsafe {
            common::check(q, layout.size(), pattern(3));
            common::fill(q, n, pattern(3));
        }
        (p, layout) = (q, Layout::from_size_align(n, 8).unwrap());
        if n >= 8 * KIB {
            assert!(
                medium().0 >= start + n as u64,
                "a block grown to {n} B is not medium"
            );
        }
    }
    // SAFETY: the live block, freed once.
    unsafe { MklAllocator.dealloc(p, layout) };
    assert_eq!(medium().0, start);
}

#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn zeroed_blocks_read_zero_after_dirty_reuse() {
    run_alone("zeroed_blocks_read_zero_after_dirty_reuse_child", &[]);
}

#[test]
#[ignore = "run by zeroed_blocks_read_zero_after_dirty_reuse in a child process"]
fn zeroed_blocks_read_zero_after_dirty_reuse_child() {
    if !medium_here() {
        return;
    }
    block_cache::enable(256 * MIB);
    for size in [4 * KIB, 48 * KIB, 200 * KIB, 1000 * KIB] {
        let layout = Layout::from_size_align(size, 64).unwrap();
        // SAFETY: non-zero layouts; each block freed once, after writing.
        unsafe {
            let p = MklAllocator.alloc(layout);
            p.write_bytes(0xA5, size);
            MklAllocator.dealloc(p, layout);
            assert!(medium().1 > 0, "kept dirty");
            let q = MklAllocator.alloc_zeroed(layout);
            assert_eq!(q, p, "{size} B: the dirty block is reused");
            assert!(std::slice::from_raw_parts(q, size).iter().all(|&b| b == 0));
            // And a clean one (given back) reads zero too.
            q.write_bytes(0x5A, size);
            MklAllocator.dealloc(q, layout);
            manager::free_buffers();
            assert_eq!(medium().1, 0);
            let r = MklAllocator.alloc_zeroed(layout);
            assert!(std::slice::from_raw_parts(r, size).iter().all(|&b| b == 0));
            MklAllocator.dealloc(r, layout);
        }
    }
}

/// Issue 42's case: ~256 MiB of 48 KiB blocks, a small live `Box` of the
/// system allocator's between each two, all blocks freed. With medium
/// blocks the resident set comes back down after the decay time and one
/// allocation; with `MKL_ALLOC_MEDIUM=off` (glibc beneath MKL, as before)
/// it stays up after a medium-sized allocation, and the medium figures stay
/// 0. (After a chunk's allocation it would come down there too: a fresh
/// chunk first trims glibc's heap, `backing::heap_trim`, tested in
/// tests/block_cache.rs.)
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
#[cfg_attr(not(target_os = "linux"), ignore = "reads /proc/self/statm")]
fn freed_blocks_go_back_to_the_kernel_after_the_decay() {
    // The decay point after the pause: a chunk's allocation, then a medium
    // block's.
    run_alone("retention_child", &[("MEDIUM_EXPECT", "released")]);
    run_alone(
        "retention_child",
        &[("MEDIUM_EXPECT", "released"), ("MEDIUM_TRIGGER", "medium")],
    );
    run_alone(
        "retention_child",
        &[
            ("MEDIUM_EXPECT", "retained"),
            ("MKL_ALLOC_MEDIUM", "off"),
            ("MEDIUM_TRIGGER", "medium"),
        ],
    );
}

#[test]
#[ignore = "run by freed_blocks_go_back_to_the_kernel_after_the_decay in a child process"]
fn retention_child() {
    let released = std::env::var("MEDIUM_EXPECT").unwrap() == "released";
    manager::init();
    if released && !medium_here() {
        return;
    }
    block_cache::enable(512 * MIB);
    block_cache::set_decay_ms(50);
    let layout = Layout::from_size_align(48 * KIB, 64).unwrap();
    let n = 256 * MIB / layout.size();
    let mut blocks = Vec::with_capacity(n);
    let mut boxes = Vec::with_capacity(n);
    let before = rss();
    for i in 0..n {
        // SAFETY: a non-zero layout; every page written.
        let p = unsafe { MklAllocator.alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: a live block of layout.size() bytes.
        unsafe { p.write_bytes(i as u8 | 1, layout.size()) };
        blocks.push(p);
        boxes.push(Box::new([i as u8; 32]));
    }
    let full = rss();
    assert!(full > before + 240 * MIB, "{before} -> {full}");
    for p in blocks {
        // SAFETY: live blocks, freed once.
        unsafe { MklAllocator.dealloc(p, layout) };
    }
    let freed = medium();
    std::thread::sleep(std::time::Duration::from_millis(120));
    // One allocation after the pause: a chunk's (the block cache's decay
    // point), or with MEDIUM_TRIGGER=medium a medium block's (its own).
    let medium_trigger = std::env::var_os("MEDIUM_TRIGGER").is_some_and(|v| v == "medium");
    let big = Layout::from_size_align(if medium_trigger { 64 * KIB } else { 2 * MIB }, 64).unwrap();
    // SAFETY: a non-zero layout, freed once.
    unsafe { MklAllocator.dealloc(MklAllocator.alloc(big), big) };
    let after = rss();
    let end = medium();
    eprintln!(
        "RSS before {} MiB, full {} MiB, after {} MiB; medium (live, dirty, clean) freed {freed:?}, end {end:?}",
        before >> 20,
        full >> 20,
        after >> 20
    );
    std::hint::black_box(&boxes);
    if released {
        assert!(freed.1 >= 240 * MIB as u64, "kept dirty first: {freed:?}");
        assert!(after < before + 8 * MIB, "{before} -> {after}");
        // Nothing dirty but, with the medium trigger, its own block.
        assert!(end.1 <= 128 * KIB as u64, "{end:?}");
        assert!(end.2 >= 240 * MIB as u64);
    } else {
        assert_eq!((freed, end), ((0, 0, 0), (0, 0, 0)));
        assert!(
            after > before + 128 * MIB,
            "glibc kept it: {before} -> {after}"
        );
    }
}

/// Without the background thread, a program that frees more than 16 MiB
/// of medium blocks with no medium allocation between (it lets go of its
/// work) gives them back at its next allocation after the decay time, a
/// small one too: through the split's small side or `MklAllocator`
/// (which MKL serves from its own small buffers). Frees between medium
/// allocations (a working set in use) do not make small allocations
/// decay points.
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
#[cfg_attr(not(target_os = "linux"), ignore = "medium blocks are Linux's")]
fn a_program_that_lets_go_gives_back_at_its_next_small_allocation() {
    run_alone("let_go_child", &[("LET_GO_VIA", "split")]);
    run_alone("let_go_child", &[("LET_GO_VIA", "mkl")]);
    run_alone("let_go_child", &[("LET_GO_VIA", "working")]);
    run_alone("let_go_child", &[("LET_GO_VIA", "teardown")]);
}

#[test]
#[ignore = "run by a_program_that_lets_go_gives_back_at_its_next_small_allocation"]
fn let_go_child() {
    if !medium_here() {
        return;
    }
    let via = std::env::var("LET_GO_VIA").unwrap();
    // "working": a working set of steady size, each freed block replaced
    // by one of another class (the frees and the allocations balance);
    // "teardown": a teardown that keeps an 8 KiB result per 64 blocks
    // dropped, which lets go all the same.
    let working = via == "working";
    let teardown = via == "teardown";
    assert!(!mkl_alloc::background::is_running());
    block_cache::enable(256 * MIB);
    block_cache::set_decay_ms(100);
    let layout = Layout::from_size_align(48 * KIB, 64).unwrap();
    let keep = Layout::from_size_align(if working { 56 } else { 8 } * KIB, 64).unwrap();
    let blocks: Vec<*mut u8> = (0..64 * MIB / layout.size())
        .map(|i| {
            // SAFETY: a non-zero layout; written within it.
            unsafe {
                let p = MklAllocator.alloc(layout);
                assert!(!p.is_null());
                p.write_bytes(i as u8, layout.size());
                p
            }
        })
        .collect();
    let mut kept = Vec::new();
    for (i, p) in blocks.into_iter().enumerate() {
        if working || (teardown && i % 64 == 63) {
            // A medium allocation between frees.
            // SAFETY: a non-zero layout, kept live to the end.
            kept.push(unsafe { MklAllocator.alloc(keep) });
        }
        // SAFETY: live blocks of `layout`, freed once.
        unsafe { MklAllocator.dealloc(p, layout) };
    }
    let dirty = medium().1;
    assert!(dirty >= (60 * MIB) as u64, "kept dirty for reuse: {dirty}");
    // Idle past the decay time, with no call of the crate's: no thread.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(medium().1, dirty, "decayed with no call and no thread");
    let before = rss();
    let small = Layout::from_size_align(32, 8).unwrap();
    // SAFETY: a non-zero layout; the block is freed at the end.
    let p = unsafe {
        if via == "split" {
            MklSplitAllocator.alloc(small)
        } else {
            MklAllocator.alloc(small)
        }
    };
    assert!(!p.is_null());
    assert!(!kept.contains(&core::ptr::null_mut()));
    let after = rss();
    let end = medium().1;
    eprintln!("{via}: dirty {dirty} -> {end}, RSS {before} -> {after}");
    if working {
        assert_eq!(end, dirty, "a small allocation decayed a working set");
    } else {
        assert_eq!(end, 0, "one small allocation after the pause");
        assert!(after + 56 * MIB < before, "RSS {before} -> {after}");
    }
    // SAFETY: live blocks of these layouts, freed once.
    unsafe {
        if via == "split" {
            MklSplitAllocator.dealloc(p, small);
        } else {
            MklAllocator.dealloc(p, small);
        }
        for q in kept {
            MklAllocator.dealloc(q, keep);
        }
    }
}

/// `MKL_ALLOC_MEDIUM` is one of the crate's switches: `off` keeps medium
/// requests on the previous functions, any other value keeps it on.
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
fn the_switch_turns_medium_blocks_off() {
    run_alone("switch_child", &[("MEDIUM_EXPECT", "on")]);
    run_alone(
        "switch_child",
        &[("MEDIUM_EXPECT", "off"), ("MKL_ALLOC_MEDIUM", "off")],
    );
    run_alone(
        "switch_child",
        &[("MEDIUM_EXPECT", "on"), ("MKL_ALLOC_MEDIUM", "bogus")],
    );
}

#[test]
#[ignore = "run by the_switch_turns_medium_blocks_off in a child process"]
fn switch_child() {
    let on = std::env::var("MEDIUM_EXPECT").unwrap() == "on";
    if !medium_here() {
        return;
    }
    let layout = Layout::from_size_align(16 * KIB, 64).unwrap();
    // SAFETY: a non-zero layout, freed once.
    let p = unsafe { MklAllocator.alloc(layout) };
    assert_eq!(medium().0 > 0, on);
    // SAFETY: as above.
    unsafe { MklAllocator.dealloc(p, layout) };
}

/// Windows keeps the previous functions below 1 MiB (no region there).
#[test]
#[cfg(windows)]
fn windows_keeps_the_previous_functions() {
    let layout = Layout::from_size_align(48 * KIB, 64).unwrap();
    // SAFETY: a non-zero layout, freed once.
    unsafe {
        let p = MklAllocator.alloc(layout);
        assert!(!p.is_null());
        assert_eq!(medium(), (0, 0, 0));
        MklAllocator.dealloc(p, layout);
    }
}

/// Not a check: prints what a malloc/free pair of 48 KiB through
/// `MklAllocator` costs, and a churn of medium blocks (a window of 1,000
/// live blocks, log-uniform 4 KiB-1 MiB, first byte of each page written).
/// Run in release, with and without `MKL_ALLOC_MEDIUM=off`:
/// `cargo test --release --test medium -- --ignored --exact timing --nocapture`.
/// This thread's CPU time (ns): the machine may be shared.
#[cfg(unix)]
fn cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

#[test]
#[cfg(unix)]
#[ignore = "a measurement, run by hand"]
fn timing() {
    manager::init();
    let layout = Layout::from_size_align(48 * KIB, 64).unwrap();
    let rounds = 1_000_000;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = cpu_ns();
        for i in 0..rounds {
            // SAFETY: a non-zero layout, freed once.
            unsafe {
                let p = MklAllocator.alloc(layout);
                p.write(i as u8);
                MklAllocator.dealloc(std::hint::black_box(p), layout);
            }
        }
        best = best.min((cpu_ns() - t) / rounds as f64);
    }
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut window: Vec<(*mut u8, Layout)> = Vec::new();
    let ops = 200_000;
    let t = cpu_ns();
    for _ in 0..ops {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // log-uniform in [4 KiB, 1 MiB): 2^(12 + 8u)
        let size = (4096.0 * 2f64.powf(8.0 * (x >> 11) as f64 / (1u64 << 53) as f64)) as usize;
        let layout = Layout::from_size_align(size.min(MIB - 256), 64).unwrap();
        // SAFETY: a non-zero layout; every block freed once.
        unsafe {
            let p = MklAllocator.alloc(layout);
            for off in (0..layout.size()).step_by(4096) {
                p.add(off).write(1);
            }
            if window.len() < 1000 {
                window.push((p, layout));
            } else {
                let i = (x % 1000) as usize;
                let (q, l) = std::mem::replace(&mut window[i], (p, layout));
                MklAllocator.dealloc(q, l);
            }
        }
    }
    let churn = (cpu_ns() - t) / ops as f64;
    for (p, l) in window {
        // SAFETY: live blocks, freed once.
        unsafe { MklAllocator.dealloc(p, l) };
    }
    eprintln!(
        "MKL_ALLOC_MEDIUM={:?}: 48 KiB malloc+free pair {best:.1} ns CPU (best of 5 x 1M); churn {churn:.0} ns CPU/op; medium {:?}; RSS {} MiB",
        std::env::var("MKL_ALLOC_MEDIUM").ok(),
        medium(),
        rss() >> 20
    );
}

/// A `fork` while another thread gives medium blocks back (outside MKL,
/// holding a class's lock for a moment at a time, a batch of blocks off
/// every list while their pages are purged) leaves the child every class
/// unlocked and nothing orphaned: each child allocates from those classes,
/// gives every dirty block back and checks that no budget stays reserved
/// for a block it cannot find (a batch copied in flight would leave its
/// reservation, counted as slack), then exits, under a watchdog (a class
/// lock copied held would hang it).
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
#[cfg_attr(not(target_os = "linux"), ignore = "fork")]
fn a_fork_while_blocks_decay_finds_the_classes_unlocked() {
    run_alone("fork_child", &[]);
    // With the background thread decaying too (its sweeps are purges).
    run_alone("fork_child", &[("MKL_ALLOC_BACKGROUND", "on")]);
}

#[test]
#[ignore = "run by a_fork_while_blocks_decay_finds_the_classes_unlocked in a child process"]
#[cfg(target_os = "linux")]
fn fork_child() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    if !medium_here() {
        return;
    }
    block_cache::enable(256 * MIB);
    if mkl_alloc::background::is_running() {
        // Its sweeps every 5 ms: purges beside the churn's own.
        block_cache::set_decay_ms(20);
    }
    static STOP: AtomicBool = AtomicBool::new(false);
    manager::free_buffers();
    let slack = manager::stats().slack_bytes;
    let layouts: Vec<Layout> = [8 * KIB, 48 * KIB, 200 * KIB]
        .iter()
        .map(|&s| Layout::from_size_align(s, 64).unwrap())
        .collect();
    let churn = {
        let layouts = layouts.clone();
        std::thread::spawn(move || {
            while !STOP.load(Relaxed) {
                for &l in &layouts {
                    // SAFETY: non-zero layouts, each block freed once.
                    unsafe {
                        let ps: Vec<*mut u8> = (0..32).map(|_| MklAllocator.alloc(l)).collect();
                        for p in ps {
                            MklAllocator.dealloc(p, l);
                        }
                    }
                }
                // Gives every dirty block back: class locks taken outside MKL.
                manager::free_buffers();
            }
        })
    };
    let mut orphans = 0;
    for _ in 0..60 {
        std::thread::sleep(std::time::Duration::from_micros(300));
        // SAFETY: the child only allocates, frees and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            for &l in &layouts {
                // SAFETY: non-zero layouts, freed once.
                unsafe { MklAllocator.dealloc(MklAllocator.alloc(l), l) };
            }
            manager::free_buffers();
            let s = manager::stats();
            let orphaned = s.medium_dirty_bytes != 0 || s.slack_bytes > slack;
            // SAFETY: leaves the child at once, running nothing of the parent's.
            unsafe { libc::_exit(if orphaned { 3 } else { 0 }) };
        }
        let mut status = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            // SAFETY: waits for our own child, without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break;
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: our own child, stuck.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("a forked child hung");
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(libc::WIFEXITED(status), "a child died: {status:#x}");
        orphans += (libc::WEXITSTATUS(status) == 3) as usize;
        assert!(matches!(libc::WEXITSTATUS(status), 0 | 3));
    }
    assert_eq!(orphans, 0, "children with a reservation left behind, of 60");
    STOP.store(true, Relaxed);
    churn.join().unwrap();
}

/// A forked child's first new thread may get the stack of a thread of the
/// parent (the C library keeps the dead threads' stacks for reuse), its
/// thread-locals set afresh in place: the slots of a thread that parked a
/// block in the parent, if still on the child's registry, would link
/// themselves after themselves at the new thread's first park, and the
/// child's next sweep would never end (it did, before the child's fork
/// handler kept the forking thread's slots alone on the registry).
#[test]
#[cfg_attr(miri, ignore = "starts child processes")]
#[cfg_attr(not(target_os = "linux"), ignore = "fork")]
fn a_forked_childs_new_thread_on_a_dead_threads_stack_parks_and_sweeps() {
    run_alone("fork_slots_child", &[]);
}

#[test]
#[ignore = "run by a_forked_childs_new_thread_on_a_dead_threads_stack_parks_and_sweeps in a child process"]
#[cfg(target_os = "linux")]
fn fork_slots_child() {
    if !medium_here() {
        return;
    }
    let l = Layout::from_size_align(48 * KIB, 64).unwrap();
    let (parked_tx, parked_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    // Parks a block (its slots registered last: the registry's first),
    // then waits, alive, through the fork.
    let t = std::thread::spawn(move || {
        // SAFETY: a non-zero layout, freed once.
        unsafe { MklAllocator.dealloc(MklAllocator.alloc(l), l) };
        parked_tx.send(()).unwrap();
        go_rx.recv().unwrap();
    });
    parked_rx.recv().unwrap();
    // SAFETY: the child starts a thread, allocates, frees, and leaves with
    // _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // Of the same stack size as `t`: glibc hands it `t`'s stack.
        std::thread::spawn(move || {
            // SAFETY: as above.
            unsafe { MklAllocator.dealloc(MklAllocator.alloc(l), l) };
        })
        .join()
        .unwrap();
        manager::free_buffers();
        let parked = manager::stats().medium_live_bytes;
        // SAFETY: leaves the child at once.
        unsafe { libc::_exit(if parked == 0 { 0 } else { 3 }) };
    }
    let mut status = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let hung = loop {
        // SAFETY: waits for our own child, without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break false;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: our own child, stuck.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    go_tx.send(()).unwrap();
    t.join().unwrap();
    assert!(!hung, "the forked child hung in its sweep");
    assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child kept medium blocks live after free_buffers (the parent thread's parked one)"
    );
}
