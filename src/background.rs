//! A background decay thread: idle memory given back without any further
//! allocation.
//!
//! The [`block_cache`](crate::block_cache) decays at the allocator's own
//! calls: a large allocation or free, or every
//! [`TICKS`](crate::block_cache::TICKS)th small free of a thread. A process
//! that stops calling the allocator (a service between requests, a
//! notebook between cells) keeps its cache until it calls again. With this
//! thread running, a chunk unused for the decay time
//! ([`block_cache::decay_ms`](crate::block_cache::decay_ms)) is unmapped
//! about a quarter of that time later (the thread wakes every
//! `min(decay_ms / 4, 250 ms)`, at least every 10 ms), whatever the
//! program does, and the program's small frees do no decay work at all:
//! the per-thread countdown is skipped (one relaxed load instead).
//!
//! Without the thread, medium blocks a program lets go of (a run of
//! frees past 16 MiB beyond the medium allocations between) are given back at
//! its next allocation of any size after the decay time (see the medium
//! heap's docs in `backing`); the thread needs no allocation at all.
//!
//! **Opt-in in Rust**, as jemalloc's `background_thread` is: call
//! [`start`], or set `MKL_ALLOC_BACKGROUND=on`, read once at the crate's
//! setup (at load on Linux, from an ELF constructor; otherwise at the first
//! allocation or [`manager::init`](crate::manager::init)), which then
//! starts it. `off`, `0`, unset or empty leave it off; any other value is
//! ignored, with one line on stderr. The Python package starts it at import
//! unless `MKL_ALLOC_BACKGROUND=off`.
//!
//! **Never in the allocator's way.** The thread holds nothing while it
//! sleeps (`park_timeout`, which [`stop`] interrupts with `unpark`); when
//! it wakes it runs the backing's decay, which takes a block-cache shard
//! lock only while it copies slots and unmaps the decayed chunks after
//! releasing it: the same code a small free runs, and it allocates
//! nothing, calls no MKL function and takes no lock a hook holds across a
//! call back into it. Starting it allocates (the thread's handle and
//! stack), outside any lock of the allocator's.
//!
//! **Fork.** The thread does not exist in a child. The child's fork
//! handler marks it not running (the child's small frees count towards the
//! decay again), and remembers that it was wanted: the child starts its
//! own at the next [`start`], or lazily at a small free of
//! [`MklSplitAllocator`](struct@crate::MklSplitAllocator) that reaches the
//! decay check (outside every lock). A fork while the thread is inside the
//! decay waits for it at the shard locks the prepare handler takes (see
//! the crate's `process` module); the thread never waits on a fork.
//!
//! **Exit.** [`stop`] wakes the thread and joins it. A process may also
//! exit with it running: it touches only the crate's statics (never torn
//! down) and the kernel's mappings.
//!
//! ```
//! use mkl_alloc::background;
//!
//! background::start().expect("the background decay thread");
//! assert!(background::is_running());
//! background::stop(); // joins it
//! assert!(!background::is_running());
//! ```

// Under loom the settings report (`source`, `env_setting`) is not built.
#![cfg_attr(loom, allow(dead_code))]

use core::cell::UnsafeCell;
use core::fmt;
use core::sync::atomic::{
    AtomicBool, AtomicU8, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::thread::JoinHandle;
use std::time::Duration;

/// The thread exists in this process and decays (a word beneath MKL,
/// `backing::signals`, which the stores read): small frees skip the decay
/// countdown while it is set.
use crate::backing::signals::{driven as running, set_driven as set_running};

/// The program asked for the thread ([`start`], `MKL_ALLOC_BACKGROUND=on`)
/// and has not [`stop`]ped it since. Survives `fork`: a child whose parent
/// ran the thread starts its own when it next needs it.
static WANTED: AtomicBool = AtomicBool::new(false);

/// Set by [`stop`]: the thread leaves at its next wake.
static STOP: AtomicBool = AtomicBool::new(false);

/// Serialises [`start`] and [`stop`]: 0, or the token of the thread
/// holding it (see [`token`]). Never taken on an allocation path, except
/// by [`resume`]'s try, which gives up if it is held; never held by the
/// thread itself.
static CONTROL: AtomicUsize = AtomicUsize::new(0);

/// The running thread's handle and the [`GENERATION`] that started it (a
/// handle inherited across `fork` names a thread that is not the child's).
struct Slot(UnsafeCell<Option<(JoinHandle<()>, usize)>>);

// SAFETY: the cell is read and written only by the holder of `CONTROL`.
unsafe impl Sync for Slot {}

static HANDLE: Slot = Slot(UnsafeCell::new(None));

/// Forks this process descends by (incremented in each child): a handle
/// of an older generation is a parent's.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

/// Where the thread's setting came from: [`SOURCE_DEFAULT`],
/// [`SOURCE_ENV`] or [`SOURCE_PROGRAM`] (reported by `manager::settings`).
static SOURCE: AtomicU8 = AtomicU8::new(SOURCE_DEFAULT);
pub(crate) const SOURCE_DEFAULT: u8 = 0;
pub(crate) const SOURCE_ENV: u8 = 1;
pub(crate) const SOURCE_PROGRAM: u8 = 2;

/// The variable read at the setup.
const ENV: &core::ffi::CStr = c"MKL_ALLOC_BACKGROUND";

/// Why [`start`] failed; its `Display` says what was asked and why it
/// failed, and [`source`](std::error::Error::source) gives the system's
/// error.
///
/// ```
/// use mkl_alloc::background;
///
/// match background::start() {
///     Ok(()) => background::stop(),
///     Err(e) => eprintln!("{e}"), // "starting mkl-alloc's background decay thread failed: ..."
/// }
/// ```
#[derive(Debug)]
pub struct StartError {
    cause: std::io::Error,
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "starting mkl-alloc's background decay thread failed: the system refused a new \
             thread ({}); the block cache still decays at the program's allocations and frees",
            self.cause
        )
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}

