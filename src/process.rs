//! Process-wide state of the allocation path: the one word every call
//! reads, the setup that runs once (at load on Linux, else at the first
//! allocation, or at [`manager::init`](crate::manager::init)), and the
//! `fork` handlers.
//!
//! **The word.** Every allocation compares its size with one relaxed word
//! ([`slow`]; the word lives beneath MKL in `backing::signals`, where the
//! medium heap's let-go flag zeroes it too): below it (small blocks, the common case) the call goes
//! straight to MKL; at or above it the allocator above MKL has work of its
//! own (lazy zeroing, huge-page advice the NumPy handler asks for). The
//! word is 0 until the setup has run, so the first call of the process
//! takes the slow path and runs it; after that it is
//! [`LAZY_ZERO_MIN`](crate::backing::zeroing::LAZY_ZERO_MIN) (1 MiB). The
//! policies for large blocks (the block cache, huge pages, growth by
//! `mremap`) live beneath MKL (`backing`), where every MKL allocation
//! meets them.
//!
//! **Setup.** It points MKL's memory functions at the backing before any
//! MKL call it makes, and runs as early as the crate can arrange: from an
//! ELF constructor when the program (or the extension module that links
//! the crate) is loaded, on Windows from a C runtime initialiser when the
//! crate is in the executable (not in a DLL, whose initialisers run under
//! the loader lock), else at the first allocation, or at
//! [`manager::init`](crate::manager::init).
//!
//! **Fork.** A child process has one thread, the copy of the one that
//! called `fork`; a lock that another thread held at that moment would stay
//! locked in the child forever. The setup registers `pthread_atfork`
//! handlers. The prepare handler takes, in this order:
//!
//! 1. the crate's rare-call lock (`fork_guard::rare`: MKL's statistics,
//!    peak usage and buffer freeing, which take every thread's account
//!    lock inside MKL);
//! 2. the gate: it waits until no thread is inside an MKL call
//!    (`fork_guard::mkl` marks every `MKL_malloc`, `MKL_calloc`,
//!    `MKL_realloc` and `MKL_free` of the crate) or inside MKL's clean-up
//!    of an exiting thread, and holds new calls outside until the fork is
//!    done; so no code beneath MKL runs either, and locks taken only by
//!    such code need no step of their own (any that must be held come
//!    after this step);
//! 3. the block cache's shard locks, in one fixed order
//!    (`block_cache::lock_for_fork`; the c_heap bins and the chunk
//!    table are lock-free).
//!
//! The parent's and the child's handlers release them in the reverse
//! order; the child also recounts the cache's budget word from the shards,
//! since a thread that had reserved bytes but not yet cached its block does
//! not exist in the child, and gives back the other threads' markers. A
//! fork from a signal handler skips what the interrupted thread itself
//! holds (the rare-call lock, its own marker, a shard it holds), which the
//! child's copy of that thread releases when the handler returns. In
//! `mkl-rt` builds on Unix the setup also calls each MKL entry point the
//! crate uses once (not on Windows, which has no `fork`): libmkl_rt resolves an entry at its first call under an internal
//! spin lock, and a child forked while another thread held that lock hangs
//! at its first MKL call. MKL calls made outside the crate (BLAS and the
//! like, from other threads) are not covered: docs/reliability.md says what
//! that means for a child.

use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

#[cfg(not(loom))]
use crate::backing::block_cache;
use crate::backing::{self, huge_pages, signals};
use crate::fork_guard;

/// Whether the setup has run.
static READY: AtomicBool = AtomicBool::new(false);

/// Whether a call for `size` bytes must consult the policies: one relaxed
/// load and a comparison.
#[inline(always)]
pub(crate) fn slow(size: usize) -> bool {
    signals::slow(size)
}

/// Runs the setup if it has not run (the first slow call of the process).
#[inline(always)]
pub(crate) fn ensure_ready() {
    if !READY.load(Relaxed) {
        setup();
    }
}

/// The word's value once the setup has run.
const THRESHOLD: usize = backing::zeroing::LAZY_ZERO_MIN;

/// The setup, at load time: an ELF constructor, so that MKL's memory
/// functions are the backing's before `main` (or, in an extension module,
/// before the loader returns), and thus before MKL's first call unless
/// another constructor makes one.
#[cfg(all(target_os = "linux", not(any(loom, miri, test))))]
#[used]
#[unsafe(link_section = ".init_array")]
static AT_LOAD: extern "C" fn() = {
    extern "C" fn at_load() {
        setup();
    }
    at_load
};

