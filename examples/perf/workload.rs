//! Group 5: the whole-program workload, one binary per global allocator
//! (`examples/workload_*.rs`), each run a fresh process.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{Env, Series, apply_env, field, med, order, parse_fields};
use crate::report::Table;

const WORKLOADS: [&str; 7] = [
    "system",
    "mimalloc",
    "mkl",
    "split",
    "jemalloc",
    "split_mimalloc",
    "split_jemalloc",
];

/// The workload binaries next to this executable; built with the cargo that
/// ran us if they are missing.
fn workload_binaries() -> Option<Vec<PathBuf>> {
    let dir = std::env::current_exe().ok()?.parent()?.to_path_buf();
    let paths: Vec<PathBuf> = WORKLOADS
        .iter()
        .map(|w| dir.join(format!("workload_{w}{}", std::env::consts::EXE_SUFFIX)))
        .collect();
    if paths.iter().all(|p| p.exists()) {
        return Some(paths);
    }
    if let Ok(cargo) = std::env::var("CARGO") {
        eprintln!("perf: building the workload_* examples with {cargo} …");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--release", "--manifest-path"])
            .arg(manifest);
        // `cargo run` gave us the package's OUT_DIR, CARGO_PKG_* &c.; passed
        // on, build scripts that watch them (ring's does) would rebuild half
        // the tree, here and again in the next ordinary build.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_CFG_")
                || [
                    "OUT_DIR",
                    "CARGO_MANIFEST_LINKS",
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_BIN_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_RUSTC_CURRENT_DIR",
                ]
                .contains(&&*k)
            {
                cmd.env_remove(&*k);
            }
        }
        for w in WORKLOADS {
            cmd.args(["--example", &format!("workload_{w}")]);
        }
        let ok = cmd.status().map(|s| s.success()).unwrap_or(false);
        if ok && paths.iter().all(|p| p.exists()) {
            return Some(paths);
        }
    }
    eprintln!(
        "perf: the workload binaries are missing from {}; build them with\n    \
         cargo build --release --examples\nthen run perf again.",
        dir.display()
    );
    None
}

/// Runs one workload binary in `env` (`kind`: service, mixed or numeric;
/// `mib`: the numeric work's buffer size); returns (CPU ms, wall ms, peak
/// RSS in KiB, user CPU ms).
fn run_workload(
    bin: &Path,
    env: Env,
    entries: usize,
    kind: &str,
    mib: usize,
) -> (f64, f64, f64, f64) {
    let mut cmd = Command::new(bin);
    cmd.arg(entries.to_string()).arg(kind).arg(mib.to_string());
    apply_env(&mut cmd, env);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(out.status.success(), "{} failed", bin.display());
    let f = parse_fields(&String::from_utf8_lossy(&out.stdout));
    (
        field(&f, "cpu_ms"),
        field(&f, "time_ms"),
        field(&f, "peak_rss_kib"),
        field(&f, "user_ms"),
    )
}

/// The whole program under each global allocator: System, mimalloc, jemalloc,
/// MklSplitAllocator with the library's defaults and with everything off
/// (issue 21's configurations), the split over mimalloc and over jemalloc
/// (issue 36), and MklAllocator with the defaults; then the mixed workload
/// (service and numeric work interleaved) and the numeric work alone
/// ([`mixed_group`]).
pub fn workload_group(t: &mut Table) {
    // Eleven rounds: one round's ratios spread by ±25 % on a shared 2-core
    // VM, so five rounds' medians moved a target by 0.1 from run to run.
    const ROUNDS: usize = 11;
    const OTHER_ROUNDS: usize = 2;
    const ENTRIES: usize = 1_000_000;
    let Some(bins) = workload_binaries() else {
        let missing = Series::new("(not run: workload binaries missing)");
        t.group("5. workload", "ms", &[missing], 0);
        return;
    };
    // (name, binary: index into WORKLOADS, environment)
    let who = [
        ("System", 0, Env::Defaults),
        ("mimalloc", 1, Env::Defaults),
        (SPLIT_DEFAULTS, 3, Env::Defaults),
        (SPLIT_OFF, 3, Env::AllOff),
        ("MklAllocator, MKL defaults", 2, Env::Defaults),
        ("jemalloc", 4, Env::Defaults),
        (SPLIT_MIMALLOC, 5, Env::Defaults),
        (SPLIT_JEMALLOC, 6, Env::Defaults),
    ];
    let new = || -> Vec<Series> { who.iter().map(|w| Series::new(w.0)).collect() };
    let (mut times, mut walls, mut rss, mut users) = (new(), new(), new(), new());
    // No warm-up round: each run is a fresh process (the binaries are in
    // the page cache after the first). The ones the targets compare run
    // in every round (System and the split; mimalloc, jemalloc and the
    // split over each); the split with everything off and pure MKL in the
    // first OTHER_ROUNDS only, to stay near three minutes.
    for r in 0..ROUNDS {
        let these: &[usize] = if r < OTHER_ROUNDS {
            &[0, 1, 2, 3, 4, 5, 6, 7]
        } else {
            &[0, 1, 2, 5, 6, 7]
        };
        for j in order(these.len(), r) {
            let i = these[j];
            let (_, bin, env) = who[i];
            let (cpu, wall, kib, user) = run_workload(&bins[bin], env, ENTRIES, "service", 8);
            times[i].values.push(cpu);
            users[i].values.push(user);
            walls[i].values.push(wall);
            rss[i].values.push(kib / 1024.0);
        }
    }
    t.group("5. workload CPU time (10^6 entries)", "ms", &times, 0);
    // User time apart: the system time of this workload is mostly the
    // kernel's huge-page work for the small side's heap, which swings from
    // run to run (see `cpu_ms` in examples/workload/common.rs).
    t.group("5. workload user CPU time", "ms", &users, 0);
    t.group("5. workload wall time", "ms", &walls, 0);
    t.group("5. workload peak RSS", "MiB", &rss, 0);
    t.target(
        "workload CPU time ≤ 1.05x System (split, MKL defaults)",
        &times[2],
        &times[0],
        1.05,
    );
    t.target(
        "workload peak RSS ≤ 1.1x System (split, MKL defaults)",
        &rss[2],
        &rss[0],
        1.1,
    );
    t.target(
        "workload CPU time ≤ 1.05x mimalloc (split over mimalloc)",
        &times[6],
        &times[1],
        1.05,
    );
    t.target(
        "workload CPU time ≤ 1.05x jemalloc (split over jemalloc)",
        &times[7],
        &times[5],
        1.05,
    );
    t.target(
        "workload user CPU time ≤ 1.05x mimalloc (split over mimalloc)",
        &users[6],
        &users[1],
        1.05,
    );
    t.target(
        "workload user CPU time ≤ 1.05x jemalloc (split over jemalloc)",
        &users[7],
        &users[5],
        1.05,
    );
    // The numeric rounds at two scales: 8 MiB buffers, which mimalloc
    // keeps and reuses; and 64 MiB, the big-buffer rows' size (the config
    // group's temporaries), which glibc and jemalloc fault in afresh.
    mixed_group(t, &bins, 8, 11);
    mixed_group(t, &bins, 64, 7);
}

