//! The quick performance table of issues 4, 10, 15 and 21: the criterion
//! workloads and more, run briefly, with competitors interleaved round by
//! round so every ratio comes from one run on one machine state.
//!
//! ```text
//! cargo build --release --examples      # builds perf and the workload_* binaries
//! cargo run --release --example perf    # every group: 15-21 minutes on 2 shared cores
//! cargo run --release --example perf -- --json docs/data/perf.json \
//!     config workload > docs/data/perf.md   # big-buffers and small-blocks charts (13-19 minutes)
//! cargo run --release --example perf -- --json docs/data/workload.json \
//!     workload > docs/data/workload.md      # the whole-program chart (8-10 minutes)
//! python3 scripts/charts.py             # redraws docs/charts/*.svg (see its header)
//! ```
//!
//! perf prints a markdown table of rows (each competitor's median, and its
//! ratio to the group's baseline) and a table of targets ("met" or
//! "missed"), and writes the same rows and targets, with the machine (CPU
//! model, logical cores, THP mode, kernel, glibc, rustc, date, git commit,
//! load average), as JSON to `--json PATH` (default:
//! `target/perf/results.json` beside the binary's `target/`).
//! `scripts/charts.py` draws docs/charts/*.svg from that JSON.
//!
//! `perf -- <word>…` runs only the groups whose names contain one of the
//! words (`--json PATH` may come anywhere); a word no group's name
//! contains, or an unknown option, is an error, and `perf -- --help`
//! prints the usage and the groups, running and writing nothing. The groups, with their rows'
//! numbers and times measured on the shared 2-core machine at a load
//! average of 13 (2026-12-01; jemalloc's rows and group 30 at 6-10):
//!
//! | Group | Rows | What | Time |
//! |---|---|---|---|
//! | alloc+free | 1 | alloc+free 16 B .. 1 MiB, align 64: MklAllocator, MklSplitAllocator, System, mimalloc, jemalloc against raw MKL_malloc/MKL_free | 4-5 s |
//! | small objects | 1b | alloc+free 16 B .. 4 KiB, align 8 (the split allocator's case) | 1-2 s |
//! | Vec growth | 2 | Vec<f64> push to 10^7 under each allocator, against a raw MKL_realloc loop | 14-20 s |
//! | hashbrown | 3 | 10^6 inserts | 5 s |
//! | views | 4 | SharedMklVec views against Arc, RwLock, AtomicRefCell (1 and 2 threads); try_push | 6 s |
//! | workload | 5 | the whole program (`examples/workload_*.rs`) under each global allocator, each run a fresh process: System, mimalloc, jemalloc, MklSplitAllocator with MKL defaults and with everything off, the split over mimalloc and over jemalloc, MklAllocator; the mixed workload (service batches and numeric rounds interleaved, with buffers of 8 MiB and of 64 MiB) under each of them but the split with everything off, and the numeric work alone under the three splits; 11 rounds (7 for 64 MiB) | 8-10 min |
//! | huge pages | 6 | issue 10: Vec push 10^7 and first touch of 64 MiB, huge pages off / on via the API | 26-30 s |
//! | huge 1GiB | 7 | push to 10^8 and 1 GiB blocks (first touch, gather, daxpy) | 1.5-2 min |
//! | huge 1GiB reuse | 7b | 1 GiB first touch after a pause and right after a free | 50-55 s |
//! | huge stall | 8 | 256 MiB alloc+touch in fresh processes, three machine states | 30 s |
//! | block cache | 9 | issue 15: the cache switched via the API in this process | 2-3 min |
//! | config small blocks | 21 | alloc+free 16 B .. 1 MiB, align 64, in fresh processes: MklAllocator with MKL defaults and with everything off, raw MKL, System, mimalloc, jemalloc | 25-45 s |
//! | config big buffers | 21 | 8 x 64 MiB temporaries; Vec push to 10^7 (the second push of a process, and the first); `vec![0.0f64; 1 << 26]` untouched (time, resident growth), zeroed then filled, 1% of pages written (time, resident growth) | 1-4 min |
//! | config push 10^8 | 21 | Vec push to 10^8, the second push of a process (and the first) | 1.5-2.5 min |
//! | fork guard | 10 | issue 27: alloc+free 16 B and 1 MiB, MklAllocator (with its fork marker) against raw MKL and the candidate markers (SeqCst fence, atomic counter) | 3 s |
//! | fork cost | 10b | issue 27: fork() in the parent, idle and while threads allocate and read stats() | 1-60 s |
//! | config backing off | 30 | MKL's memory pointers set (MKL defaults, everything off) against unset (`MKL_ALLOC_BACKING=off`), fresh processes: raw MKL_malloc/MKL_free 16 B and 1 MiB; `LAPACKE_dgesvd` 1000 x 1000 and a DFTI FFT of 2^22 complex doubles, repeated and first call | 2 min |
//! | medium churn | 42 | issue 42: a window of 2,000 live blocks, log-uniform 4 KiB-1 MiB, each step frees one at random and allocates one (a byte written per 4 KiB): System, jemalloc, mimalloc, MklAllocator, MklSplitAllocator in this process, process CPU time per step, 21 rounds | 45-80 s |
//! | medium retention | 42 | issue 42: 1 GiB of 48 KiB, 160 KiB or log-uniform 4 KiB-1 MiB blocks with a 32 B block kept after every second, all freed, 2 s idle, one 32 B alloc: resident beyond the start, a fresh child per allocator: System, jemalloc, mimalloc, MklSplitAllocator, MklAllocator, the two MKL ones with one 64 KiB alloc after instead, and with `mkl_alloc::background::start()` and no alloc after (`PERF_RETENTION_MIB=256` for a quick look) | 2-2.5 min |
//! | medium footprint | 54 | issue 54: 64 MiB of live blocks of 4096, 4097, 8192, 16384 B (and 4200, 33000: just above a class), every byte written: resident growth over the bytes asked, a fresh child per allocator: System, jemalloc, mimalloc, MklAllocator, MklSplitAllocator, MklAllocator with `MKL_ALLOC_MEDIUM=off`, 3 rounds | 20-40 s |
//! | medium sawtooth | 54 | issue 54: a working set of 300 blocks of 48 KiB freed, 20,000 alloc+free pairs of 16 B (timed, process CPU per pair), the 300 reallocated, 40 times: System, MklSplitAllocator and MklAllocator, the MKL ones also with `MKL_ALLOC_MEDIUM=off`, a fresh child each, 21 rounds | 15 s |
//! | medium same-size churn | 54 | issue 54: 1, 2 or 8 threads, each a window of 32 blocks of 4 KiB, 48 KiB or 256 KiB, free one + alloc one (a byte written per 4 KiB): System, jemalloc, mimalloc, MklAllocator, MklSplitAllocator, the MKL ones also with `MKL_ALLOC_MEDIUM=off`, a fresh child each, process CPU per step, 5 rounds | 2-4 min |
//!
//! Configurations (issue 21). The `config` groups and the workload group
//! run every measurement in a fresh child process: perf re-runs itself as
//! `perf --child <kernel> <allocator> <args…>` (or a `workload_*` binary)
//! with an environment that selects the configuration. "MKL defaults": no
//! `MKL_ALLOC_*` variable at all (removed from the child's environment, so
//! the library's defaults of the checkout apply, whatever perf itself was
//! started with); "MKL everything off": `MKL_ALLOC_BLOCK_CACHE=off
//! MKL_ALLOC_HUGE_PAGES=off`; "MKL_ALLOC_BACKING=off" (group 30): MKL's
//! memory pointers left alone. System, mimalloc and jemalloc run in
//! children too. The JSON's `configurations` records the block-cache
//! budget, the huge-page threshold and the backing's state each
//! configuration's child saw. Groups 1-4 run in perf's own
//! process, under its environment; groups 6, 7 and 9 set both policies
//! through the API for each competitor and restore them after it.
//!
//! The whole-program workload (5) needs one binary per global allocator;
//! perf runs them from its own directory (`target/release/examples/`). If
//! they are missing and perf was started by `cargo run`, it builds them
//! first with the same cargo; otherwise it prints the command and leaves
//! those rows out.
//!
//! `PERF_VERBOSE=1` also prints every target's per-round ratios on stderr;
//! `PERF_RETENTION_MIB=N` sets the MiB of blocks each "medium retention"
//! child allocates (default 1024).
//!
//! Clocks: single-threaded rows are timed in the measuring thread's CPU
//! time (user + system, `CLOCK_THREAD_CPUTIME_ID`), so time the (shared)
//! machine gives to other processes does not count, while page faults and
//! system calls made by the code measured do. The 2-thread rows are
//! per-thread wall time (contention is what they measure). The workload
//! rows show each child's CPU time (user + system, `getrusage`), wall time
//! and peak RSS (`VmHWM`); the target uses CPU time. Resident growth
//! (`vec![0.0; …]` rows) is `/proc/self/statm`'s resident size just before
//! the free minus just before the allocation, in the child.
//!
//! Method: every group runs 3-41 rounds; in each round every competitor
//! runs one batch, in an order shuffled afresh each round (fixed seed).
//! In-process groups discard one warm-up round first; child processes
//! start fresh every time, so every round counts. The table shows each
//! competitor's median batch time per operation, and each ratio is the
//! median of the per-round ratios (A and B measured moments apart).