/// The setup at load time on Windows: a C runtime initialiser
/// (`.CRT$XCU`, run before `main` by the MSVC and mingw-w64 runtimes; it
/// runs under wine with the GNU target), so that MKL's memory functions are
/// the backing's before any other code can call MKL. Only where the crate
/// is part of the program's executable: in a DLL (a Python extension) the
/// initialisers run inside `DllMain`, under the loader lock, where the
/// setup's `LoadLibraryExW` and MKL's first calls (libmkl_rt loads its
/// other DLLs) must not run; there the setup waits for the first
/// allocation, as before.
#[cfg(all(windows, not(any(loom, miri, test))))]
#[used]
#[unsafe(link_section = ".CRT$XCU")]
static AT_LOAD_WINDOWS: extern "C" fn() = {
    extern "C" fn at_load() {
        if crate::sys::in_main_executable(at_load as *const ()) {
            setup();
        }
    }
    at_load
};

/// Reads the environment's policies, points MKL's memory functions at the
/// backing, registers the fork handlers (once) and, in `mkl-rt` builds,
/// resolves MKL's entry points. Racing first calls may both run it: each
/// step is idempotent, and the registration is guarded.
#[cold]
#[inline(never)]
pub(crate) fn setup() {
    // Each reads its variable if nothing set the policy yet (under loom the
    // allocation path has no cache: loom models the shards directly).
    // First: the fork guard's thread-exit marking (its key, and the lookup
    // of glibc's thread-exit destructors, which run before MKL's key
    // destructors whatever order the keys were made in; see fork_guard).
    fork_guard::setup();
    #[cfg(not(loom))]
    let _ = block_cache::budget();
    let _ = huge_pages::threshold();
    #[cfg(not(loom))]
    backing::install();
    // Before the fork handlers: from then on the slack's trim holds the
    // rare-call lock, which a fork's prepare handler takes first.
    backing::set_rare_lock(|f| fork_guard::rare(f));
    register_fork_handlers();
    // For fork only (see the module docs): Windows has none, and there the
    // setup runs at load, where an MKL allocation would leave
    // `MKL_Disable_Fast_MM` no first call to succeed.
    #[cfg(all(feature = "mkl-rt", unix, not(miri)))]
    resolve_mkl_entries();
    fork_guard::find_mkl_locks();
    READY.store(true, Relaxed);
    signals::open(THRESHOLD);
    // Last, once the allocation path is ready (starting the thread
    // allocates, re-entering it): `MKL_ALLOC_BACKGROUND=on` starts the
    // background decay thread. Never inside a hook: the setup runs at load,
    // at `manager::init`, or above MKL at a first allocation.
    crate::background::at_setup();
}

fn register_fork_handlers() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    #[cfg(all(target_os = "linux", not(any(loom, miri))))]
    if !REGISTERED.swap(true, Relaxed) {
        // Three handlers that neither allocate nor fork.
        crate::sys::at_fork(before_fork, after_fork, in_child);
    }
    // No fork to handle under loom and Miri, nor on Windows.
    #[cfg(any(loom, miri, not(target_os = "linux")))]
    REGISTERED.store(true, Relaxed);
}

/// `pthread_atfork`'s prepare handler: the rare-call lock, no thread
/// inside MKL, every shard lock (in that order: see the module docs).
#[cfg(all(target_os = "linux", not(any(loom, miri))))]
extern "C" fn before_fork() {
    fork_guard::prepare();
    block_cache::lock_for_fork();
}

/// The parent's handler: release what `before_fork` took, in reverse.
#[cfg(all(target_os = "linux", not(any(loom, miri))))]
extern "C" fn after_fork() {
    block_cache::unlock_after_fork(false);
    fork_guard::after_fork(false);
}

/// The child's handler: make the cache and the markers consistent, then
/// release them.
#[cfg(all(target_os = "linux", not(any(loom, miri))))]
extern "C" fn in_child() {
    block_cache::unlock_after_fork(true);
    fork_guard::after_fork(true);
}

/// Calls each MKL entry point the crate uses, once, so that libmkl_rt has
/// resolved them all before user code can fork (see the module docs).
/// `MKL_Disable_Fast_MM` and `MKL_Set_Memory_Limit` change MKL's state and
/// are left to their first real call.
#[cfg(all(feature = "mkl-rt", unix, not(miri)))]
fn resolve_mkl_entries() {
    use crate::ffi;
    // SAFETY: a block is allocated, resized and freed once; the zeroed one
    // is freed once; the queries take valid pointers or plain values
    // (MKL_PEAK_MEM only reads the peak); freeing MKL's buffers releases
    // only cached, unused ones. Under the rare-call lock, since the
    // handlers are registered already.
    fork_guard::rare(|| unsafe {
        let p = ffi::MKL_malloc(64, 64);
        if !p.is_null() {
            let q = ffi::MKL_realloc(p, 128);
            ffi::MKL_free(if q.is_null() { p } else { q });
        }
        let z = ffi::MKL_calloc(1, 64, 64);
        if !z.is_null() {
            ffi::MKL_free(z);
        }
        let mut n = 0;
        ffi::MKL_Mem_Stat(&mut n);
        ffi::MKL_Peak_Mem_Usage(ffi::MKL_PEAK_MEM);
        ffi::MKL_Thread_Free_Buffers();
        ffi::MKL_Free_Buffers();
    });
}
