//! A downstream program of mkl-alloc, built once per MKL link mode by
//! scripts/downstream-check.sh: MKL memory from the global allocator and from
//! allocator-api2 collections, a `cblas_dgemm` on MKL-allocated buffers
//! checked against a naive product, and which MKL libraries the process loaded.
use std::ffi::{c_int, c_void};

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, MklSplitAllocator, manager};

#[global_allocator]
static GLOBAL: MklSplitAllocator = MklSplitAllocator;

/// MKL_INT: 64-bit in the ILP64 configurations, 32-bit otherwise (mkl_rt's
/// default interface layer is LP64).
#[cfg(ilp64)]
type MklInt = i64;
#[cfg(not(ilp64))]
type MklInt = i32;

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;

unsafe extern "C" {
    fn cblas_dgemm(
        layout: c_int,
        transa: c_int,
        transb: c_int,
        m: MklInt,
        n: MklInt,
        k: MklInt,
        alpha: f64,
        a: *const f64,
        lda: MklInt,
        b: *const f64,
        ldb: MklInt,
        beta: f64,
        c: *mut f64,
        ldc: MklInt,
    );
    fn dlopen(file: *const std::ffi::c_char, mode: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const std::ffi::c_char) -> *mut c_void;
}

fn main() {
    let mode = env!("DOWNSTREAM_MODE");
    let (m, k, n) = (67usize, 45usize, 71usize);
    let fill = |len: usize, seed: u64| -> AVec<f64, MklAllocator> {
        let mut v = AVec::with_capacity_in(len, MklAllocator);
        let mut x = seed;
        for _ in 0..len {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            v.push(((x >> 33) % 1000) as f64 / 100.0 - 5.0);
        }
        v
    };
    let a = fill(m * k, 1);
    let b = fill(k * n, 2);
    let mut c = fill(m * n, 3);
    for buf in [a.as_ptr(), b.as_ptr(), c.as_ptr()] {
        assert_eq!(buf as usize % 64, 0, "an MKL block is not 64-byte aligned");
    }
    let before = manager::stats();
    let big: Vec<f64> = vec![1.0; 1 << 20]; // 8 MiB: MKL's, through the split allocator
    let during = manager::stats();
    assert!(
        during.bytes >= before.bytes + (8 << 20),
        "the global allocator's large block is not MKL's: {before:?} -> {during:?}"
    );
    // MKL on the crate's memory in every link mode: the block lives in a
    // chunk (2 MiB-aligned, MKL's 64-byte header in front), and once freed
    // it leaves MKL's count though the block cache keeps the chunk.
    assert_eq!(
        during.backing,
        mkl_alloc::backing::Backing::Active,
        "MKL does not take the crate's memory pointers in mode {mode}"
    );
    assert_eq!(big.as_ptr() as usize % (2 << 20), 64, "the 8 MiB block is not in a chunk");
    drop(big);
    assert_eq!(manager::stats().mkl_held(), before.mkl_held(), "a freed block still counted");

    let mut expect = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            expect[i * n + j] = 2.0 * dot + 0.5 * c[i * n + j];
        }
    }
    // SAFETY: row-major m×k, k×n and m×n buffers of exactly those lengths,
    // leading dimensions k, n, n.
    unsafe {
        cblas_dgemm(
            ROW_MAJOR, NO_TRANS, NO_TRANS, m as MklInt, n as MklInt, k as MklInt, 2.0,
            a.as_ptr(), k as MklInt, b.as_ptr(), n as MklInt, 0.5, c.as_mut_ptr(), n as MklInt,
        )
    };
    let worst = c.iter().zip(&expect).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-9, "cblas_dgemm is wrong by {worst}");

    // One MKL: under mkl-rt the process's libmkl_rt is the one counting our blocks.
    if mode == "mkl-rt" {
        const RTLD_NOW: c_int = 2;
        const RTLD_NOLOAD: c_int = 4;
        // SAFETY: NUL-terminated names; RTLD_NOLOAD only returns an
        // already-loaded library and MKL_Mem_Stat has the signature bound in ffi.
        let stat = unsafe {
            let lib = dlopen(c"libmkl_rt.so.3".as_ptr(), RTLD_NOW | RTLD_NOLOAD);
            assert!(!lib.is_null(), "libmkl_rt.so.3 is not loaded in this process");
            let sym = dlsym(lib, c"MKL_Mem_Stat".as_ptr());
            assert!(!sym.is_null(), "libmkl_rt.so.3 has no MKL_Mem_Stat");
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_int) -> i64>(sym)
        };
        let block: Vec<u8> = vec![7; 64 << 20];
        let mut n = 0;
        // SAFETY: n is a valid out-pointer.
        let bytes = unsafe { stat(&mut n) };
        let ours = manager::stats();
        assert_eq!((bytes, n as i64), (ours.bytes as i64, ours.buffers as i64));
        assert!(bytes >= 64 << 20, "libmkl_rt does not see the 64 MiB block: {bytes}");
        drop(block);
        println!("{mode}: libmkl_rt's own MKL_Mem_Stat agrees with manager::stats()");
    }

    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut loaded: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains("libmkl") || p.contains("libiomp"))
        .collect();
    loaded.dedup();
    let loaded: Vec<&str> = loaded.iter().map(|p| p.rsplit('/').next().unwrap()).collect();
    println!(
        "{mode}: dgemm {m}x{k}x{n} correct (max error {worst:.1e}); MKL libraries loaded: {}",
        if loaded.is_empty() { "none (static)".into() } else { loaded.join(" ") }
    );
}
