//! Fork beside threads that reach MKL's memory manager without the crate
//! (issue 41): MKL's FFT allocating its workspace inside `DftiCommitDescriptor`
//! and friends, and code calling `MKL_malloc` / `MKL_free` directly. Each
//! takes its thread's account lock in MKL for a few instructions; MKL has
//! no fork handler, so a child forked in that window inherited the lock
//! taken and spun for ever in its first `MKL_Mem_Stat` (before the fix: the
//! child of the 3rd fork hung, in `mkl_serv_mem_stat`). Now the prepare
//! handler holds MKL's locks (`src/fork_guard/mkl_locks.rs`).
//!
//! Two threads run FFTs, one `MKL_malloc`/`MKL_free` in a loop; the main
//! thread forks 1,000 times (50 at valgrind's scale, or
//! `MKL_ALLOC_FORKS`); each child reads MKL's statistics, allocates,
//! frees MKL's buffers and exits. A hung child's stack (gdb) is in the
//! failure message.
#![cfg(all(target_os = "linux", not(miri)))]

mod common;

use core::ffi::{c_int, c_long, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use mkl_alloc::{MklAllocator, ffi, manager};

unsafe extern "C" {
    fn DftiCreateDescriptor_d_1d(handle: *mut *mut c_void, domain: c_int, length: c_long)
    -> c_long;
    fn DftiCommitDescriptor(handle: *mut c_void) -> c_long;
    fn DftiComputeForward(handle: *mut c_void, x: *mut c_void, ...) -> c_long;
    fn DftiFreeDescriptor(handle: *mut *mut c_void) -> c_long;
}

const DFTI_COMPLEX: c_int = 32;

/// One complex double FFT of `n` points: a descriptor created, committed
/// (MKL allocates its workspace), used and freed.
fn fft_once(n: usize, data: &mut [f64]) {
    let mut h = core::ptr::null_mut();
    // SAFETY: a descriptor for n complex doubles; `data` holds 2n doubles.
    unsafe {
        assert_eq!(
            DftiCreateDescriptor_d_1d(&mut h, DFTI_COMPLEX, n as c_long),
            0
        );
        assert_eq!(DftiCommitDescriptor(h), 0);
        assert_eq!(DftiComputeForward(h, data.as_mut_ptr().cast()), 0);
        assert_eq!(DftiFreeDescriptor(&mut h), 0);
    }
}

/// Forks to run (see the module docs).
fn forks() -> usize {
    let small = std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small");
    std::env::var("MKL_ALLOC_FORKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if small { 50 } else { 1000 })
}

/// How long a child may take: 5 s, or `MKL_ALLOC_FORK_DEADLINE_MS`
/// (valgrind's runs, where a child starts slowly).
fn deadline() -> Duration {
    let ms = std::env::var("MKL_ALLOC_FORK_DEADLINE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    Duration::from_millis(ms)
}

#[test]
fn fork_beside_fft_and_direct_mkl_malloc() {
    manager::init();
    // The pinned MKL's locks are recognised wherever its core is linked
    // (elsewhere this test shows whether forks are safe without them).
    if cfg!(not(any(feature = "mkl-rt", feature = "intel-mkl-src"))) {
        assert!(manager::settings().fork_holds_mkl_locks);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for t in 0..2 {
        let (stop, ops) = (stop.clone(), ops.clone());
        threads.push(std::thread::spawn(move || {
            let sizes = [64usize, 1000, 4096, 6000 + t];
            let mut data = vec![0.5f64; 2 * 8192];
            let mut k = 0;
            while !stop.load(Relaxed) {
                fft_once(sizes[k % sizes.len()], &mut data);
                ops.fetch_add(1, Relaxed);
                k += 1;
            }
        }));
    }
    {
        let (stop, ops) = (stop.clone(), ops.clone());
        threads.push(std::thread::spawn(move || {
            let mut k = 0usize;
            while !stop.load(Relaxed) {
                // SAFETY: a valid size and alignment; freed once.
                unsafe {
                    let p = ffi::MKL_malloc(16 + (k % 64) * 1000, 64);
                    assert!(!p.is_null());
                    ffi::MKL_free(p);
                }
                ops.fetch_add(1, Relaxed);
                k += 1;
            }
        }));
    }
    let n = forks();
    let started = Instant::now();
    let mut failure = None;
    for fork in 0..n {
        // SAFETY: the child reads MKL's statistics, allocates, and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let s = manager::stats();
            let l = core::alloc::Layout::from_size_align(100_000, 64).unwrap();
            // SAFETY: a non-zero layout, freed once.
            unsafe {
                use core::alloc::GlobalAlloc;
                MklAllocator.dealloc(MklAllocator.alloc(l), l);
            }
            manager::free_buffers();
            // SAFETY: ends the child without running the parent's exit code.
            unsafe { libc::_exit(if s.live_bytes() == s.bytes { 0 } else { 1 }) };
        }
        if let Err(e) = common::child::wait_child(pid, deadline(), |pid| {
            format!("; its stack:\n{}", common::child::stacks_of(pid))
        }) {
            failure = Some(format!("child of fork {fork} {e}"));
            break;
        }
    }
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    eprintln!(
        "{n} forks, {} ops, {:.1} s",
        ops.load(Relaxed),
        started.elapsed().as_secs_f64()
    );
    if let Some(e) = failure {
        panic!("{e}");
    }
}
