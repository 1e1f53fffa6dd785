//! Groups 1-4, in this process (its environment: the library's defaults
//! unless `MKL_ALLOC_*` variables are set): alloc+free by size and
//! alignment, Vec growth, hashbrown, SharedMklVec views.

use core::alloc::Layout;
use std::hint::black_box;
use std::sync::{Arc, RwLock};

use atomic_refcell::AtomicRefCell;
use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec};

use crate::harness::{interleave, ms, per_op};
use crate::report::Table;
use crate::support::*;

pub fn alloc_free_group(t: &mut Table) {
    const ROUNDS: usize = 41;
    for size in SIZES {
        let layout = Layout::from_size_align(size, ALIGN).unwrap();
        // Calibrate one batch to about 2 ms of raw MKL.
        let probe = per_op(2000, || alloc_free_raw_mkl(layout, 2000));
        let iters = ((2e6 / probe) as u64).clamp(200, 200_000);
        let series = interleave(
            ROUNDS,
            &mut [
                ("raw MKL_malloc/MKL_free", &mut || {
                    per_op(iters, || alloc_free_raw_mkl(layout, iters))
                }),
                ("MklAllocator", &mut || {
                    per_op(iters, || alloc_free(&MklAllocator, layout, iters))
                }),
                ("MklSplitAllocator", &mut || {
                    per_op(iters, || alloc_free(&MklSplitAllocator, layout, iters))
                }),
                ("System", &mut || {
                    per_op(iters, || alloc_free(&std::alloc::System, layout, iters))
                }),
                ("mimalloc", &mut || {
                    per_op(iters, || alloc_free(&mimalloc::MiMalloc, layout, iters))
                }),
                ("jemalloc", &mut || {
                    per_op(iters, || {
                        alloc_free(&tikv_jemallocator::Jemalloc, layout, iters)
                    })
                }),
            ],
        );
        let title = format!("1. alloc+free {} (align 64)", size_name(size));
        t.group(&title, "ns", &series, 0);
        t.target(
            &format!("MklAllocator ≤ 1.03x raw MKL, {}", size_name(size)),
            &series[1],
            &series[0],
            1.03,
        );
    }
}

/// What the split allocator is for: small, ordinarily aligned blocks.
pub fn small_objects_group(t: &mut Table) {
    const ROUNDS: usize = 41;
    for size in [16, 256, 4096] {
        let layout = Layout::from_size_align(size, 8).unwrap();
        let probe = per_op(2000, || alloc_free(&MklAllocator, layout, 2000));
        let iters = ((2e6 / probe) as u64).clamp(200, 200_000);
        let series = interleave(
            ROUNDS,
            &mut [
                ("System", &mut || {
                    per_op(iters, || alloc_free(&std::alloc::System, layout, iters))
                }),
                ("MklAllocator", &mut || {
                    per_op(iters, || alloc_free(&MklAllocator, layout, iters))
                }),
                ("MklSplitAllocator", &mut || {
                    per_op(iters, || alloc_free(&MklSplitAllocator, layout, iters))
                }),
                ("mimalloc", &mut || {
                    per_op(iters, || alloc_free(&mimalloc::MiMalloc, layout, iters))
                }),
                ("jemalloc", &mut || {
                    per_op(iters, || {
                        alloc_free(&tikv_jemallocator::Jemalloc, layout, iters)
                    })
                }),
            ],
        );
        let title = format!("1b. alloc+free {} (align 8)", size_name(size));
        t.group(&title, "ns", &series, 0);
    }
}

