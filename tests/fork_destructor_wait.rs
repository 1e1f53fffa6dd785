//! A fork never waits on a thread that waits on the fork (issue 41).
//!
//! The fork guard marks an exiting thread `held` from its TLS destructor
//! (registered at the thread's first MKL call) until its key destructors
//! are over, so that MKL's clean-up runs before any fork copies its locks.
//! Thread-local destructors registered *before* that first call run after
//! the mark (glibc runs them last-registered first). Here one such
//! destructor, a logger's guard, flushes through a worker thread and waits
//! for its answer, and the worker allocates through the crate. A fork that
//! waited for the `held` thread while its gate held the worker back would
//! never return: the forking thread waits for the exiting one, the exiting
//! one for the worker, the worker at the gate. At 0a32fcb three of three
//! runs stuck within four forks.
//!
//! A watchdog ends the test process with a message if the forks stop
//! making progress for 20 s (a hung parent cannot report it otherwise).
#![cfg(all(target_os = "linux", not(miri)))]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, manager};

/// Forks to run: 3,000 in release builds (CI's fork stress step), 200 at
/// valgrind's scale and in debug builds (a newcomer's `cargo test`, where
/// 3,000 took 50 s; before the fix the deadlock showed within 4 forks).
fn forks() -> usize {
    let small = cfg!(debug_assertions)
        || std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small");
    std::env::var("MKL_ALLOC_FORKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if small { 200 } else { 3000 })
}

/// The flushes the worker served (each through an MKL allocation).
static FLUSHED: AtomicUsize = AtomicUsize::new(0);

/// A request to the worker: it allocates, then answers on the channel.
type Flush = mpsc::SyncSender<()>;

/// A logger's per-thread guard: at the thread's exit, it hands its flush to
/// the worker and waits until the worker has done it.
struct LogGuard {
    worker: mpsc::Sender<Flush>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        let (done, wait) = mpsc::sync_channel(1);
        if self.worker.send(done).is_ok() {
            let _ = wait.recv();
        }
    }
}

thread_local! {
    static GUARD: std::cell::RefCell<Option<LogGuard>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn a_fork_does_not_wait_for_a_destructor_that_waits_on_an_allocating_thread() {
    manager::init();
    // The worker: each flush allocates through the crate (an MKL call,
    // which a pending fork's gate holds back) and answers.
    let (to_worker, requests) = mpsc::channel::<Flush>();
    let worker = std::thread::spawn(move || {
        for done in requests {
            let v: AVec<u8, MklAllocator> = AVec::with_capacity_in(4096, MklAllocator);
            drop(v);
            FLUSHED.fetch_add(1, Relaxed);
            let _ = done.send(());
        }
    });

    let stop = Arc::new(AtomicBool::new(false));
    let exits = Arc::new(AtomicUsize::new(0));
    let churners: Vec<_> = (0..2)
        .map(|_| {
            let (stop, exits, to_worker) = (stop.clone(), exits.clone(), to_worker.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    let to_worker = to_worker.clone();
                    std::thread::spawn(move || {
                        // The guard's destructor is registered first, so it
                        // runs after the crate's, which the allocation below
                        // registers (at the thread's first MKL call).
                        GUARD.with(|g| *g.borrow_mut() = Some(LogGuard { worker: to_worker }));
                        let v: AVec<u8, MklAllocator> = AVec::with_capacity_in(256, MklAllocator);
                        drop(v);
                    })
                    .join()
                    .unwrap();
                    exits.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();

    let done = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (done, finished) = (done.clone(), finished.clone());
        std::thread::spawn(move || {
            let mut last = (0, Instant::now());
            while !finished.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let d = done.load(Relaxed);
                if d != last.0 {
                    last = (d, Instant::now());
                } else if last.1.elapsed() > Duration::from_secs(20) {
                    eprintln!(
                        "the parent hung in fork {d}: 20 s without progress \
                         (a fork waiting on a thread whose destructor waits on an allocating thread)"
                    );
                    // SAFETY: ends the hung test process with a failure.
                    unsafe { libc::_exit(3) };
                }
            }
        })
    };

    let n = forks();
    let started = Instant::now();
    for _ in 0..n {
        // SAFETY: the child only _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: ends the child without running the parent's exit code.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        done.fetch_add(1, Relaxed);
    }
    stop.store(true, Relaxed);
    for c in churners {
        c.join().unwrap();
    }
    finished.store(true, Relaxed);
    watchdog.join().unwrap();
    drop(to_worker);
    worker.join().unwrap();
    eprintln!(
        "{n} forks, {} thread exits, {} flushes through the crate, {:.1} s",
        exits.load(Relaxed),
        FLUSHED.load(Relaxed),
        started.elapsed().as_secs_f64()
    );
    assert!(
        exits.load(Relaxed) > 0 && FLUSHED.load(Relaxed) > 0,
        "no thread exited during the forks: the test did not test"
    );
}
