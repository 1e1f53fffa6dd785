//! The quick performance table of issue 4: the criterion workloads, run
//! briefly, with competitors interleaved round by round so every ratio comes
//! from one run on one machine state.
//!
//! ```text
//! cargo build --release --examples      # builds perf and the workload_* binaries
//! cargo run --release --example perf    # about 4 minutes on 2 cores (3 of them: the huge-page groups)
//! ```
//!
//! The whole-program workload (5) needs one binary per global allocator
//! (`examples/workload_*.rs`); perf runs them as child processes from its
//! own directory (`target/release/examples/`). If they are missing and perf
//! was started by `cargo run`, it builds them first with the same cargo
//! (`cargo build --release --example workload_…`); otherwise it prints the
//! command and leaves those rows out.
//!
//! `cargo run --release --example perf -- growth views` runs only the groups
//! whose names contain one of the words (alloc+free, small objects, Vec growth, hashbrown,
//! views, workload, huge pages, huge 1GiB, huge 1GiB reuse, huge stall, block cache). The
//! `huge` groups (issue 10) run each MKL competitor with
//! `mkl_alloc::huge_pages` off and on; the large ones can be run alone:
//! `perf -- 1GiB` (10^8 pushes and 1 GiB blocks, about two minutes, with the
//! reuse group), `perf -- reuse`, `perf -- stall` (fresh child processes:
//! this binary re-run with `--stall-child`).
//!
//! `PERF_VERBOSE=1` also prints every target's per-round ratios on stderr.
//!
//! Clocks: single-threaded rows are timed in this thread's CPU time (user +
//! system, `CLOCK_THREAD_CPUTIME_ID`), so time the (shared) machine gives to
//! other processes does not count, while page faults and system calls made
//! by the code measured do. The 2-thread rows are per-thread wall time
//! (contention is what they measure). The workload rows show each child's
//! CPU time (user + system, `getrusage`) and wall time; the target uses
//! CPU time.
//!
//! Method: every group runs `ROUNDS` rounds after one discarded warm-up
//! round; in each round every competitor runs one batch, in an order
//! shuffled afresh each round (fixed seed). The table shows each competitor's median
//! batch time per operation, and each ratio is the median of the per-round
//! ratios (A and B measured moments apart).

#[path = "../benches/support/mod.rs"]
mod support;

use core::alloc::Layout;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use atomic_refcell::AtomicRefCell;
use mkl_alloc::{MklAllocator, MklSplitAllocator, SharedMklVec};
use support::*;

/// One measured competitor: its per-round values (ns per op, or a size).
#[derive(Clone)]
struct Series {
    name: String,
    values: Vec<f64>,
}

