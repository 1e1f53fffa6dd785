//! Transparent huge pages for large MKL blocks: on by default from 4 MiB.
//!
//! For a big numeric buffer the allocator's cost is page faults, not
//! bookkeeping: first touching 512 MiB takes 131 073 faults on 4 KiB pages and
//! 258 on 2 MiB pages. With the policy on, every chunk beneath MKL (see the
//! crate's `backing`) of at least the threshold, whoever asked MKL for it
//! ([`MklAllocator`](crate::MklAllocator),
//! [`MklSplitAllocator`](struct@crate::MklSplitAllocator),
//! [`SharedMklVec`](crate::SharedMklVec), NumPy under the Python handler,
//! MKL's own routines), is advised with `madvise(MADV_HUGEPAGE)` when it is
//! mapped, taken from the cache or grown. Chunks start on 2 MiB boundaries,
//! so every whole 2 MiB frame of one can be a huge page, and a chunk grown
//! with `mremap` keeps its huge pages (their page tables move). Chunks
//! below the threshold are untouched.
//!
//! **On by default** for blocks of [`DEFAULT_THRESHOLD`] (4 MiB) and more,
//! the threshold at which NumPy's own allocator advises its blocks: with
//! the block cache (also on by default) a reused block keeps its huge
//! pages, and a large buffer is faulted in 2 MiB at a time. The price: a
//! touched huge page commits 2 MiB at once (a sparse touch of a large
//! buffer costs more resident memory than on 4 KiB pages, as under NumPy's
//! allocator), and on a machine whose memory is fragmented the first huge
//! pages can stall (docs/tuning.md has the measurements). Turn it off with
//! [`disable`] or the environment variable `MKL_ALLOC_HUGE_PAGES`:
//!
//! | `MKL_ALLOC_HUGE_PAGES` | Policy |
//! |---|---|
//! | unset, empty or `on` | blocks of at least 4 MiB ([`DEFAULT_THRESHOLD`]), the default |
//! | `off` or `0` | off: exactly the MKL calls of a build without this module |
//! | a byte count (decimal digits), e.g. `67108864` | blocks of at least that many bytes |
//!
//! The variable is read once, at the crate's setup (when the program
//! loads, from an ELF constructor on Linux or, in a Windows executable, a
//! C runtime initialiser; elsewhere at the first allocation that needs the
//! policy or the first call of [`threshold`]), with libc's `getenv` (`GetEnvironmentVariableW` on Windows; the global
//! allocator must not allocate to ask); [`enable`] and [`disable`] override
//! it at any time. Any other value keeps the default, with one line on
//! stderr. [`source`] says where the threshold in force came from (the
//! default, the variable, or the program), as `manager::settings()` reports.
//!
//! Where THP is `never`, or the kernel refuses the advice, nothing fails: the
//! advice is ignored and [`status`] says so, and [`unavailable_reason`]
//! says why. (Under `never` the kernel still accepts `MADV_HUGEPAGE` and
//! [`advised_bytes`] counts it; without THP in the kernel the advice fails
//! and is not counted.)
//!
//! **On Windows** there is no advice: memory is on large pages only if it
//! is allocated so (`VirtualAlloc` with `MEM_LARGE_PAGES`), by a process
//! holding `SeLockMemoryPrivilege` (the "Lock pages in memory" user right,
//! which an administrator grants to an account: `secpol.msc`, User Rights
//! Assignment; it takes effect at the next logon). At the policy's first
//! large chunk (or the first call of [`status`]) the crate enables the
//! privilege where the process's token holds it, as mimalloc does; then
//! [`status`] is [`Status::LargePages`] and every fresh chunk under the
//! policy is allocated on large pages, its size rounded up to whole large
//! pages (2 MiB), and counted in [`advised_bytes`]. Such memory is
//! committed at once and never paged out: a shrink keeps the chunk whole,
//! the block cache cannot let the system reclaim it (`MEM_RESET`), and
//! lazy zeroing writes it. Where the system has no contiguous physical
//! memory for one, the chunk is on ordinary pages, as without the
//! privilege. Without it, [`status`] is [`Status::Unavailable`] and
//! [`unavailable_reason`] says "the process does not hold
//! SeLockMemoryPrivilege (Windows large pages)".
//!
//! ```
//! use allocator_api2::vec::Vec;
//! use mkl_alloc::{MklAllocator, huge_pages};
//!
//! huge_pages::enable(huge_pages::HUGE_PAGE_SIZE);
//! let before = huge_pages::advised_bytes();
//! let mut v: Vec<f64, MklAllocator> = Vec::with_capacity_in(1 << 21, MklAllocator); // 16 MiB
//! v.resize(1 << 21, 1.0);
//! if huge_pages::status().is_available() {
//!     assert!(huge_pages::advised_bytes() > before);
//! }
//! huge_pages::disable();
//! # drop(v);
//! ```

