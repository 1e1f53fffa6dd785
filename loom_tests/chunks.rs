//! Loom models of the chunk table beneath MKL (`src/backing/chunks.rs`,
//! issue 30): the lock-free table the hooks look every freed or resized
//! pointer up in. Under every interleaving of concurrent inserts, lookups
//! and removals, with windows that collide (loom's table has 8 slots and
//! windows of 4):
//!
//! - concurrent inserts claim distinct slots, and each finds its own
//!   record afterwards;
//! - a chunk handed to another thread (MKL's hand-over: a release store
//!   and an acquire load here) is found there with the size and request
//!   its inserter wrote, and can be resized and removed there;
//! - a removal racing an insert into the same window loses neither: the
//!   removed chunk is gone, the inserted one found.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom_chunks`.
//!
//! The table never touches a chunk's memory: the models use addresses on
//! 2 MiB boundaries beyond the user address space.
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use mkl_alloc::{Chunk, ChunkTable, chunk_home};

const MIB: usize = 1 << 20;

/// `n` chunk addresses whose windows start at the same slot.
fn colliding(n: usize) -> Vec<usize> {
    let base = 1usize << 48;
    let h = chunk_home(base);
    (0..)
        .map(|i| base + i * 2 * MIB)
        .filter(|&a| chunk_home(a) == h)
        .take(n)
        .collect()
}

fn record(size: usize, asked: usize) -> Option<Chunk> {
    Some(Chunk::new(size, asked))
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

#[test]
fn concurrent_inserts_claim_distinct_slots() {
    model(|| {
        let t = Arc::new(ChunkTable::new());
        let a = colliding(3);
        let threads: Vec<_> = (0..2)
            .map(|i| {
                let (t, addr) = (t.clone(), a[i]);
                thread::spawn(move || {
                    assert!(t.insert(addr, (i + 1) * MIB, MIB));
                    assert_eq!(t.get(addr), record((i + 1) * MIB, MIB));
                })
            })
            .collect();
        // The main thread inserts a third into the same window meanwhile.
        assert!(t.insert(a[2], 3 * MIB, 3 * MIB));
        for h in threads {
            h.join().unwrap();
        }
        for (i, &addr) in a.iter().enumerate() {
            let asked = if i == 2 { 3 * MIB } else { MIB };
            assert_eq!(t.get(addr), record((i + 1) * MIB, asked), "chunk {i}");
        }
        for (i, &addr) in a.iter().enumerate() {
            assert_eq!(t.remove(addr), Some((i + 1) * MIB));
            assert_eq!(t.get(addr), None);
        }
    });
}

#[test]
fn a_handed_over_chunk_is_found_resized_and_removed_elsewhere() {
    model(|| {
        let t = Arc::new(ChunkTable::new());
        let a = colliding(2);
        // MKL's hand-over of a pointer between threads.
        let handed = Arc::new(AtomicUsize::new(0));
        let producer = {
            let (t, handed, addr) = (t.clone(), handed.clone(), a[0]);
            thread::spawn(move || {
                assert!(t.insert(addr, 8 * MIB, 6 * MIB));
                handed.store(addr, Ordering::Release);
            })
        };
        let bystander = {
            let (t, addr) = (t.clone(), a[1]);
            thread::spawn(move || {
                assert!(t.insert(addr, MIB, MIB));
                assert_eq!(t.remove(addr), Some(MIB));
            })
        };
        let got = handed.load(Ordering::Acquire);
        if got != 0 {
            assert_eq!(t.get(got), record(8 * MIB, 6 * MIB));
            t.resize(got, Chunk::new(4 * MIB, 4 * MIB));
            assert_eq!(t.get(got), record(4 * MIB, 4 * MIB));
            assert_eq!(t.remove(got), Some(4 * MIB));
            assert_eq!(t.get(got), None);
        }
        producer.join().unwrap();
        bystander.join().unwrap();
        assert_eq!(t.get(a[1]), None);
        if got == 0 {
            assert_eq!(t.remove(a[0]), Some(8 * MIB));
        }
        assert_eq!(t.get(a[0]), None);
    });
}

#[test]
fn a_removal_racing_an_insert_loses_neither() {
    model(|| {
        let t = Arc::new(ChunkTable::new());
        let a = colliding(3);
        assert!(t.insert(a[0], MIB, MIB));
        assert!(t.insert(a[1], 2 * MIB, 2 * MIB));
        let remover = {
            let (t, addr) = (t.clone(), a[0]);
            thread::spawn(move || assert_eq!(t.remove(addr), Some(MIB)))
        };
        assert!(t.insert(a[2], 3 * MIB, 3 * MIB));
        assert_eq!(t.get(a[2]), record(3 * MIB, 3 * MIB));
        assert_eq!(t.get(a[1]), record(2 * MIB, 2 * MIB));
        remover.join().unwrap();
        assert_eq!(t.get(a[0]), None);
        assert_eq!(t.get(a[1]), record(2 * MIB, 2 * MIB));
        assert_eq!(t.get(a[2]), record(3 * MIB, 3 * MIB));
    });
}

/// Issue 41: a trim giving a live chunk's slack back (its tail past what
/// MKL last asked for) and the chunk's owner growing it within its size
/// never act on the chunk at once: the owner decides on the size it read
/// while holding the chunk, the trim skips a held chunk and the owner
/// waits for a trim's. `mapped` stands for the chunk's mapping: the trim
/// unmaps the tail, a growth past the mapping maps more; the bytes a
/// growth within the chunk hands out are mapped whatever the interleaving.
#[test]
fn a_trim_and_a_growth_within_the_chunk_never_overlap() {
    model(|| {
        let t = Arc::new(ChunkTable::new());
        let mapped = Arc::new(AtomicUsize::new(8 * MIB));
        let addr = colliding(1)[0];
        assert!(t.insert(addr, 8 * MIB, 4 * MIB));
        let trimmer = {
            let (t, mapped) = (t.clone(), mapped.clone());
            thread::spawn(move || {
                for i in 0..t.slots() {
                    if let Some((a, c)) = t.try_lock_slot(i) {
                        assert_eq!(a, addr);
                        mapped.store(c.asked, Ordering::Relaxed);
                        t.resize(a, Chunk::new(c.asked, c.asked));
                    }
                }
            })
        };
        // The owner grows the block to 6 MiB: within the chunk if its size
        // allows, else (trimmed) by growing the mapping.
        let c = t.lock(addr).expect("the chunk is live");
        let grown = if c.size >= 6 * MIB {
            Chunk::new(c.size, 6 * MIB)
        } else {
            mapped.store(6 * MIB, Ordering::Relaxed);
            Chunk::new(6 * MIB, 6 * MIB)
        };
        assert!(
            mapped.load(Ordering::Relaxed) >= 6 * MIB,
            "the growth's bytes were unmapped under it"
        );
        t.resize(addr, grown);
        trimmer.join().unwrap();
        let end = t.get(addr).expect("still live");
        assert!(end.asked == 6 * MIB && end.size >= end.asked, "{end:?}");
        assert!(mapped.load(Ordering::Relaxed) >= end.size);
        // A free after both: the owner takes it and removes it.
        assert_eq!(t.remove_record(addr), Some(end));
        assert_eq!(t.get(addr), None);
    });
}
