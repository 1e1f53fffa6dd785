//! The four hooks MKL calls (`i_malloc` & co.), and the chunk logic
//! behind them: chunks are anonymous mappings on Linux, `VirtualAlloc`ed
//! regions on Windows (`map`), where MKL's pointers are the exports of
//! `libimalloc.dll` (`set_mkl_pointers`). Requests from 4 KiB up to a
//! chunk's size are medium blocks (`medium`), where there is a region. The
//! rules of the parent module apply: nothing here allocates through the
//! global allocator or calls MKL.

use core::cell::Cell;
use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering::Relaxed};

use super::{
    LAST, MIN_CHUNK, SERVED, STATE, block_cache, chunks, decay, heap_trim, huge_pages, map, medium,
    slack, zeroing,
};
use crate::ffi;

/// The previous functions, as the setup found them (the C runtime's by
/// default); null until then. Kept as pointers, not addresses, so that
/// the function pointers made from them keep their provenance (Miri, with
/// strict provenance, calls nothing made from an integer).
static PREV_MALLOC: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
static PREV_CALLOC: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
static PREV_REALLOC: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
static PREV_FREE: AtomicPtr<()> = AtomicPtr::new(ptr::null_mut());
/// Whether the previous functions are the C library's own (then
/// `malloc_usable_size` knows their blocks); Linux's.
#[cfg(not(windows))]
static PREV_IS_LIBC: AtomicBool = AtomicBool::new(false);
/// Whether the previous functions are the process heap's (then
/// `HeapSize` knows their blocks); Windows'.
#[cfg(windows)]
static PREV_IS_HEAP: AtomicBool = AtomicBool::new(false);

/// Whether the functions beneath MKL (the hooks' previous ones, or MKL's
/// own where the hooks are not in) are the C library's (Linux).
#[cfg(not(windows))]
pub(super) fn prev_is_libc() -> bool {
    PREV_IS_LIBC.load(Relaxed)
}

/// Points MKL's memory functions at the hooks, once. Runs in the crate's
/// setup, before any MKL call the setup makes.
pub(super) fn install() {
    // One thread installs (racing first calls of the setup are possible
    // where no ELF constructor ran): MKL's pointers are plain data.
    static CLAIMED: AtomicBool = AtomicBool::new(false);
    if CLAIMED.swap(true, Relaxed) {
        return;
    }
    // What MKL's pointers hold before the hooks (the C library's functions
    // unless other code set its own), for the zeroing of MKL's blocks that
    // are not chunks: read whether or not the hooks go in.
    #[cfg(not(windows))]
    // SAFETY: MKL's pointers are plain data, written by no other thread
    // (CLAIMED); only their values are compared.
    unsafe {
        PREV_IS_LIBC.store(
            ffi::i_realloc
                .is_none_or(|f| f as usize == libc::realloc as crate::ffi::IRealloc as usize)
                && ffi::i_free
                    .is_none_or(|f| f as usize == libc::free as crate::ffi::IFree as usize),
            Relaxed,
        );
    }
    {
        const WARNING: &[u8] =
            b"mkl-alloc: MKL_ALLOC_BACKING must be off or on; MKL keeps the default (on)\n";
        if !crate::env::read_switch(c"MKL_ALLOC_BACKING", WARNING) {
            STATE.store(3, Relaxed);
            return;
        }
        const MEDIUM_WARNING: &[u8] =
            b"mkl-alloc: MKL_ALLOC_MEDIUM must be off or on; medium blocks keep the default (on)\n";
        if !crate::env::read_switch(c"MKL_ALLOC_MEDIUM", MEDIUM_WARNING) {
            medium::turn_off();
        }
        // SAFETY: MKL's pointers are plain data that MKL reads at its first
        // call, and only this thread writes them (CLAIMED).
        match unsafe { set_mkl_pointers() } {
            Set::Done => {}
            Set::Already => return,
            Set::Missing => {
                STATE.store(3, Relaxed);
                return;
            }
        }
        // Whether MKL takes them shows at the first large allocation (see
        // `note_unserved`): a probe here would be an MKL allocation, after
        // which MKL refuses `MKL_Disable_Fast_MM`.
        STATE.store(1, Relaxed);
    }
}

