//! The medium heap's spin lock: a word, taken by compare-and-swap, waited
//! for by spinning and then yielding the processor. A class's lock is
//! held for a few list operations: inside it only the span pool's lock is
//! taken (for a span), and no system call is made, so a waiter that
//! yields (it may be waiting for a thread the scheduler preempted) loses
//! little. The heap's outer lock (growth, decay batches) is held across
//! system calls and taken only outside the others.
//!
//! Outside loom, a thread records the lock it is taking or holding in a
//! thread-local word (`HOLDS`), so that a `fork` from a signal handler
//! that interrupted it knows which lock it must not wait for (see
//! `medium::lock_for_fork`). The heap's one outer lock (held across a
//! growth or a decay batch, with class locks taken inside it) is taken
//! with [`SpinLock::lock_outer`], which records it in a word of its own
//! (`OUTER`): an inner lock taken and released meanwhile leaves it there.
//! The span pool's lock, taken inside a class's, likewise records itself
//! apart (`INNER`, [`SpinLock::lock_inner`]).

use crate::sync::{AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

/// Spins before a waiter starts yielding.
const SPINS: u32 = 64;

pub(crate) struct SpinLock {
    word: AtomicUsize,
}

#[cfg(not(loom))]
std::thread_local! {
    /// The lock this thread is taking, holds or has just released (its
    /// address; 0: none).
    static HOLDS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

#[cfg(not(loom))]
std::thread_local! {
    /// The outer lock this thread is taking or holds (its address; 0:
    /// none).
    static OUTER: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    /// The innermost lock (the span pool's, taken inside a class's) this
    /// thread is taking or holds (its address; 0: none).
    static INNER: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// The innermost lock (address) this thread may hold: see the module docs.
#[cfg(not(loom))]
pub(crate) fn inner_held_here() -> usize {
    INNER.get()
}

/// The lock (address) this thread may hold: see the module docs.
#[cfg(not(loom))]
pub(crate) fn held_here() -> usize {
    HOLDS.get()
}

/// The outer lock (address) this thread may hold: see the module docs.
#[cfg(not(loom))]
pub(crate) fn outer_held_here() -> usize {
    OUTER.get()
}

impl SpinLock {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        SpinLock {
            word: AtomicUsize::new(0),
        }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        SpinLock {
            word: AtomicUsize::new(0),
        }
    }

    /// Takes the lock; the guard releases it.
    #[inline(always)]
    pub(crate) fn lock(&self) -> Guard<'_> {
        self.take(Role::Class)
    }

    /// Takes the lock as the outer one (see the module docs); the guard
    /// releases it.
    pub(crate) fn lock_outer(&self) -> Guard<'_> {
        self.take(Role::Outer)
    }

    /// Takes the lock as the innermost one (taken inside a class's lock,
    /// recorded apart from it); the guard releases it.
    pub(crate) fn lock_inner(&self) -> Guard<'_> {
        self.take(Role::Inner)
    }

    #[inline(always)]
    fn take(&self, role: Role) -> Guard<'_> {
        #[cfg(not(loom))]
        role.mark(core::ptr::from_ref(self).addr());
        if self
            .word
            .compare_exchange_weak(0, 1, Acquire, Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        Guard { lock: self, role }
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            while self.word.load(Relaxed) != 0 {
                spins = spins.saturating_add(1);
                pause(spins);
            }
            if self
                .word
                .compare_exchange_weak(0, 1, Acquire, Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Takes the lock if it is free, without waiting (the fork handler's,
    /// for a lock its own thread may hold): `true` if taken. The caller
    /// then releases it with [`force_unlock`](Self::force_unlock).
    #[cfg_attr(any(loom, windows), allow(dead_code))]
    pub(crate) fn try_lock_raw(&self) -> bool {
        self.word.compare_exchange(0, 1, Acquire, Relaxed).is_ok()
    }

    /// Takes the lock, leaving no guard (the fork handler's): released
    /// with [`force_unlock`](Self::force_unlock).
    #[cfg_attr(any(loom, windows), allow(dead_code))]
    pub(crate) fn lock_raw(&self) {
        if !self.try_lock_raw() {
            self.lock_slow();
        }
    }

    /// Releases a lock taken by [`lock_raw`](Self::lock_raw) or
    /// [`try_lock_raw`](Self::try_lock_raw).
    ///
    /// # Safety
    /// This thread (or, in a forked child, its copy) holds the lock,
    /// without a guard.
    #[cfg_attr(any(loom, windows), allow(dead_code))]
    pub(crate) unsafe fn force_unlock(&self) {
        self.word.store(0, Release);
    }
}

/// One wait step: a spin hint for the first [`SPINS`], then a yield.
#[inline(always)]
fn pause(spins: u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    if spins < SPINS {
        core::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Which thread-local word records a lock this thread takes or holds
/// (see the module docs).
#[derive(Clone, Copy)]
enum Role {
    /// A class's lock (`HOLDS`).
    Class,
    /// The heap's outer lock (`OUTER`).
    Outer,
    /// The span pool's lock, inside a class's (`INNER`).
    Inner,
}

impl Role {
    /// Records `addr` (0: none) in this role's word.
    #[cfg(not(loom))]
    #[inline(always)]
    fn mark(self, addr: usize) {
        match self {
            Role::Class => HOLDS.set(addr),
            Role::Outer => OUTER.set(addr),
            Role::Inner => INNER.set(addr),
        }
    }
}

/// A held [`SpinLock`]; dropping it releases the lock.
pub(crate) struct Guard<'a> {
    lock: &'a SpinLock,
    #[cfg_attr(loom, allow(dead_code))]
    role: Role,
}

impl Drop for Guard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.lock.word.store(0, Release);
        #[cfg(not(loom))]
        self.role.mark(0);
    }
}
