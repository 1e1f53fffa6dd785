//! The cache's shards and budget word, without any MKL call (see the
//! parent module for the policy; `loom_tests/block_cache.rs` models it).

use core::ptr;

use super::{DECAY_MS, MIN_BLOCK};
use crate::sync::{AtomicUsize, Mutex, Ordering::Relaxed};

/// A request of `n` bytes takes a block of at most `n + n / MAX_WASTE_DIV`.
const MAX_WASTE_DIV: usize = 8;

const MIN_SHIFT: u32 = MIN_BLOCK.trailing_zeros();
/// Size classes: four per power of two from `MIN_BLOCK` up (fewer under
/// loom, where the class only chooses a shard: every size check is exact).
const SHARDS: usize = if cfg!(loom) {
    2
} else {
    (usize::BITS - MIN_SHIFT) as usize * 4
};
/// Blocks per shard.
const SLOTS: usize = 4;

/// The shard for blocks of `size` bytes: `4 * (log2(size) - 20)` plus the
/// next two bits of the size (sizes below `MIN_BLOCK` share shard 0).
fn class(size: usize) -> usize {
    if size < MIN_BLOCK {
        return 0;
    }
    let log = usize::BITS - 1 - size.leading_zeros();
    let quarter = (size >> (log - 2)) & 3;
    (((log - MIN_SHIFT) as usize) * 4 + quarter).min(SHARDS - 1)
}

/// One cached block: its address (null: the slot is empty), its size and
/// when it was cached (milliseconds of the caller's clock).
#[derive(Clone, Copy)]
struct Entry {
    ptr: *mut u8,
    size: usize,
    since: usize,
}

impl Entry {
    const EMPTY: Entry = Entry {
        ptr: ptr::null_mut(),
        size: 0,
        since: 0,
    };
}

struct Slots([Entry; SLOTS]);

// SAFETY: the entries are owned MKL blocks, with no tie to the thread that
// cached them (MKL blocks are freed on any thread); the mutex around the
// slots is what shares them.
unsafe impl Send for Slots {}

/// One size class's blocks, on its own cache lines; outside loom, also the
/// place where the fork handlers keep the shard's guard from before a
/// `fork` to after it (see [`Cache::lock_for_fork`]).
#[repr(align(128))]
struct Shard {
    slots: Mutex<Slots>,
    #[cfg(not(loom))]
    #[cfg_attr(windows, allow(dead_code))] // no fork on Windows
    fork_guard: core::cell::UnsafeCell<Option<crate::sync::MutexGuard<'static, Slots>>>,
}

// SAFETY: `slots` is a mutex; `fork_guard` is read and written only by the
// thread that holds that mutex (the forking thread, between the prepare and
// the parent or child handler), so it is never accessed concurrently.
#[cfg(not(loom))]
unsafe impl Sync for Shard {}

impl Shard {
    #[cfg(not(loom))]
    const fn new() -> Self {
        Shard {
            slots: Mutex::new(Slots([Entry::EMPTY; SLOTS])),
            fork_guard: core::cell::UnsafeCell::new(None),
        }
    }

    fn lock(&self) -> Locked<'_> {
        #[cfg(not(loom))]
        HOLDS.set(ptr::from_ref(self).addr());
        // Nothing panics while a shard is locked (comparisons and copies):
        // a poisoned lock still holds consistent slots.
        let guard = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Locked {
            guard: core::mem::ManuallyDrop::new(guard),
        }
    }
}

#[cfg(not(loom))]
std::thread_local! {
    /// The shard this thread is locking, holds, or has just unlocked (its
    /// address; 0: none). Set before the lock is taken and cleared after
    /// it is released, so that a `fork` from a signal handler that
    /// interrupted this thread knows which shard it may hold (see
    /// [`Cache::lock_for_fork`]). Nothing else holds two shards at once.
    static HOLDS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// A locked shard's slots; unlocking also clears this thread's `HOLDS`.
struct Locked<'a> {
    guard: core::mem::ManuallyDrop<crate::sync::MutexGuard<'a, Slots>>,
}

impl core::ops::Deref for Locked<'_> {
    type Target = Slots;
    fn deref(&self) -> &Slots {
        &self.guard
    }
}

impl core::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Slots {
        &mut self.guard
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: the guard is dropped here once, and never used again.
        unsafe { core::mem::ManuallyDrop::drop(&mut self.guard) };
        #[cfg(not(loom))]
        HOLDS.set(0);
    }
}

