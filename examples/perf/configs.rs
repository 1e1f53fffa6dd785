//! Issue 21's groups: the library's configurations as competitors. Every
//! measurement runs in a fresh child process (`perf --child <kernel> <who>
//! …`) whose environment selects the configuration: "MKL defaults" has
//! every `MKL_ALLOC_*` variable removed, "MKL everything off" has
//! `MKL_ALLOC_BLOCK_CACHE=off MKL_ALLOC_HUGE_PAGES=off`. System, mimalloc
//! and jemalloc run the same kernels in children of their own, so that
//! every competitor starts from the same fresh process; the rounds are
//! interleaved in shuffled orders as everywhere in perf.
//!
//! The group "config backing off" (issue 30) sets MKL's memory pointers
//! (the defaults) against leaving them alone (`MKL_ALLOC_BACKING=off`, MKL
//! on glibc): raw `MKL_malloc`/`MKL_free`, and MKL calls that allocate
//! inside MKL (`LAPACKE_dgesvd`, a DFTI FFT), declared below.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::{c_char, c_int, c_long, c_void};
use std::hint::black_box;
use std::time::Instant;

use mkl_alloc::MklAllocator;
use serde_json::json;

use crate::harness::{Env, Series, child, field, interleave_multi, ms, per_op, rss_mib};
use crate::harness::{MultiCompetitor, thread_cpu_ns};
use crate::report::Table;
use crate::support::*;

/// Binds `$g` to the `GlobalAlloc` `$who` names and evaluates `$body`.
macro_rules! on_global {
    ($who:expr, $g:ident => $body:expr) => {
        match $who {
            "system" => {
                let $g = std::alloc::System;
                $body
            }
            "mimalloc" => {
                let $g = mimalloc::MiMalloc;
                $body
            }
            "jemalloc" => {
                let $g = tikv_jemallocator::Jemalloc;
                $body
            }
            "mkl" => {
                let $g = MklAllocator;
                $body
            }
            other => panic!("unknown allocator {other}"),
        }
    };
}

/// Binds `$a` to the allocator-api2 `Allocator` `$who` names (System,
/// mimalloc and jemalloc through [`ViaGlobal`], MklAllocator itself, as groups 2, 6 and
/// 9 measure it) and evaluates `$body`.
macro_rules! on_alloc {
    ($who:expr, $a:ident => $body:expr) => {
        match $who {
            "system" => {
                let $a = ViaGlobal(std::alloc::System);
                $body
            }
            "mimalloc" => {
                let $a = ViaGlobal(mimalloc::MiMalloc);
                $body
            }
            "jemalloc" => {
                let $a = ViaGlobal(tikv_jemallocator::Jemalloc);
                $body
            }
            "mkl" => {
                let $a = MklAllocator;
                $body
            }
            other => panic!("unknown allocator {other}"),
        }
    };
}

/// A competitor of the configuration groups.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    RawMkl,
    System,
    Mimalloc,
    Jemalloc,
    MklDefaults,
    MklOff,
    /// Raw MKL (or an MKL call) with `MKL_ALLOC_BACKING=off`: MKL's
    /// pointers left alone, MKL on glibc.
    BackingOff,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::RawMkl => "raw MKL_malloc/MKL_free",
            Who::System => "System",
            Who::Mimalloc => "mimalloc",
            Who::Jemalloc => "jemalloc",
            Who::MklDefaults => MKL_DEFAULTS,
            Who::MklOff => MKL_OFF,
            Who::BackingOff => BACKING_OFF,
        }
    }

    /// The allocator the child uses (both MKL configurations: MklAllocator).
    fn arg(self) -> &'static str {
        match self {
            Who::RawMkl | Who::BackingOff => "raw-mkl",
            Who::System => "system",
            Who::Mimalloc => "mimalloc",
            Who::Jemalloc => "jemalloc",
            Who::MklDefaults | Who::MklOff => "mkl",
        }
    }

    fn env(self) -> Env {
        match self {
            Who::MklOff => Env::AllOff,
            Who::BackingOff => Env::BackingOff,
            _ => Env::Defaults,
        }
    }

    /// Runs `perf --child <kernel> <who> <args…>`.
    fn run(self, kernel: &str, args: &[String]) -> Vec<(String, f64)> {
        let mut all = vec![kernel.to_string(), self.arg().to_string()];
        all.extend_from_slice(args);
        child(self.env(), &all)
    }
}

