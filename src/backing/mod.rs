//! Beneath MKL: the memory MKL draws on.
//!
//! MKL takes every byte it allocates, for the program (`MKL_malloc` & co.)
//! and for itself (BLAS threads' buffers, FFT descriptors, LAPACK
//! workspaces), through four function pointers, `i_malloc`, `i_calloc`,
//! `i_realloc` and `i_free` ([`ffi::i_malloc`] & co.), the C runtime's
//! functions by default. The crate's setup points them at the hooks below,
//! before MKL's first call wherever it can (an ELF constructor, or the
//! first allocation), and chains to the values it found there:
//!
//! - a request of [`MIN_CHUNK`] (1 MiB) or more is served by a **chunk**
//!   of the crate's: an anonymous mapping on a 2 MiB boundary (`map`),
//!   registered (`chunks`), advised onto huge pages from the huge-page
//!   threshold up ([`huge_pages`]), grown and shrunk with `mremap` (no
//!   copy), and kept in the [`block_cache`] when MKL frees it;
//! - everything else, and every block that is not a chunk (allocated by
//!   the C runtime, before the hooks or below the threshold), goes to the
//!   previous functions. Ownership is decided without reading memory
//!   outside the crate's chunks (`chunks`).
//!
//! Because the cache sits beneath MKL, MKL's statistics (`MKL_Mem_Stat`,
//! mkl-service's `mem_stat()`) count live blocks only, the cache counts
//! each chunk at its true size, and a chunk fresh from the kernel is known
//! to read zero (the allocator above then writes nothing for a zeroed
//! block: see [`last_chunk`]).
//!
//! **MKL first.** MKL copies the pointers at its first call (measured with
//! oneMKL 2026.2: set after one `MKL_malloc`, they were never called). If
//! MKL ran before the setup (another library called it first), the hooks
//! are never called: the crate's first large allocation that MKL serves
//! without a chunk shows it, and from then on
//! [`manager::stats`](crate::manager::stats)`().backing` says
//! [`Backing::MklRanFirst`]; MKL then runs on the C runtime's memory, as
//! without this crate, and the block cache and huge pages do not apply.
//! `MKL_ALLOC_BACKING=off` leaves the pointers alone.
//!
//! **Under Miri** the emulated MKL (src/ffi/miri.rs) takes its large
//! blocks through the same four pointers, as MKL does, so the hooks, the
//! registry and the cache run there too, on chunks of the emulated
//! machine's memory that are never resized in place (`map`).
//!
//! **Rules for code in here.** The hooks run inside MKL's calls, under
//! MKL's locks: they never allocate through the global allocator (which
//! may be this crate), never call MKL, and hold a block-cache shard lock
//! only while copying slots (no system call under it).

// Under loom only the block cache's shards are modelled: the hooks are
// never installed.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

pub mod block_cache;
mod budget;
mod chunks;
pub mod huge_pages;
mod map;
pub(crate) mod zeroing;

use core::cell::Cell;
use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering::Relaxed};

pub(crate) use budget::default_budget;
pub(crate) use map::PAGE;

use crate::ffi;

/// Requests of at least this many bytes (as MKL passes them to `i_malloc`:
/// the caller's size plus MKL's header and alignment) are chunks of the
/// crate's: 1 MiB, the block cache's [`MIN_BLOCK`](block_cache::MIN_BLOCK).
/// Below it the C runtime's heap keeps freed memory for reuse itself.
pub const MIN_CHUNK: usize = block_cache::MIN_BLOCK;

/// Whether MKL allocates from the crate's memory (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// The setup has not run yet.
    Unset,
    /// MKL's memory pointers are the crate's: chunks, the block cache and
    /// huge pages serve MKL's large allocations.
    Active,
    /// MKL had been called before the setup set its pointers: it keeps the
    /// C runtime's functions, and none of the crate's policies apply.
    MklRanFirst,
    /// `MKL_ALLOC_BACKING=off`: MKL runs on the C runtime's memory.
    Off,
}

static STATE: AtomicU8 = AtomicU8::new(0);

impl Backing {
    fn from_u8(v: u8) -> Backing {
        match v {
            1 => Backing::Active,
            2 => Backing::MklRanFirst,
            3 => Backing::Off,
            _ => Backing::Unset,
        }
    }
}

/// The backing's state in this process.
///
/// ```
/// use mkl_alloc::{backing, manager};
///
/// manager::init();
/// let b = backing::state();
/// assert_ne!(b, backing::Backing::Unset);
/// assert_eq!(manager::stats().backing, b);
/// ```
pub fn state() -> Backing {
    Backing::from_u8(STATE.load(Relaxed))
}

