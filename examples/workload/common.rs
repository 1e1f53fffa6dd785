//! The whole-program workload shared by the `workload_*` examples. Each
//! example is this code with a different `#[global_allocator]` (the global
//! allocator is fixed per binary, so one binary per allocator).
//!
//! Usage: `workload_<alloc> [entries] [service|mixed|numeric] [MiB]`
//! (default 1 000 000, `service`, 8: the numeric work's buffer size). Prints one line, `allocator=<name> entries=<n>
//! time_ms=<wall ms> cpu_ms=<user+sys ms> user_ms=<user ms>
//! peak_rss_kib=<VmHWM> anon_huge_kib=<AnonHugePages at the end>
//! checksum=<n> kind=<kind>`, which `examples/perf/` and
//! `benches/workload.rs` parse.
//!
//! - `service` ([`workload`]): small objects only (maps, strings, JSON).
//! - `numeric` ([`numeric`]): big buffers only: temporaries, growth, zeroed
//!   then filled.
//! - `mixed` ([`mixed`]): the two interleaved, as in a service that also
//!   computes: half the service work in 16 batches, each followed by one
//!   round of the numeric work.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

/// Builds a `BTreeMap<String, Vec<u32>>` of `n` entries, clones and drops it,
/// then makes a serde_json-style mix of small strings (n / 4 small JSON
/// documents built, serialised and mostly dropped). Returns a checksum.
pub fn workload(n: usize) -> u64 {
    let mut map: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for i in 0..n as u64 {
        let key = format!("key-{:x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let val: Vec<u32> = (0..(i % 9) as u32).map(|j| j ^ i as u32).collect();
        map.insert(key, val);
    }
    let copy = map.clone();
    let mut sum = copy.values().map(|v| v.len() as u64).sum::<u64>();
    drop(copy);
    drop(map);

    let mut kept: Vec<String> = Vec::new();
    for i in 0..(n / 4) as u64 {
        let doc = serde_json::json!({
            "id": i,
            "name": format!("user{i}"),
            "tags": ["a", format!("t{}", i % 17), "long-tag-value"],
            "score": i as f64 * 0.5,
        });
        let text = doc.to_string();
        sum += text.len() as u64;
        if i % 10 == 0 {
            kept.push(text);
        }
    }
    sum += kept.len() as u64;
    black_box(sum)
}

/// Rounds of numeric work in [`mixed`] and [`numeric`].
const NUMERIC_ROUNDS: u64 = 16;

/// One round of numeric big-buffer work at `mib` MiB (8 by default): an
/// input of `mib` MiB, four temporaries of `mib` MiB (an `a * x + y` each,
/// summed), a `Vec<f64>` pushed to `mib` MiB (grown by doubling), and a
/// `vec![0.0; n]` of twice `mib` filled afterwards. Returns a checksum.
pub fn numeric_round(round: u64, mib: usize) -> u64 {
    let n: usize = mib << 17;
    let x: Vec<f64> = (0..n).map(|i| (i as u64 ^ round) as f64).collect();
    let mut acc = 0.0f64;
    for k in 0..4 {
        let a = (k + 1) as f64 * 0.5;
        let t: Vec<f64> = x.iter().map(|&v| a * v + 1.0).collect();
        acc += black_box(&t)[n / 2 + k];
    }
    let mut grown: Vec<f64> = Vec::new();
    for i in 0..n {
        grown.push(i as f64);
    }
    acc += black_box(&grown)[n - 1];
    let mut z = vec![0.0f64; 2 * n];
    for (i, v) in z.iter_mut().enumerate() {
        *v = (i % 7) as f64;
    }
    acc += black_box(&z)[2 * n - 1];
    acc as u64
}

/// The numeric work alone: [`NUMERIC_ROUNDS`] rounds.
pub fn numeric(mib: usize) -> u64 {
    let sum = (0..NUMERIC_ROUNDS)
        .map(|r| numeric_round(r, mib))
        .sum::<u64>();
    black_box(sum)
}

/// Service work and numeric work interleaved: `n / 2` entries of the
/// service work in [`NUMERIC_ROUNDS`] batches, each followed by a round of
/// numeric work.
pub fn mixed(n: usize, mib: usize) -> u64 {
    let batch = n / 2 / NUMERIC_ROUNDS as usize;
    let mut sum = 0u64;
    for r in 0..NUMERIC_ROUNDS {
        sum = sum.wrapping_add(workload(batch));
        sum = sum.wrapping_add(numeric_round(r, mib));
    }
    black_box(sum)
}

/// The value in KiB of the line `key:` of a `/proc/self` file (`status`,
/// `smaps_rollup`); 0 where it cannot be read.
fn proc_kib(file: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/self/{file}"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Peak resident set size of this process, in KiB (`VmHWM`).
pub fn peak_rss_kib() -> u64 {
    proc_kib("status", "VmHWM")
}

/// The anonymous memory on transparent huge pages now, in KiB
/// (`AnonHugePages` of `/proc/self/smaps_rollup`; 0 where it cannot be read).
/// The same work on a heap with fewer huge pages takes more TLB misses, which
/// instruction counts do not show.
pub fn anon_huge_kib() -> u64 {
    proc_kib("smaps_rollup", "AnonHugePages")
}

/// This process's CPU time in milliseconds: (user + system, user).
/// The system part of the service workload is mostly the kernel's
/// huge-page work for the small side's heap, which varies from run to run
/// far more than anything an allocator decides (0.02 to 0.93 s over three
/// runs of mimalloc alone, for the same 2.1 s of user time).
pub fn cpu_ms() -> (f64, f64) {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage through a valid pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage failed");
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    (tv(ru.ru_utime) + tv(ru.ru_stime), tv(ru.ru_utime))
}

/// Runs the workload with the entry count from the command line and prints
/// the result line.
pub fn main_for(allocator: &str) {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("entries: a positive integer"))
        .unwrap_or(1_000_000);
    let kind = std::env::args().nth(2).unwrap_or_else(|| "service".into());
    let mib: usize = std::env::args()
        .nth(3)
        .map(|a| a.parse().expect("buffer MiB: a positive integer"))
        .unwrap_or(8);
    assert!(mib > 0, "buffer MiB: a positive integer, not 0");
    let start = cpu_ms();
    let t = Instant::now();
    let sum = match kind.as_str() {
        "service" => workload(n),
        "mixed" => mixed(n, mib),
        "numeric" => numeric(mib),
        other => panic!("kind: service, mixed or numeric, not {other:?}"),
    };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let end = cpu_ms();
    let (cpu, user) = (end.0 - start.0, end.1 - start.1);
    let huge = anon_huge_kib();
    println!(
        "allocator={allocator} entries={n} time_ms={ms:.3} cpu_ms={cpu:.3} user_ms={user:.3} peak_rss_kib={} anon_huge_kib={huge} checksum={sum} kind={kind}",
        peak_rss_kib()
    );
}