#[path = "../../benches/support/mod.rs"]
mod support;

mod classic;
mod configs;
mod fork_guard;
mod harness;
mod huge;
mod medium;
mod report;
mod stall;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use report::{Machine, Table};

type Group = fn(&mut Table);

/// Every group, in the order they run.
const GROUPS: [(&str, Group); 22] = [
    ("alloc+free", classic::alloc_free_group),
    ("small objects", classic::small_objects_group),
    ("Vec growth", classic::growth_group),
    ("hashbrown", classic::hashbrown_group),
    ("views", classic::views_group),
    ("workload", workload::workload_group),
    ("huge pages", huge::huge_pages_group),
    ("huge 1GiB", huge::huge_1gib_group),
    ("huge 1GiB reuse", huge::huge_reuse_group),
    ("huge stall", stall::huge_stall_group),
    ("block cache", huge::block_cache_group),
    ("config small blocks", configs::small_blocks_group),
    ("config big buffers", configs::big_buffers_group),
    ("config push 10^8", configs::push_1e8_group),
    ("fork guard", fork_guard::fork_guard_group),
    ("fork cost", fork_guard::fork_cost_group),
    ("config backing off", configs::backing_group),
    ("medium churn", medium::churn_group),
    ("medium retention", medium::retention_group),
    ("medium footprint", medium::footprint_group),
    ("medium same-size churn", medium::same_size_group),
    ("medium sawtooth", medium::sawtooth_group),
];

