//! Operation sequences over the medium heap beneath MKL (issue 54: blocks
//! of 4 KiB up to 1 MiB, `src/backing/medium.rs`), through both ways in:
//! `MklAllocator` (allocator-api2's `Allocator`: MKL adds its header, and
//! `allocate_zeroed` is `MKL_calloc`, which writes every byte itself) and
//! MKL's own memory pointers `i_malloc` & co. (`mkl_alloc::ffi`, the hooks
//! every MKL allocation takes: `i_calloc` trusts a block the heap says
//! reads as zero, a clean one, and writes nothing into it).
//!
//! Up to 32 slots hold live blocks; sizes lean to the edges (4096 - 88,
//! 4 KiB, 4 KiB + 1, every class's size with and without MKL's header,
//! powers of two, 1 MiB - 88, 1 MiB, just above 1 MiB, and a few below
//! 4 KiB, so that resizes cross from the C runtime to the heap and on to
//! chunks). Operations: allocate (plain or zeroed), free, resize (grow,
//! grow zeroed, shrink; `i_realloc`), decay points (the decay time set to
//! 0, 1 ms, the default: the next medium allocation then decays at once),
//! `free_buffers()`, the budget set off, to 0, small or back (a block
//! freed over it is given back at once), and a second thread that frees a
//! few blocks of the main thread's, joined before the next operation (its
//! slots go back to the heap when it exits).
//!
//! Checked: every live block holds its slot's fill where it was written
//! (the whole block up to 32 KiB; above, its first and last 8 KiB, where
//! blocks share pages and the heap zeroes or purges, and 64 bytes either
//! side of every 8th page boundary), before a free or a resize and after it
//! up to the smaller size; zeroed blocks read zero there (also taken again
//! after decay or `free_buffers` gave pages back), and so does a zeroed
//! growth's tail; through the hooks, `medium_live_bytes` moves by exactly
//! the class sizes each operation takes and gives back. At the end of each
//! input, every block freed: `medium_live_bytes` and MKL's `bytes` are back
//! where they were at its start (the calling thread's parked blocks count
//! as dirty in `figures()`, the spawned threads' went back to the heap when
//! they exited, so nothing parked counts as live), and after
//! `free_buffers()` `medium_dirty_bytes` is 0.
//!
//! Checked that it fails (each mistake planted in a local edit of the
//! crate, then reverted), on the 2-core VM, shared (load 5-7):
//! - the decay skipping the zeroing of a block's bytes on the first page
//!   it shares with a live neighbour (`Heap::give_back`): found by the
//!   seed `decay_between_live` as the corpus loads, in the first second
//!   of `scripts/fuzz.sh 60 medium_ops`; from an empty corpus, without
//!   the seeds, within 60 s in 4 runs of 6 (47-59 s: `zeroed block:
//!   byte 0 of 262184 ... is 0xb1, not 0x0`);
//! - `medium::free` dropping every block of the 48 KiB class that finds
//!   its slot taken: found in 17-20 s from an empty corpus (two runs of
//!   two), by `medium_live_bytes` after `free_buffers()` (49280 left).
//!
//! Speed: 72,404 inputs in `scripts/fuzz.sh 60 medium_ops` (1,186 a
//! second; about 2,000 a second early in a run from an empty corpus, the
//! rate falling as inputs grow). First-touch page faults were most of the
//! time, hence the sampled pages; each thread spawned and joined costs
//! about a millisecond of wall time on the loaded VM, hence [`THREADS`].
#![no_main]

use core::alloc::Layout;
use core::ffi::c_void;
use core::ptr::NonNull;
use std::sync::OnceLock;

use allocator_api2::alloc::Allocator;
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mkl_alloc::{MklAllocator, block_cache, ffi, manager};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const PAGE: usize = 4096;
/// What MKL adds to a request of alignment 64 or less (its header and
/// alignment): `MKL_malloc(4096)` asks `i_malloc` for 4184.
const MKL_HEADER: usize = 88;
const SLOTS: usize = 32;

/// The medium classes' block sizes (`src/backing/medium/class.rs`): eight
/// per doubling from 4 KiB to 32 KiB, four per doubling up to 896 KiB, each
/// plus 128 bytes, then 1 MiB.
const CLASSES: usize = 45;

