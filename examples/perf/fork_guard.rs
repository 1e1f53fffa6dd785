//! Group 10 (issue 27): what keeping `fork` out of MKL costs an
//! allocation. `MklAllocator` (the marker the crate chose: a plain store
//! around each MKL call, a `membarrier` on the fork side) against raw
//! `MKL_malloc`/`MKL_free`, and the candidates it was chosen from, each
//! written here around the raw calls exactly as the crate's fast path
//! would run it: the marker with a `SeqCst` fence (what a process without
//! `membarrier` pays), and a shared counter of threads inside MKL updated
//! with atomic read-modify-writes (the Python package's gate). Then what
//! a `fork()` costs the parent (the prepare handler's steps included), in
//! an idle process and while two threads allocate and free 16 B blocks
//! and one reads `manager::stats()` in a loop.

use core::alloc::Layout;
use core::cell::Cell;
use core::ffi::c_int;
use core::hint::black_box;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering, compiler_fence, fence};

use mkl_alloc::{MklAllocator, ffi, manager};

use crate::harness::{Series, interleave, per_op};
use crate::report::Table;
use crate::support::*;

/// A slot on its own cache line, as the crate keeps one per thread.
#[repr(align(64))]
struct Slot(AtomicU32);

static SLOT: Slot = Slot(AtomicU32::new(0));
static GATE: AtomicU32 = AtomicU32::new(0);
/// The counter candidate's word (one shard of the Python gate).
#[repr(align(64))]
struct Counter(AtomicUsize);
static INSIDE: Counter = Counter(AtomicUsize::new(0));

thread_local! {
    static MINE: Cell<*const Slot> = const { Cell::new(core::ptr::null()) };
}

/// The marker protocol around `f`; `FENCE`: a `SeqCst` fence after the
/// store instead of the compiler-only one.
#[inline(always)]
fn marked<const FENCE: bool, T>(f: impl FnOnce() -> T) -> T {
    let mut slot = MINE.get();
    if slot.is_null() {
        slot = &SLOT;
        MINE.set(slot);
    }
    // SAFETY: a pointer to a static.
    let s = unsafe { &*slot };
    s.0.store(1, Ordering::Relaxed);
    if FENCE {
        fence(Ordering::SeqCst);
    } else {
        compiler_fence(Ordering::SeqCst);
    }
    if GATE.load(Ordering::Relaxed) != 0 {
        std::process::abort(); // never: nothing forks here
    }
    let r = f();
    s.0.store(0, Ordering::Release);
    r
}

/// The counter protocol around `f`.
#[inline(always)]
fn counted<T>(f: impl FnOnce() -> T) -> T {
    INSIDE.0.fetch_add(1, Ordering::SeqCst);
    if GATE.load(Ordering::SeqCst) != 0 {
        std::process::abort();
    }
    let r = f();
    INSIDE.0.fetch_sub(1, Ordering::SeqCst);
    r
}

#[inline(never)]
fn raw_marked<const FENCE: bool>(layout: Layout, iters: u64) {
    for _ in 0..iters {
        let l = black_box(layout);
        // SAFETY: a positive size and a power-of-two alignment in a C int.
        let p = marked::<FENCE, _>(|| unsafe { ffi::MKL_malloc(l.size(), l.align() as c_int) });
        black_box(p);
        // SAFETY: p came from MKL_malloc and is freed once.
        marked::<FENCE, _>(|| unsafe { ffi::MKL_free(p) });
    }
}

#[inline(never)]
fn raw_counted(layout: Layout, iters: u64) {
    for _ in 0..iters {
        let l = black_box(layout);
        // SAFETY: as in raw_marked.
        let p = counted(|| unsafe { ffi::MKL_malloc(l.size(), l.align() as c_int) });
        black_box(p);
        // SAFETY: p came from MKL_malloc and is freed once.
        counted(|| unsafe { ffi::MKL_free(p) });
    }
}

pub fn fork_guard_group(t: &mut Table) {
    const ROUNDS: usize = 41;
    for size in [16, 1 << 20] {
        let layout = Layout::from_size_align(size, ALIGN).unwrap();
        let probe = per_op(2000, || alloc_free_raw_mkl(layout, 2000));
        let iters = ((2e6 / probe) as u64).clamp(200, 200_000);
        let series = interleave(
            ROUNDS,
            &mut [
                ("raw MKL_malloc/MKL_free", &mut || {
                    per_op(iters, || alloc_free_raw_mkl(layout, iters))
                }),
                ("MklAllocator (marker + membarrier)", &mut || {
                    per_op(iters, || alloc_free(&MklAllocator, layout, iters))
                }),
                ("raw + marker, compiler fence", &mut || {
                    per_op(iters, || raw_marked::<false>(layout, iters))
                }),
                ("raw + marker, SeqCst fence", &mut || {
                    per_op(iters, || raw_marked::<true>(layout, iters))
                }),
                ("raw + atomic counter", &mut || {
                    per_op(iters, || raw_counted(layout, iters))
                }),
            ],
        );
        let title = format!("10. fork guard: alloc+free {} (align 64)", size_name(size));
        t.group(&title, "ns", &series, 0);
        t.target(
            &format!(
                "MklAllocator with the fork marker ≤ 1.03x raw MKL, {}",
                size_name(size)
            ),
            &series[1],
            &series[0],
            1.03,
        );
    }
}

/// Microseconds of `fork()` in the parent; the child `_exit`s at once and
/// is reaped after the clock stops.
fn fork_us() -> f64 {
    let t0 = std::time::Instant::now();
    // SAFETY: the child only calls _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    let us = t0.elapsed().as_secs_f64() * 1e6;
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: reaps our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    us
}

pub fn fork_cost_group(t: &mut Table) {
    const FORKS: usize = 200;
    // Warm: the setup has run, MKL has an account for this thread.
    drop(allocator_api2::vec::Vec::<u8, _>::with_capacity_in(
        16,
        MklAllocator,
    ));
    let mut idle = Series::new("fork(), idle process");
    for _ in 0..FORKS {
        idle.values.push(fork_us());
    }
    let stop = std::sync::Arc::new(core::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let layout = Layout::from_size_align(16, ALIGN).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    if i == 2 {
                        black_box(manager::stats());
                    } else {
                        alloc_free(&MklAllocator, layout, 64);
                    }
                }
            })
        })
        .collect();
    let mut busy = Series::new("fork(), 2 threads alloc+free 16 B, 1 reads stats()");
    for _ in 0..FORKS {
        busy.values.push(fork_us());
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    t.group("10b. fork() in the parent", "us", &[idle, busy], 0);
}