/// The cache's bookkeeping, without any MKL call: blocks leaving the cache
/// are handed to the caller's `free`. The process has one (behind
/// [`enable`] & co.); the loom model builds its own.
///
/// The budget protocol: `bytes` is reserved (compare-and-swap, never past
/// `budget`) *before* a block enters a shard and released *after* it left
/// one, so at every moment the blocks in the shards total at most `bytes`,
/// and `bytes` is at most the budget it was reserved under. Relaxed
/// orderings suffice: the counter only bounds memory, a single atomic's
/// read-modify-writes are totally ordered whatever their ordering, and the
/// blocks themselves pass between threads under the shards' mutexes.
///
/// The same word covers memory the cache's owner keeps outside the shards
/// under the same budget (the live chunks' growth slack, `backing::slack`):
/// [`reserve`](Self::reserve) takes it by the same compare-and-swap, so a
/// block entering the cache and slack being kept can never both pass a
/// check that only one fits (issue 41: with two words, two threads freeing
/// at the budget's edge both did). `outside` says how much of `bytes` is
/// that memory.
pub struct Cache {
    shards: [Shard; SHARDS],
    /// Bytes reserved: cached blocks (and blocks entering or leaving) plus
    /// `outside`.
    bytes: AtomicUsize,
    /// Bytes of `bytes` held outside the shards (see [`reserve`](Self::reserve)).
    outside: AtomicUsize,
    /// The most `bytes` may reach.
    budget: AtomicUsize,
    /// When (ms) the next decay sweep is due.
    next_sweep: AtomicUsize,
    /// How long (ms) an unused block stays.
    decay: AtomicUsize,
}

