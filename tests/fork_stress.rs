//! Fork from one thread while others allocate and call every entry of
//! the crate: every child must allocate, free, read the statistics and
//! free MKL's buffers, and exit (issue 21's guarantee, and issue 27's:
//! inside MKL too).
//!
//! Two threads cycle large (2-5 MiB: block cache, huge pages, lazy zeroing)
//! and small blocks through `MklAllocator`, `MklSplitAllocator`,
//! `SharedMklVec` and `c_heap`; a third calls the rare entries
//! (`manager::stats()`, `live_bytes()`, peak usage, `free_buffers()`,
//! `thread_free_buffers()`) between small blocks; a fourth starts threads
//! that allocate once and exit (a thread's first MKL call creates MKL's
//! account for it, and its exit runs MKL's clean-up, which takes every
//! account's lock). The main thread forks (1,000 times in release builds,
//! see `forks`). Each child goes through every path, reads `stats()`,
//! calls `free_buffers()`, then `_exit(0)`s; the parent waits for it with
//! a deadline, so a child stuck on a lock that a vanished thread held
//! fails the test (it is killed, and the message says which fork).
//!
//! Each configuration runs in a child process of its own (the environment
//! is read once per process): the defaults, the block cache off, and MKL's
//! fast memory manager off (`MKL_DISABLE_FAST_MM=1`, another path inside
//! MKL). `MKL_ALLOC_FORK_COUNT_ALL=1` counts every hung child instead of
//! stopping at the third, and `MKL_ALLOC_FORK_DEADLINE_MS` shortens the
//! deadline: how the hangs of the code before issue 27 were counted.
//!
//! Measured before issue 27's fix (main 3978939, release, 3 x 1,000 forks,
//! a 2 s deadline): see docs/reliability.md, "Fork".
//!
//! Unix only: Windows has no `fork`.
#![cfg(unix)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec, c_heap, manager};

const MIB: usize = 1 << 20;

/// Forks per configuration: 1,000 in release builds (CI's stress step),
/// 100 under valgrind's small scale, 25 in debug builds (a newcomer's
/// `cargo test`, where 100 took 100 s of CI's time for the three
/// configurations); `MKL_ALLOC_FORKS` sets another count.
fn forks() -> usize {
    if let Some(n) = std::env::var("MKL_ALLOC_FORKS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if cfg!(debug_assertions) {
        25
    } else if std::env::var("MKL_ALLOC_TEST_SCALE").as_deref() == Ok("small") {
        100
    } else {
        1000
    }
}

/// One round through every allocation path, large and small; `k` varies
/// the sizes. Panics (in the parent's threads) or `_exit(1)`s (in a child,
/// through `check`) on wrong contents.
fn every_path(k: usize, check: fn(bool)) {
    let large = (2 + k % 4) * MIB + k % 4096;
    // MklAllocator: a large and a small collection, one zeroed.
    let mut v: AVec<u8, MklAllocator> = AVec::with_capacity_in(large, MklAllocator);
    v.resize(large, 7);
    check(v[large - 1] == 7);
    let z = allocator_api2::vec![in MklAllocator; 0u64; large / 8];
    check(z[0] == 0 && z[large / 8 - 1] == 0);
    let mut s: AVec<u32, MklAllocator> = AVec::new_in(MklAllocator);
    s.extend(0..(k % 200) as u32 + 1);
    check(s[0] == 0);
    // MklSplitAllocator: both sides.
    let mut w: AVec<f64, MklSplitAllocator> = AVec::new_in(MklSplitAllocator);
    w.resize(large / 8, 1.5);
    w.truncate(16);
    w.shrink_to_fit();
    check(w[15] == 1.5);
    // SharedMklVec: growth past the cache's threshold.
    let sv = SharedMklVec::<u64>::with_capacity(16);
    sv.try_resize(large / 8, 3).unwrap_or_else(|_| check(false));
    check(sv.view().map(|v| v[large / 8 - 1] == 3).unwrap_or(false));
    // c_heap: malloc, calloc (lazily zeroed), realloc, free.
    let p = c_heap::calloc(large, 1, 64);
    check(!p.is_null());
    // SAFETY: p is a live c_heap block of `large` zeroed bytes; realloc
    // returns a live block (or null, p intact) that is freed once.
    unsafe {
        check(*p.add(large - 1) == 0);
        let q = c_heap::realloc(p, large + MIB);
        check(!q.is_null());
        c_heap::free(q);
        let small = c_heap::malloc(100, 64);
        check(!small.is_null());
        c_heap::free(small);
    }
}

fn in_parent(ok: bool) {
    assert!(ok, "wrong contents in the parent");
}

fn in_child(ok: bool) {
    if !ok {
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(1) };
    }
}

