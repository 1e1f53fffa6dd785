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

/// Issue 41: the free path checked cached + slack against the budget, then
/// reserved with a compare-and-swap on the cached bytes alone, so two
/// threads freeing at once both passed: two 20 MiB chunks freed beside
/// 21 MiB of slack under a 48 MiB budget left 61 MiB held in 10 of 500
/// trials. One word now holds both (`Cache::reserve`).
#[test]
fn frees_racing_at_the_budget_edge_keep_cache_and_slack_within_it() {
    in_child_with("budget_race_child", Some("50331648"));
}

#[test]
#[ignore = "run by frees_racing_at_the_budget_edge_keep_cache_and_slack_within_it in a child process"]
fn budget_race_child() {
    use mkl_alloc::{ffi, manager};
    const BUDGET: usize = 48 * MIB;
    assert_eq!(mkl_alloc::block_cache::budget(), Some(BUDGET));
    let trials = if std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small") {
        20
    } else {
        500
    };
    let twenty = Layout::from_size_align(20 * MIB, 64).unwrap();
    let mut over = 0;
    let mut worst = 0;
    for _ in 0..trials {
        manager::free_buffers();
        // 21 MiB of slack: a block of the C runtime's growing into a chunk
        // (512 KiB to 3.2 MiB) takes a cached chunk of up to 8 times its
        // size, a freed 24 MiB one, and grows within it. Pages untouched:
        // only the bookkeeping is under test.
        // SAFETY: MKL_malloc, MKL_free and MKL_realloc with valid sizes and
        // live blocks; the grown block is freed once, at the end.
        let p = unsafe {
            let t = ffi::MKL_malloc(24 * MIB, 64);
            assert!(!t.is_null());
            ffi::MKL_free(t);
            let p = ffi::MKL_malloc(512 << 10, 64);
            assert!(!p.is_null());
            let q = ffi::MKL_realloc(p, 16 * MIB / 5);
            assert!(!q.is_null());
            q
        };
        let slack = manager::stats().slack_bytes as usize;
        assert!(slack >= 20 * MIB, "the shrink kept {slack} B of slack");
        let blocks: Vec<usize> = (0..2)
            .map(|_| {
                // SAFETY: a non-zero size.
                let b = unsafe { MklAllocator.alloc(twenty) };
                assert!(!b.is_null());
                b as usize
            })
            .collect();
        let go = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for &b in &blocks {
                let go = &go;
                s.spawn(move || {
                    go.wait();
                    // SAFETY: a live block of this layout, freed once.
                    unsafe { MklAllocator.dealloc(b as *mut u8, twenty) };
                });
            }
        });
        let st = manager::stats();
        let held = (st.cached_bytes + st.slack_bytes) as usize;
        worst = worst.max(held);
        if held > BUDGET {
            over += 1;
        }
        // SAFETY: the live MKL block, freed once.
        unsafe { ffi::MKL_free(p) };
    }
    println!(
        "{trials} trials: {over} over the budget, the most held {} MiB",
        worst / MIB
    );
    assert_eq!(
        over,
        0,
        "cache + slack above the {} MiB budget in {over} of {trials} trials (most {} MiB)",
        BUDGET / MIB,
        worst / MIB
    );
}

/// Issue 41: at the crate's share of the kernel's mapping limit, a request
/// the cache could not serve unmapped every cached chunk to make room for
/// its one mapping. It now unmaps one.
#[test]
fn at_the_mapping_limit_one_cached_chunk_makes_room() {
    in_child_with("evict_one_child", Some("1073741824"));
}