pub const MKL_DEFAULTS: &str = "MKL defaults";
pub const MKL_OFF: &str = "MKL everything off";
pub const BACKING_OFF: &str = "MKL_ALLOC_BACKING=off";

/// The big-buffer competitors, System (the baseline) first.
const BIG: [Who; 5] = [
    Who::System,
    Who::Mimalloc,
    Who::MklDefaults,
    Who::MklOff,
    Who::Jemalloc,
];

/// Runs `rounds` interleaved rounds of `kernel args` for each of `who`,
/// collecting the fields `keys`: the result is indexed `[key][who]`.
fn rounds(
    rounds: usize,
    who: &[Who],
    kernel: &str,
    args: &[String],
    keys: &[&str],
) -> Vec<Vec<Series>> {
    let mut runs: Vec<Box<dyn FnMut() -> Vec<f64>>> = who
        .iter()
        .map(|&w| {
            let args = args.to_vec();
            Box::new(move || {
                let f = w.run(kernel, &args);
                keys.iter().map(|k| field(&f, k)).collect()
            }) as Box<dyn FnMut() -> Vec<f64>>
        })
        .collect();
    let mut competitors: Vec<MultiCompetitor<'_>> = who
        .iter()
        .zip(runs.iter_mut())
        .map(|(w, f)| (w.name(), &mut **f as &mut dyn FnMut() -> Vec<f64>))
        .collect();
    interleave_multi(rounds, keys.len(), false, &mut competitors)
}

/// What each configuration's child reports of the two policies, for the
/// JSON (`configurations`).
pub fn record_policies(t: &mut Table) {
    if t.configurations.contains_key(MKL_DEFAULTS) {
        return;
    }
    for who in [Who::MklDefaults, Who::MklOff] {
        record_policy(t, who);
    }
}

/// One configuration's entry of the JSON's `configurations`: the
/// policies its child saw, and MKL's backing (`manager::stats().backing`).
fn record_policy(t: &mut Table, who: Who) {
    let f = who.run("policy", &[]);
    let opt = |k: &str| Some(field(&f, k)).filter(|v| *v >= 0.0);
    let env = match who.env() {
        Env::Defaults => json!({}),
        Env::AllOff => json!({"MKL_ALLOC_BLOCK_CACHE": "off", "MKL_ALLOC_HUGE_PAGES": "off"}),
        Env::BackingOff => json!({"MKL_ALLOC_BACKING": "off"}),
        Env::MediumOff => json!({"MKL_ALLOC_MEDIUM": "off"}),
    };
    t.configurations.insert(
        who.name().to_string(),
        json!({
            "env": env,
            "block_cache_budget": opt("cache"),
            "huge_pages_threshold": opt("hp"),
            "backing": backing_name(field(&f, "backing")),
        }),
    );
}

/// [`backing_code`]'s number back to the state's name.
fn backing_name(code: f64) -> &'static str {
    match code as u8 {
        1 => "Active",
        2 => "MklRanFirst",
        3 => "Off",
        _ => "Unset",
    }
}

/// The backing's state in this process, as a number for a child's line.
fn backing_code() -> u8 {
    use mkl_alloc::backing::{Backing, state};
    mkl_alloc::manager::init();
    match state() {
        Backing::Unset => 0,
        Backing::Active => 1,
        Backing::MklRanFirst => 2,
        Backing::Off => 3,
    }
}

/// alloc+free of 16 B .. 1 MiB (align 64): MklAllocator in both
/// configurations against raw MKL_malloc/MKL_free, System, mimalloc and
/// jemalloc.
pub fn small_blocks_group(t: &mut Table) {
    const ROUNDS: usize = 21;
    record_policies(t);
    let who = [
        Who::RawMkl,
        Who::MklDefaults,
        Who::MklOff,
        Who::System,
        Who::Mimalloc,
        Who::Jemalloc,
    ];
    for size in SIZES {
        let layout = Layout::from_size_align(size, ALIGN).unwrap();
        // A batch of about 2 ms of raw MKL, as group 1.
        let probe = per_op(2000, || alloc_free_raw_mkl(layout, 2000));
        let iters = ((2e6 / probe) as u64).clamp(200, 200_000);
        let args = [size.to_string(), iters.to_string()];
        let m = rounds(ROUNDS, &who, "alloc-free", &args, &["ns"]);
        let title = format!(
            "21. alloc+free {} (align 64), fresh process",
            size_name(size)
        );
        t.group(&title, "ns", &m[0], 0);
        if size == 16 {
            t.target(
                "16 B alloc+free ≤ 1.03x raw MKL (MKL defaults)",
                &m[0][1],
                &m[0][0],
                1.03,
            );
        }
    }
}

