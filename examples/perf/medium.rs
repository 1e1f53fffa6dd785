//! Issue 42's groups: medium blocks (4 KiB to 1 MiB).
//!
//! "medium churn" (in this process, each allocator an instance called
//! through `GlobalAlloc`, as groups 1-4): a window of 2,000 live blocks,
//! sizes log-uniform from 4 KiB to 1 MiB (a fixed xorshift sequence, the
//! same for every allocator); each step frees a random block of the window
//! and allocates a new one in its place, writing one byte in every 4 KiB of
//! the new block. Each batch fills the window (untimed), runs 2,000 steps
//! to reach a steady state (untimed), times 4,000 steps and frees the
//! window (untimed). 21 rounds. Time: the process's CPU time (user + system,
//! `getrusage(RUSAGE_SELF)`: a thread the allocator runs for itself counts
//! too) per step, the median of interleaved rounds.
//!
//! "medium same-size churn" (issue 54; a fresh child process per
//! measurement, since `MKL_ALLOC_MEDIUM` is read once): 1, 2 or 8
//! threads, each with a window of 32 live blocks of one size (4 KiB,
//! 48 KiB or 256 KiB); each step frees a random block of its window and
//! allocates one in its place, one byte written per 4 KiB. Process CPU
//! time per step (all threads' steps), the median of 5 interleaved
//! rounds: System, jemalloc, mimalloc, MklAllocator and MklSplitAllocator,
//! each MKL one also with `MKL_ALLOC_MEDIUM=off` (MKL over glibc).
//!
//! "medium footprint" (issue 54; a fresh child process per measurement):
//! 64 MiB of live blocks of 4096, 4097, 8192 or 16384 bytes, every byte
//! written; the resident growth over the bytes asked. System, jemalloc,
//! mimalloc, MklAllocator, MklSplitAllocator, and MklAllocator with
//! `MKL_ALLOC_MEDIUM=off` (MKL over glibc). 3 rounds.
//!
//! "medium retention" (a fresh child process per measurement, since an
//! allocator's state is per process): about 1 GiB of blocks (48 KiB,
//! 160 KiB, or log-uniform 4 KiB-1 MiB; one byte written in every 4 KiB)
//! allocated, with a
//! 32-byte block of the same allocator kept alive after every second one;
//! every big block freed; 2 s idle; then one 32-byte allocation; then the
//! resident set (`/proc/self/statm`) beyond what it was before the first
//! block. Two more variants of the MKL allocators make one 64 KiB
//! allocation after the pause instead (a numeric program's next buffer:
//! a medium block reaches the crate, a 32-byte one does not), and the
//! background-thread variants call
//! `mkl_alloc::background::start()` (issue 42, part 2) first thing in the
//! child and make no allocation after the pause. `PERF_RETENTION_MIB` sets
//! the amount (default 1024; 256 for
//! a quick look).

use core::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::process::{Command, Stdio};
use std::time::Duration;

use mkl_alloc::{MklAllocator, MklSplitAllocator};

use crate::harness::{
    Env, Series, apply_env, field, interleave, order, own_exe, parse_fields, process_cpu_ns,
    rss_mib,
};
use crate::report::Table;

/// The smallest and the largest medium block.
const MIN: usize = 4 << 10;
const MAX: usize = 1 << 20;
/// Live blocks in the churn's window.
const WINDOW: usize = 2000;
/// Untimed steps after the window is filled, then timed steps, per batch.
const WARM_STEPS: usize = 2000;
const STEPS: usize = 4000;
/// The page each new block gets one byte written in.
const PAGE: usize = 4096;
/// The small block kept between every two big ones (a short `String`).
const SMALL: usize = 32;

/// xorshift64: the fixed-seed sequence of sizes and victims.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Log-uniform from [`MIN`] to [`MAX`] bytes, a multiple of 8.
    fn medium(&mut self) -> usize {
        let x = MIN as f64 * (MAX as f64 / MIN as f64).powf(self.unit());
        ((x as usize) & !7).clamp(MIN, MAX)
    }
}