impl Cache {
    /// An empty cache with a budget of 0 (it keeps nothing).
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        Cache {
            shards: [const { Shard::new() }; SHARDS],
            bytes: AtomicUsize::new(0),
            outside: AtomicUsize::new(0),
            budget: AtomicUsize::new(0),
            next_sweep: AtomicUsize::new(0),
            decay: AtomicUsize::new(DECAY_MS),
        }
    }

    /// An empty cache with a budget of `budget` bytes.
    #[cfg(loom)]
    pub fn with_budget(budget: usize) -> Self {
        Cache {
            shards: core::array::from_fn(|_| Shard {
                slots: Mutex::new(Slots([Entry::EMPTY; SLOTS])),
            }),
            bytes: AtomicUsize::new(0),
            outside: AtomicUsize::new(0),
            budget: AtomicUsize::new(budget),
            next_sweep: AtomicUsize::new(0),
            decay: AtomicUsize::new(DECAY_MS),
        }
    }

    /// A cached block of `size ..= size + size/8` bytes at an address that
    /// is a multiple of `align` (a power of two), the smallest such, with
    /// its size; null if there is none. The block leaves the cache: the
    /// caller owns it.
    pub fn take(&self, size: usize, align: usize) -> (*mut u8, usize) {
        self.take_within(size, size.saturating_add(size / MAX_WASTE_DIV), align)
    }

    /// As [`take`](Self::take), for a block of `size ..= max` bytes (the
    /// smallest size class first).
    pub fn take_within(&self, size: usize, max: usize, align: usize) -> (*mut u8, usize) {
        let (p, got, _) = self.take_within_since(size, max, align);
        (p, got)
    }

    /// As [`take_within`](Self::take_within), also saying when the block
    /// was cached (for a caller that puts part of it back: the part keeps
    /// its age: [`give`](Self::give) it with that time as `now`).
    pub fn take_within_since(
        &self,
        size: usize,
        max: usize,
        align: usize,
    ) -> (*mut u8, usize, usize) {
        let (first, last) = (class(size), class(max.max(size)));
        for shard in &self.shards[first..=last] {
            let mut slots = shard.lock();
            let mut best: Option<usize> = None;
            for (i, e) in slots.0.iter().enumerate() {
                let fits = !e.ptr.is_null()
                    && e.size >= size
                    && e.size <= max
                    && e.ptr.addr() & (align - 1) == 0;
                let better = |b: &Entry| e.size < b.size || (e.size == b.size && e.since > b.since);
                if fits && best.is_none_or(|b| better(&slots.0[b])) {
                    best = Some(i);
                }
            }
            if let Some(i) = best {
                let e = core::mem::replace(&mut slots.0[i], Entry::EMPTY);
                drop(slots);
                self.bytes.fetch_sub(e.size, Relaxed);
                return (e.ptr, e.size, e.since);
            }
        }
        (ptr::null_mut(), 0, 0)
    }

    /// The largest cached block smaller than `size` bytes, with its size
    /// (the shards visited from `size`'s class down: the first that holds
    /// one smaller than `size` holds the largest); null if there is none.
    /// The block leaves the cache: the caller owns it.
    #[cfg_attr(not(all(target_os = "linux", not(miri))), allow(dead_code))] // see `take_grown`
    pub fn take_below(&self, size: usize) -> (*mut u8, usize) {
        for shard in self.shards[..=class(size)].iter().rev() {
            let mut slots = shard.lock();
            let best = (0..SLOTS)
                .filter(|&i| !slots.0[i].ptr.is_null() && slots.0[i].size < size)
                .max_by_key(|&i| slots.0[i].size);
            if let Some(i) = best {
                let e = core::mem::replace(&mut slots.0[i], Entry::EMPTY);
                drop(slots);
                self.bytes.fetch_sub(e.size, Relaxed);
                return (e.ptr, e.size);
            }
        }
        (ptr::null_mut(), 0)
    }

    /// Offers the block `ptr` of `size` bytes to the cache at time `now`
    /// (ms). Returns whether it was kept; if not, the caller still owns it.
    /// A block pushed out of a full shard (its oldest) is handed to `free`
    /// after the shard is unlocked.
    pub fn give(
        &self,
        ptr: *mut u8,
        size: usize,
        now: usize,
        free: impl FnOnce(*mut u8, usize),
    ) -> bool {
        let Some(held) = self.reserve_bytes(size) else {
            return false;
        };
        if held == 0 {
            // The cache was empty: nothing can be due before this block,
            // so the first sweep waits for it (a sweep visits every shard,
            // which a process's first reuse would otherwise pay: 176 locks
            // and the first touch of their pages).
            let due = now.saturating_add(self.decay.load(Relaxed));
            self.next_sweep.fetch_max(due, Relaxed);
        }
        let new = Entry {
            ptr,
            size,
            since: now,
        };
        let mut slots = self.shards[class(size)].lock();
        // Checked under the lock: a budget lowered (or set to 0 by
        // `disable`) before a drain visits this shard is seen here, so no
        // block enters after the drain (see `set_budget`).
        if self.bytes.load(Relaxed) > self.budget.load(Relaxed) {
            drop(slots);
            self.bytes.fetch_sub(size, Relaxed);
            return false;
        }
        // An empty slot, else the one cached longest ago.
        let mut victim = 0;
        for (i, e) in slots.0.iter().enumerate() {
            if e.ptr.is_null() {
                victim = i;
                break;
            }
            if e.since < slots.0[victim].since {
                victim = i;
            }
        }
        let out = core::mem::replace(&mut slots.0[victim], new);
        drop(slots);
        if !out.ptr.is_null() {
            self.bytes.fetch_sub(out.size, Relaxed);
            free(out.ptr, out.size);
        }
        true
    }

    /// Reserves `n` bytes of the budget (compare-and-swap, never past it):
    /// the bytes reserved before, or `None` if `n` more do not fit.
    fn reserve_bytes(&self, n: usize) -> Option<usize> {
        let budget = self.budget.load(Relaxed);
        let mut held = self.bytes.load(Relaxed);
        loop {
            if n > budget.saturating_sub(held) {
                return None;
            }
            match self
                .bytes
                .compare_exchange_weak(held, held + n, Relaxed, Relaxed)
            {
                Ok(_) => return Some(held),
                Err(now_held) => held = now_held,
            }
        }
    }

    /// Reserves `n` bytes of the budget for memory kept outside the shards
    /// (growth slack), by the same compare-and-swap as a block entering
    /// the cache; `false`, reserving nothing, if they do not fit beside
    /// what the cache and the slack already hold.
    pub fn reserve(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let ok = self.reserve_bytes(n).is_some();
        if ok {
            self.outside.fetch_add(n, Relaxed);
        }
        ok
    }

    /// Counts `n` bytes kept outside the shards whether or not they fit
    /// the budget (slack the owner cannot give back: a mapping the system
    /// rounded up).
    pub fn reserve_anyway(&self, n: usize) {
        if n != 0 {
            self.bytes.fetch_add(n, Relaxed);
            self.outside.fetch_add(n, Relaxed);
        }
    }

    /// Gives back `n` bytes reserved outside the shards.
    pub fn unreserve(&self, n: usize) {
        if n != 0 {
            self.outside.fetch_sub(n, Relaxed);
            self.bytes.fetch_sub(n, Relaxed);
        }
    }

    /// Bytes reserved outside the shards (growth slack).
    pub fn outside(&self) -> usize {
        self.outside.load(Relaxed)
    }

    /// Bytes reserved by cached blocks (and blocks entering or leaving):
    /// [`bytes`](Self::bytes) less [`outside`](Self::outside), a snapshot.
    pub fn cached(&self) -> usize {
        self.bytes().saturating_sub(self.outside())
    }

    /// If a sweep is due at `now` (ms), gives every block cached at least
    /// the decay time ago to `free` (one thread sweeps; the others go on).
    pub fn decay(&self, now: usize, mut free: impl FnMut(*mut u8, usize)) {
        let decay = self.decay.load(Relaxed);
        let due = self.next_sweep.load(Relaxed);
        if now < due || self.cached() == 0 {
            return;
        }
        if self
            .next_sweep
            .compare_exchange(due, now.saturating_add(decay / 4), Relaxed, Relaxed)
            .is_err()
        {
            return; // another thread sweeps
        }
        self.release(|e| now.saturating_sub(e.since) >= decay, &mut free);
    }

    /// Gives the largest cached block to `free` (the shards visited from
    /// the largest size class down; the first block found in the highest
    /// non-empty class, its largest); `false` if there is none.
    pub fn evict_largest(&self, free: impl FnOnce(*mut u8, usize)) -> bool {
        for shard in self.shards.iter().rev() {
            let e = {
                let mut slots = shard.lock();
                let Some(i) = (0..SLOTS)
                    .filter(|&i| !slots.0[i].ptr.is_null())
                    .max_by_key(|&i| slots.0[i].size)
                else {
                    continue;
                };
                core::mem::replace(&mut slots.0[i], Entry::EMPTY)
            };
            self.bytes.fetch_sub(e.size, Relaxed);
            free(e.ptr, e.size);
            return true;
        }
        false
    }

    /// Gives every cached block to `free`.
    pub fn drain(&self, mut free: impl FnMut(*mut u8, usize)) {
        self.release(|_| true, &mut free);
    }

    /// Removes the entries `which` selects, shard by shard, and hands each
    /// to `free` once its shard is unlocked.
    fn release(&self, which: impl Fn(&Entry) -> bool, free: &mut impl FnMut(*mut u8, usize)) {
        for shard in &self.shards {
            let mut out = [Entry::EMPTY; SLOTS];
            {
                let mut slots = shard.lock();
                for (e, o) in slots.0.iter_mut().zip(&mut out) {
                    if !e.ptr.is_null() && which(e) {
                        *o = core::mem::replace(e, Entry::EMPTY);
                    }
                }
            }
            for o in out.iter().filter(|o| !o.ptr.is_null()) {
                self.bytes.fetch_sub(o.size, Relaxed);
                free(o.ptr, o.size);
            }
        }
    }

    /// Sets the budget; if it is lower than before, or the cache holds
    /// more, the cache is emptied into `free` (memory reserved outside the
    /// shards is its owner's to give back: see `backing::slack::trim`).
    ///
    /// Why the drain leaves no straggler: a `give` checks the budget under
    /// its shard's lock. If it takes that lock after the drain has visited
    /// the shard, the drain's unlock happens-before its lock, and the new
    /// budget (stored before the drain) is what it reads: it refuses, its
    /// reservation being over the budget. If it takes the lock first, the
    /// drain finds its block. A budget only lowered without a drain could
    /// be missed by a give that read the old one (hence the drain whenever
    /// the budget goes down, even with `bytes` reading 0).
    pub fn set_budget(&self, budget: usize, free: impl FnMut(*mut u8, usize)) {
        let old = self.budget.swap(budget, Relaxed);
        if budget < old || self.bytes.load(Relaxed) > budget {
            self.drain(free);
        }
    }

    /// Sets the decay time (ms); the next sweep is due at once.
    pub fn set_decay_ms(&self, ms: usize) {
        self.decay.store(ms, Relaxed);
        self.next_sweep.store(0, Relaxed);
    }

    /// The decay time (ms).
    pub fn decay_ms(&self) -> usize {
        self.decay.load(Relaxed)
    }

    /// The budget.
    pub fn budget(&self) -> usize {
        self.budget.load(Relaxed)
    }

    /// Bytes reserved: cached blocks plus [`outside`](Self::outside).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Relaxed)
    }

    /// Takes every shard's lock, in index order, and keeps the guards in
    /// the shards: `pthread_atfork`'s prepare handler, so that no other
    /// thread is inside a shard when the process forks. Nothing else holds
    /// two shard locks at once, so the fixed order cannot deadlock.
    ///
    /// A fork from a signal handler may have interrupted this very thread
    /// inside a shard: that shard (this thread's `HOLDS`) is only tried,
    /// for about a millisecond (the thread may also have been about to
    /// lock it, or have just unlocked it, while another holds it), and
    /// skipped if it stays locked: the interrupted code, which holds it,
    /// resumes in both processes when the handler returns.
    #[cfg(not(loom))]
    #[cfg_attr(windows, allow(dead_code))] // no fork on Windows
    pub(crate) fn lock_for_fork(&'static self) {
        let mine = HOLDS.get();
        for shard in &self.shards {
            let guard = if ptr::from_ref(shard).addr() == mine {
                match try_lock_briefly(shard) {
                    Some(guard) => guard,
                    None => continue,
                }
            } else {
                shard
                    .slots
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            };
            // SAFETY: this thread holds the shard's lock (see `Shard`'s Sync).
            unsafe { *shard.fork_guard.get() = Some(guard) };
        }
    }

    /// Releases what [`lock_for_fork`](Self::lock_for_fork) took. In the
    /// child (`recount`), first sets the budget word to the bytes really in
    /// the shards: a thread that had reserved bytes for a block, or taken a
    /// block and not yet released its bytes, does not exist in the child.
    ///
    /// # Safety
    /// Called by the thread that called `lock_for_fork` (or, in the child,
    /// its copy), once after it.
    #[cfg(not(loom))]
    #[cfg_attr(windows, allow(dead_code))] // no fork on Windows
    pub(crate) unsafe fn unlock_after_fork(&'static self, recount: bool) {
        // A shard skipped by a fork from a signal handler (no guard kept)
        // holds blocks the recount cannot see, and its thread, which
        // resumes in the child, has reservations in flight: the word is
        // then left as it was (at worst too high: the cache keeps less).
        // SAFETY: this thread is the only one touching the fork guards
        // (the caller's contract).
        let all = self
            .shards
            .iter()
            .all(|shard| unsafe { (*shard.fork_guard.get()).is_some() });
        if recount && all {
            let mut bytes = 0;
            for shard in &self.shards {
                // SAFETY: this thread holds every shard's lock, its guard
                // kept in the shard (the caller's contract).
                if let Some(slots) = unsafe { &*shard.fork_guard.get() } {
                    bytes += slots.0.iter().map(|e| e.size).sum::<usize>();
                }
            }
            self.bytes
                .store(bytes + self.outside.load(Relaxed), Relaxed);
        }
        for shard in &self.shards {
            // SAFETY: as above; the guard leaves the shard and unlocks it.
            drop(unsafe { (*shard.fork_guard.get()).take() });
        }
    }

    /// Bytes and blocks in the shards right now (each shard locked in turn).
    pub fn held(&self) -> (usize, usize) {
        // Every block in a shard is covered by `bytes` (reserved before it
        // enters, released after it leaves), so 0 means no block: the usual
        // answer, without taking all 176 locks (`manager::stats` asks).
        // Relaxed: a snapshot; what this thread did itself, or learned of
        // through other synchronisation, is already visible.
        if self.cached() == 0 {
            return (0, 0);
        }
        let mut total = (0, 0);
        for shard in &self.shards {
            for e in shard.lock().0.iter().filter(|e| !e.ptr.is_null()) {
                total.0 += e.size;
                total.1 += 1;
            }
        }
        total
    }
}

