//! The platform primitives on Windows: kernel32, through `windows-sys`.

use core::ffi::{CStr, c_void};
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use windows_sys::Win32::Foundation::{CloseHandle, ERROR_SUCCESS, GetLastError, LUID};
use windows_sys::Win32::Security::{
    AdjustTokenPrivileges, LUID_AND_ATTRIBUTES, LookupPrivilegeValueW, SE_LOCK_MEMORY_NAME,
    SE_PRIVILEGE_ENABLED, TOKEN_ADJUST_PRIVILEGES, TOKEN_PRIVILEGES, TOKEN_QUERY,
};
use windows_sys::Win32::Storage::FileSystem::WriteFile;
use windows_sys::Win32::System::Console::{GetStdHandle, STD_ERROR_HANDLE};
use windows_sys::Win32::System::Environment::GetEnvironmentVariableW;
use windows_sys::Win32::System::LibraryLoader::{
    GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS, GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
    GetModuleFileNameW, GetModuleHandleExW, GetModuleHandleW, GetProcAddress, LoadLibraryExW,
};
use windows_sys::Win32::System::Memory::{
    GetLargePageMinimum, GetProcessHeap, HEAP_ZERO_MEMORY, HeapAlloc, HeapFree, HeapReAlloc,
    HeapSize, MEM_COMMIT, MEM_DECOMMIT, MEM_PRIVATE, MEMORY_BASIC_INFORMATION, PAGE_READWRITE,
    VirtualAlloc, VirtualFree, VirtualQuery,
};
use windows_sys::Win32::System::ProcessStatus::{
    K32QueryWorkingSetEx, PSAPI_WORKING_SET_EX_INFORMATION,
};
use windows_sys::Win32::System::SystemInformation::{
    GetTickCount64, GlobalMemoryStatusEx, MEMORYSTATUSEX,
};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

/// The machine's physical memory in bytes (`GlobalMemoryStatusEx`), or
/// `None` where it cannot tell.
pub(crate) fn physical_memory() -> Option<usize> {
    let mut status = MEMORYSTATUSEX {
        dwLength: size_of::<MEMORYSTATUSEX>() as u32,
        ..MEMORYSTATUSEX::default()
    };
    // SAFETY: `status` is a MEMORYSTATUSEX with its length set, written
    // through a valid pointer; nothing is allocated.
    let ok = unsafe { GlobalMemoryStatusEx(&mut status) } != 0;
    (ok && status.ullTotalPhys > 0)
        .then(|| usize::try_from(status.ullTotalPhys).unwrap_or(usize::MAX))
}

/// Milliseconds since boot (`GetTickCount64`: the system tick, 10-16 ms
/// resolution, no system call). Callers compare differences.
pub(crate) fn now_ms() -> usize {
    // SAFETY: no arguments, no preconditions.
    unsafe { GetTickCount64() as usize }
}

/// Makes the pages of `[ptr, ptr + len)` read as zero without writing
/// them: decommitted, then committed again (fresh committed pages read as
/// zero, and cost a fault when touched). `MEM_RESET` would not do: it lets
/// the system keep or drop the contents, so they need not read as zero.
/// `false`, with the contents unchanged, unless the whole range is
/// committed private read-write memory of one region (`VirtualQuery`)
/// on ordinary pages (not large pages: [`on_large_pages`]), or if the
/// decommit fails: the caller then writes the zeros itself.
///
/// Between the decommit and the recommit the range is not accessible; it
/// is the caller's, so nobody else reads it. If the recommit fails (the
/// system's commit limit reached by another process in between), the
/// memory the C library's heap believes committed is not, and no later
/// access could be made safe: the process aborts with a message, as on an
/// allocation failure.
///
/// # Safety
/// `ptr` and `len` are multiples of the page size, and the range is memory
/// that the caller owns and may write (its contents are given up); no other
/// thread accesses it during the call.
pub(crate) unsafe fn discard_to_zero(ptr: *mut u8, len: usize) -> bool {
    let mut info = MEMORY_BASIC_INFORMATION::default();
    // SAFETY: VirtualQuery writes at most the given length into `info`.
    let n = unsafe {
        VirtualQuery(
            ptr.cast::<c_void>(),
            &mut info,
            size_of::<MEMORY_BASIC_INFORMATION>(),
        )
    };
    let region_end = (info.BaseAddress as usize).saturating_add(info.RegionSize);
    // Large pages are never decommitted (a recommit could not bring them
    // back as large pages): their ranges are written instead.
    if n == 0
        || on_large_pages(ptr)
        || info.State != MEM_COMMIT
        || info.Type != MEM_PRIVATE
        || info.Protect != PAGE_READWRITE
        || region_end < ptr as usize + len
    {
        return false;
    }
    // SAFETY: the range is page-aligned committed private memory of one
    // region, owned by the caller and accessed by no other thread (the
    // caller's contract): decommitting it touches no other memory.
    if unsafe { VirtualFree(ptr.cast::<c_void>(), len, MEM_DECOMMIT) } == 0 {
        return false;
    }
    // SAFETY: the same range, reserved and just decommitted: committing it
    // again gives it fresh zero pages with its former protection.
    let back = unsafe { VirtualAlloc(ptr.cast::<c_void>(), len, MEM_COMMIT, PAGE_READWRITE) };
    if back.is_null() {
        write_stderr(b"mkl-alloc: pages decommitted to zero them could not be committed again (commit limit reached)\n");
        std::process::abort();
    }
    true
}

