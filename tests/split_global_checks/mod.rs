//! The checks of a whole test binary whose `#[global_allocator]` is the
//! split over a small side `X` (tests/split_global*.rs, one binary per
//! side: a global allocator is the whole process's): std's collections,
//! strings, threads and over-aligned boxes work on it, large blocks are
//! MKL's (seen in `MKL_Mem_Stat`) and small ones the small side's (seen by
//! `Counting`, a wrapper of atomic counters around `X`), zeroed small
//! blocks come from the small side's own `alloc_zeroed`, the small side's
//! frees drive the block cache's decay, and a fork from a threaded program
//! gives a child that allocates on both sides.
//!
//! `harness = false`: the checks count blocks exactly, so they run one
//! after another on the main thread, with no test harness allocating beside
//! them (under valgrind libtest's own allocations raced the counts).
#![allow(dead_code)] // each binary uses the whole module, but not every item

use core::alloc::{GlobalAlloc, Layout};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};

use mkl_alloc::{DEFAULT_SPLIT_THRESHOLD, block_cache, manager};

const T: usize = DEFAULT_SPLIT_THRESHOLD;
const MIB: usize = 1 << 20;

/// The small side's live blocks (allocations minus frees).
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// Calls of the small side's own `alloc_zeroed`.
static ZEROED: AtomicUsize = AtomicUsize::new(0);
/// Calls of the small side's own `realloc`.
static REALLOCS: AtomicUsize = AtomicUsize::new(0);

/// The small side `X`, every call forwarded to `X` itself, counted with
/// relaxed atomics (no lock, nothing allocated: fork-safe, and a global
/// allocator's small side may not allocate).
pub struct Counting<X>(pub X);

