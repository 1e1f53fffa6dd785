//! The operating system beneath the allocation path, in one place: physical
//! memory, a coarse clock, releasing a page range so that it reads as zero,
//! huge-page advice and the kernel's huge-page mode, the `fork` handlers,
//! writing to stderr and reading the environment. Linux (and other Unix)
//! in `unix.rs`, Windows in `windows.rs`; the rest of the crate calls these
//! names and nothing platform-specific.
//!
//! Everything here may run inside the global allocator, so nothing here
//! allocates through it: no `std::env`, no `String`, no `std::io` buffers
//! (the one exception, `thp_enabled` (Unix), is called only from the public
//! `huge_pages::status`, never from the allocation path).
//!
//! What differs on Windows: there is no `fork`, so no handlers are
//! registered; large pages exist only for memory allocated with
//! `MEM_LARGE_PAGES` by a process holding `SeLockMemoryPrivilege`, so no
//! advice is given: `large_pages` enables the privilege where it is held
//! (and says why not otherwise), and the chunks under the huge-page policy
//! are allocated on large pages then (`backing/map_windows.rs`); releasing
//! a range to zero is a decommit and a recommit of its pages (`MEM_RESET`
//! keeps or drops the contents at the system's choice, and does not zero),
//! never of large pages, which are written instead (`on_large_pages`).
//! MKL's memory functions are found in `libimalloc.dll`
//! (`mkl_memory_slots`), and the process heap serves what the hooks do
//! not (`heap_malloc` & co.).

#[cfg(unix)]
mod unix;
#[cfg(unix)]
use unix as imp;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
use windows as imp;

pub(crate) use imp::{
    EnvBuf, advise_huge, discard_to_zero, env_var, now_ms, physical_memory, write_stderr,
};
// glibc's heap, trimmed before fresh memory is mapped (`backing::heap_trim`),
// and the fine clock that bounds the time spent so.
#[cfg(all(target_os = "linux", target_env = "gnu", not(miri), not(loom)))]
pub(crate) use imp::{now_ns, trim_c_runtime_heap};
// The kernel's THP mode (Windows has none: large pages instead, below).
#[cfg(unix)]
pub(crate) use imp::thp_enabled;
// Windows has no `fork`: the handlers exist on Unix only.
#[cfg(unix)]
pub(crate) use imp::at_fork;
// Where MKL takes its memory functions from on Windows, and the process
// heap beneath the hooks there.
#[cfg(windows)]
pub(crate) use imp::{
    heap_calloc, heap_free, heap_malloc, heap_realloc, heap_size, mkl_memory_slots,
};
// Large pages on Windows: the privilege's probe, and which pages are large.
#[cfg(windows)]
pub(crate) use imp::{LargePageError, large_pages, on_large_pages};
// The load-time setup's question (process.rs).
#[cfg(all(windows, not(any(loom, miri, test))))]
pub(crate) use imp::in_main_executable;

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    /// The interior pages of a large block of the C library's heap (a
    /// private mapping on Linux, a `VirtualAlloc`ed block of the Windows
    /// heap) read as zero after the discard; the bytes around are kept.
    #[test]
    fn discarded_pages_read_as_zero() {
        const PAGE: usize = 4096;
        let mut v = vec![0xABu8; 64 << 20];
        let addr = v.as_mut_ptr() as usize;
        let start = addr.next_multiple_of(PAGE) - addr;
        let end = ((addr + v.len()) & !(PAGE - 1)) - addr;
        // SAFETY: [start, end) is page-aligned, inside `v`, which this test
        // owns and no other thread sees.
        let discarded = unsafe { discard_to_zero(v.as_mut_ptr().add(start), end - start) };
        assert!(discarded, "the system refused to release the range");
        assert!(v[start..end].iter().all(|&b| b == 0));
        assert!(v[..start].iter().chain(&v[end..]).all(|&b| b == 0xAB));
        v[start] = 1; // the pages are usable again
        assert_eq!(v[start], 1);
    }

    #[test]
    fn the_machine_and_the_clock() {
        assert!(physical_memory().is_some_and(|b| b >= 1 << 20));
        let t = now_ms();
        assert!(now_ms().wrapping_sub(t) < 60_000);
    }

    #[test]
    fn an_unset_variable_reads_empty() {
        let mut buf = EnvBuf::new();
        assert_eq!(env_var(c"MKL_ALLOC_SYS_TEST_NEVER_SET", &mut buf), b"");
    }

    /// What `std::env::set_var` sets is read (the C runtime's `getenv`
    /// would miss it); an overlong or non-ASCII value reads as `0xFF`.
    #[cfg(windows)]
    #[test]
    fn the_environment_std_sets_is_read() {
        const NAME: &str = "MKL_ALLOC_SYS_TEST";
        let read = |value: &str| {
            // SAFETY: on Windows the process environment is changed and
            // read under the system's lock (SetEnvironmentVariableW /
            // GetEnvironmentVariableW), and only this test uses NAME.
            unsafe { std::env::set_var(NAME, value) };
            let mut buf = EnvBuf::new();
            env_var(c"MKL_ALLOC_SYS_TEST", &mut buf).to_vec()
        };
        assert_eq!(read("67108864"), b"67108864");
        assert_eq!(read("off"), b"off");
        assert_eq!(read(&"9".repeat(63)), "9".repeat(63).as_bytes());
        assert_eq!(read(&"9".repeat(64)), [0xFF]);
        assert_eq!(read("on\u{e9}"), [0xFF]);
        // SAFETY: as above.
        unsafe { std::env::remove_var(NAME) };
        let mut buf = EnvBuf::new();
        assert_eq!(env_var(c"MKL_ALLOC_SYS_TEST", &mut buf), b"");
    }
}
