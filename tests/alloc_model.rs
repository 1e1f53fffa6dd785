//! Model-based property test of `MklAllocator`, and of `MklSplitAllocator`
//! over mimalloc and over jemalloc, through allocator-api2's
//! `Allocator`: random sequences of allocate / allocate_zeroed / grow /
//! grow_zeroed / shrink / deallocate, sizes 0 .. 1 MiB, alignments 1 .. 2^16.
//!
//! The model is the list of live blocks with the pattern each must hold.
//! Before every operation every live block is checked; after it, the new
//! block must be aligned to max(64, align) (an MKL block; a split's small
//! block to align), must not overlap any other live
//! block, must keep the old contents up to min(old, new) size, and zeroed
//! tails must be zero. At the end MKL must hold exactly what it held before.
//!
//! Cases: `PROPTEST_CASES` if set, else 10,000 in a release build (CI's
//! model step, a few seconds) and 1,000 in a debug build (a newcomer's
//! `cargo test`, where 10,000 took a minute of CI's time), or 64 with
//! `MKL_ALLOC_TEST_SCALE=small` (valgrind); a quarter of that for each
//! split.

use core::alloc::Layout;
use core::ptr::NonNull;
use std::sync::OnceLock;

use allocator_api2::alloc::Allocator;
use mkl_alloc::{MklAllocator, MklSplitAllocator, manager};
use proptest::prelude::*;

const MAX_SIZE: usize = 1 << 20;
const MAX_ALIGN_LOG2: u32 = 16;
const DEFAULT_CASES: u32 = 10_000;

fn cases() -> u32 {
    if let Some(n) = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return n;
    }
    if std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small") {
        64
    } else if cfg!(debug_assertions) {
        DEFAULT_CASES / 10
    } else {
        DEFAULT_CASES
    }
}

/// MAX_SIZE + 64 Ki pseudo-random bytes: block `tag` must hold the window
/// starting at `tag * 61 % 64 Ki`, so every block's pattern is distinct.
fn pattern() -> &'static [u8] {
    static P: OnceLock<Vec<u8>> = OnceLock::new();
    P.get_or_init(|| {
        let mut x = 0x853c_49e6_748f_ea9bu64;
        (0..MAX_SIZE + (1 << 16))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    })
}

fn window(tag: u64, len: usize) -> &'static [u8] {
    let start = (tag as usize * 61) % (1 << 16);
    &pattern()[start..start + len]
}

static ZEROS: [u8; MAX_SIZE] = [0; MAX_SIZE];

/// One operation. `slot` picks a live block (modulo the number of live
/// blocks; ignored when there is none).
#[derive(Clone, Debug)]
enum Op {
    Allocate {
        size: usize,
        align_log2: u32,
    },
    AllocateZeroed {
        size: usize,
        align_log2: u32,
    },
    Grow {
        slot: usize,
        new_size: usize,
        align_log2: u32,
    },
    GrowZeroed {
        slot: usize,
        new_size: usize,
        align_log2: u32,
    },
    Shrink {
        slot: usize,
        new_size: usize,
        align_log2: u32,
    },
    Deallocate {
        slot: usize,
    },
}

