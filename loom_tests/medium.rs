//! Loom models of the medium heap beneath MKL (`src/backing/medium/`,
//! issue 42): its class lock (a spin lock, whose holder loom's checked
//! cells verify is alone with the class's lists) and the decay racing
//! allocations and frees on one class:
//!
//! - a decay that takes dirty blocks off a class, purges them outside the
//!   lock and puts them on the clean list, racing an allocation of the
//!   same class: the allocation gets a dirty block (its old contents), a
//!   clean one (already purged: reads zero) or a fresh one, never a block
//!   the decay holds, and the figures and the budget agree afterwards;
//! - a free racing an allocation of its class, at the budget's edge (the
//!   free purged at once or kept dirty), loses no block and hands none out
//!   twice;
//! - a free that empties a span (given back at once: no budget), which
//!   then leaves its class for the pool, racing another class's
//!   allocation: that allocation takes a fresh span or the pooled one
//!   (reading zero), never a span still being given back, and the figures
//!   count the span once.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom_medium`.
//!
//! The region is one plain allocation, made once and reused by every
//! execution (each builds a fresh heap on it, after clearing what the
//! models' blocks and metadata entries held).
#![cfg(loom)]

use std::sync::OnceLock;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use loom::thread;
use mkl_alloc::backing::{MEDIUM_SPAN, MediumEnv, MediumHeap, medium_class_size};

// (Three tests, a region each: see `region`.)

/// Spans of the region (the heap's span table has 8 under loom).
const SPANS: usize = 8;

/// Test `t`'s region (leaked: every execution of the test reuses it; the
/// tests, which libtest runs side by side, have one each).
fn region(t: usize) -> *mut u8 {
    static REGIONS: [OnceLock<usize>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let addr = *REGIONS[t].get_or_init(|| {
        let layout = std::alloc::Layout::from_size_align(SPANS * MEDIUM_SPAN, 4096).unwrap();
        // SAFETY: a non-zero size; never freed.
        unsafe { std::alloc::alloc_zeroed(layout) as usize }
    });
    // Exposed provenance: the allocation is never freed.
    std::ptr::with_exposed_provenance_mut(addr)
}

/// A budget (loom's atomic) and a purge that zeroes, as `MADV_DONTNEED`.
struct Env {
    budget: usize,
    reserved: AtomicUsize,
}

impl MediumEnv for Env {
    fn reserve(&self, n: usize) -> bool {
        self.reserved
            .fetch_update(Relaxed, Relaxed, |r| {
                (n <= self.budget - r).then_some(r + n)
            })
            .is_ok()
    }
    fn unreserve(&self, n: usize) {
        self.reserved.fetch_sub(n, Relaxed);
    }
    unsafe fn purge(&self, p: *mut u8, len: usize) {
        // SAFETY: the heap's contract: free blocks of the region, unused.
        unsafe { p.write_bytes(0, len) };
    }
}

fn setup(t: usize, budget: usize) -> Arc<(MediumHeap, Env)> {
    let heap = MediumHeap::new();
    let p = region(t);
    // Fresh blocks must read zero, and their metadata entries as never
    // freed: the first segment's metadata (span 0) and the first blocks of
    // the spans the models use are cleared of what an earlier execution
    // wrote.
    for span in 0..3 {
        // SAFETY: inside the region, which no other execution uses now.
        unsafe { p.add(span * MEDIUM_SPAN).write_bytes(0, 64 << 10) };
    }
    assert!(heap.set_region(p, SPANS * MEDIUM_SPAN));
    Arc::new((
        heap,
        Env {
            budget,
            reserved: AtomicUsize::new(0),
        },
    ))
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    // The spin lock's waits are branches too (a yield each).
    b.max_branches = 5_000;
    b.check(f);
}

/// A block of class 0, its first byte checked against `zero` and set.
fn take(h: &(MediumHeap, Env)) -> *mut u8 {
    let (p, zero) = h.0.alloc(0, &h.1).unwrap();
    // SAFETY: a live block of class 0 (4 KiB), ours alone.
    unsafe {
        if zero {
            assert_eq!(p.read(), 0, "a clean or fresh block reads zero");
        } else {
            assert_eq!(p.read(), 1, "a dirty block keeps its contents");
        }
        p.write(1);
    }
    p
}

#[test]
fn decay_races_an_allocation_on_one_class() {
    model(|| {
        let size = medium_class_size(0);
        let h = setup(0, usize::MAX);
        // A block kept live throughout: the span never empties (and so
        // never leaves the class for the pool) in this model.
        let _keep = take(&h);
        let (a, b) = (take(&h), take(&h));
        // SAFETY: live blocks, freed once each.
        unsafe {
            h.0.free(a, 0, &h.1);
            h.0.free(b, 0, &h.1);
        }
        let h2 = h.clone();
        let decay = thread::spawn(move || h2.0.decay(100, Some(10), &h2.1));
        let p = take(&h);
        // SAFETY: live, freed once.
        unsafe { h.0.free(p, 100, &h.1) };
        let purged = decay.join().unwrap();
        assert!(purged <= 2);
        let (live, dirty, clean) = h.0.figures();
        assert_eq!(live, size);
        assert_eq!(dirty, h.1.reserved.load(Relaxed));
        // The allocation may have taken a block the decay had cleaned.
        assert!(clean <= purged * size);
        // a, b and p (a fresh block if the decay held a and b when it
        // asked): each free once, nothing else.
        let free = (dirty + clean) / size;
        assert!(free == 2 || free == 3, "{free}");
        let mut seen: Vec<*mut u8> = (0..free).map(|_| take(&h)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), free);
        assert!(seen.contains(&a) && seen.contains(&b));
    });
}