/// Starts the background decay thread, unless it is running: from then on
/// idle cached memory is given back without any further allocation, and
/// small frees skip the decay countdown. Idempotent; in a child process
/// whose parent ran the thread, starts the child's own.
///
/// # Errors
/// [`StartError`] if the system refuses a new thread (the thread limit,
/// memory for its stack); the crate then decays as without the thread.
///
/// ```
/// use mkl_alloc::background;
///
/// background::start()?;
/// background::start()?; // already running: nothing to do
/// assert!(background::is_running());
/// background::stop();
/// # Ok::<(), background::StartError>(())
/// ```
pub fn start() -> Result<(), StartError> {
    SOURCE.store(SOURCE_PROGRAM, Relaxed);
    let _guard = Control::lock();
    spawn_locked()
}

/// Stops the background decay thread and waits for it to leave (it leaves
/// at once, or after the decay sweep it is in, a few system calls). Small
/// frees count towards the decay again. Idempotent: nothing to do if it is
/// not running.
///
/// ```
/// use mkl_alloc::background;
///
/// background::stop(); // not running: nothing to do
/// background::start().unwrap();
/// background::stop();
/// assert!(!background::is_running());
/// ```
pub fn stop() {
    SOURCE.store(SOURCE_PROGRAM, Relaxed);
    let _guard = Control::lock();
    WANTED.store(false, Relaxed);
    // The small frees' countdown first: the thread may leave only after.
    set_running(false);
    // SAFETY: under CONTROL.
    let Some((handle, generation)) = (unsafe { (*HANDLE.0.get()).take() }) else {
        return;
    };
    if generation != GENERATION.load(Relaxed) {
        // The parent's thread: not in this process, nothing to join (its
        // handle must not be dropped either, which would detach a thread
        // id that is not the child's).
        core::mem::forget(handle);
        return;
    }
    STOP.store(true, Release);
    handle.thread().unpark();
    // The thread takes no lock and allocates nothing while it runs: it
    // leaves at its next check of STOP. (A panic in it is impossible: the
    // decay does not panic; were it to, there is nothing to report here.)
    let _ = handle.join();
    STOP.store(false, Relaxed);
}

/// Whether the background decay thread is running in this process (false
/// in a child process until it starts its own).
///
/// ```
/// assert!(!mkl_alloc::background::is_running()); // off by default in Rust
/// ```
pub fn is_running() -> bool {
    running()
}

/// Where the setting came from (`SOURCE_*`).
pub(crate) fn source() -> u8 {
    SOURCE.load(Relaxed)
}

/// Starts the thread if it is wanted and not running (a child whose parent
/// ran it), unless [`start`] or [`stop`] is under way: for a small free's
/// cold path, outside every lock of the allocator's. Never waits.
#[cold]
#[inline(never)]
pub(crate) fn resume() {
    if WANTED.load(Relaxed) && !running() {
        if let Some(_guard) = Control::try_lock() {
            let _ = spawn_locked();
        }
    }
}

/// The setup's part (`process::setup`, outside any lock and any MKL
/// call): reads `MKL_ALLOC_BACKGROUND` once and starts the thread if it
/// says `on`. Without allocating unless it starts the thread.
pub(crate) fn at_setup() {
    static READ: AtomicBool = AtomicBool::new(false);
    if READ.swap(true, Relaxed) {
        return;
    }
    let mut buf = crate::sys::EnvBuf::new();
    let value = crate::sys::env_var(ENV, &mut buf);
    if value.is_empty() {
        return; // the default: off (the Python package starts it itself)
    }
    match crate::env::parse_switch(value) {
        Ok(on) => {
            if SOURCE.load(Relaxed) == SOURCE_DEFAULT {
                SOURCE.store(SOURCE_ENV, Relaxed);
            }
            if on {
                WANTED.store(true, Relaxed);
                // A racing first call may hold CONTROL: it starts it then.
                resume();
            }
        }
        Err(()) => crate::sys::write_stderr(
            b"mkl-alloc: MKL_ALLOC_BACKGROUND must be on or off; ignored (the background decay thread keeps its default: off in Rust, on in the Python package)\n",
        ),
    }
}

