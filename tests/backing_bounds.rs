//! The bounds of the memory beneath MKL (issue 35), each checked in a
//! fresh child process, since each fills or measures process-wide state
//! (the chunk table, the block cache, the resident set):
//!
//! - a full chunk table never fails a growth that memory can serve: the
//!   chunk that cannot be registered is copied into the C runtime's block;
//! - the crate's chunks keep within half of `vm.max_map_count`;
//! - an idle process leaves its cache reclaimable (`MADV_FREE`);
//! - the slack of a chunk grown onto a larger cached one is counted
//!   (`MemStats::slack_bytes`) and bounded with the cache by its budget.
#![cfg(target_os = "linux")]

mod common;

use core::alloc::{GlobalAlloc, Layout};

use mkl_alloc::MklAllocator;

const MIB: usize = 1 << 20;

/// Runs the ignored test `name` of this binary in a child process and
/// asserts that it passed.
fn in_child(name: &str) {
    in_child_with(name, None);
}

/// As [`in_child`], with `MKL_ALLOC_BLOCK_CACHE` set to `cache` if given.
fn in_child_with(name: &str, cache: Option<&str>) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--ignored", "--test-threads=1"])
        .env_remove("MKL_ALLOC_BACKING")
        .env_remove("MKL_ALLOC_BLOCK_CACHE")
        .env_remove("MKL_ALLOC_HUGE_PAGES");
    if let Some(c) = cache {
        cmd.env("MKL_ALLOC_BLOCK_CACHE", c);
    }
    let out = cmd.output().unwrap();
    let (passed, text) = common::child_passed(&out);
    assert!(passed, "{text}");
}

/// 70 000 live blocks of `size` bytes (more than the chunk table's 65 536
/// slots, and more chunks than the kernel's mapping limit allows): the
/// process's mappings stay within half of `vm.max_map_count`; then 200
/// of the first grown x3: the count of growths that failed.
fn failed_growths_with_a_full_table(size: usize) -> usize {
    let layout = Layout::from_size_align(size, 64).unwrap();
    // The C library serves what is not a chunk from its heap, not with
    // mappings of its own, so that the mappings counted are the crate's.
    // SAFETY: mallopt changes a tunable of the C library's malloc.
    assert_eq!(
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) },
        1
    );
    let mut blocks = Vec::with_capacity(70_000);
    for _ in 0..70_000 {
        // SAFETY: a non-zero size.
        let p = unsafe { MklAllocator.alloc(layout) };
        assert!(!p.is_null(), "{} live blocks of {size} B", blocks.len());
        blocks.push((p, size));
    }
    let maps = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count();
    let max: usize = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    println!("{maps} mappings, vm.max_map_count {max}");
    assert!(maps <= max / 2, "{maps} mappings, vm.max_map_count {max}");
    let mut failed = 0;
    for (i, (p, n)) in blocks.iter_mut().take(200).enumerate() {
        // SAFETY: a live block of `layout`, written within it.
        unsafe {
            p.write(i as u8);
            p.add(size - 1).write(!(i as u8));
            let q = MklAllocator.realloc(*p, layout, 3 * size);
            if q.is_null() {
                failed += 1;
                continue;
            }
            assert_eq!((q.read(), q.add(size - 1).read()), (i as u8, !(i as u8)));
            q.add(3 * size - 1).write(1);
            (*p, *n) = (q, 3 * size);
        }
    }
    for (p, n) in blocks {
        // SAFETY: a live block of this allocator, of `n` bytes.
        unsafe { MklAllocator.dealloc(p, Layout::from_size_align(n, 64).unwrap()) };
    }
    failed
}

/// Before: all 200 1 MiB growths failed (a chunk that must move could not
/// be registered, or the kernel refused its mapping), and the crate's
/// chunks took the process to the kernel's mapping limit.
#[test]
fn a_full_chunk_table_fails_no_growth() {
    in_child("full_table_child_1mib");
    in_child("full_table_child_2mib");
}

#[test]
#[ignore = "run by a_full_chunk_table_fails_no_growth in a child process"]
fn full_table_child_1mib() {
    assert_eq!(failed_growths_with_a_full_table(MIB), 0);
}

#[test]
#[ignore = "run by a_full_chunk_table_fails_no_growth in a child process"]
fn full_table_child_2mib() {
    assert_eq!(failed_growths_with_a_full_table(2 * MIB - 8192), 0);
}

