//! The background decay thread (`mkl_alloc::background`): an idle
//! process's cache empties with it and stays without it, start/stop/start,
//! `MKL_ALLOC_BACKGROUND`, a fork from a parent running it (the child
//! allocates, frees, decays and starts its own), and an exit with it
//! running.
//!
//! Each case runs in a child process of its own (an ignored test run
//! alone), so that the thread, the cache and the environment are that
//! child's: the parent's other tests allocate meanwhile, which would decay
//! the cache without any thread.
#![cfg(target_os = "linux")]

mod common;

use core::alloc::{GlobalAlloc, Layout};
use std::time::{Duration, Instant};

use mkl_alloc::{MklAllocator, MklSplitAllocator, background, backing, block_cache, manager};

const MIB: usize = 1 << 20;

/// Runs the ignored test `name` alone in a fresh process with `env`;
/// panics with its output unless it passed.
fn run_alone(name: &str, env: &[(&str, &str)]) -> String {
    common::run_ignored_alone(name, "MKL_ALLOC_BACKGROUND", env)
}

/// Caches one 8 MiB chunk (freed by MKL into the block cache) and sets a
/// decay of 100 ms; returns the bytes cached.
fn cache_a_chunk() -> usize {
    block_cache::enable(64 * MIB);
    block_cache::set_decay_ms(3_600_000);
    let l = Layout::from_size_align(8 * MIB, 64).unwrap();
    // SAFETY: a non-zero size; the block is freed once, with its layout.
    unsafe {
        let p = MklAllocator.alloc(l);
        assert!(!p.is_null());
        p.write_bytes(1, l.size());
        MklAllocator.dealloc(p, l);
    }
    let cached = block_cache::cached_bytes();
    assert!(cached >= 8 * MIB, "nothing cached: {cached}");
    block_cache::set_decay_ms(100);
    cached
}

/// Frees a 64 KiB MKL block: a medium block beneath MKL, held dirty for
/// reuse until it decays (none where medium blocks are off).
fn dirty_a_medium_block() {
    let l = Layout::from_size_align(64 << 10, 64).unwrap();
    // SAFETY: a non-zero size; the block is freed once, with its layout.
    unsafe {
        let p = MklAllocator.alloc(l);
        assert!(!p.is_null());
        p.write_bytes(1, l.size());
        MklAllocator.dealloc(p, l);
    }
}

/// Bytes held for reuse: cached chunks and dirty medium blocks.
fn held() -> u64 {
    let s = manager::stats();
    s.cached_bytes + s.medium_dirty_bytes
}

/// Waits up to `limit` for the cache and the dirty medium blocks to go,
/// allocating nothing; the bytes still held at the end.
fn idle_until_empty(limit: Duration) -> u64 {
    let start = Instant::now();
    while held() != 0 && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
    held()
}

#[test]
fn an_idle_process_gives_its_cache_back_with_the_thread_only() {
    if backing::state() != backing::Backing::Active {
        return; // no chunks beneath MKL: nothing is cached
    }
    run_alone("idle_child", &[("BG_EXPECT", "on")]);
    run_alone("idle_child", &[("BG_EXPECT", "off")]);
    // Started by the variable, at the setup: no call of the program's.
    run_alone(
        "idle_child",
        &[("BG_EXPECT", "env"), ("MKL_ALLOC_BACKGROUND", "on")],
    );
}

/// With `BG_EXPECT=on` starts the thread, `env` expects the variable to
/// have started it, `off` runs none; then caches a chunk and idles: the
/// cache empties within a bound with the thread, and keeps the chunk
/// without it (the same idle, the same decay time: what the thread adds).
/// Ends with the thread running, if it runs: the process exits so.
#[test]
#[ignore = "run alone by an_idle_process_gives_its_cache_back_with_the_thread_only"]
fn idle_child() {
    let expect = std::env::var("BG_EXPECT").unwrap();
    match expect.as_str() {
        "on" => background::start().unwrap(),
        "env" => {
            assert!(
                background::is_running(),
                "MKL_ALLOC_BACKGROUND=on did not start it"
            );
            let s = manager::settings();
            assert!(s.background);
            assert_eq!(s.background_source, manager::Source::Environment);
        }
        _ => assert!(!background::is_running(), "running by default"),
    }
    block_cache::set_decay_ms(3_600_000);
    dirty_a_medium_block();
    let cached = cache_a_chunk();
    let dirty = manager::stats().medium_dirty_bytes;
    if expect == "off" {
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(
            block_cache::cached_bytes(),
            cached,
            "decayed with no thread and no allocation"
        );
        assert_eq!(manager::stats().medium_dirty_bytes, dirty);
        manager::free_buffers();
    } else {
        // Decay 100 ms, the thread's sweep every 25 ms: a bound of 2 s
        // leaves room for a loaded machine.
        let left = idle_until_empty(Duration::from_secs(2));
        assert_eq!(
            left, 0,
            "the thread did not decay the idle cache ({dirty} B medium)"
        );
        assert_eq!(manager::stats().cached_bytes, 0);
        assert!(background::is_running());
    }
}

