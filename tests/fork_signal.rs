//! `fork()` from a signal handler that interrupted a thread of the crate
//! (issue 27): the prepare handler must not wait for what the interrupted
//! thread itself holds (a block cache shard, the rare-call lock, its own
//! "inside MKL" marker), and the child, once the handler returns, must
//! finish what that thread was doing and then allocate, free, read the
//! statistics and free MKL's buffers.
//!
//! A worker cycles 2 MiB blocks through the block cache (each allocation
//! and free locks a shard, inside MKL's call, beneath it; the chunks are
//! the crate's mappings, so the signal seldom lands inside the C library's
//! `malloc`, whose own fork locks glibc documents as unsafe from a
//! handler) and reads
//! `manager::stats()` (the rare-call lock, MKL's `MKL_Mem_Stat`, every
//! shard). The main thread signals it (`SIGUSR1`) again and again; the
//! handler forks. Before issue 27 the prepare handler deadlocked on the
//! shard the interrupted thread held, within a few dozen forks.
//!
//! The stress runs in a child process with a deadline (a deadlocked
//! handler hangs the process that forks, not its child).
//!
//! Linux only: Windows has no `fork`.
#![cfg(target_os = "linux")]

use core::alloc::{GlobalAlloc, Layout};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mkl_alloc::{MklAllocator, block_cache, manager};

const MIB: usize = 1 << 20;

/// Set by the handler in the child only: the worker then does the child's work.
static IN_CHILD: AtomicBool = AtomicBool::new(false);
/// The last child's pid, set by the handler in the parent.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// Rounds the worker went through (it has started when this is non-zero).
static ROUNDS: AtomicUsize = AtomicUsize::new(0);

fn forks() -> usize {
    if let Some(n) = std::env::var("MKL_ALLOC_FORKS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if cfg!(debug_assertions) { 50 } else { 300 }
}

extern "C" fn on_signal(_: libc::c_int) {
    // SAFETY: fork from a signal handler: what this test is about. The
    // child returns from the handler into the interrupted code.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        IN_CHILD.store(true, Ordering::SeqCst);
    } else {
        CHILD.store(pid, Ordering::SeqCst);
    }
}

fn fail_in_child(ok: bool) {
    if !ok {
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(1) };
    }
}

/// The child's work, once the interrupted code has gone on: every kind of
/// block, the statistics, MKL's buffers.
fn child_work() -> ! {
    let a = MklAllocator;
    for size in [16, 4096, 3 * MIB, 2 * MIB] {
        let layout = Layout::from_size_align(size, 64).unwrap();
        // SAFETY: a non-zero layout; the block is written, read and freed once.
        unsafe {
            let p = a.alloc_zeroed(layout);
            fail_in_child(!p.is_null());
            fail_in_child(*p.add(size - 1) == 0);
            *p = 1;
            let q = a.realloc(p, layout, 2 * size);
            fail_in_child(!q.is_null() && *q == 1);
            a.dealloc(q, Layout::from_size_align(2 * size, 64).unwrap());
        }
    }
    let s = manager::stats();
    fail_in_child(s.cached_bytes <= 256 * MIB as u64 && s.live_bytes() == s.bytes);
    manager::free_buffers();
    manager::thread_free_buffers();
    // SAFETY: ends the child without running the parent's exit code.
    unsafe { libc::_exit(0) }
}

fn worker() {
    let a = MklAllocator;
    let layout = Layout::from_size_align(2 * MIB, 64).unwrap();
    let mut k = 0usize;
    loop {
        if IN_CHILD.load(Ordering::SeqCst) {
            child_work();
        }
        // SAFETY: a non-zero layout; the block is written and freed once.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            *p = k as u8;
            a.dealloc(p, layout);
        }
        if k % 16 == 0 {
            let s = manager::stats();
            assert!(s.cached_bytes <= 256 * MIB as u64, "over the budget");
        }
        k += 1;
        ROUNDS.store(k, Ordering::Relaxed);
    }
}

#[test]
#[ignore = "run by the test below in a child process"]
fn fork_from_signal_handler_stress() {
    block_cache::enable(256 * MIB);
    // SAFETY: installs a handler that only forks and stores to atomics.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &sa, core::ptr::null_mut()),
            0
        );
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        worker();
    });
    let target = rx.recv().unwrap();
    while ROUNDS.load(Ordering::Relaxed) == 0 {
        std::thread::yield_now();
    }
    let n = forks();
    for fork in 0..n {
        CHILD.store(0, Ordering::SeqCst);
        // SAFETY: signals our own live worker thread.
        assert_eq!(unsafe { libc::pthread_kill(target, libc::SIGUSR1) }, 0);
        let start = Instant::now();
        let pid = loop {
            match CHILD.load(Ordering::SeqCst) {
                0 if start.elapsed() > Duration::from_secs(10) => {
                    panic!("fork {fork}: the handler's fork did not return in 10 s (deadlock)")
                }
                0 => std::thread::sleep(Duration::from_micros(100)),
                pid => break pid,
            }
        };
        assert!(pid > 0, "fork {fork}: fork failed");
        let mut status = 0;
        loop {
            // SAFETY: waits for our own child without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break;
            }
            if start.elapsed() > fork_deadline() {
                // SAFETY: kills and reaps our own hung child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                panic!("fork {fork}: the child hung");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "fork {fork}: the child ended with status {status:#x}"
        );
        // Let the worker run a little between signals.
        std::thread::sleep(Duration::from_micros(300));
    }
    eprintln!(
        "fork from a signal handler: {n} forks, the worker at round {}",
        ROUNDS.load(Ordering::Relaxed)
    );
}

#[test]
#[cfg_attr(miri, ignore = "fork and child processes")]
fn forks_from_a_signal_handler_complete() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fork_from_signal_handler_stress",
            "--ignored",
            "--nocapture",
        ])
        .env_remove("MKL_ALLOC_BLOCK_CACHE")
        .env_remove("MKL_ALLOC_HUGE_PAGES")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let limit = Duration::from_secs(300);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            eprint!("{text}");
            assert!(status.success(), "{text}");
            return;
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the stress did not finish in {limit:?} (a fork handler deadlocked?): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long a forked child may take before it counts as hung: 20 s, or
/// `MKL_ALLOC_FORK_DEADLINE_MS` (scripts/valgrind.sh gives 90 s: a child
/// under memcheck on a loaded 2-core machine has taken more than 20).
fn fork_deadline() -> Duration {
    std::env::var("MKL_ALLOC_FORK_DEADLINE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(20), Duration::from_millis)
}
