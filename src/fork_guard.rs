//! Keeps `fork` out of MKL's memory manager: a per-thread "inside MKL"
//! marker around every `MKL_malloc` / `MKL_calloc` / `MKL_realloc` /
//! `MKL_free` the crate makes, a lock around the rare calls (statistics,
//! peak usage, freeing buffers), and the prepare handler's side of both.
//!
//! **Why.** MKL's memory manager (oneMKL 2026.2, `mkl_memory_patched.o`)
//! keeps one account per thread in a table of 1,024 spin locks and one
//! global lock. `MKL_malloc` and its kin take the calling thread's (and,
//! for a thread's first call, create its account); `MKL_Mem_Stat`,
//! `MKL_Free_Buffers` and `MKL_Peak_Mem_Usage` take every one; the clean-up
//! MKL runs when a thread that called it exits (`mm_cleanup_thread_cbk`, a
//! `pthread_key` destructor) takes the global lock and all 1,024. MKL has
//! no fork handler: a child forked while another thread was inside any of
//! these inherits that lock taken, and spins for ever at its first MKL call
//! that needs it.
//!
//! **The marker.** Each thread owns a slot of a static array (claimed at
//! its first MKL call, given back at its exit: nothing here is allocated,
//! since the crate may be the global allocator). Around each MKL call the
//! thread stores 1 into its slot's `inside`, checks the process's [`GATE`]
//! word, calls MKL and stores 0: two plain stores and a load, no atomic
//! read-modify-write and no fence. The prepare handler sets the gate's
//! `PENDING` bit and then runs `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`,
//! which makes every running thread of the process execute a full barrier:
//! after it, a thread either had its `inside` store visible to the handler
//! (which then waits for it to leave MKL) or reads `PENDING` (and waits
//! outside MKL until the fork is over). This is the asymmetric fence of
//! folly's `asymmetric_thread_fence_light/heavy` and of Linux's RCU. Where
//! `membarrier` is refused (kernels before 4.14, some sandboxes) the gate
//! carries the `FENCE` bit instead and every call pays a `SeqCst` fence.
//!
//! **Thread exit.** The slot's owner also marks itself (`held`) across the
//! `pthread_key` destructors of its exit, MKL's clean-up among them. Its
//! first MKL call registers a TLS destructor (glibc's
//! `__cxa_thread_atexit_impl`, looked up at the setup), which glibc runs
//! before every `pthread_key` destructor: it marks the thread. The
//! crate's own key's destructor re-arms itself in the first round and, in
//! the second (after MKL's clean-up, whichever key comes first), gives
//! the slot back. The key order alone is not enough: MKL creates its key
//! at its first call, and a program that calls MKL before the crate's
//! setup (Python's `mkl_fft` imported before `mkl_alloc`) has MKL's key
//! first, so MKL's clean-up ran before the crate's destructor, unmarked
//! (issue 34; `tests/fork_mkl_first.rs`). Where the TLS destructor is
//! missing (glibc before 2.18, musl) the key's first round marks the
//! thread: covered only when the crate's key comes first.
//!
//! The main thread is not marked by its TLS destructor: those run in
//! `exit`, which runs no key destructor after them (nothing would give the
//! mark back) and no MKL clean-up either. A main thread that leaves by
//! `pthread_exit` runs only the key destructors, in key order: the crate's
//! key marks it if it comes before MKL's, so the key is made by a
//! constructor of priority 100, before any constructor of the program's
//! own can call MKL (`tests/fork_main_exit.rs`). Not covered: a main
//! thread leaving by `pthread_exit` in a process where MKL ran before even
//! that constructor (from a shared library's constructor, or in a module
//! loaded later, as Python's are).
//!
//! A thread marked `held` stays so through the TLS and key destructors
//! that run after its mark, whatever they do: they may wait on other
//! threads, which may wait at the gate. A fork waiting only for `held`
//! threads therefore backs off every millisecond or so (reopens the gate,
//! releases the rare-call lock, sleeps, and tries again), so that it never
//! waits on a thread that waits on it (issue 41: a logger guard flushing
//! through a worker thread at thread exit hung the parent). A slot whose
//! thread died with `held` set (its first MKL call came during a late
//! destructor round) is found by the prepare handler
//! (`tgkill(pid, tid, 0)` fails) and given back.
//!
//! **The order** in which the prepare handler takes everything (process.rs
//! says it too): (1) the rare-call lock, (2) the gate: wait until no thread
//! is inside an MKL call (so no code beneath MKL runs either), then MKL's
//! own memory-manager locks, for the MKL calls the crate does not make
//! ([`mkl_locks`]), (3) the block cache's shards. A thread holding the rare-call lock may enter MKL
//! (step 2 cannot have begun); a thread inside MKL takes no crate lock; a
//! thread waiting at the gate holds none (no shard lock is held across an
//! MKL call); a thread marked `held` that asks for the rare-call lock while
//! a fork holds it steps out of `held` while it waits.
//!
//! **Fork from a signal handler.** The handler's thread may have been
//! interrupted anywhere: holding the rare-call lock (the lock records its
//! owner: step 1 is skipped), inside MKL (its own slot is not waited for),
//! or holding a shard (see `block_cache::lock_for_fork`). The child then
//! resumes what the interrupted thread was doing once the handler returns.
//!
//! Under loom and Miri (no `fork`, no system calls), and off Linux (this
//! uses `membarrier`, futexes and `tgkill`; Windows has no `fork`), the
//! marker is empty.

