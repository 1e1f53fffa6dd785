//! Beneath MKL: the memory MKL draws on.
//!
//! MKL takes every byte it allocates, for the program (`MKL_malloc` & co.)
//! and for itself (BLAS threads' buffers, FFT descriptors, LAPACK
//! workspaces), through four function pointers, `i_malloc`, `i_calloc`,
//! `i_realloc` and `i_free` ([`ffi::i_malloc`](crate::ffi::i_malloc) & co.), the C runtime's
//! functions by default. The crate's setup points them at the hooks below,
//! before MKL's first call wherever it can (an ELF constructor, a C
//! runtime initialiser in a Windows executable, or the first allocation),
//! and chains to the values it found there:
//!
//! - a request of [`MIN_CHUNK`] (1 MiB) or more is served by a **chunk**
//!   of the crate's: an anonymous mapping on a 2 MiB boundary (`map`),
//!   registered (`chunks`), advised onto huge pages from the huge-page
//!   threshold up ([`huge_pages`]), grown and shrunk with `mremap` (no
//!   copy), and kept in the [`block_cache`] when MKL frees it;
//! - a request of 4 KiB up to [`MIN_CHUNK`] is a **medium block** of the
//!   crate's (Linux): a block of a size class carved from one reserved
//!   region, whose freed pages go back to the kernel after the decay time
//!   (`medium`; `MKL_ALLOC_MEDIUM=off` turns it off);
//! - everything else, and every block that is neither (allocated by
//!   the C runtime, before the hooks or below 4 KiB), goes to the
//!   previous functions. Ownership is decided without reading memory
//!   outside the crate's chunks and region (`medium`, then `chunks`).
//!
//! Because the cache sits beneath MKL, MKL's statistics (`MKL_Mem_Stat`,
//! mkl-service's `mem_stat()`) count live blocks only, the cache counts
//! each chunk at its true size, and a chunk fresh from the kernel is known
//! to read zero (the allocator above then writes nothing for a zeroed
//! block: see `last_chunk`).
//!
//! **MKL first.** MKL copies the pointers at its first call (measured with
//! oneMKL 2026.2: set after one `MKL_malloc`, they were never called). If
//! MKL ran before the setup (another library called it first), the hooks
//! are never called: the crate's first allocation that the hooks would
//! have served with a chunk (1 MiB or more; 32 MiB or more with the block
//! cache and huge pages both off) and that MKL serves without one shows
//! it, and from then on
//! [`manager::stats`](crate::manager::stats)`().backing` says
//! [`Backing::MklRanFirst`]; MKL then runs on the C runtime's memory, as
//! without this crate, and the block cache and huge pages do not apply.
//! `MKL_ALLOC_BACKING=off` leaves the pointers alone.
//!
//! **On Windows** MKL's DLLs export no such pointers: `mkl_core.3.dll`
//! reads them, at its first call, from the exports `i_malloc_dll` & co. of
//! a module named `libimalloc.dll` (`ffi::IMALLOC_DLL`), if all four are
//! set, and otherwise keeps its own functions. The build writes a
//! data-only `libimalloc.dll` beside MKL's DLLs; the setup loads it (or
//! the Intel runtime's own, if one is loaded or found) and sets its four
//! pointers. Without one, the state is [`Backing::Off`]. Chunks there are
//! `VirtualAlloc`ed regions on 2 MiB boundaries (`map_windows.rs`): a
//! shrink decommits the tail, a growth recommits only that tail and
//! otherwise moves by copying (Windows has no `mremap`), the cache's lazy
//! free is `MEM_RESET`, and no huge pages are advised (Windows has no
//! advice): where the process holds `SeLockMemoryPrivilege`, a fresh chunk
//! under the huge-page policy is allocated on large pages instead, whole,
//! never decommitted or reset (see [`huge_pages`]). The
//! functions beneath the hooks are the process heap's (`HeapAlloc`), or
//! those the Intel runtime's DLL held.
//!
//! **Under Miri** the emulated MKL (src/ffi/miri/large.rs) takes its large
//! blocks through the same four pointers, as MKL does, so the hooks, the
//! registry and the cache run there too, on chunks of the emulated
//! machine's memory that are never resized in place (`map`).
//!
//! **Rules for code in here.** The hooks run inside MKL's calls, under
//! MKL's locks: they never allocate through the global allocator (which
//! may be this crate), never call MKL, and hold a block-cache shard lock
//! only while copying slots (no system call under it).

