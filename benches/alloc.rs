//! Criterion groups 1-3 of issue 4, competitors side by side on one input:
//!
//! 1. `alloc_free/<size>`: one alloc + free at 16 B .. 1 MiB, align 64:
//!    `MklAllocator`, raw `MKL_malloc`/`MKL_free`, `System`, `mimalloc`,
//!    `MklSplitAllocator`.
//! 2. `vec_growth/<n>`: `allocator_api2::vec::Vec<f64, A>` pushed to 10^7
//!    (and 10^8 with `MKL_ALLOC_BENCH_LONG=1`) vs a raw `MKL_realloc`
//!    doubling loop.
//! 3. `hashbrown_insert`: 10^6 inserts, `MklAllocator` vs the default.
//! 4. `huge_pages/...` (issue 10): each MKL row with `mkl_alloc::huge_pages`
//!    off and on, beside `System` and `mimalloc`: `Vec<f64, A>` pushed to
//!    10^7 (and 10^8), first touch of 64 MiB (and 1 GiB) by alloc + write
//!    and alloc_zeroed + write, and with `MKL_ALLOC_BENCH_LONG=1` a random
//!    gather and a daxpy over a touched 1 GiB block.
//!
//! Default runs are short (10 samples, 1 s); `MKL_ALLOC_BENCH_LONG=1` runs
//! criterion's defaults and the 10^8 growth.

mod config;
#[path = "support/mod.rs"]
mod support;

use core::alloc::Layout;
use std::hint::black_box;
use std::time::Duration;

use config::{criterion, long};
use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use mkl_alloc::{MklAllocator, MklSplitAllocator};
use support::*;

fn alloc_free_group(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc_free");
    for size in SIZES {
        let layout = Layout::from_size_align(size, ALIGN).unwrap();
        let name = size_name(size);
        g.bench_with_input(
            BenchmarkId::new("raw MKL_malloc", &name),
            &layout,
            |b, &l| b.iter(|| alloc_free_raw_mkl(l, 1)),
        );
        g.bench_with_input(BenchmarkId::new("MklAllocator", &name), &layout, |b, &l| {
            b.iter(|| alloc_free(&MklAllocator, l, 1))
        });
        g.bench_with_input(
            BenchmarkId::new("MklSplitAllocator", &name),
            &layout,
            |b, &l| b.iter(|| alloc_free(&MklSplitAllocator, l, 1)),
        );
        g.bench_with_input(BenchmarkId::new("System", &name), &layout, |b, &l| {
            b.iter(|| alloc_free(&std::alloc::System, l, 1))
        });
        g.bench_with_input(BenchmarkId::new("mimalloc", &name), &layout, |b, &l| {
            b.iter(|| alloc_free(&mimalloc::MiMalloc, l, 1))
        });
    }
    g.finish();
}

fn vec_growth_group(c: &mut Criterion) {
    let mut g = c.benchmark_group("vec_growth");
    g.sampling_mode(SamplingMode::Flat);
    let sizes: &[usize] = if long() {
        &[10_000_000, 100_000_000]
    } else {
        &[10_000_000]
    };
    for &n in sizes {
        let id = format!("{n}");
        g.bench_with_input(BenchmarkId::new("raw MKL_realloc", &id), &n, |b, &n| {
            b.iter(|| black_box(raw_mkl_realloc_growth(n)))
        });
        g.bench_with_input(BenchmarkId::new("MklAllocator", &id), &n, |b, &n| {
            b.iter(|| black_box(vec_growth(MklAllocator, n)))
        });
        g.bench_with_input(BenchmarkId::new("MklSplitAllocator", &id), &n, |b, &n| {
            b.iter(|| black_box(vec_growth(MklSplitAllocator, n)))
        });
        g.bench_with_input(BenchmarkId::new("System", &id), &n, |b, &n| {
            b.iter(|| black_box(vec_growth(ViaGlobal(std::alloc::System), n)))
        });
        g.bench_with_input(BenchmarkId::new("mimalloc", &id), &n, |b, &n| {
            b.iter(|| black_box(vec_growth(ViaGlobal(mimalloc::MiMalloc), n)))
        });
    }
    g.finish();
}

