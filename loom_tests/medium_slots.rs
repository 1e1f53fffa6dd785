//! Loom models of the medium heap's per-thread slots and their registry
//! (`src/backing/medium/slots.rs`, issue 54): a thread parks its freed
//! block of a small class in its own slot (a plain store) and takes it
//! back (a swap); the decay, from any thread, sweeps every thread's slots
//! (a swap each, under the registry's spin lock); a thread's slots leave
//! the registry and give their blocks back when it exits; a word lets the
//! decay skip the registry when nothing was parked since the last two
//! sweeps. Each model checks that no block is lost or given back twice,
//! and that after the threads finish, two sweeps leave nothing parked:
//!
//! - a thread parking and re-taking blocks of one class, racing a sweep
//!   from another thread;
//! - two threads each parking (their slots registering beside a third's),
//!   one exiting (its slots unlinked and emptied) while the other sweeps;
//! - the "may be parked" word: a park racing a sweep, then two sweeps,
//!   which must give the block back. Under the old rule (the word a flag
//!   each sweep cleared) loom finds the lost block: the sweep lowers the
//!   word and swaps the slot before the park's store (the store is later
//!   in the slot's modification order), while the park reads the word
//!   from before the sweep's exchange (a relaxed load, not ordered after
//!   its own store: loom lets it read the older value, as a store buffer
//!   does on x86), so it leaves the word down and no later sweep looks.
//!   Checked by hand (2026-12-07): with the sweep's exchange replaced by
//!   a store of 0 (the old code), or by a swap to 0, this model fails,
//!   and loom's failing interleaving is that one; the other two pass with
//!   the store of 0 (their later parks raise the word again, or their
//!   exit gives the block back).
//!
//! A park's writes (the block, the word) are swaps under loom, plain
//! stores otherwise (`publish!` in `slots.rs`): loom leaves a plain store
//! and a concurrent swap unordered, and would then show a final sweep the
//! sweep's null after the parked block, a lost block no real execution
//! has (tokio-rs/loom issues 254 and 389). The first version of these
//! models, with plain stores, failed so in two of the three.
//!
//! Explored without a preemption bound (every interleaving): about 2 s
//! for the three in release on the shared 2-core machine.
//! The links between slots are loom's checked cells here, so every access
//! to them outside the registry's lock would be reported as a race.
//!
//! Blocks are addresses that are never dereferenced (the heap is not
//! modelled: a block given back goes to a log), each with its class in its
//! low page bits. Each thread's slots stay where they are while on the
//! registry (an `Arc`, or the thread's stack), as a thread's storage does.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom_medium_slots`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use mkl_alloc::backing::{MEDIUM_SLOT_CLASSES, MediumSlots as Slots, SlotsRegistry as Registry};

/// A thread's slots, shared with the model's main thread, which acts for
/// the thread after joining it (its later sweeps, its exit).
struct Owned(Slots);

// SAFETY: the slots' thread alone parks in them and leaves with them (the
// main thread only once it joined that thread); other threads reach them
// through the registry, under its lock, and take blocks by a swap.
unsafe impl Send for Owned {}
// SAFETY: as above.
unsafe impl Sync for Owned {}

/// Block `i` of class `k` (never dereferenced).
fn block(i: usize, k: usize) -> *mut u8 {
    std::ptr::without_provenance_mut(((i << 4) | k) << 12)
}

/// A log of the blocks given back, checking each one's class.
fn log(freed: &mut Vec<usize>) -> impl FnMut(usize, *mut u8) + '_ {
    |k, p| {
        assert_eq!(
            (p.addr() >> 12) & 15,
            k,
            "a block given back with its class"
        );
        freed.push(p.addr());
    }
}

/// Parks block `p` of class `k` in `s`, or frees it to the "heap" (the log)
/// if the slot is taken, as `medium::free` does.
fn free(r: &Registry, s: &Owned, k: usize, p: *mut u8, freed: &mut Vec<usize>) {
    // SAFETY: `s` is this thread's (see `Owned`), stays in place and
    // leaves before it goes; `p` is given up.
    if !unsafe { r.put(&s.0, k, p) } {
        freed.push(p.addr());
    }
}

/// Every block in `all` exactly once among `held` (handed out again) and
/// `freed` (given back to the heap), nothing else.
fn check_once(all: &[*mut u8], held: &[usize], freed: &[usize]) {
    let mut seen: Vec<usize> = held.iter().chain(freed).copied().collect();
    seen.sort_unstable();
    let mut want: Vec<usize> = all.iter().map(|p| p.addr()).collect();
    want.sort_unstable();
    assert_eq!(
        seen, want,
        "every block once: held {held:x?}, freed {freed:x?}"
    );
}

/// Two sweeps after the threads finished: nothing parked after them (in
/// `slots`), and the word down.
fn final_sweeps(r: &Registry, slots: &[&Owned], freed: &mut Vec<usize>) {
    r.sweep(log(freed));
    r.sweep(log(freed));
    for s in slots {
        assert_eq!(s.0.parked(), 0, "a block left parked after two sweeps");
        for k in 0..MEDIUM_SLOT_CLASSES {
            assert_eq!(s.0.take(k), None);
        }
    }
    assert!(!r.any(), "two sweeps without a park lower the word to zero");
}

