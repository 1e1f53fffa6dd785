//! Criterion group 4 of issue 4: `SharedMklVec` view acquire + release vs
//! `Arc::clone` + drop, `RwLock::try_read` and `AtomicRefCell::try_borrow`,
//! uncontended and with 2 threads on one value; and `try_push` growth vs
//! `Vec::push`, with `mkl_alloc::huge_pages` off and on. Short by default; `MKL_ALLOC_BENCH_LONG=1` for criterion's
//! defaults.

mod config;
#[path = "support/mod.rs"]
mod support;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use atomic_refcell::AtomicRefCell;
use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use mkl_alloc::SharedMklVec;
use support::*;

fn views_group(c: &mut Criterion) {
    let data: Vec<f64> = (0..1024).map(f64::from).collect();
    let shared = SharedMklVec::from_slice(&data);
    let arc = Arc::new(data.clone());
    let lock = RwLock::new(data.clone());
    let cell = AtomicRefCell::new(data);
    let kernels: [(&str, &(dyn Fn(u64) + Sync)); 4] = [
        ("SharedMklVec view", &|n| view_loop(&shared, n)),
        ("Arc clone+drop", &|n| arc_loop(&arc, n)),
        ("RwLock try_read", &|n| rwlock_loop(&lock, n)),
        ("AtomicRefCell try_borrow", &|n| {
            atomic_refcell_loop(&cell, n)
        }),
    ];
    let mut g = c.benchmark_group("view_acquire_release");
    for (name, f) in kernels {
        g.bench_function(BenchmarkId::new(name, "uncontended"), |b| b.iter(|| f(1)));
        // Two threads on one value: each iteration of the sample is one op
        // per thread; time per op is the mean per-thread wall time.
        g.bench_function(BenchmarkId::new(name, "2 threads"), |b| {
            b.iter_custom(|iters| Duration::from_nanos(two_threads(iters, f) as u64))
        });
    }
    g.finish();
}

fn push_group(c: &mut Criterion) {
    let mut g = c.benchmark_group("push_growth");
    g.sampling_mode(SamplingMode::Flat);
    let n = 10_000_000usize;
    g.bench_with_input(BenchmarkId::new("Vec::push", n), &n, |b, &n| {
        b.iter(|| std_vec_growth(n))
    });
    g.bench_with_input(
        BenchmarkId::new("SharedMklVec::try_push", n),
        &n,
        |b, &n| b.iter(|| shared_try_push(n)),
    );
    // Issue 10: the same growth with `mkl_alloc::huge_pages` on (2 MiB).
    g.bench_with_input(
        BenchmarkId::new("SharedMklVec::try_push hp on", n),
        &n,
        |b, &n| {
            set_huge_pages(true);
            b.iter(|| shared_try_push(n));
            set_huge_pages(false);
        },
    );
    g.finish();
}

fn config() -> Criterion {
    config::criterion(Duration::from_millis(300), Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = views_group, push_group
}
criterion_main!(benches);
