//! The medium heap's core, on a region given to it: spans handed to
//! classes, each class's lists of free blocks, and the decay, without any
//! system call of its own (the caller's [`Env`] purges pages and keeps the
//! budget). The process's heap runs on the reserved region
//! (`medium::region`); the unit tests and the loom model run it on a plain
//! allocation.
//!
//! **Layout.** The region is a run of segments ([`SEG`], 64 MiB, 16
//! spans), given to the heap one at a time as it grows
//! ([`grow`](Heap::grow)): address space is taken as the medium working
//! set needs it, not all at once. A segment's first span holds the block
//! metadata of the segment's pages, one [`Meta`] of 16 bytes per page
//! (256 KiB, of which only the entries of blocks ever freed are touched:
//! 16 bytes per block); the other spans hold blocks. A span (4 MiB)
//! belongs to one class from its first block on (the span table, one byte
//! per span, says which), and is carved bump-style into that class's
//! blocks, back to back: a class is a multiple of 512 bytes plus 128,
//! above 4 KiB, so a block starts 64-byte aligned and shares its first and
//! last pages with its neighbours. A block is named by its offset in the
//! region in 64-byte units; its metadata entry is that of the page it
//! starts in (no two blocks start in one page: every class is larger than
//! a page).
//!
//! **The rare lock.** Growth (a system call) and each decay batch (its
//! blocks off every list while their pages are purged) run under one more
//! spin lock, outside the classes' (`rare`); the fork handler takes it
//! before theirs, so that no child inherits a segment half added or a
//! batch of blocks on no list with its budget still reserved.
//!
//! **Lists.** Each class keeps, under its lock: the dirty list (blocks
//! freed and still resident, doubly linked, newest first: reuse pops the
//! newest, decay the oldest, each in constant time; a block's entry holds
//! when it was freed), the clean list (blocks whose pages went back to
//! the kernel: they read as zero), and the bump range of its current span.
//! A request takes a dirty block, else a clean one, else a fresh one.
//! Each entry also holds its block's state (live, dirty, clean, in
//! flight), so that a block given back can tell its neighbours'.
//!
//! **Giving pages back.** A page is given back only when every block on
//! it is free: a decay batch takes its dirty blocks and their clean
//! neighbours (the clean list is doubly linked for that) off the lists,
//! gives back every page among them, and zeroes a block's bytes on a page
//! it shares with a live or dirty neighbour (resident anyway), so that a
//! clean block reads as zero throughout. Nothing else is written into a
//! free block: its pages stay unresident until it is used again.

use core::ptr;

#[cfg(not(loom))]
use core::sync::atomic::{AtomicU8, AtomicU32};
#[cfg(loom)]
use loom::sync::atomic::{AtomicU8, AtomicU32};