fn hashbrown_group(c: &mut Criterion) {
    let mut g = c.benchmark_group("hashbrown_insert");
    g.sampling_mode(SamplingMode::Flat);
    let n = 1_000_000u64;
    g.bench_with_input(BenchmarkId::new("default", n), &n, |b, &n| {
        b.iter(|| hashbrown_insert_default(n))
    });
    g.bench_with_input(BenchmarkId::new("MklAllocator", n), &n, |b, &n| {
        b.iter(|| hashbrown_insert(MklAllocator, n))
    });
    g.bench_with_input(BenchmarkId::new("MklSplitAllocator", n), &n, |b, &n| {
        b.iter(|| hashbrown_insert(MklSplitAllocator, n))
    });
    g.finish();
}

/// Runs `f` with the huge-page policy `on` (2 MiB) or off; leaves it off.
fn hp<R>(on: bool, f: impl FnOnce() -> R) -> R {
    set_huge_pages(on);
    let r = f();
    set_huge_pages(false);
    r
}

fn huge_pages_group(c: &mut Criterion) {
    let mut g = c.benchmark_group("huge_pages");
    g.sampling_mode(SamplingMode::Flat);
    let pushes: &[usize] = if long() {
        &[10_000_000, 100_000_000]
    } else {
        &[10_000_000]
    };
    for &n in pushes {
        let id = format!("push {n}");
        for on in [false, true] {
            let name = if on {
                "MklAllocator hp on"
            } else {
                "MklAllocator hp off"
            };
            g.bench_with_input(BenchmarkId::new(name, &id), &n, |b, &n| {
                b.iter(|| hp(on, || black_box(vec_growth(MklAllocator, n))))
            });
        }
        g.bench_with_input(BenchmarkId::new("System", &id), &n, |b, &n| {
            b.iter(|| black_box(vec_growth(ViaGlobal(std::alloc::System), n)))
        });
        g.bench_with_input(BenchmarkId::new("mimalloc", &id), &n, |b, &n| {
            b.iter(|| black_box(vec_growth(ViaGlobal(mimalloc::MiMalloc), n)))
        });
    }
    let blocks: &[usize] = if long() {
        &[64 << 20, 1 << 30]
    } else {
        &[64 << 20]
    };
    for &bytes in blocks {
        for zeroed in [false, true] {
            let id = format!(
                "touch {} {}",
                size_name(bytes),
                if zeroed { "zeroed" } else { "alloc" }
            );
            for on in [false, true] {
                let name = if on {
                    "MklAllocator hp on"
                } else {
                    "MklAllocator hp off"
                };
                g.bench_with_input(BenchmarkId::new(name, &id), &bytes, |b, &n| {
                    b.iter(|| hp(on, || first_touch(&MklAllocator, n, zeroed)))
                });
            }
            g.bench_with_input(BenchmarkId::new("System", &id), &bytes, |b, &n| {
                b.iter(|| first_touch(&ViaGlobal(std::alloc::System), n, zeroed))
            });
            g.bench_with_input(BenchmarkId::new("mimalloc", &id), &bytes, |b, &n| {
                b.iter(|| first_touch(&ViaGlobal(mimalloc::MiMalloc), n, zeroed))
            });
        }
    }
    if long() {
        // Passes over a 1 GiB block touched beforehand (one block at a time).
        let n = (1usize << 30) / 8;
        let mut over = |name: &str, xs: &mut [f64]| {
            g.bench_function(BenchmarkId::new(name, "gather 1 GiB"), |b| {
                b.iter(|| gather(xs, 20_000_000))
            });
            g.bench_function(BenchmarkId::new(name, "daxpy 1 GiB"), |b| {
                b.iter(|| daxpy_halves(xs, 0.5))
            });
        };
        for on in [false, true] {
            let name = if on {
                "MklAllocator hp on"
            } else {
                "MklAllocator hp off"
            };
            let mut block = hp(on, || Filled::new(MklAllocator, n));
            over(name, block.as_mut_slice());
        }
        over(
            "System",
            Filled::new(ViaGlobal(std::alloc::System), n).as_mut_slice(),
        );
        over(
            "mimalloc",
            Filled::new(ViaGlobal(mimalloc::MiMalloc), n).as_mut_slice(),
        );
    }
    g.finish();
}

fn config() -> Criterion {
    criterion(Duration::from_millis(300), Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = alloc_free_group, vec_growth_group, hashbrown_group, huge_pages_group
}
criterion_main!(benches);
