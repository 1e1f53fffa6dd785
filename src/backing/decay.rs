//! Decay: when the stores beneath MKL give back what they keep, decided in
//! one room (issue 56).
//!
//! Two stores keep freed memory for reuse: the block cache (chunks of
//! 1 MiB and more) and the medium heap (dirty blocks of 4 KiB-1 MiB). Each
//! gives back what has been unused for the decay time
//! ([`block_cache::decay_ms`](super::block_cache::decay_ms), one setting for both) when asked:
//! `block_cache::decay(now)`, `medium::decay(now)`. Neither decides when:
//! this module does, and nothing else calls them but `empty`, a lowered
//! budget and `free_buffers`, which give everything back at once.
//!
//! The decay points, cheapest first:
//!
//! - **Small frees** (MKL's under 4 KiB, the split allocator's small side,
//!   c_heap's bins): every [`TICKS`]th of a thread ([`tick`], or
//!   [`tick_due`] then [`idle`] for a caller with a cold path of its own):
//!   a thread-local countdown, no shared write, no clock read on the way.
//! - **Large calls** (a chunk taken from or given to the block cache, or
//!   a cached chunk taken for a growth): [`point`], beside a system call
//!   or a chunk's worth of page faults.
//! - **Medium allocations**, and every allocation while the program has
//!   let go of its medium blocks (the let-go rule, `medium::let_go`):
//!   [`medium_point`].
//! - **The background thread**, where it runs ([`point`], every quarter
//!   of the decay time); the countdown then stops (`signals::driven`).
//!
//! The block cache decays at every point that reaches it (its shards'
//! ages are read under a short lock); the medium heap at most once per
//! quarter of the decay time across the process (`NEXT_SWEEP`: a sweep
//! walks every class). Which memory counts against the one budget is the
//! budget's business (`budget`, the block cache's word); when it goes back
//! is this module's.

/// A thread checks whether the stores' memory is due to decay once per
/// this many of its small frees (MKL's, the split allocator's system side,
/// c_heap's bins) (a countdown in a thread-local word; the clock is read
/// only then, and only while a store holds memory).
pub const TICKS: u32 = 1024;

#[cfg(not(loom))]
mod imp {
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    use crate::backing::{block_cache, medium, signals};
    use crate::sys::now_ms;

    std::thread_local! {
        /// This thread's small frees until its next decay check.
        static COUNTDOWN: core::cell::Cell<u32> = const { core::cell::Cell::new(super::TICKS) };
    }

    /// When (ms) the medium heap's next sweep is due ([`medium_point`]).
    static NEXT_SWEEP: AtomicUsize = AtomicUsize::new(0);

    /// Counts one small free of this thread; every [`TICKS`](super::TICKS)th
    /// is a decay point ([`idle`]).
    #[inline(always)]
    pub(crate) fn tick() {
        if tick_due() {
            idle();
        }
    }

    /// [`tick`]'s countdown alone: counts one small free of this thread
    /// and says whether it is the [`TICKS`](super::TICKS)th, when the
    /// caller must call [`idle`] (which restarts the countdown): for a
    /// caller that reaches the decay through a cold path of its own, so
    /// that its hot path stays a tail call. The hot path is a decrement
    /// and a test.
    ///
    /// While the background decay thread serves the process
    /// (`signals::driven`), never due, and no countdown at all: one
    /// relaxed load.
    #[inline(always)]
    pub(crate) fn tick_due() -> bool {
        if signals::driven() {
            return false;
        }
        COUNTDOWN.with(|c| {
            let n = c.get();
            c.set(n.wrapping_sub(1));
            n == 0
        })
    }

    /// Restarts this thread's countdown, then a decay [`point`] (the small
    /// path's decay point, and the let-go rule's).
    #[cold]
    #[inline(never)]
    pub(crate) fn idle() {
        COUNTDOWN.with(|c| c.set(super::TICKS));
        point();
    }

    /// A decay point over both stores: a chunk about to be taken from or
    /// given to the block cache (the hooks), the background thread's sweep,
    /// and [`idle`]. The clock is read only while a store holds memory;
    /// nothing allocated, a shard or class lock held only while slots or
    /// links are copied.
    #[inline]
    pub(crate) fn point() {
        let cached = block_cache::holds_any();
        if cached || medium::any_dirty() {
            let now = now_ms();
            if cached {
                block_cache::decay(now);
            }
            medium_point(now);
        }
    }

    /// The medium heap's decay, at most once per quarter of the decay time
    /// across the process: one load until a sweep is due.
    #[inline]
    pub(crate) fn medium_point(now: usize) {
        let due = NEXT_SWEEP.load(Relaxed);
        if now < due || !medium::any_dirty() {
            return;
        }
        let next = now.saturating_add((block_cache::decay_ms() / 4).max(1));
        if NEXT_SWEEP
            .compare_exchange(due, next, Relaxed, Relaxed)
            .is_ok()
        {
            medium::decay(now);
        }
    }

    /// Whether the medium heap's next sweep is due at `now` (the let-go
    /// rule waits for it: until then an allocation costs a clock read and
    /// a load).
    #[inline]
    pub(crate) fn medium_due(now: usize) -> bool {
        now >= NEXT_SWEEP.load(Relaxed)
    }

    /// The decay time changed: the medium heap's next sweep is due at once.
    pub(crate) fn changed() {
        NEXT_SWEEP.store(0, Relaxed);
    }
}

/// Under loom the stores are modelled alone: no decay points.
#[cfg(loom)]
mod imp {
    #[inline(always)]
    pub(crate) fn tick() {}
    #[inline(always)]
    pub(crate) fn tick_due() -> bool {
        false
    }
    pub(crate) fn idle() {}
    pub(crate) fn point() {}
    pub(crate) fn changed() {}
}

pub(crate) use imp::*;
