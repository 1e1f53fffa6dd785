//! Fork from one thread while others allocate: every child must allocate
//! and free through every path and exit (issue 21's fork guarantee).
//!
//! Two threads cycle large (2-5 MiB: block cache, huge pages, lazy zeroing)
//! and small blocks through `MklAllocator`, `MklSplitAllocator`,
//! `SharedMklVec` and `c_heap`, while the main thread forks (1,000 times
//! in release builds, see `forks`). Each child does the same through every path, then
//! `_exit(0)`s; the parent waits for it with a deadline, so a child stuck on
//! a lock that a vanished thread held fails the test (it is killed, and the
//! message says which fork). Before the fork handlers, such a child hung in
//! `Cache::take` → `Mutex::lock_contended` about once in ten forks.
//!
//! Each configuration runs in a child process of its own (the environment
//! is read once per process): the defaults, and the cache asked for
//! explicitly (`MKL_ALLOC_BLOCK_CACHE=on`).
//!
//! Unix only: Windows has no `fork`.
#![cfg(unix)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec, c_heap};

const MIB: usize = 1 << 20;

/// Forks per configuration: 1,000 in release builds (CI's stress step),
/// 100 in debug builds (a newcomer's `cargo test`) and under valgrind's
/// small scale; `MKL_ALLOC_FORKS` sets another count.
fn forks() -> usize {
    if let Some(n) = std::env::var("MKL_ALLOC_FORKS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if cfg!(debug_assertions) || std::env::var("MKL_ALLOC_TEST_SCALE").as_deref() == Ok("small") {
        100
    } else {
        1000
    }
}

/// How long a child may take before it counts as hung.
const DEADLINE: Duration = Duration::from_secs(20);

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

/// Waits for `pid` up to the deadline; `Err` describes a hang or failure.
fn wait(pid: libc::pid_t, fork: usize) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                Ok(())
            } else {
                Err(format!(
                    "child of fork {fork} ended with status {status:#x}"
                ))
            };
        }
        if start.elapsed() > DEADLINE {
            // SAFETY: kills and reaps our own hung child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err(format!(
                "child of fork {fork} hung for {DEADLINE:?} (a lock held across fork?)"
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The stress itself (run in a child process by the tests below).
#[test]
#[ignore = "run by the tests below in a child process, once per configuration"]
fn fork_child_stress() {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut k = t;
                while !stop.load(Ordering::Relaxed) {
                    every_path(k, in_parent);
                    k += 2;
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for fork in 0..forks() {
        // SAFETY: the child runs only the allocation paths and _exit; it
        // never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            every_path(fork, in_child);
            // SAFETY: ends the child without running the parent's exit code.
            unsafe { libc::_exit(0) };
        }
        if let Err(e) = wait(pid, fork) {
            failures.push(e);
            if failures.len() >= 3 {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

fn run(var: Option<&str>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "fork_child_stress", "--ignored", "--nocapture"]);
    cmd.env_remove("MKL_ALLOC_BLOCK_CACHE")
        .env_remove("MKL_ALLOC_HUGE_PAGES");
    if let Some(v) = var {
        cmd.env("MKL_ALLOC_BLOCK_CACHE", v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "MKL_ALLOC_BLOCK_CACHE={var:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[cfg_attr(miri, ignore = "fork and child processes")]
fn forked_children_allocate_with_the_defaults() {
    run(None);
}

#[test]
#[cfg_attr(miri, ignore = "fork and child processes")]
fn forked_children_allocate_with_the_cache_asked_for() {
    run(Some("on"));
}