// SAFETY: every call is forwarded to X with the caller's arguments; the
// counters only observe.
unsafe impl<X: GlobalAlloc> GlobalAlloc for Counting<X> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's alloc contract, forwarded.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(1, Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's alloc contract, forwarded.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(1, Relaxed);
            ZEROED.fetch_add(1, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(1, Relaxed);
        // SAFETY: the caller's dealloc contract, forwarded.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        REALLOCS.fetch_add(1, Relaxed);
        // SAFETY: the caller's realloc contract, forwarded.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

fn small_live() -> isize {
    LIVE.load(Relaxed)
}

fn mkl_blocks() -> u64 {
    manager::stats().buffers
}

fn large_buffers_are_mkl_blocks_aligned_to_64() {
    let base = manager::stats();
    let small = small_live();
    let v = vec![1.5f64; 1 << 17];
    let during = manager::stats();
    assert_eq!(v.as_ptr() as usize % 64, 0);
    assert_eq!(during.buffers, base.buffers + 1);
    assert!(during.bytes >= base.bytes + (1 << 20));
    assert_eq!(
        small_live(),
        small,
        "the large buffer went to the small side"
    );
    assert!(v.iter().all(|&x| x == 1.5));
    drop(v);
    assert_eq!(mkl_blocks(), base.buffers);
    assert_eq!(small_live(), small);
}

fn small_objects_are_the_small_sides() {
    let base = manager::stats();
    let small = small_live();
    let boxes: Vec<Box<u64>> = (0..100).map(Box::new).collect(); // 800 B vector
    let strings: Vec<String> = (0..100).map(|i| format!("item-{i}")).collect();
    assert_eq!(manager::stats(), base, "small blocks went to MKL");
    assert_eq!(
        small_live(),
        small + 202,
        "small blocks missed the small side"
    );
    assert_eq!(*boxes[99], 99);
    assert_eq!(strings[42], "item-42");
    drop((boxes, strings));
    assert_eq!(small_live(), small);
}

fn zeroed_blocks_are_zeroed_by_their_side() {
    let base = mkl_blocks();
    let zeroed = ZEROED.load(Relaxed);
    let small = vec![0u64; 100]; // alloc_zeroed, 800 B
    assert_eq!(
        ZEROED.load(Relaxed),
        zeroed + 1,
        "not the small side's alloc_zeroed"
    );
    assert!(small.iter().all(|&x| x == 0));
    let big = vec![0u64; 1 << 18]; // alloc_zeroed, 2 MiB: MKL's
    assert_eq!(ZEROED.load(Relaxed), zeroed + 1);
    assert_eq!(mkl_blocks(), base + 1);
    assert!(big.iter().all(|&x| x == 0));
    drop((small, big));
    assert_eq!(mkl_blocks(), base);
}

fn over_aligned_boxes_are_mkl_blocks() {
    #[repr(C, align(32))]
    struct Simd([f32; 8]);
    let base = mkl_blocks();
    let small = small_live();
    let b = Box::new(Simd([2.0; 8]));
    assert_eq!(&*b as *const Simd as usize % 64, 0);
    assert_eq!(mkl_blocks(), base + 1);
    assert_eq!(small_live(), small);
    assert_eq!(b.0[7], 2.0);
    drop(b);
    assert_eq!(mkl_blocks(), base);
}

fn a_growing_vec_moves_into_mkl_and_back_keeping_contents() {
    let base = mkl_blocks();
    let small = small_live();
    let reallocs = REALLOCS.load(Relaxed);
    let mut v: Vec<u8> = Vec::new();
    let mut moved_in = false;
    for i in 0..(4 * T) {
        v.push((i % 251) as u8);
        if v.capacity() >= T {
            moved_in = true;
            assert_eq!(v.as_ptr() as usize % 64, 0);
            assert_eq!(mkl_blocks(), base + 1);
            assert_eq!(small_live(), small, "the old small block was not freed");
        } else {
            assert_eq!(mkl_blocks(), base);
            assert_eq!(small_live(), small + 1);
        }
    }
    assert!(moved_in);
    // Growth below the threshold was the small side's own realloc.
    assert!(REALLOCS.load(Relaxed) > reallocs);
    v.truncate(T / 2);
    v.shrink_to_fit(); // realloc large -> small
    assert_eq!(mkl_blocks(), base);
    assert_eq!(small_live(), small + 1);
    assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    drop(v);
    let mut s = String::with_capacity(10);
    for _ in 0..T {
        s.push('x'); // realloc small -> large
    }
    assert_eq!(mkl_blocks(), base + 1);
    assert_eq!(small_live(), small);
    assert_eq!(s.len(), T);
    drop(s);
    assert_eq!(mkl_blocks(), base);
}

fn std_collections_and_threads_work() {
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut m: BTreeMap<String, Vec<u32>> = BTreeMap::new();
                for i in 0..20_000u64 {
                    m.insert(format!("{t}-{i}"), (0..(i % 7) as u32).collect());
                }
                let c = m.clone();
                drop(m);
                let mut h: HashMap<u64, String> = HashMap::new();
                for i in 0..20_000 {
                    h.insert(i, i.to_string());
                }
                (c.len(), c[&format!("{t}-13")].len(), h[&19_999].clone())
            })
        })
        .collect();
    for h in handles {
        let (n, longest, last) = h.join().unwrap();
        assert_eq!(n, 20_000);
        assert_eq!(longest, 6);
        assert_eq!(last, "19999");
    }
}

/// The small side's frees alone empty the block cache once its chunks are
/// older than the decay period (each thread ticks once per small free).
fn small_frees_drive_the_block_caches_decay() {
    block_cache::enable(64 * MIB);
    block_cache::set_decay_ms(3_600_000);
    drop(vec![1u8; 8 * MIB]);
    assert!(block_cache::cached_bytes() >= 8 * MIB, "nothing cached");
    block_cache::set_decay_ms(100);
    std::thread::sleep(std::time::Duration::from_millis(200));
    for i in 0..4 * block_cache::TICKS as u64 {
        drop(std::hint::black_box(Box::new(i)));
    }
    assert_eq!(
        block_cache::cached_bytes(),
        0,
        "small frees did not decay the cache"
    );
    block_cache::disable();
}