use core::ffi::CStr;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

use crate::env::SizePolicy;
use crate::env::Source;

/// The size of an x86-64 transparent huge page (2 MiB): the granule that is
/// advised, and the threshold `MKL_ALLOC_HUGE_PAGES=on` sets.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// The threshold the policy has by default and with `MKL_ALLOC_HUGE_PAGES=on`
/// (4 MiB, NumPy's threshold for its own `madvise(MADV_HUGEPAGE)`).
pub const DEFAULT_THRESHOLD: usize = 4 << 20;

/// The threshold, `OFF` while the policy is off (see `SizePolicy`).
static POLICY: SizePolicy = SizePolicy::new();
const OFF: usize = SizePolicy::OFF;

/// Bytes advised with `MADV_HUGEPAGE` successfully since the process started.
static ADVISED: AtomicU64 = AtomicU64::new(0);

const ENV: &CStr = c"MKL_ALLOC_HUGE_PAGES";

/// Where the threshold in force came from (see [`source`]): `SOURCE_UNREAD`
/// until `read_env` or a setter runs, then `source_code`'s. A setter's
/// store wins over an environment read racing it (the read only fills an
/// unread word), as the policy word's own does.
static SOURCE: AtomicU8 = AtomicU8::new(SOURCE_UNREAD);
const SOURCE_UNREAD: u8 = 0;

fn source_code(s: Source) -> u8 {
    match s {
        Source::Default => 1,
        Source::Environment => 2,
        Source::Program => 3,
    }
}

/// Turns the policy on for MKL blocks of at least `min_bytes` bytes (a
/// `min_bytes` of 0 is the same as 1, every block; a block smaller than
/// 4 MiB may have no aligned 2 MiB interior to advise, and `usize::MAX` is
/// stored as `usize::MAX - 1`, which selects the same blocks: none).
/// Overrides `MKL_ALLOC_HUGE_PAGES`.
/// Blocks allocated before keep the advice they had.
///
/// ```
/// use mkl_alloc::huge_pages;
///
/// huge_pages::enable(64 << 20);
/// assert_eq!(huge_pages::threshold(), Some(64 << 20));
/// huge_pages::disable();
/// ```
pub fn enable(min_bytes: usize) {
    // OFF is no threshold at all: usize::MAX - 1 selects the same blocks
    // (none has size usize::MAX), and 0 is stored as 1 (every block).
    SOURCE.store(source_code(Source::Program), Relaxed);
    POLICY.set(min_bytes.min(OFF - 1));
}

/// Turns the policy off: chunks mapped or grown from now on are not
/// advised. Overrides `MKL_ALLOC_HUGE_PAGES`.
///
/// ```
/// use mkl_alloc::huge_pages;
///
/// huge_pages::disable();
/// assert_eq!(huge_pages::threshold(), None);
/// ```
pub fn disable() {
    SOURCE.store(source_code(Source::Program), Relaxed);
    POLICY.set(OFF);
}

