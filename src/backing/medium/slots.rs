//! Each thread's last freed block of each small medium class, kept for
//! its next allocation of that class (up to 256 KiB): a thread that frees
//! and allocates in turn (a loop over temporaries) does both without the
//! heap's locks or any shared write (a plain store to park, one
//! uncontended swap to take). A slot holds one block; a second free of
//! the class while it is taken goes to the heap.
//!
//! Every thread's slots are on a registry, so that the decay (any
//! thread's, the background thread's) takes parked blocks from every
//! thread: an idle thread keeps none past the decay time. A parked block
//! counts as live in the heap's figures (MKL counts it freed); `figures`
//! reports the calling thread's as dirty. A thread's slots go back to the
//! heap when it exits; `empty` (`free_buffers`) sweeps them all. The
//! registry's lock is taken by the fork handler first, so a child finds
//! the registry whole; the child's handler keeps the forking thread's
//! slots alone on it and gives the others' blocks back to the heap (their
//! threads' storage is the C library's to reuse: see
//! [`Registry::keep_only_in_child`]).
//!
//! The logic is [`Slots`] (one thread's) and [`Registry`] (every thread's,
//! and the word that lets the decay skip it), which give blocks back
//! through a function of the caller's, so that the loom model
//! (`loom_tests/medium_slots.rs`) builds its own per execution. The
//! process's ones (a static registry, a `thread_local!` of slots, blocks
//! given back to the process's heap) are outside loom only, below.

use core::ptr;

use super::lock::SpinLock;
use crate::sync::{
    AtomicPtr, AtomicU8, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, UnsafeCell,
};

/// Classes below this one (blocks up to 256 KiB + 128 B) have a slot in
/// each thread: at most 1.8 MiB a thread, until the next decay. (Two
/// under loom: the models use no more, and each sweep swaps every slot.)
#[cfg(not(loom))]
pub const SLOT_CLASSES: usize = 37;
#[cfg(loom)]
pub const SLOT_CLASSES: usize = 2;

/// One thread's slots: its parked blocks, and its links on the registry.
pub struct Slots {
    blocks: [AtomicPtr<u8>; SLOT_CLASSES],
    /// The registry's links (under its lock), and whether these slots are
    /// on it (read by their thread alone, written by it under the lock).
    next: UnsafeCell<*const Slots>,
    prev: UnsafeCell<*const Slots>,
    on: UnsafeCell<bool>,
}

/// Reads a cell of [`Slots`].
///
/// # Safety
/// No write to it races this read (the registry's lock held, or the
/// slots' own thread reading `on`).
#[inline(always)]
unsafe fn get<T: Copy>(c: &UnsafeCell<T>) -> T {
    // SAFETY: the caller's contract: no racing write.
    c.with(|p| unsafe { *p })
}

/// Writes a cell of [`Slots`].
///
/// # Safety
/// No other access to it races this write (the registry's lock held, and
/// for `on` the slots' own thread).
#[inline(always)]
unsafe fn set<T>(c: &UnsafeCell<T>, v: T) {
    // SAFETY: the caller's contract: no racing access.
    c.with_mut(|p| unsafe { *p = v })
}

impl Slots {
    /// Empty slots, on no registry.
    #[cfg(not(loom))]
    pub const fn new() -> Slots {
        Slots {
            blocks: [const { AtomicPtr::new(ptr::null_mut()) }; SLOT_CLASSES],
            next: UnsafeCell::new(ptr::null()),
            prev: UnsafeCell::new(ptr::null()),
            on: UnsafeCell::new(false),
        }
    }

    /// Empty slots, on no registry.
    #[cfg(loom)]
    pub fn new() -> Slots {
        Slots {
            blocks: core::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            next: UnsafeCell::new(ptr::null()),
            prev: UnsafeCell::new(ptr::null()),
            on: UnsafeCell::new(false),
        }
    }

    /// The parked block of class `k`, taken out of its slot, if there is
    /// one: a relaxed load, and a swap only if the slot holds a block.
    #[inline(always)]
    pub fn take(&self, k: usize) -> Option<*mut u8> {
        let slot = &self.blocks[k];
        if slot.load(Relaxed).is_null() {
            return None;
        }
        let p = slot.swap(ptr::null_mut(), Acquire);
        (!p.is_null()).then_some(p)
    }

    /// Bytes in the parked blocks (a snapshot).
    pub fn parked(&self) -> usize {
        (0..SLOT_CLASSES)
            .filter(|&k| !self.blocks[k].load(Relaxed).is_null())
            .map(super::class::size)
            .sum()
    }

