//! Zeroed blocks on memory that is not the C library's (issue 41).
//!
//! A large zeroed block that is not one of the crate's chunks (the backing
//! off, or MKL on functions of its own) was zeroed by releasing its pages
//! (`MADV_DONTNEED`), which reads as zero only for private anonymous
//! memory. Here a constructor (priority 101: before the crate's setup and
//! MKL's first call) points MKL's memory functions at a small allocator
//! over a *shared* anonymous mapping, which reuses a freed block: released
//! pages of shared memory keep their contents, so a block freed dirty and
//! handed out again as zeroed read its old bytes. In a child process with
//! the backing off and MKL's own buffer pool off, so that every block is
//! this allocator's.
#![cfg(all(target_os = "linux", not(miri)))]

mod common;

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use mkl_alloc::{MklAllocator, ffi};

const MIB: usize = 1 << 20;
const REGION: usize = 64 * MIB;
/// Each block has a 64-byte header holding its size.
const HEAD: usize = 64;

static BASE: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// The last block freed (its address), reused by the next request it fits.
static FREED: AtomicUsize = AtomicUsize::new(0);

fn region() -> usize {
    if BASE.load(Relaxed) == 0 {
        // SAFETY: a fresh shared anonymous mapping, ours for the process.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                REGION,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        BASE.store(p as usize, Relaxed);
    }
    BASE.load(Relaxed)
}

unsafe extern "C" fn shm_malloc(n: usize) -> *mut c_void {
    let freed = FREED.load(Relaxed);
    // SAFETY: a block of ours keeps its size in its header.
    if freed != 0 && unsafe { *((freed - HEAD) as *const usize) } >= n {
        FREED.store(0, Relaxed);
        return freed as *mut c_void;
    }
    let base = region();
    let size = (n + HEAD).next_multiple_of(4096);
    let at = NEXT.fetch_add(size, Relaxed);
    if at + size > REGION {
        return core::ptr::null_mut();
    }
    let p = base + at + HEAD;
    // SAFETY: the header lies in our region, before the block.
    unsafe { *((p - HEAD) as *mut usize) = size - HEAD };
    p as *mut c_void
}

unsafe extern "C" fn shm_calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        return core::ptr::null_mut();
    };
    // SAFETY: malloc's contract; the block is written within its size.
    unsafe {
        let p = shm_malloc(total);
        if !p.is_null() {
            p.cast::<u8>().write_bytes(0, total);
        }
        p
    }
}

unsafe extern "C" fn shm_free(p: *mut c_void) {
    if !p.is_null() {
        FREED.store(p as usize, Relaxed);
    }
}

unsafe extern "C" fn shm_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: realloc's contract, over the functions above.
    unsafe {
        let q = shm_malloc(n);
        if !q.is_null() && !p.is_null() {
            let old = *((p as usize - HEAD) as *const usize);
            core::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(n));
            shm_free(p);
        }
        q
    }
}

#[used]
#[unsafe(link_section = ".init_array.00101")]
static SHARED_MEMORY_BENEATH_MKL: extern "C" fn() = {
    extern "C" fn set() {
        if std::env::var_os("MKL_ALLOC_SHM_CHILD").is_none() {
            return;
        }
        // SAFETY: MKL's pointers are plain data, set before MKL's first
        // call and the crate's setup, by the only thread there is.
        unsafe {
            ffi::i_malloc = Some(shm_malloc);
            ffi::i_calloc = Some(shm_calloc);
            ffi::i_realloc = Some(shm_realloc);
            ffi::i_free = Some(shm_free);
        }
    }
    set
};

#[test]
fn zeroed_blocks_on_shared_memory_beneath_mkl_read_as_zero() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shm_child", "--ignored", "--test-threads=1"])
        .env("MKL_ALLOC_SHM_CHILD", "1")
        .env("MKL_ALLOC_BACKING", "off")
        .env("MKL_DISABLE_FAST_MM", "1")
        .output()
        .unwrap();
    let (passed, text) = common::child_passed(&out);
    assert!(passed, "{text}");
}

#[test]
#[ignore = "run by zeroed_blocks_on_shared_memory_beneath_mkl_read_as_zero in a child process"]
fn shm_child() {
    let layout = Layout::from_size_align(4 * MIB, 64).unwrap();
    // SAFETY: a non-zero size; the block is written within it and freed.
    let first = unsafe {
        let p = MklAllocator.alloc(layout);
        assert!(!p.is_null());
        p.write_bytes(0xAB, layout.size());
        MklAllocator.dealloc(p, layout);
        p
    };
    let base = BASE.load(Relaxed);
    assert!(
        (base..base + REGION).contains(&(first as usize)),
        "MKL's block is not on the shared mapping: the test does not test"
    );
    // SAFETY: a non-zero size.
    let z = unsafe { MklAllocator.alloc_zeroed(layout) };
    assert!(!z.is_null());
    assert_eq!(z, first, "the allocator beneath MKL reused the dirty block");
    // SAFETY: the live zeroed block of `layout.size()` bytes.
    let bytes = unsafe { core::slice::from_raw_parts(z, layout.size()) };
    let dirty = bytes.iter().filter(|&&b| b != 0).count();
    assert_eq!(dirty, 0, "{dirty} bytes of the zeroed block are not zero");
    // SAFETY: a live block of this layout, freed once.
    unsafe { MklAllocator.dealloc(z, layout) };
}