/// Where the threshold in force ([`threshold`]) came from:
/// [`Source::Program`] once [`enable`] or [`disable`] was called (even with
/// the value the environment gave), [`Source::Environment`] if
/// `MKL_ALLOC_HUGE_PAGES` held a value the crate understood when it read
/// it, else [`Source::Default`] (unset, empty, or a value it ignored).
/// Reads `MKL_ALLOC_HUGE_PAGES` if nothing did yet.
///
/// ```
/// use mkl_alloc::huge_pages;
/// use mkl_alloc::manager::Source;
///
/// huge_pages::enable(huge_pages::DEFAULT_THRESHOLD);
/// assert_eq!(huge_pages::source(), Source::Program);
/// ```
pub fn source() -> Source {
    threshold();
    match SOURCE.load(Relaxed) {
        3 => Source::Program,
        2 => Source::Environment,
        _ => Source::Default,
    }
}

/// The threshold in force: `Some(min_bytes)` while the policy is on, `None`
/// while it is off. Reads `MKL_ALLOC_HUGE_PAGES` if nothing did yet.
///
/// ```
/// use mkl_alloc::huge_pages;
///
/// huge_pages::enable(huge_pages::HUGE_PAGE_SIZE);
/// assert_eq!(huge_pages::threshold(), Some(2 << 20));
/// huge_pages::disable();
/// ```
pub fn threshold() -> Option<usize> {
    match POLICY.get(read_env) {
        OFF => None,
        t => Some(t),
    }
}

/// Bytes advised with `madvise(MADV_HUGEPAGE)` successfully since the
/// process started (a block grown or allocated several times counts each
/// time); on Windows, bytes of the chunks on large pages, counted where
/// Linux would advise them (mapped, taken from the cache or grown). It moves only while the policy is on and the kernel accepts the
/// advice: the way to confirm the policy acts (whether the kernel then backs
/// the range with huge pages is [`status`]'s question, and `AnonHugePages` in
/// `/proc/self/smaps` shows it).
///
/// ```
/// use mkl_alloc::huge_pages;
///
/// let advised: u64 = huge_pages::advised_bytes();
/// println!("{advised} bytes advised for huge pages so far");
/// ```
pub fn advised_bytes() -> u64 {
    ADVISED.load(Relaxed)
}

/// The kernel's transparent-huge-page mode, from
/// `/sys/kernel/mm/transparent_hugepage/enabled`; on Windows, whether the
/// process can allocate large pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// `always`: every large anonymous mapping may get huge pages, advised or not.
    Always,
    /// `madvise`: only advised ranges get huge pages (what this policy does).
    Madvise,
    /// `never`: no huge pages; the advice is accepted and ignored.
    Never,
    /// The file is missing or unreadable (no THP in this kernel, or not
    /// Linux); on Windows, no large pages: [`unavailable_reason`] says why.
    Unavailable,
    /// Windows: the process holds `SeLockMemoryPrivilege`, which the crate
    /// enabled, and the system has large pages: fresh chunks under the
    /// policy are allocated on them (see the module docs).
    LargePages,
}

impl Status {
    /// Whether blocks under the policy can get huge pages (`Always` or
    /// `Madvise`; `LargePages` on Windows).
    ///
    /// ```
    /// use mkl_alloc::huge_pages::Status;
    ///
    /// assert!(Status::Madvise.is_available());
    /// assert!(Status::LargePages.is_available());
    /// assert!(!Status::Never.is_available());
    /// ```
    pub fn is_available(self) -> bool {
        matches!(self, Status::Always | Status::Madvise | Status::LargePages)
    }

    /// Parses the contents of the `enabled` file: the bracketed word
    /// (`always [madvise] never` is `Madvise`); `Unavailable` if none.
    ///
    /// ```
    /// use mkl_alloc::huge_pages::Status;
    ///
    /// assert_eq!(Status::parse("always [madvise] never\n"), Status::Madvise);
    /// assert_eq!(Status::parse("[never]"), Status::Never);
    /// assert_eq!(Status::parse(""), Status::Unavailable);
    /// ```
    pub fn parse(enabled: &str) -> Status {
        let chosen = enabled
            .split_whitespace()
            .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'));
        match chosen {
            Some("always") => Status::Always,
            Some("madvise") => Status::Madvise,
            Some("never") => Status::Never,
            _ => Status::Unavailable,
        }
    }
}