    /// Takes every parked block, and passes each to `free` with its class.
    fn give_back(&self, free: &mut impl FnMut(usize, *mut u8)) {
        for (k, slot) in self.blocks.iter().enumerate() {
            let p = slot.swap(ptr::null_mut(), Acquire);
            if !p.is_null() {
                free(k, p);
            }
        }
    }
}

/// A park's store (of a block, of [`PARKED`]): a plain store, and a swap
/// under loom, whose model of a plain store racing a sweep's swap (or
/// exchange) is weaker than the C11 model's (tokio-rs/loom issues 254 and
/// 389): it leaves the two writes unordered, and a later read may then
/// see the sweep's write, as if it came after the store, although the
/// swap read the value from before the store. No real execution does
/// that (a swap reads the latest value, so a store it did not see is the
/// later one), and with it loom would report blocks lost that are not.
/// As a swap, the park's write is ordered after the sweep's or read by
/// it, as the real store is; its read of the word stays a plain load.
macro_rules! publish {
    ($atomic:expr, $v:expr, $order:expr) => {{
        #[cfg(not(loom))]
        $atomic.store($v, $order);
        #[cfg(loom)]
        let _ = $atomic.swap($v, $order);
    }};
}

/// [`Registry::any`]'s word after a park.
const PARKED: u8 = 2;

/// Every thread's slots that ever parked a block: a list under a spin
/// lock (taken outside every heap lock; the fork handler takes it first),
/// and a word that says whether a block may be parked on it.
pub struct Registry {
    lock: SpinLock,
    /// The list's first entry: written and read under `lock`.
    head: AtomicPtr<Slots>,
    /// Whether a block may be parked in some thread: [`PARKED`] after a
    /// park, lowered by one at each sweep; 0 (nothing to sweep) only
    /// after two sweeps in a row with no park between. One would do if a
    /// park's slot store and its read of this word were ordered, but they
    /// are not (a fence on every free would cost more than the slot
    /// saves): a thread may park a block the sweep just missed (its store
    /// not yet visible) and read the word from before the sweep lowered
    /// it, and so not raise it again. The second sweep, a quarter of the
    /// decay time later, sees the block.
    any: AtomicU8,
}

impl Registry {
    /// An empty registry.
    #[cfg(not(loom))]
    pub const fn new() -> Registry {
        Registry {
            lock: SpinLock::new(),
            head: AtomicPtr::new(ptr::null_mut()),
            any: AtomicU8::new(0),
        }
    }

    /// An empty registry.
    #[cfg(loom)]
    pub fn new() -> Registry {
        Registry {
            lock: SpinLock::new(),
            head: AtomicPtr::new(ptr::null_mut()),
            any: AtomicU8::new(0),
        }
    }

    /// Whether a block may be parked in any thread (a snapshot).
    #[inline]
    pub fn any(&self) -> bool {
        self.any.load(Relaxed) != 0
    }

    /// Parks the freed block `p` of class `k` in `s`: `false` if the slot
    /// is taken. Puts `s` on the registry at its first park.
    ///
    /// # Safety
    /// `s` is the calling thread's (only its thread parks in it and
    /// [`leave`](Self::leave)s with it); it stays where it is, and leaves
    /// before it goes. `p` is a block of class `k` the caller gives up:
    /// whoever takes it out of the slot owns it.
    #[inline(always)]
    pub unsafe fn put(&self, s: &Slots, k: usize, p: *mut u8) -> bool {
        let slot = &s.blocks[k];
        // Only this thread stores a block; a sweep only takes one (a
        // swap): a plain store cannot lose a block.
        if !slot.load(Relaxed).is_null() {
            return false;
        }
        // SAFETY: `on` is written by this thread alone (the contract).
        if !unsafe { get(&s.on) } {
            // SAFETY: the caller's contract.
            unsafe { self.register(s) };
        }
        publish!(slot, p, Release);
        // Read-shared: written only when it changes (once a sweep, by the
        // threads that park after it).
        if self.any.load(Relaxed) != PARKED {
            publish!(self.any, PARKED, Relaxed);
        }
        true
    }

    /// # Safety
    /// As [`put`](Self::put): `s` is the calling thread's, not on the
    /// registry, and leaves it before it goes.
    #[cold]
    #[inline(never)]
    unsafe fn register(&self, s: &Slots) {
        let _g = Held::take(&self.lock);
        let head = self.head.load(Relaxed);
        // SAFETY: the lock held; `on` is this thread's (the contract).
        unsafe {
            set(&s.next, head.cast_const());
            set(&s.prev, ptr::null());
            if !head.is_null() {
                // A live thread's slots, on the registry (unlinked before
                // they go).
                set(&(*head).prev, ptr::from_ref(s));
            }
            set(&s.on, true);
        }
        self.head.store(ptr::from_ref(s).cast_mut(), Relaxed);
    }

