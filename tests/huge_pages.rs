//! The huge-page policy (`mkl_alloc::huge_pages`): its API, the environment
//! variable (in child processes: it is read once per process), what it does
//! to blocks above and below the threshold, growth keeping contents and
//! alignment, the failure path, and `/proc/self/smaps` showing huge pages.
//!
//! The policy is process-wide, so every test here that allocates a large
//! block or changes the policy holds `serial()`.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use allocator_api2::alloc::Allocator;
use mkl_alloc::huge_pages::{self, HUGE_PAGE_SIZE, Status};
use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec, SharedVecError};

// Every allocation of this binary, libtest's included, is an MKL block, so
// in `env_child` the environment variable is first read inside the global
// allocator (by the process's first allocation): that must neither allocate
// nor recurse.
#[global_allocator]
static GLOBAL: MklAllocator = MklAllocator;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const MIB: usize = 1 << 20;

/// The 2 MiB-aligned interior of a block: what the policy advises.
fn interior(p: *const u8, size: usize) -> (usize, usize) {
    let a = p as usize;
    (
        a.next_multiple_of(HUGE_PAGE_SIZE),
        (a + size) & !(HUGE_PAGE_SIZE - 1),
    )
}

/// `AnonHugePages` (KiB) summed over the mappings of `/proc/self/smaps`
/// that overlap `[start, end)`.
fn anon_huge_kib(start: usize, end: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let mut overlapping = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                overlapping = a < end && start < b;
                continue;
            }
        }
        if overlapping {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                kib += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
    }
    kib
}

/// Writes one byte per 4 KiB page (the first touch) with a pattern.
fn touch(p: *mut u8, size: usize) {
    for off in (0..size).step_by(4096) {
        // SAFETY: off < size, inside the caller's live block.
        unsafe { p.add(off).write((off / 4096) as u8) };
    }
}

/// The bytes `fill` writes and `check` reads: all of the first and last
/// 64 KiB and every 4093rd byte between (a prime stride, so a copy shifted
/// by any page-sized offset is caught), to keep 40 MiB blocks quick.
fn probes(size: usize) -> impl Iterator<Item = usize> {
    let edge = size.min(1 << 16);
    (0..edge)
        .chain(size - edge..size)
        .chain((0..size).step_by(4093))
}

fn pattern(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(31) ^ (i >> 12) as u8 ^ seed
}

fn fill(p: *mut u8, size: usize, seed: u8) {
    for i in probes(size) {
        // SAFETY: i < size, inside the caller's live block.
        unsafe { p.add(i).write(pattern(i, seed)) };
    }
}

/// Checks that the first `size` bytes hold what `fill(_, size, seed)` wrote.
fn check(p: *const u8, size: usize, seed: u8) {
    for i in probes(size) {
        // SAFETY: i < size, inside the caller's live block.
        let b = unsafe { p.add(i).read() };
        assert_eq!(b, pattern(i, seed), "byte {i} of {size} lost");
    }
}

#[test]
fn policy_api_round_trips() {
    let _g = serial();
    huge_pages::enable(64 * MIB);
    assert_eq!(huge_pages::threshold(), Some(64 * MIB));
    huge_pages::enable(HUGE_PAGE_SIZE);
    assert_eq!(huge_pages::threshold(), Some(HUGE_PAGE_SIZE));
    // 0 and 1 select the same blocks (all); the threshold says 1.
    huge_pages::enable(0);
    assert_eq!(huge_pages::threshold(), Some(1));
    huge_pages::enable(usize::MAX);
    assert_eq!(huge_pages::threshold(), Some(usize::MAX - 1));
    huge_pages::disable();
    assert_eq!(huge_pages::threshold(), None);
}