/// Reads `/sys/kernel/mm/transparent_hugepage/enabled` (each call: the
/// administrator may change it at run time). On Windows: `LargePages`
/// where the process holds `SeLockMemoryPrivilege` (the first call, or
/// the policy's first large chunk, enables it: see the module docs), else
/// `Unavailable`; the answer is kept for the process's life.
///
/// ```
/// use mkl_alloc::huge_pages;
///
/// match huge_pages::status() {
///     s if s.is_available() => println!("huge pages {s:?}: the policy can act"),
///     s => println!("huge pages {s:?}: nothing fails, but none are used"),
/// }
/// ```
pub fn status() -> Status {
    #[cfg(windows)]
    return match crate::sys::large_pages() {
        Ok(_) => Status::LargePages,
        Err(_) => Status::Unavailable,
    };
    #[cfg(not(windows))]
    {
        match crate::sys::thp_enabled() {
            Some(s) => Status::parse(&s),
            None => Status::Unavailable,
        }
    }
}

/// Why blocks under the policy get no huge pages in this process (see
/// [`unavailable_reason`]); its `Display` is a sentence for the user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Linux: `/sys/kernel/mm/transparent_hugepage/enabled` is missing or
    /// unreadable (no transparent huge pages in this kernel).
    NoThp,
    /// Linux: transparent huge pages are `never`.
    ThpNever,
    /// Windows: the process's token does not hold `SeLockMemoryPrivilege`
    /// (`AdjustTokenPrivileges` reported `ERROR_NOT_ALL_ASSIGNED`).
    NoLockMemoryPrivilege,
    /// Windows: enabling `SeLockMemoryPrivilege` failed: the call that
    /// failed and its error code (`GetLastError`).
    PrivilegeCallFailed {
        /// `OpenProcessToken`, `LookupPrivilegeValueW` or
        /// `AdjustTokenPrivileges`.
        call: &'static str,
        /// The system's error code.
        error: u32,
    },
    /// Windows: the system has no large pages (`GetLargePageMinimum`
    /// returned 0).
    NoLargePages,
    /// Neither Linux nor Windows: the crate has no huge pages there.
    Unsupported,
}

impl core::fmt::Display for Reason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Reason::NoThp => f.write_str(
                "no transparent huge pages: /sys/kernel/mm/transparent_hugepage/enabled is missing or unreadable",
            ),
            Reason::ThpNever => f.write_str(
                "transparent huge pages are `never` (/sys/kernel/mm/transparent_hugepage/enabled): the advice is ignored",
            ),
            Reason::NoLockMemoryPrivilege => f.write_str(
                "the process does not hold SeLockMemoryPrivilege (Windows large pages): grant its account \"Lock pages in memory\" (secpol.msc, User Rights Assignment) and log on again",
            ),
            Reason::PrivilegeCallFailed { call, error } => write!(
                f,
                "enabling SeLockMemoryPrivilege for Windows large pages failed: {call} returned error {error}"
            ),
            Reason::NoLargePages => f.write_str(
                "the system has no large pages (GetLargePageMinimum returned 0)",
            ),
            Reason::Unsupported => f.write_str(
                "huge pages are supported on Linux (transparent huge pages) and Windows (large pages) only",
            ),
        }
    }
}

/// Why [`status`] is not available: `None` where blocks under the policy
/// can get huge pages ([`Status::is_available`]), else the reason, whose
/// `Display` says what to change. On Windows this runs the privilege check
/// (see [`status`]).
///
/// ```
/// use mkl_alloc::huge_pages;
///
/// match huge_pages::unavailable_reason() {
///     None => assert!(huge_pages::status().is_available()),
///     Some(why) => {
///         assert!(!huge_pages::status().is_available());
///         println!("no huge pages: {why}");
///     }
/// }
/// ```
pub fn unavailable_reason() -> Option<Reason> {
    #[cfg(windows)]
    return crate::sys::large_pages().err().map(|e| match e {
        crate::sys::LargePageError::NotHeld => Reason::NoLockMemoryPrivilege,
        crate::sys::LargePageError::NoLargePages => Reason::NoLargePages,
        crate::sys::LargePageError::Call(call, error) => {
            Reason::PrivilegeCallFailed { call, error }
        }
    });
    #[cfg(not(windows))]
    {
        match status() {
            _ if !cfg!(target_os = "linux") => Some(Reason::Unsupported),
            Status::Unavailable => Some(Reason::NoThp),
            Status::Never => Some(Reason::ThpNever),
            _ => None,
        }
    }
}

