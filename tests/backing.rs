//! The backing beneath MKL on every platform that has it (Linux, and
//! Windows through `libimalloc.dll`): MKL's large blocks are the crate's
//! chunks, a freed one is kept by the block cache while MKL's own count
//! drops back, and a chunk shrunk in place grows back in place.
//!
//! MKL's counts and the cache are process-wide: each test takes `serial()`.
#![cfg(any(target_os = "linux", windows))]

mod common;

use core::alloc::{GlobalAlloc, Layout};

use allocator_api2::vec::Vec as AVec;
use mkl_alloc::backing::{self, Backing};
use mkl_alloc::{MklAllocator, block_cache, manager};

const MIB: usize = 1 << 20;

use common::serial;

/// Writes one byte a page into the live block `[p, p + n)`.
fn fill(p: *mut u8, n: usize) {
    for i in (0..n).step_by(4096) {
        // SAFETY: inside the live block of at least n bytes.
        unsafe { p.add(i).write((i / 4096) as u8) };
    }
}

/// Checks what `fill` wrote into `[p, p + n)`.
fn check(p: *const u8, n: usize) {
    for i in (0..n).step_by(4096) {
        // SAFETY: inside the live block of at least n bytes.
        assert_eq!(unsafe { p.add(i).read() }, (i / 4096) as u8, "byte {i}");
    }
}

/// On Windows before the backing there, the state was `Off` and a freed
/// 8 MiB block went back to the C runtime's heap: nothing was cached.
#[test]
fn a_freed_large_block_is_cached_beneath_mkl() {
    let _s = serial();
    manager::init();
    assert_eq!(backing::state(), Backing::Active);
    assert_eq!(manager::stats().backing, Backing::Active);
    block_cache::enable(64 * MIB);
    let before = manager::stats();
    let mut v: AVec<f64, MklAllocator> = AVec::with_capacity_in(MIB, MklAllocator); // 8 MiB
    v.resize(MIB, 1.5);
    let during = manager::stats();
    assert!(during.bytes >= before.bytes + 8 * MIB as u64, "{during:?}");
    drop(v);
    let after = manager::stats();
    assert_eq!(
        after.mkl_held(),
        before.mkl_held(),
        "MKL still counts the block"
    );
    assert!(
        block_cache::cached_bytes() >= 8 * MIB && after.cached_bytes >= 8 * MIB as u64,
        "the freed chunk is not cached: {after:?}"
    );
    // A zeroed block of the same size takes the cached (dirty, and on
    // Windows `MEM_RESET`) chunk and still reads as zero.
    let l = Layout::from_size_align(8 * MIB, 64).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { MklAllocator.alloc_zeroed(l) };
    assert!(!p.is_null());
    assert_eq!(
        block_cache::cached_bytes(),
        0,
        "the cached chunk was not reused"
    );
    // SAFETY: 8 MiB of initialised (zero) bytes just allocated.
    assert!(
        unsafe { core::slice::from_raw_parts(p, 8 * MIB) }
            .iter()
            .all(|&b| b == 0)
    );
    // SAFETY: allocated above with this layout.
    unsafe { MklAllocator.dealloc(p, l) };
    manager::free_buffers();
    assert_eq!(block_cache::cached_bytes(), 0);
    block_cache::disable();
}

/// A chunk shrunk by a quarter or more (but not to half or less, which
/// the allocator above MKL answers with a move) gives its tail back (an
/// `mremap` on Linux, a decommit on Windows) and keeps its contents;
/// grown again it keeps them too. On Windows the growth is always in place: the
/// decommitted tail stays reserved for the chunk.
#[test]
fn a_shrunk_chunk_keeps_its_contents_and_grows_back() {
    let _s = serial();
    let big = Layout::from_size_align(32 * MIB, 64).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { MklAllocator.alloc(big) };
    assert!(!p.is_null());
    fill(p, 32 * MIB);
    // SAFETY: the live block of `big`, resized to a non-zero size.
    let q = unsafe { MklAllocator.realloc(p, big, 20 * MIB) };
    assert!(!q.is_null());
    check(q, 20 * MIB);
    let small = Layout::from_size_align(20 * MIB, 64).unwrap();
    // SAFETY: the live block of `small`.
    let r = unsafe { MklAllocator.realloc(q, small, 32 * MIB) };
    assert!(!r.is_null());
    check(r, 20 * MIB);
    if cfg!(windows) {
        assert_eq!(r, q, "the chunk did not grow back into its own tail");
    }
    fill(r, 32 * MIB);
    check(r, 32 * MIB);
    // SAFETY: the live block of `big`.
    unsafe { MklAllocator.dealloc(r, big) };
}

