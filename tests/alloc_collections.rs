//! MklAllocator as an allocator-api2 allocator for chosen collections:
//! `allocator_api2::vec::Vec` and `hashbrown::HashMap`, filled, checked and
//! dropped, with MKL's counters showing the blocks come and go; zero-sized
//! layouts never reach MKL.

use core::alloc::Layout;
use std::sync::{Mutex, MutexGuard};

use allocator_api2::alloc::Allocator;
use allocator_api2::vec::Vec as AVec;
use mkl_alloc::{MklAllocator, manager};

/// MKL's counters are process-wide: tests that read them run one at a time
/// (the global allocator here is the system one, so only these tests use MKL).
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
fn assert_aligned<T>(p: *const T, what: &str) {
    assert_eq!(p as usize % 64, 0, "{what} at {p:p} not 64-byte aligned");
}

#[test]
fn vec_new_in_fill_check_drop() {
    let _g = serial();
    let n: u64 = if cfg!(miri) {
        1_000
    } else if small() {
        20_000
    } else {
        200_000
    };
    let before = manager::stats();
    let mut v: AVec<u64, MklAllocator> = AVec::new_in(MklAllocator);
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "an empty Vec allocates nothing"
    );
    let mut last = core::ptr::null();
    for i in 0..n {
        v.push(i * 7 + 1);
        if v.as_ptr() != last {
            assert_aligned(v.as_ptr(), "Vec buffer after growth");
            last = v.as_ptr();
        }
    }
    let during = manager::stats();
    assert_eq!(during.buffers, before.buffers + 1, "one buffer: {during:?}");
    assert!(
        during.bytes >= before.bytes + n * 8,
        "{before:?} -> {during:?}"
    );
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 7 + 1));

    let c = v.clone();
    assert_aligned(c.as_ptr(), "cloned Vec");
    assert_eq!(&c[..], &v[..]);
    assert_eq!(manager::stats().buffers, before.buffers + 2);
    drop(c);

    v.truncate(1000);
    v.shrink_to_fit();
    assert_aligned(v.as_ptr(), "shrunk Vec");
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 7 + 1));
    let shrunk = manager::stats();
    // A large block shrinking to half or less moves to a smaller one (so
    // the bytes drop: tests/shrink_returns_memory.rs); a smaller shrink
    // stays in place, where MKL keeps counting the whole block. Either way
    // the bytes must not grow, and it is still one block.
    assert!(
        shrunk.bytes <= during.bytes && shrunk.buffers == during.buffers,
        "shrink_to_fit took more from MKL: {during:?} -> {shrunk:?}"
    );
    assert_eq!(v.capacity(), 1000);
    v.extend_from_slice(&[5, 6, 7]);
    assert_eq!(&v[1000..], &[5, 6, 7]);
    drop(v);
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "every block returned to MKL"
    );
}

#[test]
fn vec_of_strings_and_f64_is_simd_ready() {
    let _g = serial();
    let before = manager::stats();
    let mut x: AVec<f64, MklAllocator> = AVec::with_capacity_in(1000, MklAllocator);
    x.extend((0..1000).map(f64::from));
    assert_aligned(x.as_ptr(), "Vec<f64>");
    assert_eq!(x.iter().sum::<f64>(), 499_500.0);
    let mut s: AVec<String, MklAllocator> = AVec::new_in(MklAllocator);
    for i in 0..500 {
        s.push(format!("item {i}"));
    }
    assert_eq!(s[499], "item 499");
    s.retain(|t| t.ends_with('7'));
    assert_eq!(s.len(), 50);
    drop(s);
    drop(x);
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

#[test]
fn hashbrown_map_new_in_fill_check_drop() {
    let _g = serial();
    let n: u32 = if cfg!(miri) {
        200
    } else if small() {
        5_000
    } else {
        50_000
    };
    let before = manager::stats();
    let mut m: hashbrown::HashMap<u32, AVec<u32, MklAllocator>, _, MklAllocator> =
        hashbrown::HashMap::new_in(MklAllocator);
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "an empty map allocates nothing"
    );
    for i in 0..n {
        let mut v = AVec::with_capacity_in((i % 5 + 1) as usize, MklAllocator);
        v.extend(0..i % 5 + 1);
        m.insert(i, v);
    }
    assert_eq!(m.len(), n as usize);
    let during = manager::stats();
    // n value buffers plus the table itself.
    assert!(
        during.buffers > before.buffers + n as u64,
        "{before:?} -> {during:?}"
    );
    for i in 0..n {
        let v = &m[&i];
        assert_aligned(v.as_ptr(), "value buffer");
        assert_eq!(&v[..], &(0..i % 5 + 1).collect::<Vec<_>>()[..]);
    }
    for i in (0..n).step_by(2) {
        assert!(m.remove(&i).is_some());
    }
    assert_eq!(m.len(), (n / 2) as usize);
    assert!(m.keys().all(|k| k % 2 == 1));
    m.shrink_to_fit();
    assert!(
        (1..n)
            .step_by(2)
            .all(|k| m[&k].len() == (k % 5 + 1) as usize)
    );
    drop(m);
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "every block returned to MKL"
    );
}

