//! A whole test binary with `MklSplitAllocator` as its `#[global_allocator]`:
//! std's collections, strings, threads and over-aligned boxes work on it,
//! large blocks are MKL's (seen in `MKL_Mem_Stat`) and small ones are not.
//!
//! `harness = false`: the checks count MKL blocks exactly, so they run one
//! after another on the main thread, with no test harness allocating beside
//! them (under valgrind libtest's own allocations raced the counts).

use std::collections::{BTreeMap, HashMap};

use mkl_alloc::{DEFAULT_SPLIT_THRESHOLD, MklSplitAllocator, manager};

#[global_allocator]
static GLOBAL: MklSplitAllocator = MklSplitAllocator;

const T: usize = DEFAULT_SPLIT_THRESHOLD;

fn mkl_blocks() -> u64 {
    manager::stats().buffers
}

fn large_buffers_are_mkl_blocks_aligned_to_64() {
    let base = manager::stats();
    let v = vec![1.5f64; 1 << 17];
    let during = manager::stats();
    assert_eq!(v.as_ptr() as usize % 64, 0);
    assert_eq!(during.buffers, base.buffers + 1);
    assert!(during.bytes >= base.bytes + (1 << 20));
    assert!(v.iter().all(|&x| x == 1.5));
    drop(v);
    assert_eq!(mkl_blocks(), base.buffers);
}

fn small_objects_are_not_mkl_blocks() {
    let base = manager::stats();
    let boxes: Vec<Box<u64>> = (0..100).map(Box::new).collect(); // 800 B vector
    let strings: Vec<String> = (0..100).map(|i| format!("item-{i}")).collect();
    assert_eq!(manager::stats(), base, "small blocks went to MKL");
    assert_eq!(*boxes[99], 99);
    assert_eq!(strings[42], "item-42");
}

fn over_aligned_boxes_are_mkl_blocks() {
    #[repr(C, align(32))]
    struct Simd([f32; 8]);
    let base = mkl_blocks();
    let b = Box::new(Simd([2.0; 8]));
    assert_eq!(&*b as *const Simd as usize % 64, 0);
    assert_eq!(mkl_blocks(), base + 1);
    assert_eq!(b.0[7], 2.0);
    drop(b);
    assert_eq!(mkl_blocks(), base);
}

fn a_growing_vec_moves_into_mkl_and_back_keeping_contents() {
    let base = mkl_blocks();
    let mut v: Vec<u8> = Vec::new();
    let mut moved_in = false;
    for i in 0..(4 * T) {
        v.push((i % 251) as u8);
        if v.capacity() >= T {
            moved_in = true;
            assert_eq!(v.as_ptr() as usize % 64, 0);
            assert_eq!(mkl_blocks(), base + 1);
        } else {
            assert_eq!(mkl_blocks(), base);
        }
    }
    assert!(moved_in);
    v.truncate(T / 2);
    v.shrink_to_fit(); // realloc large -> small
    assert_eq!(mkl_blocks(), base);
    assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    let mut s = String::with_capacity(10);
    for _ in 0..T {
        s.push('x'); // realloc small -> large
    }
    assert_eq!(mkl_blocks(), base + 1);
    assert_eq!(s.len(), T);
    drop(s);
    assert_eq!(mkl_blocks(), base);
}

fn std_collections_and_threads_work() {
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut m: BTreeMap<String, Vec<u32>> = BTreeMap::new();
                for i in 0..20_000u64 {
                    m.insert(format!("{t}-{i}"), (0..(i % 7) as u32).collect());
                }
                let c = m.clone();
                drop(m);
                let mut h: HashMap<u64, String> = HashMap::new();
                for i in 0..20_000 {
                    h.insert(i, i.to_string());
                }
                (c.len(), c[&format!("{t}-13")].len(), h[&19_999].clone())
            })
        })
        .collect();
    for h in handles {
        let (n, longest, last) = h.join().unwrap();
        assert_eq!(n, 20_000);
        assert_eq!(longest, 6);
        assert_eq!(last, "19999");
    }
}

fn main() {
    // The checks count MKL blocks exactly; the block cache (on by default)
    // keeps freed large blocks, counted by MKL, so it is off here.
    mkl_alloc::block_cache::disable();
    let checks: [(&str, fn()); 5] = [
        (
            "large_buffers_are_mkl_blocks_aligned_to_64",
            large_buffers_are_mkl_blocks_aligned_to_64,
        ),
        (
            "small_objects_are_not_mkl_blocks",
            small_objects_are_not_mkl_blocks,
        ),
        (
            "over_aligned_boxes_are_mkl_blocks",
            over_aligned_boxes_are_mkl_blocks,
        ),
        (
            "a_growing_vec_moves_into_mkl_and_back_keeping_contents",
            a_growing_vec_moves_into_mkl_and_back_keeping_contents,
        ),
        (
            "std_collections_and_threads_work",
            std_collections_and_threads_work,
        ),
    ];
    for (name, check) in checks {
        check();
        println!("test {name} ... ok");
    }
    println!("split_global: {} passed, 0 failed", checks.len());
}