#[cfg(all(target_os = "linux", not(any(loom, miri))))]
mod mkl_locks;

#[cfg(all(target_os = "linux", not(any(loom, miri))))]
pub(crate) use real::*;

#[cfg(any(loom, miri, not(target_os = "linux")))]
pub(crate) use empty::*;

#[cfg(any(loom, miri, not(target_os = "linux")))]
mod empty {
    /// Runs `f`, an MKL call (no fork to keep out under loom and Miri, nor
    /// on Windows, which has no `fork`).
    #[inline(always)]
    pub(crate) fn mkl<T>(f: impl FnOnce() -> T) -> T {
        f()
    }

    /// Runs `f`, a rare MKL call.
    #[inline(always)]
    pub(crate) fn rare<T>(f: impl FnOnce() -> T) -> T {
        f()
    }

    /// Nothing to set up.
    pub(crate) fn setup() {}

    /// No fork, no MKL lock to hold across one.
    pub(crate) fn find_mkl_locks() {}

    /// No fork, no MKL lock held across one.
    pub(crate) fn holds_mkl_locks() -> bool {
        false
    }
}

#[cfg(all(target_os = "linux", not(any(loom, miri))))]
mod real {
    use core::cell::Cell;
    use core::ffi::c_void;
    use core::ptr;
    use core::sync::atomic::{
        AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering::AcqRel, Ordering::Acquire,
        Ordering::Relaxed, Ordering::Release, Ordering::SeqCst, compiler_fence, fence,
    };

    /// Threads with a slot of their own; any more (alive at once) share
    /// [`OVERFLOW`], a counter they update with atomic read-modify-writes,
    /// and their exits are not marked. 4,096 (256 KiB of static memory,
    /// resident only as far as threads have claimed slots; the prepare
    /// handler scans up to the highest claimed). With 512, a review's
    /// program of more threads than that hung a child in 3 of 92 forks
    /// (issue 41).
    const SLOTS: usize = 4096;

    /// One thread's marker, on its own cache line (two threads' stores
    /// never meet).
    #[repr(align(64))]
    struct Slot {
        /// 1 while the owner is inside an MKL call (stored by the owner only).
        inside: AtomicU32,
        /// 1 while the owner runs its exit's `pthread_key` destructors.
        held: AtomicU32,
        /// Whether a thread owns the slot.
        claimed: AtomicBool,
        /// The owner's thread id (to find a slot whose owner died).
        tid: AtomicI32,
    }