fn size() -> impl Strategy<Value = usize> {
    // Mostly small, sometimes up to 1 MiB; shrinks towards 0.
    prop_oneof![
        4 => 0..=256usize,
        3 => 0..=16_384usize,
        1 => 0..=MAX_SIZE,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let align = 0..=MAX_ALIGN_LOG2;
    prop_oneof![
        3 => (size(), align.clone()).prop_map(|(size, align_log2)| Op::Allocate { size, align_log2 }),
        2 => (size(), align.clone())
            .prop_map(|(size, align_log2)| Op::AllocateZeroed { size, align_log2 }),
        2 => (any::<usize>(), size(), align.clone())
            .prop_map(|(slot, new_size, align_log2)| Op::Grow { slot, new_size, align_log2 }),
        2 => (any::<usize>(), size(), align.clone())
            .prop_map(|(slot, new_size, align_log2)| Op::GrowZeroed { slot, new_size, align_log2 }),
        2 => (any::<usize>(), size(), align)
            .prop_map(|(slot, new_size, align_log2)| Op::Shrink { slot, new_size, align_log2 }),
        2 => any::<usize>().prop_map(|slot| Op::Deallocate { slot }),
    ]
}

struct Live {
    ptr: NonNull<u8>,
    layout: Layout,
    /// Which pattern window the block holds.
    tag: u64,
}

struct Model<A: Allocator> {
    a: A,
    /// The alignment a block of a layout must have (not zero-sized).
    align_of: fn(&A, Layout) -> usize,
    live: Vec<Live>,
    next_tag: u64,
}

impl<A: Allocator> Model<A> {
    fn new(a: A, align_of: fn(&A, Layout) -> usize) -> Self {
        Model {
            a,
            align_of,
            live: Vec::new(),
            next_tag: 0,
        }
    }

    fn check_all(&self) -> Result<(), TestCaseError> {
        for (i, b) in self.live.iter().enumerate() {
            // SAFETY: every block in the model is live, owned by the model
            // and was fully written with its pattern.
            let got = unsafe { core::slice::from_raw_parts(b.ptr.as_ptr(), b.layout.size()) };
            prop_assert!(
                got == window(b.tag, b.layout.size()),
                "live block {} ({:?}) lost its pattern",
                i,
                b.layout
            );
        }
        Ok(())
    }

    /// Checks a block just returned by the allocator for `layout`.
    fn check_new(&self, p: NonNull<[u8]>, layout: Layout) -> Result<NonNull<u8>, TestCaseError> {
        prop_assert_eq!(p.len(), layout.size(), "block length");
        let ptr = p.cast::<u8>();
        let addr = ptr.as_ptr() as usize;
        let want = if layout.size() == 0 {
            layout.align()
        } else {
            (self.align_of)(&self.a, layout)
        };
        prop_assert_eq!(
            addr % want,
            0,
            "{:#x} not aligned to {} for {:?}",
            addr,
            want,
            layout
        );
        if layout.size() > 0 {
            for b in self.live.iter().filter(|b| b.layout.size() > 0) {
                let other = b.ptr.as_ptr() as usize;
                let disjoint = addr + layout.size() <= other || other + b.layout.size() <= addr;
                prop_assert!(
                    disjoint,
                    "new block {:#x}+{} overlaps live block {:#x}+{}",
                    addr,
                    layout.size(),
                    other,
                    b.layout.size()
                );
            }
        }
        Ok(ptr)
    }

    fn push(&mut self, ptr: NonNull<u8>, layout: Layout) {
        let tag = self.next_tag;
        self.next_tag += 1;
        // SAFETY: ptr is a live block of layout.size() bytes, owned by the model.
        unsafe {
            core::ptr::copy_nonoverlapping(
                window(tag, layout.size()).as_ptr(),
                ptr.as_ptr(),
                layout.size(),
            )
        };
        self.live.push(Live { ptr, layout, tag });
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.check_all()?;
        let a = &self.a;
        match *op {
            Op::Allocate { size, align_log2 } | Op::AllocateZeroed { size, align_log2 } => {
                let layout = Layout::from_size_align(size, 1 << align_log2).unwrap();
                let zeroed = matches!(op, Op::AllocateZeroed { .. });
                let p = if zeroed {
                    a.allocate_zeroed(layout)
                } else {
                    a.allocate(layout)
                };
                let p = p.map_err(|_| TestCaseError::fail(format!("{op:?} failed")))?;
                let ptr = self.check_new(p, layout)?;
                if zeroed {
                    // SAFETY: a fresh block of `size` bytes.
                    let got = unsafe { core::slice::from_raw_parts(ptr.as_ptr(), size) };
                    prop_assert!(got == &ZEROS[..size], "allocate_zeroed not zero");
                }
                self.push(ptr, layout);
            }
            Op::Grow {
                slot,
                new_size,
                align_log2,
            }
            | Op::GrowZeroed {
                slot,
                new_size,
                align_log2,
            }
            | Op::Shrink {
                slot,
                new_size,
                align_log2,
            } => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let i = slot % self.live.len();
                let old = self.live.swap_remove(i);
                let old_size = old.layout.size();
                let shrink = matches!(op, Op::Shrink { .. });
                // Grow needs new >= old, shrink new <= old: fold the size in.
                let new_size = if shrink {
                    new_size.min(old_size)
                } else {
                    new_size.max(old_size).min(MAX_SIZE)
                };
                let new = Layout::from_size_align(new_size, 1 << align_log2).unwrap();
                // SAFETY: old.ptr is a live block of old.layout owned by the
                // model (removed from it above); the call consumes it on success.
                let r = unsafe {
                    match op {
                        Op::Grow { .. } => a.grow(old.ptr, old.layout, new),
                        Op::GrowZeroed { .. } => a.grow_zeroed(old.ptr, old.layout, new),
                        _ => a.shrink(old.ptr, old.layout, new),
                    }
                };
                let p = match r {
                    Ok(p) => p,
                    Err(_) => {
                        self.live.push(old);
                        return Err(TestCaseError::fail(format!("{op:?} failed")));
                    }
                };
                let ptr = self.check_new(p, new)?;
                let keep = old_size.min(new_size);
                // SAFETY: the new block is live and holds at least new_size bytes.
                let got = unsafe { core::slice::from_raw_parts(ptr.as_ptr(), new_size) };
                prop_assert!(
                    got[..keep] == *window(old.tag, keep),
                    "{:?}: the first {} bytes were not kept",
                    op,
                    keep
                );
                if matches!(op, Op::GrowZeroed { .. }) {
                    prop_assert!(got[keep..] == ZEROS[..new_size - keep], "tail not zeroed");
                }
                self.push(ptr, new);
            }
            Op::Deallocate { slot } => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let b = self.live.swap_remove(slot % self.live.len());
                // SAFETY: b is a live block of b.layout, removed from the model.
                unsafe { a.deallocate(b.ptr, b.layout) };
            }
        }
        Ok(())
    }
}

