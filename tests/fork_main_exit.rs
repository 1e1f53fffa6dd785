//! Fork while the main thread leaves by `pthread_exit`, MKL called before
//! the crate's setup (issue 41).
//!
//! A main thread that leaves by `pthread_exit` runs no TLS destructor, only
//! the `pthread_key` destructors, in key order: MKL's clean-up
//! (`mm_cleanup_thread_cbk`, which takes MKL's global lock and every
//! account's lock) runs there, and a child forked meanwhile by another
//! thread copied those locks taken unless the crate's key, which marks the
//! thread, came first. A constructor of this program (priority 101: the
//! first a program may use) calls MKL before the crate's setup; the crate
//! makes its key at priority 100, before it.
//!
//! Each run is a process (this program with `MKL_ALLOC_MAIN_EXIT_RUN` set):
//! its main thread calls MKL, starts a thread that forks in a loop (each
//! child reads MKL's statistics and exits), then leaves by `pthread_exit`;
//! the forking thread ends the process with its verdict. The parent runs
//! 150 such processes (20 at valgrind's scale), each within a deadline.
//!
//! No test harness (`harness = false`) and a C `main`, so that the main
//! thread is this program's: `pthread_exit` unwinds through `main` alone
//! (declared `C-unwind`, with nothing to drop).
#![cfg_attr(all(target_os = "linux", not(miri)), no_main)]

#[cfg(not(all(target_os = "linux", not(miri))))]
fn main() {}

#[cfg(all(target_os = "linux", not(miri)))]
mod common;

#[cfg(all(target_os = "linux", not(miri)))]
mod linux {
    use core::ffi::{c_char, c_int, c_void};
    use std::time::{Duration, Instant};

    use mkl_alloc::{ffi, manager};

    const RUN: &str = "MKL_ALLOC_MAIN_EXIT_RUN";

    unsafe extern "C-unwind" {
        fn pthread_exit(value: *mut c_void) -> !;
    }

    #[used]
    #[unsafe(link_section = ".init_array.00101")]
    static MKL_BEFORE_THE_SETUP: extern "C" fn() = {
        extern "C" fn first() {
            // SAFETY: MKL_malloc with a valid size and alignment; the block
            // is freed once.
            unsafe {
                let p = ffi::MKL_malloc(64, 64);
                assert!(!p.is_null());
                ffi::MKL_free(p);
            }
        }
        first
    };

    /// Forks per run.
    const FORKS: usize = 20;

    /// One run's forking thread: forks while the main thread exits, then
    /// ends the process with 0 if every child exited in time.
    fn forker() {
        let mut verdict = 0;
        for fork in 0..FORKS {
            // SAFETY: the child reads MKL's statistics and _exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let s = manager::stats();
                // SAFETY: ends the child without running exit handlers.
                unsafe { libc::_exit(if s.live_bytes() == s.bytes { 0 } else { 1 }) };
            }
            if pid < 0 {
                verdict = 4;
                break;
            }
            if let Err(e) =
                super::common::child::wait_child(pid, Duration::from_secs(5), |_| String::new())
            {
                eprintln!("fork {fork}: the child {e}");
                verdict = 5;
                break;
            }
        }
        std::process::exit(verdict);
    }

    /// One run (see the module docs).
    fn run() -> ! {
        manager::init();
        // The main thread's own MKL calls: its account in MKL, whose
        // clean-up runs at its exit.
        let v = allocator_api2::vec::Vec::<u8, _>::with_capacity_in(256, mkl_alloc::MklAllocator);
        drop(v);
        std::thread::spawn(forker);
        // SAFETY: leaves the main thread; nothing of `main` needs dropping
        // (the spawned thread's handle is detached), and the process lives
        // on in the forking thread.
        unsafe { pthread_exit(core::ptr::null_mut()) }
    }

    #[unsafe(no_mangle)]
    extern "C-unwind" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
        if std::env::var_os(RUN).is_some() {
            run();
        }
        let small = std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small");
        let runs = if small { 20 } else { 150 };
        let me = std::env::current_exe().expect("this program's path");
        let started = Instant::now();
        let mut failed = Vec::new();
        for i in 0..runs {
            let mut child = std::process::Command::new(&me)
                .env(RUN, "1")
                .spawn()
                .expect("start a run");
            let deadline = Instant::now() + Duration::from_secs(60);
            let status = loop {
                if let Some(s) = child.try_wait().expect("wait for a run") {
                    break Some(s);
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            match status {
                Some(s) if s.success() => {}
                Some(s) => failed.push(format!("run {i}: {s}")),
                None => failed.push(format!("run {i}: hung for 60 s")),
            }
        }
        println!(
            "fork_main_exit: {runs} runs of {FORKS} forks while the main thread leaves by pthread_exit, {} failed, {:.1} s",
            failed.len(),
            started.elapsed().as_secs_f64()
        );
        if failed.is_empty() {
            println!("1 passed, 0 failed");
            0
        } else {
            for f in &failed {
                eprintln!("{f}");
            }
            println!("0 passed, 1 failed");
            1
        }
    }
}