/// A fresh order of `k` competitors for round `r`: a Fisher-Yates shuffle
/// driven by a fixed xorshift sequence, so no competitor always follows the
/// same neighbour (an allocator leaves caches and freed memory behind for
/// the next one) and every run of perf uses the same orders.
fn order(k: usize, r: usize) -> Vec<usize> {
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

/// Runs `rounds` interleaved rounds (plus one warm-up) of the competitors,
/// each round in its own order.
fn interleave(rounds: usize, competitors: &mut [(&str, &mut dyn FnMut() -> f64)]) -> Vec<Series> {
    let k = competitors.len();
    let mut out: Vec<Series> = competitors
        .iter()
        .map(|(n, _)| Series {
            name: n.to_string(),
            values: Vec::with_capacity(rounds),
        })
        .collect();
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

/// As [`interleave`], for competitors that measure `metrics` values per
/// run (e.g. first touch, then a pass over the same block): the result is
/// indexed `[metric][competitor]`.
#[allow(clippy::type_complexity)]
fn interleave_multi(
    rounds: usize,
    metrics: usize,
    competitors: &mut [(&str, &mut dyn FnMut() -> Vec<f64>)],
) -> Vec<Vec<Series>> {
    let k = competitors.len();
    let mut out: Vec<Vec<Series>> = (0..metrics)
        .map(|_| {
            competitors
                .iter()
                .map(|(n, _)| Series {
                    name: n.to_string(),
                    values: Vec::with_capacity(rounds),
                })
                .collect()
        })
        .collect();
    for r in 0..=rounds {
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

fn med(s: &Series) -> f64 {
    median(&mut s.values.clone())
}

/// Median of the per-round ratios a/b.
fn ratio(a: &Series, b: &Series) -> f64 {
    let mut r: Vec<f64> = a.values.iter().zip(&b.values).map(|(x, y)| x / y).collect();
    median(&mut r)
}

/// This thread's CPU time (user + system) in nanoseconds. Single-threaded
/// rows are timed with it, so time the shared machine gives to other
/// processes does not count; page faults and system calls made by the
/// code measured do.
fn thread_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

/// Times `f` once (thread CPU time), in nanoseconds per op.
fn per_op(iters: u64, f: impl FnOnce()) -> f64 {
    let t = thread_cpu_ns();
    f();
    (thread_cpu_ns() - t) / iters as f64
}

/// Times `f` once (thread CPU time), in milliseconds.
fn ms(f: impl FnOnce()) -> f64 {
    let t = thread_cpu_ns();
    f();
    (thread_cpu_ns() - t) / 1e6
}

struct Table {
    rows: Vec<String>,
    targets: Vec<String>,
}

impl Table {
    fn group(&mut self, title: &str, unit: &str, series: &[Series], base: usize) {
        for (i, s) in series.iter().enumerate() {
            let r = if i == base {
                "1.00 (baseline)".to_string()
            } else {
                format!("{:.2}", ratio(s, &series[base]))
            };
            self.rows.push(format!(
                "| {title} | {} | {} {unit} | {r} |",
                s.name,
                fmt_num(med(s))
            ));
        }
    }

    fn target(&mut self, what: &str, a: &Series, b: &Series, limit: f64) {
        let r = ratio(a, b);
        if std::env::var_os("PERF_VERBOSE").is_some() {
            let per_round: Vec<String> = a
                .values
                .iter()
                .zip(&b.values)
                .map(|(x, y)| format!("{:.3}", x / y))
                .collect();
            eprintln!("perf: {what}: per-round ratios {}", per_round.join(" "));
        }
        let status = if r <= limit { "**met**" } else { "**missed**" };
        self.targets.push(format!(
            "| {what} | {} / {} | {r:.4} | ≤ {limit:.2} | {status} |",
            a.name, b.name
        ));
    }
}

fn fmt_num(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn alloc_free_group(t: &mut Table) {
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
                    per_op(iters, || {
                        alloc_free(&MklSplitAllocator::<4096>, layout, iters)
                    })
                }),
                ("System", &mut || {
                    per_op(iters, || alloc_free(&std::alloc::System, layout, iters))
                }),
                ("mimalloc", &mut || {
                    per_op(iters, || alloc_free(&mimalloc::MiMalloc, layout, iters))
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
fn small_objects_group(t: &mut Table) {
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
                    per_op(iters, || {
                        alloc_free(&MklSplitAllocator::<4096>, layout, iters)
                    })
                }),
                ("mimalloc", &mut || {
                    per_op(iters, || alloc_free(&mimalloc::MiMalloc, layout, iters))
                }),
            ],
        );
        let title = format!("1b. alloc+free {} (align 8)", size_name(size));
        t.group(&title, "ns", &series, 0);
    }
}

fn growth_group(t: &mut Table) {
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
                    black_box(vec_growth(MklSplitAllocator::<4096>, N));
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

fn hashbrown_group(t: &mut Table) {
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
                    black_box(hashbrown_insert(MklSplitAllocator::<4096>, N));
                })
            }),
        ],
    );
    t.group("3. hashbrown insert 10^6 u64", "ms", &series, 0);
}

