//! Stress (release mode, bounded by operation count, each well under 60 s on
//! 2 cores): 8 threads doing a random mix of alloc / alloc_zeroed / realloc /
//! grow / shrink / free on MklAllocator through both interfaces, handing
//! blocks to each other over channels; every block's contents are checked
//! before every operation on it. Prints operations per second.
//!
//! Run: `cargo test --release --test stress -- --ignored --nocapture`
//! (`MKL_ALLOC_STRESS_OPS=<ops per thread>` to change the size of the run).

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Barrier, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::Instant;

use allocator_api2::alloc::Allocator;
use mkl_alloc::{MklAllocator, manager};

const THREADS: usize = 8;

/// Each test checks MKL's process-wide counters and wants the machine: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
const MAX_SIZE: usize = 1 << 20;
const WINDOWS: usize = 1 << 16;

fn ops_per_thread(default: usize) -> usize {
    std::env::var("MKL_ALLOC_STRESS_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn pattern() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| {
        let mut x = 0xda94_2042_e4dd_58b5u64;
        (0..MAX_SIZE + WINDOWS)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as u8
            })
            .collect()
    })
}

fn window(tag: u64, len: usize) -> &'static [u8] {
    let start = (tag as usize).wrapping_mul(0x9e37) % WINDOWS;
    &pattern()[start..start + len]
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Mostly small, sometimes up to 1 MiB.
    fn size(&mut self) -> usize {
        let max = match self.below(100) {
            0..70 => 1024,
            70..96 => 64 << 10,
            _ => MAX_SIZE,
        };
        1 + self.below(max as u64) as usize
    }
    fn align(&mut self) -> usize {
        1 << self.below(13)
    }
}

struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    tag: u64,
    global: bool,
}

// SAFETY: a Block is the sole owner of an MKL block; MKL blocks can be
// accessed and freed from any thread.
unsafe impl Send for Block {}

impl Block {
    fn bytes(&self) -> &[u8] {
        // SAFETY: live block owned by self, fully written.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    fn fill(&mut self, tag: u64) {
        let src = window(tag, self.layout.size());
        // SAFETY: live block owned by self, layout.size() bytes; src is a
        // distinct buffer of the same length.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), src.len()) };
        self.tag = tag;
    }

    #[track_caller]
    fn check(&self) {
        assert!(
            self.bytes() == window(self.tag, self.layout.size()),
            "block {:p} {:?} lost its contents",
            self.ptr,
            self.layout
        );
    }

    #[track_caller]
    fn check_aligned(&self) {
        let want = self.layout.align().max(64);
        assert_eq!(
            self.ptr.as_ptr() as usize % want,
            0,
            "misaligned {:?}",
            self.layout
        );
    }

    fn alloc(rng: &mut Rng, tag: u64) -> Block {
        let layout = Layout::from_size_align(rng.size(), rng.align()).unwrap();
        let global = rng.below(2) == 0;
        let zeroed = rng.below(4) == 0;
        let ptr = if global {
            // SAFETY: size > 0.
            let p = unsafe {
                if zeroed {
                    MklAllocator.alloc_zeroed(layout)
                } else {
                    MklAllocator.alloc(layout)
                }
            };
            NonNull::new(p).expect("alloc")
        } else if zeroed {
            MklAllocator
                .allocate_zeroed(layout)
                .expect("allocate_zeroed")
                .cast()
        } else {
            MklAllocator.allocate(layout).expect("allocate").cast()
        };
        let mut b = Block {
            ptr,
            layout,
            tag: 0,
            global,
        };
        b.check_aligned();
        if zeroed {
            assert!(b.bytes().iter().all(|&x| x == 0), "zeroed block not zero");
        }
        b.fill(tag);
        b
    }

    fn resize(&mut self, rng: &mut Rng, tag: u64) {
        self.check();
        let old = self.layout;
        let new_size = rng.size();
        let keep = old.size().min(new_size);
        if self.global {
            // SAFETY: live block of `old` owned by self; new_size > 0; on
            // success the old pointer is replaced.
            let p = unsafe { MklAllocator.realloc(self.ptr.as_ptr(), old, new_size) };
            self.ptr = NonNull::new(p).expect("realloc");
            self.layout = Layout::from_size_align(new_size, old.align()).unwrap();
        } else {
            let new = Layout::from_size_align(new_size, rng.align()).unwrap();
            let zeroed = rng.below(2) == 0;
            // SAFETY: live block of `old` owned by self; grow when larger,
            // shrink when not smaller; the result replaces it.
            let p = unsafe {
                if new_size >= old.size() && zeroed {
                    MklAllocator.grow_zeroed(self.ptr, old, new)
                } else if new_size >= old.size() {
                    MklAllocator.grow(self.ptr, old, new)
                } else {
                    MklAllocator.shrink(self.ptr, old, new)
                }
            }
            .expect("resize");
            self.ptr = p.cast();
            self.layout = new;
            if zeroed && new_size > old.size() {
                assert!(
                    self.bytes()[keep..].iter().all(|&x| x == 0),
                    "grow_zeroed tail"
                );
            }
        }
        self.check_aligned();
        assert!(
            self.bytes()[..keep] == *window(self.tag, keep),
            "resize lost the first {keep} bytes"
        );
        self.fill(tag);
    }