#[test]
fn start_stop_start() {
    run_alone("start_stop_child", &[]);
    // A value that is not a switch: ignored, with a line on stderr.
    let out = run_alone("start_stop_child", &[("MKL_ALLOC_BACKGROUND", "yes")]);
    assert!(
        out.contains("MKL_ALLOC_BACKGROUND must be on or off"),
        "{out}"
    );
}

#[test]
#[ignore = "run alone by start_stop_start"]
fn start_stop_child() {
    assert!(!background::is_running());
    let s = manager::settings();
    assert!(!s.background);
    assert_eq!(s.background_source, manager::Source::Default);
    assert!(
        s.to_string()
            .contains("background decay thread: off [default]"),
        "{s}"
    );
    background::stop(); // not running: nothing to do
    for _ in 0..3 {
        background::start().unwrap();
        background::start().unwrap(); // idempotent
        assert!(background::is_running());
        background::stop();
        assert!(!background::is_running());
        background::stop();
    }
    background::start().unwrap();
    let s = manager::settings();
    assert_eq!(s.background_source, manager::Source::Program);
    assert!(
        s.to_string()
            .contains("background decay thread: on [set by the program]"),
        "{s}"
    );
    // The thread stopped is joined: it decays no more (a chunk cached
    // after the stop stays through the idle that the thread would have
    // ended).
    background::stop();
    let cached = cache_a_chunk();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(block_cache::cached_bytes(), cached, "decayed after stop()");
    manager::free_buffers();
}

#[test]
fn a_fork_from_a_parent_running_the_thread() {
    if backing::state() != backing::Backing::Active {
        return;
    }
    run_alone("fork_child", &[]);
}

/// Forks 20 times while the thread sweeps (a helper thread caches chunks
/// that decay every few ms): each child finds the thread not running,
/// allocates and frees, starts its own lazily at a small free of the
/// split allocator that reaches the decay check, decays, and its idle
/// cache empties; a watchdog kills a child that hangs.
#[test]
#[ignore = "run alone by a_fork_from_a_parent_running_the_thread"]
fn fork_child() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    block_cache::enable(256 * MIB);
    block_cache::set_decay_ms(0); // every sweep decays all
    background::start().unwrap();
    static DONE: AtomicBool = AtomicBool::new(false);
    let churn = std::thread::spawn(|| {
        let l = Layout::from_size_align(2 * MIB, 64).unwrap();
        while !DONE.load(Relaxed) {
            // SAFETY: a non-zero size; freed once, with its layout.
            unsafe { MklAllocator.dealloc(MklAllocator.alloc(l), l) };
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    for fork in 0..20 {
        std::thread::sleep(Duration::from_millis(7));
        // SAFETY: the child runs only `in_forked_child`, which ends in _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            in_forked_child();
        }
        common::child::wait_child(pid, Duration::from_secs(10), |_| String::new())
            .unwrap_or_else(|e| panic!("child of fork {fork} {e}"));
    }
    DONE.store(true, Relaxed);
    churn.join().unwrap();
    assert!(background::is_running());
    background::stop();
}

/// The forked child's checks; exits 0 if they pass, 1 (with a line) if not.
fn in_forked_child() -> ! {
    let check = |ok: bool, what: &str| {
        if !ok {
            eprintln!("forked child: {what}");
            // SAFETY: ends the child without running the parent's atexit.
            unsafe { libc::_exit(1) };
        }
    };
    check(
        !background::is_running(),
        "the parent's thread counted as running",
    );
    block_cache::set_decay_ms(3_600_000);
    let l = Layout::from_size_align(4 * MIB, 64).unwrap();
    // SAFETY: a non-zero size; freed once, with its layout.
    unsafe { MklAllocator.dealloc(MklAllocator.alloc(l), l) };
    check(block_cache::cached_bytes() >= 4 * MIB, "nothing cached");
    block_cache::set_decay_ms(50);
    std::thread::sleep(Duration::from_millis(60));
    // Small frees of the split allocator: the decay check they reach
    // starts the child's own thread, and decays (or the new thread does:
    // it may be inside that sweep when the loop ends).
    let split = MklSplitAllocator;
    let small = Layout::from_size_align(48, 8).unwrap();
    for _ in 0..2 * block_cache::TICKS {
        // SAFETY: a small layout, freed at once with the same layout.
        unsafe { split.dealloc(split.alloc(small), small) };
    }
    check(background::is_running(), "no thread of its own started");
    check(
        idle_until_empty(Duration::from_secs(3)) == 0,
        "nothing decayed after the small frees",
    );
    // Its own thread decays an idle cache.
    block_cache::set_decay_ms(3_600_000);
    // SAFETY: as above.
    unsafe { MklAllocator.dealloc(MklAllocator.alloc(l), l) };
    block_cache::set_decay_ms(50);
    check(
        idle_until_empty(Duration::from_secs(3)) == 0,
        "the child's thread did not decay",
    );
    background::stop();
    check(!background::is_running(), "stop() in the child");
    // SAFETY: ends the child without running the parent's atexit handlers.
    unsafe { libc::_exit(0) }
}