fn views_group(t: &mut Table) {
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

/// Runs `f` with the huge-page policy `on` (2 MiB threshold) or off, and
/// leaves it off.
fn with_hp(on: bool, f: impl FnOnce() -> f64) -> f64 {
    set_huge_pages(on);
    let v = f();
    set_huge_pages(false);
    v
}

const HP_OFF: &str = "MklAllocator, huge pages off";
const HP_ON: &str = "MklAllocator, huge pages on";

/// `Vec<f64, A>` pushed to `n` (`name`: "10^7"; `row`: the table's row
/// number), System and mimalloc beside MklAllocator with huge pages off and
/// on; the target of issue 10.
fn huge_growth(t: &mut Table, rounds: usize, n: usize, row: &str, name: &str) {
    let series = interleave(
        rounds,
        &mut [
            ("Vec<f64, System>", &mut || {
                ms(|| {
                    black_box(vec_growth(ViaGlobal(std::alloc::System), n));
                })
            }),
            ("Vec<f64, MklAllocator>, huge pages off", &mut || {
                with_hp(false, || {
                    ms(|| {
                        black_box(vec_growth(MklAllocator, n));
                    })
                })
            }),
            ("Vec<f64, MklAllocator>, huge pages on", &mut || {
                with_hp(true, || {
                    ms(|| {
                        black_box(vec_growth(MklAllocator, n));
                    })
                })
            }),
            ("Vec<f64, mimalloc>", &mut || {
                ms(|| {
                    black_box(vec_growth(ViaGlobal(mimalloc::MiMalloc), n));
                })
            }),
        ],
    );
    t.group(&format!("{row} Vec<f64> push to {name}"), "ms", &series, 0);
    t.target(
        &format!("MklAllocator + huge pages ≤ 0.8x System, Vec push {name}"),
        &series[2],
        &series[0],
        0.8,
    );
}

/// Runs `f` with the block cache (default budget) and the huge-page policy
/// as given, then turns both off; the cache is emptied before and after,
/// so each run starts cold and leaves nothing behind for the next one.
fn with_cfg(cache: bool, hp: bool, f: impl FnOnce() -> f64) -> f64 {
    mkl_alloc::block_cache::disable();
    if cache {
        mkl_alloc::block_cache::enable(mkl_alloc::block_cache::default_budget());
    }
    set_huge_pages(hp);
    let v = f();
    set_huge_pages(false);
    mkl_alloc::block_cache::disable();
    v
}

/// Issue 15: the block cache. Each MKL competitor runs plain (cache and
/// huge pages off: the library's default), with the cache (the
/// configuration the README recommends for numerical programs, and the one
/// the targets measure), and with the cache and huge pages; every run
/// starts with an empty cache.
fn block_cache_group(t: &mut Table) {
    const B: usize = 64 << 20;
    const PLAIN: &str = "MklAllocator (defaults: no cache, no huge pages)";
    const CACHE: &str = "MklAllocator + block cache";
    const BOTH: &str = "MklAllocator + block cache + huge pages";
    let temporaries = |a: &dyn Fn() -> f64| -> f64 {
        ms(|| {
            (0..8).for_each(|_| {
                black_box(a());
            })
        })
    };
    let series = interleave(
        11,
        &mut [
            ("System", &mut || {
                temporaries(&|| first_touch(&ViaGlobal(std::alloc::System), B, false))
            }),
            (PLAIN, &mut || {
                with_cfg(false, false, || {
                    temporaries(&|| first_touch(&MklAllocator, B, false))
                })
            }),
            (CACHE, &mut || {
                with_cfg(true, false, || {
                    temporaries(&|| first_touch(&MklAllocator, B, false))
                })
            }),
            (BOTH, &mut || {
                with_cfg(true, true, || {
                    temporaries(&|| first_touch(&MklAllocator, B, false))
                })
            }),
            ("mimalloc", &mut || {
                temporaries(&|| first_touch(&ViaGlobal(mimalloc::MiMalloc), B, false))
            }),
        ],
    );
    t.group(
        "9. 64 MiB temporaries, 8 per round (alloc, write all, free)",
        "ms",
        &series,
        0,
    );
    t.target(
        "block cache ≤ 0.5x System, 64 MiB temporaries",
        &series[2],
        &series[0],
        0.5,
    );

    // Growth as a program's loop does it: the push is timed the second
    // time round, after one untimed push and drop (every allocator warm).
    for (n, name, rounds, limit) in [(10_000_000, "10^7", 11, 0.8), (100_000_000, "10^8", 5, 1.0)] {
        let twice = |grow: &dyn Fn() -> f64| -> f64 {
            black_box(grow());
            ms(|| {
                black_box(grow());
            })
        };
        let series = interleave(
            rounds,
            &mut [
                ("Vec<f64, System>", &mut || {
                    twice(&|| vec_growth(ViaGlobal(std::alloc::System), n))
                }),
                (PLAIN, &mut || {
                    with_cfg(false, false, || twice(&|| vec_growth(MklAllocator, n)))
                }),
                (CACHE, &mut || {
                    with_cfg(true, false, || twice(&|| vec_growth(MklAllocator, n)))
                }),
                (BOTH, &mut || {
                    with_cfg(true, true, || twice(&|| vec_growth(MklAllocator, n)))
                }),
                ("Vec<f64, mimalloc>", &mut || {
                    twice(&|| vec_growth(ViaGlobal(mimalloc::MiMalloc), n))
                }),
            ],
        );
        t.group(
            &format!("9. Vec<f64> push to {name}, the second time"),
            "ms",
            &series,
            0,
        );
        t.target(
            &format!("block cache ≤ {limit:.1}x System, Vec push to {name} (second time)"),
            &series[2],
            &series[0],
            limit,
        );
    }
}

/// Issue 10, steady state: growth to 10^7 and first touch of 64 MiB, each
/// MKL competitor with huge pages off and on.
fn huge_pages_group(t: &mut Table) {
    const N: usize = 10_000_000;
    huge_growth(t, 11, N, "6.", "10^7");
    let series = interleave(
        11,
        &mut [
            ("Vec<f64>::push (System)", &mut || {
                ms(|| {
                    black_box(std_vec_growth(N));
                })
            }),
            ("SharedMklVec::try_push, huge pages off", &mut || {
                with_hp(false, || {
                    ms(|| {
                        black_box(shared_try_push(N));
                    })
                })
            }),
            ("SharedMklVec::try_push, huge pages on", &mut || {
                with_hp(true, || {
                    ms(|| {
                        black_box(shared_try_push(N));
                    })
                })
            }),
        ],
    );
    t.group("6. push to 10^7 f64", "ms", &series, 0);
    const B: usize = 64 << 20;
    for zeroed in [false, true] {
        let series = interleave(
            15,
            &mut [
                ("System", &mut || {
                    ms(|| {
                        black_box(first_touch(&ViaGlobal(std::alloc::System), B, zeroed));
                    })
                }),
                (HP_OFF, &mut || {
                    with_hp(false, || {
                        ms(|| {
                            black_box(first_touch(&MklAllocator, B, zeroed));
                        })
                    })
                }),
                (HP_ON, &mut || {
                    with_hp(true, || {
                        ms(|| {
                            black_box(first_touch(&MklAllocator, B, zeroed));
                        })
                    })
                }),
                ("mimalloc", &mut || {
                    ms(|| {
                        black_box(first_touch(&ViaGlobal(mimalloc::MiMalloc), B, zeroed));
                    })
                }),
            ],
        );
        let how = if zeroed {
            "alloc_zeroed + write (vec![0.0; n], filled)"
        } else {
            "alloc + write"
        };
        t.group(&format!("6. first touch 64 MiB, {how}"), "ms", &series, 1);
        t.target(
            &format!("huge pages on ≥ 3x faster than off, first touch 64 MiB, {how}"),
            &series[2],
            &series[1],
            1.0 / 3.0,
        );
    }
}

/// Issue 10, the large rows: growth to 10^8, and 1 GiB blocks: first touch
/// (alloc + write, alloc_zeroed + write), a TLB-bound gather and a
/// streaming daxpy over memory already touched. About a minute.
fn huge_1gib_group(t: &mut Table) {
    const N: usize = 100_000_000;
    huge_growth(t, 3, N, "7.", "10^8");
    const B: usize = 1 << 30;
    const READS: usize = 20_000_000;
    fn run<A: allocator_api2::alloc::Allocator + Copy>(a: A) -> Vec<f64> {
        let touch = ms(|| {
            black_box(first_touch(&a, B, false));
        });
        let touch_zeroed = ms(|| {
            black_box(first_touch(&a, B, true));
        });
        let mut block = Filled::new(a, B / 8);
        let g = ms(|| {
            black_box(gather(block.as_mut_slice(), READS));
        });
        let d = ms(|| {
            black_box(daxpy_halves(block.as_mut_slice(), 0.5));
        });
        vec![touch, touch_zeroed, g, d]
    }
    let m = interleave_multi(
        4,
        4,
        &mut [
            ("System", &mut || run(ViaGlobal(std::alloc::System))),
            (HP_OFF, &mut || {
                set_huge_pages(false);
                run(MklAllocator)
            }),
            (HP_ON, &mut || {
                set_huge_pages(true);
                let v = run(MklAllocator);
                set_huge_pages(false);
                v
            }),
            ("mimalloc", &mut || run(&ViaGlobal(mimalloc::MiMalloc))),
        ],
    );
    let titles = [
        "7. first touch 1 GiB, alloc + write",
        "7. first touch 1 GiB, alloc_zeroed + write",
        "7. gather 2·10^7 random f64 over 1 GiB",
        "7. daxpy over 1 GiB (y += a·x, 512 MiB each)",
    ];
    for (title, series) in titles.iter().zip(&m) {
        t.group(title, "ms", series, 1);
    }
    for (i, title) in titles[..2].iter().enumerate() {
        t.target(
            &format!("huge pages on ≥ 3x faster than off, {}", &title[3..]),
            &m[i][2],
            &m[i][1],
            1.0 / 3.0,
        );
    }
}

/// Issue 10, why the 1 GiB first touch is slow with huge pages on this
/// machine: the same 1 GiB block allocated + written right after an equal
/// block was freed, and after a 5 s pause (in which a VM with free page
/// reporting hands the freed 2 MiB frames back to the host). Alternating
/// off / on, 3 rounds of (pause, then two back-to-back blocks); about 40 s.
fn huge_reuse_group(t: &mut Table) {
    const B: usize = 1 << 30;
    const ROUNDS: usize = 3;
    let names = [HP_OFF, HP_ON];
    let new = |n: &str| Series {
        name: n.to_string(),
        values: vec![],
    };
    let mut after_pause: Vec<Series> = names.iter().map(|n| new(n)).collect();
    let mut back_to_back: Vec<Series> = names.iter().map(|n| new(n)).collect();
    let touch = |on: bool| {
        with_hp(on, || {
            ms(|| {
                black_box(first_touch(&MklAllocator, B, false));
            })
        })
    };
    for r in 0..ROUNDS {
        for i in order(2, r) {
            std::thread::sleep(std::time::Duration::from_secs(5));
            after_pause[i].values.push(touch(i == 1));
            let a = touch(i == 1);
            let b = touch(i == 1);
            back_to_back[i].values.push(a.max(b));
        }
    }
    t.group(
        "7b. first touch 1 GiB after a 5 s pause",
        "ms",
        &after_pause,
        0,
    );
    t.group(
        "7b. first touch 1 GiB right after freeing 1 GiB (slower of two)",
        "ms",
        &back_to_back,
        0,
    );
}

/// The block the stall children allocate and touch.
const STALL_BYTES: usize = 256 << 20;

/// Child of `huge_stall_group`: prepares the machine state `pre` names,
/// then allocates and touches one MKL block of STALL_BYTES with huge
/// pages `on` or off; prints its thread CPU time and wall time.
fn stall_child(on: bool, pre: &str) {
    let page = 4096;
    // Anonymous memory in 4 KiB pages (MADV_NOHUGEPAGE, whatever THP says).
    let map = |bytes: usize| -> *mut u8 {
        // SAFETY: a fresh private anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap of {bytes} bytes failed");
        // SAFETY: the mapping just made; the advice changes no contents.
        unsafe { libc::madvise(p, bytes, libc::MADV_NOHUGEPAGE) };
        let p = p.cast::<u8>();
        for off in (0..bytes).step_by(page) {
            // SAFETY: inside the mapping.
            unsafe { p.add(off).write(1) };
        }
        p
    };
    let mut keep: Option<(*mut u8, usize)> = None;
    match pre {
        "fresh" => {}
        // 512 MiB of 4 KiB pages touched and unmapped just before.
        "after-free" => {
            let b = 512 << 20;
            let p = map(b);
            // SAFETY: the whole mapping made above, not used again.
            unsafe { libc::munmap(p.cast(), b) };
        }
        // 1 GiB of 4 KiB pages with every other page given back: 512 MiB
        // stays resident, spread over every 2 MiB frame it touched.
        "fragmented" => {
            let b = 1 << 30;
            let p = map(b);
            for off in (0..b).step_by(2 * page) {
                // SAFETY: one page inside the mapping; its contents are not
                // needed again.
                unsafe { libc::madvise(p.add(off).cast(), page, libc::MADV_DONTNEED) };
            }
            keep = Some((p, b));
        }
        other => panic!("unknown stall preparation {other}"),
    }
    set_huge_pages(on);
    let wall = Instant::now();
    let cpu = ms(|| {
        black_box(first_touch(&MklAllocator, STALL_BYTES, false));
    });
    let wall = wall.elapsed().as_secs_f64() * 1e3;
    if let Some((p, b)) = keep {
        // SAFETY: the mapping made above, not used again.
        unsafe { libc::munmap(p.cast(), b) };
    }
    println!("cpu_ms={cpu} wall_ms={wall}");
}

/// Issue 10, the cost: the slowest single allocation + first touch of a
/// 256 MiB MKL block among N fresh processes, huge pages off and on, in
/// three machine states (fresh; right after 512 MiB of 4 KiB pages were
/// freed; with 512 MiB of 4 KiB pages scattered over 1 GiB of frames).
fn huge_stall_group(t: &mut Table) {
    const N: usize = 6;
    let exe = std::env::current_exe().expect("perf's own path");
    let pres = ["fresh", "after-free", "fragmented"];
    // [pre][off, on] -> (cpu, wall) per child
    let mut cells: Vec<[(Series, Series); 2]> = pres
        .iter()
        .map(|_| {
            [false, true].map(|on| {
                let n = if on { HP_ON } else { HP_OFF };
                let s = || Series {
                    name: n.to_string(),
                    values: vec![],
                };
                (s(), s())
            })
        })
        .collect();
    for r in 0..N {
        for i in order(2 * pres.len(), r) {
            let (p, on) = (i / 2, i % 2 == 1);
            let out = Command::new(&exe)
                .args(["--stall-child", if on { "on" } else { "off" }, pres[p]])
                .output()
                .expect("run a stall child");
            assert!(out.status.success(), "stall child failed: {out:?}");
            let line = String::from_utf8_lossy(&out.stdout).into_owned();
            let field = |k: &str| -> f64 {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix(k))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("no {k} in {line:?}"))
            };
            cells[p][on as usize].0.values.push(field("cpu_ms="));
            cells[p][on as usize].1.values.push(field("wall_ms="));
        }
    }
    let max = |s: &Series| s.values.iter().copied().fold(0.0, f64::max);
    for (p, cell) in pres.iter().zip(&cells) {
        for (clock, pick) in [("CPU", 0), ("wall", 1)] {
            let [off, on] = cell;
            let (off, on) = if pick == 0 {
                (&off.0, &on.0)
            } else {
                (&off.1, &on.1)
            };
            let title = format!("8. alloc+touch 256 MiB in a fresh process, {p}, {clock} time");
            t.group(
                &format!("{title}, median of {N}"),
                "ms",
                &[off.clone(), on.clone()],
                0,
            );
            t.rows.push(format!(
                "| {title}, slowest of {N} | {} | {} ms | 1.00 (baseline) |",
                off.name,
                fmt_num(max(off))
            ));
            t.rows.push(format!(
                "| {title}, slowest of {N} | {} | {} ms | {:.2} |",
                on.name,
                fmt_num(max(on)),
                max(on) / max(off)
            ));
        }
    }
}