#[test]
#[ignore = "run by at_the_mapping_limit_one_cached_chunk_makes_room in a child process"]
fn evict_one_child() {
    use mkl_alloc::manager;
    // MKL's block starts 64 bytes into its chunk, which is 2 MiB-aligned.
    let is_chunk = |p: *mut u8| p as usize % (2 * MIB) == 64;
    let one = Layout::from_size_align(MIB, 64).unwrap();
    let mut live = Vec::new();
    loop {
        // SAFETY: a non-zero size.
        let p = unsafe { MklAllocator.alloc(one) };
        assert!(!p.is_null(), "{} live blocks", live.len());
        if !is_chunk(p) {
            // The crate's share of the mapping limit is taken: the C
            // runtime served it.
            // SAFETY: a live block of this layout, freed once.
            unsafe { MklAllocator.dealloc(p, one) };
            break;
        }
        live.push(p);
        assert!(live.len() < 1 << 20, "no mapping limit reached");
    }
    // Four cached (a size class keeps four blocks).
    for p in live.drain(live.len() - 4..) {
        // SAFETY: as above.
        unsafe { MklAllocator.dealloc(p, one) };
    }
    assert_eq!(manager::stats().cached_buffers, 4);
    let three = Layout::from_size_align(3 * MIB, 64).unwrap();
    // SAFETY: a non-zero size.
    let q = unsafe { MklAllocator.alloc(three) };
    assert!(!q.is_null());
    let s = manager::stats();
    println!(
        "{} live chunks at the limit; after a 3 MiB request: chunk {}, {} cached",
        live.len() + 4,
        is_chunk(q),
        s.cached_buffers
    );
    assert!(is_chunk(q), "a cached chunk made room for the new one");
    // One cached chunk is grown to 3 MiB (in place, or, with no mapping
    // to be had for a move, unmapped to make room), and two more go to
    // make room for the 2 MiB new (issue 54: the cache unmaps as much as
    // the crate maps): one stays. Until issue 54, one went and three
    // stayed; before issue 41, all went.
    assert_eq!(
        s.cached_buffers, 1,
        "as many cached chunks unmapped as needed, not all"
    );
    // SAFETY: live blocks of their layouts, each freed once.
    unsafe {
        MklAllocator.dealloc(q, three);
        for p in live {
            MklAllocator.dealloc(p, one);
        }
    }
}

/// Issue 41: a growth onto a cached chunk moved only the old bytes onto
/// it, replacing a prefix of its mapping; repeated with shrinking old
/// sizes, each step added a mapping (8 for one chunk in review). A chunk
/// now stays within two mappings whatever the growth pattern.
#[test]
fn growths_onto_one_cached_chunk_keep_it_within_two_mappings() {
    in_child_with("mappings_child", Some("1073741824"));
}

/// The mappings of this process that overlap `[start, start + len)`.
fn mappings_in(start: usize, len: usize) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| {
            let range = l.split(' ').next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            a < start + len && b > start
        })
        .count()
}