/// The churn's sizes and victims, the same for every allocator and round.
struct Plan {
    fill: Vec<usize>,
    /// (index in the window freed, size allocated in its place)
    steps: Vec<(usize, usize)>,
}

impl Plan {
    fn new() -> Self {
        let mut r = Rng(0x4242_0042_9E37_79B9);
        let fill = (0..WINDOW).map(|_| r.medium()).collect();
        let steps = (0..WARM_STEPS + STEPS)
            .map(|_| ((r.next() % WINDOW as u64) as usize, r.medium()))
            .collect();
        Self { fill, steps }
    }
}

/// A block of `size` bytes (align 8, as `Vec<f64>` asks), one byte
/// written in every 4 KiB.
fn alloc_touched<G: GlobalAlloc>(g: &G, size: usize) -> (*mut u8, Layout) {
    let layout = Layout::from_size_align(size, 8).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { g.alloc(layout) };
    assert!(!p.is_null(), "allocation of {size} bytes failed");
    for off in (0..size).step_by(PAGE) {
        // SAFETY: off < size, inside the block.
        unsafe { p.add(off).write_volatile(1) };
    }
    (p, layout)
}

/// One batch of the churn under `g`: nanoseconds of process CPU time per
/// timed step.
fn churn<G: GlobalAlloc>(g: &G, plan: &Plan) -> f64 {
    let mut window: Vec<(*mut u8, Layout)> =
        plan.fill.iter().map(|&s| alloc_touched(g, s)).collect();
    let mut step = |&(victim, size): &(usize, usize)| {
        let (p, l) = window[victim];
        // SAFETY: allocated by `g` with `l`, freed once (replaced at once).
        unsafe { g.dealloc(p, l) };
        window[victim] = alloc_touched(g, size);
    };
    let (warm, timed) = plan.steps.split_at(WARM_STEPS);
    warm.iter().for_each(&mut step);
    let t = process_cpu_ns();
    timed.iter().for_each(&mut step);
    let ns = (process_cpu_ns() - t) / timed.len() as f64;
    for (p, l) in black_box(window) {
        // SAFETY: allocated by `g` with `l`, freed once.
        unsafe { g.dealloc(p, l) };
    }
    ns
}

/// Medium churn: System, jemalloc, mimalloc, MklAllocator and
/// MklSplitAllocator (its default small side), interleaved in this process.
pub fn churn_group(t: &mut Table) {
    const ROUNDS: usize = 21;
    let plan = Plan::new();
    let series = interleave(
        ROUNDS,
        &mut [
            ("System", &mut || churn(&std::alloc::System, &plan)),
            ("jemalloc", &mut || {
                churn(&tikv_jemallocator::Jemalloc, &plan)
            }),
            ("mimalloc", &mut || churn(&mimalloc::MiMalloc, &plan)),
            ("MklAllocator", &mut || churn(&MklAllocator, &plan)),
            ("MklSplitAllocator", &mut || {
                churn(&MklSplitAllocator, &plan)
            }),
        ],
    );
    t.group(
        "42. medium churn: 2,000 live blocks, log-uniform 4 KiB-1 MiB, free one + alloc one (process CPU per step)",
        "ns",
        &series,
        0,
    );
    let fastest = series[..3]
        .iter()
        .min_by(|a, b| crate::harness::med(a).total_cmp(&crate::harness::med(b)))
        .unwrap();
    for mkl in &series[3..] {
        t.target(
            &format!(
                "medium churn: {} ≤ 1.05x the fastest of System, jemalloc, mimalloc",
                mkl.name
            ),
            mkl,
            fastest,
            1.05,
        );
    }
}

/// The block sizes of the retention rows: the argument a child gets, and
/// the rows' title.
const SIZES: [(&str, &str); 3] = [
    ("48k", "48 KiB blocks"),
    ("160k", "160 KiB blocks"),
    ("mixed", "log-uniform 4 KiB-1 MiB blocks"),
];

/// A competitor of the retention rows.
struct Who {
    name: &'static str,
    /// The allocator the child uses.
    arg: &'static str,
    /// What the child does around the pause: `alloc`, one 32 B allocation
    /// after it; `medium`, one 64 KiB allocation after it (a numeric
    /// program's next buffer); `background`, `mkl_alloc::background::start()`
    /// first and no allocation after.
    end: &'static str,
}