#[test]
fn status_matches_the_kernel_file() {
    let s = huge_pages::status();
    // Off Linux there is no THP, whatever the path holds (under wine it is
    // the Linux host's file).
    let file = if cfg!(target_os = "linux") {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
    } else {
        Err(std::io::ErrorKind::Unsupported.into())
    };
    match file {
        Ok(text) => {
            let word = text
                .split_whitespace()
                .find(|w| w.starts_with('['))
                .expect("a bracketed mode");
            let expect = match word {
                "[always]" => Status::Always,
                "[madvise]" => Status::Madvise,
                "[never]" => Status::Never,
                w => panic!("unknown THP mode {w}"),
            };
            assert_eq!(s, expect);
        }
        Err(_) if cfg!(windows) => {
            // Windows: large pages, or the reason there are none.
            let why = huge_pages::unavailable_reason();
            assert_eq!(s == Status::LargePages, why.is_none(), "{s:?}, {why:?}");
            assert!(s == Status::LargePages || s == Status::Unavailable, "{s:?}");
        }
        Err(_) => assert_eq!(s, Status::Unavailable),
    }
    assert_eq!(s.is_available(), huge_pages::unavailable_reason().is_none());
    assert_eq!(Status::parse("[always] madvise never"), Status::Always);
    assert_eq!(Status::parse("always madvise never"), Status::Unavailable);
}

/// Runs this test binary's `env_child` in a fresh process with
/// `MKL_ALLOC_HUGE_PAGES` set to `value` (or unset), expecting `expect`.
fn run_child(value: Option<&str>, expect: Option<usize>) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        "env_child",
        "--nocapture",
        "--test-threads=1",
    ]);
    match value {
        Some(v) => cmd.env("MKL_ALLOC_HUGE_PAGES", v),
        None => cmd.env_remove("MKL_ALLOC_HUGE_PAGES"),
    };
    cmd.env(
        "MKL_ALLOC_HP_EXPECT",
        expect.map_or("none".to_string(), |t| t.to_string()),
    );
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "child with MKL_ALLOC_HUGE_PAGES={value:?} failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "the child test did not run"
    );
    stderr
}

#[test]
fn env_variable_is_read_once_per_process() {
    let on = Some(huge_pages::DEFAULT_THRESHOLD);
    // On by default, from 4 MiB.
    assert!(!run_child(None, on).contains("MKL_ALLOC_HUGE_PAGES"));
    run_child(Some(""), on);
    run_child(Some("off"), None);
    run_child(Some("0"), None);
    run_child(Some("on"), on);
    run_child(Some("ON"), on);
    run_child(Some("12582912"), Some(12 * MIB));
    run_child(Some("12M"), Some(12 * MIB));
    run_child(Some("12MiB"), Some(12 * MIB));
    for bad in ["2MB", "yes", "-5"] {
        // A typo keeps the default, with a warning.
        let err = run_child(Some(bad), on);
        assert!(
            err.contains("MKL_ALLOC_HUGE_PAGES must be off, on or a byte count"),
            "no warning for {bad:?}: {err}"
        );
    }
}

/// The child half of `env_variable_is_read_once_per_process` (ignored in a
/// normal run). Its first large allocation reads the variable inside the
/// allocator, before anything else consults the policy.
#[test]
#[ignore = "run by env_variable_is_read_once_per_process in a child process"]
fn env_child() {
    let expect = std::env::var("MKL_ALLOC_HP_EXPECT").expect("run as a child");
    let expect: Option<usize> = match expect.as_str() {
        "none" => None,
        t => Some(t.parse().unwrap()),
    };
    let before = huge_pages::advised_bytes();
    let layout = Layout::from_size_align(16 * MIB, 64).unwrap();
    // SAFETY: a non-zero layout; the block is freed below.
    let p = unsafe { MklAllocator.alloc(layout) };
    assert!(!p.is_null());
    let advised = huge_pages::advised_bytes() - before;
    // SAFETY: allocated above with `layout`.
    unsafe { MklAllocator.dealloc(p, layout) };
    assert_eq!(huge_pages::threshold(), expect);
    if expect.is_some() && cfg!(target_os = "linux") {
        assert!(advised >= 12 * MIB as u64, "advised {advised} bytes");
    } else {
        // Off; or not Linux, where nothing is advised (Windows has no
        // advice for the C heap's blocks).
        assert_eq!(advised, 0);
    }
    // enable / disable override the variable.
    huge_pages::enable(3 * MIB);
    assert_eq!(huge_pages::threshold(), Some(3 * MIB));
    huge_pages::disable();
    assert_eq!(huge_pages::threshold(), None);
}