fn class_block(k: usize) -> usize {
    if k == CLASSES - 1 {
        return MIB;
    }
    let (doubling, step, per) = if k < 24 {
        (k / 8, k % 8, 8)
    } else {
        (3 + (k - 24) / 4, (k - 24) % 4, 4)
    };
    let base = PAGE << doubling;
    base + base / per * step + 128
}

/// The block size the medium heap serves a request of `n` bytes beneath
/// MKL with; 0 outside 4 KiB..1 MiB.
fn medium_size(n: usize) -> usize {
    if !(PAGE..MIB).contains(&n) {
        return 0;
    }
    (0..CLASSES)
        .map(class_block)
        .find(|&b| b >= n)
        .unwrap()
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// `MklAllocator`, through allocator-api2.
    Mkl,
    /// MKL's pointers: `i_malloc`, `i_calloc`, `i_realloc`, `i_free`.
    Hook,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Size {
    /// One of [`EDGES`].
    Edge(u8),
    /// A class's block size, less MKL's header for `MklAllocator`, plus a
    /// small step either side.
    Class { k: u8, step: u8 },
    /// Any size from 4 KiB to 1 MiB + 4 KiB, mostly below 68 KiB.
    Medium(u32),
    /// Below 4 KiB.
    Small(u16),
    /// The size of the block in this slot (blocks of one class are
    /// neighbours in their span), or an edge where it is empty.
    Like(u8),
}

const EDGES: [usize; 24] = [
    PAGE - MKL_HEADER,
    PAGE - 1,
    PAGE,
    PAGE + 1,
    PAGE + 128 - MKL_HEADER,
    PAGE + 129 - MKL_HEADER,
    PAGE + 128,
    PAGE + 129,
    8 * KIB,
    16 * KIB,
    32 * KIB,
    32 * KIB + 128 - MKL_HEADER,
    64 * KIB,
    128 * KIB,
    256 * KIB,
    256 * KIB + 128 - MKL_HEADER,
    256 * KIB + 129,
    512 * KIB,
    MIB - MKL_HEADER,
    MIB - MKL_HEADER + 1,
    MIB - 1,
    MIB,
    MIB + 1,
    MIB + PAGE,
];

impl Size {
    fn bytes(self, api: Api, slots: &[Option<Block>; SLOTS]) -> usize {
        let header = if api == Api::Mkl { MKL_HEADER } else { 0 };
        let n = match self {
            Size::Like(i) => match slots[i as usize % SLOTS] {
                Some(b) => b.size,
                None => EDGES[i as usize % EDGES.len()],
            },
            Size::Edge(i) => EDGES[i as usize % EDGES.len()],
            Size::Class { k, step } => {
                let b = class_block(k as usize % CLASSES) - header;
                match step % 8 {
                    0 => b,
                    1 => b - 1,
                    2 => b + 1,
                    3 => b - 128, // whole pages
                    4 => b - 127,
                    5 => b - 129,
                    6 => b + 64,
                    _ => b - 64,
                }
            }
            Size::Medium(x) => {
                let range = if x & 3 == 0 { MIB } else { 64 * KIB };
                PAGE + (x >> 2) as usize % range
            }
            Size::Small(x) => x as usize % PAGE,
        };
        // `i_malloc(0)` and `i_realloc(p, 0)` are the C runtime's corner
        // cases (the latter may free and return null): not the heap's.
        if api == Api::Hook { n.max(1) } else { n }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Align {
    A8,
    A64,
    A4096,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Point {
    /// The decay time set to 0: the next medium allocation gives back
    /// every dirty block (and sweeps the parked ones).
    Decay0,
    Decay1,
    /// Back to the decay time the process started with.
    DecayDefault,
    FreeBuffers,
    /// The block cache off (dirty medium blocks given back; no more kept).
    BudgetOff,
    /// A budget of 0: every freed medium block past the slots is given
    /// back at once.
    BudgetZero,
    /// A budget of 64 KiB: a few dirty blocks kept, the rest given back.
    BudgetSmall,
    /// Back to the budget the process started with.
    BudgetDefault,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc {
        slot: u8,
        size: Size,
        api: Api,
        zeroed: bool,
        align: Align,
    },
    Free {
        slot: u8,
    },
    Resize {
        slot: u8,
        size: Size,
        zeroed: bool,
    },
    Point(Point),
    /// A second thread frees the blocks of up to 4 of the slots whose bit
    /// is set, and is joined (the first [`THREADS`] of an input; later
    /// ones do nothing).
    CrossFree {
        slots: u32,
    },
}

#[derive(Clone, Copy)]
struct Block {
    ptr: NonNull<u8>,
    size: usize,
    align: usize,
    api: Api,
    fill: u8,
    /// A medium block (`Api::Hook` only, where medium blocks are on).
    medium: bool,
}

// SAFETY: a block is plain memory of MKL's or the heap's, freeable from any
// thread; only one thread holds it at a time.
unsafe impl Send for Block {}

impl Block {
    fn layout(&self) -> Layout {
        Layout::from_size_align(self.size, self.align).unwrap()
    }
}

struct Hooks {
    malloc: ffi::IMalloc,
    calloc: ffi::ICalloc,
    realloc: ffi::IRealloc,
    free: ffi::IFree,
}

struct Init {
    hooks: Hooks,
    /// Medium blocks are on beneath MKL (the exact figure checks apply).
    medium: bool,
    decay_ms: usize,
    budget: Option<usize>,
}

fn init() -> &'static Init {
    static INIT: OnceLock<Init> = OnceLock::new();
    INIT.get_or_init(|| {
        manager::init();
        // MKL's first blocks in a thread bring its own (medium too): taken
        // here, before any input's figures.
        let layout = Layout::from_size_align(16 * KIB, 64).unwrap();
        let p = MklAllocator.allocate(layout).unwrap();
        // SAFETY: the block just allocated, with its layout, freed once.
        unsafe { MklAllocator.deallocate(p.cast(), layout) };
        // SAFETY: MKL's pointers are plain data, written by the crate's
        // setup (done above) and never again; read by value.
        let hooks = unsafe {
            Hooks {
                malloc: ffi::i_malloc.unwrap_or(libc_malloc),
                calloc: ffi::i_calloc.unwrap_or(libc_calloc),
                realloc: ffi::i_realloc.unwrap_or(libc_realloc),
                free: ffi::i_free.unwrap_or(libc_free),
            }
        };
        let before = manager::stats().medium_live_bytes;
        // SAFETY: malloc's contract; the block is freed once below.
        let p = unsafe { (hooks.malloc)(8 * KIB) };
        let medium = manager::stats().medium_live_bytes == before + medium_size(8 * KIB) as u64;
        // SAFETY: the block just allocated, freed once.
        unsafe { (hooks.free)(p) };
        manager::free_buffers();
        Init {
            hooks,
            medium,
            decay_ms: block_cache::decay_ms(),
            budget: block_cache::budget(),
        }
    })
}

unsafe extern "C" {
    #[link_name = "malloc"]
    fn libc_malloc(n: usize) -> *mut c_void;
    #[link_name = "calloc"]
    fn libc_calloc(n: usize, size: usize) -> *mut c_void;
    #[link_name = "realloc"]
    fn libc_realloc(p: *mut c_void, n: usize) -> *mut c_void;
    #[link_name = "free"]
    fn libc_free(p: *mut c_void);
}

/// Above this size only a block's first and last [`EDGE`] bytes are
/// written and checked, and [`WINDOW`] bytes either side of every
/// [`STRIDE`]th page boundary between (where the heap shares, purges and
/// zeroes pages: at a block's edges; its inner pages are sampled, not all
/// touched, since first-touch page faults were most of a run's time).
const FULL: usize = 32 * KIB;
const EDGE: usize = 8 * KIB;
const WINDOW: usize = 64;
const STRIDE: usize = 8;

/// The ranges (offset, length) of a block of `len` bytes at `addr` that
/// are written and checked.
fn ranges(addr: usize, len: usize, mut f: impl FnMut(usize, usize)) {
    if len <= FULL {
        if len > 0 {
            f(0, len);
        }
        return;
    }
    f(0, EDGE);
    let mut b = (addr + EDGE).next_multiple_of(PAGE) - addr;
    while b + WINDOW <= len - EDGE {
        f(b - WINDOW, 2 * WINDOW);
        b += STRIDE * PAGE;
    }
    f(len - EDGE, EDGE);
}

/// Checks that the bytes of the block at `ptr` that [`ranges`] samples
/// for a block of `sampled_len` bytes at `sampled_at` (where they were
/// written: the block before a resize moved it, or the block itself) hold
/// `v`, from offset `from` up to `len`.
fn check(
    ptr: NonNull<u8>,
    sampled_at: usize,
    sampled_len: usize,
    from: usize,
    len: usize,
    v: u8,
    what: &str,
) {
    ranges(sampled_at, sampled_len, |off, n| {
        let (start, end) = (off.max(from), (off + n).min(len));
        if start >= end {
            return;
        }
        // SAFETY: callers pass a live block of at least `len` bytes.
        let bytes = unsafe { core::slice::from_raw_parts(ptr.as_ptr().add(start), end - start) };
        let word = u64::from_ne_bytes([v; 8]);
        // SAFETY: any bytes are valid u64s.
        let (head, words, tail) = unsafe { bytes.align_to::<u64>() };
        if head.iter().chain(tail).all(|&b| b == v) && words.iter().all(|&w| w == word) {
            return;
        }
        let i = bytes.iter().position(|&b| b != v).unwrap();
        panic!(
            "{what}: byte {} of {len} at {:p} is {:#x}, not {v:#x}",
            start + i,
            ptr,
            bytes[i]
        );
    });
}

fn fill(b: &Block) {
    ranges(b.ptr.as_ptr().addr(), b.size, |off, n| {
        // SAFETY: a live block of `b.size` bytes; the range lies within.
        unsafe { b.ptr.as_ptr().add(off).write_bytes(b.fill, n) };
    });
}

fn check_block(b: &Block, what: &str) {
    let at = b.ptr.as_ptr().addr();
    check(b.ptr, at, b.size, 0, b.size, b.fill, what);
}

/// Frees `b` (any thread).
fn release(hooks: &Hooks, b: Block) {
    match b.api {
        // SAFETY: a live block of this layout from MklAllocator, freed once.
        Api::Mkl => unsafe { MklAllocator.deallocate(b.ptr, b.layout()) },
        // SAFETY: a live block of MKL's pointers, freed once.
        Api::Hook => unsafe { (hooks.free)(b.ptr.as_ptr().cast()) },
    }
}

/// Bytes in live medium blocks, as `manager::stats` reports them.
fn live() -> u64 {
    manager::stats().medium_live_bytes
}

/// Checks that a hook's operation gave back a medium block of `gone`
/// bytes (0: none) and took one of `taken` (0: none): the live figure moves
/// by exactly the difference.
fn expect_live(before: u64, gone: usize, taken: usize, what: &str) {
    let want = before + taken as u64 - gone as u64;
    let got = live();
    assert_eq!(
        got, want,
        "{what} (a medium block of {gone} bytes given back, one of {taken} taken): \
         medium_live_bytes {before} -> {got}"
    );
}

/// The medium block a hook's block of `b` holds (0: it is not one).
fn medium_of(b: &Block) -> usize {
    if b.medium { medium_size(b.size) } else { 0 }
}

struct State {
    slots: [Option<Block>; SLOTS],
    fills: u8,
    /// Whether the decay time or the budget changed (restored at the end).
    changed: bool,
    /// Whether the input called MKL (`MklAllocator`).
    mkl_used: bool,
    /// Threads spawned so far.
    threads: usize,
}

/// Threads an input may spawn: a spawn and a join cost about a
/// millisecond of wall time on a loaded 2-core VM (the new thread waits to
/// be scheduled), a hundred times an operation's.
const THREADS: usize = 2;

impl State {
    fn next_fill(&mut self, slot: usize) -> u8 {
        self.fills = self.fills.wrapping_add(1);
        // Never 0, so that a stale byte and a zeroed one differ.
        ((slot as u8).wrapping_mul(37) ^ self.fills.wrapping_mul(101)) | 1
    }
}

fn free_slot(init: &Init, st: &mut State, slot: usize) {
    let Some(b) = st.slots[slot].take() else {
        return;
    };
    check_block(&b, "before free");
    let exact = b.api == Api::Hook && init.medium;
    let before = if exact { live() } else { 0 };
    release(&init.hooks, b);
    if exact {
        expect_live(before, medium_of(&b), 0, "i_free");
    }
}

fn alloc(
    init: &Init,
    st: &mut State,
    slot: usize,
    size: Size,
    api: Api,
    zeroed: bool,
    align: Align,
) {
    free_slot(init, st, slot);
    let n = size.bytes(api, &st.slots);
    let align = match align {
        Align::A8 => 8,
        Align::A64 => 64,
        Align::A4096 => 4096,
    };
    let exact = api == Api::Hook && init.medium;
    let before = if exact { live() } else { 0 };
    let ptr = match api {
        Api::Mkl => {
            st.mkl_used = true;
            let layout = Layout::from_size_align(n, align).unwrap();
            let got = if zeroed {
                MklAllocator.allocate_zeroed(layout)
            } else {
                MklAllocator.allocate(layout)
            };
            got.ok().map(|p| p.cast::<u8>())
        }
        Api::Hook => {
            // SAFETY: malloc's and calloc's contracts (num = 1).
            let p = unsafe {
                if zeroed {
                    (init.hooks.calloc)(1, n)
                } else {
                    (init.hooks.malloc)(n)
                }
            };
            NonNull::new(p.cast::<u8>())
        }
    };
    let Some(ptr) = ptr else {
        return; // refused: allowed (the fuzzer's RSS limit)
    };
    if exact {
        let what = if zeroed { "i_calloc" } else { "i_malloc" };
        expect_live(before, 0, medium_size(n), what);
    } else if api == Api::Mkl {
        assert_eq!(ptr.as_ptr().addr() % align, 0, "{n} bytes misaligned");
    }
    let b = Block {
        ptr,
        size: n,
        align: if api == Api::Hook { 1 } else { align },
        api,
        fill: st.next_fill(slot),
        medium: exact && medium_size(n) > 0,
    };
    if zeroed {
        check(ptr, ptr.as_ptr().addr(), n, 0, n, 0, "zeroed block");
    }
    fill(&b);
    st.slots[slot] = Some(b);
}

fn resize(init: &Init, st: &mut State, slot: usize, size: Size, zeroed: bool) {
    let Some(mut b) = st.slots[slot] else {
        return;
    };
    let n = size.bytes(b.api, &st.slots);
    check_block(&b, "before resize");
    let exact = b.api == Api::Hook && init.medium;
    let before = if exact { live() } else { 0 };
    let moved = match b.api {
        Api::Mkl => {
            let (old, new) = (b.layout(), Layout::from_size_align(n, b.align).unwrap());
            // SAFETY: a live block of `old` from MklAllocator; grow for a
            // size at least the old one, shrink for a smaller one.
            unsafe {
                if n >= b.size {
                    if zeroed {
                        MklAllocator.grow_zeroed(b.ptr, old, new)
                    } else {
                        MklAllocator.grow(b.ptr, old, new)
                    }
                } else {
                    MklAllocator.shrink(b.ptr, old, new)
                }
            }
            .ok()
            .map(|p| p.cast::<u8>())
        }
        // SAFETY: a live block of MKL's pointers; `n` > 0; on failure
        // realloc leaves it as it was.
        Api::Hook => NonNull::new(unsafe { (init.hooks.realloc)(b.ptr.as_ptr().cast(), n) }.cast()),
    };
    let Some(ptr) = moved else {
        check_block(&b, "after a refused resize");
        return;
    };
    if exact {
        // A medium block resized is one of the new size's class, if it
        // is a medium size (the same block within its class); so is a
        // block of the C runtime's; a chunk stays one (or moves to the C
        // runtime): from outside the heap, either is allowed.
        let taken = medium_size(n);
        let moved_in = b.medium || (taken > 0 && live() != before);
        expect_live(
            before,
            medium_of(&b),
            if moved_in { taken } else { 0 },
            "i_realloc",
        );
        b.medium = moved_in && taken > 0;
    } else if b.api == Api::Mkl {
        assert_eq!(ptr.as_ptr().addr() % b.align, 0, "{n} bytes misaligned");
    }
    let kept = b.size.min(n);
    // What was written in the old block, at the same offsets.
    check(
        ptr,
        b.ptr.as_ptr().addr(),
        b.size,
        0,
        kept,
        b.fill,
        "kept by resize",
    );
    if zeroed && n > b.size && b.api == Api::Mkl {
        check(
            ptr,
            ptr.as_ptr().addr(),
            n,
            b.size,
            n,
            0,
            "grown zeroed tail",
        );
    }
    b.ptr = ptr;
    b.size = n;
    b.fill = st.next_fill(slot);
    fill(&b);
    st.slots[slot] = Some(b);
}

fn point(init: &Init, st: &mut State, p: Point) {
    match p {
        Point::Decay0 => block_cache::set_decay_ms(0),
        Point::Decay1 => block_cache::set_decay_ms(1),
        Point::DecayDefault => block_cache::set_decay_ms(init.decay_ms),
        Point::FreeBuffers => {
            manager::free_buffers();
            let s = manager::stats();
            assert_eq!(s.medium_dirty_bytes, 0, "dirty after free_buffers: {s:?}");
            return;
        }
        Point::BudgetOff => block_cache::disable(),
        Point::BudgetZero => block_cache::enable(0),
        Point::BudgetSmall => block_cache::enable(64 * KIB),
        Point::BudgetDefault => restore_budget(init),
    }
    st.changed = true;
}

fn restore_budget(init: &Init) {
    match init.budget {
        Some(b) => block_cache::enable(b),
        None => block_cache::disable(),
    }
}

fn cross_free(init: &'static Init, st: &mut State, mask: u32) {
    if st.threads == THREADS {
        return;
    }
    let mut batch = Vec::new();
    for slot in 0..SLOTS {
        if batch.len() == 4 {
            break;
        }
        if mask & (1 << slot) != 0
            && let Some(b) = st.slots[slot].take()
        {
            check_block(&b, "before a free on another thread");
            batch.push(b);
        }
    }
    if batch.is_empty() {
        return;
    }
    st.threads += 1;
    let before = live();
    let hooks_only = batch.iter().all(|b| b.api == Api::Hook);
    let freed: usize = batch.iter().map(medium_of).sum();
    std::thread::spawn(move || {
        for b in batch {
            release(&init.hooks, b);
        }
    })
    .join()
    .unwrap();
    // The thread's parked blocks went back to the heap as it exited.
    if hooks_only && init.medium {
        let got = live();
        assert_eq!(
            got,
            before - freed as u64,
            "{freed} bytes freed on another thread: medium_live_bytes {before} -> {got}"
        );
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let init = init();
    let start = manager::stats();
    let mut st = State {
        slots: [None; SLOTS],
        fills: 0,
        changed: false,
        mkl_used: false,
        threads: 0,
    };
    for op in ops.into_iter().take(256) {
        match op {
            Op::Alloc {
                slot,
                size,
                api,
                zeroed,
                align,
            } => alloc(
                init,
                &mut st,
                slot as usize % SLOTS,
                size,
                api,
                zeroed,
                align,
            ),
            Op::Free { slot } => free_slot(init, &mut st, slot as usize % SLOTS),
            Op::Resize { slot, size, zeroed } => {
                resize(init, &mut st, slot as usize % SLOTS, size, zeroed)
            }
            Op::Point(p) => point(init, &mut st, p),
            Op::CrossFree { slots } => cross_free(init, &mut st, slots),
        }
    }
    for slot in 0..SLOTS {
        free_slot(init, &mut st, slot);
    }
    let end = manager::stats();
    // MKL's first allocation in a thread brings blocks of its own (80 KiB
    // with oneMKL 2026.2: a medium block, live), which `free_buffers` (at
    // the end of every input, and in `init`) gives back: where the input
    // called MKL, they may be live now and were not at its start, so the
    // figure is compared after `free_buffers` only.
    if !st.mkl_used {
        assert_eq!(
            end.medium_live_bytes, start.medium_live_bytes,
            "medium_live_bytes after every block was freed: {start:?} -> {end:?}"
        );
    }
    assert_eq!(
        end.mkl_held(),
        start.mkl_held(),
        "MKL's bytes after every block was freed: {start:?} -> {end:?}"
    );
    manager::free_buffers();
    let after = manager::stats();
    assert_eq!(after.medium_dirty_bytes, 0, "after free_buffers: {after:?}");
    assert_eq!(
        after.medium_live_bytes, start.medium_live_bytes,
        "medium_live_bytes after every block was freed and free_buffers(): {start:?} -> {after:?}"
    );
    if st.changed {
        block_cache::set_decay_ms(init.decay_ms);
        restore_budget(init);
    }
});