/// The previous functions, as the setup found them (the C runtime's by
/// default); null until then. Kept as pointers, not addresses, so that
/// the function pointers made from them keep their provenance (Miri, with
/// strict provenance, calls nothing made from an integer).
static PREV_MALLOC: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
static PREV_CALLOC: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
static PREV_REALLOC: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
static PREV_FREE: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
/// Whether the previous functions are the C library's own (then
/// `malloc_usable_size` knows their blocks).
static PREV_IS_LIBC: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The chunk the last hook call of this thread served, and whether it
    /// was fresh from the kernel (see [`last_chunk`]).
    static LAST: Cell<(usize, bool)> = const { Cell::new((0, false)) };
}

/// Whether any chunk was ever served: MKL calls the hooks.
static SERVED: AtomicBool = AtomicBool::new(false);

/// Called by the allocator above when MKL served a request of `size`
/// bytes without a chunk: if no chunk was ever served and the request was
/// one for a chunk, MKL never calls the hooks (it ran before the setup).
#[cold]
pub(crate) fn note_unserved(size: usize) {
    if size >= MIN_CHUNK && !SERVED.load(Relaxed) && STATE.load(Relaxed) == 1 {
        STATE.store(2, Relaxed);
    }
}

/// Forgets which chunk this thread's last MKL allocation used: the
/// allocator above calls it before an `MKL_malloc` whose answer it needs.
#[inline]
pub(crate) fn clear_last() {
    LAST.with(|c| c.set((0, false)));
}

/// The chunk (its address) that served this thread's MKL allocations
/// since [`clear_last`], and whether it came fresh from the kernel (its
/// pages then read as zero): `None` if MKL took the C runtime's memory.
#[inline]
pub(crate) fn last_chunk() -> Option<(usize, bool)> {
    let (addr, fresh) = LAST.with(Cell::get);
    (addr != 0).then_some((addr, fresh))
}

/// Points MKL's memory functions at the hooks, once. Runs in the crate's
/// setup, before any MKL call the setup makes.
pub(crate) fn install() {
    if STATE.load(Relaxed) != 0 {
        return;
    }
    const WARNING: &[u8] =
        b"mkl-alloc: MKL_ALLOC_BACKING must be off or on; MKL keeps the default (on)\n";
    if crate::env::read(c"MKL_ALLOC_BACKING", 1, WARNING).is_none() {
        STATE.store(3, Relaxed);
        return;
    }
    // SAFETY: MKL's pointers are plain data that MKL reads at its first
    // call; racing setups both write the same values (the previous ones
    // are read first, and a hook is never its own previous function:
    // the check below). Each previous value is the C runtime's function
    // or one that other code installed, with the same contract.
    unsafe {
        let m = ffi::i_malloc.unwrap_or(libc::malloc);
        if m as usize == hook_malloc as crate::ffi::IMalloc as usize {
            return;
        }
        PREV_MALLOC.store(m as *mut (), Relaxed);
        PREV_CALLOC.store(ffi::i_calloc.unwrap_or(libc::calloc) as *mut (), Relaxed);
        PREV_REALLOC.store(ffi::i_realloc.unwrap_or(libc::realloc) as *mut (), Relaxed);
        PREV_FREE.store(ffi::i_free.unwrap_or(libc::free) as *mut (), Relaxed);
        PREV_IS_LIBC.store(
            ffi::i_realloc
                .is_none_or(|f| f as usize == libc::realloc as crate::ffi::IRealloc as usize)
                && ffi::i_free
                    .is_none_or(|f| f as usize == libc::free as crate::ffi::IFree as usize),
            Relaxed,
        );
        ffi::i_malloc = Some(hook_malloc);
        ffi::i_calloc = Some(hook_calloc);
        ffi::i_realloc = Some(hook_realloc);
        ffi::i_free = Some(hook_free);
    }
    // Whether MKL takes them shows at the first large allocation (see
    // `note_unserved`): a probe here would be an MKL allocation, after
    // which MKL refuses `MKL_Disable_Fast_MM`.
    STATE.store(1, Relaxed);
}

// The previous functions. Each is called only after `install` stored it
// (the hooks are set after the stores).

