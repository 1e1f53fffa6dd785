//! Keeps `fork` out of MKL's memory manager: a gate that every MKL call
//! made with the interpreter detached passes, and that a `pthread_atfork`
//! prepare handler closes, waiting until no thread is inside, before the
//! process forks.
//!
//! Why: MKL's memory manager (libmkl_core, oneMKL 2026.2) keeps per-thread
//! accounts, each guarded by a spin lock that `MKL_malloc`, `MKL_free` and
//! `MKL_realloc` take for the calling thread, and that `MKL_Mem_Stat` and
//! `MKL_Free_Buffers` take for every thread. MKL registers no fork handler:
//! a child forked while another thread was inside such a call inherits that
//! thread's lock taken, and spins for ever in its first `MKL_Mem_Stat`
//! (seen in the fork stress test, tests/fork_stress.py, about once in a few
//! hundred forks). The crate's own fork handlers cover its block cache's
//! locks and libmkl_rt's lazy symbol resolution, not MKL's internals.
//!
//! With the GIL, only the calls made detached (`py.detach`) can run while
//! another thread forks (os.fork holds the GIL): `MKLMemory`'s allocation,
//! copy-construction, `realloc` and DLPack copy, and `free_buffers`. Those
//! pass the gate, and so does the DLPack tensor's deleter, which a consumer
//! may call on any thread without the interpreter and which frees the
//! block when its export was the last holder (always for `copy=True`). (The NumPy handler's functions run with the GIL held; on
//! free-threaded CPython they, and frees on any thread, would need it too.)
//! Not covered either: MKL's own clean-up when a thread that called it
//! exits (`mm_cleanup_thread_cbk`, which takes the same locks, without the
//! GIL), nor MKL calls by other libraries in the process.
//!
//! Windows has no `fork`: there [`register`] registers nothing and the gate
//! is never closed, so passing it only counts.
//!
//! Passing costs one atomic add and subtract on a counter of the thread's
//! own (one of [`SHARDS`], each on its own cache line), and a load of the
//! closed flag.

use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::cell::Cell;

/// Counters of threads inside the gate, spread so that threads seldom share one.
const SHARDS: usize = 16;

#[repr(align(128))]
struct Shard(AtomicUsize);

static INSIDE: [Shard; SHARDS] = [const { Shard(AtomicUsize::new(0)) }; SHARDS];
static CLOSED: AtomicBool = AtomicBool::new(false);
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, and how deep it is inside the gate.
    static MINE: Cell<(usize, usize)> = const { Cell::new((usize::MAX, 0)) };
}

/// A pass through the gate: the thread is inside until it is dropped (on
/// the same thread: it counts in the thread's own record, so it is not Send).
pub struct Pass {
    shard: usize,
    _not_send: PhantomData<*const ()>,
}

/// Enters the gate, waiting while a fork is being prepared. Re-entrant.
pub fn enter() -> Pass {
    let (mut shard, depth) = MINE.get();
    if shard == usize::MAX {
        shard = NEXT_SHARD.fetch_add(1, SeqCst) % SHARDS;
    }
    if depth > 0 {
        INSIDE[shard].0.fetch_add(1, SeqCst);
        MINE.set((shard, depth + 1));
        return Pass {
            shard,
            _not_send: PhantomData,
        };
    }
    loop {
        // SeqCst with `prepare`'s store and loads: either this thread sees
        // the gate closed, or `prepare` sees this thread inside.
        INSIDE[shard].0.fetch_add(1, SeqCst);
        if !CLOSED.load(SeqCst) {
            MINE.set((shard, 1));
            return Pass {
                shard,
                _not_send: PhantomData,
            };
        }
        INSIDE[shard].0.fetch_sub(1, SeqCst);
        while CLOSED.load(SeqCst) {
            std::thread::yield_now();
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        INSIDE[self.shard].0.fetch_sub(1, SeqCst);
        let (shard, depth) = MINE.get();
        MINE.set((shard, depth - 1));
    }
}

/// Runs `f` inside the gate.
pub fn pass<T>(f: impl FnOnce() -> T) -> T {
    let _pass = enter();
    f()
}

#[cfg(unix)]
extern "C" fn prepare() {
    CLOSED.store(true, SeqCst);
    // The forking thread itself is never inside (os.fork is not called from
    // a gated section); everyone else leaves within one MKL call.
    while INSIDE.iter().map(|s| s.0.load(SeqCst)).sum::<usize>() != 0 {
        std::thread::yield_now();
    }
}

#[cfg(unix)]
extern "C" fn in_parent() {
    CLOSED.store(false, SeqCst);
}

#[cfg(unix)]
extern "C" fn in_child() {
    // Only this thread exists: counts of threads that had stepped in and
    // were about to step back out (they saw the gate closed) are void.
    for s in &INSIDE {
        s.0.store(0, SeqCst);
    }
    CLOSED.store(false, SeqCst);
}

#[cfg(unix)]
unsafe extern "C" {
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> core::ffi::c_int;
}

/// Off Unix (Windows) there is no `fork`, so no handler to register: Ok.
#[cfg(not(unix))]
pub fn register() -> Result<(), i32> {
    Ok(())
}

/// Registers the handlers (once per process, whatever the calls), after
/// `mkl_alloc::manager::init()`: prepare handlers run in reverse order of
/// registration, so this gate closes before the crate's handler takes the
/// block cache's locks. Err: `pthread_atfork`'s error number.
#[cfg(unix)]
pub fn register() -> Result<(), i32> {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if REGISTERED.swap(true, SeqCst) {
        return Ok(());
    }
    // SAFETY: three `extern "C" fn()` without preconditions; they neither
    // allocate nor fork, and stay valid for the process's life (the
    // extension is never unloaded).
    let rc = unsafe { pthread_atfork(Some(prepare), Some(in_parent), Some(in_child)) };
    if rc == 0 {
        Ok(())
    } else {
        REGISTERED.store(false, SeqCst);
        Err(rc)
    }
}