const WORKLOADS: [&str; 4] = ["system", "mimalloc", "mkl", "split"];

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

/// Runs one workload binary; returns (CPU ms, wall ms, peak RSS in KiB).
fn run_workload(bin: &Path, entries: usize) -> (f64, f64, f64) {
    let out = Command::new(bin)
        .arg(entries.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(out.status.success(), "{} failed", bin.display());
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |k: &str| -> f64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {line:?}"))
    };
    (field("cpu_ms="), field("time_ms="), field("peak_rss_kib="))
}

fn workload_group(t: &mut Table) {
    const ROUNDS: usize = 5;
    const OTHER_ROUNDS: usize = 2;
    const ENTRIES: usize = 1_000_000;
    let Some(bins) = workload_binaries() else {
        t.rows
            .push("| 5. workload | (not run: workload binaries missing) | | |".into());
        return;
    };
    let names = ["System", "mimalloc", "MklAllocator", "MklSplitAllocator"];
    let mut times: Vec<Series> = names
        .iter()
        .map(|n| Series {
            name: n.to_string(),
            values: vec![],
        })
        .collect();
    let mut walls: Vec<Series> = names
        .iter()
        .map(|n| Series {
            name: n.to_string(),
            values: vec![],
        })
        .collect();
    let mut rss: Vec<Series> = names
        .iter()
        .map(|n| Series {
            name: n.to_string(),
            values: vec![],
        })
        .collect();
    // No warm-up round: each run is a fresh process (the binaries are in
    // the page cache after the first). The pair the target compares,
    // System and MklSplitAllocator, runs in every round; mimalloc and pure
    // MKL in the first OTHER_ROUNDS only, to stay under two minutes.
    for r in 0..ROUNDS {
        let who: &[usize] = if r < OTHER_ROUNDS {
            &[0, 1, 2, 3]
        } else {
            &[0, 3]
        };
        for j in order(who.len(), r) {
            let i = who[j];
            let (cpu, wall, kib) = run_workload(&bins[i], ENTRIES);
            times[i].values.push(cpu);
            walls[i].values.push(wall);
            rss[i].values.push(kib / 1024.0);
        }
    }
    t.group("5. workload CPU time (10^6 entries)", "ms", &times, 0);
    t.group("5. workload wall time", "ms", &walls, 0);
    t.group("5. workload peak RSS", "MiB", &rss, 0);
    t.target(
        "split allocator ≤ 1.1x System, workload CPU time",
        &times[3],
        &times[0],
        1.1,
    );
    t.target(
        "split allocator ≤ 1.1x System, workload peak RSS",
        &rss[3],
        &rss[0],
        1.1,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--stall-child") {
        stall_child(args[2] == "on", &args[3]);
        return;
    }
    let start = Instant::now();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut t = Table {
        rows: vec![],
        targets: vec![],
    };
    type Group = fn(&mut Table);
    let steps: [(&str, Group); 11] = [
        ("alloc+free", alloc_free_group),
        ("small objects", small_objects_group),
        ("Vec growth", growth_group),
        ("hashbrown", hashbrown_group),
        ("views", views_group),
        ("workload", workload_group),
        ("huge pages", huge_pages_group),
        ("huge 1GiB", huge_1gib_group),
        ("huge 1GiB reuse", huge_reuse_group),
        ("huge stall", huge_stall_group),
        ("block cache", block_cache_group),
    ];
    // `perf -- <word>…`: only the groups whose name contains a word.
    let only: Vec<String> = std::env::args().skip(1).collect();
    for (name, f) in steps {
        if !only.is_empty() && !only.iter().any(|w| name.contains(w.as_str())) {
            continue;
        }
        let t0 = Instant::now();
        f(&mut t);
        eprintln!("perf: {name} done in {:.1} s", t0.elapsed().as_secs_f64());
    }

    println!(
        "Machine: {cpu}, {cores} logical cores. Medians of interleaved rounds; ratios are medians of per-round ratios.\n"
    );
    println!("| Workload | Competitor | Median | Ratio to baseline |");
    println!("|---|---|---:|---:|");
    for r in &t.rows {
        println!("{r}");
    }
    println!("\n| Target (issues 4, 10, 15) | Ratio of | Ratio | Limit | Status |");
    println!("|---|---|---:|---:|---|");
    for r in &t.targets {
        println!("{r}");
    }
    println!("\nTotal time: {:.1} s", start.elapsed().as_secs_f64());
}