#[test]
fn hashbrown_string_keys() {
    let _g = serial();
    let before = manager::stats();
    let mut m = hashbrown::HashMap::new_in(MklAllocator);
    let n: u32 = if cfg!(miri) { 300 } else { 10_000 };
    for i in 0..n {
        m.insert(format!("k{i}"), i);
    }
    assert!(manager::stats().bytes > before.bytes + u64::from(n) * 4);
    assert!((0..n).all(|i| m[&format!("k{i}")] == i));
    drop(m);
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

#[test]
fn zero_sized_layouts_never_reach_mkl() {
    let _g = serial();
    let before = manager::stats();
    let a = MklAllocator;

    let mut units: AVec<(), MklAllocator> = AVec::new_in(MklAllocator);
    let n = if cfg!(miri) { 1_000 } else { 1_000_000 };
    for _ in 0..n {
        units.push(());
    }
    assert_eq!(units.len(), n);
    let empty: AVec<u64, MklAllocator> = AVec::with_capacity_in(0, MklAllocator);
    assert_eq!(empty.capacity(), 0);
    let zst_map: hashbrown::HashMap<(), (), _, MklAllocator> =
        hashbrown::HashMap::new_in(MklAllocator);
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "ZST collections touched MKL"
    );
    drop((units, empty, zst_map));

    for k in [0u32, 3, 6, 12, 20, 30, 40] {
        let align = 1usize << k;
        let z = Layout::from_size_align(0, align).unwrap();
        let p = a.allocate(z).expect("zero-size allocate");
        assert_eq!(p.len(), 0);
        assert_eq!(
            p.cast::<u8>().as_ptr() as usize % align,
            0,
            "dangling misaligned"
        );
        let q = a.allocate_zeroed(z).expect("zero-size allocate_zeroed");
        assert_eq!(q.cast::<u8>().as_ptr() as usize % align, 0);
        assert_eq!(
            manager::stats().mkl_held(),
            before.mkl_held(),
            "zero-size allocate reached MKL (align {align})"
        );
        // SAFETY: p and q came from `a` with layout `z`; freeing a zero-size block is a no-op.
        unsafe {
            a.deallocate(p.cast(), z);
            a.deallocate(q.cast(), z);
        }
        assert_eq!(
            manager::stats().mkl_held(),
            before.mkl_held(),
            "zero-size deallocate reached MKL"
        );
    }

    // grow from zero size allocates; shrink to zero size frees.
    let z = Layout::from_size_align(0, 8).unwrap();
    let one_k = Layout::from_size_align(1024, 8).unwrap();
    let p = a.allocate(z).unwrap().cast::<u8>();
    // SAFETY: p is a zero-size block of `z`; grow consumes it, shrink consumes
    // the grown block, and the final zero-size block needs no freeing.
    unsafe {
        let g = a
            .grow_zeroed(p, z, one_k)
            .expect("grow from zero")
            .cast::<u8>();
        assert_aligned(g.as_ptr(), "grown from zero");
        assert!(
            core::slice::from_raw_parts(g.as_ptr(), 1024)
                .iter()
                .all(|&b| b == 0)
        );
        assert_eq!(manager::stats().buffers, before.buffers + 1);
        let s = a.shrink(g, one_k, z).expect("shrink to zero");
        assert_eq!(s.len(), 0);
        assert_eq!(s.cast::<u8>().as_ptr() as usize % 8, 0);
        a.deallocate(s.cast(), z);
    }
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "shrink to zero did not free"
    );
}

/// What `MKL_realloc` does with the address, as `src/allocator.rs` and the
/// README state it (oneMKL 2026.2; `examples/realloc_in_place.rs` prints
/// more sizes): a shrink keeps the block, a growth within the block MKL
/// already holds keeps it, a growth beyond it moves the block.
#[test]
#[cfg_attr(
    miri,
    ignore = "measures where MKL puts a reallocated block; Miri's MKL emulation always moves it"
)]
fn realloc_keeps_the_address_on_shrink_and_the_contents_on_growth() {
    use core::alloc::GlobalAlloc;
    let _g = serial();
    let l = |size| Layout::from_size_align(size, 64).unwrap();
    // SAFETY: every block is a live MklAllocator block of the layout passed
    // with it, written within its size, and freed once.
    unsafe {
        let p = MklAllocator.alloc(l(100_000));
        assert!(!p.is_null());
        p.write_bytes(0xA5, 100_000);
        let q = MklAllocator.realloc(p, l(100_000), 1_000);
        assert_eq!(q, p, "a shrink keeps the address");
        let r = MklAllocator.realloc(q, l(1_000), 2_000);
        assert_eq!(r, q, "growing back within the held block keeps it");
        assert!((0..1_000).all(|i| *r.add(i) == 0xA5));
        MklAllocator.dealloc(r, l(2_000));

        for (from, to) in [(1_000, 2_000), (1 << 20, 1 << 21)] {
            let p = MklAllocator.alloc(l(from));
            assert!(!p.is_null());
            p.write_bytes(0x5A, from);
            // With MKL on the crate's memory, MKL's realloc asks i_realloc:
            // the C runtime's realloc for a small block, mremap for a
            // chunk. Either may grow in place or move; contents stay.
            let q = MklAllocator.realloc(p, l(from), to);
            assert!(!q.is_null());
            assert_eq!(q as usize % 64, 0);
            assert!((0..from).all(|i| *q.add(i) == 0x5A));
            MklAllocator.dealloc(q, l(to));
        }
    }
}