const RETENTION: [Who; 9] = [
    Who {
        name: "System",
        arg: "system",
        end: "alloc",
    },
    Who {
        name: "jemalloc",
        arg: "jemalloc",
        end: "alloc",
    },
    Who {
        name: "mimalloc",
        arg: "mimalloc",
        end: "alloc",
    },
    Who {
        name: "MklSplitAllocator",
        arg: "split",
        end: "alloc",
    },
    Who {
        name: "MklAllocator",
        arg: "mkl",
        end: "alloc",
    },
    Who {
        name: "MklSplitAllocator, one 64 KiB alloc after",
        arg: "split",
        end: "medium",
    },
    Who {
        name: "MklAllocator, one 64 KiB alloc after",
        arg: "mkl",
        end: "medium",
    },
    Who {
        name: "MklSplitAllocator, background thread, no alloc after",
        arg: "split",
        end: "background",
    },
    Who {
        name: "MklAllocator, background thread, no alloc after",
        arg: "mkl",
        end: "background",
    },
];

/// MiB of blocks each retention child allocates: `PERF_RETENTION_MIB`,
/// 1024 by default.
fn retention_mib() -> usize {
    match std::env::var("PERF_RETENTION_MIB") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|&m| m > 0)
            .unwrap_or_else(|| panic!("PERF_RETENTION_MIB={v:?}: a positive number of MiB")),
        Err(_) => 1024,
    }
}

/// Starts `perf --child retention <who> <sizes> <mib> <after>`.
fn spawn_retention(who: &Who, sizes: &str, mib: usize) -> std::process::Child {
    let mut cmd = Command::new(own_exe());
    cmd.args(["--child", "retention", who.arg, sizes])
        .arg(mib.to_string())
        .arg(who.end);
    apply_env(&mut cmd, Env::Defaults);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("start a perf retention child")
}

/// Retention: for each block size, every competitor in a child of its
/// own; the children of one round run at the same time (most of a child's
/// time is its 2 s pause, and what is measured is memory, not time).
pub fn retention_group(t: &mut Table) {
    const ROUNDS: usize = 3;
    let mib = retention_mib();
    let who = &RETENTION;
    for (arg, title) in SIZES {
        let mut idle: Vec<Series> = who.iter().map(|w| Series::new(w.name)).collect();
        let mut freed = idle.clone();
        for r in 0..ROUNDS {
            let children: Vec<(usize, std::process::Child)> = order(who.len(), r)
                .into_iter()
                .map(|i| (i, spawn_retention(&who[i], arg, mib)))
                .collect();
            for (i, c) in children {
                let out = c.wait_with_output().expect("wait for a retention child");
                assert!(
                    out.status.success(),
                    "retention child {} {arg} failed: {}",
                    who[i].name,
                    String::from_utf8_lossy(&out.stderr)
                );
                let f = parse_fields(&String::from_utf8_lossy(&out.stdout));
                assert!(
                    who[i].end != "background" || field(&f, "background") == 1.0,
                    "{}: the background thread was not running at the end",
                    who[i].name
                );
                idle[i].values.push(field(&f, "rss_mib"));
                freed[i].values.push(field(&f, "freed_mib"));
            }
        }
        let what = format!("42. retention, {mib} MiB of {title}");
        t.values(
            &format!("{what}: resident beyond the start, 2 s idle then the ending"),
            "MiB",
            &idle,
        );
        t.values(
            &format!("{what}: resident beyond the start just after the free"),
            "MiB",
            &freed,
        );
        let start = Series {
            name: "the start".into(),
            values: vec![0.0; ROUNDS],
        };
        for (w, s) in who.iter().zip(&idle) {
            if w.arg == "split" || w.arg == "mkl" {
                t.target_diff(
                    &format!(
                        "retention, {title}: {} ≤ 32 MiB beyond the start after 2 s idle",
                        w.name
                    ),
                    s,
                    &start,
                    32.0,
                    "MiB",
                );
            }
        }
    }
}