/// What `set_mkl_pointers` did.
enum Set {
    /// MKL's pointers are the hooks now.
    Done,
    /// They were the hooks already: nothing changed.
    Already,
    /// There are no pointers to set (Windows without `libimalloc.dll`).
    #[cfg_attr(not(windows), allow(dead_code))]
    Missing,
}

/// Points MKL's four pointers at the hooks, keeping what they held as the
/// previous functions (the C runtime's by default): Linux, where they are
/// data symbols of MKL's.
///
/// # Safety
/// No other thread writes MKL's pointers, and MKL has not read them yet
/// (or reads the previous values: then the hooks are never called).
#[cfg(not(windows))]
unsafe fn set_mkl_pointers() -> Set {
    // libmkl_rt loads libmkl_core at its first call, and the core
    // takes `i_malloc` & co. from the first library in the global
    // scope that defines them. A Python extension (loaded with
    // RTLD_LOCAL) brings libmkl_rt in locally, so the core would bind
    // its own, untouched copies (measured: no chunk served). Promoting
    // the already-loaded libmkl_rt to the global scope, before any MKL
    // call, makes the core bind the ones set below.
    #[cfg(all(feature = "mkl-rt", target_os = "linux", not(miri)))]
    // SAFETY: RTLD_NOLOAD loads nothing: it returns the library if it
    // is loaded (it is, the crate links it) and only widens its scope;
    // the handle is kept for the process's life.
    unsafe {
        libc::dlopen(
            c"libmkl_rt.so.3".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_GLOBAL | libc::RTLD_LAZY,
        );
    }
    // SAFETY: the caller's contract; the previous values are read first,
    // and a hook is never its own previous function (the check below).
    // Each previous value is the C runtime's function or one that other
    // code installed, with the same contract.
    unsafe {
        let m = ffi::i_malloc.unwrap_or(libc::malloc);
        if m as usize == hook_malloc as crate::ffi::IMalloc as usize {
            return Set::Already;
        }
        PREV_MALLOC.store(m as *mut (), Relaxed);
        PREV_CALLOC.store(ffi::i_calloc.unwrap_or(libc::calloc) as *mut (), Relaxed);
        PREV_REALLOC.store(ffi::i_realloc.unwrap_or(libc::realloc) as *mut (), Relaxed);
        PREV_FREE.store(ffi::i_free.unwrap_or(libc::free) as *mut (), Relaxed);
        ffi::i_malloc = Some(hook_malloc);
        ffi::i_calloc = Some(hook_calloc);
        ffi::i_realloc = Some(hook_realloc);
        ffi::i_free = Some(hook_free);
    }
    Set::Done
}