    /// Takes `s` off the registry.
    ///
    /// # Safety
    /// `s` is on it; the lock is held; `s` is the calling thread's.
    unsafe fn unlink(&self, s: &Slots) {
        // SAFETY: the lock held; the registry's entries are live threads'
        // slots (unlinked before they go); `on` is this thread's.
        unsafe {
            let (next, prev) = (get(&s.next), get(&s.prev));
            if prev.is_null() {
                self.head.store(next.cast_mut(), Relaxed);
            } else {
                set(&(*prev).next, next);
            }
            if !next.is_null() {
                set(&(*next).prev, prev);
            }
            set(&s.on, false);
        }
    }

    /// `s`'s thread exits: `s` leaves the registry, and its parked blocks
    /// go to `free` (with their class).
    ///
    /// # Safety
    /// `s` is the calling thread's (see [`put`](Self::put)).
    pub unsafe fn leave(&self, s: &Slots, mut free: impl FnMut(usize, *mut u8)) {
        // SAFETY: `on` is this thread's (the contract).
        if unsafe { get(&s.on) } {
            let _g = Held::take(&self.lock);
            // SAFETY: on the registry, the lock held, this thread's.
            unsafe { self.unlink(s) };
        }
        s.give_back(&mut free);
    }

    /// Takes every thread's parked blocks, and passes each to `free` (with
    /// its class), under the registry's lock; nothing if no block was
    /// parked since the last two sweeps.
    pub fn sweep(&self, mut free: impl FnMut(usize, *mut u8)) {
        if self.any.load(Relaxed) == 0 {
            return; // nothing parked since the last two sweeps
        }
        let _g = Held::take(&self.lock);
        // Under the lock, so sweeps do not race each other; a park that
        // raised the word meanwhile keeps it raised (the exchange fails).
        let any = self.any.load(Relaxed);
        if any != 0 {
            let _ = self.any.compare_exchange(any, any - 1, Relaxed, Relaxed);
        }
        let mut s = self.head.load(Relaxed).cast_const();
        while !s.is_null() {
            // SAFETY: a live thread's slots, on the registry (unlinked,
            // under the lock, before they go); the lock held.
            let slots = unsafe { &*s };
            slots.give_back(&mut free);
            // SAFETY: the lock held.
            s = unsafe { get(&slots.next) };
        }
    }

    /// Whether no slots are on the registry.
    #[cfg(any(loom, test))]
    pub fn is_empty(&self) -> bool {
        let _g = Held::take(&self.lock);
        self.head.load(Relaxed).is_null()
    }

    /// The fork handlers': the registry's lock.
    #[cfg(not(loom))]
    pub(crate) fn lock_for_fork(&self) -> bool {
        // A fork from a signal handler that interrupted this thread while
        // it held the lock: not waited for (see `medium::lock_for_fork`).
        if HELD.try_with(core::cell::Cell::get).unwrap_or(false) {
            return (0..1000).any(|_| {
                self.lock.try_lock_raw() || {
                    std::thread::yield_now();
                    false
                }
            });
        }
        self.lock.lock_raw();
        true
    }

    /// In a forked child, every thread's slots but `own` leave the
    /// registry, their blocks passed to `free`. Their threads do not exist
    /// in the child, and their storage is the C library's to reuse or
    /// unmap: a thread the child starts may get a dead thread's stack, its
    /// thread-locals set afresh in place, and left on the list those slots
    /// would link themselves after themselves at their first park, and the
    /// next sweep would never end.
    ///
    /// # Safety
    /// The calling thread is a forked child's only one, in its fork
    /// handler (no other thread started yet), and holds the lock
    /// ([`lock_for_fork`](Self::lock_for_fork) returned `true`); `own` is
    /// its slots, or null.
    #[cfg(not(loom))]
    pub(crate) unsafe fn keep_only_in_child(
        &self,
        own: *const Slots,
        mut free: impl FnMut(usize, *mut u8),
    ) {
        let mut kept = false;
        let mut s = self.head.load(Relaxed).cast_const();
        while !s.is_null() {
            // SAFETY: the parent's threads' slots, in the child's copy of
            // their storage (untouched: no thread started since the fork);
            // the lock held (the caller's contract).
            let slots = unsafe { &*s };
            // SAFETY: as above.
            let next = unsafe { get(&slots.next) };
            if s == own {
                kept = true;
            } else {
                slots.give_back(&mut free);
            }
            s = next;
        }
        if kept {
            // SAFETY: this thread's slots, the lock held.
            unsafe {
                set(&(*own).next, ptr::null());
                set(&(*own).prev, ptr::null());
            }
        }
        let head = if kept { own } else { ptr::null() };
        self.head.store(head.cast_mut(), Relaxed);
    }