/// How long a child may take before it counts as hung (20 s, or
/// `MKL_ALLOC_FORK_DEADLINE_MS`).
fn deadline() -> Duration {
    std::env::var("MKL_ALLOC_FORK_DEADLINE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(20), Duration::from_millis)
}

/// What every child does: every path, then the rare entries.
fn child_work(fork: usize) {
    every_path(fork, in_child);
    let s = manager::stats();
    // The child recounted the cache: within its budget (none when off).
    let budget = mkl_alloc::block_cache::budget().unwrap_or(0) as u64;
    in_child(s.cached_bytes <= budget && s.live_bytes() == s.bytes);
    let _ = manager::peak_bytes();
    manager::free_buffers();
    manager::thread_free_buffers();
    in_child(c_heap::malloc(24, 64).is_null() || manager::stats().buffers > 0);
}

/// The rare entries, between small blocks.
fn rare_calls(k: usize) {
    let s = manager::stats();
    assert_eq!(s.live_bytes(), s.bytes);
    let v: AVec<u8, MklAllocator> = AVec::with_capacity_in(16 + k % 512, MklAllocator);
    drop(v);
    match k % 8 {
        0 => manager::free_buffers(),
        1 => manager::thread_free_buffers(),
        2 => {
            let _ = manager::peak_bytes();
        }
        3 => {
            let _ = manager::reset_peak();
        }
        _ => {}
    }
}

/// One short-lived thread: its first MKL call, one block, its exit.
fn churn(k: usize) {
    std::thread::spawn(move || {
        let v: AVec<u8, MklAllocator> = AVec::with_capacity_in(32 + k % 64, MklAllocator);
        drop(v);
        if k % 4 == 0 {
            let big: AVec<u8, MklAllocator> = AVec::with_capacity_in(MIB + k % 4096, MklAllocator);
            drop(big);
        }
    })
    .join()
    .unwrap();
}

/// The stress itself (run in a child process by the tests below).
#[test]
#[ignore = "run by the tests below in a child process, once per configuration"]
fn fork_child_stress() {
    manager::enable_peak_tracking();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut k = t;
                while !stop.load(Ordering::Relaxed) {
                    match t {
                        0 | 1 => every_path(k, in_parent),
                        2 => rare_calls(k),
                        _ => churn(k),
                    }
                    k += 4;
                    // A breath between rounds: on a machine with fewer cores
                    // than busy threads, a fork otherwise mostly waits for
                    // a thread preempted inside MKL to be scheduled again.
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
        })
        .collect();
    let count_all = std::env::var_os("MKL_ALLOC_FORK_COUNT_ALL").is_some();
    let limit = deadline();
    let mut failures = Vec::new();
    let started = Instant::now();
    let n = forks();
    let mut fork_us = Vec::with_capacity(n);
    for fork in 0..n {
        let t0 = Instant::now();
        // SAFETY: the child runs only the allocation paths and _exit; it
        // never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid != 0 {
            fork_us.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        if pid == 0 {
            child_work(fork);
            // SAFETY: ends the child without running the parent's exit code.
            unsafe { libc::_exit(0) };
        }
        if let Err(e) =
            common::child::wait_child(pid, limit, |_| " (a lock held across fork?)".into())
                .map_err(|e| format!("child of fork {fork} {e}"))
        {
            eprintln!("{e}");
            failures.push(e);
            if failures.len() >= 3 && !count_all {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    fork_us.sort_by(f64::total_cmp);
    let at = |q: f64| fork_us[((fork_us.len() - 1) as f64 * q) as usize];
    eprintln!(
        "fork stress: {} of {} children failed or hung, {:.1} s; fork() in the parent: median {:.0} us, p90 {:.0} us",
        failures.len(),
        fork_us.len(),
        started.elapsed().as_secs_f64(),
        at(0.5),
        at(0.9),
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

fn run(vars: &[(&str, &str)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "fork_child_stress", "--ignored", "--nocapture"]);
    cmd.env_remove("MKL_ALLOC_BLOCK_CACHE")
        .env_remove("MKL_ALLOC_HUGE_PAGES")
        .env_remove("MKL_DISABLE_FAST_MM");
    cmd.envs(vars.iter().copied());
    let out = cmd.output().unwrap();
    eprint!("{vars:?}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{vars:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[cfg_attr(miri, ignore = "fork and child processes")]
fn forked_children_allocate_with_the_defaults() {
    run(&[]);
}

#[test]
#[cfg_attr(miri, ignore = "fork and child processes")]
fn forked_children_allocate_with_the_cache_off() {
    run(&[("MKL_ALLOC_BLOCK_CACHE", "off")]);
}

#[test]
#[cfg_attr(miri, ignore = "fork and child processes")]
fn forked_children_allocate_with_mkl_fast_mm_off() {
    run(&[("MKL_DISABLE_FAST_MM", "1")]);
}
