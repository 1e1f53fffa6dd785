//! Medium blocks: every block beneath MKL from 4 KiB up to [`MIN_CHUNK`]
//! (1 MiB) on the crate's own memory, given back to the kernel after the
//! decay time.
//!
//! **Why.** Below 1 MiB the hooks used to pass MKL's requests to the C
//! runtime (glibc's `malloc`), which never returns a freed block that sits
//! between live small ones: a NumPy program that made and freed 1 GiB of
//! 48 KiB arrays, a short string kept between each two, stayed 1 GiB
//! resident (issue 42). Medium blocks are served instead from one region
//! of the crate's, and freed ones go back to the kernel (`MADV_DONTNEED`,
//! so the resident set drops, not only what the kernel may reclaim) once
//! unused for the block cache's decay time.
//!
//! **What.** At the first medium request the region is placed (`region`:
//! a range of up to 128 GiB from 1 TiB up, of which only a first segment of
//! 64 MiB is mapped; it grows a segment at a time as spans are needed,
//! each mapped right after the last, so that under `ulimit -v` the region
//! takes what the medium working set needs, not the limit's half; where
//! no such place can be had it is reserved whole, and if even that fails
//! medium blocks stay off and requests go to the functions beneath the
//! hooks, as before). It stays one range of addresses, so telling whether
//! a freed pointer is a medium block is one subtraction and a comparison,
//! made before the chunk table's lookup. The region is carved into spans
//! of 4 MiB, handed bump-style to 45 size classes (`class`: eight per
//! doubling from 4 to 32 KiB, then four up to 1 MiB, each plus 128 bytes,
//! room for MKL's header; a request takes the smallest class
//! that holds it; blocks lie back to back, 64-byte aligned, so that a
//! 4 KiB array is resident at 4 KiB + 128 B, and a block's pages past
//! what its owner touches never become resident; a page two blocks share
//! is given back once both are free). Each class has a lock
//! (`lock`: a spin lock; while it is held no system call is made and only
//! the span pool's lock is taken), a list of dirty blocks (freed, resident, reused
//! newest first, each with the time it was freed), a list of clean ones
//! (given back: they read as zero, so a zeroed request taking one writes
//! nothing) and the bump range of its span. Metadata lives outside the
//! blocks (`heap`: an entry of 16 bytes per page in each segment's first
//! span), so a clean block's pages stay unresident. Spans stay with their
//! class for good (their free blocks with them, clean once decayed:
//! address space only); a request that finds no span left, and the region
//! unable to grow, goes to the previous functions. A block of the previous
//! functions that `i_realloc` resizes to a medium size (a `Vec` pushed
//! past 4 KiB) moves onto a medium block.
//!
//! **Decay and budget.** A dirty block freed at least
//! [`block_cache::decay_ms`] ago is purged and moved to the clean list by
//! [`decay`], which the block cache's decay points call (a large
//! allocation or free, and every thread's [`TICKS`](block_cache::TICKS)th
//! small or medium free), as can any thread at any time (a background
//! decay thread). Dirty bytes count under the block cache's one budget
//! (with the cached chunks and the growth slack): a block freed when they
//! do not fit is purged at once. `manager::free_buffers()`,
//! `block_cache::empty()` and `block_cache::disable()` purge every dirty
//! block. The purge runs outside the class's lock (the lock is held to
//! take a batch of blocks off the dirty list, and again to put them on
//! the clean list), adjacent blocks in one call, under the heap's rare
//! lock, which the fork handler takes: no child inherits a batch on no
//! list, nor its budget reserved (a free reserves under the class's lock
//! for the same reason).
//!
//! **A program that lets go of its work, without a background thread.**
//! The decay runs at the crate's calls, or on the background decay thread
//! ([`crate::background`]). Without the thread, a program that frees its
//! medium blocks and then makes no call that reaches the crate's memory
//! (it allocates only small objects, which the split's small side or
//! MKL's own small buffers serve) would keep them resident for as long as
//! it runs. The crate tells such a program by its frees: a run of frees
//! that passes [`LET_GO`] (16 MiB) beyond the medium allocations made
//! meanwhile is a program letting go of its work, not one reusing it (a
//! working set in use frees and allocates in turn; a teardown may still
//! allocate now and then). From then on, until the run's dirty
//! blocks are reused or decayed, every allocation through the crate's
//! allocators is a decay point, small ones too (`MklAllocator`'s, which
//! MKL serves from its own buffers, and the split's small side's): a
//! coarse clock read, and the decay once due. So one allocation after an
//! idle pause gives back what decayed meanwhile, as one medium allocation
//! always did. Otherwise the check costs the split's small allocation a
//! relaxed load (in an out-of-line call that tail-calls the small side)
//! and `MklAllocator`'s nothing: the flag zeroes the word its every call
//! already compares with (`signals::all_slow`), so that its allocations
//! take the slow path, which checks. With the thread, nothing is flagged:
//! the thread decays by the clock.
//!
//! **Figures.** [`MemStats`](crate::manager::MemStats) reports bytes in
//! live medium blocks (`medium_live_bytes`, at their classes' sizes; MKL
//! counts the same blocks in `bytes`, at the sizes asked), held dirty for
//! reuse (`medium_dirty_bytes`) and given back (`medium_clean_bytes`:
//! address space, not memory).
//!
//! **Where.** Linux. `MKL_ALLOC_MEDIUM=off` (read once, at the hooks'
//! setup) keeps the C runtime beneath MKL below 1 MiB, as does
//! `MKL_ALLOC_BACKING=off`. On Windows, and under Miri, medium requests go
//! to the previous functions as before (the heap's logic is tested on a
//! plain allocation there). A `fork` finds every class unlocked: the fork
//! handler takes the rare lock, then the classes' locks, after the block
//! cache's shards.

