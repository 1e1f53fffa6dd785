//! MklAllocator as the whole program's `#[global_allocator]`: std's strings,
//! collections, threads, thread-local destructors and panics all run on MKL
//! blocks, every block is 64-byte aligned, and MKL's own statistics see them.
//!
//! Its own test binary: one global-allocator configuration per binary.

use std::collections::{BTreeMap, HashMap};
use std::panic;
use std::sync::{Mutex, MutexGuard};
use std::thread;

use mkl_alloc::{MklAllocator, manager};

#[global_allocator]
static GLOBAL: MklAllocator = MklAllocator;

/// The tests read MKL's process-wide counters, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // This binary pins MKL's own counts block for block; the block cache
    // (on by default) keeps freed large blocks, counted by MKL, so it is
    // off here (tests/block_cache.rs covers it).
    mkl_alloc::block_cache::disable();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `MKL_ALLOC_TEST_SCALE=small` (valgrind); Miri (interpreted) runs smaller still.
fn small() -> bool {
    std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small")
}

#[track_caller]
fn assert_aligned<T: ?Sized>(p: *const T, what: &str) {
    let addr = p.cast::<u8>() as usize;
    assert_eq!(addr % 64, 0, "{what} at {addr:#x} is not 64-byte aligned");
}

#[test]
fn the_test_harness_itself_runs_on_mkl_blocks() {
    let _g = serial();
    // The harness's own live data (test names, arguments, channels) was
    // allocated before this function ran: with MKL as the global allocator,
    // MKL already holds blocks. With any other allocator it would hold none.
    let s = manager::stats();
    assert!(s.buffers > 0, "MKL holds no blocks: {s:?}");
    assert!(s.bytes > 0, "{s:?}");
}

#[test]
fn strings_are_mkl_blocks() {
    let _g = serial();
    let mut s = String::new();
    let mut last = core::ptr::null();
    for i in 0..2000 {
        s.push_str(&i.to_string());
        if s.as_ptr() != last {
            assert_aligned(s.as_ptr(), "String buffer");
            last = s.as_ptr();
        }
    }
    let expected: String = (0..2000).map(|i| i.to_string()).collect();
    assert_eq!(s, expected);
    let f = format!("{s}-{}", s.len());
    assert_aligned(f.as_ptr(), "format! output");
    assert!(f.ends_with(&format!("-{}", s.len())));
    s.shrink_to_fit();
    assert_aligned(s.as_ptr(), "shrunk String");
    assert_eq!(s, expected);
    let boxed: Box<str> = s.into_boxed_str();
    assert_aligned(boxed.as_ptr(), "Box<str>");
}

#[test]
fn vec_growth_shrink_and_box_keep_alignment_and_contents() {
    let _g = serial();
    let n = if cfg!(miri) {
        1_000
    } else if small() {
        20_000
    } else {
        200_000
    };
    let mut v: Vec<u64> = Vec::new();
    let mut last = core::ptr::null();
    for i in 0..n {
        v.push(i * 3);
        if v.as_ptr() != last {
            assert_aligned(v.as_ptr(), "Vec<u64> after realloc");
            last = v.as_ptr();
        }
    }
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 3));
    v.truncate(10);
    v.shrink_to_fit();
    assert_aligned(v.as_ptr(), "Vec after shrink_to_fit");
    assert_eq!(v, (0..10).map(|i| i * 3).collect::<Vec<u64>>());
    let b: Box<[u64]> = v.into_boxed_slice();
    assert_aligned(b.as_ptr(), "Box<[u64]>");
    let one = Box::new(7u8);
    assert_aligned(&*one, "Box<u8>");
    assert_eq!(*one, 7);
    let zeroed = vec![0u32; if cfg!(miri) { 10_000 } else { 100_000 }];
    assert_aligned(zeroed.as_ptr(), "vec![0; n]");
    assert!(zeroed.iter().all(|&x| x == 0));
}

#[test]
fn mkl_stats_grow_and_shrink_with_a_big_vec() {
    let _g = serial();
    // Under Miri (interpreted, every byte written and read) 256 KiB.
    const N: usize = if cfg!(miri) { 256 << 10 } else { 32 << 20 };
    // The harness's own thread may allocate or free a little meanwhile.
    const SLACK: u64 = if cfg!(miri) { 64 << 10 } else { 1 << 20 };
    let before = manager::stats();
    let mut big: Vec<u8> = Vec::with_capacity(N);
    big.resize(N, 0xa5);
    let during = manager::stats();
    assert!(
        during.bytes + SLACK >= before.bytes + N as u64,
        "a live {N}-byte Vec is not in MKL's count: before {before:?}, during {during:?}"
    );
    assert_aligned(big.as_ptr(), "big Vec");
    assert!(big.iter().all(|&b| b == 0xa5));
    drop(big);
    let after = manager::stats();
    assert!(
        after.bytes + N as u64 <= during.bytes + SLACK,
        "dropping the Vec did not give its bytes back to MKL: during {during:?}, after {after:?}"
    );
}

