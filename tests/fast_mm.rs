//! `manager::disable_fast_mm` and `manager::fast_mm_disabled`, each case in
//! a fresh process: turning MKL's fast memory manager off cannot be undone,
//! and what `MKL_Disable_Fast_MM` answers depends on what the process did
//! before. Each test re-runs this binary with its own name and an
//! environment variable, and the child checks the case.
//!
//! Measured with oneMKL 2026.2 (these tests pin it): the first call before
//! any MKL allocation returns 1, also with `MKL_DISABLE_FAST_MM=1` set;
//! every later call returns 0 although the manager stays off; a first call
//! after MKL has allocated returns 0.

#![cfg(not(loom))]

use std::process::Command;

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, manager};

const CHILD: &str = "MKL_ALLOC_FAST_MM_CHILD";
const MKL_VAR: &str = "MKL_DISABLE_FAST_MM";

/// In the parent: re-runs test `name` alone in a child process (with
/// `MKL_DISABLE_FAST_MM` set to `var`, or removed) and checks that it ran
/// and passed; returns false. In the child: returns true, and the caller
/// runs the case.
fn in_fresh_process(name: &str, var: Option<&str>) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    match var {
        Some(v) => child.env(MKL_VAR, v),
        None => child.env_remove(MKL_VAR),
    };
    let out = child.output().expect("re-run this test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {name} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "child did not run {name}: {stdout}"
    );
    false
}

/// An MKL block that is counted by MKL and freed again.
fn one_block_round_trip() {
    // Counted and freed by MKL itself: not kept by the block cache.
    mkl_alloc::block_cache::disable();
    let before = manager::stats();
    let mut v: AVec<u8, MklAllocator> = AVec::with_capacity_in(1 << 20, MklAllocator);
    v.extend((0..1 << 20).map(|i| i as u8));
    assert_eq!(
        manager::stats().buffers,
        before.buffers + 1,
        "still counted"
    );
    assert!(v.iter().enumerate().all(|(i, &b)| b == i as u8));
    drop(v);
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

#[test]
fn first_call_turns_it_off_later_calls_report_false() {
    if !in_fresh_process("first_call_turns_it_off_later_calls_report_false", None) {
        return;
    }
    assert!(!manager::fast_mm_disabled(), "nothing turned it off yet");
    // MKL_Mem_Stat is not an allocation: the call still comes early enough.
    let _ = manager::stats();
    assert!(manager::disable_fast_mm(), "the first call turns it off");
    assert!(manager::fast_mm_disabled());
    // Later calls change nothing and say so, though the manager stays off.
    assert!(!manager::disable_fast_mm());
    assert!(!manager::disable_fast_mm());
    assert!(
        manager::fast_mm_disabled(),
        "a false answer does not undo it"
    );
    one_block_round_trip();
}

#[test]
fn a_call_after_mkl_allocated_is_too_late() {
    if !in_fresh_process("a_call_after_mkl_allocated_is_too_late", None) {
        return;
    }
    one_block_round_trip();
    assert!(
        !manager::disable_fast_mm(),
        "too late once MKL has allocated"
    );
    assert!(!manager::fast_mm_disabled(), "not known to be off");
    assert!(!manager::disable_fast_mm());
    one_block_round_trip();
}

#[test]
fn the_environment_variable_is_reported_and_the_first_call_still_succeeds() {
    let name = "the_environment_variable_is_reported_and_the_first_call_still_succeeds";
    if !in_fresh_process(name, Some("1")) {
        return;
    }
    assert!(manager::fast_mm_disabled(), "MKL_DISABLE_FAST_MM=1 is seen");
    assert!(
        manager::disable_fast_mm(),
        "MKL still answers 1 to the first call"
    );
    assert!(!manager::disable_fast_mm());
    one_block_round_trip();
    assert!(manager::fast_mm_disabled());
}

#[test]
fn an_empty_environment_variable_is_not_reported() {
    if !in_fresh_process("an_empty_environment_variable_is_not_reported", Some("")) {
        return;
    }
    assert!(!manager::fast_mm_disabled());
}
