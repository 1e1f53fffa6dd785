//! Stress for `SharedMklVec` (issue 5, item 2; release mode, bounded by
//! count, well under 60 s on 2 cores): 4 reader threads take views (borrowed
//! and owned `ArcView`s) and check a per-generation fill pattern while 2
//! resizer threads move the buffer from generation to generation. Every read
//! must be consistent; prints operations per second and refusal counts.
//!
//! Run: `cargo test --release --features serde,bytemuck --test shared_vec_stress --
//! --ignored --nocapture` (`MKL_ALLOC_STRESS_GENERATIONS=<n>` and
//! `MKL_ALLOC_STRESS_READS=<reads per reader>` change the size of the run).
//!
//! # The pattern
//!
//! Generation `g` has length `len_of(g)` and every element equal to `g`.
//! From an even `g` to `g + 1` the length stays, and the step is one
//! `try_view_mut` that overwrites every element (atomic for every reader).
//! From an odd `g` the length changes (grows or shrinks, moving the block),
//! which the API cannot do in one claim: `try_resize(len_of(g + 1), g + 1)`,
//! then a `try_view_mut` that fills everything with `g + 1`. Between the two
//! a reader may see the *transitional* state, which is just as exactly
//! defined: length `len_of(g + 1)`, the first `min(len_of(g), len_of(g +
//! 1))` elements `g`, the rest `g + 1`. A read that is neither exactly a
//! settled nor exactly a transitional state (a torn copy, a length from one
//! generation with contents of another, freed memory) fails the test.
//!
//! The two resizers compete for the same transitions: whoever holds the
//! mutable view completes a pending fill or performs an even step; an odd
//! step's `try_resize` is done by the resizer that won it (an atomic
//! compare-exchange of "the target of the last resize started" from `g - 1`
//! to `g + 1`, made while holding the mutable view that saw `g` settled), so
//! no stale resize can ever be applied. Readers also check that the
//! generation they see never goes backwards.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

use mkl_alloc::{SharedMklVec, SharedVecError, manager};

const READERS: usize = 4;
const RESIZERS: usize = 2;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The length of generation `g`: odd generations keep their predecessor's
/// length; even ones take a new one, 1 ..= 8192, never equal to the
/// previous (consecutive `k` differ by 7919, which is not 0 mod 8192).
fn len_of(g: u64) -> usize {
    let k = g / 2;
    1 + ((k.wrapping_mul(7919)) % 8192) as usize
}

/// What a read found.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum State {
    Settled(u64),
    /// Resized towards `g + 1`, not yet filled.
    Transitional(u64),
}

/// Classifies a read exactly, or panics with what was wrong.
#[track_caller]
fn classify(s: &[u64]) -> State {
    assert!(!s.is_empty(), "every generation has at least one element");
    let g = s[0];
    if s.len() == len_of(g) && s.iter().all(|&x| x == g) {
        return State::Settled(g);
    }
    let keep = len_of(g).min(len_of(g + 1));
    if g % 2 == 1
        && s.len() == len_of(g + 1)
        && s[..keep].iter().all(|&x| x == g)
        && s[keep..].iter().all(|&x| x == g + 1)
    {
        return State::Transitional(g);
    }
    let first_bad = s.iter().position(|&x| x != g);
    panic!(
        "inconsistent read: len {} (generation {g} has {}, {} has {}), first element {g}, \
         first other value at {first_bad:?}: {:?}",
        s.len(),
        len_of(g),
        g + 1,
        len_of(g + 1),
        first_bad.map(|i| s[i])
    );
}

fn generation(state: State) -> u64 {
    match state {
        State::Settled(g) | State::Transitional(g) => g,
    }
}