/// Reads `MKL_ALLOC_HUGE_PAGES` (once, without allocating: see `env`).
fn read_env() -> usize {
    const WARNING: &[u8] =
        b"mkl-alloc: MKL_ALLOC_HUGE_PAGES must be off, on or a byte count (4194304, 4M, 4MiB); huge pages keep their default (4 MiB)\n";
    let mut buf = crate::sys::EnvBuf::new();
    let value = crate::sys::env_var(ENV, &mut buf);
    let (policy, from) = match crate::env::parse(value, DEFAULT_THRESHOLD) {
        Ok(p) if !value.is_empty() => (p, Source::Environment),
        Ok(p) => (p, Source::Default),
        Err(()) => {
            crate::sys::write_stderr(WARNING);
            (Some(DEFAULT_THRESHOLD), Source::Default)
        }
    };
    // Only an unread word: a setter that ran meanwhile keeps its `Program`.
    let _ = SOURCE.compare_exchange(SOURCE_UNREAD, source_code(from), Relaxed, Relaxed);
    match policy {
        Some(t) => t.min(OFF - 1),
        None => OFF,
    }
}

/// Whether a block of `size` bytes falls under the policy. For a block
/// below the threshold (and whenever the policy is off) this is one relaxed
/// load and one comparison.
#[inline(always)]
pub(crate) fn applies(size: usize) -> bool {
    POLICY.covers(size, read_env)
}

/// Advises the 2 MiB-aligned interior of the block `[ptr, ptr + size)` with
/// `MADV_HUGEPAGE` and counts the bytes if the kernel accepts. Failure (THP
/// not built in, `EINVAL`) is ignored: the block is as usable as before.
///
/// # Safety
/// `[ptr, ptr + size)` is a live block owned by the caller: the advice must
/// not reach memory that belongs to anyone else (it changes no contents,
/// only how the kernel backs the range).
#[inline(never)]
pub(crate) unsafe fn advise(ptr: *mut u8, size: usize) {
    let addr = ptr as usize;
    let start = addr.next_multiple_of(HUGE_PAGE_SIZE);
    let end = (addr + size) & !(HUGE_PAGE_SIZE - 1);
    if end <= start {
        return;
    }
    // SAFETY: [start, end) lies inside the caller's block (start ≥ addr,
    // end ≤ addr + size) and is page-aligned; MADV_HUGEPAGE changes neither
    // contents nor protection.
    let advised = unsafe { crate::sys::advise_huge(ptr.wrapping_add(start - addr), end - start) };
    if advised {
        ADVISED.fetch_add((end - start) as u64, Relaxed);
    }
}

/// Advises a whole chunk `[ptr, ptr + size)` beneath MKL (2 MiB-aligned, a
/// whole number of 4 KiB pages), counting its whole 2 MiB frames. The
/// advice covers the chunk's partial last frame too, so that the mapping
/// stays one (`mremap` moves only a single mapping); that frame stays on
/// small pages anyway, the mapping ending inside it.
///
/// # Safety
/// `[ptr, ptr + size)` is a chunk of the crate's that the caller owns.
pub(crate) unsafe fn advise_chunk(ptr: *mut u8, size: usize) {
    // SAFETY: the caller's contract; MADV_HUGEPAGE changes neither contents
    // nor protection.
    if unsafe { crate::sys::advise_huge(ptr, size) } {
        ADVISED.fetch_add((size & !(HUGE_PAGE_SIZE - 1)) as u64, Relaxed);
    }
}