#[test]
fn blocks_below_the_threshold_are_not_advised() {
    let _g = serial();
    // Fresh blocks: a cached chunk that earlier tests had advised keeps
    // its advice (and its huge pages) when it is reused, and since issue
    // 54 it may serve a 32 MiB block cut down or grown.
    mkl_alloc::manager::free_buffers();
    huge_pages::enable(64 * MIB);
    let before = huge_pages::advised_bytes();
    let size = 32 * MIB;
    let layout = Layout::from_size_align(size, 64).unwrap();
    // SAFETY: non-zero layouts; every block is freed below.
    unsafe {
        let a = MklAllocator.alloc(layout);
        let z = MklAllocator.alloc_zeroed(layout);
        let g = MklAllocator.alloc(Layout::from_size_align(MIB, 64).unwrap());
        let g = MklAllocator.realloc(g, Layout::from_size_align(MIB, 64).unwrap(), size);
        for p in [a, z, g] {
            assert!(!p.is_null());
            touch(p, size);
        }
        assert_eq!(
            huge_pages::advised_bytes(),
            before,
            "a block under 64 MiB was advised"
        );
        if huge_pages::status() == Status::Madvise {
            for p in [a, z, g] {
                let (s, e) = interior(p, size);
                assert_eq!(anon_huge_kib(s, e), 0, "huge pages below the threshold");
            }
        }
        for p in [a, z, g] {
            MklAllocator.dealloc(p, layout);
        }
    }
    huge_pages::disable();
}

#[test]
fn advised_bytes_counts_each_large_block() {
    let _g = serial();
    huge_pages::enable(HUGE_PAGE_SIZE);
    let size = 16 * MIB + 123;
    let layout = Layout::from_size_align(size, 64).unwrap();
    let before = huge_pages::advised_bytes();
    // SAFETY: a non-zero layout, freed below.
    let p = unsafe { MklAllocator.alloc(layout) };
    assert!(!p.is_null());
    let (s, e) = interior(p, size);
    let advised = huge_pages::advised_bytes() - before;
    // SAFETY: allocated above with `layout`.
    unsafe { MklAllocator.dealloc(p, layout) };
    // The kernel accepts MADV_HUGEPAGE wherever THP is built in (even under
    // `never`, where it has no effect).
    // The whole chunk beneath MKL is advised: its whole 2 MiB frames are
    // counted, at least the block's own interior, at most the chunk.
    if huge_pages::status() != Status::Unavailable {
        assert!(advised >= (e - s) as u64);
        assert!(advised <= (size + HUGE_PAGE_SIZE) as u64);
        assert_eq!(advised % HUGE_PAGE_SIZE as u64, 0);
    }
    huge_pages::disable();
    let before = huge_pages::advised_bytes();
    // SAFETY: as above.
    unsafe {
        let p = MklAllocator.alloc(layout);
        assert!(!p.is_null());
        MklAllocator.dealloc(p, layout);
    }
    assert_eq!(
        huge_pages::advised_bytes(),
        before,
        "advised with the policy off"
    );
}