/// Forks while two threads allocate on both sides; each child allocates on
/// both sides too and exits. A child that hangs (a lock inherited taken)
/// fails the check after its deadline (20 s, `fork_deadline`).
#[cfg(unix)]
fn fork_while_threads_allocate_on_both_sides() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    fn both_sides(k: usize) -> bool {
        let small: Vec<String> = (0..50).map(|i| format!("{k}-{i}")).collect();
        let mut big = vec![k as u32; (1 + k % 3) * MIB / 4];
        big.push(7);
        let z = vec![0u8; 3 * MIB];
        small[49] == format!("{k}-49") && big[0] == k as u32 && z[3 * MIB - 1] == 0
    }
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut k = t;
                while !stop.load(Relaxed) {
                    assert!(both_sides(k));
                    k += 2;
                }
            })
        })
        .collect();
    // Valgrind's scale (`MKL_ALLOC_TEST_SCALE=small`): 8 forks, each of
    // which copies valgrind's state while both workers run serialised
    // beside it (~4 s a fork over mimalloc there).
    let small = std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small");
    let forks = if small {
        8
    } else if cfg!(debug_assertions) {
        50
    } else {
        200
    };
    for fork in 0..forks {
        // SAFETY: the child only allocates, checks and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = both_sides(fork) && both_sides(fork + 1);
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let start = Instant::now();
        loop {
            let mut status = 0;
            // SAFETY: waits for our own child without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "fork {fork}: the child failed (status {status:#x})"
                );
                break;
            }
            if start.elapsed() > fork_deadline() {
                // SAFETY: kills and reaps our own hung child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                panic!("fork {fork}: the child hung for {:?}", fork_deadline());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Relaxed);
    for w in workers {
        w.join().unwrap();
    }
}

/// Runs every check, printing libtest's lines; `name` is the binary's.
pub fn run(name: &str) {
    // The checks count MKL blocks exactly; the block cache (on by default)
    // keeps freed large blocks, counted by MKL, so it is off here.
    block_cache::disable();
    let mut checks: Vec<(&str, fn())> = vec![
        (
            "large_buffers_are_mkl_blocks_aligned_to_64",
            large_buffers_are_mkl_blocks_aligned_to_64,
        ),
        (
            "small_objects_are_the_small_sides",
            small_objects_are_the_small_sides,
        ),
        (
            "zeroed_blocks_are_zeroed_by_their_side",
            zeroed_blocks_are_zeroed_by_their_side,
        ),
        (
            "over_aligned_boxes_are_mkl_blocks",
            over_aligned_boxes_are_mkl_blocks,
        ),
        (
            "a_growing_vec_moves_into_mkl_and_back_keeping_contents",
            a_growing_vec_moves_into_mkl_and_back_keeping_contents,
        ),
        (
            "std_collections_and_threads_work",
            std_collections_and_threads_work,
        ),
        (
            "small_frees_drive_the_block_caches_decay",
            small_frees_drive_the_block_caches_decay,
        ),
    ];
    #[cfg(unix)]
    checks.push((
        "fork_while_threads_allocate_on_both_sides",
        fork_while_threads_allocate_on_both_sides,
    ));
    for (check_name, check) in &checks {
        check();
        println!("test {check_name} ... ok");
    }
    println!("{name}: {} passed, 0 failed", checks.len());
}

/// How long a forked child may take before it counts as hung: 20 s, or
/// `MKL_ALLOC_FORK_DEADLINE_MS` (scripts/valgrind.sh gives 90 s: a child
/// under memcheck on a loaded 2-core machine has taken more than 20).
#[cfg(unix)]
fn fork_deadline() -> std::time::Duration {
    use std::time::Duration;
    std::env::var("MKL_ALLOC_FORK_DEADLINE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(20), Duration::from_millis)
}