// Under loom only the block cache's shards and the chunk table are
// modelled (the hooks are not built), and off Linux and Windows there are
// no chunks: the hooks are never installed, and the chunk paths of the
// cache and huge pages go unused.
#![cfg_attr(
    any(loom, not(any(target_os = "linux", windows))),
    allow(dead_code, unused_imports)
)]

pub mod block_cache;
mod budget;
pub(crate) mod chunks;
pub(crate) mod decay;
mod heap_trim;
#[cfg(all(any(target_os = "linux", windows), not(loom)))]
mod hooks;
pub mod huge_pages;
#[cfg(target_os = "linux")]
mod map;
#[cfg(windows)]
#[path = "map_windows.rs"]
mod map;
#[cfg(all(target_os = "linux", not(miri)))]
mod map_limit;
pub(crate) mod medium;
#[cfg(all(test, miri))]
mod miri_tests;
pub(crate) mod signals;
pub(crate) mod slack;
mod valgrind;
pub(crate) mod zeroing;

use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};

pub(crate) use budget::default_budget;

// The loom models' way into the medium heap (`loom_tests/medium.rs`) and
// its per-thread slots (`loom_tests/medium_slots.rs`).
#[cfg(loom)]
#[doc(hidden)]
pub use medium::{
    class::{CLASSES as MEDIUM_CLASSES, size as medium_class_size},
    heap::{Env as MediumEnv, Heap as MediumHeap, SPAN as MEDIUM_SPAN},
    slots::{Registry as SlotsRegistry, SLOT_CLASSES as MEDIUM_SLOT_CLASSES, Slots as MediumSlots},
};

/// The granule of a chunk's size (one 4 KiB page): a chunk's last partial
/// huge page stays on small pages, so rounding further would only commit
/// memory nobody asked for.
pub(crate) const PAGE: usize = 4096;

/// Requests of at least this many bytes (as MKL passes them to `i_malloc`:
/// the caller's size plus MKL's header and alignment) are chunks of the
/// crate's: 1 MiB, the block cache's [`MIN_BLOCK`](block_cache::MIN_BLOCK).
/// Below it the C runtime's heap keeps freed memory for reuse itself.
pub const MIN_CHUNK: usize = block_cache::MIN_BLOCK;
// Miri's model of MKL takes blocks of this size through `i_malloc`.
#[cfg(miri)]
const _: () = assert!(crate::ffi::LARGE == MIN_CHUNK);

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
    /// `MKL_ALLOC_BACKING=off`, a platform without chunks (neither Linux
    /// nor Windows), or Windows without a `libimalloc.dll` to find (see
    /// the module docs): MKL runs on its default memory functions.
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

thread_local! {
    /// The chunk the last hook call of this thread served, and whether it
    /// was fresh from the kernel (see [`last_chunk`]).
    static LAST: Cell<(usize, bool)> = const { Cell::new((0, false)) };
}

/// Whether any chunk was ever served: MKL calls the hooks.
static SERVED: AtomicBool = AtomicBool::new(false);

/// Called by the allocator above when MKL served a request of `size`
/// bytes without a chunk: if no chunk was ever served and the hooks would
/// have served this request with one, MKL never calls the hooks (it ran
/// before the setup). "Would have" is the hooks' own rule: with the block
/// cache and huge pages both off they take only requests of 32 MiB and
/// more, so a 16 MiB block from the C runtime proves nothing then. (MKL
/// asks the hooks for `size` plus its header: at least as large, and the
/// rule holds for every size above one it holds for.)
#[cold]
pub(crate) fn note_unserved(size: usize) {
    if STATE.load(Relaxed) == 1 && !SERVED.load(Relaxed) && hooks_take(size) {
        STATE.store(2, Relaxed);
    }
}