#![cfg_attr(
    any(loom, miri, not(target_os = "linux")),
    allow(dead_code, unused_imports)
)]

pub(crate) mod class;
pub(crate) mod heap;
pub(crate) mod lock;
#[cfg(target_os = "linux")]
mod region;
pub(crate) mod slots;

#[cfg(not(loom))]
pub(crate) use instance::*;

/// A run of frees that passes this many bytes beyond the medium
/// allocations made meanwhile is a program letting go of its work: until its dirty blocks are
/// reused or decayed, every allocation of the crate's allocators is a
/// decay point (see the module docs).
pub(crate) const LET_GO: usize = 16 << 20;

/// Under loom there is no process heap (the model builds its own).
#[cfg(loom)]
pub(crate) fn figures() -> (usize, usize, usize) {
    (0, 0, 0)
}

#[cfg(loom)]
pub(crate) fn fallbacks() -> (usize, usize) {
    (0, 0)
}

#[cfg(loom)]
pub(crate) fn empty() {}

#[cfg(loom)]
#[inline(always)]
pub(crate) fn at_allocation() {}

#[cfg(loom)]
#[inline(always)]
pub(crate) fn let_go_pending() -> bool {
    false
}

#[cfg(doc)]
use super::{MIN_CHUNK, block_cache};