/// Grows a block through `grow` sizes, checking contents and alignment at
/// each step, with `GlobalAlloc::realloc` and allocator-api2 `grow`,
/// `grow_zeroed` and `shrink`, for MklAllocator and MklSplitAllocator.
fn grow_chain<A: GlobalAlloc + Allocator>(a: &A, align: usize) {
    let sizes = [MIB, 3 * MIB + 13, 17 * MIB, 40 * MIB + 4097];
    let min_align = align.max(64);
    // GlobalAlloc::realloc.
    let l0 = Layout::from_size_align(sizes[0], align).unwrap();
    // SAFETY: non-zero layouts; each realloc gets the live block and its
    // current layout; the final block is freed once.
    unsafe {
        let mut p = a.alloc(l0);
        assert!(!p.is_null());
        fill(p, sizes[0], 7);
        let mut old = l0;
        for &n in &sizes[1..] {
            let q = a.realloc(p, old, n);
            assert!(!q.is_null(), "realloc to {n} at align {align}");
            assert_eq!(
                q as usize % min_align,
                0,
                "realloc to {n} lost align {align}"
            );
            check(q, old.size(), 7);
            fill(q, n, 7);
            p = q;
            old = Layout::from_size_align(n, align).unwrap();
        }
        a.dealloc(p, old);
    }
    // Allocator::grow / grow_zeroed / shrink.
    let mut block = a.allocate(l0).unwrap();
    let mut old = l0;
    // SAFETY: the block is live and `old` is its layout throughout.
    unsafe {
        fill(block.cast::<u8>().as_ptr(), sizes[0], 3);
        for (i, &n) in sizes[1..].iter().enumerate() {
            let new = Layout::from_size_align(n, align).unwrap();
            let p: NonNull<u8> = block.cast();
            block = if i % 2 == 0 {
                a.grow(p, old, new).unwrap()
            } else {
                a.grow_zeroed(p, old, new).unwrap()
            };
            let q = block.cast::<u8>().as_ptr();
            assert_eq!(q as usize % min_align, 0, "grow to {n} lost align {align}");
            check(q, old.size(), 3);
            if i % 2 == 1 {
                let tail = std::slice::from_raw_parts(q.add(old.size()), n - old.size());
                assert!(tail.iter().all(|&b| b == 0), "grow_zeroed tail not zero");
            }
            fill(q, n, 3);
            old = new;
        }
        let small = Layout::from_size_align(2 * MIB, align).unwrap();
        fill(block.cast::<u8>().as_ptr(), small.size(), 5);
        block = a.shrink(block.cast(), old, small).unwrap();
        check(block.cast::<u8>().as_ptr(), small.size(), 5);
        a.deallocate(block.cast(), small);
    }
}

#[test]
fn growth_keeps_contents_and_alignment_with_the_policy_on() {
    let _g = serial();
    huge_pages::enable(HUGE_PAGE_SIZE);
    // Blocks cached by earlier tests were advised already: start empty so
    // that the chain allocates (and advises) fresh blocks too.
    mkl_alloc::manager::free_buffers();
    let before = huge_pages::advised_bytes();
    for align in [8, 64, 4096, HUGE_PAGE_SIZE, 1 << 30] {
        grow_chain(&MklAllocator, align);
        grow_chain(&MklSplitAllocator, align);
    }
    if huge_pages::status() != Status::Unavailable {
        assert!(huge_pages::advised_bytes() > before);
    }
    huge_pages::disable();
}

#[test]
fn growth_keeps_contents_and_alignment_with_the_policy_off() {
    let _g = serial();
    huge_pages::disable();
    let before = huge_pages::advised_bytes();
    for align in [8, 64, HUGE_PAGE_SIZE, 1 << 30] {
        grow_chain(&MklAllocator, align);
    }
    assert_eq!(huge_pages::advised_bytes(), before);
}

#[test]
#[cfg_attr(
    mkl_alloc_wine,
    ignore = "wine reserves 2^45+ bytes that Windows refuses; touching them gets the process killed"
)]
fn impossible_growth_leaves_the_block_intact_with_the_policy_on() {
    let _g = serial();
    huge_pages::enable(HUGE_PAGE_SIZE);
    let size = 4 * MIB;
    let huge = 1usize << 46; // 64 TiB: more than this machine can ever back
    for align in [64, 1 << 30] {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: a non-zero layout; the block stays live through the failed
        // growths (their contract) and is freed once at the end.
        unsafe {
            let p = MklAllocator.alloc(layout);
            assert!(!p.is_null());
            fill(p, size, 11);
            let advised = huge_pages::advised_bytes();
            assert!(MklAllocator.realloc(p, layout, huge).is_null());
            let nn = NonNull::new(p).unwrap();
            let big = Layout::from_size_align(huge, align).unwrap();
            assert!(MklAllocator.grow(nn, layout, big).is_err());
            assert!(MklAllocator.grow_zeroed(nn, layout, big).is_err());
            assert!(MklSplitAllocator.grow(nn, layout, big).is_err());
            assert_eq!(
                huge_pages::advised_bytes(),
                advised,
                "a failed growth was advised"
            );
            check(p, size, 11);
            assert_eq!(p as usize % align, 0);
            // Still a live block: it grows for real afterwards.
            let q = MklAllocator.realloc(p, layout, 2 * size);
            assert!(!q.is_null());
            check(q, size, 11);
            MklAllocator.dealloc(q, Layout::from_size_align(2 * size, align).unwrap());
        }
    }
    let v = SharedMklVec::from_slice(&vec![2.5f64; MIB]);
    let err = v.try_reserve(1 << 43).unwrap_err();
    assert!(matches!(err, SharedVecError::AllocFailed { .. }), "{err:?}");
    assert_eq!(v.len(), MIB);
    assert!(v.view().unwrap().iter().all(|&x| x == 2.5));
    huge_pages::disable();
}

