//! The platform primitives on Linux (and other Unix): libc.

use core::ffi::{CStr, c_void};

/// The machine's physical memory in bytes, or `None` where `sysconf`
/// cannot tell.
pub(crate) fn physical_memory() -> Option<usize> {
    // SAFETY: sysconf takes any name and returns -1 for one it does not
    // know; it allocates nothing.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| (pages as usize).saturating_mul(page as usize))
}

/// Milliseconds of the coarse monotonic clock: on Linux a vDSO read of the
/// last tick (a few ns, no system call, no hardware clock read), with a
/// resolution of one kernel tick (1-10 ms). Wraps around; callers compare
/// differences.
pub(crate) fn now_ms() -> usize {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[cfg(target_os = "linux")]
    const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC_COARSE;
    #[cfg(not(target_os = "linux"))]
    const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(CLOCK, &mut ts) };
    (ts.tv_sec as usize)
        .wrapping_mul(1000)
        .wrapping_add(ts.tv_nsec as usize / 1_000_000)
}

/// Nanoseconds of the monotonic clock (a vDSO read on Linux, no system
/// call): for timing what the crate itself does, where [`now_ms`]'s tick
/// is too coarse. Wraps around; callers compare differences.
#[cfg(all(target_os = "linux", target_env = "gnu", not(miri), not(loom)))]
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Gives the C runtime's free heap memory back to the system: glibc's
/// `malloc_trim(0)`, which shrinks the top of every arena and releases
/// (`MADV_DONTNEED`) the whole pages inside its free chunks. It takes
/// each arena's lock in turn and allocates nothing; where another
/// `malloc` is preloaded (jemalloc, mimalloc) it trims glibc's own,
/// unused, heap: a few microseconds. Whether any memory was released.
#[cfg(all(target_os = "linux", target_env = "gnu", not(miri), not(loom)))]
pub(crate) fn trim_c_runtime_heap() -> bool {
    // SAFETY: malloc_trim takes a pad in bytes and has no preconditions;
    // it is safe to call from any thread at any time, inside MKL's
    // calls too (the hooks call glibc's malloc there already).
    unsafe { libc::malloc_trim(0) != 0 }
}

/// Releases the pages of `[ptr, ptr + len)` with `madvise(MADV_DONTNEED)`:
/// afterwards they read as zero and cost a page fault when touched.
/// `false` if the kernel refused (the contents are then unchanged, and the
/// caller writes the zeros itself).
///
/// # Safety
/// `ptr` and `len` are multiples of the page size, and the range is
/// private anonymous memory that the caller owns and may write (its
/// contents are given up).
pub(crate) unsafe fn discard_to_zero(ptr: *mut u8, len: usize) -> bool {
    // Miri has no `madvise`: the caller writes the zeros.
    if cfg!(miri) {
        return false;
    }
    // SAFETY: the caller owns the page-aligned private anonymous range:
    // releasing it changes no other memory, and its pages read as zero after.
    unsafe { libc::madvise(ptr.cast::<c_void>(), len, libc::MADV_DONTNEED) == 0 }
}

/// Advises `[ptr, ptr + len)` with `madvise(MADV_HUGEPAGE)`; `true` if the
/// kernel accepted the advice.
///
/// # Safety
/// The range is page-aligned and lies inside a live block that the caller
/// owns (the advice changes neither contents nor protection, only how the
/// kernel backs the range).
pub(crate) unsafe fn advise_huge(ptr: *mut u8, len: usize) -> bool {
    // Miri has no `madvise`: the advice fails, as in a kernel without THP.
    if cfg!(miri) {
        return false;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: the caller's page-aligned range; MADV_HUGEPAGE changes
    // neither contents nor protection.
    let rc = unsafe { libc::madvise(ptr.cast::<c_void>(), len, libc::MADV_HUGEPAGE) };
    #[cfg(not(target_os = "linux"))]
    let rc = {
        let _ = (ptr, len);
        -1
    };
    rc == 0
}

/// The contents of `/sys/kernel/mm/transparent_hugepage/enabled`, or
/// `None` where it cannot be read (no THP in this kernel). Allocates: not
/// for the allocation path.
pub(crate) fn thp_enabled() -> Option<String> {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()
}

/// Registers `pthread_atfork` handlers for the life of the process.
pub(crate) fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) {
    // SAFETY: three `extern "C" fn()`, which the caller wrote to neither
    // allocate nor fork; glibc keeps them for the process's life.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// Writes `msg` to stderr with one `write(2)`: no allocation, no lock.
pub(crate) fn write_stderr(msg: &[u8]) {
    // SAFETY: writes a caller's buffer to file descriptor 2; no allocation.
    unsafe { libc::write(2, msg.as_ptr().cast::<c_void>(), msg.len()) };
}

/// Room for a copied environment value. On Unix the value is read in
/// place, so it holds nothing.
pub(crate) struct EnvBuf;

impl EnvBuf {
    pub(crate) const fn new() -> Self {
        EnvBuf
    }
}

/// The value of the environment variable `name` (empty if unset), read
/// with libc's `getenv`: in place, without allocating.
pub(crate) fn env_var<'a>(name: &CStr, _buf: &'a mut EnvBuf) -> &'a [u8] {
    // SAFETY: `name` is NUL-terminated; getenv returns null or a pointer to
    // a NUL-terminated string in the environment, which the caller parses
    // while it borrows `_buf`, before it returns. Changing the environment
    // while another thread reads it is what `std::env::set_var` (unsafe
    // since Rust 2024) obliges its caller to rule out, reads through libc
    // included.
    unsafe {
        let p = libc::getenv(name.as_ptr());
        if p.is_null() {
            &[]
        } else {
            CStr::from_ptr(p).to_bytes()
        }
    }
}