#[inline(always)]
unsafe fn prev_malloc(n: usize) -> *mut c_void {
    // SAFETY: an `i_malloc`-compatible function stored by `install`.
    unsafe { core::mem::transmute::<*mut (), crate::ffi::IMalloc>(PREV_MALLOC.load(Relaxed))(n) }
}
#[inline(always)]
unsafe fn prev_calloc(a: usize, b: usize) -> *mut c_void {
    // SAFETY: as in prev_malloc.
    unsafe { core::mem::transmute::<*mut (), crate::ffi::ICalloc>(PREV_CALLOC.load(Relaxed))(a, b) }
}
#[inline(always)]
unsafe fn prev_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: as in prev_malloc.
    unsafe {
        core::mem::transmute::<*mut (), crate::ffi::IRealloc>(PREV_REALLOC.load(Relaxed))(p, n)
    }
}
#[inline(always)]
unsafe fn prev_free(p: *mut c_void) {
    // SAFETY: as in prev_malloc.
    unsafe { core::mem::transmute::<*mut (), crate::ffi::IFree>(PREV_FREE.load(Relaxed))(p) }
}

/// Runs `f`; if it fails (null) while the cache holds memory, empties the
/// cache and runs it once more: memory kept for reuse must never be why an
/// allocation fails.
#[inline(always)]
fn retry(mut f: impl FnMut() -> *mut c_void) -> *mut c_void {
    let p = f();
    if p.is_null() && block_cache::cached_bytes() != 0 {
        block_cache::empty();
        return f();
    }
    p
}

/// `i_malloc`.
unsafe extern "C" fn hook_malloc(n: usize) -> *mut c_void {
    if n >= MIN_CHUNK {
        let p = new_chunk(n);
        if !p.is_null() {
            return p.cast();
        }
    }
    // SAFETY: the previous function's contract is malloc's.
    retry(|| unsafe { prev_malloc(n) })
}

/// `i_calloc` (MKL's own `MKL_calloc` does not call it, but MKL's internals
/// may).
unsafe extern "C" fn hook_calloc(num: usize, size: usize) -> *mut c_void {
    let Some(n) = num.checked_mul(size) else {
        return ptr::null_mut();
    };
    if n >= MIN_CHUNK {
        let p = new_chunk(n);
        if !p.is_null() {
            if !LAST.with(Cell::get).1 {
                // SAFETY: a chunk of at least n bytes just handed to us.
                unsafe { zeroing::zero(p, n, PAGE) };
            }
            return p.cast();
        }
    }
    // SAFETY: calloc's contract.
    retry(|| unsafe { prev_calloc(num, size) })
}

/// `i_free`.
unsafe extern "C" fn hook_free(p: *mut c_void) {
    let addr = p as usize;
    if chunks::may_be_chunk(addr) {
        if let Some(size) = chunks::remove(addr) {
            // SAFETY: MKL frees the chunk: nothing uses it any more.
            unsafe { release(p.cast(), size) };
            return;
        }
    }
    block_cache::tick();
    // SAFETY: not a chunk: a block of the previous functions, freed once.
    unsafe { prev_free(p) }
}

/// `i_realloc`.
unsafe extern "C" fn hook_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { hook_malloc(n) };
    }
    let addr = p as usize;
    if chunks::may_be_chunk(addr) {
        if let Some(old) = chunks::size_of(addr) {
            // SAFETY: a live chunk of `old` bytes that MKL resizes.
            let q = unsafe { resize_chunk(p.cast(), old, n) };
            if !q.is_null() {
                LAST.with(|c| c.set((q as usize, false)));
            }
            return q.cast();
        }
    }
    if n >= MIN_CHUNK && PREV_IS_LIBC.load(Relaxed) {
        // A block of the C runtime's growing into a chunk's size (a Vec
        // pushed past 1 MiB): moved into a chunk once, so that from here on
        // it grows with mremap, on huge pages, and is cached when freed.
        // SAFETY: `p` is a live block of the C library's malloc (the
        // previous functions are libc's own), which knows its usable size.
        let usable = unsafe { libc::malloc_usable_size(p) };
        let q = new_chunk(n);
        if !q.is_null() {
            // SAFETY: distinct live blocks; `p` holds `usable` readable
            // bytes, `q` at least `n`; `p` is freed once, after the copy.
            unsafe {
                ptr::copy_nonoverlapping(p.cast::<u8>(), q, usable.min(n));
                prev_free(p);
            }
            return q.cast();
        }
    }
    // SAFETY: a block of the previous functions; realloc's contract.
    retry(|| unsafe { prev_realloc(p, n) })
}