/// `perf --child retention <who> <sizes> <mib> <end>`: one retention
/// measurement, printed as `key=value` pairs. `end`: `alloc` (one 32 B
/// allocation after the pause), `medium` (one 64 KiB allocation after it)
/// or `background` (the background thread started first, nothing
/// allocated after the pause).
pub fn retention_child(args: &[String]) {
    let (who, sizes, end) = (args[0].as_str(), args[1].as_str(), args[3].as_str());
    let mib: usize = args[2].parse().expect("MiB");
    let after = match end {
        "alloc" => After::Small,
        "medium" => After::Medium,
        "background" => {
            mkl_alloc::background::start().expect("start the background decay thread");
            After::Nothing
        }
        other => panic!("unknown retention ending {other}"),
    };
    let line = match who {
        "system" => retention(&std::alloc::System, sizes, mib, after),
        "jemalloc" => retention(&tikv_jemallocator::Jemalloc, sizes, mib, after),
        "mimalloc" => retention(&mimalloc::MiMalloc, sizes, mib, after),
        "mkl" => retention(&MklAllocator, sizes, mib, after),
        "split" => retention(&MklSplitAllocator, sizes, mib, after),
        other => panic!("unknown allocator {other}"),
    };
    println!("{line}");
}

/// What a retention child allocates after its pause.
#[derive(Clone, Copy, PartialEq)]
enum After {
    Nothing,
    /// One 32 B block.
    Small,
    /// One 64 KiB block, one byte written per 4 KiB.
    Medium,
}

/// The retention measurement under `g` (see the module's docs).
fn retention<G: GlobalAlloc>(g: &G, sizes: &str, mib: usize, after: After) -> String {
    let mut r = Rng(0x4242_0042_5EED_0001);
    let mut next = || match sizes {
        "48k" => 48 << 10,
        "160k" => 160 << 10,
        "mixed" => r.medium(),
        other => panic!("unknown retention sizes {other}"),
    };
    let total = mib << 20;
    let mut plan = vec![];
    let mut sum = 0;
    while sum < total {
        let s = next();
        plan.push(s);
        sum += s;
    }
    let small = Layout::from_size_align(SMALL, 8).unwrap();
    let alloc_small = || {
        // SAFETY: a non-zero size.
        let p = unsafe { g.alloc(small) };
        assert!(!p.is_null(), "a 32 B allocation failed");
        // SAFETY: SMALL bytes, inside the block.
        unsafe { p.write_bytes(b's', SMALL) };
        p
    };
    // The allocator's first use (its pools, MKL's initialisation) is not
    // what is measured: a small and a medium block first.
    // SAFETY: allocated just above with their layouts, freed once.
    unsafe {
        g.dealloc(alloc_small(), small);
        let (p, l) = alloc_touched(g, MIN);
        g.dealloc(p, l);
    }
    let mut big: Vec<(*mut u8, Layout)> = Vec::with_capacity(plan.len());
    let mut smalls: Vec<*mut u8> = Vec::with_capacity(plan.len() / 2 + 2);
    let start = rss_mib();
    for (i, &s) in plan.iter().enumerate() {
        big.push(alloc_touched(g, s));
        if i % 2 == 1 {
            smalls.push(alloc_small());
        }
    }
    let peak = rss_mib() - start;
    for (p, l) in big.drain(..) {
        // SAFETY: allocated by `g` with `l`, freed once.
        unsafe { g.dealloc(p, l) };
    }
    let freed = rss_mib() - start;
    std::thread::sleep(Duration::from_secs(2));
    let medium = match after {
        After::Nothing => None,
        After::Small => {
            smalls.push(alloc_small());
            None
        }
        After::Medium => Some(alloc_touched(g, 64 << 10)),
    };
    let idle = rss_mib() - start;
    if let Some((p, l)) = medium {
        // SAFETY: allocated by `g` with `l` just above, freed once.
        unsafe { g.dealloc(p, l) };
    }
    let background = u8::from(mkl_alloc::background::is_running());
    for p in smalls {
        // SAFETY: allocated by `g` with `small`, freed once.
        unsafe { g.dealloc(p, small) };
    }
    format!(
        "rss_mib={idle} freed_mib={freed} peak_mib={peak} blocks={} background={background}",
        plan.len()
    )
}

