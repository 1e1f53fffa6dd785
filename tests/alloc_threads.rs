//! Cross-thread: 8 threads allocate blocks, hand them over channels to other
//! threads, which write, check and free them (100,000 blocks in all). A block
//! allocated in one thread and freed in another is an ordinary case for MKL.

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::Duration;

use allocator_api2::alloc::Allocator;
use mkl_alloc::{MklAllocator, manager};

const THREADS: usize = 8;
const MAX_SIZE: usize = 4096;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `MKL_ALLOC_TEST_SCALE=small` (valgrind); Miri (interpreted) runs smaller still.
fn small() -> bool {
    std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small")
}

/// 256 rows, row `t` is `4 * MAX_SIZE` bytes of `t` (blocks grow up to 3x + 1): contents are compared with memcmp.
fn rows() -> &'static [Vec<u8>] {
    static R: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    R.get_or_init(|| (0..=255u8).map(|t| vec![t; 4 * MAX_SIZE]).collect())
}

struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    /// The byte every byte of the block holds.
    tag: u8,
    /// Allocated through GlobalAlloc (else Allocator).
    global: bool,
}

// SAFETY: a Block is the sole owner of an MKL block; MKL blocks may be used
// and freed from any thread (MKL_free of another thread's block is allowed).
unsafe impl Send for Block {}

impl Block {
    fn new(rng: &mut u64, tag: u8) -> Block {
        let size = 1 + (next(rng) as usize % MAX_SIZE);
        let align = 1usize << (next(rng) % 13);
        let layout = Layout::from_size_align(size, align).unwrap();
        let global = next(rng) % 2 == 0;
        let ptr = if global {
            // SAFETY: size > 0.
            NonNull::new(unsafe { MklAllocator.alloc(layout) }).expect("alloc")
        } else {
            MklAllocator.allocate(layout).expect("allocate").cast()
        };
        assert_eq!(ptr.as_ptr() as usize % align.max(64), 0, "misaligned");
        let mut b = Block {
            ptr,
            layout,
            tag: 0,
            global,
        };
        b.write(tag);
        b
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the block is live, owned by self and fully initialised.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    fn write(&mut self, tag: u8) {
        // SAFETY: the block is live, owned by self, `size` bytes long.
        unsafe { self.ptr.as_ptr().write_bytes(tag, self.layout.size()) };
        self.tag = tag;
    }

    #[track_caller]
    fn check(&self) {
        let size = self.layout.size();
        assert!(
            self.bytes() == &rows()[self.tag as usize][..size],
            "block {:p} ({size} B) lost its contents {}",
            self.ptr,
            self.tag
        );
    }

    fn free(self) {
        // SAFETY: the block is live and owned by self (consumed here), and
        // is freed through the interface that allocated it.
        unsafe {
            if self.global {
                MklAllocator.dealloc(self.ptr.as_ptr(), self.layout);
            } else {
                MklAllocator.deallocate(self.ptr, self.layout);
            }
        }
    }
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

enum Msg {
    /// Freshly allocated by the sender: write it and pass it on.
    Fresh(Block),
    /// Written by the sender: check it and free it.
    Written(Block),
}

#[test]
fn blocks_handed_between_threads() {
    let _g = serial();
    rows();
    let total = if cfg!(miri) {
        400
    } else if small() {
        8_000
    } else {
        100_000
    };
    let per_thread = total / THREADS;
    let before = manager::stats();

    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<Msg>()).unzip();
    // Messages still to be handled: one Fresh and one Written per block.
    let remaining = Arc::new(AtomicUsize::new(2 * per_thread * THREADS));
    let handles: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(i, rx)| {
            let txs = txs.clone();
            let remaining = Arc::clone(&remaining);
            thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ((i as u64 + 1) * 0x1234_5678);
                let (mut written, mut freed) = (0usize, 0usize);
                let mut handle = |msg: Msg, rng: &mut u64| match msg {
                    Msg::Fresh(mut b) => {
                        b.check();
                        b.write((next(rng) % 256) as u8);
                        b.check();
                        let to = (i + 1 + (next(rng) as usize % (THREADS - 1))) % THREADS;
                        txs[to].send(Msg::Written(b)).unwrap();
                        written += 1;
                    }
                    Msg::Written(b) => {
                        b.check();
                        b.free();
                        freed += 1;
                    }
                };
                let mut handle = |msg: Msg, rng: &mut u64| {
                    handle(msg, rng);
                    remaining.fetch_sub(1, Ordering::AcqRel);
                };
                for k in 0..per_thread {
                    let b = Block::new(&mut rng, (k % 256) as u8);
                    let to = (i + 1 + k % (THREADS - 1)) % THREADS;
                    txs[to].send(Msg::Fresh(b)).unwrap();
                    while let Ok(msg) = rx.try_recv() {
                        handle(msg, &mut rng);
                    }
                }
                // Serve until every message of the run has been handled.
                loop {
                    if remaining.load(Ordering::Acquire) == 0 {
                        break;
                    }
                    if let Ok(msg) = rx.recv_timeout(Duration::from_millis(5)) {
                        handle(msg, &mut rng);
                    }
                }
                (written, freed)
            })
        })
        .collect();
    drop(txs);
    let (mut written, mut freed) = (0, 0);
    for h in handles {
        let (w, f) = h.join().unwrap();
        written += w;
        freed += f;
    }
    assert_eq!(
        written,
        per_thread * THREADS,
        "every block was written once"
    );
    assert_eq!(freed, per_thread * THREADS, "every block was freed once");
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "MKL still holds blocks after all were freed"
    );
}

#[test]
fn realloc_in_another_thread_keeps_contents() {
    let _g = serial();
    let before = manager::stats();
    let (tx, rx) = mpsc::channel::<Block>();
    let n = if cfg!(miri) {
        40
    } else if small() {
        200
    } else {
        2_000
    };
    let producer = thread::spawn(move || {
        let mut rng = 7u64;
        for k in 0..n {
            tx.send(Block::new(&mut rng, (k % 251) as u8)).unwrap();
        }
    });
    let consumer = thread::spawn(move || {
        for mut b in rx {
            b.check();
            let new_size = b.layout.size() * 3 + 1;
            // SAFETY: b is a live block of b.layout, owned here; the result
            // replaces it (realloc/grow consumed the old pointer).
            let p = unsafe {
                if b.global {
                    NonNull::new(MklAllocator.realloc(b.ptr.as_ptr(), b.layout, new_size))
                        .expect("realloc")
                } else {
                    let new = Layout::from_size_align(new_size, b.layout.align()).unwrap();
                    MklAllocator
                        .grow(b.ptr, b.layout, new)
                        .expect("grow")
                        .cast()
                }
            };
            assert_eq!(p.as_ptr() as usize % b.layout.align().max(64), 0);
            let old_size = b.layout.size();
            b.ptr = p;
            b.layout = Layout::from_size_align(new_size, b.layout.align()).unwrap();
            assert!(
                b.bytes()[..old_size] == rows()[b.tag as usize][..old_size],
                "prefix lost across a cross-thread realloc"
            );
            b.write(b.tag.wrapping_add(1));
            b.check();
            b.free();
        }
    });
    producer.join().unwrap();
    consumer.join().unwrap();
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}
