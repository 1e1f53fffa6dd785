//! Criterion group 5 of issue 4: the whole-program workload
//! (`examples/workload/common.rs`), one binary per global allocator
//! (System, mimalloc, MklAllocator, MklSplitAllocator, the split over
//! mimalloc and over jemalloc), run as child
//! processes; the time measured is the one each child reports for its
//! workload (process start-up excluded). Peak RSS is reported by
//! `cargo run --release --example perf`, not here.
//!
//! `cargo bench` does not build examples: run `cargo build --release
//! --examples` first (the binaries are looked up in `target/release/examples`
//! next to this bench's `target/release/deps`); missing binaries are
//! reported and skipped. Short runs use 10^5 entries; `MKL_ALLOC_BENCH_LONG=1`
//! uses 10^6.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};

mod config;
use config::{criterion, long};

fn binary(name: &str) -> Option<PathBuf> {
    // target/<profile>/deps/workload-<hash> -> target/<profile>/examples/
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let candidates = [
        profile_dir.to_path_buf(),
        profile_dir.parent()?.join("release"),
    ];
    candidates
        .iter()
        .map(|d| {
            d.join("examples")
                .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
        })
        .find(|p| p.exists())
}

/// Runs a workload binary; returns the workload time it reports.
fn run(bin: &PathBuf, entries: usize) -> Duration {
    let out = Command::new(bin)
        .arg(entries.to_string())
        .output()
        .expect("run workload binary");
    assert!(out.status.success(), "{} failed", bin.display());
    let line = String::from_utf8_lossy(&out.stdout);
    let ms: f64 = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("time_ms="))
        .and_then(|v| v.parse().ok())
        .expect("time_ms in the workload's output");
    Duration::from_secs_f64(ms / 1e3)
}

fn workload_group(c: &mut Criterion) {
    let entries = if long() { 1_000_000 } else { 100_000 };
    let mut g = c.benchmark_group("workload");
    g.sampling_mode(SamplingMode::Flat);
    for (name, label) in [
        ("workload_system", "System"),
        ("workload_mimalloc", "mimalloc"),
        ("workload_mkl", "MklAllocator"),
        ("workload_split", "MklSplitAllocator"),
        ("workload_split_mimalloc", "MklSplitAllocator over mimalloc"),
        ("workload_split_jemalloc", "MklSplitAllocator over jemalloc"),
    ] {
        let Some(bin) = binary(name) else {
            eprintln!(
                "workload: {name} not found; run `cargo build --release --examples` first (skipped)"
            );
            continue;
        };
        g.bench_function(BenchmarkId::new(label, entries), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| run(&bin, entries)).sum())
        });
    }
    g.finish();
}

fn config() -> Criterion {
    // Whole programs: 10 samples even in a long run.
    criterion(Duration::from_millis(200), Duration::from_secs(2)).sample_size(10)
}

criterion_group! {
    name = benches;
    config = config();
    targets = workload_group
}
criterion_main!(benches);