/// A block of the heap beneath the hooks (below 1 MiB) that grows to a
/// chunk's size moves into a chunk once, keeping its bytes, so that it is
/// cached when freed (`malloc_usable_size` tells the copy's length on
/// Linux, `HeapSize` on Windows; before it, on Windows, such a block stayed
/// on the process heap and was never cached).
#[test]
fn a_small_block_grown_large_becomes_a_chunk() {
    let _s = serial();
    block_cache::enable(64 * MIB);
    let small = Layout::from_size_align(64 << 10, 64).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { MklAllocator.alloc(small) };
    assert!(!p.is_null());
    fill(p, 64 << 10);
    // SAFETY: the live block of `small`, grown.
    let q = unsafe { MklAllocator.realloc(p, small, 8 * MIB) };
    assert!(!q.is_null());
    check(q, 64 << 10);
    fill(q, 8 * MIB);
    // SAFETY: the live block, now of 8 MiB.
    unsafe { MklAllocator.dealloc(q, Layout::from_size_align(8 * MIB, 64).unwrap()) };
    assert!(
        block_cache::cached_bytes() >= 8 * MIB,
        "the grown block was not a chunk: {:?}",
        manager::stats()
    );
    manager::free_buffers();
    block_cache::disable();
}

/// The setup runs when the program loads (an ELF constructor on Linux, a
/// C runtime initialiser on Windows): MKL's pointers are the hooks before
/// any code of the program's runs, so an MKL call made before the crate's
/// first allocation (a BLAS routine of another crate's, say) is on the
/// backing too. Checked in a fresh process that touches nothing first.
#[test]
#[cfg_attr(miri, ignore = "starts a child process")]
fn the_setup_runs_when_the_program_loads() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "load_child", "--ignored", "--test-threads=1"])
        .env_remove("MKL_ALLOC_BACKING")
        .output()
        .unwrap();
    let (passed, text) = common::child_passed(&out);
    assert!(passed, "{text}");
}

#[test]
#[ignore = "run by the_setup_runs_when_the_program_loads in a child process"]
fn load_child() {
    // Nothing of the crate's has run in this process but its load-time
    // setup.
    assert_eq!(backing::state(), Backing::Active);
}

/// `MKL_ALLOC_BACKING` is a switch: `off` (or `0`) leaves MKL's pointers
/// alone, `on` or unset sets them, and anything else sets them too, with
/// the one-line warning the other variables give (`7` was taken as on
/// without a word before).
#[test]
#[cfg_attr(miri, ignore = "starts a child process")]
fn backing_variable_warns_on_a_value_other_than_on_or_off() {
    const WARNING: &str = "mkl-alloc: MKL_ALLOC_BACKING must be off or on";
    let run = |value: &str, expect: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "backing_env_child",
                "--ignored",
                "--test-threads=1",
            ])
            .env("MKL_ALLOC_BACKING", value)
            .env("MKL_ALLOC_BACKING_EXPECT", expect)
            .output()
            .unwrap();
        let (passed, text) = common::child_passed(&out);
        assert!(passed, "MKL_ALLOC_BACKING={value:?}: {text}");
        String::from_utf8_lossy(&out.stderr).contains(WARNING)
    };
    for ok in ["on", "ON", ""] {
        assert!(!run(ok, "active"), "a warning for {ok:?}");
    }
    for off in ["off", "0"] {
        assert!(!run(off, "off"), "a warning for {off:?}");
    }
    for bad in ["7", "yes", "1048576"] {
        assert!(run(bad, "active"), "no warning for {bad:?}");
    }
}

#[test]
#[ignore = "run by backing_variable_warns_on_a_value_other_than_on_or_off in a child process"]
fn backing_env_child() {
    manager::init();
    let expect = match std::env::var("MKL_ALLOC_BACKING_EXPECT").unwrap().as_str() {
        "off" => Backing::Off,
        _ => Backing::Active,
    };
    assert_eq!(backing::state(), expect);
}