use super::class::{self, CLASSES, PAGE_SHIFT};
use super::lock::SpinLock;
use crate::backing::PAGE;
use crate::sync::{
    AtomicPtr, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

#[cfg(loom)]
use loom::cell::UnsafeCell;

/// `core`'s cell with loom's closure API (a `const` constructor, which
/// `crate::sync`'s lacks; loom's own cell under loom).
#[cfg(not(loom))]
struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    const fn new(v: T) -> Self {
        UnsafeCell(core::cell::UnsafeCell::new(v))
    }

    #[inline(always)]
    fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// The span: the unit the region is handed to classes in (4 MiB; 1 MiB
/// under Miri and loom, whose regions are small allocations).
pub const SPAN: usize = if cfg!(any(miri, loom)) {
    1 << 20
} else {
    4 << 20
};

/// The largest region (128 GiB of address space, taken as it is needed).
pub(crate) const REGION_MAX: usize = 128 << 30;

/// Spans a segment has: the unit the region grows by (64 MiB; 4 MiB under
/// Miri and loom). Its first span holds the segment's block metadata.
pub(crate) const SEG_SPANS: usize = if cfg!(any(miri, loom)) { 4 } else { 16 };

/// A segment's bytes.
pub const SEG: usize = SEG_SPANS * SPAN;

/// Pages of a segment, as a shift.
const SEG_PAGES_SHIFT: u32 = (SEG >> PAGE_SHIFT).trailing_zeros();

/// Spans a region may have (the span table's length).
/// Under Miri: 64 (its tests' regions are a few spans), since Miri's borrow
/// tracker visits every atomic of the table at each `&Heap` it retags
/// (65,536 at full size: seconds per operation; see `chunks::SLOTS`).
pub(crate) const MAX_SPANS: usize = if cfg!(loom) {
    8
} else if cfg!(miri) {
    64
} else {
    REGION_MAX / SPAN
};

/// Classes the heap keeps: all of them, but 2 under loom (whose models
/// use classes 0 and 1, and explore every atomic access of every class).
const N_CLASSES: usize = if cfg!(loom) { 2 } else { CLASSES };

/// No block (the end of a list).
const NONE: u32 = u32::MAX;

/// Blocks a decay takes out of a class per hold of its lock.
const BATCH: usize = 32;

/// A batch with the clean neighbours that join it (two a block at most).
const FLIGHT_MAX: usize = 3 * BATCH;

/// The rare lock's bit in what [`Heap::lock_for_fork`] took (above every
/// class's).
#[cfg(not(loom))]
const RARE_BIT: u64 = 1 << 63;
/// The pool's lock's bit.
#[cfg(not(loom))]
const POOL_BIT: u64 = 1 << 62;
const _: () = assert!(CLASSES < 62);

/// Blocks are named by their offset in the region in these units (64
/// bytes: every block starts at a multiple; 128 GiB / 64 fits a `u32`).
const UNIT_SHIFT: u32 = 6;
const _: () = assert!(REGION_MAX >> UNIT_SHIFT <= NONE as usize);

/// A block's metadata, at the index of the page its start lies in (no two
/// blocks start in one page: every class is larger than a page).
#[repr(C)]
#[derive(Clone, Copy)]
struct Meta {
    /// The next block in its list (older, in the dirty list).
    next: u32,
    /// The previous block in its list (newer, in the dirty list).
    prev: u32,
    /// When it was freed (ms, wrapping), in the dirty list.
    since: u32,
    /// [`LIVE`] (0: a block carved and never freed reads so), [`DIRTY`],
    /// [`CLEAN`] or [`FLIGHT`].
    state: u32,
}

/// Handed out (or carved and never freed).
const LIVE: u32 = 0;
/// Free, on the dirty list: its contents resident and kept.
const DIRTY: u32 = 1;
/// Free, on the clean list: it reads as zero, its pages given back but
/// those it shares with a neighbour that is not free.
const CLEAN: u32 = 2;
/// Free, on no list: its pages being given back (under the rare lock).
const FLIGHT: u32 = 3;

// A segment's metadata fits its first span.
const _: () = assert!((SEG >> PAGE_SHIFT) * size_of::<Meta>() <= SPAN);
const _: () = assert!(SEG.is_power_of_two() && REGION_MAX % SEG == 0);

/// The first span at or after `s` that may hold blocks (not a segment's
/// metadata span).
#[inline(always)]
const fn block_span(s: usize) -> usize {
    if s % SEG_SPANS == 0 { s + 1 } else { s }
}

/// What the heap needs from its owner: the budget that dirty blocks count
/// under, and the purge of a block's pages.
pub trait Env {
    /// Reserves `n` bytes for a block going dirty: `false` if they do not
    /// fit (the block is then purged at once).
    fn reserve(&self, n: usize) -> bool;
    /// Gives back `n` bytes reserved before.
    fn unreserve(&self, n: usize);
    /// Gives the pages of `[p, p + len)` back to the kernel: they read as
    /// zero afterwards.
    ///
    /// # Safety
    /// The range is free blocks of the heap, which nobody uses.
    unsafe fn purge(&self, p: *mut u8, len: usize);
    /// Zeroes `[p, p + len)`: a free block's bytes on a page it shares
    /// with a block that is not free (so that a clean block reads as zero
    /// throughout).
    ///
    /// # Safety
    /// The range is a free block's of the heap, which nobody uses.
    unsafe fn zero(&self, p: *mut u8, len: usize) {
        // SAFETY: the caller's contract.
        unsafe { p.write_bytes(0, len) };
    }
}

/// A class's lists, under its lock.
struct Lists {
    dirty_head: u32,
    dirty_tail: u32,
    clean_head: u32,
    /// The next fresh block (an offset in the region) and the end of the
    /// current span's blocks.
    bump: usize,
    end: usize,
}

/// One class: its lock, its lists, and its figures (written under the
/// lock, read without it).
#[repr(align(128))]
struct Class {
    lock: SpinLock,
    lists: UnsafeCell<Lists>,
    live: AtomicUsize,
    dirty: AtomicUsize,
    clean: AtomicUsize,
}

// SAFETY: `lists` is read and written only under `lock` (and by the fork
// handler holding it); everything else is atomic.
unsafe impl Sync for Class {}
// SAFETY: as above; the lists hold indices, not references.
unsafe impl Send for Class {}

impl Class {
    #[cfg(not(loom))]
    const fn new() -> Self {
        Class {
            lock: SpinLock::new(),
            lists: UnsafeCell::new(Lists::EMPTY),
            live: AtomicUsize::new(0),
            dirty: AtomicUsize::new(0),
            clean: AtomicUsize::new(0),
        }
    }

    #[cfg(loom)]
    fn new() -> Self {
        Class {
            lock: SpinLock::new(),
            lists: UnsafeCell::new(Lists::EMPTY),
            live: AtomicUsize::new(0),
            dirty: AtomicUsize::new(0),
            clean: AtomicUsize::new(0),
        }
    }
}

impl Lists {
    const EMPTY: Lists = Lists {
        dirty_head: NONE,
        dirty_tail: NONE,
        clean_head: NONE,
        bump: 0,
        end: 0,
    };
}

/// A figure written only under its class's lock: no read-modify-write.
#[inline(always)]
fn add(a: &AtomicUsize, n: usize) {
    a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
}

#[inline(always)]
fn sub(a: &AtomicUsize, n: usize) {
    a.store(a.load(Relaxed).wrapping_sub(n), Relaxed);
}

/// The heap: a region (none until [`set_region`](Heap::set_region)), its
/// span table and its classes.
pub struct Heap {
    base: AtomicPtr<u8>,
    /// The region's length so far, whole segments; 0 until it is set
    /// (stored after `base`, and after each segment is added, with
    /// release: a thread that reads it reads `base` too).
    len: AtomicUsize,
    /// Held to grow the region and across each decay batch (see the
    /// module docs); never inside a class's lock.
    rare: SpinLock,
    /// The next span to hand out.
    next_span: AtomicUsize,
    /// Each span's class plus one; 0: not handed out.
    spans: [AtomicU8; MAX_SPANS],
    /// Each span's carved blocks that are not clean (live, dirty, or in
    /// flight from either): written under its class's lock. A span whose
    /// count falls to 0 leaves its class for the pool.
    used: [AtomicU32; MAX_SPANS],
    /// The pool: spans that left their class, whole and given back (their
    /// metadata too), for any class to take. A stack linked through
    /// `pool_next`, under `pool_lock` (innermost: taken inside a class's).
    pool_lock: SpinLock,
    pool_head: AtomicU32,
    pool_next: [AtomicU32; MAX_SPANS],
    /// Spans in the pool.
    pooled: AtomicUsize,
    classes: [Class; N_CLASSES],
}

impl Heap {
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Heap {
            base: AtomicPtr::new(ptr::null_mut()),
            len: AtomicUsize::new(0),
            rare: SpinLock::new(),
            next_span: AtomicUsize::new(0),
            spans: [const { AtomicU8::new(0) }; MAX_SPANS],
            used: [const { AtomicU32::new(0) }; MAX_SPANS],
            pool_lock: SpinLock::new(),
            pool_head: AtomicU32::new(NONE),
            pool_next: [const { AtomicU32::new(NONE) }; MAX_SPANS],
            pooled: AtomicUsize::new(0),
            classes: [const { Class::new() }; N_CLASSES],
        }
    }

    #[cfg(loom)]
    pub fn new() -> Self {
        Heap {
            base: AtomicPtr::new(ptr::null_mut()),
            len: AtomicUsize::new(0),
            rare: SpinLock::new(),
            next_span: AtomicUsize::new(0),
            spans: core::array::from_fn(|_| AtomicU8::new(0)),
            used: core::array::from_fn(|_| AtomicU32::new(0)),
            pool_lock: SpinLock::new(),
            pool_head: AtomicU32::new(NONE),
            pool_next: core::array::from_fn(|_| AtomicU32::new(NONE)),
            pooled: AtomicUsize::new(0),
            classes: core::array::from_fn(|_| Class::new()),
        }
    }

    /// Gives the heap its region, `[base, base + len)` (`len` a multiple
    /// of [`SEG`], at most [`REGION_MAX`]; `base` page-aligned, memory
    /// that reads as zero and that nothing else uses): `false`, changing
    /// nothing, if it has one already.
    pub fn set_region(&self, base: *mut u8, len: usize) -> bool {
        debug_assert!(len % SEG == 0 && len <= MAX_SPANS * SPAN && len > 0);
        if self
            .base
            .compare_exchange(ptr::null_mut(), base, Relaxed, Relaxed)
            .is_err()
        {
            return false;
        }
        self.next_span.store(1, Relaxed);
        self.len.store(len, Release);
        true
    }

    /// Grows the region by a segment where every span is handed out:
    /// `add(at)` makes `[at, at + SEG)` memory that reads as zero and that
    /// nothing else uses (`false` if it cannot). Under the rare lock, so
    /// that one thread grows at a time and no fork copies a segment half
    /// added. `true` if a span is free afterwards (added here or by
    /// another thread meanwhile).
    pub fn grow(&self, add: impl FnOnce(*mut u8) -> bool) -> bool {
        if !self.ready() {
            return false;
        }
        let _rare = self.rare.lock_outer();
        let len = self.len.load(Acquire);
        if block_span(self.next_span.load(Relaxed)) < len / SPAN {
            return true;
        }
        if len + SEG > MAX_SPANS * SPAN || !add(self.base().wrapping_add(len)) {
            return false;
        }
        self.len.store(len + SEG, Release);
        true
    }

    /// The region's length so far (0 before it is set).
    #[cfg(test)]
    fn mapped(&self) -> usize {
        self.len.load(Acquire)
    }

    /// Whether the heap has its region.
    #[inline(always)]
    pub fn ready(&self) -> bool {
        self.len.load(Acquire) != 0
    }

    /// Whether `p` lies in the region: one subtraction and a comparison
    /// (false for every address while there is no region).
    #[inline(always)]
    pub fn contains(&self, p: *const u8) -> bool {
        let len = self.len.load(Acquire);
        p.addr().wrapping_sub(self.base.load(Relaxed).addr()) < len
    }

    #[inline(always)]
    fn base(&self) -> *mut u8 {
        self.base.load(Relaxed)
    }

    /// The block named `id` (see [`UNIT_SHIFT`]).
    #[inline(always)]
    fn block(&self, id: u32) -> *mut u8 {
        self.base().wrapping_add((id as usize) << UNIT_SHIFT)
    }

    /// The metadata entry of the block `id`.
    ///
    /// # Safety
    /// `id` is a block of the heap; the caller holds its class's lock.
    #[inline(always)]
    unsafe fn meta(&self, id: u32) -> *mut Meta {
        let page = (id >> (PAGE_SHIFT - UNIT_SHIFT)) as usize;
        let (seg, page) = (page >> SEG_PAGES_SHIFT, page & ((1 << SEG_PAGES_SHIFT) - 1));
        // SAFETY: a segment's entries lie at its start, one per page of
        // the segment, within its first span (checked above).
        unsafe { self.base().add(seg * SEG).cast::<Meta>().add(page) }
    }

    /// The class of the block at offset `off` of the region.
    #[inline(always)]
    fn class_at(&self, off: usize) -> usize {
        self.spans[off / SPAN].load(Relaxed) as usize - 1
    }

    /// The class of the live block `p` of the heap.
    ///
    /// # Safety
    /// `p` is a live block of the heap.
    #[inline(always)]
    pub unsafe fn class_of(&self, p: *const u8) -> usize {
        self.class_at(p.addr() - self.base().addr())
    }

    /// The size of the live block `p` of the heap.
    #[inline(always)]
    pub fn block_size(&self, p: *const u8) -> usize {
        class::size(self.class_at(p.addr() - self.base().addr()))
    }

    /// A block of class `k`, and whether it reads as zero (a clean or
    /// fresh one); `None` if the heap has no region or no span left.
    #[inline]
    pub fn alloc(&self, k: usize, env: &impl Env) -> Option<(*mut u8, bool)> {
        let c = &self.classes[k];
        let size = class::size(k);
        let guard = c.lock.lock();
        let got = c.lists.with_mut(|l| {
            // SAFETY: the class's lock is held: nothing else reads or
            // writes its lists, nor its blocks' metadata.
            let l = unsafe { &mut *l };
            if l.dirty_head != NONE {
                let i = l.dirty_head;
                // SAFETY: `i` is a block of this class (lock held).
                unsafe {
                    let next = (*self.meta(i)).next;
                    l.dirty_head = next;
                    if next == NONE {
                        l.dirty_tail = NONE;
                    } else {
                        (*self.meta(next)).prev = NONE;
                    }
                    (*self.meta(i)).state = LIVE;
                }
                sub(&c.dirty, size);
                add(&c.live, size);
                // Under the lock, so that no fork copies the block live
                // with its budget still reserved.
                env.unreserve(size);
                return Some((i, false));
            }
            if l.clean_head != NONE {
                let i = l.clean_head;
                // SAFETY: as above.
                unsafe {
                    self.unlink_clean(l, i);
                    (*self.meta(i)).state = LIVE;
                }
                self.use_span(i, 1);
                sub(&c.clean, size);
                add(&c.live, size);
                return Some((i, true));
            }
            if l.end - l.bump < size {
                let s = match self.pool_pop() {
                    Some(s) => s,
                    None => {
                        let spans = self.len.load(Acquire) / SPAN;
                        let s = self
                            .next_span
                            .fetch_update(Relaxed, Relaxed, |s| {
                                let s = block_span(s);
                                (s < spans).then_some(s + 1)
                            })
                            .ok()?;
                        block_span(s)
                    }
                };
                self.spans[s].store(k as u8 + 1, Relaxed);
                l.bump = s * SPAN;
                l.end = l.bump + SPAN / size * size;
            }
            // Its metadata entry reads LIVE: never written since its span
            // was fresh or pooled (given back whole, metadata too), and no
            // other block starts in its page.
            let i = (l.bump >> UNIT_SHIFT) as u32;
            l.bump += size;
            self.use_span(i, 1);
            add(&c.live, size);
            Some((i, true))
        });
        drop(guard);
        let (i, zero) = got?;
        Some((self.block(i), zero))
    }

    /// Frees the block `p` at `now` (ms): onto its class's dirty list if
    /// the budget has room for it, else its pages given back and onto the
    /// clean list. The budget is reserved under the class's lock, so that
    /// no fork copies a reservation without its block on the dirty list.
    ///
    /// # Safety
    /// `p` is a live block of the heap (as [`alloc`](Self::alloc) returned
    /// it), not used again.
    #[inline]
    pub unsafe fn free(&self, p: *mut u8, now: usize, env: &impl Env) {
        let off = p.addr() - self.base().addr();
        let k = self.class_at(off);
        let size = class::size(k);
        debug_assert!((off % SPAN) % size == 0, "not a block's start");
        let id = (off >> UNIT_SHIFT) as u32;
        let c = &self.classes[k];
        let guard = c.lock.lock();
        let dirty = c.lists.with_mut(|l| {
            if !env.reserve(size) {
                return false;
            }
            // SAFETY: the class's lock is held (see `alloc`).
            let l = unsafe { &mut *l };
            // SAFETY: `id` is a block of this class (lock held).
            unsafe {
                let head = l.dirty_head;
                *self.meta(id) = Meta {
                    next: head,
                    prev: NONE,
                    since: now as u32,
                    state: DIRTY,
                };
                if head == NONE {
                    l.dirty_tail = id;
                } else {
                    (*self.meta(head)).prev = id;
                }
                l.dirty_head = id;
            }
            add(&c.dirty, size);
            sub(&c.live, size);
            true
        });
        drop(guard);
        if dirty {
            return;
        }
        // No room in the budget: given back at once, as a decay batch of
        // one (under the rare lock, see `give_back`).
        let _rare = self.rare.lock_outer();
        let mut flight = [NONE; FLIGHT_MAX];
        flight[0] = id;
        let guard = c.lock.lock();
        let n = c.lists.with_mut(|l| {
            // SAFETY: the class's lock is held (see `alloc`); `id` is its
            // block, live until now, in no list.
            unsafe { (*self.meta(id)).state = FLIGHT };
            sub(&c.live, size);
            add(&c.clean, size);
            // SAFETY: as above; `flight[0]` is in flight.
            unsafe { self.take_neighbours(&mut *l, size, &mut flight, 1) }
        });
        drop(guard);
        // SAFETY: the blocks in flight are this class's, free, off every
        // list; the rare lock is held.
        unsafe { self.give_back(c, size, &mut flight[..n], 1, env) };
    }

    /// Adds to `flight[n..]` the clean neighbours of the blocks
    /// `flight[..n]`, each taken off the clean list and marked in flight,
    /// so that the pages they share can be given back with them; returns
    /// how many are in flight now.
    ///
    /// # Safety
    /// The class's lock is held; `flight[..n]` are its blocks, in flight.
    unsafe fn take_neighbours(
        &self,
        l: &mut Lists,
        size: usize,
        flight: &mut [u32; FLIGHT_MAX],
        n: usize,
    ) -> usize {
        let mut m = n;
        for j in 0..n {
            let off = (flight[j] as usize) << UNIT_SHIFT;
            let in_span = off % SPAN;
            // The previous block (carved: the span is carved in order),
            // and the next one where it exists and is carved.
            let prev = (in_span >= size).then(|| off - size);
            let next = off + size;
            let next =
                (in_span + 2 * size <= SPAN && !(l.bump <= next && next < l.end)).then_some(next);
            for q in [prev, next].into_iter().flatten() {
                let q = (q >> UNIT_SHIFT) as u32;
                // SAFETY: `q` is a carved block of this class (lock held).
                unsafe {
                    if (*self.meta(q)).state == CLEAN {
                        self.unlink_clean(l, q);
                        (*self.meta(q)).state = FLIGHT;
                        flight[m] = q;
                        m += 1;
                    }
                }
            }
        }
        m
    }

    /// Gives back the pages of the blocks in `flight` (the first `fresh`
    /// of them dirty or live until now, the rest clean neighbours that
    /// joined them): every page that only free blocks share, whole; the
    /// bytes of a fresh block on a page it shares with a block that is not
    /// free are zeroed instead. Then they go on the clean list. Called
    /// without the class's lock, under the rare lock, so that no fork
    /// copies them on no list.
    ///
    /// # Safety
    /// The blocks are the class's, free, in flight (off every list, nobody
    /// else's); the rare lock is held.
    unsafe fn give_back(
        &self,
        c: &Class,
        size: usize,
        flight: &mut [u32],
        fresh: usize,
        env: &impl Env,
    ) {
        // Address order, each with whether it was clean (its bytes zero).
        let mut order = [(NONE, false); FLIGHT_MAX];
        for (j, &id) in flight.iter().enumerate() {
            let mut i = j;
            while i > 0 && order[i - 1].0 > id {
                order[i] = order[i - 1];
                i -= 1;
            }
            order[i] = (id, j >= fresh);
        }
        let order = &order[..flight.len()];
        let step = (size >> UNIT_SHIFT) as u32;
        let mut first = 0;
        while first < order.len() {
            let mut last = first;
            while last + 1 < order.len() && order[last + 1].0 == order[last].0 + step {
                last += 1;
            }
            let start = (order[first].0 as usize) << UNIT_SHIFT;
            let end = ((order[last].0 as usize) << UNIT_SHIFT) + size;
            // The span's last block has no neighbour after it: the rest of
            // its last page is nobody's.
            let last_in_span = end % SPAN + size > SPAN || end % SPAN == 0;
            let (ps, pe) = (
                start.next_multiple_of(PAGE),
                if last_in_span {
                    end.next_multiple_of(PAGE)
                } else {
                    end & !(PAGE - 1)
                },
            );
            // SAFETY: the caller's contract: these pages hold only blocks
            // in flight (and, past the span's last block, nothing), and a
            // block's bytes on a page shared with another block are its own.
            unsafe {
                if pe > ps {
                    env.purge(self.base().add(ps), pe - ps);
                }
                if start < ps && !order[first].1 {
                    env.zero(self.base().add(start), ps.min(end) - start);
                }
                if pe < end && pe >= ps && !order[last].1 {
                    env.zero(self.base().add(pe), end - pe);
                }
            }
            first = last + 1;
        }
        let mut emptied = [NONE; FLIGHT_MAX];
        let mut n = 0;
        let guard = c.lock.lock();
        c.lists.with_mut(|l| {
            // SAFETY: the class's lock is held (see `alloc`).
            let l = unsafe { &mut *l };
            for (j, &id) in flight.iter().enumerate() {
                // SAFETY: a block of this class, in no list.
                unsafe { self.push_clean(l, id) };
                if j < fresh && self.use_span(id, -1) == 0 {
                    emptied[n] = (((id as usize) << UNIT_SHIFT) / SPAN) as u32;
                    n += 1;
                }
            }
            for &s in &emptied[..n] {
                // SAFETY: the lock is held; every carved block of `s` is
                // clean (its count fell to 0).
                unsafe { self.leave_class(c, l, size, s as usize) };
            }
        });
        drop(guard);
        for &s in &emptied[..n] {
            let s = s as usize;
            // SAFETY: the span left its class: no block of it is on a
            // list, live or in anybody's hands; its metadata entries are
            // read by nobody until it is carved again.
            unsafe {
                env.purge(self.base().add(s * SPAN), SPAN);
                let (seg, first) = (s / SEG_SPANS, (s % SEG_SPANS) * (SPAN >> PAGE_SHIFT));
                let meta = self.base().add(seg * SEG).cast::<Meta>().add(first);
                env.purge(meta.cast(), (SPAN >> PAGE_SHIFT) * size_of::<Meta>());
            }
            self.pool_push(s);
        }
    }

    /// Adds `d` (1 or -1) to the count of the span that holds the block
    /// `id`; returns the new count. Under the class's lock.
    #[inline(always)]
    fn use_span(&self, id: u32, d: i32) -> u32 {
        let s = ((id as usize) << UNIT_SHIFT) / SPAN;
        let n = self.used[s].load(Relaxed).wrapping_add_signed(d);
        self.used[s].store(n, Relaxed);
        n
    }

    /// Takes every carved block of the span `s` (all clean) off the clean
    /// list, and the span out of the class (its bump range too, if it is
    /// the class's current span).
    ///
    /// # Safety
    /// The class's lock is held; `s` is its span, every carved block of
    /// which is clean.
    unsafe fn leave_class(&self, c: &Class, l: &mut Lists, size: usize, s: usize) {
        let start = s * SPAN;
        let carved = if (start..=start + SPAN).contains(&l.bump) && l.end > l.bump {
            let n = (l.bump - start) / size;
            (l.bump, l.end) = (0, 0);
            n
        } else {
            SPAN / size
        };
        for b in 0..carved {
            let id = ((start + b * size) >> UNIT_SHIFT) as u32;
            // SAFETY: a block of the class, clean: on the clean list.
            unsafe { self.unlink_clean(l, id) };
        }
        sub(&c.clean, carved * size);
        self.spans[s].store(0, Relaxed);
    }

    /// Puts the span `s` (out of every class, given back) in the pool.
    fn pool_push(&self, s: usize) {
        let _guard = self.pool_lock.lock_inner();
        self.pool_next[s].store(self.pool_head.load(Relaxed), Relaxed);
        self.pool_head.store(s as u32, Relaxed);
        add(&self.pooled, 1);
    }

    /// A span from the pool, if it holds one.
    #[inline]
    fn pool_pop(&self) -> Option<usize> {
        if self.pool_head.load(Relaxed) == NONE {
            return None;
        }
        let _guard = self.pool_lock.lock_inner();
        let s = self.pool_head.load(Relaxed);
        if s == NONE {
            return None;
        }
        self.pool_head
            .store(self.pool_next[s as usize].load(Relaxed), Relaxed);
        sub(&self.pooled, 1);
        Some(s as usize)
    }

    /// # Safety
    /// The class's lock is held, and `id` is its block, in no list.
    #[inline(always)]
    unsafe fn push_clean(&self, l: &mut Lists, id: u32) {
        let head = l.clean_head;
        // SAFETY: the caller's contract; `head` is a block of the class.
        unsafe {
            *self.meta(id) = Meta {
                next: head,
                prev: NONE,
                since: 0,
                state: CLEAN,
            };
            if head != NONE {
                (*self.meta(head)).prev = id;
            }
        }
        l.clean_head = id;
    }

    /// Takes the block `id` off the clean list.
    ///
    /// # Safety
    /// The class's lock is held, and `id` is its block, on the clean list.
    #[inline(always)]
    unsafe fn unlink_clean(&self, l: &mut Lists, id: u32) {
        // SAFETY: the caller's contract: `id` and its list neighbours are
        // blocks of the class.
        unsafe {
            let m = *self.meta(id);
            if m.prev == NONE {
                l.clean_head = m.next;
            } else {
                (*self.meta(m.prev)).next = m.next;
            }
            if m.next != NONE {
                (*self.meta(m.next)).prev = m.prev;
            }
        }
    }

    /// Gives back the dirty blocks freed at least `older_than` ms before
    /// `now` (every dirty block with `None`), oldest first, and moves them
    /// to their classes' clean lists; returns how many. A batch at a time:
    /// under the rare lock (a fork waits until its blocks are on a list
    /// again and their budget given back), its class's lock held only to
    /// take the batch (and its clean neighbours) off the lists and to put
    /// them on the clean list; the pages go back between, without it.
    pub fn decay(&self, now: usize, older_than: Option<u32>, env: &impl Env) -> usize {
        self.decay_limited(now, older_than, usize::MAX, env)
    }

    /// [`decay`](Self::decay), stopping once the blocks given back hold at
    /// least `limit` bytes.
    pub fn decay_limited(
        &self,
        now: usize,
        older_than: Option<u32>,
        limit: usize,
        env: &impl Env,
    ) -> usize {
        let mut total = 0;
        let mut bytes = 0;
        for (k, c) in self.classes.iter().enumerate() {
            if c.dirty.load(Relaxed) == 0 || bytes >= limit {
                continue;
            }
            let size = class::size(k);
            loop {
                let mut flight = [NONE; FLIGHT_MAX];
                let _rare = self.rare.lock_outer();
                let guard = c.lock.lock();
                let (n, m) = c.lists.with_mut(|l| {
                    // SAFETY: the class's lock is held (see `alloc`).
                    let l = unsafe { &mut *l };
                    let mut n = 0;
                    while n < BATCH && l.dirty_tail != NONE {
                        let i = l.dirty_tail;
                        // SAFETY: a block of this class (lock held).
                        let m = unsafe { *self.meta(i) };
                        if older_than.is_some_and(|d| (now as u32).wrapping_sub(m.since) < d) {
                            break;
                        }
                        l.dirty_tail = m.prev;
                        // SAFETY: as above.
                        unsafe {
                            if m.prev == NONE {
                                l.dirty_head = NONE;
                            } else {
                                (*self.meta(m.prev)).next = NONE;
                            }
                            (*self.meta(i)).state = FLIGHT;
                        }
                        flight[n] = i;
                        n += 1;
                    }
                    sub(&c.dirty, n * size);
                    add(&c.clean, n * size);
                    // SAFETY: as above; `flight[..n]` are in flight.
                    (n, unsafe { self.take_neighbours(l, size, &mut flight, n) })
                });
                drop(guard);
                if n == 0 {
                    break;
                }
                // SAFETY: the blocks in flight are this class's, free, off
                // every list; the rare lock is held.
                unsafe { self.give_back(c, size, &mut flight[..m], n, env) };
                env.unreserve(n * size);
                total += n;
                bytes += n * size;
                if n < BATCH || bytes >= limit {
                    break;
                }
            }
        }
        total
    }

    /// Bytes in live blocks, in dirty blocks (free, resident) and in
    /// clean blocks (free, given back): a snapshot.
    /// (The pool's spans count as clean: address space only.)
    pub fn figures(&self) -> (usize, usize, usize) {
        let pooled = self.pooled.load(Relaxed) * SPAN;
        self.classes.iter().fold((0, 0, pooled), |(l, d, c), k| {
            (
                l + k.live.load(Relaxed),
                d + k.dirty.load(Relaxed),
                c + k.clean.load(Relaxed),
            )
        })
    }

    /// Whether any class holds dirty blocks (a snapshot).
    #[inline]
    pub fn any_dirty(&self) -> bool {
        self.classes.iter().any(|c| c.dirty.load(Relaxed) != 0)
    }

    /// `pthread_atfork`'s prepare handler: takes the rare lock, then every
    /// class's lock, in order, then the pool's. A lock this thread may hold
    /// itself (`mine`, `mine_outer` and `mine_inner`, from a fork in a
    /// signal handler that interrupted it) is only tried, for about a
    /// millisecond, and skipped if it stays held. Returns which were taken
    /// (bit `k`: class `k`; [`RARE_BIT`], [`POOL_BIT`]: those locks).
    #[cfg(not(loom))]
    #[cfg_attr(windows, allow(dead_code))]
    pub(crate) fn lock_for_fork(&self, mine: usize, mine_outer: usize, mine_inner: usize) -> u64 {
        let take = |lock: &SpinLock, own: bool| {
            if !own {
                lock.lock_raw();
                return true;
            }
            (0..1000).any(|_| {
                lock.try_lock_raw() || {
                    std::thread::yield_now();
                    false
                }
            })
        };
        let mut taken = 0u64;
        if take(&self.rare, ptr::from_ref(&self.rare).addr() == mine_outer) {
            taken |= RARE_BIT;
        }
        for (k, c) in self.classes.iter().enumerate() {
            if take(&c.lock, ptr::from_ref(&c.lock).addr() == mine) {
                taken |= 1 << k;
            }
        }
        if take(
            &self.pool_lock,
            ptr::from_ref(&self.pool_lock).addr() == mine_inner,
        ) {
            taken |= POOL_BIT;
        }
        taken
    }

    /// Releases the locks [`lock_for_fork`](Self::lock_for_fork) took.
    ///
    /// # Safety
    /// `taken` is what it returned, in this thread (or its copy in the
    /// child), once.
    #[cfg(not(loom))]
    #[cfg_attr(windows, allow(dead_code))]
    pub(crate) unsafe fn unlock_after_fork(&self, taken: u64) {
        for (k, c) in self.classes.iter().enumerate() {
            if taken & (1 << k) != 0 {
                // SAFETY: the caller's contract: held here, without a guard.
                unsafe { c.lock.force_unlock() };
            }
        }
        if taken & POOL_BIT != 0 {
            // SAFETY: as above.
            unsafe { self.pool_lock.force_unlock() };
        }
        if taken & RARE_BIT != 0 {
            // SAFETY: as above.
            unsafe { self.rare.force_unlock() };
        }
    }
}

