//! What `MKL_realloc` does with a block's address: the measurement behind
//! the realloc notes in `src/allocator.rs` and the README.
//!
//! ```text
//! cargo run --release --example realloc_in_place
//! ```
//!
//! For each (from, to) pair: allocate `from` bytes with `MKL_malloc` at
//! alignment 64, fill them, `MKL_realloc` to `to` bytes, and report whether
//! the address was kept ("in place") or changed ("moved"), checking that the
//! first `min(from, to)` bytes survived. Then a doubling loop from 64 B to
//! 128 MiB counts how many of its growth steps moved, and the sequence the
//! review reported (100 000 B shrunk to 1 000, then grown to 2 000).
//! Every pair runs in a fresh block, one after another on one thread; MKL's
//! fast memory manager is as configured by the environment
//! (`MKL_DISABLE_FAST_MM`).

use core::ffi::c_void;

use mkl_alloc::ffi;

/// `MKL_malloc(size, 64)` filled with a pattern; panics if MKL fails.
fn filled(size: usize) -> *mut c_void {
    // SAFETY: size > 0, alignment 64 (a power of two).
    let p = unsafe { ffi::MKL_malloc(size, 64) };
    assert!(!p.is_null(), "MKL_malloc({size}) failed");
    fill(p, size);
    p
}

/// Writes the pattern over the first `size` bytes of `p`, a live block of at
/// least that many bytes.
fn fill(p: *mut c_void, size: usize) {
    // SAFETY: p is a live block of at least `size` bytes (callers).
    unsafe { core::slice::from_raw_parts_mut(p.cast::<u8>(), size) }
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i % 251) as u8);
}

/// Reallocates `p` (a live block holding the pattern over `from` bytes) to
/// `to` bytes; returns the new block and whether the address was kept.
fn realloc_checked(p: *mut c_void, from: usize, to: usize) -> (*mut c_void, bool) {
    // SAFETY: p is a live MKL block; to > 0.
    let q = unsafe { ffi::MKL_realloc(p, to) };
    assert!(!q.is_null(), "MKL_realloc({from} -> {to}) failed");
    // SAFETY: q is a live block of at least `to` bytes, of which the first
    // min(from, to) hold the pattern.
    let kept = unsafe { core::slice::from_raw_parts(q.cast::<u8>(), from.min(to)) };
    assert!(
        kept.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
        "contents lost in {from} -> {to}"
    );
    (q, q == p)
}

fn main() {
    let pairs: &[(usize, usize)] = &[
        // shrinks
        (100, 50),
        (1_000, 100),
        (100_000, 1_000),
        (1 << 20, 1 << 10),
        (1 << 25, 1 << 24),
        // grows
        (64, 65),
        (64, 128),
        (100, 200),
        (1_000, 2_000),
        (4096, 8192),
        (65_536, 65_600),
        (1_000, 100_000),
        (1 << 20, 1 << 21),
        (1 << 24, 1 << 25),
    ];
    println!("| from (B) | to (B) | address |");
    println!("|---:|---:|---|");
    for &(from, to) in pairs {
        let (q, same) = realloc_checked(filled(from), from, to);
        println!(
            "| {from} | {to} | {} |",
            if same { "in place" } else { "moved" }
        );
        // SAFETY: q is a live MKL block, freed once.
        unsafe { ffi::MKL_free(q) };
    }

    let (mut p, mut size, mut steps, mut moves) = (filled(64), 64usize, 0, 0);
    while size < 1 << 27 {
        let (q, same) = realloc_checked(p, size, size * 2);
        p = q;
        size *= 2;
        fill(p, size);
        steps += 1;
        moves += usize::from(!same);
    }
    // SAFETY: p is a live MKL block, freed once.
    unsafe { ffi::MKL_free(p) };
    println!("doubling 64 B -> 128 MiB: {moves} of {steps} growth steps moved the block");

    let p = filled(100_000);
    let (q, shrink_kept) = realloc_checked(p, 100_000, 1_000);
    let (r, grow_kept) = realloc_checked(q, 1_000, 2_000);
    // SAFETY: r is a live MKL block, freed once.
    unsafe { ffi::MKL_free(r) };
    println!(
        "100000 -> 1000 -> 2000: shrink {}, then grow {}",
        if shrink_kept { "in place" } else { "moved" },
        if grow_kept { "in place" } else { "moved" }
    );
}
