//! How perf measures: interleaved rounds in shuffled orders, the clocks,
//! resident memory, and the child processes that run one measurement
//! under a chosen environment.

use std::path::PathBuf;
use std::process::Command;

use crate::support::median;

/// One measured competitor: its per-round values (ns per op, ms, MiB).
#[derive(Clone)]
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

impl Series {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            values: vec![],
        }
    }
}

/// A fresh order of `k` competitors for round `r`: a Fisher-Yates shuffle
/// driven by a fixed xorshift sequence, so no competitor always follows the
/// same neighbour (an allocator leaves caches and freed memory behind for
/// the next one) and every run of perf uses the same orders.
pub fn order(k: usize, r: usize) -> Vec<usize> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (r as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut o: Vec<usize> = (0..k).collect();
    for i in (1..k).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        o.swap(i, (x % (i as u64 + 1)) as usize);
    }
    o
}

/// A competitor of [`interleave`]: its name and one measurement.
pub type Competitor<'a> = (&'a str, &'a mut dyn FnMut() -> f64);

/// Runs `rounds` interleaved rounds (plus one warm-up) of the competitors,
/// each round in its own order.
pub fn interleave(rounds: usize, competitors: &mut [Competitor<'_>]) -> Vec<Series> {
    let k = competitors.len();
    let mut out: Vec<Series> = competitors.iter().map(|(n, _)| Series::new(n)).collect();
    for r in 0..=rounds {
        for i in order(k, r) {
            let v = (competitors[i].1)();
            if r > 0 {
                out[i].values.push(v);
            }
        }
    }
    out
}

/// A competitor of [`interleave_multi`]: several values per run.
pub type MultiCompetitor<'a> = (&'a str, &'a mut dyn FnMut() -> Vec<f64>);

/// As [`interleave`], for competitors that measure `metrics` values per
/// run (e.g. first touch, then a pass over the same block): the result is
/// indexed `[metric][competitor]`. `warm_up: false` keeps every round
/// (runs in fresh child processes have nothing to warm).
pub fn interleave_multi(
    rounds: usize,
    metrics: usize,
    warm_up: bool,
    competitors: &mut [MultiCompetitor<'_>],
) -> Vec<Vec<Series>> {
    let k = competitors.len();
    let mut out: Vec<Vec<Series>> = (0..metrics)
        .map(|_| competitors.iter().map(|(n, _)| Series::new(n)).collect())
        .collect();
    let first = usize::from(!warm_up);
    for r in first..=rounds {
        for i in order(k, r) {
            let v = (competitors[i].1)();
            assert_eq!(v.len(), metrics);
            if r > 0 {
                for (m, x) in v.into_iter().enumerate() {
                    out[m][i].values.push(x);
                }
            }
        }
    }
    out
}

pub fn med(s: &Series) -> f64 {
    median(&mut s.values.clone())
}

/// The per-round ratios a/b (rounds where both ran: the first
/// `min(len)` values, which interleaving keeps paired).
pub fn ratios(a: &Series, b: &Series) -> Vec<f64> {
    a.values.iter().zip(&b.values).map(|(x, y)| x / y).collect()
}

/// Median of the per-round ratios a/b.
pub fn ratio(a: &Series, b: &Series) -> f64 {
    median(&mut ratios(a, b))
}

/// Median of the per-round differences a - b.
pub fn difference(a: &Series, b: &Series) -> f64 {
    let mut d: Vec<f64> = a.values.iter().zip(&b.values).map(|(x, y)| x - y).collect();
    median(&mut d)
}

/// This thread's CPU time (user + system) in nanoseconds. Single-threaded
/// rows are timed with it, so time the shared machine gives to other
/// processes does not count; page faults and system calls made by the
/// code measured do.
pub fn thread_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

/// This process's CPU time (user + system of every thread, `getrusage`)
/// in nanoseconds: for rows where an allocator's own thread, if it runs
/// one, must count too.
pub fn process_cpu_ns() -> f64 {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: getrusage writes one rusage through a valid pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage(RUSAGE_SELF) failed");
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e9 + t.tv_usec as f64 * 1e3;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Times `f` once (thread CPU time), in nanoseconds per op.
pub fn per_op(iters: u64, f: impl FnOnce()) -> f64 {
    let t = thread_cpu_ns();
    f();
    (thread_cpu_ns() - t) / iters as f64
}

/// Times `f` once (thread CPU time), in milliseconds.
pub fn ms(f: impl FnOnce()) -> f64 {
    let t = thread_cpu_ns();
    f();
    (thread_cpu_ns() - t) / 1e6
}

/// This process's resident set in MiB (`/proc/self/statm`, huge pages
/// included at their full size).
pub fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm's resident field");
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    pages * page / (1024.0 * 1024.0)
}

/// The environment a child process runs in, as far as mkl-alloc reads it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Env {
    /// Every `MKL_ALLOC_*` variable removed: the library's defaults.
    Defaults,
    /// `MKL_ALLOC_BLOCK_CACHE=off MKL_ALLOC_HUGE_PAGES=off`, nothing else.
    AllOff,
    /// `MKL_ALLOC_BACKING=off`, nothing else: MKL's memory pointers left
    /// alone (MKL on glibc).
    BackingOff,
    /// `MKL_ALLOC_MEDIUM=off`, nothing else: blocks below 1 MiB on the C
    /// runtime beneath MKL.
    MediumOff,
}

/// Sets `cmd`'s environment to `env`: every `MKL_ALLOC_*` variable of
/// ours is removed first, whatever the parent was started with.
pub fn apply_env(cmd: &mut Command, env: Env) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MKL_ALLOC_") {
            cmd.env_remove(&k);
        }
    }
    match env {
        Env::Defaults => {}
        Env::AllOff => {
            cmd.env("MKL_ALLOC_BLOCK_CACHE", "off");
            cmd.env("MKL_ALLOC_HUGE_PAGES", "off");
        }
        Env::BackingOff => {
            cmd.env("MKL_ALLOC_BACKING", "off");
        }
        Env::MediumOff => {
            cmd.env("MKL_ALLOC_MEDIUM", "off");
        }
    }
}

/// perf's own executable, re-run for child measurements.
pub fn own_exe() -> PathBuf {
    std::env::current_exe().expect("perf's own path")
}

/// Runs `perf --child <args…>` in `env` and returns the `key=value` pairs
/// of its one line of output.
pub fn child(env: Env, args: &[String]) -> Vec<(String, f64)> {
    let mut cmd = Command::new(own_exe());
    cmd.arg("--child").args(args);
    apply_env(&mut cmd, env);
    let out = cmd.output().expect("run a perf child");
    assert!(
        out.status.success(),
        "perf child {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_fields(&String::from_utf8_lossy(&out.stdout))
}

/// `k=v` pairs of a line (values that are not numbers are left out).
pub fn parse_fields(line: &str) -> Vec<(String, f64)> {
    line.split_whitespace()
        .filter_map(|f| {
            let (k, v) = f.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The value of `key` in `fields`; panics with the fields if it is missing.
pub fn field(fields: &[(String, f64)], key: &str) -> f64 {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {key} in {fields:?}"))
}