/// Every interleaving (the models are small enough for no bound).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = None;
    // The spin lock's waits are branches too (a yield each).
    b.max_branches = 5_000;
    b.check(f);
}

/// A thread frees a block (parked), allocates (takes it back, or finds the
/// slot swept), frees two more (the second goes to the heap while the
/// first is parked), while another thread sweeps.
#[test]
fn park_and_take_race_a_sweep() {
    model(|| {
        let r = Arc::new(Registry::new());
        let a = Arc::new(Owned(Slots::new()));
        let all = [block(1, 0), block(2, 0), block(3, 0)];
        let (r1, a1) = (r.clone(), a.clone());
        let t = thread::spawn(move || {
            let (mut held, mut freed) = (Vec::new(), Vec::new());
            free(&r1, &a1, 0, all[0], &mut freed);
            if let Some(p) = a1.0.take(0) {
                assert_eq!(p, all[0], "the block this thread parked");
                held.push(p.addr());
            }
            free(&r1, &a1, 0, all[1], &mut freed);
            free(&r1, &a1, 0, all[2], &mut freed);
            (held, freed)
        });
        let mut swept = Vec::new();
        r.sweep(log(&mut swept));
        let (held, mut freed) = t.join().unwrap();
        freed.append(&mut swept);
        final_sweeps(&r, &[&a], &mut freed);
        check_once(&all, &held, &freed);
        // The thread exits: nothing left to give back.
        let mut rest = Vec::new();
        // SAFETY: `a`'s thread was joined: this thread acts for it.
        unsafe { r.leave(&a.0, log(&mut rest)) };
        assert!(rest.is_empty());
        assert!(r.is_empty());
    });
}

/// Slots on the registry already (the main thread's), two threads that
/// each park a block (registering), one of which then exits (its slots
/// unlinked and given back) while the other sweeps: each block goes back
/// once, by the sweep, the exit or the final sweeps, and the list stays
/// whole (the exiting slots may be first, between the others or last).
#[test]
fn an_exit_races_a_sweep() {
    model(|| {
        let r = Arc::new(Registry::new());
        let c = Arc::new(Owned(Slots::new()));
        let b = Arc::new(Owned(Slots::new()));
        let all = [block(1, 0), block(2, 1), block(3, 0), block(4, 1)];
        let mut freed = Vec::new();
        free(&r, &c, 1, all[3], &mut freed);
        let r1 = r.clone();
        let exits = thread::spawn(move || {
            // This thread's slots, in its storage until it exits.
            let a = Owned(Slots::new());
            let mut freed = Vec::new();
            free(&r1, &a, 0, all[0], &mut freed);
            // SAFETY: this thread's slots, going now.
            unsafe { r1.leave(&a.0, log(&mut freed)) };
            freed
        });
        let (r2, b2) = (r.clone(), b.clone());
        let sweeps = thread::spawn(move || {
            let mut freed = Vec::new();
            free(&r2, &b2, 1, all[1], &mut freed);
            free(&r2, &b2, 0, all[2], &mut freed);
            r2.sweep(log(&mut freed));
            freed
        });
        freed.append(&mut exits.join().unwrap());
        freed.append(&mut sweeps.join().unwrap());
        final_sweeps(&r, &[&b, &c], &mut freed);
        check_once(&all, &[], &freed);
        // SAFETY: `b`'s thread was joined; `c` is this thread's.
        unsafe {
            r.leave(&b.0, log(&mut freed));
            r.leave(&c.0, log(&mut freed));
        }
        check_once(&all, &[], &freed);
        assert!(r.is_empty());
    });
}

/// The "may be parked" word: a thread whose earlier park raised it
/// parks a block while another thread sweeps; two sweeps after it must
/// give the block back (the decay's sweeps come a quarter of the decay
/// time apart: by then every store is visible, which joining the threads
/// models). See the module docs for the interleaving the two-sweep rule
/// closes, and which loom finds under the old one-sweep rule.
#[test]
fn a_park_racing_a_sweep_is_given_back_within_two_sweeps() {
    model(|| {
        let r = Arc::new(Registry::new());
        let a = Arc::new(Owned(Slots::new()));
        let all = [block(1, 0), block(2, 1)];
        let mut freed = Vec::new();
        // An earlier park: the slots registered, the word raised.
        free(&r, &a, 0, all[0], &mut freed);
        let (r1, a1) = (r.clone(), a.clone());
        let parks = thread::spawn(move || {
            let mut freed = Vec::new();
            free(&r1, &a1, 1, all[1], &mut freed);
            freed
        });
        let r2 = r.clone();
        let sweeps = thread::spawn(move || {
            let mut freed = Vec::new();
            r2.sweep(log(&mut freed));
            freed
        });
        freed.append(&mut parks.join().unwrap());
        freed.append(&mut sweeps.join().unwrap());
        final_sweeps(&r, &[&a], &mut freed);
        check_once(&all, &[], &freed);
        // SAFETY: `a`'s thread was joined: this thread acts for it.
        unsafe { r.leave(&a.0, log(&mut freed)) };
        check_once(&all, &[], &freed);
        assert!(r.is_empty());
    });
}