#[cfg(all(test, not(loom)))]
pub(crate) mod tests {
    use super::*;
    use core::cell::Cell;
    use std::alloc::{Layout, alloc_zeroed, dealloc};

    /// A region that is a plain allocation, and an `Env` that zeroes
    /// purged blocks (as `MADV_DONTNEED` would) and keeps a budget.
    pub(crate) struct Test {
        pub(crate) heap: Box<Heap>,
        region: *mut u8,
        len: usize,
        pub(crate) budget: Cell<usize>,
        pub(crate) reserved: Cell<usize>,
        pub(crate) purged: Cell<usize>,
    }

    impl Test {
        /// A heap on `spans` spans for blocks (whole segments: their
        /// metadata spans besides).
        pub(crate) fn new(spans: usize) -> Test {
            let len = spans.div_ceil(SEG_SPANS - 1) * SEG;
            let layout = Layout::from_size_align(len, 4096).unwrap();
            // SAFETY: a non-zero size.
            let region = unsafe { alloc_zeroed(layout) };
            assert!(!region.is_null());
            let heap = Box::new(Heap::new());
            assert!(heap.set_region(region, len));
            assert!(!heap.set_region(region, len));
            Test {
                heap,
                region,
                len,
                budget: Cell::new(usize::MAX),
                reserved: Cell::new(0),
                purged: Cell::new(0),
            }
        }
    }