#[test]
fn shared_vec_growth_is_advised_and_keeps_contents() {
    let _g = serial();
    huge_pages::enable(HUGE_PAGE_SIZE);
    let before = huge_pages::advised_bytes();
    let v = SharedMklVec::<f64>::with_alignment(0, 4096).unwrap();
    let n = 3 << 20; // 24 MiB of f64
    for i in 0..n {
        v.try_push(i as f64).unwrap();
    }
    let view = v.view().unwrap();
    assert_eq!(view.as_ptr() as usize % 4096, 0);
    assert!(view.iter().enumerate().all(|(i, &x)| x == i as f64));
    if huge_pages::status() != Status::Unavailable {
        assert!(huge_pages::advised_bytes() - before >= 16 * MIB as u64);
    }
    drop(view);
    huge_pages::disable();
}

/// Skips (with a message) where the kernel cannot give huge pages.
fn thp_available(test: &str) -> bool {
    let s = huge_pages::status();
    if !s.is_available() {
        eprintln!("{test}: skipped, transparent huge pages are {s:?} here");
    }
    s.is_available()
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "THP and /proc/self/smaps are Linux's: on Windows no block is advised"
)]
fn smaps_shows_huge_pages_for_advised_blocks() {
    if !thp_available("smaps_shows_huge_pages_for_advised_blocks") {
        return;
    }
    let _g = serial();
    huge_pages::enable(HUGE_PAGE_SIZE);
    // A block cached by an earlier test keeps the 4 KiB pages it was
    // faulted in with (advice changes how new pages are backed): start
    // from fresh blocks.
    mkl_alloc::manager::free_buffers();
    let size = 64 * MIB;
    let layout = Layout::from_size_align(size, 64).unwrap();
    // SAFETY: non-zero layouts; blocks freed below.
    unsafe {
        for zeroed in [false, true] {
            let p = if zeroed {
                MklAllocator.alloc_zeroed(layout)
            } else {
                MklAllocator.alloc(layout)
            };
            assert!(!p.is_null());
            touch(p, size);
            let (s, e) = interior(p, size);
            let kib = anon_huge_kib(s, e);
            assert!(
                kib > 0,
                "no AnonHugePages in an advised block (zeroed: {zeroed})"
            );
            MklAllocator.dealloc(p, layout);
        }
    }
    huge_pages::disable();
}

/// The growth order: with MKL_realloc the copy would land on fresh,
/// unadvised memory, faulted in 4 KiB pages.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "THP and /proc/self/smaps are Linux's: on Windows no block is advised"
)]
fn smaps_shows_huge_pages_after_growth() {
    if !thp_available("smaps_shows_huge_pages_after_growth") {
        return;
    }
    let _g = serial();
    huge_pages::enable(HUGE_PAGE_SIZE);
    let mut v: allocator_api2::vec::Vec<f64, MklAllocator> =
        allocator_api2::vec::Vec::new_in(MklAllocator);
    for i in 0..(8 << 20) {
        v.push(i as f64); // 64 MiB at the end, every byte written by a copy or a push
    }
    let bytes = v.capacity() * 8;
    let (s, e) = interior(v.as_ptr().cast(), bytes);
    let kib = anon_huge_kib(s, e);
    assert!(kib > 0, "a grown block is not on huge pages");
    huge_pages::disable();

    // Off, under `madvise`: the same growth gets no huge pages at all, on
    // fresh chunks (the cache emptied first: a cached chunk that `v`'s
    // growth left, advised, keeps its advice when reused).
    if huge_pages::status() == Status::Madvise {
        mkl_alloc::manager::free_buffers();
        let mut w: allocator_api2::vec::Vec<f64, MklAllocator> =
            allocator_api2::vec::Vec::new_in(MklAllocator);
        for i in 0..(8 << 20) {
            w.push(i as f64);
        }
        let (s, e) = interior(w.as_ptr().cast(), w.capacity() * 8);
        assert_eq!(anon_huge_kib(s, e), 0, "huge pages with the policy off");
    }
}