#[cfg(not(loom))]
mod instance {
    use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering::Relaxed};

    use super::heap::{Env, Heap};
    use super::slots::{self, SLOT_CLASSES};
    use super::{LET_GO, class};
    use crate::backing::{block_cache, decay};

    /// The process's medium heap (its region set at the first request).
    pub(super) static HEAP: Heap = Heap::new();

    /// 0: on (the region reserved at the first request), 1: off (no
    /// region could be reserved), 2: off (`MKL_ALLOC_MEDIUM=off`), 3: off
    /// (not built for this system).
    static OFF: AtomicU8 = AtomicU8::new(0);

    /// Medium-size requests that went to the C runtime because the heap
    /// had no room (the region full and unable to grow, or none could be
    /// reserved), and the bytes they asked for: `MemStats` reports both.
    /// Touched on that path only.
    static FALLBACKS: AtomicUsize = AtomicUsize::new(0);
    static FALLBACK_BYTES: AtomicUsize = AtomicUsize::new(0);

    /// Whether the region grows (placed where segments may follow it).
    static GROWS: AtomicBool = AtomicBool::new(false);

    /// The classes the fork handler locked (bit `k`: class `k`).
    static FORK_TAKEN: AtomicU64 = AtomicU64::new(0);

    /// Whether the fork handler took the slots' registry lock.
    static SLOTS_TAKEN: AtomicBool = AtomicBool::new(false);

    /// Bytes freed less bytes allocated (medium blocks, floored at zero)
    /// while no background thread serves the process: the current run of
    /// frees.
    static RUN: AtomicUsize = AtomicUsize::new(0);

    /// A run of frees passed [`LET_GO`] and its dirty blocks are not yet
    /// reused or decayed: every allocation of the crate's allocators is a
    /// decay point ([`let_go`]).
    static LET_GO_PENDING: AtomicBool = AtomicBool::new(false);

    /// Bytes in dirty blocks (the classes' `dirty` figures summed, in one
    /// word): the flag clears once they are down to [`LET_GO`].
    static DIRTY: AtomicUsize = AtomicUsize::new(0);

    /// The budget and the purge beneath the process's heap.
    pub(super) struct Global;

    impl Env for Global {
        #[inline(always)]
        fn reserve(&self, n: usize) -> bool {
            let kept = block_cache::reserve_medium(n);
            if kept {
                DIRTY.fetch_add(n, Relaxed);
            }
            kept
        }
        #[inline(always)]
        fn unreserve(&self, n: usize) {
            DIRTY.fetch_sub(n, Relaxed);
            block_cache::unreserve_medium(n)
        }
        unsafe fn purge(&self, p: *mut u8, len: usize) {
            #[cfg(target_os = "linux")]
            // SAFETY: the caller's contract: free blocks of the region.
            unsafe {
                super::region::purge(p, len)
            };
            #[cfg(not(target_os = "linux"))]
            let _ = (p, len); // no region: never reached
        }
        unsafe fn zero(&self, p: *mut u8, len: usize) {
            // A free block: inaccessible to memcheck but for this write.
            crate::backing::valgrind::mark_defined(p.addr(), len);
            // SAFETY: the caller's contract: a free block's bytes, ours.
            unsafe { p.write_bytes(0, len) };
            crate::backing::valgrind::mark_noaccess(p.addr(), len);
        }
    }

    /// Turns medium blocks off (`MKL_ALLOC_MEDIUM=off`): read once, before
    /// the first request; later requests go to the previous functions.
    pub(crate) fn turn_off() {
        OFF.store(2, Relaxed);
    }

    /// Whether medium blocks are on (Linux, not turned off, a region
    /// reserved or still to be), and whether `MKL_ALLOC_MEDIUM=off` turned
    /// them off.
    pub(crate) fn is_on() -> (bool, bool) {
        let off = OFF.load(Relaxed);
        (
            cfg!(all(target_os = "linux", not(miri))) && off == 0,
            off == 2,
        )
    }

    /// Whether `p` is a medium block (or in the region): one subtraction
    /// and a comparison.
    #[inline(always)]
    pub(crate) fn contains(p: *const u8) -> bool {
        HEAP.contains(p)
    }

    /// A medium block for a request of `n` bytes, and whether it reads as
    /// zero; `None` if `n` is not a medium size, medium blocks are off, or
    /// the region is full.
    ///
    /// Each medium allocation is also a decay point (a coarse clock read
    /// and one load while no sweep is due): a program that goes idle and
    /// then makes one medium allocation gives back what decayed meanwhile,
    /// without a background thread.
    #[inline]
    pub(crate) fn alloc(n: usize) -> Option<(*mut u8, bool)> {
        let k = class::of(n)?;
        if k < SLOT_CLASSES {
            if let Some(p) = slots::take(k) {
                crate::backing::valgrind::malloc_like(p.addr(), class::size(k), false);
                return Some((p, false));
            }
        }
        if !HEAP.ready() && !init() {
            if OFF.load(Relaxed) == 1 {
                fell_back(n);
            }
            return None;
        }
        let mut got = HEAP.alloc(k, &Global);
        if got.is_none() {
            got = grow_and_alloc(k);
            if got.is_none() {
                fell_back(n);
            }
        }
        // A medium allocation takes its size off the run of frees (see
        // `let_go`): a working set that frees and allocates in turn keeps
        // it near zero, while a teardown with an allocation now and then
        // (a result kept per 64 arrays dropped) still passes LET_GO. No
        // read-modify-write: a lost update only shifts the estimate.
        let run = RUN.load(Relaxed);
        if run != 0 {
            RUN.store(run.saturating_sub(class::size(k)), Relaxed);
        }
        // And clears the flag once the run's blocks are reused.
        settle();
        if let Some((p, zero)) = got {
            // To memcheck, the whole class size (a resize within the class
            // keeps the block and copies nothing; one across copies it whole).
            crate::backing::valgrind::malloc_like(p.addr(), class::size(k), zero);
        }
        decay::medium_point(crate::sys::now_ms());
        got
    }

    /// A request of `n` bytes the heap could not serve: counted, and said
    /// once on stderr (a system call, no allocation: this runs beneath
    /// MKL, inside its calls).
    #[cold]
    #[inline(never)]
    fn fell_back(n: usize) {
        if FALLBACKS.fetch_add(1, Relaxed) == 0 {
            crate::sys::write_stderr(
                b"mkl-alloc: the medium heap has no room (its address space is full or could not be reserved): MKL's blocks of 4 KiB-1 MiB it cannot place go to the C runtime, counted in MemStats::medium_fallbacks\n",
            );
        }
        FALLBACK_BYTES.fetch_add(n, Relaxed);
    }

    /// Medium-size requests the C runtime served because the heap had no
    /// room, and the bytes they asked for, since the process started.
    pub(crate) fn fallbacks() -> (usize, usize) {
        (FALLBACKS.load(Relaxed), FALLBACK_BYTES.load(Relaxed))
    }

    /// Grows the region by a segment where it may (every span handed out),
    /// then takes a block of class `k` again.
    #[cold]
    #[inline(never)]
    fn grow_and_alloc(k: usize) -> Option<(*mut u8, bool)> {
        #[cfg(target_os = "linux")]
        // SAFETY: the heap passes the end of the region that
        // `region::reserve` placed, under its rare lock.
        if GROWS.load(Relaxed) && HEAP.grow(|at| unsafe { super::region::grow(at) }) {
            return HEAP.alloc(k, &Global);
        }
        let _ = k;
        None
    }

    const _: () = assert!(class::size(SLOT_CLASSES - 1) == (256 << 10) + class::HEADROOM);

    /// Reserves the region, once: `false` if medium blocks are off or
    /// none can be had. Racing threads each reserve one; the first to set
    /// it wins and the others give theirs back.
    #[cold]
    #[inline(never)]
    fn init() -> bool {
        if OFF.load(Relaxed) != 0 {
            return false;
        }
        #[cfg(target_os = "linux")]
        {
            let Some((p, len, grows)) = super::region::reserve() else {
                OFF.store(1, Relaxed);
                return false;
            };
            if HEAP.set_region(p, len) {
                GROWS.store(grows, Relaxed);
            } else {
                // SAFETY: our reservation, unused: another thread's won.
                unsafe { super::region::unreserve(p, len) };
            }
            // The winner may not have published the length yet: this
            // request goes to the previous functions then.
            HEAP.ready()
        }
        #[cfg(not(target_os = "linux"))]
        {
            OFF.store(3, Relaxed);
            false
        }
    }

    /// The class size of the medium block `p`: the bytes it holds.
    ///
    /// # Safety
    /// `p` is a live medium block.
    #[inline]
    pub(crate) unsafe fn block_size(p: *const u8) -> usize {
        HEAP.block_size(p)
    }

    /// The size of the class a request of `n` bytes takes, `None` if it
    /// is not a medium size.
    #[inline]
    pub(crate) fn class_size(n: usize) -> Option<usize> {
        class::of(n).map(class::size)
    }

    /// Frees the medium block `p`: kept dirty for reuse, or given back at
    /// once where the budget has no room for it.
    ///
    /// # Safety
    /// `p` is a live medium block, not used again.
    #[inline]
    pub(crate) unsafe fn free(p: *mut u8) {
        crate::backing::valgrind::free_like(p.addr());
        // SAFETY: the caller's contract: a live medium block.
        let k = unsafe { HEAP.class_of(p) };
        if k < SLOT_CLASSES && slots::put(k, p) {
            return;
        }
        if !crate::backing::signals::driven() {
            // SAFETY: the caller's contract: a live medium block.
            count_free(unsafe { block_size(p) });
        }
        // SAFETY: the caller's contract.
        unsafe { HEAP.free(p, crate::sys::now_ms(), &Global) }
    }

    /// Counts `n` bytes into the current run of frees (no medium
    /// allocation since its first), without a background thread; a run
    /// that passes [`LET_GO`] makes every allocation a decay point.
    #[inline]
    fn count_free(n: usize) {
        let before = RUN.fetch_add(n, Relaxed);
        if before + n > LET_GO && !LET_GO_PENDING.load(Relaxed) {
            set_pending(true);
        }
    }

    /// Sets or clears the flag, and with it the allocation path's word
    /// (`signals::all_slow`): while it is set every `MklAllocator`
    /// allocation takes the slow path, which calls [`let_go`].
    fn set_pending(on: bool) {
        if LET_GO_PENDING.load(Relaxed) != on {
            LET_GO_PENDING.store(on, Relaxed);
            crate::backing::signals::all_slow(on);
        }
    }

    /// Clears the flag once the dirty blocks are down to [`LET_GO`]
    /// (reused or decayed).
    #[inline(always)]
    fn settle() {
        if LET_GO_PENDING.load(Relaxed) && DIRTY.load(Relaxed) <= LET_GO {
            set_pending(false);
        }
    }

    /// The allocators' check (see the module docs): one relaxed load, and
    /// [`let_go`] if a program let go of its work.
    #[inline(always)]
    pub(crate) fn at_allocation() {
        if let_go_pending() {
            let_go();
        }
    }

    /// Whether [`at_allocation`] would decay: for a caller that keeps
    /// the decay out of its own fast path (the split's small side).
    #[inline(always)]
    pub(crate) fn let_go_pending() -> bool {
        LET_GO_PENDING.load(Relaxed)
    }

    /// An allocation after a run of frees past [`LET_GO`]: the block
    /// cache's decay (medium blocks' and chunks'), which clears the flag
    /// once the dirty blocks are down to [`LET_GO`]. Outside every lock;
    /// allocates nothing.
    #[cold]
    #[inline(never)]
    fn let_go() {
        if crate::backing::signals::driven() {
            set_pending(false);
            return;
        }
        // Until a sweep is due: a clock read and a load.
        if !decay::medium_due(crate::sys::now_ms()) {
            return;
        }
        decay::idle();
        settle();
    }

    /// Gives back every dirty block freed at least
    /// [`block_cache::decay_ms`] before `now_ms` (milliseconds of
    /// `sys::now_ms`, the block cache's clock), then clears the let-go
    /// flag if the dirty blocks are down to [`LET_GO`]; returns how many.
    /// Callable from any thread at any time, inside or outside MKL's
    /// calls; `backing::decay` chooses when (at most once per quarter of
    /// the decay time).
    pub(crate) fn decay(now_ms: usize) -> usize {
        let n = decay_dirty(now_ms);
        settle();
        n
    }

    /// [`decay`]'s giving back.
    fn decay_dirty(now_ms: usize) -> usize {
        let d = block_cache::decay_ms();
        if d > (u32::MAX / 2) as usize {
            return 0; // a decay beyond ~24 days: never
        }
        // This thread's parked blocks go back with the decay, as freed the
        // decay time ago (a decay point comes at most every quarter of it:
        // the next allocation of such a class takes a fresh block then).
        slots::sweep(now_ms.wrapping_sub(d));
        if !HEAP.any_dirty() {
            return 0;
        }
        HEAP.decay(now_ms, Some(d as u32), &Global)
    }

    /// Gives back dirty blocks, the oldest of each class first, until at
    /// least `bytes` of budget are freed (or none is left); returns the
    /// bytes freed. For the block cache, whose budget they share: a big
    /// temporary is worth more than dirty blocks whose pages may never
    /// have been touched.
    pub(crate) fn trim(bytes: usize) -> usize {
        slots::sweep(crate::sys::now_ms());
        let before = HEAP.figures().1;
        HEAP.decay_limited(crate::sys::now_ms(), None, bytes, &Global);
        before.saturating_sub(HEAP.figures().1)
    }

    /// Gives back every dirty block (`manager::free_buffers`,
    /// `block_cache::empty` and `disable`, a budget lowered below what is
    /// held).
    pub(crate) fn empty() {
        slots::sweep(crate::sys::now_ms());
        if HEAP.any_dirty() {
            HEAP.decay(crate::sys::now_ms(), None, &Global);
        }
    }

    /// Whether any class holds dirty blocks (a snapshot).
    #[inline]
    /// (A block parked in a thread's slot counts: the decay takes it.)
    pub(crate) fn any_dirty() -> bool {
        HEAP.any_dirty() || slots::any()
    }

    /// Bytes in live medium blocks, held dirty for reuse, and given back
    /// (clean): a snapshot.
    ///
    /// The calling thread's parked blocks (see `slots`) count as dirty
    /// (free, resident); other threads' as live (at most 1.8 MiB a
    /// thread, until the next decay: the heap cannot tell them from blocks
    /// in use).
    pub(crate) fn figures() -> (usize, usize, usize) {
        let (live, dirty, clean) = HEAP.figures();
        let parked = slots::parked();
        (live - parked, dirty + parked, clean)
    }

    /// `pthread_atfork`'s prepare handler, after the block cache's
    /// shards: takes every class's lock (see `Heap::lock_for_fork`).
    #[cfg_attr(windows, allow(dead_code))]
    pub(crate) fn lock_for_fork() {
        // The slots' registry first: a sweep holds it around heap frees.
        SLOTS_TAKEN.store(slots::lock_for_fork(), Relaxed);
        let taken = HEAP.lock_for_fork(
            super::lock::held_here(),
            super::lock::outer_held_here(),
            super::lock::inner_held_here(),
        );
        FORK_TAKEN.store(taken, Relaxed);
    }

    /// The parent's and the child's handler (`child`): releases what
    /// [`lock_for_fork`] took. In the child, only the forking thread's
    /// slots stay on the registry (the other threads' storage is gone),
    /// their blocks given back to the heap.
    #[cfg_attr(windows, allow(dead_code))]
    pub(crate) fn unlock_after_fork(child: bool) {
        let taken = FORK_TAKEN.swap(0, Relaxed);
        // SAFETY: called by the fork handlers, in the thread that ran
        // lock_for_fork (or its copy in the child), once after it.
        unsafe { HEAP.unlock_after_fork(taken) };
        if SLOTS_TAKEN.swap(false, Relaxed) {
            if child {
                // SAFETY: the child's handler (its only thread), the
                // registry's lock taken by lock_for_fork, the heap's
                // released above.
                unsafe { slots::keep_only_this_thread() };
            }
            // SAFETY: as above: taken by lock_for_fork.
            unsafe { slots::unlock_after_fork() };
        }
    }
}

#[cfg(all(
    test,
    target_os = "linux",
    target_arch = "x86_64",
    not(miri),
    not(loom)
))]
mod tests {
    use crate::backing::valgrind;

    /// Under memcheck (`scripts/valgrind.sh`), medium blocks are heap
    /// blocks: addressable while live, inaccessible once freed (so a use
    /// after free is reported), and so is the region where no block has
    /// been. Natively there is nothing to observe.
    #[test]
    fn memcheck_sees_medium_blocks_handed_out_and_freed() {
        if !valgrind::running() {
            return;
        }
        let n = 48 << 10;
        let (p, _) = super::alloc(n).expect("a medium block under valgrind");
        assert!(valgrind::addressable(p.addr(), 64));
        assert!(valgrind::addressable(p.addr() + n - 64, 64));
        // SAFETY: the block just handed out, freed once, not used again.
        unsafe { super::free(p) };
        assert!(!valgrind::addressable(p.addr(), 1));
        assert!(!valgrind::addressable(p.addr() + n - 1, 1));
        // Far past every span handed out: never a block.
        assert!(!valgrind::addressable(p.addr() + (256 << 20), 1));
    }
}