    impl Drop for Test {
        fn drop(&mut self) {
            let layout = Layout::from_size_align(self.len, 4096).unwrap();
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.region, layout) };
        }
    }

    impl Env for Test {
        fn reserve(&self, n: usize) -> bool {
            let ok = n <= self.budget.get() - self.reserved.get();
            if ok {
                self.reserved.set(self.reserved.get() + n);
            }
            ok
        }
        fn unreserve(&self, n: usize) {
            self.reserved.set(self.reserved.get() - n);
        }
        unsafe fn purge(&self, p: *mut u8, len: usize) {
            assert!(self.heap.contains(p) && self.heap.contains(p.wrapping_add(len - 1)));
            // SAFETY: the caller's contract: free blocks of the heap.
            unsafe { p.write_bytes(0, len) };
            self.purged.set(self.purged.get() + len);
        }
    }

    #[test]
    fn no_region_contains_nothing() {
        let h = Box::new(Heap::new());
        assert!(!h.ready());
        for a in [0usize, 1, 4096, usize::MAX] {
            assert!(!h.contains(ptr::without_provenance(a)));
        }
    }

    #[test]
    fn blocks_are_distinct_aligned_and_know_their_class() {
        // Under Miri (8 spans of 1 MiB) every ninth class, up to class 36
        // (256 KiB: its three blocks share a span), a span each.
        let e = Test::new(if cfg!(miri) { 8 } else { CLASSES });
        let mut got = Vec::new();
        for k in (0..CLASSES).step_by(if cfg!(miri) { 9 } else { 1 }) {
            for _ in 0..3 {
                let (p, zero) = e.heap.alloc(k, &e).unwrap();
                assert!(zero, "a fresh block reads zero");
                assert!(e.heap.contains(p));
                assert_eq!(p.addr() % 64, 0);
                assert_eq!(e.heap.block_size(p), class::size(k));
                // SAFETY: a live block of class::size(k) bytes.
                unsafe {
                    p.write(k as u8 + 1);
                    p.add(class::size(k) - 1).write(k as u8 + 1);
                }
                got.push((p, k));
            }
        }
        for &(p, k) in &got {
            // SAFETY: still live.
            unsafe {
                assert_eq!(p.read(), k as u8 + 1);
                assert_eq!(p.add(class::size(k) - 1).read(), k as u8 + 1);
            }
        }
        let live: usize = got.iter().map(|&(_, k)| class::size(k)).sum();
        assert_eq!(e.heap.figures(), (live, 0, 0));
        assert!(!e.heap.contains(e.region.wrapping_add(e.len)));
        assert!(!e.heap.contains(e.region.wrapping_sub(1)));
        for (p, _) in got {
            // SAFETY: live blocks, freed once.
            unsafe { e.heap.free(p, 0, &e) };
        }
        assert_eq!(e.heap.figures(), (0, live, 0));
        assert_eq!(e.reserved.get(), live);
    }

    #[test]
    fn dirty_blocks_are_reused_newest_first() {
        let e = Test::new(2);
        let a = e.heap.alloc(11, &e).unwrap().0;
        let b = e.heap.alloc(11, &e).unwrap().0;
        // SAFETY: live blocks, each freed once.
        unsafe {
            a.write(7);
            e.heap.free(a, 1, &e);
            e.heap.free(b, 2, &e);
        }
        assert_eq!(e.heap.alloc(11, &e), Some((b, false)));
        assert_eq!(e.heap.alloc(11, &e), Some((a, false)));
        // SAFETY: a dirty block keeps its contents (nothing wrote it).
        assert_eq!(unsafe { a.read() }, 7);
        assert_eq!(e.reserved.get(), 0);
        assert_eq!(e.heap.figures().1, 0);
    }

    #[test]
    fn decay_purges_the_old_blocks_only_and_they_come_back_zero() {
        let e = Test::new(2);
        let k = 9; // 48 KiB (plus 128 B)
        let size = class::size(k);
        let blocks: Vec<_> = (0..40).map(|_| e.heap.alloc(k, &e).unwrap().0).collect();
        assert_eq!(blocks[0].addr() % PAGE, 0, "a span's first block");
        for (i, &p) in blocks.iter().enumerate() {
            // SAFETY: live blocks, freed once each; 20 at 0 ms, 20 at 50.
            unsafe {
                p.write_bytes(0xAB, 64);
                e.heap.free(p, if i < 20 { 0 } else { 50 }, &e);
            }
        }
        assert_eq!(e.heap.decay(30, Some(100), &e), 0);
        assert_eq!(e.heap.decay(100, Some(100), &e), 20);
        // Their pages but the last, which the 21st block (dirty) shares.
        assert_eq!(e.purged.get(), (20 * size) & !(PAGE - 1));
        assert_eq!(e.heap.figures(), (0, 20 * size, 20 * size));
        assert_eq!(e.reserved.get(), 20 * size);
        // The young ones are still reused first, dirty.
        for _ in 0..20 {
            assert!(!e.heap.alloc(k, &e).unwrap().1);
        }
        for _ in 0..20 {
            let (p, zero) = e.heap.alloc(k, &e).unwrap();
            assert!(zero);
            assert!(blocks[..20].contains(&p));
            // SAFETY: a live block of `size` bytes.
            assert!(
                unsafe { core::slice::from_raw_parts(p, 64) }
                    .iter()
                    .all(|&b| b == 0)
            );
        }
        // Wrapping clock: a block freed just before the wrap is old after it.
        let p = e.heap.alloc(k, &e).unwrap().0;
        // SAFETY: live, freed once.
        unsafe { e.heap.free(p, u32::MAX as usize - 5, &e) };
        assert_eq!(e.heap.decay(u32::MAX as usize + 10, Some(10), &e), 1);
    }

    #[test]
    fn a_free_beyond_the_budget_is_purged_at_once() {
        let e = Test::new(2);
        let k = 3;
        e.budget.set(class::size(k));
        let size = class::size(k);
        let a = e.heap.alloc(k, &e).unwrap().0;
        let b = e.heap.alloc(k, &e).unwrap().0;
        // SAFETY: live blocks, freed once each.
        unsafe {
            a.write_bytes(0xA, size);
            b.write_bytes(0xB, size);
            e.heap.free(a, 0, &e);
            e.heap.free(b, 0, &e);
        }
        // The pages wholly b's: its first one is shared with a (dirty),
        // its last with the block after it (not carved yet).
        let (start, end) = (b.addr(), b.addr() + size);
        assert_eq!(
            e.purged.get(),
            (end & !(PAGE - 1)) - start.next_multiple_of(PAGE)
        );
        assert_eq!(e.heap.figures(), (0, size, size));
        // Dirty first, whole, then the clean one, which reads zero.
        assert_eq!(e.heap.alloc(k, &e), Some((a, false)));
        assert_eq!(e.heap.alloc(k, &e), Some((b, true)));
        // SAFETY: live blocks of `size` bytes.
        unsafe {
            assert!(bytes(a, size).iter().all(|&x| x == 0xA));
            assert!(bytes(b, size).iter().all(|&x| x == 0));
        }
    }

    /// # Safety
    /// `[p, p + len)` is readable.
    unsafe fn bytes<'a>(p: *mut u8, len: usize) -> &'a [u8] {
        // SAFETY: the caller's contract.
        unsafe { core::slice::from_raw_parts(p, len) }
    }

    /// Blocks share pages with their neighbours (a class is whole pages
    /// plus 128 bytes): a page goes back only once every block on it is
    /// free, and a live or dirty neighbour keeps its bytes; a freed
    /// block's bytes on a page it shares read zero all the same.
    #[test]
    fn pages_shared_by_free_blocks_go_back_and_neighbours_keep_theirs() {
        let e = Test::new(2);
        let k = 0; // 4 KiB + 128: no page is ever a block's alone
        let size = class::size(k);
        let b: Vec<_> = (0..8).map(|_| e.heap.alloc(k, &e).unwrap().0).collect();
        for (i, &p) in b.iter().enumerate() {
            // SAFETY: live blocks of `size` bytes.
            unsafe { p.write_bytes(i as u8 + 1, size) };
        }
        // SAFETY: live blocks, freed once each.
        unsafe {
            e.heap.free(b[1], 0, &e);
            e.heap.free(b[3], 0, &e);
        }
        assert_eq!(e.heap.decay(0, None, &e), 2);
        assert_eq!(e.purged.get(), 0, "every page of theirs has a live block");
        // SAFETY: live blocks.
        unsafe {
            for i in [0, 2, 4] {
                assert!(bytes(b[i], size).iter().all(|&x| x == i as u8 + 1));
            }
        }
        // b[2] freed and decayed: b[1..=3] free, the pages among them go
        // back, those shared with b[0] and b[4] stay.
        // SAFETY: live, freed once.
        unsafe { e.heap.free(b[2], 0, &e) };
        assert_eq!(e.heap.decay(0, None, &e), 1);
        let (start, end) = (b[1].addr(), b[3].addr() + size);
        assert_eq!(
            e.purged.get(),
            (end & !(PAGE - 1)) - start.next_multiple_of(PAGE)
        );
        assert!(e.purged.get() >= PAGE);
        assert_eq!(e.heap.figures(), (5 * size, 0, 3 * size));
        // SAFETY: live blocks.
        unsafe {
            for i in [0, 4] {
                assert!(bytes(b[i], size).iter().all(|&x| x == i as u8 + 1));
            }
        }
        let mut again: Vec<_> = (0..3)
            .map(|_| {
                let (p, zero) = e.heap.alloc(k, &e).unwrap();
                assert!(zero);
                // SAFETY: a live block of `size` bytes.
                assert!(unsafe { bytes(p, size) }.iter().all(|&x| x == 0));
                p
            })
            .collect();
        again.sort();
        assert_eq!(again, b[1..=3]);
    }

    #[test]
    fn drain_purges_everything_and_adjacent_blocks_in_one_call() {
        let e = Test::new(2);
        let k = 1;
        let blocks: Vec<_> = (0..70).map(|_| e.heap.alloc(k, &e).unwrap().0).collect();
        for &p in &blocks {
            // SAFETY: live blocks, each freed once.
            unsafe { e.heap.free(p, 5, &e) };
        }
        assert!(e.heap.any_dirty());
        assert_eq!(e.heap.decay(5, None, &e), 70);
        assert!(!e.heap.any_dirty());
        assert_eq!(e.reserved.get(), 0);
        // Every block of the span free and clean: the span left the class
        // for the pool (counted clean, as address space).
        assert_eq!(e.heap.figures(), (0, 0, SPAN));
    }

    /// A span whose blocks are all free and clean leaves its class, given
    /// back whole with its metadata, and any class takes it next: a
    /// program that changes phase (many blocks of one size, freed, then
    /// another size) reuses it, and what the first phase's metadata took
    /// goes back with it.
    #[test]
    fn an_emptied_span_goes_to_the_pool_for_any_class() {
        let e = Test::new(2);
        let big = 12; // 64 KiB + 128 B: 63 a span (15 under Miri)
        let size = class::size(big);
        let per_span = SPAN / size;
        let blocks: Vec<_> = (0..2 * per_span)
            .map(|_| e.heap.alloc(big, &e).unwrap().0)
            .collect();
        for &p in &blocks {
            // SAFETY: live blocks of `size` bytes, each freed once below.
            unsafe { p.write_bytes(7, size) };
        }
        // The first span's blocks freed and given back; one block of the
        // second span freed and kept dirty.
        // SAFETY: live blocks, each freed once.
        unsafe {
            for &p in &blocks[..=per_span] {
                e.heap.free(p, 0, &e);
            }
        }
        let before = e.purged.get();
        assert_eq!(e.heap.decay(0, Some(0), &e), per_span + 1);
        let (first, second) = (blocks[0], blocks[per_span]);
        assert_eq!((first.addr() - e.region.addr()) % SPAN, 0);
        // The first span went whole to the pool (and its 16 bytes a page
        // of metadata); the second stays its class's (two blocks live).
        assert!(e.purged.get() - before >= SPAN + (SPAN >> PAGE_SHIFT) * size_of::<Meta>());
        assert_eq!(e.heap.figures(), ((per_span - 1) * size, 0, SPAN + size));
        // Another class takes the pooled span: fresh, reading zero.
        let small = 0;
        let (p, zero) = e.heap.alloc(small, &e).unwrap();
        assert!(zero);
        assert_eq!(p, first);
        assert_eq!(e.heap.block_size(p), class::size(small));
        // SAFETY: a live block of class::size(small) bytes.
        assert!(
            unsafe { bytes(p, class::size(small)) }
                .iter()
                .all(|&x| x == 0)
        );
        // The big class's freed block of the second span is reused.
        assert_eq!(e.heap.alloc(big, &e), Some((second, true)));
    }

    #[test]
    fn a_full_region_says_none_and_frees_still_serve() {
        let e = Test::new(2);
        let k = CLASSES - 1; // 1 MiB: SPAN / 1 MiB blocks a span
        let n = e.len / SEG * (SEG_SPANS - 1) * (SPAN / class::size(k));
        let blocks: Vec<_> = (0..n).map(|_| e.heap.alloc(k, &e).unwrap().0).collect();
        assert_eq!(e.heap.alloc(k, &e), None);
        assert_eq!(e.heap.alloc(0, &e), None); // no span left for another class
        // SAFETY: live, freed once.
        unsafe { e.heap.free(blocks[0], 0, &e) };
        assert_eq!(e.heap.alloc(k, &e), Some((blocks[0], false)));
    }

    /// The region grows a segment at a time, where every span is handed
    /// out: the new segment's blocks (and their metadata, in its own first
    /// span) serve as the first one's, and a refused growth says so.
    #[test]
    fn the_region_grows_a_segment_at_a_time() {
        let e = Test::new(2 * (SEG_SPANS - 1));
        assert_eq!(e.len, 2 * SEG);
        let heap = Box::new(Heap::new());
        assert!(!heap.grow(|_| unreachable!("no region yet")));
        assert!(heap.set_region(e.region, SEG));
        let k = CLASSES - 1;
        let per_seg = (SEG_SPANS - 1) * (SPAN / class::size(k));
        let first: Vec<_> = (0..per_seg).map(|_| heap.alloc(k, &e).unwrap().0).collect();
        assert!(first.iter().all(|&p| p.addr() - e.region.addr() >= SPAN));
        assert_eq!(heap.alloc(k, &e), None);
        assert!(!heap.contains(e.region.wrapping_add(SEG)));
        // A growth the system refuses changes nothing.
        assert!(!heap.grow(|_| false));
        assert_eq!(heap.mapped(), SEG);
        let mut asked = None;
        assert!(heap.grow(|at| {
            asked = Some(at);
            true
        }));
        assert_eq!(asked, Some(e.region.wrapping_add(SEG)));
        assert_eq!(heap.mapped(), 2 * SEG);
        // A span free: the next growth adds nothing.
        assert!(heap.grow(|_| unreachable!("a span is free")));
        let (p, zero) = heap.alloc(k, &e).unwrap();
        assert!(zero);
        // The new segment's first span is its metadata: blocks after it.
        assert_eq!(p, e.region.wrapping_add(SEG + SPAN));
        assert!(heap.contains(p));
        // SAFETY: live blocks of either segment, each freed once; their
        // metadata entries are each segment's own.
        unsafe {
            p.write(9);
            heap.free(p, 3, &e);
            heap.free(first[1], 4, &e);
        }
        assert_eq!(heap.alloc(k, &e), Some((first[1], false)));
        assert_eq!(heap.alloc(k, &e), Some((p, false)));
        // SAFETY: a live block of the heap.
        assert_eq!(unsafe { p.read() }, 9);
        assert_eq!(heap.decay(10, None, &e), 0);
        // Under Miri the test's own heap is freed with it.
        for q in first.into_iter().chain([p]) {
            // SAFETY: live, freed once.
            unsafe { heap.free(q, 5, &e) };
        }
        assert_eq!(heap.decay(10, None, &e), per_seg + 1);
    }

    /// A block's byte pattern.
    fn tag(p: *mut u8) -> u8 {
        (p.addr() >> 6) as u8 | 1
    }

    /// The offsets of a block of `size` bytes at `p` worth reading: every
    /// byte natively; under Miri its ends and both sides of each page
    /// boundary (where neighbours meet).
    fn probe(p: *mut u8, size: usize) -> impl Iterator<Item = usize> {
        let a = p.addr();
        let edges = ((a + 1).next_multiple_of(PAGE)..a + size)
            .step_by(PAGE)
            .flat_map(move |b| [b - 1 - a, b - a]);
        let all = if cfg!(miri) { 0..0 } else { 0..size };
        all.chain([0, size - 1]).chain(edges)
    }

    #[test]
    fn random_operations_never_hand_out_a_block_twice() {
        let e = Test::new(4);
        e.budget.set(8 * class::size(12));
        let mut live: Vec<(*mut u8, usize)> = Vec::new();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let steps = if cfg!(miri) { 120 } else { 5000 };
        for now in 0..steps {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = [1, 5, 9, 12][(x % 4) as usize];
            match (x >> 8) % 8 {
                0..=3 => {
                    if let Some((p, zero)) = e.heap.alloc(k, &e) {
                        assert!(live.iter().all(|&(q, _)| q != p));
                        let size = class::size(k);
                        // SAFETY: a live block of `size` bytes.
                        unsafe {
                            if zero {
                                assert!(probe(p, size).all(|i| p.add(i).read() == 0));
                            }
                            p.write_bytes(tag(p), size);
                        }
                        live.push((p, k));
                    }
                }
                4..=6 if !live.is_empty() => {
                    let (p, k) = live.swap_remove((x >> 16) as usize % live.len());
                    assert_eq!(e.heap.block_size(p), class::size(k));
                    // SAFETY: live, freed once.
                    unsafe {
                        let t = tag(p);
                        assert!(probe(p, class::size(k)).all(|i| p.add(i).read() == t));
                        e.heap.free(p, now, &e);
                    }
                }
                _ => {
                    e.heap.decay(now, Some(20), &e);
                }
            }
            let (l, d, _) = e.heap.figures();
            assert_eq!(l, live.iter().map(|&(_, k)| class::size(k)).sum::<usize>());
            assert_eq!(d, e.reserved.get());
            assert!(d <= e.budget.get());
        }
    }
}