/// `target/perf/results.json` in the `target/` this binary was built in
/// (`target/release/examples/perf`).
fn default_json() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.parent()?.join("perf/results.json")))
        .unwrap_or_else(|| PathBuf::from("target/perf/results.json"))
}

/// The usage `--help` prints: the flags, and the groups a word selects.
fn usage() -> String {
    let mut u = String::from(
        "usage: cargo run --release --example perf -- [--json PATH] [WORD ...]\n\n\
         Runs the performance groups whose names contain one of the WORDs (every\n\
         group when none is given), prints a markdown table of rows and targets,\n\
         and writes the same as JSON.\n\n\
         options:\n  \
           --json PATH   write the JSON to PATH (default: target/perf/results.json)\n  \
           -h, --help    print this and exit, running and writing nothing\n\n\
         environment:\n  \
           PERF_VERBOSE=1  also print every target's per-round ratios on stderr\n  \
           PERF_RETENTION_MIB=N  MiB of blocks per \"medium retention\" child\n                         \
           (default 1024; 256 for a quick look)\n\n\
         groups (a WORD selects every group whose name contains it; \"config\"\n\
         selects the four config groups):\n",
    );
    for (name, _) in GROUPS {
        u.push_str("  ");
        u.push_str(name);
        u.push('\n');
    }
    u
}