/// The mixed workload (`workload_* N mixed MiB`: service batches
/// interleaved with numeric rounds of temporaries, growth and
/// zeroed-then-filled buffers of `mib` MiB) under every competitor, and the
/// numeric work alone under the three splits (`workload_* N numeric MiB`),
/// each run a fresh process, all in every one of `rounds` rounds.
fn mixed_group(t: &mut Table, bins: &[PathBuf], mib: usize, rounds: usize) {
    const ENTRIES: usize = 1_000_000;
    // (name, binary: index into WORKLOADS)
    let who = [
        ("System", 0),
        ("mimalloc", 1),
        ("jemalloc", 4),
        (SPLIT_DEFAULTS, 3),
        (SPLIT_MIMALLOC, 5),
        (SPLIT_JEMALLOC, 6),
        ("MklAllocator, MKL defaults", 2),
    ];
    // The numeric work alone: the three splits (indices into `who`).
    let numeric_who = [3, 4, 5];
    let new =
        |names: &mut dyn Iterator<Item = &str>| -> Vec<Series> { names.map(Series::new).collect() };
    let (mut times, mut rss) = (
        new(&mut who.iter().map(|w| w.0)),
        new(&mut who.iter().map(|w| w.0)),
    );
    let mut numeric = new(&mut numeric_who.iter().map(|&i| who[i].0));
    for r in 0..rounds {
        // One shuffled order over both kinds of run.
        let runs = who.len() + numeric_who.len();
        for j in order(runs, r) {
            if j < who.len() {
                let (_, bin) = who[j];
                let (cpu, _, kib, _) =
                    run_workload(&bins[bin], Env::Defaults, ENTRIES, "mixed", mib);
                times[j].values.push(cpu);
                rss[j].values.push(kib / 1024.0);
            } else {
                let k = j - who.len();
                let (_, bin) = who[numeric_who[k]];
                let (cpu, _, _, _) =
                    run_workload(&bins[bin], Env::Defaults, ENTRIES, "numeric", mib);
                numeric[k].values.push(cpu);
            }
        }
    }
    t.group(
        &format!("5. mixed workload CPU time (10^6 entries, {mib} MiB buffers)"),
        "ms",
        &times,
        0,
    );
    t.group(
        &format!("5. mixed workload peak RSS ({mib} MiB buffers)"),
        "MiB",
        &rss,
        0,
    );
    t.group(
        &format!("5. numeric work CPU time ({mib} MiB buffers)"),
        "ms",
        &numeric,
        0,
    );
    for (k, over) in [(1, "mimalloc"), (2, "jemalloc")] {
        t.target(
            &format!(
                "numeric work CPU time ≤ 1.05x the split over System (split over {over}, {mib} MiB)"
            ),
            &numeric[k],
            &numeric[0],
            1.05,
        );
    }
    // The best split (by median CPU time) against the best peer alone.
    let best = |ix: &[usize]| -> usize {
        *ix.iter()
            .min_by(|&&a, &&b| med(&times[a]).total_cmp(&med(&times[b])))
            .unwrap()
    };
    let (split, peer) = (best(&[3, 4, 5]), best(&[0, 1, 2]));
    t.target(
        &format!(
            "mixed workload CPU time ≤ 0.9x the best peer alone, {mib} MiB ({} / {})",
            who[split].0, who[peer].0
        ),
        &times[split],
        &times[peer],
        0.9,
    );
    t.target(
        &format!(
            "mixed workload peak RSS ≤ 1.1x the best peer alone, {mib} MiB ({} / {})",
            who[split].0, who[peer].0
        ),
        &rss[split],
        &rss[peer],
        1.1,
    );
}

const SPLIT_DEFAULTS: &str = "MklSplitAllocator, MKL defaults";
const SPLIT_OFF: &str = "MklSplitAllocator, MKL everything off";
const SPLIT_MIMALLOC: &str = "MklSplitAllocator<MiMalloc>, MKL defaults";
const SPLIT_JEMALLOC: &str = "MklSplitAllocator<Jemalloc>, MKL defaults";