/// Windows: the status and its reason agree with the privilege check
/// (wine's processes do not hold `SeLockMemoryPrivilege`, so under wine
/// the reason is that one), and with the policy on an 8 MiB block, on
/// large pages where the process may have them and on ordinary pages
/// otherwise, keeps its bytes across growth and shrinking, is cached when
/// freed, and is served from the cache again.
#[cfg(windows)]
#[test]
fn windows_large_pages_or_the_reason_and_blocks_that_work_either_way() {
    use mkl_alloc::backing::{self, Backing};
    use mkl_alloc::{block_cache, huge_pages::Reason};

    let _g = serial();
    let s = huge_pages::status();
    let why = huge_pages::unavailable_reason();
    match why {
        None => assert_eq!(s, Status::LargePages),
        Some(r) => {
            assert_eq!(s, Status::Unavailable);
            let text = r.to_string();
            assert!(text.contains("SeLockMemoryPrivilege"), "{text}");
            if r == Reason::NoLockMemoryPrivilege {
                assert!(
                    text.contains("the process does not hold SeLockMemoryPrivilege"),
                    "{text}"
                );
            }
        }
    }
    if cfg!(mkl_alloc_wine) {
        assert_eq!(why, Some(Reason::NoLockMemoryPrivilege), "under wine");
    }
    eprintln!(
        "huge pages here: {s:?} ({})",
        why.map_or("available".into(), |r| r.to_string())
    );

    huge_pages::enable(huge_pages::DEFAULT_THRESHOLD);
    block_cache::enable(256 * MIB);
    mkl_alloc::manager::free_buffers();
    let before = huge_pages::advised_bytes();
    let size = 8 * MIB;
    let layout = Layout::from_size_align(size, 64).unwrap();
    // SAFETY: a non-zero layout; each pointer is the live block of the
    // layout it is resized or freed with, used until then only.
    unsafe {
        let p = MklAllocator.alloc(layout);
        assert!(!p.is_null());
        fill(p, size, 3);
        let grown = Layout::from_size_align(3 * size, 64).unwrap();
        let q = MklAllocator.realloc(p, layout, grown.size());
        assert!(!q.is_null());
        check(q, size, 3);
        fill(q, grown.size(), 6);
        fill(q, size, 4); // the bytes `check(_, size, 4)` reads
        let r = MklAllocator.realloc(q, grown, size);
        assert!(!r.is_null());
        check(r, size, 4);
        let z = MklAllocator.alloc_zeroed(layout);
        assert!(!z.is_null());
        assert!(probes(size).all(|i| z.add(i).read() == 0));
        MklAllocator.dealloc(z, layout);
        MklAllocator.dealloc(r, layout);
        if backing::state() == Backing::Active {
            assert!(block_cache::cached_bytes() >= size, "not cached");
        }
        // Served from the cache now: the same chunk, whatever its pages.
        let again = MklAllocator.alloc(layout);
        assert!(!again.is_null());
        fill(again, size, 5);
        check(again, size, 5);
        let z = MklAllocator.alloc_zeroed(layout);
        assert!(!z.is_null());
        assert!(
            probes(size).all(|i| z.add(i).read() == 0),
            "a cached chunk zeroed"
        );
        MklAllocator.dealloc(z, layout);
        MklAllocator.dealloc(again, layout);
    }
    let counted = huge_pages::advised_bytes() - before;
    if s != Status::LargePages {
        assert_eq!(counted, 0, "counted without large pages");
    }
    mkl_alloc::manager::free_buffers();
    huge_pages::disable();
    block_cache::enable(block_cache::default_budget());
}