/// Issue 21's big buffers: 8 x 64 MiB temporaries, Vec push to 10^7 (the
/// second push of a process), and `vec![0.0f64; 1 << 26]` untouched,
/// filled, and with 1% of its pages written.
pub fn big_buffers_group(t: &mut Table) {
    record_policies(t);
    let m = rounds(11, &BIG, "temporaries", &[], &["ms"]);
    t.group(
        "21. 64 MiB temporaries, 8 per round (alloc, write all, free)",
        "ms",
        &m[0],
        0,
    );
    t.target(
        "64 MiB temporaries ≤ 0.5x System (MKL defaults)",
        &m[0][2],
        &m[0][0],
        0.5,
    );

    push_rows(t, 11, 10_000_000, "10^7");

    const ZEROS: &str = "21. vec![0.0f64; 1 << 26] (512 MiB)";
    let keys = ["ms", "rss_mib"];
    let m = rounds(9, &BIG, "zeros", &["untouched".into()], &keys);
    t.group(&format!("{ZEROS}, untouched: alloc + free"), "ms", &m[0], 0);
    t.group(
        &format!("{ZEROS}, untouched: resident growth"),
        "MiB",
        &m[1],
        0,
    );
    t.target(
        "vec![0.0; 2^26] untouched ≤ 1.2x System (MKL defaults)",
        &m[0][2],
        &m[0][0],
        1.2,
    );
    let what = "vec![0.0; 2^26] untouched, RSS growth ≤ System's + 16 MiB (MKL defaults)";
    t.target_diff(what, &m[1][2], &m[1][0], 16.0, "MiB");

    let m = rounds(9, &BIG, "zeros", &["filled".into()], &keys);
    t.group(&format!("{ZEROS}, zeroed then filled"), "ms", &m[0], 0);
    t.target(
        "vec![0.0; 2^26] zeroed then filled ≤ 1.0x System (MKL defaults)",
        &m[0][2],
        &m[0][0],
        1.0,
    );

    let m = rounds(9, &BIG, "zeros", &["sparse".into()], &keys);
    t.group(&format!("{ZEROS}, 1% of pages written"), "ms", &m[0], 0);
    t.group(
        &format!("{ZEROS}, 1% of pages written: resident growth"),
        "MiB",
        &m[1],
        0,
    );
}

/// Vec push to 10^8, the second push of a process (about two minutes).
pub fn push_1e8_group(t: &mut Table) {
    record_policies(t);
    push_rows(t, 5, 100_000_000, "10^8");
}

/// `Vec<f64, A>` pushed to `n` twice in a fresh process: rows for the
/// second push (the target) and the first.
fn push_rows(t: &mut Table, r: usize, n: usize, name: &str) {
    let m = rounds(r, &BIG, "push", &[n.to_string()], &["ms", "first_ms"]);
    t.group(
        &format!("21. Vec<f64> push to {name}, the second time"),
        "ms",
        &m[0],
        0,
    );
    t.group(
        &format!("21. Vec<f64> push to {name}, the first time"),
        "ms",
        &m[1],
        0,
    );
    let what = format!("Vec push to {name} (second time) ≤ 1.0x System (MKL defaults)");
    t.target(&what, &m[0][2], &m[0][0], 1.0);
}

