//! A one-minute tour of mkl-alloc: `cargo run --release --example tour`.
//!
//! This binary runs entirely on MKL's memory manager: `MklAllocator` is its
//! global allocator, so every String, Vec and HashMap below lives in MKL memory.

use std::collections::HashMap;

use std::sync::Arc;
use std::thread;

use mkl_alloc::{MklAllocator, SharedMklVec, SharedVecError, manager};

#[global_allocator]
static GLOBAL: MklAllocator = MklAllocator;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    println!("mkl-alloc tour\n");

    println!("1. MklAllocator is this program's global allocator.");
    let before = manager::stats();
    let words: Vec<String> = (0..10_000).map(|i| format!("word-{i}")).collect();
    let index: HashMap<&str, usize> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.as_str(), i))
        .collect();
    let during = manager::stats();
    println!(
        "   10,000 Strings + a HashMap: MKL holds {} more blocks, {:.2} MiB more (MKL_Mem_Stat)",
        during.buffers - before.buffers,
        mib(during.bytes - before.bytes)
    );
    let misaligned = words
        .iter()
        .filter(|w| w.as_ptr() as usize % 64 != 0)
        .count();
    println!(
        "   every String's buffer is 64-byte aligned: {} misaligned of {}",
        misaligned,
        words.len()
    );
    assert_eq!(index["word-9999"], 9999);
    drop(index);
    drop(words);

    println!("\n2. Or only for chosen collections, through allocator-api2.");
    let mut samples: allocator_api2::vec::Vec<f64, MklAllocator> =
        allocator_api2::vec::Vec::new_in(MklAllocator);
    samples.extend((0..1_000_000).map(|i| f64::from(i).sqrt()));
    println!(
        "   Vec<f64, MklAllocator> of {} elements at {:p} (address % 64 = {}), sum = {:.1}",
        samples.len(),
        samples.as_ptr(),
        samples.as_ptr() as usize % 64,
        samples.iter().sum::<f64>()
    );
    let mut table = hashbrown::HashMap::new_in(MklAllocator);
    table.extend((0u64..100_000).map(|k| (k, k * k)));
    println!(
        "   hashbrown::HashMap::new_in(MklAllocator): {} entries, 99,999² = {}",
        table.len(),
        table[&99_999]
    );

    println!("\n3. Alignment is whatever you ask for, up to 2^30.");
    for align in [64usize, 4096, 1 << 21] {
        let layout = std::alloc::Layout::from_size_align(1000, align).unwrap();
        // SAFETY: a non-zero-sized layout; the block is freed with the same layout.
        unsafe {
            let p = std::alloc::GlobalAlloc::alloc(&MklAllocator, layout);
            println!(
                "   align {align:>8}: {p:p}  (address % align = {})",
                p as usize % align
            );
            std::alloc::GlobalAlloc::dealloc(&MklAllocator, p, layout);
        }
    }
    let too_strict = std::alloc::Layout::from_size_align(64, 1 << 31).unwrap();
    // SAFETY: as above; a null result is not freed.
    let p = unsafe { std::alloc::GlobalAlloc::alloc(&MklAllocator, too_strict) };
    println!(
        "   align 2^31 (MKL's int parameter cannot say it): {p:p}, refused rather than misaligned"
    );

    drop(samples);
    drop(table);

    println!("\n4. MKL's memory manager, observed and controlled (mkl_alloc::manager).");
    manager::enable_peak_tracking();
    let big: Vec<f64> = vec![0.5; 4 << 20];
    let peak = manager::peak_bytes().unwrap_or(0);
    drop(big);
    let now = manager::stats();
    println!(
        "   peak while a 32 MiB Vec lived: {:.1} MiB; after drop: {:.1} MiB live, {:.1} MiB cached",
        mib(peak),
        mib(now.live_bytes()),
        mib(now.cached_bytes)
    );
    println!("   (the block cache keeps freed large blocks for reuse, for about a second)");
    manager::reset_peak();
    manager::disable_peak_tracking();
    manager::free_buffers();
    println!(
        "   free_buffers() gave cached blocks back: {:.1} MiB cached now",
        mib(manager::stats().cached_bytes)
    );

    println!("\n5. SharedMklVec: one buffer, many threads, resized through &self.");
    let shared = Arc::new(SharedMklVec::from_slice(&[1.0f64, 2.0, 3.0]));
    let view = SharedMklVec::view_arc(&shared).expect("nobody is resizing");
    let refused = shared.try_push(4.0);
    assert_eq!(refused, Err(SharedVecError::Exported { views: 1 }));
    println!("   try_push while a view lives: {}", refused.unwrap_err());
    let sum = thread::spawn(move || view.iter().sum::<f64>())
        .join()
        .unwrap();
    println!("   another thread summed its view: {sum}; the view is gone with that thread");
    shared.try_push(4.0).expect("no view is alive now");
    println!(
        "   try_push after it dropped: ok, len {}, capacity {}, {}-byte aligned",
        shared.len(),
        shared.capacity(),
        shared.alignment()
    );

    println!("\nDone. `cargo test` runs the test suite; the README has the rest.");
}
