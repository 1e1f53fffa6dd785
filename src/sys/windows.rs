//! The platform primitives on Windows: kernel32, through `windows-sys`.

use core::ffi::{CStr, c_void};

use windows_sys::Win32::Storage::FileSystem::WriteFile;
use windows_sys::Win32::System::Console::{GetStdHandle, STD_ERROR_HANDLE};
use windows_sys::Win32::System::Environment::GetEnvironmentVariableW;
use windows_sys::Win32::System::LibraryLoader::{
    GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS, GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
    GetModuleFileNameW, GetModuleHandleExW, GetModuleHandleW, GetProcAddress, LoadLibraryExW,
};
use windows_sys::Win32::System::Memory::{
    GetProcessHeap, HEAP_ZERO_MEMORY, HeapAlloc, HeapFree, HeapReAlloc, HeapSize, MEM_COMMIT,
    MEM_DECOMMIT, MEM_PRIVATE, MEMORY_BASIC_INFORMATION, PAGE_READWRITE, VirtualAlloc, VirtualFree,
    VirtualQuery,
};
use windows_sys::Win32::System::SystemInformation::{
    GetTickCount64, GlobalMemoryStatusEx, MEMORYSTATUSEX,
};

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
/// committed private read-write memory of one region (`VirtualQuery`),
/// or if the decommit fails: the caller then writes the zeros itself.
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
    if n == 0
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
/// process holding `SeLockMemoryPrivilege` (the crate's chunks are not).
/// Always `false` (nothing advised).
///
/// # Safety
/// None needed (nothing is done); the signature is the Unix one.
pub(crate) unsafe fn advise_huge(ptr: *mut u8, len: usize) -> bool {
    let _ = (ptr, len);
    false
}

/// Windows has no transparent huge pages: always `None` (the mode reads as
/// unavailable). Not the file's path under wine either, where it would
/// name the Linux host's file.
pub(crate) fn thp_enabled() -> Option<String> {
    None
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