/// `perf --child <kernel> <who> <args…>`: one measurement, printed as
/// `key=value` pairs on one line.
pub fn child_main(args: &[String]) {
    let kernel = args[0].as_str();
    if kernel == "stall" {
        crate::stall::stall_child(args[1] == "on", &args[2]);
        return;
    }
    let who = args[1].as_str();
    let num = |i: usize| -> usize { args[i].parse().expect("a number") };
    let line = match kernel {
        "policy" => {
            let or_minus = |x: Option<usize>| x.map_or(-1.0, |v| v as f64);
            format!(
                "cache={} hp={} backing={}",
                or_minus(mkl_alloc::block_cache::budget()),
                or_minus(mkl_alloc::huge_pages::threshold()),
                backing_code()
            )
        }
        "alloc-free" => {
            let layout = Layout::from_size_align(num(2), ALIGN).unwrap();
            let iters = num(3) as u64;
            // One warm-up batch, then the median of five: a fresh process
            // starts with cold caches and MKL's pools empty.
            let batches = |f: &dyn Fn()| {
                f();
                let mut t: Vec<f64> = (0..5).map(|_| per_op(iters, f)).collect();
                format!("ns={}", median(&mut t))
            };
            if who == "raw-mkl" {
                batches(&|| alloc_free_raw_mkl(layout, iters))
            } else {
                on_global!(who, g => batches(&|| alloc_free(&g, layout, iters)))
            }
        }
        "temporaries" => on_alloc!(who, a => temporaries(&a)),
        "push" => on_alloc!(who, a => push_twice(&a, num(2))),
        "zeros" => on_global!(who, g => zeros(&g, &args[2])),
        "raw-alloc-free" => {
            let layout = Layout::from_size_align(num(2), ALIGN).unwrap();
            let iters = num(3) as u64;
            mkl_alloc::manager::init();
            alloc_free_raw_mkl(layout, iters);
            let mut t: Vec<f64> = (0..5)
                .map(|_| per_op(iters, || alloc_free_raw_mkl(layout, iters)))
                .collect();
            format!("ns={} backing={}", median(&mut t), backing_code())
        }
        "dgesvd" => format!(
            "{} backing={}",
            dgesvd_calls(num(2), num(3)),
            backing_code()
        ),
        "fft" => format!("{} backing={}", fft_calls(num(2), num(3)), backing_code()),
        other => panic!("unknown child kernel {other}"),
    };
    println!("{line}");
}

/// 8 temporaries of 64 MiB: allocated, written, freed.
fn temporaries<A: allocator_api2::alloc::Allocator>(a: &A) -> String {
    let wall = Instant::now();
    let cpu = ms(|| {
        for _ in 0..8 {
            black_box(first_touch(a, 64 << 20, false));
        }
    });
    format!("ms={cpu} wall_ms={}", wall.elapsed().as_secs_f64() * 1e3)
}

/// `Vec<f64, A>` pushed to `n`, dropped, and pushed to `n` again.
fn push_twice<A: allocator_api2::alloc::Allocator>(a: &A, n: usize) -> String {
    let first = ms(|| {
        black_box(vec_growth(a, n));
    });
    let second = ms(|| {
        black_box(vec_growth(a, n));
    });
    format!("ms={second} first_ms={first}")
}

/// `vec![0.0f64; 1 << 26]` as std makes it (`GlobalAlloc::alloc_zeroed`,
/// align 8), then per `mode`: nothing written ("untouched"), every f64
/// written ("filled"), or one f64 in every 100th 4 KiB page ("sparse");
/// freed. Time (thread CPU) of the whole, and the resident growth measured
/// just before the free (after a warm-up: the allocator's first use).
fn zeros<G: GlobalAlloc>(g: &G, mode: &str) -> String {
    const N: usize = 1 << 26;
    let layout = Layout::array::<f64>(N).unwrap();
    // The allocator's first use (its pools, code pages) is not the block's
    // cost: a 16 B and a 1 MiB block first.
    for bytes in [16, 1 << 20] {
        let l = Layout::from_size_align(bytes, 8).unwrap();
        // SAFETY: a non-zero size.
        let p = black_box(unsafe { g.alloc(l) });
        assert!(!p.is_null(), "warm-up allocation failed");
        // SAFETY: allocated just above with `l`, freed once.
        unsafe { g.dealloc(p, l) };
    }
    let before = rss_mib();
    let t0 = thread_cpu_ns();
    // SAFETY: a non-zero size.
    let p = unsafe { g.alloc_zeroed(layout) }.cast::<f64>();
    assert!(!p.is_null(), "alloc_zeroed of 512 MiB failed");
    match mode {
        "untouched" => {}
        "filled" => (0..N).for_each(|i| {
            // SAFETY: i < N, inside the block.
            unsafe { p.add(i).write(i as f64) }
        }),
        "sparse" => (0..N).step_by(100 * 4096 / 8).for_each(|i| {
            // SAFETY: i < N, inside the block.
            unsafe { p.add(i).write(1.0) }
        }),
        other => panic!("unknown zeros mode {other}"),
    }
    black_box(p);
    let t1 = thread_cpu_ns();
    let grown = rss_mib() - before;
    let t2 = thread_cpu_ns();
    // SAFETY: allocated above with `layout`, freed once.
    unsafe { g.dealloc(p.cast(), layout) };
    let t3 = thread_cpu_ns();
    format!("ms={} rss_mib={grown}", ((t1 - t0) + (t3 - t2)) / 1e6)
}