    /// # Safety
    /// [`lock_for_fork`](Self::lock_for_fork) returned `true`, in this
    /// thread (or its copy).
    #[cfg(not(loom))]
    pub(crate) unsafe fn unlock_after_fork(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.lock.force_unlock() };
    }
}

#[cfg(not(loom))]
std::thread_local! {
    /// Whether this thread is taking or holds a registry's lock (for a
    /// fork from a signal handler that interrupted it).
    static HELD: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// A registry's lock, held; released when dropped.
struct Held<'a>(&'a SpinLock);

impl<'a> Held<'a> {
    fn take(lock: &'a SpinLock) -> Held<'a> {
        #[cfg(not(loom))]
        let _ = HELD.try_with(|h| h.set(true));
        lock.lock_raw();
        Held(lock)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // SAFETY: taken by `Held::take` in this thread.
        unsafe { self.0.force_unlock() };
        #[cfg(not(loom))]
        let _ = HELD.try_with(|h| h.set(false));
    }
}

#[cfg(not(loom))]
pub(super) use process::*;

/// The process's registry and each thread's slots, whose blocks go back
/// to the process's heap.
#[cfg(not(loom))]
mod process {
    use super::super::instance::{Global, HEAP};
    use super::{Registry, Slots};

    /// Every thread's slots.
    static REGISTRY: Registry = Registry::new();

    /// A thread's slots, which leave the registry, their blocks given back
    /// to the heap, when the thread exits.
    struct Mine(Slots);

    impl Drop for Mine {
        fn drop(&mut self) {
            let when = crate::sys::now_ms();
            // SAFETY: this thread's slots, in its storage, going now; the
            // registry passes each parked block on once.
            unsafe { REGISTRY.leave(&self.0, |_, p| free(p, when)) };
        }
    }

    std::thread_local! {
        static SLOTS: Mine = const { Mine(Slots::new()) };
    }

    /// Gives a parked block back to the heap, as freed at `when` (ms).
    ///
    /// # Safety
    /// `p` is a block the registry passed on (freed to a slot, no longer
    /// its owner's, and taken out of it by a swap: passed on once).
    unsafe fn free(p: *mut u8, when: usize) {
        // SAFETY: the caller's contract: a medium block, freed once.
        unsafe { HEAP.free(p, when, &Global) }
    }

    /// Whether a block may be parked in any thread (a snapshot).
    #[inline]
    pub(crate) fn any() -> bool {
        REGISTRY.any()
    }

    /// This thread's parked block of class `k`, if it has one.
    #[inline(always)]
    pub(crate) fn take(k: usize) -> Option<*mut u8> {
        SLOTS.try_with(|s| s.0.take(k)).ok().flatten()
    }

    /// Parks the freed block `p` of class `k` in this thread's slot:
    /// `false` if the slot is taken (or the thread is exiting).
    #[inline(always)]
    pub(crate) fn put(k: usize, p: *mut u8) -> bool {
        SLOTS
            // SAFETY: this thread's slots, in its storage until it exits
            // (`Mine` leaves then); `p` is a freed block of class `k`.
            .try_with(|s| unsafe { REGISTRY.put(&s.0, k, p) })
            .unwrap_or(false)
    }

    /// Bytes in this thread's parked blocks.
    pub(crate) fn parked() -> usize {
        SLOTS.try_with(|s| s.0.parked()).unwrap_or(0)
    }

    /// Gives every thread's parked blocks back to the heap, as freed at
    /// `when` (ms).
    pub(crate) fn sweep(when: usize) {
        // SAFETY: the registry passes each parked block on once.
        REGISTRY.sweep(|_, p| unsafe { free(p, when) });
    }

    /// The fork handlers': the registry's lock.
    pub(crate) fn lock_for_fork() -> bool {
        REGISTRY.lock_for_fork()
    }