    fn free(self) {
        self.check();
        // SAFETY: live block owned by self (consumed), freed through the
        // interface that allocated it.
        unsafe {
            if self.global {
                MklAllocator.dealloc(self.ptr.as_ptr(), self.layout);
            } else {
                MklAllocator.deallocate(self.ptr, self.layout);
            }
        }
    }
}

fn worker(
    id: usize,
    ops: usize,
    rx: Receiver<Block>,
    txs: Vec<Sender<Block>>,
    barrier: Arc<Barrier>,
) -> usize {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ ((id as u64 + 1) << 32));
    let mut pool: Vec<Block> = Vec::new();
    let mut tag = (id as u64) << 40;
    let mut done = 0;
    for _ in 0..ops {
        while let Ok(b) = rx.try_recv() {
            b.check();
            pool.push(b);
        }
        tag += 1;
        let choice = rng.below(100);
        if pool.is_empty() || (choice < 35 && pool.len() < 256) {
            pool.push(Block::alloc(&mut rng, tag));
        } else {
            let i = rng.below(pool.len() as u64) as usize;
            match choice {
                0..60 => pool[i].resize(&mut rng, tag),
                60..85 => pool.swap_remove(i).free(),
                _ => {
                    let b = pool.swap_remove(i);
                    b.check();
                    let to = (id + 1 + rng.below(THREADS as u64 - 1) as usize) % THREADS;
                    txs[to].send(b).unwrap();
                }
            }
        }
        done += 1;
    }
    // All sends happen before this barrier, so afterwards every block sent
    // to this thread is already in its channel.
    barrier.wait();
    while let Ok(b) = rx.try_recv() {
        pool.push(b);
    }
    for b in pool {
        b.free();
        done += 1;
    }
    done
}

#[test]
#[ignore = "stress: run in release by .ci/run"]
fn eight_threads_mixed_ops_with_handover() {
    let _g = serial();
    pattern();
    let ops = ops_per_thread(200_000);
    let before = manager::stats();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel()).unzip();
    let barrier = Arc::new(Barrier::new(THREADS));
    let start = Instant::now();
    let handles: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(id, rx)| {
            let txs = txs.clone();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || worker(id, ops, rx, txs, barrier))
        })
        .collect();
    drop(txs);
    let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "stress mixed: {THREADS} threads, {total} operations in {secs:.2} s = {:.0} ops/s",
        total as f64 / secs
    );
    assert!(total >= ops * THREADS);
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "MKL holds blocks after the run"
    );
}

#[test]
#[ignore = "stress: run in release by .ci/run"]
fn eight_threads_small_block_churn_freed_elsewhere() {
    // The allocator's hot path: small blocks (16 .. 256 B), half of them
    // freed by the next thread.
    let _g = serial();
    let ops = ops_per_thread(200_000) * 16;
    let before = manager::stats();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<Block>()).unzip();
    let barrier = Arc::new(Barrier::new(THREADS));
    let start = Instant::now();
    let handles: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(id, rx)| {
            let next = txs[(id + 1) % THREADS].clone();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let mut rng = Rng(0x1234_5678_9abc_def1 ^ id as u64);
                let mut done = 0usize;
                for k in 0..ops {
                    let size = 16 + rng.below(241) as usize;
                    let layout = Layout::from_size_align(size, 8).unwrap();
                    // SAFETY: size > 0.
                    let p = NonNull::new(unsafe { MklAllocator.alloc(layout) }).expect("alloc");
                    assert_eq!(p.as_ptr() as usize % 64, 0);
                    // SAFETY: p is a live block of `size` bytes.
                    unsafe { p.as_ptr().write_bytes(k as u8, size) };
                    let b = Block {
                        ptr: p,
                        layout,
                        tag: 0,
                        global: true,
                    };
                    if k % 2 == 0 {
                        next.send(b).unwrap();
                    } else {
                        assert!(b.bytes().iter().all(|&x| x == k as u8));
                        // SAFETY: the block is live and ours, freed once.
                        unsafe { MklAllocator.dealloc(b.ptr.as_ptr(), b.layout) };
                    }
                    done += 1;
                    while let Ok(b) = rx.try_recv() {
                        // SAFETY: a live block handed to us, freed once.
                        unsafe { MklAllocator.dealloc(b.ptr.as_ptr(), b.layout) };
                        done += 1;
                    }
                }
                barrier.wait();
                while let Ok(b) = rx.try_recv() {
                    // SAFETY: a live block handed to us, freed once.
                    unsafe { MklAllocator.dealloc(b.ptr.as_ptr(), b.layout) };
                    done += 1;
                }
                done
            })
        })
        .collect();
    drop(txs);
    let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "stress small-block churn: {THREADS} threads, {total} alloc+free in {secs:.2} s = {:.0} ops/s",
        total as f64 / secs
    );
    assert_eq!(
        total,
        ops * THREADS + ops * THREADS / 2,
        "every block freed once"
    );
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "MKL holds blocks after the run"
    );
}