#[test]
fn hashmap_and_btreemap() {
    let _g = serial();
    let n: u32 = if cfg!(miri) {
        200
    } else if small() {
        2_000
    } else {
        20_000
    };
    let mut h: HashMap<String, Vec<u32>> = HashMap::new();
    for i in 0..n {
        h.insert(format!("key-{i}"), (0..i % 17).collect());
    }
    assert_eq!(h.len(), n as usize);
    for (k, v) in &h {
        assert_aligned(k.as_ptr(), "HashMap key");
        if v.capacity() > 0 {
            assert_aligned(v.as_ptr(), "HashMap value");
        }
        let i: u32 = k["key-".len()..].parse().unwrap();
        assert_eq!(*v, (0..i % 17).collect::<Vec<u32>>());
    }
    h.retain(|k, _| k.len() % 2 == 0);
    h.shrink_to_fit();
    assert!(h.keys().all(|k| k.len() % 2 == 0));

    // BTreeMap nodes are not reachable, but MKL's count shows they are its blocks.
    let before = manager::stats();
    let mut b: BTreeMap<u64, [u64; 4]> = BTreeMap::new();
    for i in 0..n as u64 {
        b.insert(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), [i; 4]);
    }
    let during = manager::stats();
    let payload = n as u64 * 40; // key + value bytes, a lower bound on node bytes
    assert!(
        during.bytes >= before.bytes + payload,
        "BTreeMap nodes are not MKL blocks: {before:?} -> {during:?}"
    );
    for (k, v) in &b {
        assert_eq!(v[0].wrapping_mul(0x9e37_79b9_7f4a_7c15), *k);
    }
    drop(b);
    let after = manager::stats();
    assert!(
        after.bytes + payload <= during.bytes,
        "{during:?} -> {after:?}"
    );
}

struct AllocOnThreadExit;

impl Drop for AllocOnThreadExit {
    fn drop(&mut self) {
        // Runs during thread exit: allocating and freeing here must work.
        let s = format!("bye from {:?}", thread::current().id());
        assert_aligned(s.as_ptr(), "String in a TLS destructor");
        assert!(s.starts_with("bye"));
    }
}

thread_local! {
    static ON_EXIT: AllocOnThreadExit = const { AllocOnThreadExit };
    static LOCAL: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[test]
fn threads_allocate_free_and_exit() {
    let _g = serial();
    let rounds = if small() { 2 } else { 10 };
    for round in 0..rounds {
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                thread::Builder::new()
                    .name(format!("worker-{round}-{t}"))
                    .spawn(move || {
                        ON_EXIT.with(|_| ());
                        LOCAL.with(|l| {
                            l.borrow_mut().extend((0..100).map(|i| format!("{t}-{i}")));
                        });
                        let n = if cfg!(miri) { 1_000 } else { 10_000 };
                        let v: Vec<u64> = (0..n).map(|i| i ^ t).collect();
                        assert_aligned(v.as_ptr(), "Vec in a thread");
                        v
                    })
                    .unwrap()
            })
            .collect();
        for (t, h) in handles.into_iter().enumerate() {
            // The Vec was allocated by a thread that has exited: still ours to read and free.
            let v = h.join().unwrap();
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 ^ t as u64));
        }
    }
}

#[test]
fn panic_caught_with_catch_unwind() {
    let _g = serial();
    // A silent hook while the deliberate panic runs: the default one may
    // capture a backtrace (RUST_BACKTRACE) and keep its symbol cache in MKL
    // blocks for good, which would blur the accounting below. The other
    // tests wait on SERIAL, so none of their panics is hidden.
    let default_hook = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    let before = manager::stats();
    let result = panic::catch_unwind(|| {
        let _held = vec![1u8; 1 << 20];
        panic!("deliberate panic number {}", std::hint::black_box(42));
    });
    panic::set_hook(default_hook);
    let payload = result.expect_err("the closure panics");
    assert_aligned(&*payload as *const dyn std::any::Any, "panic payload box");
    let msg = payload
        .downcast_ref::<String>()
        .expect("a formatted panic message is a String");
    assert_aligned(msg.as_ptr(), "panic message");
    assert_eq!(msg, "deliberate panic number 42");
    drop(payload);
    // The 1 MiB Vec was freed during unwinding.
    let after = manager::stats();
    assert!(
        after.bytes < before.bytes + (1 << 20),
        "{before:?} -> {after:?}"
    );
}

#[test]
fn try_reserve_beyond_the_machine_is_an_error_not_an_abort() {
    let _g = serial();
    // 1 TiB: a valid Layout (< isize::MAX) that no allocator here can serve
    // (MKL's malloc is refused by the kernel), so the error comes from MKL.
    const HUGE: usize = 1 << 40;
    let mut v: Vec<u8> = vec![1, 2, 3];
    let cap = v.capacity();
    let err = v.try_reserve(HUGE).expect_err("1 TiB cannot be reserved");
    assert!(
        err.to_string().contains("allocator returned an error"),
        "the failure must come from the allocator, got: {err}"
    );
    assert_eq!(v, [1, 2, 3], "contents unchanged");
    assert_eq!(v.capacity(), cap, "capacity unchanged");
    let err = v.try_reserve_exact(HUGE).expect_err("1 TiB, exact");
    assert!(
        err.to_string().contains("allocator returned an error"),
        "{err}"
    );
    // Near isize::MAX: also a clean error.
    let err = v
        .try_reserve(isize::MAX as usize - 3)
        .expect_err("isize::MAX bytes");
    assert!(!err.to_string().is_empty());
    let mut s = String::from("kept");
    assert!(s.try_reserve(HUGE).is_err());
    assert_eq!(s, "kept");
    let mut h: HashMap<u64, u64> = HashMap::new();
    h.insert(1, 2);
    assert!(h.try_reserve(HUGE).is_err());
    assert_eq!(h.get(&1), Some(&2));
    // And the allocator still works afterwards.
    v.try_reserve(1 << 20).expect("1 MiB is fine");
    assert_aligned(v.as_ptr(), "Vec after failed reserves");
    assert_eq!(v, [1, 2, 3]);
}