/// The JSON path and the group words from the command line, `None` for
/// `--help`; an error for a flag perf does not know, `--json` without a
/// path, or a word that selects no group (nothing would run, and the JSON
/// would be overwritten with an empty table).
fn parse_args(args: &[String]) -> Result<Option<(PathBuf, Vec<String>)>, String> {
    let mut json_path = default_json();
    let mut words: Vec<String> = vec![];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--json" => match it.next() {
                Some(p) => json_path = PathBuf::from(p),
                None => return Err("--json needs a PATH".into()),
            },
            flag if flag.starts_with('-') => {
                return Err(format!("unknown option {flag:?}"));
            }
            word => {
                if !GROUPS.iter().any(|(name, _)| name.contains(word)) {
                    return Err(format!(
                        "{word:?} selects no group: a WORD must be part of a group's name"
                    ));
                }
                words.push(a.clone());
            }
        }
    }
    Ok(Some((json_path, words)))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        if args.get(1).map(String::as_str) == Some("retention") {
            medium::retention_child(&args[2..]);
            return;
        }
        if args.get(1).map(String::as_str) == Some("same-size") {
            medium::same_size_child(&args[2..]);
            return;
        }
        if args.get(1).map(String::as_str) == Some("sawtooth") {
            medium::sawtooth_child(&args[2..]);
            return;
        }
        if args.get(1).map(String::as_str) == Some("footprint") {
            medium::footprint_child(&args[2..]);
            return;
        }
        configs::child_main(&args[1..]);
        return;
    }
    let (json_path, words) = match parse_args(&args) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            print!("{}", usage());
            return;
        }
        Err(e) => {
            eprintln!("perf: {e} (`perf -- --help` lists the options and the groups)");
            std::process::exit(2);
        }
    };
    let start = Instant::now();
    let mut machine = Machine::probe();
    let mut t = Table::default();
    // What groups 1-4 (this process) run under.
    let or_off = |x: Option<usize>| x.map_or(json!(null), |v| json!(v));
    let own_env: serde_json::Map<String, serde_json::Value> = std::env::vars()
        .filter(|(k, _)| k.starts_with("MKL_ALLOC_"))
        .map(|(k, v)| (k, json!(v)))
        .collect();
    t.configurations.insert(
        "perf's own process".into(),
        json!({
            "env": own_env,
            "block_cache_budget": or_off(mkl_alloc::block_cache::budget()),
            "huge_pages_threshold": or_off(mkl_alloc::huge_pages::threshold()),
        }),
    );
    for (name, f) in GROUPS {
        if !words.is_empty() && !words.iter().any(|w| name.contains(w.as_str())) {
            continue;
        }
        let t0 = Instant::now();
        t.group = name.to_string();
        f(&mut t);
        eprintln!("perf: {name} done in {:.1} s", t0.elapsed().as_secs_f64());
    }
    machine.loadavg_end = report::loadavg();
    let seconds = start.elapsed().as_secs_f64();
    print!("{}", t.markdown(&machine));
    println!("\nTotal time: {seconds:.1} s");
    let doc = t.json(&machine, &args, seconds);
    match report::write_json(&json_path, &doc) {
        Ok(p) => eprintln!("perf: wrote {}", p.display()),
        Err(e) => eprintln!("perf: cannot write {}: {e}", json_path.display()),
    }
}
