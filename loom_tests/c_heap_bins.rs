//! Loom models of `c_heap`'s bins of small blocks (`mkl_alloc::c_heap`,
//! NumPy's handler): one [`Bin`] under every interleaving of concurrent
//! puts and takes.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --test loom_c_heap_bins`.
//!
//! What they check: a block is owned by exactly one party at a time (taken
//! by one thread, or still cached, or refused and kept by its owner: never
//! two, never none), and what the previous owner wrote to a block happens
//! before what the next owner reads (the blocks are loom cells, so a
//! missing `Release`/`Acquire` pair is reported as a race).
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use mkl_alloc::Bin;
use mkl_alloc::c_heap::BIN_SLOTS;

/// A block: a loom-checked cell, handed around as a raw pointer as the
/// c_heap hands its blocks.
fn block(value: u64) -> *mut u8 {
    Box::into_raw(Box::new(UnsafeCell::new(value))).cast()
}

/// # Safety
/// `p` came from `block` and is owned by the caller.
unsafe fn cell<'a>(p: *mut u8) -> &'a UnsafeCell<u64> {
    // SAFETY: the caller's contract.
    unsafe { &*p.cast::<UnsafeCell<u64>>() }
}

/// Frees a block made by `block`.
///
/// # Safety
/// `p` came from `block`, is owned by the caller and not used again.
unsafe fn free(p: *mut u8) {
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(p.cast::<UnsafeCell<u64>>()) });
}

/// Everything still in the bin (single-threaded, at the end).
fn leftovers(bin: &Bin) -> Vec<usize> {
    let mut out = Vec::new();
    while let Some(p) = bin.take() {
        out.push(p as usize);
    }
    out.sort();
    out
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// The `Release` of `put` and the `Acquire` of `take`: a block written and
/// cached on one thread is read, with that write, on another, which then
/// writes it too. (The taker spins until the block arrives, with loom's
/// `yield_now`: loom does not reorder a load before a store that has not
/// run yet, so without the spin it would only see the empty bin.)
#[test]
fn what_was_written_before_a_put_is_seen_after_the_take() {
    model(|| {
        let bin = Arc::new(Bin::new());
        let b2 = bin.clone();
        let writer = thread::spawn(move || {
            let p = block(0);
            // SAFETY: a fresh block, owned here until the put.
            unsafe { cell(p).with_mut(|v| *v = 42) };
            assert!(b2.put(p), "an empty bin takes a block");
        });
        let p = loop {
            if let Some(p) = bin.take() {
                break p;
            }
            thread::yield_now();
        };
        // SAFETY: taken: owned here now.
        assert_eq!(unsafe { cell(p).with(|v| *v) }, 42);
        // SAFETY: as above.
        unsafe { cell(p).with_mut(|v| *v = 7) };
        writer.join().unwrap();
        assert!(leftovers(&bin).is_empty(), "taken and still cached");
        // SAFETY: owned here; freed once.
        unsafe { free(p) };
    });
}

/// Two threads take from a bin holding one block: exactly one gets it.
#[test]
fn one_block_two_takers() {
    model(|| {
        let bin = Arc::new(Bin::new());
        let p = block(5);
        assert!(bin.put(p));
        let b2 = bin.clone();
        let other = thread::spawn(move || b2.take().map(|p| p as usize));
        let mine = bin.take().map(|p| p as usize);
        let theirs = other.join().unwrap();
        assert_eq!(
            usize::from(mine.is_some()) + usize::from(theirs.is_some()),
            1,
            "one block, one owner"
        );
        assert_eq!(mine.or(theirs), Some(p as usize));
        assert!(leftovers(&bin).is_empty());
        // SAFETY: the block is back with its maker; freed once.
        unsafe { free(p) };
    });
}

/// Two threads cache a block each into the bin's last free slot: exactly
/// one is kept, the other is refused and stays its owner's.
#[test]
fn the_last_slot_goes_to_one_of_two_puts() {
    model(|| {
        let bin = Arc::new(Bin::new());
        let fill: Vec<*mut u8> = (0..BIN_SLOTS - 1).map(|i| block(i as u64)).collect();
        for &p in &fill {
            assert!(bin.put(p));
        }
        let (a, b) = (block(100), block(200));
        let (a_addr, b_addr) = (a as usize, b as usize);
        let b2 = bin.clone();
        let other = thread::spawn(move || b2.put(b_addr as *mut u8));
        let kept_a = bin.put(a);
        let kept_b = other.join().unwrap();
        assert!(kept_a ^ kept_b, "one slot: exactly one put succeeds");
        let left = leftovers(&bin);
        assert_eq!(left.len(), BIN_SLOTS);
        let winner = if kept_a { a_addr } else { b_addr };
        assert!(left.contains(&winner));
        assert!(!left.contains(if kept_a { &b_addr } else { &a_addr }));
        for p in left
            .into_iter()
            .chain([if kept_a { b_addr } else { a_addr }])
        {
            // SAFETY: every block is back with the test; each freed once.
            unsafe { free(p as *mut u8) };
        }
    });
}

/// A put racing a take on an empty bin, and a block cached again by a
/// thread that took it: every block ends up in exactly one place.
#[test]
fn put_take_and_put_again_lose_and_duplicate_nothing() {
    model(|| {
        let bin = Arc::new(Bin::new());
        let first = block(1);
        assert!(bin.put(first));
        let b2 = bin.clone();
        // Takes a block (the first, or the second if it came meanwhile),
        // writes it and caches it again.
        let recycler = thread::spawn(move || {
            let p = b2.take()?;
            // SAFETY: taken: owned here until the put.
            unsafe { cell(p).with_mut(|v| *v += 10) };
            assert!(b2.put(p), "a slot is free: this thread emptied one");
            Some(p as usize)
        });
        let second = block(2);
        assert!(bin.put(second));
        let recycled = recycler.join().unwrap();
        let left = leftovers(&bin);
        assert_eq!(left, {
            let mut both = vec![first as usize, second as usize];
            both.sort();
            both
        });
        for p in left {
            // SAFETY: back with the test; the recycler's write happened
            // before its put, and the take here acquired it.
            let v = unsafe { cell(p as *mut u8).with(|v| *v) };
            assert_eq!(v >= 10, recycled == Some(p), "written once, by its taker");
            // SAFETY: owned here; freed once.
            unsafe { free(p as *mut u8) };
        }
    });
}