/// Issue 30: MKL's memory pointers set (the defaults: MKL's blocks of
/// 1 MiB and more in the crate's chunks, cached and on huge pages beneath
/// MKL) against left alone (`MKL_ALLOC_BACKING=off`: MKL on glibc), each
/// run a fresh process; "MKL everything off" keeps the pointers set but
/// the cache and huge pages off. Raw `MKL_malloc`/`MKL_free`, then MKL
/// calls that allocate inside MKL: `LAPACKE_dgesvd` and a DFTI FFT.
pub fn backing_group(t: &mut Table) {
    record_policies(t);
    record_policy(t, Who::BackingOff);
    let who = [Who::BackingOff, Who::MklDefaults, Who::MklOff];
    for size in [16, 1 << 20] {
        let layout = Layout::from_size_align(size, ALIGN).unwrap();
        let probe = per_op(2000, || alloc_free_raw_mkl(layout, 2000));
        let iters = ((2e6 / probe) as u64).clamp(200, 200_000);
        let args = [size.to_string(), iters.to_string()];
        let m = rounds(15, &who, "raw-alloc-free", &args, &["ns", "backing"]);
        check_backing(&m[1]);
        let title = format!(
            "30. raw MKL_malloc + MKL_free {} (align 64), pointers set / unset",
            size_name(size)
        );
        t.group(&title, "ns", &m[0], 0);
    }

    let keys = ["ms", "first_ms", "backing"];
    const N: usize = 1000;
    let m = rounds(5, &who, "dgesvd", &[N.to_string(), "3".into()], &keys);
    check_backing(&m[2]);
    let what = format!("LAPACKE_dgesvd {N} x {N} (row-major, jobu = jobvt = 'A')");
    t.group(
        &format!("30. {what}, repeated (median of 3 calls)"),
        "ms",
        &m[0],
        0,
    );
    t.group(&format!("30. {what}, the first call"), "ms", &m[1], 0);
    t.target(
        &format!("{what} repeated ≤ 1.0x MKL_ALLOC_BACKING=off (MKL defaults)"),
        &m[0][1],
        &m[0][0],
        1.0,
    );

    const LOG2: usize = 22;
    let m = rounds(7, &who, "fft", &[LOG2.to_string(), "5".into()], &keys);
    check_backing(&m[2]);
    let what =
        format!("DFTI FFT of 2^{LOG2} complex doubles (create, commit, forward in place, free)");
    t.group(
        &format!("30. {what}, repeated (median of 5)"),
        "ms",
        &m[0],
        0,
    );
    t.group(&format!("30. {what}, the first"), "ms", &m[1], 0);
    t.target(
        &format!("FFT 2^{LOG2} repeated ≤ 1.0x MKL_ALLOC_BACKING=off (MKL defaults)"),
        &m[0][1],
        &m[0][0],
        1.0,
    );
}

/// Every child of the backing group ran in the state its configuration
/// asks for: `[BackingOff, MklDefaults, MklOff]`'s `backing` fields.
fn check_backing(b: &[Series]) {
    let want = ["Off", "Active", "Active"];
    for (s, w) in b.iter().zip(want) {
        for &v in &s.values {
            assert_eq!(
                backing_name(v),
                w,
                "{}: the backing was {}",
                s.name,
                backing_name(v)
            );
        }
    }
}

// MKL's C interfaces (LP64: `lapack_int` is a C int; `MKL_LONG` a C long
// on Linux), declared here: the default link mode (static MKL, lp64,
// sequential) has LAPACKE and DFTI.
const LAPACK_ROW_MAJOR: c_int = 101;
const DFTI_COMPLEX: c_int = 32;