/// The lock of a shard that this thread may hold itself (see
/// [`Cache::lock_for_fork`]): tried for about a millisecond.
#[cfg(not(loom))]
#[cfg_attr(windows, allow(dead_code))] // no fork on Windows
fn try_lock_briefly(shard: &'static Shard) -> Option<crate::sync::MutexGuard<'static, Slots>> {
    for _ in 0..1000 {
        match shard.slots.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_four_per_doubling() {
        assert_eq!(class(1), 0);
        assert_eq!(class(MIN_BLOCK), 0);
        assert_eq!(class(MIN_BLOCK + MIN_BLOCK / 4), 1);
        assert_eq!(class(2 * MIN_BLOCK - 1), 3);
        assert_eq!(class(2 * MIN_BLOCK), 4);
        assert_eq!(class(usize::MAX), SHARDS - 1);
        let mut last = 0;
        for s in (MIN_BLOCK..64 * MIN_BLOCK).step_by(4093) {
            assert!(class(s) >= last);
            last = class(s);
        }
        // A fitting block (n ..= n + n/8) is always in n's class or the next.
        for n in (MIN_BLOCK..64 * MIN_BLOCK).step_by(65_521) {
            assert!(class(n + n / MAX_WASTE_DIV) <= class(n) + 1);
        }
    }
}