/// No advice exists for memory already allocated: Windows backs a range
/// with large pages only if it was allocated with `MEM_LARGE_PAGES`, by a
/// process holding `SeLockMemoryPrivilege` (the crate's chunks under the
/// huge-page policy are, where [`large_pages`] allows: `map_windows.rs`).
/// Nothing is done; `true` (counted as advised) if the range starts on a
/// large page ([`on_large_pages`]): a large-page chunk, counted each time
/// it is mapped, taken from the cache or grown, as advice is on Linux.
///
/// # Safety
/// None needed (nothing is done); the signature is the Unix one.
pub(crate) unsafe fn advise_huge(ptr: *mut u8, len: usize) -> bool {
    let _ = len;
    on_large_pages(ptr)
}

/// What the large-page probe ([`large_pages`]) found, encoded in one
/// word: 0 before it ran; `ENABLED | minimum` once it enabled the
/// privilege; `FAILED | step << 32 | error` if it could not.
static LARGE: AtomicU64 = AtomicU64::new(0);
const ENABLED: u64 = 1 << 62;
const FAILED: u64 = 2 << 62;

/// The step of the large-page probe that failed, with the system's error
/// code (`GetLastError`) where there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LargePageError {
    /// `AdjustTokenPrivileges` reported `ERROR_NOT_ALL_ASSIGNED`: the
    /// process's token does not hold `SeLockMemoryPrivilege`.
    NotHeld,
    /// `GetLargePageMinimum` returned 0: the system has no large pages.
    NoLargePages,
    /// A call failed: `OpenProcessToken`, `LookupPrivilegeValueW` or
    /// `AdjustTokenPrivileges`, and its error code.
    Call(&'static str, u32),
}

const CALLS: [&str; 3] = [
    "OpenProcessToken",
    "LookupPrivilegeValueW",
    "AdjustTokenPrivileges",
];

impl LargePageError {
    fn encode(self) -> u64 {
        match self {
            LargePageError::NotHeld => FAILED | (1 << 32),
            LargePageError::NoLargePages => FAILED | (2 << 32),
            LargePageError::Call(name, error) => {
                let i = CALLS.iter().position(|&c| c == name).unwrap_or(0) as u64;
                FAILED | ((3 + i) << 32) | u64::from(error)
            }
        }
    }

    fn decode(word: u64) -> LargePageError {
        match (word >> 32) & 0xFF {
            1 => LargePageError::NotHeld,
            2 => LargePageError::NoLargePages,
            i => LargePageError::Call(
                CALLS[(i as usize).saturating_sub(3).min(CALLS.len() - 1)],
                word as u32,
            ),
        }
    }
}

/// Whether this process can allocate large pages: the large-page minimum
/// (`GetLargePageMinimum`, 2 MiB on x86-64) if it holds
/// `SeLockMemoryPrivilege` and the privilege is now enabled, else what
/// failed. The first call enables the privilege as mimalloc does
/// (`OpenProcessToken`, `LookupPrivilegeValueW`, `AdjustTokenPrivileges`,
/// which succeeds with `ERROR_NOT_ALL_ASSIGNED` when the privilege is not
/// held: hence the check of `GetLastError`); later calls read the answer.
/// Racing first calls each probe, with the same answer. Allocates
/// nothing: the token's structures are on the stack.
pub(crate) fn large_pages() -> Result<usize, LargePageError> {
    let mut word = LARGE.load(Relaxed);
    if word == 0 {
        word = match probe_large_pages() {
            Ok(min) => ENABLED | min as u64,
            Err(e) => e.encode(),
        };
        LARGE.store(word, Relaxed);
    }
    if word & ENABLED != 0 {
        Ok((word & !ENABLED) as usize)
    } else {
        Err(LargePageError::decode(word))
    }
}