/// `Rss - LazyFree` of this process, in bytes (`/proc/self/smaps_rollup`):
/// what it keeps resident that the kernel cannot take back at will.
fn unreclaimable() -> usize {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    let kib = |key: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map_or(0, |v| {
                v.trim().trim_end_matches("kB").trim().parse().unwrap()
            })
    };
    (kib("Rss:") - kib("LazyFree:")) * 1024
}

/// Before: an idle process kept every cached chunk under 8 MiB resident
/// (48 of 1-8 MiB: 161 MiB, LazyFree 0).
#[test]
fn an_idle_process_keeps_its_cache_reclaimable() {
    in_child("idle_child");
}

#[test]
#[ignore = "run by an_idle_process_keeps_its_cache_reclaimable in a child process"]
fn idle_child() {
    let before = unreclaimable();
    let layouts: Vec<Layout> = (0..48)
        .map(|i| Layout::from_size_align(MIB + i * 7 * MIB / 47, 64).unwrap())
        .collect();
    let blocks: Vec<*mut u8> = layouts
        .iter()
        .map(|&l| {
            // SAFETY: a non-zero size; every page of the block written.
            unsafe {
                let p = MklAllocator.alloc(l);
                assert!(!p.is_null());
                p.write_bytes(1, l.size());
                p
            }
        })
        .collect();
    let touched = unreclaimable();
    assert!(touched >= before + 150 * MIB, "{touched} after {before}");
    for (&p, &l) in blocks.iter().zip(&layouts) {
        // SAFETY: a live block of `l`.
        unsafe { MklAllocator.dealloc(p, l) };
    }
    assert!(
        mkl_alloc::block_cache::cached_bytes() >= 100 * MIB,
        "the chunks are cached"
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    let idle = unreclaimable();
    println!(
        "idle: {} MiB above the start",
        (idle.saturating_sub(before)) / MIB
    );
    assert!(
        idle <= before + 16 * MIB,
        "{} MiB resident that the kernel cannot take back",
        (idle - before) / MIB
    );
}

/// `VmRSS` of this process, in bytes.
fn rss() -> usize {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
        .unwrap();
    kib * 1024
}

/// Before: each round's Vec, grown from 1 to 2 MiB, took the round's
/// freed 7.5 MiB temporary from the cache and kept its 5.5 MiB of slack,
/// counted nowhere: RSS +751 MiB with a budget of 64 MiB, against +208
/// MiB with the backing off.
#[test]
fn growth_slack_is_counted_and_bounded_by_the_budget() {
    in_child_with("slack_child", Some("67108864"));
}

#[test]
#[ignore = "run by growth_slack_is_counted_and_bounded_by_the_budget in a child process"]
fn slack_child() {
    use allocator_api2::vec::Vec as AVec;
    const BUDGET: usize = 64 * MIB;
    assert_eq!(mkl_alloc::block_cache::budget(), Some(BUDGET));
    let start = (rss(), mkl_alloc::manager::stats());
    let temp = Layout::from_size_align(15 * MIB / 2, 64).unwrap();
    let mut kept = Vec::new();
    for _ in 0..100 {
        // SAFETY: a non-zero size, written whole, then freed.
        unsafe {
            let t = MklAllocator.alloc(temp);
            assert!(!t.is_null());
            t.write_bytes(1, temp.size());
            MklAllocator.dealloc(t, temp);
        }
        let mut v: AVec<u8, MklAllocator> = AVec::new_in(MklAllocator);
        for i in 0..1_500_000 {
            v.push(i as u8);
        }
        kept.push(v);
    }
    let (end, s) = (rss(), mkl_alloc::manager::stats());
    let grown = end - start.0;
    let live = (s.bytes - start.1.bytes) as usize;
    let (cached, slack) = (s.cached_bytes as usize, s.slack_bytes as usize);
    println!(
        "RSS +{} MiB: live {} MiB, cached {} MiB, slack {} MiB",
        grown / MIB,
        live / MIB,
        cached / MIB,
        slack / MIB
    );
    assert!(cached + slack <= BUDGET, "{s:?}");
    assert!(grown <= live + BUDGET + 16 * MIB, "RSS +{grown}: {s:?}");
    assert!(
        grown <= live + cached + slack + 16 * MIB,
        "RSS +{grown} not accounted for: {s:?}"
    );
}