/// `perf --child <args…>` with the defaults, or with medium blocks off.
fn medium_child(args: &[&str], medium_off: bool) -> Vec<(String, f64)> {
    let env = if medium_off {
        Env::MediumOff
    } else {
        Env::Defaults
    };
    crate::harness::child(env, &args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
}

/// The block sizes of the footprint rows: the four, then two
/// just above a class (the worst case of the class spacing: 4,200 B is
/// 4,288 B beneath MKL, above the 4,224-byte class).
const FOOTPRINT: [usize; 6] = [4096, 4097, 8192, 16384, 4200, 33000];

/// Live footprint (issue 54): for each size, every competitor in a child
/// of its own, interleaved over 3 rounds.
pub fn footprint_group(t: &mut Table) {
    const ROUNDS: usize = 3;
    for size in FOOTPRINT {
        let mut series: Vec<Series> = WHO[..6].iter().map(|w| Series::new(w.0)).collect();
        for r in 0..ROUNDS {
            for i in order(6, r) {
                let (_, arg, off) = WHO[i];
                let f = medium_child(&["footprint", arg, &size.to_string()], off);
                series[i].values.push(field(&f, "ratio"));
            }
        }
        t.values(
            &format!(
                "54. live footprint, 64 MiB of {size} B blocks, every byte written: resident growth / bytes asked"
            ),
            "x",
            &series,
        );
        let asked = Series {
            name: "the bytes asked".into(),
            values: vec![1.0; ROUNDS],
        };
        // The sizes; the class edges are shown, not targeted.
        for s in series[3..5].iter().filter(|_| size % 4096 < 2) {
            t.target(
                &format!(
                    "live footprint, {size} B: {} ≤ 1.05x the bytes asked",
                    s.name
                ),
                s,
                &asked,
                1.05,
            );
        }
    }
}

/// `perf --child footprint <who> <size>`: one footprint measurement,
/// printed as `ratio=<resident growth / bytes asked>`.
pub fn footprint_child(args: &[String]) {
    let size: usize = args[1].parse().expect("a block size");
    let ratio = match args[0].as_str() {
        "system" => footprint(&std::alloc::System, size),
        "jemalloc" => footprint(&tikv_jemallocator::Jemalloc, size),
        "mimalloc" => footprint(&mimalloc::MiMalloc, size),
        "mkl" => footprint(&MklAllocator, size),
        "split" => footprint(&MklSplitAllocator, size),
        other => panic!("unknown allocator {other}"),
    };
    println!("ratio={ratio:.4}");
}

/// 64 MiB of live blocks of `size` bytes under `g`, every byte written:
/// the resident growth over the bytes asked.
fn footprint<G: GlobalAlloc>(g: &G, size: usize) -> f64 {
    let l = Layout::from_size_align(size, 8).unwrap();
    let n = (64 << 20) / size;
    let mut blocks: Vec<*mut u8> = Vec::with_capacity(n);
    // The allocator's first use (its pools, MKL's initialisation) is not
    // what is measured.
    // SAFETY: a non-zero layout, freed once.
    unsafe { g.dealloc(g.alloc(l), l) };
    let start = rss_mib();
    for _ in 0..n {
        // SAFETY: a non-zero layout.
        let p = unsafe { g.alloc(l) };
        assert!(!p.is_null(), "a {size} B allocation failed");
        // SAFETY: a live block of `size` bytes.
        unsafe { p.write_bytes(1, size) };
        blocks.push(p);
    }
    let grown = rss_mib() - start;
    for p in blocks {
        // SAFETY: allocated by `g` with `l`, freed once.
        unsafe { g.dealloc(p, l) };
    }
    grown * (1 << 20) as f64 / (n * size) as f64
}

/// The competitors of the footprint (the first six) and same-size rows:
/// name, the child's allocator, and whether medium blocks are off.
const WHO: [(&str, &str, bool); 7] = [
    ("System", "system", false),
    ("jemalloc", "jemalloc", false),
    ("mimalloc", "mimalloc", false),
    ("MklAllocator", "mkl", false),
    ("MklSplitAllocator", "split", false),
    ("MklAllocator, MKL_ALLOC_MEDIUM=off", "mkl", true),
    ("MklSplitAllocator, MKL_ALLOC_MEDIUM=off", "split", true),
];

/// Same-size churn (issue 54): each size and thread count, every
/// competitor in a child of its own, 5 interleaved rounds.
pub fn same_size_group(t: &mut Table) {
    const ROUNDS: usize = 5;
    for size in [4 << 10, 48 << 10, 256 << 10] {
        for threads in [1usize, 2, 8] {
            let mut series: Vec<Series> = WHO.iter().map(|w| Series::new(w.0)).collect();
            for r in 0..ROUNDS {
                for i in order(WHO.len(), r) {
                    let (_, arg, off) = WHO[i];
                    let args = ["same-size", arg, &size.to_string(), &threads.to_string()];
                    let f = medium_child(&args, off);
                    series[i].values.push(field(&f, "ns"));
                }
            }
            let kib = size >> 10;
            t.values(
                &format!(
                    "54. same-size churn, {kib} KiB, {threads} thread(s), window 32: free one + alloc one (process CPU per step)"
                ),
                "ns",
                &series,
            );
            for (on, off) in [(3, 5), (4, 6)] {
                t.target(
                    &format!(
                        "same-size churn, {kib} KiB, {threads} thread(s): {} ≤ 1.05x itself with MKL_ALLOC_MEDIUM=off",
                        series[on].name
                    ),
                    &series[on],
                    &series[off],
                    1.05,
                );
            }
        }
    }
}

/// `perf --child same-size <who> <size> <threads>`: process CPU time per
/// step, printed as `ns=<value>`.
pub fn same_size_child(args: &[String]) {
    let size: usize = args[1].parse().expect("a block size");
    let threads: usize = args[2].parse().expect("a thread count");
    let ns = match args[0].as_str() {
        "system" => same_size(&std::alloc::System, size, threads),
        "jemalloc" => same_size(&tikv_jemallocator::Jemalloc, size, threads),
        "mimalloc" => same_size(&mimalloc::MiMalloc, size, threads),
        "mkl" => same_size(&MklAllocator, size, threads),
        "split" => same_size(&MklSplitAllocator, size, threads),
        other => panic!("unknown allocator {other}"),
    };
    println!("ns={ns:.2}");
}

/// The same-size churn under `g`: `threads` threads, each a window of 32
/// blocks of `size` bytes; process CPU time per step over all threads.
fn same_size<G: GlobalAlloc + Sync>(g: &G, size: usize, threads: usize) -> f64 {
    const WINDOW: usize = 32;
    let steps: usize = (40 << 30) / size.max(64 << 10) / threads.max(1);
    let steps = steps.clamp(20_000, 400_000);
    let run = |seed: u64, steps: usize| {
        let mut r = Rng(seed);
        let mut w: Vec<(*mut u8, Layout)> = (0..WINDOW).map(|_| alloc_touched(g, size)).collect();
        for _ in 0..steps {
            let i = (r.next() % WINDOW as u64) as usize;
            let (p, l) = w[i];
            // SAFETY: allocated by `g` with `l`, freed once.
            unsafe { g.dealloc(p, l) };
            w[i] = alloc_touched(g, size);
        }
        for (p, l) in w {
            // SAFETY: as above.
            unsafe { g.dealloc(p, l) };
        }
    };
    // A warm-up in each thread's place (pools, MKL's per-thread state).
    run(1, 1000);
    let t0 = process_cpu_ns();
    std::thread::scope(|s| {
        for k in 0..threads {
            let run = &run;
            s.spawn(move || run(0x5EED_0000 + k as u64, steps));
        }
    });
    (process_cpu_ns() - t0) / (steps * threads) as f64
}

/// The sawtooth's competitors: name, the child's allocator, and whether
/// medium blocks are off.
const SAWTOOTH: [(&str, &str, bool); 5] = [
    ("System", "system", false),
    ("MklSplitAllocator", "split", false),
    ("MklSplitAllocator, MKL_ALLOC_MEDIUM=off", "split", true),
    ("MklAllocator", "mkl", false),
    ("MklAllocator, MKL_ALLOC_MEDIUM=off", "mkl", true),
];

/// The sawtooth (issue 54, point 7): a working set that frees its medium
/// blocks, does small work, and allocates them again, over and over; what
/// the retention machinery (the let-go run) costs the small work. Every
/// competitor in a child of its own, 5 interleaved rounds.
pub fn sawtooth_group(t: &mut Table) {
    // 21, not 5: the timed part is 5 ms of 16-byte pairs a child, and a
    // child's figure spreads by +-12 % with where its heap and stack land
    // (System's too: 5.1-6.3 ns); 40 rounds of medium on over off had
    // quartiles 0.97 and 1.06, and five rounds' median fell anywhere from
    // 0.99 to 1.14, eleven's from 1.01 to 1.09.
    const ROUNDS: usize = 21;
    let mut series: Vec<Series> = SAWTOOTH.iter().map(|w| Series::new(w.0)).collect();
    for r in 0..ROUNDS {
        for i in order(SAWTOOTH.len(), r) {
            let (_, arg, off) = SAWTOOTH[i];
            let f = medium_child(&["sawtooth", arg], off);
            series[i].values.push(field(&f, "ns"));
        }
    }
    t.values(
        "54. sawtooth: 300 x 48 KiB freed, 20,000 alloc+free pairs of 16 B, the 300 reallocated (process CPU per small pair)",
        "ns",
        &series,
    );
    for (on, off) in [(1, 2), (3, 4)] {
        t.target(
            &format!(
                "sawtooth: {}'s small pairs ≤ 1.05x itself with MKL_ALLOC_MEDIUM=off",
                series[on].name
            ),
            &series[on],
            &series[off],
            1.05,
        );
    }
    t.target(
        "sawtooth: MklSplitAllocator's small pairs ≤ 1.02x its small side alone (System)",
        &series[1],
        &series[0],
        1.02,
    );
}

/// `perf --child sawtooth <who>`: process CPU time per small pair,
/// printed as `ns=<value>`.
pub fn sawtooth_child(args: &[String]) {
    let ns = match args[0].as_str() {
        "system" => sawtooth(&std::alloc::System),
        "mkl" => sawtooth(&MklAllocator),
        "split" => sawtooth(&MklSplitAllocator),
        other => panic!("unknown allocator {other}"),
    };
    println!("ns={ns:.2}");
}

/// The sawtooth under `g`: 40 cycles of freeing 300 touched blocks of
/// 48 KiB, 20,000 alloc+free pairs of 16 B (only these timed), and the
/// 300 allocated again.
fn sawtooth<G: GlobalAlloc>(g: &G) -> f64 {
    const CYCLES: usize = 40;
    const PAIRS: usize = 20_000;
    let small = Layout::from_size_align(16, 8).unwrap();
    let mut set: Vec<(*mut u8, Layout)> = (0..300).map(|_| alloc_touched(g, 48 << 10)).collect();
    let mut timed = 0.0;
    for c in 0..=CYCLES {
        for (p, l) in set.drain(..) {
            // SAFETY: allocated by `g` with `l`, freed once.
            unsafe { g.dealloc(p, l) };
        }
        let t0 = process_cpu_ns();
        for _ in 0..PAIRS {
            // SAFETY: a non-zero layout; freed once, right after.
            let p = unsafe { g.alloc(small) };
            assert!(!p.is_null());
            // SAFETY: a live block of 16 bytes.
            unsafe { p.write_volatile(1) };
            // SAFETY: allocated by `g` with `small`, freed once.
            unsafe { g.dealloc(p, small) };
        }
        // The first cycle warms up (MKL's buffers, the heaps' first spans).
        if c > 0 {
            timed += process_cpu_ns() - t0;
        }
        set.extend((0..300).map(|_| alloc_touched(g, 48 << 10)));
    }
    for (p, l) in set {
        // SAFETY: as above.
        unsafe { g.dealloc(p, l) };
    }
    timed / (CYCLES * PAIRS) as f64
}