/// Whether the probe ran and enabled large pages: no probe is made.
#[inline]
fn large_pages_enabled() -> bool {
    LARGE.load(Relaxed) & ENABLED != 0
}

fn probe_large_pages() -> Result<usize, LargePageError> {
    let last = |name| {
        // SAFETY: no preconditions.
        LargePageError::Call(name, unsafe { GetLastError() })
    };
    let mut token = core::ptr::null_mut();
    // SAFETY: the pseudo-handle of the current process needs no closing;
    // the token handle is written through a valid pointer.
    if unsafe {
        OpenProcessToken(
            GetCurrentProcess(),
            TOKEN_ADJUST_PRIVILEGES | TOKEN_QUERY,
            &mut token,
        )
    } == 0
    {
        return Err(last(CALLS[0]));
    }
    let mut luid = LUID::default();
    // SAFETY: a NUL-terminated UTF-16 constant, the LUID written through a
    // valid pointer; null is the local system.
    let result =
        if unsafe { LookupPrivilegeValueW(core::ptr::null(), SE_LOCK_MEMORY_NAME, &mut luid) } == 0
        {
            Err(last(CALLS[1]))
        } else {
            let privileges = TOKEN_PRIVILEGES {
                PrivilegeCount: 1,
                Privileges: [LUID_AND_ATTRIBUTES {
                    Luid: luid,
                    Attributes: SE_PRIVILEGE_ENABLED,
                }],
            };
            // SAFETY: the token was opened with TOKEN_ADJUST_PRIVILEGES; the new
            // state is a valid TOKEN_PRIVILEGES on the stack; no previous state
            // is asked for (null, length 0).
            let ok = unsafe {
                AdjustTokenPrivileges(
                    token,
                    0,
                    &privileges,
                    0,
                    core::ptr::null_mut(),
                    core::ptr::null_mut(),
                )
            } != 0;
            // SAFETY: no preconditions; read right after the call.
            let error = unsafe { GetLastError() };
            if !ok {
                Err(LargePageError::Call(CALLS[2], error))
            } else if error != ERROR_SUCCESS {
                // ERROR_NOT_ALL_ASSIGNED: the token does not hold it.
                Err(LargePageError::NotHeld)
            } else {
                // SAFETY: no preconditions.
                match unsafe { GetLargePageMinimum() } {
                    0 => Err(LargePageError::NoLargePages),
                    min => Ok(min),
                }
            }
        };
    // SAFETY: the token handle opened above, closed once.
    unsafe { CloseHandle(token) };
    result
}

/// Whether the page at `p` is a large page (`QueryWorkingSetEx`: valid
/// and `LargePage`; large pages are never paged out, so always valid).
/// Asks the system only once the probe enabled large pages in this
/// process ([`large_pages_enabled`]): before that the crate made none, and
/// the answer is `false` at the cost of one load.
pub(crate) fn on_large_pages(p: *mut u8) -> bool {
    if !large_pages_enabled() {
        return false;
    }
    let mut info = PSAPI_WORKING_SET_EX_INFORMATION {
        VirtualAddress: p.cast(),
        ..PSAPI_WORKING_SET_EX_INFORMATION::default()
    };
    // SAFETY: one entry on the stack, of the length given; the call only
    // reads the process's page tables.
    let ok = unsafe {
        K32QueryWorkingSetEx(
            GetCurrentProcess(),
            (&raw mut info).cast(),
            size_of::<PSAPI_WORKING_SET_EX_INFORMATION>() as u32,
        )
    } != 0;
    // SAFETY: every bit pattern of the union's word is a valid usize.
    let flags = unsafe { info.VirtualAttributes.Flags };
    ok && large_page_bits(flags)
}

/// Whether a `PSAPI_WORKING_SET_EX_BLOCK` word says valid (bit 0) and
/// large page (bit 23: after Valid 1, ShareCount 3, Win32Protection 11,
/// Shared 1, Node 6 and Locked 1).
#[inline]
const fn large_page_bits(flags: usize) -> bool {
    (flags & 1) != 0 && (flags & (1 << 23)) != 0
}

