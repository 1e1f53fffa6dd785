//! The C runtime's heap, trimmed before the crate maps fresh memory for a
//! chunk, so that the two heaps of a process do not peak side by side
//! (issue 54: the real workloads' peak).
//!
//! Beneath MKL the crate keeps its chunks and medium blocks apart from the
//! C runtime's heap (glibc's `malloc`), which still serves everything else
//! of a program: Python's objects, pandas' hash tables, MKL's blocks under
//! 4 KiB. glibc keeps what those free: the whole pages inside free chunks
//! stay resident, and its trim threshold rises with every large block it
//! unmaps (to twice that block, up to 64 MiB), so the top stays too. Under
//! NumPy's default allocator an array's next request takes that memory;
//! with arrays on MKL memory it maps fresh memory beside it, and the two
//! peaks add. Measured on pandas' `sort_values` of a 3,000,000-row frame
//! (`python/benchmarks/workloads.py`, 2-core VM): 17.8 MiB lay free in
//! glibc's heap at the peak, which was 22 MiB over NumPy's default's (of it
//! 13 MiB MKL's libraries); trimmed here, 11 MiB.
//!
//! So whenever the hooks are about to map fresh memory for a chunk (a new
//! chunk or a growth the block cache cannot serve), [`before_fresh_memory`]
//! calls `malloc_trim(0)` first, as the block cache gives back cached
//! chunks then ("caching never raises the peak"). A trim walks glibc's free
//! lists: about 2 us on a Python process's heap, 0.2 ms the first time on
//! a fragmented one. It is bounded to 1 % of the time: after a trim that
//! took `t`, the next waits at least `99 t` and 1 ms, and twice as long
//! after each trim in a row that released nothing (up to about a second):
//! a program whose C heap holds nothing free pays for few. Fresh chunks are
//! 1 MiB and more, each costing hundreds of page faults when written, so
//! the check (a clock read and a load) is noise on that path, and small
//! blocks never reach it.
//!
//! Fork-safe: the one word is claimed with a compare-and-swap that moves
//! the next time on before the trim, so a child forked during a trim sees
//! a time a millisecond away, never a word stuck; glibc's own fork handler
//! covers its arenas. Elsewhere (Windows, musl, Miri) there is no trim.

#[cfg(all(target_os = "linux", target_env = "gnu", not(miri), not(loom)))]
mod imp {
    use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

    use crate::sys;

    /// The shortest wait between two trims, in nanoseconds.
    const MIN_GAP_NS: u64 = 1_000_000;

    /// How many times a trim's own duration the next one waits (a trim
    /// then takes at most 1 % of the time).
    const GAP_FACTOR: u64 = 99;

    /// The most doublings of the wait after trims that released nothing
    /// (1 ms << 10: about a second).
    const MAX_BACKOFF: u32 = 10;

    /// The earliest time (`sys::now_ns`) the next trim may run.
    static NEXT: AtomicU64 = AtomicU64::new(0);

    /// Trims in a row that released nothing (at most [`MAX_BACKOFF`]).
    static MISSES: AtomicU32 = AtomicU32::new(0);

    /// Trims the C runtime's heap unless one ran too recently (see the
    /// module docs). Outside the crate's own locks; allocates nothing.
    #[inline(never)]
    pub(crate) fn before_fresh_memory() {
        let now = sys::now_ns();
        let next = NEXT.load(Relaxed);
        if now < next {
            return;
        }
        // One thread trims; the others go on. The time moves on first, so
        // that a fork in the middle leaves the child a word that clears.
        if NEXT
            .compare_exchange(next, now.saturating_add(MIN_GAP_NS), Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        let released = sys::trim_c_runtime_heap();
        let end = sys::now_ns();
        let misses = if released {
            0
        } else {
            (MISSES.load(Relaxed) + 1).min(MAX_BACKOFF)
        };
        MISSES.store(misses, Relaxed);
        let took = end.saturating_sub(now);
        let gap = took.saturating_mul(GAP_FACTOR).max(MIN_GAP_NS << misses);
        NEXT.store(end.saturating_add(gap), Relaxed);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu", not(miri), not(loom))))]
mod imp {
    /// No C runtime heap to trim here (see the module docs).
    #[cfg_attr(not(any(target_os = "linux", windows)), allow(dead_code))]
    pub(crate) fn before_fresh_memory() {}
}

pub(crate) use imp::before_fresh_memory;