/// Windows: MKL's DLLs read the pointers exported by `libimalloc.dll`
/// (see `ffi::IMALLOC_DLL`). If all four hold functions (set by other code
/// before), those are the previous ones; otherwise (null, as in the
/// build's data-only DLL and the `mkl` wheel's) the process heap's, whose
/// blocks `HeapSize` measures (`PREV_IS_HEAP`); no C runtime's `malloc` is
/// known to be beneath either, so there is no `PREV_IS_LIBC` here.
///
/// # Safety
/// As on Linux.
#[cfg(windows)]
unsafe fn set_mkl_pointers() -> Set {
    let Some(slots) = crate::sys::mkl_memory_slots() else {
        return Set::Missing;
    };
    let hooks: [*mut c_void; 4] = [
        hook_malloc as ffi::IMalloc as *mut c_void,
        hook_calloc as ffi::ICalloc as *mut c_void,
        hook_realloc as ffi::IRealloc as *mut c_void,
        hook_free as ffi::IFree as *mut c_void,
    ];
    let heap: [*mut c_void; 4] = [
        crate::sys::heap_malloc as ffi::IMalloc as *mut c_void,
        crate::sys::heap_calloc as ffi::ICalloc as *mut c_void,
        crate::sys::heap_realloc as ffi::IRealloc as *mut c_void,
        crate::sys::heap_free as ffi::IFree as *mut c_void,
    ];
    // SAFETY: each slot is an exported pointer-sized variable of a module
    // loaded for good (mkl_memory_slots), written by no other thread (the
    // caller's contract); a non-null value there is an `i_malloc`-family
    // function of the same contract.
    unsafe {
        let found = slots.map(|s| s.read());
        if found[0] == hooks[0] {
            return Set::Already;
        }
        let set = found.iter().all(|p| !p.is_null());
        let prev = if set { found } else { heap };
        PREV_IS_HEAP.store(!set, Relaxed);
        for (cell, p) in [&PREV_MALLOC, &PREV_CALLOC, &PREV_REALLOC, &PREV_FREE]
            .into_iter()
            .zip(prev)
        {
            cell.store(p.cast(), Relaxed);
        }
        for (slot, h) in slots.into_iter().zip(hooks) {
            slot.write(h);
        }
    }
    Set::Done
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

/// Whether a request of `n` bytes is served by a chunk: from [`MIN_CHUNK`]
/// while the block cache or the huge-page policy covers it; with both
/// off, from [`MIN_UNCACHED_CHUNK`] only, since an uncached chunk costs a
/// mapping per allocation (`mmap` and `munmap`: 5.6 µs for 1 MiB,
/// measured, against 40 ns for glibc's heap, which keeps such blocks up to
/// its 32 MiB mmap ceiling).
#[inline]
pub(super) fn chunk_for(n: usize) -> bool {
    n >= MIN_CHUNK && (n >= MIN_UNCACHED_CHUNK || block_cache::covers(n) || huge_pages::applies(n))
}

/// With the block cache off, requests of this many bytes and more (glibc's
/// largest mmap threshold, 32 MiB, above which it maps every block itself)
/// are chunks; smaller ones go to the C runtime.
pub(crate) const MIN_UNCACHED_CHUNK: usize = 32 << 20;

/// `i_malloc`.
unsafe extern "C" fn hook_malloc(n: usize) -> *mut c_void {
    if let Some((p, _)) = medium::alloc(n) {
        return p.cast();
    }
    if chunk_for(n) {
        let p = new_chunk(n, false);
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
    if let Some((p, zero)) = medium::alloc(n) {
        if !zero {
            // SAFETY: a dirty medium block of at least n bytes, ours.
            unsafe { p.write_bytes(0, n) };
        }
        return p.cast();
    }
    if chunk_for(n) {
        let p = new_chunk(n, false);
        if !p.is_null() {
            if !LAST.with(Cell::get).1 {
                // SAFETY: a chunk of at least n bytes just handed to us.
                unsafe { zeroing::zero(p, n, zeroing::chunk_granule(n)) };
            }
            return p.cast();
        }
    }
    // SAFETY: calloc's contract.
    retry(|| unsafe { prev_calloc(num, size) })
}

/// `i_free`.
unsafe extern "C" fn hook_free(p: *mut c_void) {
    if medium::contains(p.cast()) {
        // SAFETY: a medium block (the region holds nothing else that MKL
        // could free), freed once.
        unsafe { medium::free(p.cast()) };
        decay::tick();
        return;
    }
    let addr = p as usize;
    if chunks::may_be_chunk(addr) {
        if let Some(c) = chunks::remove_record(addr) {
            slack::change(slack::of(c), 0);
            // SAFETY: MKL frees the chunk: nothing uses it any more.
            unsafe { release(p.cast(), c) };
            return;
        }
    }
    decay::tick();
    // SAFETY: not a chunk: a block of the previous functions, freed once.
    unsafe { prev_free(p) }
}

/// `i_realloc`.
unsafe extern "C" fn hook_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { hook_malloc(n) };
    }
    if medium::contains(p.cast()) {
        // SAFETY: a live medium block that MKL resizes.
        return unsafe { realloc_medium(p.cast(), n) };
    }
    let addr = p as usize;
    if chunks::may_be_chunk(addr) {
        if let Some(old) = chunks::lock(addr) {
            // SAFETY: a live chunk, as recorded, that MKL resizes; held
            // (resize_chunk releases or removes it on every path).
            let (q, chunk) = unsafe { resize_chunk(p.cast(), old, n) };
            if chunk {
                LAST.with(|c| c.set((q as usize, false)));
            }
            return q.cast();
        }
    }
    // A block of the C runtime's growing (or shrinking) into a medium size
    // (a `Vec` pushed past 4 KiB under `MklAllocator`, whose first blocks
    // MKL serves from below 4 KiB): moved onto a medium block once, so
    // that from here on it is the crate's, given back when freed, as every
    // MKL block of 4 KiB-1 MiB is. Left to `realloc` where medium blocks
    // are off or full.
    if medium::class_size(n).is_some() {
        // SAFETY: `p` is a live block of the previous functions.
        if let Some(usable) = unsafe { prev_usable_size(p) } {
            if let Some((q, _)) = medium::alloc(n) {
                // SAFETY: distinct live blocks; `p` holds `usable` readable
                // bytes, `q` at least `n`; `p` is freed once, after the copy.
                unsafe {
                    ptr::copy_nonoverlapping(p.cast::<u8>(), q, usable.min(n));
                    prev_free(p);
                }
                return q.cast();
            }
        }
    }
    // With neither policy on, the C library grows a block with `mremap`
    // itself (from its mmap threshold up), and a move would only copy it
    // onto fresh pages (measured: a push to 10^7 with everything off took
    // 1.5x System's time with the move).
    let usable = if chunk_for(n) && (block_cache::covers(n) || huge_pages::applies(n)) {
        // SAFETY: `p` is a live block of the previous functions.
        unsafe { prev_usable_size(p) }
    } else {
        None
    };
    if let Some(usable) = usable {
        // A block of the C runtime's growing into a chunk's size (a Vec
        // pushed past 1 MiB): moved into a chunk once, so that from here on
        // it grows in place where it can, on huge pages, and is cached
        // when freed. A growth, so it may take a cached chunk with room
        // to grow in, as a chunk's growth does (see `grow_chunk`).
        let q = new_chunk(n, true);
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

/// The live medium block `p` resized for a request of `n` bytes: the same
/// block where `n` takes its class; otherwise a new block (medium, a chunk,
/// or the previous functions'), `min(block size, n)` bytes copied and `p`
/// freed. Null on failure, `p` then untouched.
///
/// # Safety
/// `p` is a live medium block.
#[cold]
unsafe fn realloc_medium(p: *mut u8, n: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    let have = unsafe { medium::block_size(p) };
    if medium::class_size(n) == Some(have) {
        return p.cast();
    }
    let mut q = ptr::null_mut();
    if chunk_for(n) {
        q = new_chunk(n, true);
    } else if let Some((m, _)) = medium::alloc(n) {
        q = m;
    }
    if q.is_null() {
        // SAFETY: malloc's contract.
        q = retry(|| unsafe { prev_malloc(n) }).cast();
        if q.is_null() {
            return q.cast();
        }
    }
    // SAFETY: distinct live blocks: `p` holds `have` bytes, `q` at least
    // `n`; `p` is freed once, after the copy.
    unsafe {
        ptr::copy_nonoverlapping(p, q, have.min(n));
        medium::free(p);
    }
    q.cast()
}

/// Gives back the slack of live chunks (their tails past what MKL last
/// asked for), chunk by chunk, while the cache and the slack together hold
/// more than `limit` bytes: the budget lowered below what they hold, or
/// every buffer freed (`limit` 0). A chunk its owner holds (in a resize or
/// a free) is skipped: a trim never waits (see `chunks`). Run under the
/// rare-call lock, so that no fork copies a chunk held by it.
pub(crate) fn trim_slack(limit: usize) {
    // Under Miri no tail can be given back (`map::trim_tail` is false
    // there), and the scan of the table's 65,536 slots, interpreted, cost
    // minutes of the Miri runs' time.
    if cfg!(miri) || slack::bytes() == 0 {
        return;
    }
    chunks::for_each_unheld(|addr, c| {
        let over = block_cache::cached_bytes() + slack::bytes() > limit;
        // SAFETY: the chunk is live and held here: no growth within it,
        // and no free, runs until it is released with the record returned.
        if over && c.size > c.asked && unsafe { map::trim_tail(addr as *mut u8, c.size, c.asked) } {
            slack::change(slack::of(c), 0);
            return chunks::Chunk { size: c.asked, ..c };
        }
        c
    });
}

/// The usable size of `p`, a live block of the previous functions, where
/// they can tell it: glibc's `malloc_usable_size` when they are the C
/// library's own, `HeapSize` on Windows when they are the process heap's.
///
/// # Safety
/// `p` is a live block of the previous functions.
#[inline]
unsafe fn prev_usable_size(p: *mut c_void) -> Option<usize> {
    #[cfg(not(windows))]
    {
        // SAFETY: the caller's contract; with PREV_IS_LIBC the previous
        // functions are libc's own, whose blocks it measures.
        PREV_IS_LIBC
            .load(Relaxed)
            .then(|| unsafe { libc::malloc_usable_size(p) })
    }
    #[cfg(windows)]
    {
        if !PREV_IS_HEAP.load(Relaxed) {
            return None;
        }
        // SAFETY: the caller's contract; with PREV_IS_HEAP the previous
        // functions are the process heap's.
        unsafe { crate::sys::heap_size(p) }
    }
}

/// A chunk for a request of `n >= MIN_CHUNK` bytes: a cached one of
/// `n ..= n + n/8` bytes (up to [`GROWTH_SLACK`](block_cache::GROWTH_SLACK)
/// times `n` for a block `growing` into a chunk, which then grows in place
/// on pages already resident rather than on fresh ones), else a fresh
/// mapping; null if neither can be had. Records it in [`LAST`].
fn new_chunk(n: usize, growing: bool) -> *mut u8 {
    let Some(size) = map::round(n) else {
        return ptr::null_mut();
    };
    let (mut p, mut got, mut fresh, mut split) = (ptr::null_mut(), size, false, false);
    // Bytes the cache already gave up for this request.
    let mut evicted = 0;
    if block_cache::covers(size) {
        decay::point();
        (p, got, split) = if growing {
            block_cache::take_for_growth(size)
        } else {
            block_cache::take(size)
        };
        // No chunk fits: cached memory serves the request all the same,
        // a larger chunk cut down or a smaller one grown, before any is
        // mapped beside the cache (issue 54: see `block_cache`, "Peak").
        if p.is_null() {
            (p, got, split) = block_cache::take_cut(size, growth_keep(size, growing));
        }
        if p.is_null() {
            let (q, carried) = block_cache::take_grown(size);
            if q.is_null() {
                evicted = carried;
            } else {
                (p, got) = (q, size);
                // Its growth is new memory: the cache makes room for it.
                make_room(size - carried);
            }
        }
    }
    if p.is_null() {
        (p, got) = fresh_chunk(size);
        if p.is_null() {
            return p;
        }
        fresh = true;
        make_room(got.saturating_sub(evicted));
    }
    if huge_pages::applies(got) {
        if fresh {
            // MKL writes its header at the chunk's start, then the caller
            // its data from 64 bytes on. Faulted in now, before the advice,
            // that first page is a 4 KiB page: an untouched zeroed buffer
            // stays 4 KiB resident, not a whole 2 MiB huge page (measured:
            // +2 MiB and 0.28 ms for an untouched `vec![0.0; 1 << 26]`).
            // The frame stays on small pages; the rest is huge.
            // SAFETY: the first byte of a fresh private mapping of ours;
            // writing 0 keeps it reading as zero.
            unsafe { p.write_volatile(0) };
        }
        // SAFETY: the whole chunk is ours (a cached one may have been
        // cached while the policy was off: advising again is one call).
        unsafe { huge_pages::advise_chunk(p, got) };
    }
    // SAFETY: the chunk is ours alone, not yet registered.
    got = unsafe { keep_slack(p, got, size, !fresh) };
    let record = chunks::Chunk {
        split,
        ..chunks::Chunk::new(got, size)
    };
    if !chunks::insert(p as usize, record) {
        slack::change(got - size, 0);
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

/// What to keep of a larger cached chunk taken for `size` bytes
/// (`block_cache::take_cut`): `size` for a new block; for a growth the
/// whole chunk, as slack it grows into on pages the cache kept. Cut down
/// to a multiple of `size`, a growth outgrew its piece and moved, a split
/// chunk, by copying: a `Vec<f64>` pushed to 10^7 a second time, its
/// first push's 128 MiB chunk cached, took 90 ms cut at 8 times, 22 ms
/// before any cut and with the chunk taken whole (2-core AMD EPYC VM).
/// The slack is reserved under the budget like any growth's (trimmed off
/// where it does not fit: `keep_slack`) and leaves with the chunk.
fn growth_keep(size: usize, growing: bool) -> usize {
    if growing { usize::MAX } else { size }
}

/// The size to keep of a chunk of `got` bytes about to serve `size`:
/// its slack (`got - size`) counted under the cache's budget. Slack from the
/// cache (`from_cache`: a larger cached chunk, or one within the fit's
/// eighth) is reserved by the budget's compare-and-swap and, where it does
/// not fit, trimmed off (`got` becomes `size`): so the cache and the slack
/// together never exceed the budget, whatever other threads free at the
/// same time (issue 41). Slack of a fresh mapping (the system's rounding
/// to large pages) and a tail the kernel would not trim are counted
/// anyway.
///
/// # Safety
/// `[p, p + got)` is a chunk of the crate's that nothing else uses yet.
unsafe fn keep_slack(p: *mut u8, got: usize, size: usize, from_cache: bool) -> usize {
    let extra = got - size;
    if extra == 0 || (from_cache && slack::try_add(extra)) {
        return got;
    }
    // SAFETY: the caller's contract; a shrink unmaps only the chunk's tail.
    if from_cache && unsafe { map::resize_in_place(p, got, size) } {
        return size;
    }
    slack::change(0, extra);
    got
}

/// `bytes` of new memory mapped for a chunk: the block cache gives back
/// as much (caching never raises the peak), and the C runtime's heap its
/// free pages (`heap_trim`, at most 1 % of the time), so that neither
/// store's free memory sits resident beside the new.
fn make_room(bytes: usize) {
    block_cache::evict_for(bytes);
    heap_trim::before_fresh_memory();
}

/// A fresh mapping for a chunk of `size` bytes and its true size: on
/// large pages where the huge-page policy applies and the system gives
/// them (Windows: `map::map_large`, rounded up to whole large pages), else
/// an ordinary one ([`map_evicting`]); null if none can be had.
fn fresh_chunk(size: usize) -> (*mut u8, usize) {
    if huge_pages::applies(size) {
        let (p, got) = map::map_large(size);
        if !p.is_null() {
            return (p, got);
        }
    }
    (map_evicting(size), size)
}

/// A fresh mapping of `size` bytes; where it is refused (the crate's
/// share of the kernel's mapping limit is taken, or memory is short)
/// while the cache holds chunks, cached chunks are unmapped one at a time,
/// the largest first, until it is not: one slot at the limit costs one
/// cached chunk, not the whole cache (issue 41). Null if none can be had.
fn map_evicting(size: usize) -> *mut u8 {
    let mut p = map::map(size);
    while p.is_null() && block_cache::evict_one() {
        p = map::map(size);
    }
    p
}

/// A chunk MKL freed (already out of the registry, `c` its record): into
/// the cache, or back to the kernel.
///
/// # Safety
/// `[p, p + c.size)` is a chunk nothing uses any more.
unsafe fn release(p: *mut u8, c: chunks::Chunk) {
    let cached = block_cache::covers(c.size) && {
        decay::point();
        // SAFETY: the caller's contract: ours to keep or unmap.
        unsafe { block_cache::give(p, c.size, c.split) }
    };
    if !cached {
        // SAFETY: as above.
        unsafe { map::unmap(p, c.size) };
    }
}

/// The chunk `p` (`c`: its record) resized for a request of `n` bytes,
/// and whether the block returned is a chunk: within its size where it
/// fits, else in place where the address space allows, else moved (page
/// tables, not bytes) onto a cached chunk, whose pages are already there,
/// or onto a fresh mapping. Where no chunk can be had for it (the chunk
/// table's window is full, or the kernel refuses a mapping: its
/// `vm.max_map_count`), the block is copied into one of the previous
/// functions, as a new allocation would have been: a full table never
/// fails a growth that memory can serve. Null on failure, the chunk then
/// as it was.
///
/// # Safety
/// `p` is a live chunk recorded as `c`.
unsafe fn resize_chunk(p: *mut u8, c: chunks::Chunk, n: usize) -> (*mut u8, bool) {
    let Some(new) = map::round(n.max(1)) else {
        return (ptr::null_mut(), false);
    };
    let old = c.size;
    if new <= old {
        // A shrink (below what was asked before) by a quarter of the
        // chunk or more gives the tail back; milder ones keep the chunk
        // whole (a Vec trimming its last doubling's slack) while the slack
        // fits the cache's budget, and so does a growth within a chunk
        // taken larger (see `block_cache::GROWTH_SLACK`).
        // The slack's rise is reserved under the budget first (see
        // `keep_slack`).
        let rise = (old - new).saturating_sub(slack::of(c));
        let mild = new > old - old / 4 && slack::try_add(rise);
        let had = slack::of(c) + if mild { rise } else { 0 };
        // SAFETY: `[p, p + old)` is the live chunk.
        let size = if new < c.asked && !mild && unsafe { map::resize_in_place(p, old, new) } {
            new
        } else {
            old
        };
        chunks::resize(
            p as usize,
            chunks::Chunk {
                split: c.split,
                ..chunks::Chunk::new(size, new)
            },
        );
        slack::change(had, size - new);
        return (p, true);
    }
    // SAFETY: the caller's contract.
    let q = unsafe { grow_chunk(p, c, new) };
    if !q.is_null() {
        return (q, true);
    }
    // SAFETY: the caller's contract; `grow_chunk` left the chunk as it was.
    (unsafe { move_to_prev(p, c, n) }, false)
}

/// The live chunk `p` (`c`: its record) moved into a block of `n` bytes
/// of the previous functions (its first `min(c.asked, n)` bytes copied:
/// everything MKL's block holds), the chunk then released as a free
/// would; null if they cannot serve it either (the chunk then as it was).
///
/// # Safety
/// `p` is a live chunk recorded as `c`.
unsafe fn move_to_prev(p: *mut u8, c: chunks::Chunk, n: usize) -> *mut u8 {
    // SAFETY: malloc's contract.
    let q = retry(|| unsafe { prev_malloc(n) }).cast::<u8>();
    if q.is_null() {
        chunks::resize(p as usize, c); // as it was, released
        return q;
    }
    chunks::remove(p as usize);
    slack::change(slack::of(c), 0);
    // SAFETY: distinct live blocks: `p` maps `c.size >= c.asked` bytes,
    // `q` holds `n`; the chunk, out of the table, is released once.
    unsafe {
        ptr::copy_nonoverlapping(p, q, c.asked.min(n));
        release(p, c);
    }
    q
}

/// The live chunk `p` (`c`: its record) grown to a chunk of
/// `new > c.size` bytes (see [`resize_chunk`]); null if no chunk can be
/// had, the chunk then as it was.
///
/// # Safety
/// `p` is a live chunk recorded as `c`.
unsafe fn grow_chunk(p: *mut u8, c: chunks::Chunk, new: usize) -> *mut u8 {
    let old = c.size;
    let advise = huge_pages::applies(new);
    // SAFETY: the live chunk; a failed growth changes nothing.
    if unsafe { map::resize_in_place(p, old, new) } {
        // (A split chunk never grows in place: `mremap` resizes one
        // mapping only.)
        chunks::resize(p as usize, chunks::Chunk::new(new, new));
        slack::change(slack::of(c), 0);
        // New memory: the cache makes room for it (see `block_cache`).
        make_room(new - old);
        if advise {
            // SAFETY: the whole grown chunk is ours.
            unsafe { huge_pages::advise_chunk(p, new) };
        }
        return p;
    }
    // Moved: onto a cached chunk, whose pages (faulted in already) past
    // `old` become the growth, or onto a fresh mapping. The target is
    // registered first, so that a full table costs nothing but a refusal.
    let (mut target, mut size, target_split) = if block_cache::covers(new) {
        decay::point();
        match block_cache::take_for_growth(new) {
            // None within `GROWTH_SLACK` times: a larger one cut down
            // (see `new_chunk`).
            (t, _, _) if t.is_null() => block_cache::take_cut(new, growth_keep(new, true)),
            found => found,
        }
    } else {
        (ptr::null_mut(), 0, false)
    };
    let cached = !target.is_null();
    if cached {
        // SAFETY: the cached chunk is ours alone, not yet registered.
        size = unsafe { keep_slack(target, size, new, true) };
    } else {
        (target, size) = if advise {
            map::map_large(new)
        } else {
            (ptr::null_mut(), 0)
        };
        if target.is_null() {
            (target, size) = (map_evicting(new), new);
        }
        if target.is_null() {
            return target;
        }
        // The old pages move (or are copied and unmapped): what is new is
        // the rest, for which the cache makes room.
        make_room(size.saturating_sub(old));
    }
    if !cached {
        slack::change(0, size - new);
    }
    let record = chunks::Chunk {
        split: target_split,
        ..chunks::Chunk::new(size, new)
    };
    // Held until its record is final (below): a trim must not take its
    // slack while the old bytes move in.
    if !chunks::insert_as(target as usize, record, true) {
        slack::change(size - new, 0);
        // SAFETY: unregistered and unused.
        unsafe { release(target, record) };
        return ptr::null_mut();
    }
    chunks::remove(p as usize);
    slack::change(slack::of(c), 0);
    // A cached target keeps its own pages past `old`; a fresh one grows
    // the moved mapping to `new` (zero-filled past `old`). Moved onto a
    // cached chunk, the old pages replace its start, and the chunk is then
    // two mappings (`split`; the kernel merges no two of them). To keep
    // every chunk within two whatever the growths onto it (issue 41: moves
    // with shrinking old sizes added a mapping each, 8 for one chunk),
    // the old bytes are copied, not moved, onto a cached chunk that is
    // split already. They are copied too where `mremap` refuses: it moves
    // one mapping only, and a split chunk is two.
    let len = if cached { old } else { new };
    // SAFETY: `target` is ours and unused; p is the live chunk, moved
    // whole on success and untouched on failure.
    let moved = !target_split && !unsafe { map::move_onto(p, old, len, target) }.is_null();
    if !moved {
        // SAFETY: both are ours, distinct, and hold at least `old` bytes;
        // the old chunk is unmapped once copied.
        unsafe {
            ptr::copy_nonoverlapping(p, target, old);
            map::unmap(p, old);
        }
    }
    chunks::resize(
        target as usize,
        chunks::Chunk {
            split: target_split || (cached && moved),
            ..record
        },
    );
    if advise {
        // SAFETY: the whole chunk at `target` is ours.
        unsafe { huge_pages::advise_chunk(target, size) };
    }
    target
}