unsafe extern "C" {
    fn LAPACKE_dgesvd(
        matrix_layout: c_int,
        jobu: c_char,
        jobvt: c_char,
        m: c_int,
        n: c_int,
        a: *mut f64,
        lda: c_int,
        s: *mut f64,
        u: *mut f64,
        ldu: c_int,
        vt: *mut f64,
        ldvt: c_int,
        superb: *mut f64,
    ) -> c_int;
    /// `DftiCreateDescriptor(h, DFTI_DOUBLE, domain, 1, length)` as
    /// mkl_dfti.h's macro expands it: the length is the variadic argument.
    fn DftiCreateDescriptor_d_1d(h: *mut *mut c_void, domain: c_int, ...) -> c_long;
    fn DftiCommitDescriptor(h: *mut c_void) -> c_long;
    fn DftiComputeForward(h: *mut c_void, x: *mut c_void, ...) -> c_long;
    fn DftiFreeDescriptor(h: *mut *mut c_void) -> c_long;
}

/// Deterministic values in [-1, 1) (xorshift), for the inputs.
fn fill(x: &mut [f64], seed: u64) {
    let mut s = seed | 1;
    for v in x {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *v = (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0;
    }
}

/// `LAPACKE_dgesvd` on an `n` x `n` matrix (every singular vector), once
/// and then `calls` times, each on a fresh copy of the same matrix; the
/// thread CPU time of each call (MKL sequential: all of it in this thread).
fn dgesvd_calls(n: usize, calls: usize) -> String {
    mkl_alloc::manager::init();
    let mut orig = vec![0.0f64; n * n];
    fill(&mut orig, 0x5EED);
    let (mut a, mut s) = (orig.clone(), vec![0.0f64; n]);
    let (mut u, mut vt) = (vec![0.0f64; n * n], vec![0.0f64; n * n]);
    let mut superb = vec![0.0f64; n];
    let ni = n as c_int;
    let mut once = || {
        a.copy_from_slice(&orig);
        ms(|| {
            // SAFETY: every array has the size its leading dimension and
            // n imply (n x n, n, n - 1 <= n); MKL writes only inside them.
            let info = unsafe {
                LAPACKE_dgesvd(
                    LAPACK_ROW_MAJOR,
                    b'A' as c_char,
                    b'A' as c_char,
                    ni,
                    ni,
                    a.as_mut_ptr(),
                    ni,
                    s.as_mut_ptr(),
                    u.as_mut_ptr(),
                    ni,
                    vt.as_mut_ptr(),
                    ni,
                    superb.as_mut_ptr(),
                )
            };
            assert_eq!(info, 0, "LAPACKE_dgesvd failed");
            black_box(s[0]);
        })
    };
    let first = once();
    let mut t: Vec<f64> = (0..calls).map(|_| once()).collect();
    format!("ms={} first_ms={first}", median(&mut t))
}

/// A DFTI FFT of 2^`log2` complex doubles, in place: descriptor created,
/// committed, computed forward and freed, once and then `calls` times;
/// the thread CPU time of each.
fn fft_calls(log2: usize, calls: usize) -> String {
    mkl_alloc::manager::init();
    let len = 1usize << log2;
    let mut orig = vec![0.0f64; 2 * len];
    fill(&mut orig, 0xF0F7);
    let mut x = orig.clone();
    let mut once = || {
        x.copy_from_slice(&orig);
        ms(|| {
            let mut h: *mut c_void = core::ptr::null_mut();
            // SAFETY: the calls of mkl_dfti.h for a 1-D double complex
            // transform in place (DFTI_PLACEMENT's default); x holds `len`
            // interleaved complex values; the handle is freed once.
            unsafe {
                let st = DftiCreateDescriptor_d_1d(&mut h, DFTI_COMPLEX, len as c_long);
                assert_eq!(st, 0, "DftiCreateDescriptor failed");
                assert_eq!(DftiCommitDescriptor(h), 0, "DftiCommitDescriptor failed");
                let st = DftiComputeForward(h, x.as_mut_ptr().cast::<c_void>());
                assert_eq!(st, 0, "DftiComputeForward failed");
                assert_eq!(DftiFreeDescriptor(&mut h), 0, "DftiFreeDescriptor failed");
            }
            black_box(x[0]);
        })
    };
    let first = once();
    let mut t: Vec<f64> = (0..calls).map(|_| once()).collect();
    format!("ms={} first_ms={first}", median(&mut t))
}