/// What `MKL_ALLOC_BACKGROUND` said: `Some(on)`, or `None` if it is unset,
/// empty or not a switch (for the settings report).
pub(crate) fn env_setting() -> Option<bool> {
    let mut buf = crate::sys::EnvBuf::new();
    let value = crate::sys::env_var(ENV, &mut buf);
    if value.is_empty() {
        return None;
    }
    crate::env::parse_switch(value).ok()
}

/// Spawns the thread unless it runs. The caller holds `CONTROL`.
fn spawn_locked() -> Result<(), StartError> {
    WANTED.store(true, Relaxed);
    if running() {
        return Ok(());
    }
    // SAFETY: under CONTROL.
    let slot = unsafe { &mut *HANDLE.0.get() };
    if let Some((handle, generation)) = slot.take() {
        if generation == GENERATION.load(Relaxed) {
            // Not running but not joined: cannot happen (stop joins under
            // CONTROL); join it rather than leak it.
            STOP.store(true, Release);
            handle.thread().unpark();
            let _ = handle.join();
        } else {
            // Inherited across fork: the parent's thread (see `stop`).
            core::mem::forget(handle);
        }
    }
    STOP.store(false, Relaxed);
    // Spawning allocates (the handle, the name, the stack's bookkeeping):
    // no allocator lock is held here, and a free that reaches `resume`
    // meanwhile finds CONTROL held and goes on.
    match std::thread::Builder::new()
        .name("mkl-alloc-decay".into())
        .spawn(run)
    {
        Ok(handle) => {
            *slot = Some((handle, GENERATION.load(Relaxed)));
            set_running(true);
            Ok(())
        }
        Err(cause) => {
            WANTED.store(false, Relaxed);
            Err(StartError { cause })
        }
    }
}

/// How long the thread sleeps between sweeps: a quarter of the decay time
/// (the cache's own sweep interval), at most 250 ms, at least 10 ms.
fn interval() -> Duration {
    #[cfg(not(loom))]
    let decay = crate::block_cache::decay_ms();
    // Under loom the allocation path has no cache (loom models its shards).
    #[cfg(loom)]
    let decay = crate::block_cache::DECAY_MS;
    Duration::from_millis((decay / 4).clamp(10, 250) as u64)
}

/// The thread: decay, sleep, until [`stop`]. Allocates nothing and holds
/// nothing while it sleeps.
fn run() {
    while !STOP.load(Acquire) {
        // Both stores' decay (`backing::decay`): outside MKL, holding
        // nothing, allocating nothing.
        crate::backing::decay::point();
        std::thread::park_timeout(interval());
    }
}

/// The child's fork handler (`fork_guard::after_fork`): the thread is the
/// parent's. Small frees count again; the wish survives, so the child
/// starts its own at the next [`start`] or [`resume`]. A `CONTROL` held by
/// a thread that did not fork is released (that thread is gone); held by
/// the forking thread itself (a fork from a signal handler inside
/// `start`), it stays, and that thread's copy releases it.
#[cfg_attr(any(loom, miri, not(target_os = "linux")), allow(dead_code))]
pub(crate) fn after_fork_in_child() {
    GENERATION.fetch_add(1, Relaxed);
    set_running(false);
    STOP.store(false, Relaxed);
    let owner = CONTROL.load(Relaxed);
    if owner != 0 && owner != token() {
        CONTROL.store(0, Release);
    }
}

std::thread_local! {
    /// Its address is this thread's token (see [`CONTROL`]).
    static TOKEN: u8 = const { 0 };
}

/// A token unique to this thread among the live ones.
fn token() -> usize {
    TOKEN.with(|t| core::ptr::from_ref(t).addr())
}

/// `CONTROL` held; released when dropped.
struct Control;

impl Control {
    fn lock() -> Control {
        let me = token();
        while CONTROL
            .compare_exchange_weak(0, me, Acquire, Relaxed)
            .is_err()
        {
            // Held by a start (a spawn) or a stop (a join): short.
            std::thread::yield_now();
        }
        Control
    }

    fn try_lock() -> Option<Control> {
        CONTROL
            .compare_exchange(0, token(), Acquire, Relaxed)
            .is_ok()
            .then_some(Control)
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        CONTROL.store(0, Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::set_running;
    use crate::backing::decay::{TICKS, tick_due};

    /// While the thread serves the process, a small free's decay check is
    /// never due (no countdown); without it, the `TICKS`th is.
    #[test]
    fn small_frees_skip_the_decay_countdown_while_the_thread_serves() {
        set_running(true);
        let due = (0..3 * TICKS).filter(|_| tick_due()).count();
        set_running(false);
        assert_eq!(due, 0, "the countdown ran while the thread served");
        let due = (0..3 * TICKS).filter(|_| tick_due()).count();
        // The countdown restarts only at the decay (`decay::idle`), not
        // called here: exactly one check falls due.
        assert_eq!(due, 1, "checks due in {} frees", 3 * TICKS);
    }
}