/// A chunk for a request of `n >= MIN_CHUNK` bytes: a cached one of
/// `n ..= n + n/8` bytes, else a fresh mapping; null if neither can be
/// had. Records it in [`LAST`].
fn new_chunk(n: usize) -> *mut u8 {
    let Some(size) = map::round(n) else {
        return ptr::null_mut();
    };
    let (mut p, mut got, mut fresh) = (ptr::null_mut(), size, false);
    if block_cache::covers(size) {
        (p, got) = block_cache::take(size);
    }
    if p.is_null() {
        p = map::map(size);
        if p.is_null() && block_cache::cached_bytes() != 0 {
            block_cache::empty();
            p = map::map(size);
        }
        if p.is_null() {
            return p;
        }
        (got, fresh) = (size, true);
    }
    if huge_pages::applies(got) {
        // SAFETY: the whole chunk is ours (a cached one may have been
        // cached while the policy was off: advising again is one call).
        unsafe { huge_pages::advise_chunk(p, got) };
    }
    if !chunks::insert(p as usize, got) {
        // SAFETY: unregistered, so no one else knows of it.
        unsafe { map::unmap(p, got) };
        return ptr::null_mut();
    }
    LAST.with(|c| c.set((p as usize, fresh)));
    if !SERVED.load(Relaxed) {
        SERVED.store(true, Relaxed);
    }
    p
}

/// A chunk MKL freed (already out of the registry): into the cache, or
/// back to the kernel.
///
/// # Safety
/// `[p, p + size)` is a chunk nothing uses any more.
unsafe fn release(p: *mut u8, size: usize) {
    // SAFETY: the caller's contract: ours to keep or unmap.
    if !(block_cache::covers(size) && unsafe { block_cache::give(p, size) }) {
        // SAFETY: as above.
        unsafe { map::unmap(p, size) };
    }
}

/// The chunk `p` of `old` bytes resized for a request of `n` bytes: in
/// place where the address space allows, else moved (page tables, not
/// bytes) onto a cached chunk, whose pages are already there, or onto a
/// fresh mapping. Null on failure, the chunk then as it was.
///
/// # Safety
/// `p` is a live chunk of `old` bytes.
unsafe fn resize_chunk(p: *mut u8, old: usize, n: usize) -> *mut u8 {
    let Some(new) = map::round(n.max(1)) else {
        return ptr::null_mut();
    };
    if new <= old {
        // A shrink by a quarter or more gives the tail back; milder ones
        // keep the chunk whole (a Vec trimming its last doubling's slack).
        // SAFETY: `[p, p + old)` is the live chunk.
        if new <= old - old / 4 && unsafe { map::resize_in_place(p, old, new) } {
            chunks::resize(p as usize, new);
        }
        return p;
    }
    let advise = huge_pages::applies(new);
    // SAFETY: the live chunk; a failed growth changes nothing.
    if unsafe { map::resize_in_place(p, old, new) } {
        chunks::resize(p as usize, new);
        if advise {
            // SAFETY: the whole grown chunk is ours.
            unsafe { huge_pages::advise_chunk(p, new) };
        }
        return p;
    }
    // Moved: onto a cached chunk, whose pages (faulted in already) past
    // `old` become the growth, or onto a fresh mapping. The target is
    // registered first, so that a full table costs nothing but a refusal.
    let (mut target, mut size) = if block_cache::covers(new) {
        block_cache::take(new)
    } else {
        (ptr::null_mut(), 0)
    };
    let cached = !target.is_null();
    if !cached {
        (target, size) = (map::map(new), new);
        if target.is_null() {
            return target;
        }
    }
    if !chunks::insert(target as usize, size) {
        // SAFETY: unregistered and unused.
        unsafe { release(target, size) };
        return ptr::null_mut();
    }
    chunks::remove(p as usize);
    // A cached target keeps its own pages past `old`; a fresh one grows
    // the moved mapping to `new` (zero-filled past `old`). `mremap` moves
    // one mapping only: a chunk made of two (one grown onto a cached
    // chunk before) is copied instead, onto the target's resident pages.
    let len = if cached { old } else { new };
    // SAFETY: `target` is ours and unused; p is the live chunk, moved
    // whole on success and untouched on failure.
    if unsafe { map::move_onto(p, old, len, target) }.is_null() {
        // SAFETY: both are ours, distinct, and hold at least `old` bytes;
        // the old chunk is unmapped once copied.
        unsafe {
            ptr::copy_nonoverlapping(p, target, old);
            map::unmap(p, old);
        }
    }
    if advise {
        // SAFETY: the whole chunk at `target` is ours.
        unsafe { huge_pages::advise_chunk(target, size) };
    }
    target
}