pub fn growth_group(t: &mut Table) {
    const ROUNDS: usize = 15;
    const N: usize = 10_000_000;
    let series = interleave(
        ROUNDS,
        &mut [
            ("raw MKL_realloc doubling", &mut || {
                ms(|| {
                    black_box(raw_mkl_realloc_growth(N));
                })
            }),
            ("Vec<f64, MklAllocator>", &mut || {
                ms(|| {
                    black_box(vec_growth(MklAllocator, N));
                })
            }),
            ("Vec<f64, MklSplitAllocator>", &mut || {
                ms(|| {
                    black_box(vec_growth(MklSplitAllocator, N));
                })
            }),
            ("Vec<f64, System>", &mut || {
                ms(|| {
                    black_box(vec_growth(ViaGlobal(std::alloc::System), N));
                })
            }),
            ("Vec<f64, mimalloc>", &mut || {
                ms(|| {
                    black_box(vec_growth(ViaGlobal(mimalloc::MiMalloc), N));
                })
            }),
            ("Vec<f64, jemalloc>", &mut || {
                ms(|| {
                    black_box(vec_growth(ViaGlobal(tikv_jemallocator::Jemalloc), N));
                })
            }),
        ],
    );
    t.group("2. Vec<f64> push to 10^7", "ms", &series, 0);
    t.target(
        "Vec growth with MklAllocator ≤ 1.05x raw MKL_realloc loop",
        &series[1],
        &series[0],
        1.05,
    );
}

pub fn hashbrown_group(t: &mut Table) {
    const ROUNDS: usize = 7;
    const N: u64 = 1_000_000;
    let series = interleave(
        ROUNDS,
        &mut [
            ("default (System)", &mut || {
                ms(|| {
                    black_box(hashbrown_insert_default(N));
                })
            }),
            ("MklAllocator", &mut || {
                ms(|| {
                    black_box(hashbrown_insert(MklAllocator, N));
                })
            }),
            ("MklSplitAllocator", &mut || {
                ms(|| {
                    black_box(hashbrown_insert(MklSplitAllocator, N));
                })
            }),
        ],
    );
    t.group("3. hashbrown insert 10^6 u64", "ms", &series, 0);
}

pub fn views_group(t: &mut Table) {
    const ROUNDS: usize = 31;
    const ITERS: u64 = 200_000;
    let data: Vec<f64> = (0..1024).map(f64::from).collect();
    let shared = SharedMklVec::from_slice(&data);
    let arc = Arc::new(data.clone());
    let lock = RwLock::new(data.clone());
    let cell = AtomicRefCell::new(data);
    for threads in [1, 2] {
        let run = |f: &(dyn Fn(u64) + Sync)| {
            if threads == 1 {
                per_op(ITERS, || f(ITERS))
            } else {
                two_threads(ITERS, f) / ITERS as f64
            }
        };
        let series = interleave(
            ROUNDS,
            &mut [
                ("SharedMklVec view", &mut || run(&|n| view_loop(&shared, n))),
                ("Arc clone+drop", &mut || run(&|n| arc_loop(&arc, n))),
                ("RwLock::try_read", &mut || run(&|n| rwlock_loop(&lock, n))),
                ("AtomicRefCell::try_borrow", &mut || {
                    run(&|n| atomic_refcell_loop(&cell, n))
                }),
            ],
        );
        let mode = if threads == 1 {
            "uncontended"
        } else {
            "2 threads"
        };
        t.group(&format!("4. acquire+release, {mode}"), "ns", &series, 1);
        t.target(
            &format!("view ≤ 1.2x Arc clone+drop, {mode}"),
            &series[0],
            &series[1],
            1.2,
        );
        t.target(
            &format!("view ≤ 1.0x RwLock::try_read, {mode}"),
            &series[0],
            &series[2],
            1.0,
        );
    }
    const N: usize = 10_000_000;
    let series = interleave(
        7,
        &mut [
            ("Vec<f64>::push (System)", &mut || {
                ms(|| {
                    black_box(std_vec_growth(N));
                })
            }),
            ("SharedMklVec::try_push", &mut || {
                ms(|| {
                    black_box(shared_try_push(N));
                })
            }),
        ],
    );
    t.group("4. push to 10^7 f64", "ms", &series, 0);
}