    impl Slot {
        const fn new() -> Self {
            Slot {
                inside: AtomicU32::new(0),
                held: AtomicU32::new(0),
                claimed: AtomicBool::new(false),
                tid: AtomicI32::new(0),
            }
        }
    }

    static SLOT: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
    /// Slots ever claimed are below this index (the prepare handler's scan).
    static HIGH: AtomicUsize = AtomicUsize::new(0);
    /// Threads without a slot that are inside MKL.
    static OVERFLOW: AtomicUsize = AtomicUsize::new(0);

    /// A fork is being prepared: threads stay out of MKL until it is done.
    const PENDING: u32 = 1;
    /// `membarrier` is not in force: every call fences.
    const FENCE: u32 = 2;
    /// The word every MKL call reads after marking itself. `FENCE` until
    /// the setup has registered `membarrier`.
    static GATE: AtomicU32 = AtomicU32::new(FENCE);

    /// The rare-call lock: 0, or its owner's token (see [`token`]).
    static RARE: AtomicUsize = AtomicUsize::new(0);
    /// Forks waiting for the rare-call lock: while non-zero, rare calls
    /// wait before they take it (a thread calling `stats()` in a loop
    /// would otherwise win it back each time, and the fork would starve:
    /// measured, half a second).
    static RARE_WANTED: AtomicUsize = AtomicUsize::new(0);

    /// The `pthread_key` whose destructor marks a thread's exit, plus one
    /// (0: not created yet).
    static KEY: AtomicUsize = AtomicUsize::new(0);

    /// The thread is not exiting.
    const RUNNING: u8 = 0;
    /// The thread is exiting, marked `held` (by its TLS destructor, or by
    /// the first round of its key's destructor).
    const MARKED: u8 = 1;
    /// The key's destructor ran its first round and re-armed itself: its
    /// second round gives the slot back.
    const ARMED: u8 = 2;

    /// glibc's `__cxa_thread_atexit_impl` (0: not found; looked up at the
    /// setup: glibc 2.18+, so it is not linked, for the manylinux2014
    /// wheels' glibc 2.17).
    static CXA_THREAD_ATEXIT: AtomicUsize = AtomicUsize::new(0);

    /// `int __cxa_thread_atexit_impl(void (*)(void *), void *, void *dso)`.
    type CxaThreadAtexit =
        unsafe extern "C" fn(unsafe extern "C" fn(*mut c_void), *mut c_void, *mut c_void) -> i32;

    /// This thread's slot: null before its first MKL call, [`NO_SLOT`]
    /// when it has none (all taken, or given back at its exit).
    const NO_SLOT: *const Slot = ptr::without_provenance(1);

    thread_local! {
        static MINE: Cell<*const Slot> = const { Cell::new(ptr::null()) };
        /// This thread's part of [`OVERFLOW`] (for a fork from a signal handler).
        static MY_OVERFLOW: Cell<usize> = const { Cell::new(0) };
        /// Where this thread is in its exit: [`RUNNING`], [`MARKED`] or
        /// [`ARMED`].
        static EXIT: Cell<u8> = const { Cell::new(RUNNING) };
        /// What this thread's prepare handler took (see [`prepare`]).
        static TOOK_RARE: Cell<bool> = const { Cell::new(false) };
    }

    /// A token unique to this thread among the live ones: the address of
    /// one of its thread-locals.
    #[inline]
    fn token() -> usize {
        MINE.with(|c| ptr::from_ref(c).addr())
    }

