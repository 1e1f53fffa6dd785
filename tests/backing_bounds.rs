//! The bounds of the memory beneath MKL (issue 35), each checked in a
//! fresh child process, since each fills or measures process-wide state
//! (the chunk table, the block cache, the resident set):
//!
//! - a full chunk table never fails a growth that memory can serve: the
//!   chunk that cannot be registered is copied into the C runtime's block.
#![cfg(target_os = "linux")]

mod common;

use core::alloc::{GlobalAlloc, Layout};

use mkl_alloc::MklAllocator;

const MIB: usize = 1 << 20;

/// Runs the ignored test `name` of this binary in a child process and
/// asserts that it passed.
fn in_child(name: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--ignored", "--test-threads=1"])
        .env_remove("MKL_ALLOC_BACKING")
        .env_remove("MKL_ALLOC_BLOCK_CACHE")
        .env_remove("MKL_ALLOC_HUGE_PAGES")
        .output()
        .unwrap();
    let (passed, text) = common::child_passed(&out);
    assert!(passed, "{text}");
}

/// 70 000 live blocks of `size` bytes (more than the chunk table's 65 536
/// slots), then 200 of the first grown x3: the count of growths that
/// failed.
fn failed_growths_with_a_full_table(size: usize) -> usize {
    let layout = Layout::from_size_align(size, 64).unwrap();
    let mut blocks = Vec::with_capacity(70_000);
    for _ in 0..70_000 {
        // SAFETY: a non-zero size.
        let p = unsafe { MklAllocator.alloc(layout) };
        assert!(!p.is_null(), "{} live blocks of {size} B", blocks.len());
        blocks.push((p, size));
    }
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

/// Before: 26 of 200 1 MiB growths failed, 188 of 200 just under 2 MiB.
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
