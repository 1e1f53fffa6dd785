//! The binding trap: `mkl_service.h`'s lower-case names are `#define`s for
//! the upper-case C functions; the lower-case *symbols* in the library are the
//! Fortran interface, which takes every argument by pointer. A binding of
//! `mkl_malloc(size, align)` links and then dereferences `size` as an address.
//!
//! These tests call through `mkl_alloc::ffi` with by-value arguments and check
//! what a correct binding gives (an aligned block, counted by MKL); bound to
//! the Fortran symbols they would crash or fail. They also check that the
//! addresses `ffi` binds are not those of the Fortran symbols.

use core::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

use mkl_alloc::ffi;

// The Fortran interface, declared here only to compare addresses and to show
// the by-pointer calling convention. Never call these by value.
unsafe extern "C" {
    fn mkl_malloc_(size: *const usize, align: *const c_int) -> *mut c_void;
    fn mkl_malloc(size: *const usize, align: *const c_int) -> *mut c_void;
    fn mkl_free_(ptr: *const *mut c_void);
    fn mkl_free(ptr: *const *mut c_void);
}

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn mem_stat() -> (i64, c_int) {
    let mut n: c_int = -1;
    // SAFETY: MKL_Mem_Stat writes one int through a valid pointer.
    let bytes = unsafe { ffi::MKL_Mem_Stat(&mut n) };
    (bytes, n)
}

#[test]
fn ffi_binds_the_c_functions_not_the_fortran_symbols() {
    let c_malloc = ffi::MKL_malloc as *const () as usize;
    let c_free = ffi::MKL_free as *const () as usize;
    for (name, f) in [
        ("mkl_malloc_", mkl_malloc_ as *const () as usize),
        ("mkl_malloc", mkl_malloc as *const () as usize),
    ] {
        assert_ne!(c_malloc, f, "ffi::MKL_malloc is the Fortran symbol {name}");
    }
    for (name, f) in [
        ("mkl_free_", mkl_free_ as *const () as usize),
        ("mkl_free", mkl_free as *const () as usize),
    ] {
        assert_ne!(c_free, f, "ffi::MKL_free is the Fortran symbol {name}");
    }
}

#[test]
fn by_value_calls_give_aligned_counted_blocks() {
    let _g = serial();
    let (b0, n0) = mem_stat();
    assert!(n0 >= 0, "MKL_Mem_Stat wrote the buffer count");
    for align in [64 as c_int, 128, 4096, 1 << 16] {
        // Size 1000 by value: through the Fortran symbol this would be read
        // as the address 0x3e8 and crash.
        // SAFETY: positive size and power-of-two alignment by value.
        let p = unsafe { ffi::MKL_malloc(1000, align) };
        assert!(!p.is_null());
        assert_eq!(p as usize % align as usize, 0, "align {align}");
        let (b1, n1) = mem_stat();
        assert_eq!(n1, n0 + 1, "MKL counts the block");
        assert!(b1 >= b0 + 1000, "MKL counts its bytes: {b0} -> {b1}");
        // SAFETY: p is a live 1000-byte block.
        unsafe {
            p.cast::<u8>().write_bytes(0xab, 1000);
            ffi::MKL_free(p);
        }
        assert_eq!(mem_stat(), (b0, n0), "MKL_free gave it back");
    }
}

#[test]
fn calloc_and_realloc_by_value() {
    let _g = serial();
    let before = mem_stat();
    // SAFETY: by-value counts (10 x 100 bytes) and alignment.
    let p = unsafe { ffi::MKL_calloc(10, 100, 256) }.cast::<u8>();
    assert!(!p.is_null());
    assert_eq!(p as usize % 256, 0);
    // SAFETY: p is a live, zeroed 1000-byte block; realloc consumes it and
    // the result is freed once.
    unsafe {
        let s = core::slice::from_raw_parts_mut(p, 1000);
        assert!(s.iter().all(|&b| b == 0));
        for (i, b) in s.iter_mut().enumerate() {
            *b = i as u8;
        }
        let q = ffi::MKL_realloc(p.cast(), 100_000).cast::<u8>();
        assert!(!q.is_null());
        let s = core::slice::from_raw_parts(q, 1000);
        assert!(s.iter().enumerate().all(|(i, &b)| b == i as u8));
        ffi::MKL_free(q.cast());
    }
    assert_eq!(mem_stat(), before);
}

#[test]
fn the_fortran_symbol_takes_pointers() {
    // What the lower-case symbol really is: called with pointers it works.
    // (Called with values, as a wrong binding would, it reads address 1000.)
    let _g = serial();
    let before = mem_stat();
    let size: usize = 1000;
    let align: c_int = 128;
    // SAFETY: the Fortran interface reads both arguments through the pointers,
    // which point at live locals.
    let p = unsafe { mkl_malloc_(&size, &align) };
    assert!(!p.is_null());
    assert_eq!(p as usize % 128, 0);
    assert_eq!(mem_stat().1, before.1 + 1);
    // SAFETY: p is the live block just allocated; mkl_free_ reads it through the pointer.
    unsafe { mkl_free_(&p) };
    assert_eq!(mem_stat(), before);
}

#[test]
fn peak_and_buffer_controls_take_values() {
    let _g = serial();
    // SAFETY: by-value mode constants; MKL_Free_Buffers takes no arguments.
    unsafe {
        assert!(ffi::MKL_Peak_Mem_Usage(ffi::MKL_PEAK_MEM_ENABLE) >= 0);
        let p = ffi::MKL_malloc(1 << 20, 64);
        assert!(!p.is_null());
        assert!(ffi::MKL_Peak_Mem_Usage(ffi::MKL_PEAK_MEM) >= 1 << 20);
        ffi::MKL_free(p);
        assert!(ffi::MKL_Peak_Mem_Usage(ffi::MKL_PEAK_MEM_DISABLE) >= 0);
        assert_eq!(ffi::MKL_Peak_Mem_Usage(ffi::MKL_PEAK_MEM), -1, "disabled");
        ffi::MKL_Free_Buffers();
        ffi::MKL_Thread_Free_Buffers();
    }
}