#[test]
#[ignore = "run by growths_onto_one_cached_chunk_keep_it_within_two_mappings in a child process"]
fn mappings_child() {
    use mkl_alloc::ffi;
    // MKL's block starts 64 bytes into its chunk; a chunk is the request
    // plus MKL's header, in whole pages.
    let chunk_of = |p: *mut core::ffi::c_void| p as usize - 64;
    let chunk_len = |n: usize| (n + 64 + 24).next_multiple_of(4096);
    let mut target = 0;
    let mut guards = Vec::new();
    for (step, old) in [16, 14, 12, 10, 8].into_iter().enumerate() {
        let old = old * MIB;
        // SAFETY: MKL_malloc with a valid size; the blocks are written
        // within them, `t` freed once into the cache, `a` grown once with
        // MKL_realloc and freed once.
        unsafe {
            // The target is live while `a` is made: cached, it would serve
            // `a`, cut down (issue 54). Freed after, it is cached for the
            // growth.
            let t = ffi::MKL_malloc(64 * MIB, 64);
            assert!(!t.is_null());
            if step == 0 {
                target = chunk_of(t);
            }
            assert_eq!(chunk_of(t), target, "step {step}: the cached chunk");
            let a = ffi::MKL_malloc(old, 64);
            assert!(!a.is_null());
            ffi::MKL_free(t);
            a.cast::<u8>().write_bytes(step as u8 + 1, old);
            // Something mapped right after the chunk, so that it cannot
            // grow in place and moves onto the cached one.
            let after = chunk_of(a) + chunk_len(old);
            let g = libc::mmap(
                after as *mut core::ffi::c_void,
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            if g != libc::MAP_FAILED {
                guards.push(g);
            }
            let b = ffi::MKL_realloc(a, old + MIB);
            assert!(!b.is_null());
            assert_eq!(
                chunk_of(b),
                target,
                "step {step}: the growth took the cached chunk"
            );
            let bytes = core::slice::from_raw_parts(b.cast::<u8>(), old);
            assert!(
                bytes.iter().all(|&x| x == step as u8 + 1),
                "step {step}: contents moved"
            );
            ffi::MKL_free(b);
        }
    }
    let maps = mappings_in(target, chunk_len(64 * MIB));
    println!("one cached chunk after 5 growths onto it: {maps} mappings");
    assert!(maps <= 2, "{maps} mappings for one chunk");
    for g in guards {
        // SAFETY: our own guard page.
        unsafe { libc::munmap(g, 4096) };
    }
}

/// Issue 41: `block_cache::enable` with a lower budget drained only the
/// cache, and the slack of live chunks stayed (450 MiB under a new budget
/// of 64 MiB in review), resident, also after `free_buffers()`. Both now
/// give the slack's tails back.
#[test]
fn a_lowered_budget_and_free_buffers_give_the_slack_back() {
    in_child_with("lowered_budget_child", Some("1073741824"));
}

/// `n` blocks of the C runtime's grown into chunks onto freed, written
/// 24 MiB chunks: about 21 MiB of resident slack each. Each block's first
/// 3 MiB hold its index.
fn grown_with_slack(n: usize) -> Vec<*mut core::ffi::c_void> {
    use mkl_alloc::ffi;
    (0..n)
        .map(|i| {
            // SAFETY: MKL_malloc, MKL_free and MKL_realloc with valid
            // sizes and live blocks, written within their sizes.
            unsafe {
                let t = ffi::MKL_malloc(24 * MIB, 64);
                assert!(!t.is_null());
                t.cast::<u8>().write_bytes(0xEE, 24 * MIB);
                ffi::MKL_free(t);
                let p = ffi::MKL_malloc(512 << 10, 64);
                assert!(!p.is_null());
                let q = ffi::MKL_realloc(p, 16 * MIB / 5);
                assert!(!q.is_null());
                q.cast::<u8>().write_bytes(i as u8, 3 * MIB);
                q
            }
        })
        .collect()
}

#[test]
#[ignore = "run by a_lowered_budget_and_free_buffers_give_the_slack_back in a child process"]
fn lowered_budget_child() {
    use mkl_alloc::{block_cache, ffi, manager};
    let blocks = grown_with_slack(20);
    let before = (rss(), manager::stats());
    assert!(
        before.1.slack_bytes as usize >= 400 * MIB,
        "the growths kept {} MiB of slack",
        before.1.slack_bytes / MIB as u64
    );
    block_cache::enable(64 * MIB);
    let after = (rss(), manager::stats());
    println!(
        "budget 1 GiB -> 64 MiB: slack {} -> {} MiB, cached {} MiB, RSS -{} MiB",
        before.1.slack_bytes / MIB as u64,
        after.1.slack_bytes / MIB as u64,
        after.1.cached_bytes / MIB as u64,
        (before.0 - after.0) / MIB
    );
    assert!(
        (after.1.cached_bytes + after.1.slack_bytes) as usize <= 64 * MIB,
        "{:?}",
        after.1
    );
    assert!(
        before.0 - after.0 >= 300 * MIB,
        "RSS fell only {} B",
        before.0 - after.0
    );
    // The blocks are intact and still grow and shrink.
    for (i, &q) in blocks.iter().enumerate() {
        // SAFETY: live MKL blocks of 3.2 MiB, read within, grown once.
        unsafe {
            let bytes = core::slice::from_raw_parts(q.cast::<u8>(), 3 * MIB);
            assert!(bytes.iter().all(|&b| b == i as u8), "block {i}");
            let r = ffi::MKL_realloc(q, 6 * MIB);
            assert!(!r.is_null());
            let bytes = core::slice::from_raw_parts(r.cast::<u8>(), 3 * MIB);
            assert!(bytes.iter().all(|&b| b == i as u8), "block {i} grown");
            ffi::MKL_free(r);
        }
    }
    // free_buffers gives every byte of slack back (the cache emptied
    // first: the freed 6 MiB chunks would serve the growths).
    block_cache::enable(1 << 30);
    block_cache::disable();
    block_cache::enable(1 << 30);
    let more = grown_with_slack(8);
    assert!(manager::stats().slack_bytes as usize >= 150 * MIB);
    manager::free_buffers();
    let s = manager::stats();
    assert_eq!((s.slack_bytes, s.cached_bytes), (0, 0), "{s:?}");
    for q in more {
        // SAFETY: live MKL blocks, freed once.
        unsafe { ffi::MKL_free(q) };
    }
}
