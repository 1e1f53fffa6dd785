//! Raw bindings to oneMKL's C service functions (`mkl_service.h`). Nothing else.
//!
//! **Upper-case names only.** In `mkl_service.h` the lower-case names
//! (`mkl_malloc`, `mkl_free`, …) are `#define`s for these. The lower-case
//! *symbols* that the library also exports are the Fortran interface, which
//! takes every argument by pointer: binding `mkl_malloc(size, align)` links and
//! then segfaults inside `mkl_malloc_`. The build script checks each prototype
//! below against the `mkl_service.h` of the MKL being linked.
//!
//! These are exposed for benchmarks and for code that must hand MKL blocks to C;
//! everything else should go through [`MklAllocator`](crate::MklAllocator).
//!
//! MKL does not validate its arguments (measured with 2026.2): keep every size
//! at most `isize::MAX` (larger ones corrupt the heap in `MKL_realloc` and
//! crash `MKL_calloc`), and pass `num = 1` to `MKL_calloc`, which does not
//! check `num * size` for overflow and returns a block of the wrapped size.
//!
//! Under Miri (`cfg(miri)`), which cannot call C, these functions are served
//! by an emulation over `std::alloc::System` that keeps MKL's contract as the
//! crate relies on it: `src/ffi/miri/`, compiled into no other build.
#![allow(non_snake_case)]

use core::ffi::c_int;
use core::ffi::c_void;

/// `MKL_PEAK_MEM_DISABLE`: stop tracking peak usage.
pub const MKL_PEAK_MEM_DISABLE: c_int = 0;
/// `MKL_PEAK_MEM_ENABLE`: start tracking peak usage.
pub const MKL_PEAK_MEM_ENABLE: c_int = 1;
/// `MKL_PEAK_MEM_RESET`: return the peak and reset it to the current usage.
pub const MKL_PEAK_MEM_RESET: c_int = -1;
/// `MKL_PEAK_MEM`: return the peak.
pub const MKL_PEAK_MEM: c_int = 2;
/// `MKL_MEM_MCDRAM`: the only memory type `MKL_Set_Memory_Limit` takes.
pub const MKL_MEM_MCDRAM: c_int = 1;

#[cfg(miri)]
mod miri;
#[cfg(miri)]
pub use miri::*;

#[cfg(not(miri))]
unsafe extern "C" {
    /// `void* MKL_malloc(size_t size, int align)`: null on failure and for size 0.
    pub fn MKL_malloc(size: usize, align: c_int) -> *mut c_void;
    /// `void* MKL_calloc(size_t num, size_t size, int align)`: zeroed.
    /// `num * size` is not checked for overflow (see the module docs).
    pub fn MKL_calloc(num: usize, size: usize, align: c_int) -> *mut c_void;
    /// `void* MKL_realloc(void *ptr, size_t size)`: null on failure, `ptr` then intact.
    pub fn MKL_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    /// `void MKL_free(void *ptr)`.
    pub fn MKL_free(ptr: *mut c_void);
    /// `MKL_INT64 MKL_Mem_Stat(int* nbuffers)`: bytes held; buffer count through the pointer.
    pub fn MKL_Mem_Stat(nbuffers: *mut c_int) -> i64;
    /// `MKL_INT64 MKL_Peak_Mem_Usage(int reset)`: one of the `MKL_PEAK_MEM*` modes.
    pub fn MKL_Peak_Mem_Usage(reset: c_int) -> i64;
    /// `void MKL_Free_Buffers(void)`: release cached buffers of all threads.
    pub fn MKL_Free_Buffers();
    /// `void MKL_Thread_Free_Buffers(void)`: release the calling thread's cached buffers.
    pub fn MKL_Thread_Free_Buffers();
    /// `int MKL_Disable_Fast_MM(void)`: turn the caching memory manager off.
    pub fn MKL_Disable_Fast_MM() -> c_int;
    /// `int MKL_Set_Memory_Limit(int mem_type, size_t limit)`.
    pub fn MKL_Set_Memory_Limit(mem_type: c_int, limit: usize) -> c_int;
}

/// `i_malloc.h`'s `void* (*i_malloc)(size_t size)`.
pub type IMalloc = unsafe extern "C" fn(size: usize) -> *mut c_void;
/// `i_malloc.h`'s `void* (*i_calloc)(size_t nmemb, size_t size)`.
pub type ICalloc = unsafe extern "C" fn(nmemb: usize, size: usize) -> *mut c_void;
/// `i_malloc.h`'s `void* (*i_realloc)(void *ptr, size_t size)`.
pub type IRealloc = unsafe extern "C" fn(ptr: *mut c_void, size: usize) -> *mut c_void;
/// `i_malloc.h`'s `void (*i_free)(void *ptr)`.
pub type IFree = unsafe extern "C" fn(ptr: *mut c_void);

// MKL's memory-function pointers ("Redefining Memory Functions" in the
// oneMKL developer guide): data symbols that MKL reads at its first call
// and takes every allocation through afterwards, the C runtime's functions
// by default. The crate sets them once, in its setup (`backing`). On
// Windows MKL's DLLs export none of them: see `IMALLOC_DLL`.
#[cfg(not(any(miri, windows)))]
unsafe extern "C" {
    /// MKL's `malloc`.
    pub static mut i_malloc: Option<IMalloc>;
    /// MKL's `calloc`.
    pub static mut i_calloc: Option<ICalloc>;
    /// MKL's `realloc`.
    pub static mut i_realloc: Option<IRealloc>;
    /// MKL's `free`.
    pub static mut i_free: Option<IFree>;
}

/// On Windows, the module MKL takes its memory functions from:
/// `mkl_core.3.dll`, at its first call, loads `libimalloc.dll` (the Intel
/// compilers' runtime DLL, which the `mkl` wheel also ships, its pointers
/// null; a module of that name already loaded is the one found) and reads the four pointers its exports [`IMALLOC_SYMBOLS`]
/// hold, if all four exist and none is null; else it keeps its own
/// functions (measured with oneMKL 2026.2's DLLs). The build provides a
/// data-only one beside MKL's DLLs (build/imalloc.rs). UTF-16, with its
/// terminating NUL, for `GetModuleHandleW` and `LoadLibraryExW`.
#[cfg(windows)]
pub const IMALLOC_DLL: [u16; 15] = wide(b"libimalloc.dll\0");

/// On Windows, `mkl_rt.3.dll`'s module name (UTF-16, NUL-terminated): the
/// build's `libimalloc.dll` lies beside it.
#[cfg(windows)]
pub const MKL_RT_DLL: [u16; 13] = wide(b"mkl_rt.3.dll\0");

/// The data symbols of [`IMALLOC_DLL`], each a pointer to one function
/// pointer, in `i_malloc` order: [`IMalloc`], [`ICalloc`], [`IRealloc`],
/// [`IFree`].
#[cfg(windows)]
pub const IMALLOC_SYMBOLS: [&core::ffi::CStr; 4] = [
    c"i_malloc_dll",
    c"i_calloc_dll",
    c"i_realloc_dll",
    c"i_free_dll",
];

/// ASCII as UTF-16, at compile time.
#[cfg(windows)]
const fn wide<const N: usize>(ascii: &[u8; N]) -> [u16; N] {
    let mut w = [0u16; N];
    let mut i = 0;
    while i < N {
        w[i] = ascii[i] as u16;
        i += 1;
    }
    w
}