impl<A: Allocator> Drop for Model<A> {
    fn drop(&mut self) {
        for b in self.live.drain(..) {
            // SAFETY: every block left in the model is live and owned by it.
            unsafe { self.a.deallocate(b.ptr, b.layout) };
        }
    }
}

/// An MKL block's alignment.
fn mkl_align<A>(_: &A, layout: Layout) -> usize {
    layout.align().max(64)
}

/// A split's: MKL's for an MKL block, the layout's for a small one.
fn split_align<S, const T: usize>(a: &MklSplitAllocator<S, T>, layout: Layout) -> usize {
    if a.is_mkl(layout) {
        layout.align().max(64)
    } else {
        layout.align()
    }
}

/// Runs `ops` on a fresh model over `a`; at the end MKL must hold what it
/// held before.
fn run<A: Allocator>(
    a: A,
    align_of: fn(&A, Layout) -> usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    // MKL's counts are compared block for block: the block cache (on by
    // default) would keep freed large blocks, counted by MKL; its own
    // sequences are tests/block_cache.rs's.
    mkl_alloc::block_cache::disable();
    let before = manager::stats();
    {
        let mut model = Model::new(a, align_of);
        for op in ops {
            model.apply(op)?;
        }
        model.check_all()?;
    }
    // The model freed everything: MKL holds what it held before.
    prop_assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "blocks leaked or double-counted"
    );
    Ok(())
}

/// MKL's counts are process-wide: one model at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_op_sequences_keep_every_block_intact(ops in prop::collection::vec(op(), 1..48)) {
        let _g = serial();
        run(MklAllocator, mkl_align, &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases().div_ceil(4),
        ..ProptestConfig::default()
    })]

    #[test]
    fn split_over_mimalloc_keeps_every_block_intact(ops in prop::collection::vec(op(), 1..48)) {
        let _g = serial();
        run(MklSplitAllocator::over(mimalloc::MiMalloc), split_align, &ops)?;
    }

    #[cfg(unix)]
    #[test]
    fn split_over_jemalloc_keeps_every_block_intact(ops in prop::collection::vec(op(), 1..48)) {
        let _g = serial();
        run(MklSplitAllocator::over(tikv_jemallocator::Jemalloc), split_align, &ops)?;
    }
}