    /// The child's fork handler, before [`unlock_after_fork`]: only this
    /// thread's slots stay on the registry; the other threads' blocks go
    /// back to the heap (see [`Registry::keep_only_in_child`]).
    ///
    /// # Safety
    /// A forked child's fork handler, [`lock_for_fork`] having returned
    /// `true`; the heap's locks released.
    pub(crate) unsafe fn keep_only_this_thread() {
        // This thread's slots (their first use here registers their
        // destructor, as at any first park).
        let own = SLOTS
            .try_with(|s| core::ptr::from_ref(&s.0))
            .unwrap_or(core::ptr::null());
        let when = crate::sys::now_ms();
        // SAFETY: the caller's contract; the registry passes each parked
        // block on once.
        unsafe { REGISTRY.keep_only_in_child(own, |_, p| free(p, when)) };
    }

    /// # Safety
    /// [`lock_for_fork`] returned `true`, in this thread (or its copy).
    pub(crate) unsafe fn unlock_after_fork() {
        // SAFETY: the caller's contract.
        unsafe { REGISTRY.unlock_after_fork() };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Registry, Slots};

    /// A block that is never dereferenced: its class in the low bits of
    /// its page number.
    fn block(i: usize, k: usize) -> *mut u8 {
        core::ptr::without_provenance_mut(((i << 4) | k) << 12)
    }

    /// The registry's logic without the process's heap: parks and takes,
    /// sweeps (the second one lowers the word to "nothing parked"), a
    /// thread that parks and exits while another sweeps, and the slots
    /// leaving in turn.
    #[test]
    fn registry_gives_back_every_parked_block_once() {
        let r = Registry::new();
        let (a, b) = (Slots::new(), Slots::new());
        let mut freed = Vec::new();
        let mut log = |k: usize, p: *mut u8| {
            assert_eq!((p.addr() >> 12) & 15, k);
            freed.push(p.addr());
        };
        assert!(!r.any());
        // SAFETY (each `put` and `leave`): `a` and `b` are this thread's,
        // stay on its stack and leave before they go; the blocks are
        // given up.
        unsafe {
            assert!(r.put(&a, 0, block(1, 0)));
            assert!(!r.put(&a, 0, block(2, 0)), "the slot is taken");
            assert!(r.put(&b, 1, block(3, 1)));
        }
        assert!(r.any());
        assert_eq!(a.take(0), Some(block(1, 0)));
        assert_eq!(a.take(0), None);
        // SAFETY: as above.
        unsafe { assert!(r.put(&a, 0, block(4, 0))) };
        r.sweep(&mut log);
        assert!(r.any(), "zero only after two sweeps without a park");
        r.sweep(&mut log);
        assert!(!r.any());
        let exited = std::thread::scope(|t| {
            let h = t.spawn(|| {
                let c = Slots::new();
                let mut mine = Vec::new();
                // SAFETY: `c` is this thread's, leaves before it goes.
                unsafe {
                    assert!(r.put(&c, 1, block(5, 1)));
                    r.leave(&c, |_, p| mine.push(p.addr()));
                }
                mine
            });
            h.join().unwrap()
        });
        assert_eq!(exited, [block(5, 1).addr()]);
        r.sweep(&mut log);
        // SAFETY: as above.
        unsafe {
            r.leave(&a, &mut log);
            r.leave(&b, &mut log);
        }
        assert!(r.is_empty());
        freed.sort_unstable();
        assert_eq!(freed, [block(3, 1).addr(), block(4, 0).addr()]);
    }

    /// A forked child's handler keeps its own slots alone on the registry,
    /// whatever their place in it, and gives the others' blocks back.
    #[test]
    fn a_child_keeps_only_its_own_slots() {
        for own in 0..3 {
            let r = Registry::new();
            let slots = [Slots::new(), Slots::new(), Slots::new()];
            for (i, s) in slots.iter().enumerate() {
                // SAFETY: this thread's slots, on its stack, leaving (or
                // dropped from the registry) before they go.
                unsafe { assert!(r.put(s, 0, block(i + 1, 0))) };
            }
            let mut freed = Vec::new();
            assert!(r.lock_for_fork());
            // SAFETY: the lock held; no other thread touches `r`.
            unsafe {
                r.keep_only_in_child(&slots[own], |_, p| freed.push(p.addr()));
                r.unlock_after_fork();
            }
            let mut want: Vec<usize> = (0..3)
                .filter(|&i| i != own)
                .map(|i| block(i + 1, 0).addr())
                .collect();
            freed.sort_unstable();
            want.sort_unstable();
            assert_eq!(freed, want);
            r.sweep(|_, p| freed.push(p.addr()));
            assert_eq!(freed.len(), 3, "the kept slots are swept");
            // SAFETY: `own`'s slots, this thread's.
            unsafe { r.leave(&slots[own], |_, _| {}) };
            assert!(r.is_empty());
        }
    }
}