#[test]
fn a_free_races_an_allocation_at_the_budgets_edge() {
    model(|| {
        let size = medium_class_size(1);
        // Room for one dirty block: the second free is purged at once.
        let h = setup(1, size);
        let blocks: Vec<*mut u8> = (0..3).map(|_| h.0.alloc(1, &h.1).unwrap().0).collect();
        // SAFETY: a live block, freed once.
        unsafe { h.0.free(blocks[0], 0, &h.1) };
        let (h2, p) = (h.clone(), blocks[1] as usize);
        // SAFETY: a live block, freed once, by that thread.
        let t = thread::spawn(move || unsafe { h2.0.free(p as *mut u8, 0, &h2.1) });
        let (q, _) = h.0.alloc(1, &h.1).unwrap();
        t.join().unwrap();
        assert!(q != blocks[2], "a live block handed out again");
        let (live, dirty, clean) = h.0.figures();
        assert_eq!(live, 2 * size);
        assert_eq!(dirty, h.1.reserved.load(Relaxed));
        assert!(dirty <= size);
        // The free blocks, q and the live one: each there once.
        let free = (dirty + clean) / size;
        let mut seen: Vec<usize> = (0..free)
            .map(|_| h.0.alloc(1, &h.1).unwrap().0 as usize)
            .collect();
        seen.extend([q as usize, blocks[2] as usize]);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), free + 2);
    });
}

#[test]
fn a_span_emptied_by_a_free_races_another_classs_allocation() {
    model(|| {
        // No budget: the free gives its block back at once, which empties
        // the span (its only block) and sends it to the pool.
        let h = setup(2, 0);
        let a = h.0.alloc(0, &h.1).unwrap().0;
        let (h2, pa) = (h.clone(), a as usize);
        // SAFETY: a live block, freed once, by that thread.
        let t = thread::spawn(move || unsafe { h2.0.free(pa as *mut u8, 0, &h2.1) });
        let (q, zero) = h.0.alloc(1, &h.1).unwrap();
        assert!(zero, "a fresh or pooled span's block");
        // SAFETY: a live block of class 1, ours alone.
        unsafe {
            assert_eq!(q.read(), 0, "a fresh or pooled block reads zero");
            q.write(1);
        }
        t.join().unwrap();
        let (live, dirty, clean) = h.0.figures();
        assert_eq!(live, medium_class_size(1));
        assert_eq!(dirty, 0);
        // The emptied span is in the pool, or class 1 took it from there.
        assert!(
            clean == MEDIUM_SPAN || (clean == 0 && q == a),
            "{clean} {q:?} {a:?}"
        );
    });
}