#[derive(Default)]
struct Counts {
    reads: AtomicU64,
    read_busy: AtomicU64,
    elements_checked: AtomicU64,
    fills: AtomicU64,
    value_steps: AtomicU64,
    resizes: AtomicU64,
    shrinks: AtomicU64,
    claim_exported: AtomicU64,
    claim_busy: AtomicU64,
    resize_exported: AtomicU64,
    resize_busy: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[track_caller]
fn refusal(e: SharedVecError, exported: &AtomicU64, busy: &AtomicU64) {
    match e {
        SharedVecError::Exported { views } => {
            assert!(
                (1..=READERS).contains(&views),
                "Exported {{ views: {views} }}"
            );
            bump(exported);
        }
        SharedVecError::Busy => bump(busy),
        e => panic!("unexpected refusal: {e}"),
    }
}

#[test]
#[ignore = "stress: run in release by .ci/run"]
fn four_readers_two_resizers_generations_stay_consistent() {
    let generations = env_or("MKL_ALLOC_STRESS_GENERATIONS", 100_000);
    let reads = env_or("MKL_ALLOC_STRESS_READS", 5_000_000);
    let before = manager::stats();

    let v = Arc::new(SharedMklVec::from_slice(&vec![0u64; len_of(0)]));
    // The target of the last length-changing resize started: odd `g`'s
    // resize moves it from `g - 1` to `g + 1`, so each has one winner.
    let started = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let c = Counts::default();
    let barrier = Barrier::new(READERS + RESIZERS);
    let t0 = Instant::now();

    thread::scope(|s| {
        for r in 0..READERS {
            let (v, c, barrier, done) = (&v, &c, &barrier, &done);
            s.spawn(move || {
                barrier.wait();
                let mut last = 0;
                // Until the resizers are done (at most `reads` attempts),
                // so that every read races the resizers.
                for i in 0..reads {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    // Alternate borrowed and owned (Arc) views.
                    let got = if (i + r as u64) % 4 == 0 {
                        SharedMklVec::view_arc(v).map(|a| {
                            let st = classify(&a);
                            (st, a.len())
                        })
                    } else {
                        v.view().map(|a| {
                            assert!(v.view_count() >= 1);
                            (classify(&a), a.len())
                        })
                    };
                    match got {
                        Ok((st, len)) => {
                            let g = generation(st);
                            assert!(g >= last, "generation went back from {last} to {g}");
                            last = g;
                            bump(&c.reads);
                            c.elements_checked.fetch_add(len as u64, Ordering::Relaxed);
                        }
                        Err(SharedVecError::Busy) => bump(&c.read_busy),
                        Err(e) => panic!("view refused with {e}"),
                    }
                }
            });
        }
        for _ in 0..RESIZERS {
            let (v, c, barrier, started, done) = (&v, &c, &barrier, &started, &done);
            s.spawn(move || {
                barrier.wait();
                let mut attempts = 0u64;
                while !done.load(Ordering::Relaxed) {
                    attempts += 1;
                    assert!(
                        attempts < 1_000 * generations + 10_000_000,
                        "no progress: stuck at {:?}",
                        v.len()
                    );
                    if attempts % 64 == 0 {
                        // Any resizer may shrink at any time: contents stay.
                        match v.try_shrink_to_fit() {
                            Ok(()) => bump(&c.shrinks),
                            Err(e) => refusal(e, &c.resize_exported, &c.resize_busy),
                        }
                    }
                    let mut m = match v.try_view_mut() {
                        Ok(m) => m,
                        Err(e) => {
                            refusal(e, &c.claim_exported, &c.claim_busy);
                            thread::yield_now();
                            continue;
                        }
                    };
                    let won = match classify(&m) {
                        State::Transitional(g) => {
                            m.fill(g + 1);
                            bump(&c.fills);
                            None
                        }
                        State::Settled(g) if g >= generations => {
                            done.store(true, Ordering::Relaxed);
                            None
                        }
                        State::Settled(g) if g % 2 == 0 => {
                            m.fill(g + 1);
                            bump(&c.value_steps);
                            None
                        }
                        State::Settled(g) => started
                            .compare_exchange(g - 1, g + 1, Ordering::Relaxed, Ordering::Relaxed)
                            .ok()
                            .map(|_| g),
                    };
                    drop(m);
                    if let Some(g) = won {
                        // Ours alone: nothing else can leave Settled(g) until
                        // this resize lands, so retry until it does.
                        loop {
                            match v.try_resize(len_of(g + 1), g + 1) {
                                Ok(()) => break,
                                Err(e) => refusal(e, &c.resize_exported, &c.resize_busy),
                            }
                            thread::yield_now();
                        }
                        bump(&c.resizes);
                    }
                }
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();

    // Settled at the target, no view left, and the buffer works.
    assert_eq!(v.view_count(), 0);
    let last = classify(&v.view().unwrap());
    assert_eq!(last, State::Settled(generations));
    let ld = |x: &AtomicU64| x.load(Ordering::Relaxed);
    let (reads_ok, fills, values, resizes) = (
        ld(&c.reads),
        ld(&c.fills),
        ld(&c.value_steps),
        ld(&c.resizes),
    );
    assert_eq!(
        resizes,
        generations / 2,
        "every odd step resized exactly once"
    );
    assert_eq!(fills, resizes, "every resize completed by exactly one fill");
    assert_eq!(values + resizes, generations, "one step per generation");
    assert!(reads_ok > 0);
    let ops = reads_ok + fills + values + resizes + ld(&c.shrinks);
    println!(
        "shared_vec stress: {READERS} readers (at most {reads} views each), {RESIZERS} resizers, \
         {generations} generations in {secs:.2} s\n  \
         successful: {reads_ok} views ({} elements checked), {values} in-place steps, \
         {resizes} resizes + {fills} fills, {} shrinks = {ops} ops, {:.0} ops/s\n  \
         refused: view Busy {}, try_view_mut Exported {} / Busy {}, \
         try_resize+try_shrink_to_fit Exported {} / Busy {}",
        ld(&c.elements_checked),
        ld(&c.shrinks),
        ops as f64 / secs,
        ld(&c.read_busy),
        ld(&c.claim_exported),
        ld(&c.claim_busy),
        ld(&c.resize_exported),
        ld(&c.resize_busy),
    );
    drop(v);
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "MKL holds blocks after the run"
    );
}