    /// Runs `f`, which calls `MKL_malloc`, `MKL_calloc`, `MKL_realloc` or
    /// `MKL_free` (and nothing that forks), with this thread marked inside
    /// MKL, so that a fork waits for it to leave.
    #[inline(always)]
    pub(crate) fn mkl<T>(f: impl FnOnce() -> T) -> T {
        let slot = MINE.get();
        if slot.addr() <= NO_SLOT.addr() {
            return without_slot(f);
        }
        // SAFETY: a non-null, non-NO_SLOT value of MINE is a slot of the
        // static array that this thread owns.
        let s = unsafe { &*slot };
        s.inside.store(1, Relaxed);
        // The store comes before the gate's load in program order; the
        // prepare handler's membarrier orders them for the hardware.
        compiler_fence(SeqCst);
        if GATE.load(Relaxed) != 0 {
            at_gate(s);
        }
        let r = f();
        // Release: what the call did happens-before a fork that sees 0.
        s.inside.store(0, Release);
        r
    }

    /// The gate is not plain: fence if `membarrier` is not in force; while
    /// a fork is pending, step out of MKL and wait (unless this thread is
    /// `held`: the fork waits for it anyway, so it must not wait for the
    /// fork).
    #[cold]
    #[inline(never)]
    fn at_gate(s: &Slot) {
        loop {
            let mut g = GATE.load(Relaxed);
            if g & FENCE != 0 {
                fence(SeqCst);
                g = GATE.load(Relaxed);
            }
            if g & PENDING == 0 || s.held.load(Relaxed) != 0 {
                return;
            }
            s.inside.store(0, Release);
            wait_for_fork();
            s.inside.store(1, Relaxed);
            compiler_fence(SeqCst);
        }
    }