/// The four pointers MKL takes its memory functions from on Windows (see
/// [`ffi::IMALLOC_DLL`](crate::ffi::IMALLOC_DLL)), in `i_malloc` order:
/// the exports of a `libimalloc.dll` already loaded, else of the one
/// beside `mkl_rt.3.dll` (which the build provides), else of one the
/// standard DLL search finds; loaded for good. `None` if there is none, or
/// it lacks one of the four. Allocates nothing (the loader's own heap
/// aside): a path on the stack.
pub(crate) fn mkl_memory_slots() -> Option<[*mut *mut c_void; 4]> {
    use crate::ffi::{IMALLOC_DLL, IMALLOC_SYMBOLS, MKL_RT_DLL};
    // SAFETY: the names are NUL-terminated UTF-16 constants; looking a
    // module up, or loading a data-only DLL (no entry point runs), changes
    // no memory of the program's. A module handle is never freed, so the
    // slots stay valid for the process's life.
    unsafe {
        let mut module = GetModuleHandleW(IMALLOC_DLL.as_ptr());
        if module.is_null() {
            let rt = GetModuleHandleW(MKL_RT_DLL.as_ptr());
            let mut path = [0u16; 1024];
            let cap = path.len() - IMALLOC_DLL.len();
            let n = if rt.is_null() {
                0
            } else {
                GetModuleFileNameW(rt, path.as_mut_ptr(), cap as u32) as usize
            };
            if n != 0 && n < cap {
                let dir = path[..n]
                    .iter()
                    .rposition(|&u| u == u16::from(b'\\'))
                    .map_or(0, |i| i + 1);
                path[dir..dir + IMALLOC_DLL.len()].copy_from_slice(&IMALLOC_DLL);
                module = LoadLibraryExW(path.as_ptr(), core::ptr::null_mut(), 0);
            }
        }
        if module.is_null() {
            module = LoadLibraryExW(IMALLOC_DLL.as_ptr(), core::ptr::null_mut(), 0);
        }
        if module.is_null() {
            return None;
        }
        let mut slots = [core::ptr::null_mut(); 4];
        for (slot, name) in slots.iter_mut().zip(IMALLOC_SYMBOLS) {
            *slot = GetProcAddress(module, name.as_ptr().cast())? as *mut *mut c_void;
        }
        Some(slots)
    }
}

/// Whether `addr` (code of the crate's) lies in the process's executable,
/// not in a DLL.
#[cfg_attr(any(loom, miri, test), allow(dead_code))] // the load-time setup's
pub(crate) fn in_main_executable(addr: *const ()) -> bool {
    let mut module = core::ptr::null_mut();
    // SAFETY: with FROM_ADDRESS the name argument is an address, looked up
    // only; UNCHANGED_REFCOUNT takes no reference; the handle is written
    // through a valid pointer. GetModuleHandleW(null) is the executable.
    unsafe {
        GetModuleHandleExW(
            GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
            addr.cast(),
            &mut module,
        ) != 0
            && module == GetModuleHandleW(core::ptr::null())
    }
}

// The process heap as `i_malloc` & co.: the functions beneath the hooks
// where `libimalloc.dll` held none (MKL's own defaults, in mkl_core, are
// not exported). Blocks are 16-byte aligned; MKL aligns its own on top.

/// `malloc` on the process heap.
///
/// # Safety
/// None beyond malloc's: the result is freed with [`heap_free`].
pub(crate) unsafe extern "C" fn heap_malloc(n: usize) -> *mut c_void {
    // SAFETY: the process heap is valid for the process's life.
    unsafe { HeapAlloc(GetProcessHeap(), 0, n) }
}

/// `calloc` on the process heap: null if `a * b` overflows.
///
/// # Safety
/// As [`heap_malloc`].
pub(crate) unsafe extern "C" fn heap_calloc(a: usize, b: usize) -> *mut c_void {
    let Some(n) = a.checked_mul(b) else {
        return core::ptr::null_mut();
    };
    // SAFETY: as in heap_malloc; the block is zeroed.
    unsafe { HeapAlloc(GetProcessHeap(), HEAP_ZERO_MEMORY, n) }
}

/// `realloc` on the process heap (null `p`: a new block); null on failure,
/// `p` then intact.
///
/// # Safety
/// `p` is null or a live block of these functions.
pub(crate) unsafe extern "C" fn heap_realloc(p: *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: the caller's contract; HeapReAlloc leaves the block as it
    // was when it fails.
    unsafe {
        if p.is_null() {
            HeapAlloc(GetProcessHeap(), 0, n)
        } else {
            HeapReAlloc(GetProcessHeap(), 0, p, n.max(1))
        }
    }
}

/// The size of `p`, a block of [`heap_malloc`] & co. (`HeapSize`), or
/// `None` if the heap cannot tell.
///
/// # Safety
/// `p` is a live block of these functions.
pub(crate) unsafe fn heap_size(p: *mut c_void) -> Option<usize> {
    // SAFETY: the caller's contract; HeapSize only reads the heap's
    // bookkeeping of the block.
    let n = unsafe { HeapSize(GetProcessHeap(), 0, p) };
    (n != usize::MAX).then_some(n)
}

