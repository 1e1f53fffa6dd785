//! What a shrink costs and what it gives back, in place (`MKL_realloc`)
//! against moved (`MKL_malloc` + copy + `MKL_free`): the measurement behind
//! `SHRINK_MOVE_MIN` and `SHRINK_MOVE_RATIO` in `src/allocator.rs`.
//!
//! ```text
//! cargo run --release --example shrink_threshold
//! ```
//!
//! For each block size and each target fraction of it, one thread, fresh
//! blocks, the two ways interleaved (in place, moved, in place, ...), five
//! rounds each, the median reported: the time of the shrink alone, the bytes
//! MKL still counts for the block afterwards (`MKL_Mem_Stat`), and how much
//! resident memory (RSS) the shrink gave back. Every block is filled first
//! so that its pages are resident.

use core::ffi::{c_int, c_void};
use std::time::Instant;

use mkl_alloc::ffi;

const ROUNDS: usize = 5;

fn mem_stat() -> i64 {
    let mut n: c_int = 0;
    // SAFETY: MKL_Mem_Stat writes one int through a valid pointer.
    unsafe { ffi::MKL_Mem_Stat(&mut n) }
}

/// Resident bytes of this process (`/proc/self/statm`, field 2).
fn rss() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: i64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as i64
}

/// A fresh MKL block of `size` bytes at alignment 64, every byte written.
fn filled(size: usize) -> *mut u8 {
    // SAFETY: size > 0, alignment 64.
    let p = unsafe { ffi::MKL_malloc(size, 64) }.cast::<u8>();
    assert!(!p.is_null(), "MKL_malloc({size}) failed");
    // SAFETY: p is a fresh block of `size` bytes.
    unsafe { p.write_bytes(0x5a, size) };
    p
}

struct Outcome {
    nanos: u128,
    /// MKL_Mem_Stat after the shrink minus before the block existed.
    held: i64,
    /// RSS given back by the shrink (before it minus after it).
    returned: i64,
}

/// Shrinks a fresh filled block of `old` bytes to `new`, in place or moved.
fn shrink_once(old: usize, new: usize, moved: bool) -> Outcome {
    let base = mem_stat();
    let p = filled(old);
    let rss_before = rss();
    let start = Instant::now();
    let q = if moved {
        // SAFETY: new > 0; the fresh block and p are distinct, p holds old
        // >= new bytes and is freed once.
        unsafe {
            let q = ffi::MKL_malloc(new, 64).cast::<u8>();
            assert!(!q.is_null());
            core::ptr::copy_nonoverlapping(p, q, new);
            ffi::MKL_free(p.cast());
            q
        }
    } else {
        // SAFETY: p is a live MKL block; new > 0.
        let q = unsafe { ffi::MKL_realloc(p.cast::<c_void>(), new) }.cast::<u8>();
        assert!(!q.is_null());
        q
    };
    let nanos = start.elapsed().as_nanos();
    let outcome = Outcome {
        nanos,
        held: mem_stat() - base,
        returned: rss_before - rss(),
    };
    // SAFETY: q is the live block; freed once.
    unsafe { ffi::MKL_free(q.cast()) };
    outcome
}

fn median(mut v: Vec<i128>) -> i128 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn human(bytes: i128) -> String {
    let (b, sign) = (bytes.abs(), if bytes < 0 { "-" } else { "" });
    if b >= 1 << 20 {
        format!("{sign}{:.1} MiB", b as f64 / (1 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{sign}{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{sign}{b} B")
    }
}

fn main() {
    println!(
        "{:>9} {:>6} | {:>11} {:>11} {:>11} | {:>11} {:>11} {:>11}",
        "block", "to", "in place ns", "MKL holds", "RSS back", "moved ns", "MKL holds", "RSS back"
    );
    for shift in [12, 14, 16, 17, 18, 20, 22, 24, 26, 28] {
        let old = 1usize << shift;
        for div in [2usize, 4, 16, 1 << 20] {
            let new = (old / div).max(1);
            let mut rows: [Vec<[i128; 3]>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..ROUNDS {
                for moved in [false, true] {
                    let o = shrink_once(old, new, moved);
                    rows[moved as usize].push([
                        o.nanos as i128,
                        o.held as i128,
                        o.returned as i128,
                    ]);
                }
            }
            let col = |way: usize, i: usize| median(rows[way].iter().map(|r| r[i]).collect());
            println!(
                "{:>9} {:>6} | {:>11} {:>11} {:>11} | {:>11} {:>11} {:>11}",
                human(old as i128),
                if div == 1 << 20 {
                    "1 B".to_string()
                } else {
                    format!("1/{div}")
                },
                col(0, 0),
                human(col(0, 1)),
                human(col(0, 2)),
                col(1, 0),
                human(col(1, 1)),
                human(col(1, 2)),
            );
        }
    }
}