    /// Waits until no fork is pending (a futex wait on the gate word).
    fn wait_for_fork() {
        loop {
            let g = GATE.load(Acquire);
            if g & PENDING == 0 {
                return;
            }
            // SAFETY: FUTEX_WAIT on a static word: sleeps while it holds `g`
            // (or returns at once); no memory is written.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    GATE.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    g,
                    ptr::null::<libc::timespec>(),
                );
            }
        }
    }

    /// The first MKL call of a thread (which claims a slot), and every call
    /// of a thread without one (which counts in [`OVERFLOW`]).
    #[cold]
    #[inline(never)]
    fn without_slot<T>(f: impl FnOnce() -> T) -> T {
        if MINE.get().is_null() && claim() {
            return mkl(f);
        }
        loop {
            OVERFLOW.fetch_add(1, SeqCst);
            if GATE.load(SeqCst) & PENDING == 0 || nested() {
                break;
            }
            OVERFLOW.fetch_sub(1, SeqCst);
            wait_for_fork();
        }
        MY_OVERFLOW.set(MY_OVERFLOW.get() + 1);
        let r = f();
        MY_OVERFLOW.set(MY_OVERFLOW.get() - 1);
        OVERFLOW.fetch_sub(1, Release);
        r
    }

    /// Whether this thread (without a slot) is inside MKL already: a fork
    /// then waits for it, so it must not wait for the fork.
    fn nested() -> bool {
        MY_OVERFLOW.get() != 0
    }

    /// Claims a free slot for this thread (`false`: none free; the thread
    /// then has [`NO_SLOT`]) and registers its exit destructor.
    fn claim() -> bool {
        let key = key();
        for (i, s) in SLOT.iter().enumerate() {
            if s.claimed.load(Relaxed) || s.claimed.swap(true, Acquire) {
                continue;
            }
            // SAFETY: gettid takes no arguments and cannot fail.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
            s.tid.store(tid, Relaxed);
            s.inside.store(0, Relaxed);
            s.held.store(0, Relaxed);
            // SeqCst: before this thread's first `inside` store, so a fork
            // that misses the new bound sees the gate first (module docs).
            HIGH.fetch_max(i + 1, SeqCst);
            MINE.set(s);
            if let Some(key) = key {
                // SAFETY: a key this module created; the value is a static
                // slot, handed back to `on_exit`. glibc keeps the first 32
                // keys' values in the thread's descriptor (no allocation).
                unsafe { libc::pthread_setspecific(key, ptr::from_ref(s).cast()) };
            }
            let cxa = CXA_THREAD_ATEXIT.load(Relaxed);
            if cxa != 0 {
                // SAFETY: CXA_THREAD_ATEXIT holds the address of glibc's
                // `__cxa_thread_atexit_impl` (see `setup`), of this type.
                let f = unsafe { core::mem::transmute::<usize, CxaThreadAtexit>(cxa) };
                // SAFETY: registers `on_thread_exit` (which never unwinds)
                // with a static slot; the DSO is this module's (a static of
                // it), kept loaded while the thread lives. glibc allocates
                // the entry with its own `calloc`, never this crate's
                // allocator, and this runs outside any MKL call.
                unsafe {
                    f(
                        on_thread_exit,
                        ptr::from_ref(s).cast_mut().cast(),
                        ptr::from_ref(&KEY).cast_mut().cast(),
                    )
                };
            }
            return true;
        }
        MINE.set(NO_SLOT);
        false
    }

    /// The exit destructor's key, made by a constructor of priority 100,
    /// ahead of the program's own prioritised constructors (101 and up)
    /// and of the crate's setup (unprioritised): a program that calls MKL
    /// from a constructor of its own then still has the crate's key before
    /// MKL's, which is what marks a main thread that leaves by
    /// `pthread_exit` (its TLS destructors do not run there: glibc runs
    /// only the key destructors, in key order). Priorities up to 100 are
    /// the toolchain's: this one creates a key and nothing else.
    #[cfg(not(test))]
    #[used]
    #[unsafe(link_section = ".init_array.00100")]
    static KEY_AT_LOAD: extern "C" fn() = {
        extern "C" fn at_load() {
            let _ = key();
        }
        at_load
    };

    /// The exit destructor's key, created if needed (`None`: refused).
    fn key() -> Option<libc::pthread_key_t> {
        match KEY.load(Acquire) {
            0 => {}
            k => return Some((k - 1) as libc::pthread_key_t),
        }
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: creates a key with a destructor that never unwinds.
        if unsafe { libc::pthread_key_create(&mut key, Some(on_exit)) } != 0 {
            return None;
        }
        match KEY.compare_exchange(0, key as usize + 1, AcqRel, Acquire) {
            Ok(_) => Some(key),
            Err(k) => {
                // Another thread created one first: keep theirs.
                // SAFETY: our own key, never handed out.
                unsafe { libc::pthread_key_delete(key) };
                Some((k - 1) as libc::pthread_key_t)
            }
        }
    }

    /// The thread's TLS destructor (`__cxa_thread_atexit_impl`'s), which
    /// glibc runs at a thread's exit before every `pthread_key` destructor:
    /// marks the thread `held` before MKL's clean-up can run, whichever key
    /// came first (issue 34: MKL called before the crate's setup creates
    /// its key first, and its clean-up then ran before `on_exit`'s first
    /// round, unmarked). Not on the main thread: its TLS destructors run in
    /// `exit`, which runs no key destructor after them (nothing would give
    /// the mark back), and where MKL's clean-up does not run either.
    unsafe extern "C" fn on_thread_exit(value: *mut c_void) {
        let slot = value.cast_const().cast::<Slot>();
        if slot != MINE.get() || EXIT.get() != RUNNING {
            return;
        }
        // SAFETY: gettid and getpid take no arguments and cannot fail.
        if unsafe { libc::syscall(libc::SYS_gettid) } as i32 == unsafe { libc::getpid() } {
            return;
        }
        // SAFETY: the value set in `claim`: a static slot this thread owns.
        mark_exiting(unsafe { &*slot });
    }

    /// The exit destructor (the key's). First round: mark the thread `held`
    /// unless its TLS destructor did, and re-arm, so that MKL's clean-up
    /// runs marked if its key comes later. Second round: give the slot back.
    unsafe extern "C" fn on_exit(value: *mut c_void) {
        let slot = value.cast_const().cast::<Slot>();
        if slot != MINE.get() {
            return; // not this thread's (cannot happen: keys are per thread)
        }
        // SAFETY: the value set in `claim`: a static slot this thread owns.
        let s = unsafe { &*slot };
        if EXIT.get() != ARMED {
            if EXIT.get() == RUNNING {
                mark_exiting(s);
            }
            EXIT.set(ARMED);
            if let Some(key) = key() {
                // SAFETY: re-arms this thread's value of our key for the
                // next destructor round (no allocation, see `claim`).
                unsafe { libc::pthread_setspecific(key, value) };
            }
            return;
        }
        release(s);
        MINE.set(NO_SLOT);
    }

    /// Marks this exiting thread `held` (waiting at the gate like an MKL
    /// call while a fork is pending).
    fn mark_exiting(s: &Slot) {
        EXIT.set(MARKED);
        s.held.store(1, Relaxed);
        compiler_fence(SeqCst);
        while GATE.load(Relaxed) != 0 {
            let mut g = GATE.load(Relaxed);
            if g & FENCE != 0 {
                fence(SeqCst);
                g = GATE.load(Relaxed);
            }
            if g & PENDING == 0 {
                break;
            }
            s.held.store(0, Release);
            wait_for_fork();
            s.held.store(1, Relaxed);
            compiler_fence(SeqCst);
        }
    }

    /// Gives a slot back (its owner left MKL and is exiting, or is gone).
    fn release(s: &Slot) {
        s.inside.store(0, Relaxed);
        s.held.store(0, Relaxed);
        s.claimed.store(false, Release);
    }

    /// Runs `f`, a rare MKL call (statistics, peak usage, freeing buffers),
    /// under the rare-call lock, which the prepare handler takes first.
    pub(crate) fn rare<T>(f: impl FnOnce() -> T) -> T {
        if MINE.get().is_null() {
            // MKL may create this thread's account: its exit is then
            // marked too.
            claim();
        }
        let me = token();
        if RARE.load(Relaxed) == me {
            return f(); // nested (a rare call inside another)
        }
        lock_rare(me);
        let r = f();
        RARE.store(0, Release);
        r
    }

    /// Takes the rare-call lock. A `held` thread (at its exit) steps out of
    /// `held` while it waits: the lock may be a fork's, waiting for it.
    fn lock_rare(me: usize) {
        if RARE_WANTED.load(Relaxed) == 0 && RARE.compare_exchange(0, me, Acquire, Relaxed).is_ok()
        {
            return;
        }
        let slot = MINE.get();
        let s = (slot.addr() > NO_SLOT.addr()).then(|| {
            // SAFETY: as in `mkl`.
            unsafe { &*slot }
        });
        let was_held = s.is_some_and(|s| s.held.load(Relaxed) != 0);
        if let (true, Some(s)) = (was_held, s) {
            s.held.store(0, Release);
        }
        let mut spins = 0u32;
        while RARE_WANTED.load(Relaxed) != 0
            || RARE.compare_exchange_weak(0, me, Acquire, Relaxed).is_err()
        {
            pause(&mut spins);
        }
        if let (true, Some(s)) = (was_held, s) {
            // No fork is pending while this thread holds the lock.
            s.held.store(1, Relaxed);
        }
    }

    /// Once, at the process's setup, before its first MKL call: creates
    /// the exit destructor's key (so that it precedes MKL's keys, unless
    /// MKL ran first), looks up `__cxa_thread_atexit_impl` (see
    /// `on_thread_exit`) and registers `membarrier`; the gate's `FENCE`
    /// bit is cleared if that succeeded.
    pub(crate) fn setup() {
        let _ = key();
        if CXA_THREAD_ATEXIT.load(Relaxed) == 0 {
            // SAFETY: looks a symbol up by a NUL-terminated name.
            let f =
                unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__cxa_thread_atexit_impl".as_ptr()) };
            CXA_THREAD_ATEXIT.store(f.addr(), Relaxed);
        }
        if GATE.load(Relaxed) & FENCE != 0 && register_membarrier() {
            GATE.fetch_and(!FENCE, SeqCst);
        }
    }

    /// At the setup, once MKL is loaded (after `libmkl_rt` resolved its
    /// entries): finds MKL's memory-manager locks, which every fork then
    /// holds (`mkl_locks`).
    pub(crate) fn find_mkl_locks() {
        super::mkl_locks::find();
    }

    /// Whether forks hold MKL's memory-manager locks (`mkl_locks`).
    pub(crate) fn holds_mkl_locks() -> bool {
        super::mkl_locks::found()
    }

    const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    fn membarrier(cmd: libc::c_int) -> libc::c_long {
        // SAFETY: membarrier takes a command and two zero arguments; it
        // touches no memory of ours.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
    }

    fn register_membarrier() -> bool {
        let cmds = membarrier(MEMBARRIER_CMD_QUERY);
        cmds >= 0
            && cmds & libc::c_long::from(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0
            && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
            && membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0
    }

    /// The prepare handler's steps 1 and 2 (module docs): the rare-call
    /// lock (unless this thread holds it: a fork from a signal handler),
    /// then the gate closed and every other thread out of MKL.
    ///
    /// A thread marked `held` runs its exit's destructors, which may wait
    /// on other threads (a logger's guard flushing through a worker at
    /// thread exit), and those may be waiting at the closed gate or for the
    /// rare-call lock: a fork that only waited would never return (issue
    /// 41). So while the only threads it waits for are `held` ones, the
    /// fork backs off every [`BACK_OFF_SPINS`] spins: it reopens the gate,
    /// releases the lock it took, sleeps for a millisecond and starts
    /// again. A fork therefore never waits on a thread that waits on the
    /// fork; at worst it waits as long as a destructor runs.
    pub(crate) fn prepare() {
        let me = token();
        let took = RARE.load(Relaxed) != me;
        TOOK_RARE.set(took);
        loop {
            if took {
                lock_rare_for_fork(me);
            }
            GATE.fetch_or(PENDING, SeqCst);
            if GATE.load(Relaxed) & FENCE != 0 || membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0
            {
                // Not in force: the fast path fences (FENCE); so does this side.
                fence(SeqCst);
            }
            if others_out_of_mkl() {
                // Step 2 done: no call of the crate's is inside MKL. Now
                // the calls that are not the crate's (module docs of
                // `mkl_locks`): MKL's own locks, in MKL's order. Not from
                // a signal handler that interrupted this thread in MKL
                // (or holding the rare-call lock, or in its exit's
                // clean-up): it may hold some of them, and the child
                // resumes that call, which gives them back itself.
                if took && !inside_mkl_here() {
                    super::mkl_locks::hold();
                }
                return;
            }
            // Back off: everything this attempt took, given back.
            reopen_gate();
            if took {
                RARE.store(0, Release);
            }
            sleep_ms(1);
        }
    }

    /// Whether this thread is inside an MKL call of the crate's or marked
    /// `held` (a fork from a signal handler that interrupted it there).
    fn inside_mkl_here() -> bool {
        let mine = MINE.get();
        if MY_OVERFLOW.get() != 0 {
            return true;
        }
        if mine.addr() <= NO_SLOT.addr() {
            return false;
        }
        // SAFETY: as in `mkl`: this thread's slot.
        let s = unsafe { &*mine };
        s.inside.load(Relaxed) != 0 || s.held.load(Relaxed) != 0
    }

    /// Spins of [`prepare`] waiting only for `held` threads before it backs
    /// off (about a millisecond: a thread's own clean-up in MKL takes
    /// microseconds).
    const BACK_OFF_SPINS: u32 = 2048;

    /// Takes the rare-call lock for a fork, ahead of the rare calls waiting
    /// for it (see [`RARE_WANTED`]).
    fn lock_rare_for_fork(me: usize) {
        RARE_WANTED.fetch_add(1, Relaxed);
        let mut spins = 0u32;
        while RARE.compare_exchange_weak(0, me, Acquire, Relaxed).is_err() {
            pause(&mut spins);
        }
        RARE_WANTED.fetch_sub(1, Relaxed);
    }

    /// Waits, with the gate closed, until no other thread is inside MKL or
    /// marked `held`: `true`. `false`: only `held` threads were left for
    /// [`BACK_OFF_SPINS`] spins, and the caller backs off (see [`prepare`]).
    /// A slot whose thread died `held` is given back on the way.
    fn others_out_of_mkl() -> bool {
        let mine = MINE.get();
        let my_overflow = MY_OVERFLOW.get();
        let mut spins = 0u32;
        let mut held_only = 0u32;
        loop {
            let mut inside = OVERFLOW.load(Acquire) != my_overflow;
            let mut held = false;
            for s in &SLOT[..HIGH.load(Acquire).min(SLOTS)] {
                if ptr::eq(s, mine) {
                    continue;
                }
                if s.inside.load(Acquire) != 0 {
                    inside = true;
                } else if s.held.load(Acquire) != 0 {
                    if spins > 1064 && !alive(s.tid.load(Relaxed)) {
                        release(s);
                    } else {
                        held = true;
                    }
                }
            }
            if !inside && !held {
                return true;
            }
            // A thread inside an MKL call leaves it without waiting on
            // anything of the program's; a held one may not.
            held_only = if inside { 0 } else { held_only + 1 };
            if held_only > BACK_OFF_SPINS {
                return false;
            }
            pause(&mut spins);
        }
    }

    /// Reopens the gate and wakes the threads waiting at it.
    fn reopen_gate() {
        GATE.fetch_and(!PENDING, SeqCst);
        // SAFETY: FUTEX_WAKE on a static word wakes the threads waiting at
        // the gate; no memory is written.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                GATE.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            );
        }
    }

    /// Sleeps `ms` milliseconds (async-signal-safe: a fork's prepare
    /// handler may run in a signal handler).
    fn sleep_ms(ms: i64) {
        let t = libc::timespec {
            tv_sec: 0,
            tv_nsec: ms * 1_000_000,
        };
        // SAFETY: nanosleep reads the timespec on our stack; an early wake
        // (a signal) only shortens the back-off.
        unsafe { libc::nanosleep(&t, ptr::null_mut()) };
    }

    /// One wait of a spin: a pause instruction at first, then the CPU
    /// given up (the thread waited for may be off it).
    fn pause(spins: &mut u32) {
        *spins = spins.saturating_add(1);
        if *spins < 64 {
            core::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }

    /// Whether the thread `tid` of this process still exists.
    fn alive(tid: i32) -> bool {
        // SAFETY: signal 0 only checks that the thread exists.
        let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }

    /// The parent's and the child's handler: reopen the gate, release the
    /// rare-call lock if [`prepare`] took it. In the child (`child`), the
    /// other threads are gone: their slots and counts are given back.
    pub(crate) fn after_fork(child: bool) {
        super::mkl_locks::release(child);
        if child {
            let mine = MINE.get();
            for s in &SLOT[..HIGH.load(Relaxed).min(SLOTS)] {
                if !ptr::eq(s, mine) && s.claimed.load(Relaxed) {
                    release(s);
                }
            }
            if mine.addr() > NO_SLOT.addr() {
                // SAFETY: as in `mkl`: this thread's slot; its thread id
                // changed with the fork.
                let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
                // SAFETY: as in `mkl`.
                unsafe { &*mine }.tid.store(tid, Relaxed);
            }
            OVERFLOW.store(MY_OVERFLOW.get(), Relaxed);
            // The background decay thread is the parent's: not running here
            // (the child starts its own when it next needs one).
            crate::background::after_fork_in_child();
        }
        if child {
            GATE.fetch_and(!PENDING, SeqCst);
        } else {
            reopen_gate();
        }
        if TOOK_RARE.get() {
            RARE.store(0, Release);
        }
    }
}