/// `free` on the process heap (null: nothing).
///
/// # Safety
/// `p` is null or a live block of these functions, freed once.
pub(crate) unsafe extern "C" fn heap_free(p: *mut c_void) {
    if !p.is_null() {
        // SAFETY: the caller's contract.
        unsafe { HeapFree(GetProcessHeap(), 0, p) };
    }
}

/// Writes `msg` to the standard error handle with one `WriteFile`: no
/// allocation. Nothing is written if there is no such handle.
pub(crate) fn write_stderr(msg: &[u8]) {
    // SAFETY: GetStdHandle has no preconditions; WriteFile reads `msg`
    // (at most u32::MAX bytes) and writes the count through a valid
    // pointer, synchronously (no OVERLAPPED). A null or invalid handle
    // makes it fail, which is ignored.
    unsafe {
        let handle = GetStdHandle(STD_ERROR_HANDLE);
        let mut written = 0u32;
        let len = u32::try_from(msg.len()).unwrap_or(u32::MAX);
        WriteFile(
            handle,
            msg.as_ptr(),
            len,
            &mut written,
            core::ptr::null_mut(),
        );
    }
}

/// UTF-16 units of a name or value the environment reader handles,
/// terminating NUL included: the crate's names and values are short
/// (a byte count has at most 20 digits).
const ENV_UNITS: usize = 64;

/// Room for a copied environment value: the UTF-16 value and its bytes.
pub(crate) struct EnvBuf {
    wide: [u16; ENV_UNITS],
    bytes: [u8; ENV_UNITS],
}

impl EnvBuf {
    pub(crate) const fn new() -> Self {
        EnvBuf {
            wide: [0; ENV_UNITS],
            bytes: [0; ENV_UNITS],
        }
    }
}

/// What a value that cannot be a policy reads as: one byte that no
/// policy parser accepts (so the caller warns and keeps its default).
const UNPARSABLE: u8 = 0xFF;

/// The value of the environment variable `name` (empty if unset), read
/// with `GetEnvironmentVariableW` into `buf`, on the stack: the C
/// runtime's `getenv` keeps a copy of the environment that
/// `std::env::set_var` (which calls `SetEnvironmentVariableW`) does not
/// update. A value longer than 63 UTF-16 units, or with a character
/// outside ASCII, is no policy: it reads as the byte `0xFF`.
pub(crate) fn env_var<'a>(name: &CStr, buf: &'a mut EnvBuf) -> &'a [u8] {
    let mut wide_name = [0u16; ENV_UNITS];
    let name = name.to_bytes();
    if name.len() >= ENV_UNITS {
        return &[];
    }
    for (w, &b) in wide_name.iter_mut().zip(name) {
        *w = u16::from(b);
    }
    // SAFETY: `wide_name` is NUL-terminated (its last units are zero);
    // the call writes at most ENV_UNITS units into `buf.wide`.
    let n = unsafe {
        GetEnvironmentVariableW(wide_name.as_ptr(), buf.wide.as_mut_ptr(), ENV_UNITS as u32)
    } as usize;
    if n == 0 {
        return &[]; // unset (or empty)
    }
    if n >= ENV_UNITS || !buf.wide[..n].iter().all(|&u| u < 0x80) {
        buf.bytes[0] = UNPARSABLE;
        return &buf.bytes[..1];
    }
    for (b, &u) in buf.bytes.iter_mut().zip(&buf.wide[..n]) {
        *b = u as u8;
    }
    &buf.bytes[..n]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_probe_round_trips_through_its_word() {
        for e in [
            LargePageError::NotHeld,
            LargePageError::NoLargePages,
            LargePageError::Call("OpenProcessToken", 5),
            LargePageError::Call("LookupPrivilegeValueW", 1313),
            LargePageError::Call("AdjustTokenPrivileges", u32::MAX),
        ] {
            let word = e.encode();
            assert_eq!(word & ENABLED, 0);
            assert_eq!(LargePageError::decode(word), e);
        }
    }

    #[test]
    fn the_large_page_bit_needs_a_valid_page() {
        assert!(large_page_bits(1 | 1 << 23));
        assert!(!large_page_bits(1 << 23)); // not valid: the bit means nothing
        assert!(!large_page_bits(1 | 1 << 22)); // locked, small
        assert!(!large_page_bits(0));
    }
}
