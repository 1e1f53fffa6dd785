//! The measurement behind `MklSplitAllocator`'s default threshold (4 KiB):
//! for block sizes around it, at alignment 8 (what `String`, `Vec<u64>` &c.
//! ask for), the time of `System` vs MKL and the memory each live block
//! costs.
//!
//! ```text
//! cargo run --release --example split_threshold
//! ```
//!
//! Time: interleaved rounds of (a) one alloc + free and (b) 1000 blocks
//! allocated then freed, per competitor; medians, ns per block.
//! Memory: 20 000 live blocks, each written in full; the growth of VmRSS
//! divided by the count, minus the block size, is the per-block overhead.
//! The two memory measurements run in child processes (this binary
//! re-executed with an argument) so each starts from a fresh heap.

#[path = "../benches/support/mod.rs"]
mod support;

use core::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::time::Instant;

use mkl_alloc::MklAllocator;
use std::alloc::System;
use support::median;

const SIZES: [usize; 9] = [64, 512, 1024, 2048, 3072, 4096, 8192, 16384, 65536];
const LIVE: usize = 20_000;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Child mode: `<system|mkl> <size>`: prints the overhead per live block.
fn memory_child(which: &str, size: usize) {
    let layout = Layout::from_size_align(size, 8).unwrap();
    let before = rss_kib();
    let mut blocks = Vec::with_capacity(LIVE);
    for _ in 0..LIVE {
        // SAFETY: non-zero size.
        let p = unsafe {
            if which == "mkl" {
                MklAllocator.alloc(layout)
            } else {
                System.alloc(layout)
            }
        };
        assert!(!p.is_null());
        // SAFETY: the block holds `size` bytes.
        unsafe { p.write_bytes(1, size) };
        blocks.push(p);
    }
    let after = rss_kib();
    let per_block = (after - before) as f64 * 1024.0 / LIVE as f64;
    println!("{:.0}", per_block - size as f64);
    for p in blocks {
        // SAFETY: allocated above with `layout`, freed once.
        unsafe {
            if which == "mkl" {
                MklAllocator.dealloc(p, layout)
            } else {
                System.dealloc(p, layout)
            }
        }
    }
}

fn overhead(which: &str, size: usize) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([which, &size.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn batch<A: GlobalAlloc>(a: &A, layout: Layout, ptrs: &mut [*mut u8]) {
    for p in ptrs.iter_mut() {
        // SAFETY: non-zero size.
        *p = unsafe { a.alloc(black_box(layout)) };
    }
    for &p in ptrs.iter().rev() {
        // SAFETY: allocated just above with `layout`, freed once.
        unsafe { a.dealloc(black_box(p), layout) };
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 {
        return memory_child(&args[1], args[2].parse().unwrap());
    }
    println!(
        "| block (align 8) | System alloc+free | MKL alloc+free | MKL/System | System 1000 live | MKL 1000 live | MKL/System | System overhead/block | MKL overhead/block |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for size in SIZES {
        let layout = Layout::from_size_align(size, 8).unwrap();
        let (mut s1, mut m1, mut sb, mut mb) = (vec![], vec![], vec![], vec![]);
        let mut ptrs = vec![core::ptr::null_mut(); 1000];
        const ITERS: u64 = 20_000;
        for round in 0..=25 {
            let t = Instant::now();
            support::alloc_free(&System, layout, ITERS);
            let s = t.elapsed().as_nanos() as f64 / ITERS as f64;
            let t = Instant::now();
            support::alloc_free(&MklAllocator, layout, ITERS);
            let m = t.elapsed().as_nanos() as f64 / ITERS as f64;
            let t = Instant::now();
            batch(&System, layout, &mut ptrs);
            let s2 = t.elapsed().as_nanos() as f64 / 1000.0;
            let t = Instant::now();
            batch(&MklAllocator, layout, &mut ptrs);
            let m2 = t.elapsed().as_nanos() as f64 / 1000.0;
            if round > 0 {
                s1.push(s);
                m1.push(m);
                sb.push(s2);
                mb.push(m2);
            }
        }
        let r1: Vec<f64> = m1.iter().zip(&s1).map(|(m, s)| m / s).collect();
        let rb: Vec<f64> = mb.iter().zip(&sb).map(|(m, s)| m / s).collect();
        println!(
            "| {} | {:.1} ns | {:.1} ns | {:.2} | {:.1} ns | {:.1} ns | {:.2} | {} B | {} B |",
            support::size_name(size),
            median(&mut s1),
            median(&mut m1),
            median(&mut r1.clone()),
            median(&mut sb),
            median(&mut mb),
            median(&mut rb.clone()),
            overhead("system", size),
            overhead("mkl", size),
        );
    }
}
