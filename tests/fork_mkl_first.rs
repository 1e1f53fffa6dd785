//! Fork while threads exit, with MKL called before the crate's setup
//! (issue 34). MKL creates the `pthread_key` of its per-thread clean-up
//! (`mm_cleanup_thread_cbk`, which takes MKL's global lock and every
//! account's lock) at its first call. When that call comes before the
//! crate's setup (a library that calls MKL first: Python's `mkl_fft`
//! imported before `mkl_alloc`), MKL's key precedes the crate's, so at a
//! thread's exit MKL's clean-up runs before the crate's destructor has
//! marked the thread: a fork then may copy MKL's locks taken, and the
//! child spins for ever in its first `MKL_Mem_Stat`.
//!
//! A constructor of this test binary, with a priority (`.init_array.00099`)
//! that runs it before the crate's (the fork guard's key is made at
//! priority 100, the setup unprioritised), makes MKL's first call: MKL's
//! key then precedes the crate's, as it does where a shared library's
//! constructor, or a Python module imported first, called MKL. Two threads then keep starting threads that allocate one block
//! through the crate and exit; the main thread forks, and each child reads
//! `manager::stats()` and exits. A child that does not exit within the
//! deadline is hung: its stack (gdb, if installed) is in the message.
//!
//! Linux only (the fork guard is Linux's).
#![cfg(all(target_os = "linux", not(miri)))]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, ffi, manager};

#[used]
#[unsafe(link_section = ".init_array.00099")]
static MKL_BEFORE_THE_SETUP: extern "C" fn() = {
    extern "C" fn first() {
        // SAFETY: MKL_malloc with a valid size and alignment; the block is
        // freed once.
        unsafe {
            let p = ffi::MKL_malloc(64, 64);
            assert!(!p.is_null());
            ffi::MKL_free(p);
        }
    }
    first
};

/// Forks to run: 3,000, or 200 at valgrind's scale
/// (`MKL_ALLOC_TEST_SCALE=small`: there each fork copies valgrind's own
/// state, ~0.1 s, and its run is about memory errors, not the race);
/// `MKL_ALLOC_FORKS` sets another count. The test stops at the first hung
/// child.
fn forks() -> usize {
    let small = std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small");
    std::env::var("MKL_ALLOC_FORKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if small { 200 } else { 3000 })
}

#[test]
fn fork_while_threads_exit_after_mkl_ran_first() {
    manager::init();
    let stop = Arc::new(AtomicBool::new(false));
    let exits = Arc::new(AtomicUsize::new(0));
    let churners: Vec<_> = (0..2)
        .map(|t| {
            let (stop, exits) = (stop.clone(), exits.clone());
            std::thread::spawn(move || {
                let mut k = t;
                while !stop.load(Relaxed) {
                    // A short thread: its first MKL call (through the crate)
                    // creates its account in MKL, its exit runs MKL's clean-up.
                    std::thread::spawn(move || {
                        let v: AVec<u8, MklAllocator> =
                            AVec::with_capacity_in(64 + k % 64, MklAllocator);
                        drop(v);
                    })
                    .join()
                    .unwrap();
                    exits.fetch_add(1, Relaxed);
                    k += 2;
                }
            })
        })
        .collect();
    let limit = Duration::from_secs(5);
    let n = forks();
    let started = Instant::now();
    let mut failure = None;
    let mut done = 0;
    for fork in 0..n {
        // SAFETY: the child reads MKL's statistics and _exits; it never
        // returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let s = manager::stats();
            // SAFETY: ends the child without running the parent's exit code.
            unsafe { libc::_exit(if s.live_bytes() == s.bytes { 0 } else { 1 }) };
        }
        done += 1;
        if let Err(e) = common::child::wait_child(pid, limit, |pid| {
            format!("; its stack:\n{}", common::child::stacks_of(pid))
        })
        .map_err(|e| format!("child of fork {fork} {e}"))
        {
            failure = Some(e);
            break;
        }
    }
    stop.store(true, Relaxed);
    for c in churners {
        c.join().unwrap();
    }
    eprintln!(
        "{done} forks, {} thread exits, {:.1} s",
        exits.load(Relaxed),
        started.elapsed().as_secs_f64()
    );
    if let Some(e) = failure {
        panic!("{e}");
    }
}