/// Whether the hooks serve a request of `size` bytes with a chunk.
#[inline]
fn hooks_take(size: usize) -> bool {
    #[cfg(all(target_os = "linux", not(loom)))]
    return hooks::chunk_for(size);
    // No hooks: the state is never Active here, and this is not reached.
    #[cfg(any(not(target_os = "linux"), loom))]
    {
        let _ = size;
        false
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

/// Points MKL's memory functions at the hooks, once: on Linux and Windows
/// (there through `libimalloc.dll`). Elsewhere MKL stays on the C
/// runtime's memory and the state is [`Backing::Off`].
pub(crate) fn install() {
    #[cfg(all(any(target_os = "linux", windows), not(loom)))]
    hooks::install();
    #[cfg(any(not(any(target_os = "linux", windows)), loom))]
    STATE.store(3, Relaxed);
}

/// Whether MKL's blocks that are not chunks are private anonymous memory
/// (see `zeroing::foreign_granule`): on Linux where the functions beneath
/// MKL are the C library's own; on Windows always (`discard_to_zero`
/// checks each range); nowhere else.
pub(crate) fn foreign_is_anonymous() -> bool {
    #[cfg(all(target_os = "linux", not(loom)))]
    return hooks::prev_is_libc();
    #[cfg(all(windows, not(loom)))]
    return true;
    #[cfg(any(loom, not(any(target_os = "linux", windows))))]
    return false;
}

/// The fork guard's rare-call lock, handed down by the process's setup
/// (`set_rare_lock`) before it registers the fork handlers: the slack's
/// trim runs under it, so that no fork copies a chunk the trim holds.
/// Unset before the setup, when no fork handler is registered either.
static RARE_LOCK: std::sync::OnceLock<fn(&mut dyn FnMut())> = std::sync::OnceLock::new();

/// Sets the lock [`trim_slack`] runs under (once; later calls change
/// nothing): a function that runs its argument holding it.
#[cfg_attr(any(loom, not(any(target_os = "linux", windows))), allow(dead_code))]
pub(crate) fn set_rare_lock(run_under: fn(&mut dyn FnMut())) {
    let _ = RARE_LOCK.set(run_under);
}

/// Gives back the slack of live chunks while the cache and the slack hold
/// more than `limit` bytes (see `hooks::trim_slack`), under the rare-call
/// lock (no fork while a chunk is held by the trim).
pub(crate) fn trim_slack(limit: usize) {
    #[cfg(all(any(target_os = "linux", windows), not(loom)))]
    match RARE_LOCK.get() {
        Some(run_under) => run_under(&mut || hooks::trim_slack(limit)),
        None => hooks::trim_slack(limit),
    }
    #[cfg(any(loom, not(any(target_os = "linux", windows))))]
    let _ = limit;
}

/// Bytes of growth slack in live chunks (see `slack`); 0 where there are
/// no chunks.
pub(crate) fn slack_bytes() -> usize {
    slack::bytes()
}

/// Gives a chunk that left the block cache back to the system.
///
/// # Safety
/// `[p, p + size)` is a chunk of the crate's that nothing uses any more.
pub(crate) unsafe fn unmap_chunk(p: *mut u8, size: usize) {
    #[cfg(any(target_os = "linux", windows))]
    // SAFETY: the caller's contract.
    unsafe {
        map::unmap(p, size)
    };
    #[cfg(not(any(target_os = "linux", windows)))]
    {
        // No chunk exists elsewhere: the cache is never given one.
        let _ = (p, size);
        unreachable!("mkl-alloc: a chunk on a platform without chunks");
    }
}

/// Marks a cached chunk's pages as reclaimable (`MADV_FREE`, `MEM_RESET`
/// on Windows; see [`block_cache`]).
///
/// # Safety
/// `[p, p + size)` is a chunk of the crate's whose contents nobody needs.
pub(crate) unsafe fn lazy_free(p: *mut u8, size: usize) {
    #[cfg(any(target_os = "linux", windows))]
    // SAFETY: the caller's contract.
    unsafe {
        map::lazy_free(p, size)
    };
    #[cfg(not(any(target_os = "linux", windows)))]
    let _ = (p, size);
}
