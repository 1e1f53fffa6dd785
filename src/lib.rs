//! Intel oneMKL's memory manager behind Rust's allocator interfaces.
//!
//! The whole program's large buffers on MKL, its small objects on the
//! system allocator:
//!
//! ```
//! use mkl_alloc::MklSplitAllocator;
//!
//! #[global_allocator]
//! static GLOBAL: MklSplitAllocator = MklSplitAllocator;
//!
//! fn main() {
//!     let v = vec![0.0f64; 1 << 20]; // 8 MiB: MKL memory, 64-byte aligned
//!     assert_eq!(v.as_ptr() as usize % 64, 0);
//! }
//! ```
//!
//! (`MklAllocator` installs the same way, for a program in which every
//! block must be MKL's.) What is in the crate:
//!
//! - [`MklAllocator`]: `GlobalAlloc` and allocator-api2's `Allocator` (0.2 and 0.4) on
//!   `MKL_malloc` / `MKL_calloc` / `MKL_realloc` / `MKL_free`; every block is
//!   aligned to at least 64 bytes.
//! - [`MklSplitAllocator`](struct@MklSplitAllocator): a size-split allocator for `#[global_allocator]`:
//!   small blocks (under 4 KiB by default, alignment at most 16) from the
//!   system allocator, or from any other (`MklSplitAllocator::over(MiMalloc)`),
//!   all others from MKL aligned to 64 bytes.
//! - [`manager`]: MKL's memory statistics, peak usage and buffer caches;
//!   the crate's settings in force and where each came from
//!   ([`manager::settings`], whose `Display` is one line per setting).
//! - [`backing`]: beneath MKL, the memory MKL draws on. MKL's memory
//!   functions (`i_malloc` & co.) are the crate's: every MKL block of
//!   1 MiB or more, the program's and MKL's own, lives in a chunk of the
//!   crate's, grown with `mremap` (no copy), and kept when freed in
//!   - [`block_cache`]: a bounded, decaying cache of freed chunks, on by
//!     default, so that big temporaries are not faulted in again and again
//!     (`MKL_ALLOC_BLOCK_CACHE=off` turns it off); MKL's statistics count
//!     live blocks only;
//!   - [`huge_pages`]: chunks of 4 MiB and more by default on transparent
//!     huge pages (`madvise(MADV_HUGEPAGE)`; `MKL_ALLOC_HUGE_PAGES=off`
//!     turns it off).
//! - [`background`]: a decay thread (opt-in in Rust, `MKL_ALLOC_BACKGROUND=on`
//!   or [`background::start`]; on by default in the Python package) that
//!   gives idle cached memory back without any further allocation; while it
//!   runs, small frees do no decay work.
//! - Large zeroed blocks cost nothing until touched: a fresh chunk is not
//!   written at all, a reused one has its pages given back
//!   (`MADV_DONTNEED`) instead of written.
//! - Every lock and counter on an allocation path survives `fork` from any
//!   thread ([`manager::init`] explains how).
//! - [`SharedMklVec`]: a growable MKL buffer shared across threads; counted
//!   [`View`]s and one atomic word make resizing through `&self` safe (a
//!   resize is refused, never blocked, while a view is alive); an [`Export`]
//!   is an owned, counted view for foreign (raw-pointer) readers and writers.
//! - [`c_heap`]: C's `malloc`/`calloc`/`realloc`/`free` contract over MKL
//!   blocks (size and alignment in a header), for callers whose `free`
//!   passes no size, such as NumPy's data-memory handler.
//! - [`ffi`]: the raw bindings (upper-case `MKL_*` names only).
//!
//! MKL itself is found or provisioned by the build script (`build/`); see
//! docs/linking.md. The defaults and their switches: docs/tuning.md.
#![deny(unsafe_op_in_unsafe_fn)]
// Set by build/main.rs on nightly compilers only: see the `nightly` feature.
// The gate is needed only where allocator-api2 0.2's `nightly` feature is on
// somewhere in the graph; elsewhere nightly would warn that it is unused.
#![cfg_attr(mkl_alloc_nightly, feature(allocator_api))]
#![cfg_attr(mkl_alloc_nightly, allow(unknown_lints, unused_features))]
#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` (Cargo.toml): feature-gated items carry
// a badge naming their feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

// With the `intel-mkl-src` feature, intel-mkl-src links an installed MKL in
// the chosen configuration; otherwise build/ links MKL (installed or cached,
// or libmkl_rt under `mkl-rt`).
#[cfg(feature = "intel-mkl-src")]
extern crate intel_mkl_src as _;

/// Dynamic configurations: the interface library (which also holds
/// `MKL_malloc` & co.) calls into the core and threading libraries, but none
/// of the three names another as needed, and rustc links with `--as-needed`:
/// a program that calls only the interface would start without them and die
/// at its first BLAS call (`undefined symbol: mkl_blas_dgemm`). One address
/// from each keeps both in the program's needed libraries; neither is called.
#[cfg(mkl_dynamic)]
mod keep_dynamic_layers {
    unsafe extern "C" {
        /// In `libmkl_core` only.
        fn mkl_serv_allocate();
        /// In every threading layer (`libmkl_sequential`, `libmkl_intel_thread`), not in the core.
        fn mkl_serv_get_max_threads();
    }
    #[used]
    static KEEP: [unsafe extern "C" fn(); 2] = [mkl_serv_allocate, mkl_serv_get_max_threads];

    // `libmkl_intel_thread` calls into the OpenMP runtime, `libiomp5`.
    #[cfg(mkl_dynamic_iomp)]
    unsafe extern "C" {
        fn omp_get_num_procs();
    }
    #[cfg(mkl_dynamic_iomp)]
    #[used]
    static KEEP_IOMP: unsafe extern "C" fn() = omp_get_num_procs;
}

// The interfaces.
mod allocator;
pub mod c_heap;
mod shared_vec;
mod split;
// MKL's manager, and the process-wide state of the allocation path
// (the setup, the fork handlers, the marker around every MKL call).
mod fork_guard;
pub mod manager;
mod process;
mod settings;
// The background decay thread (opt-in).
pub mod background;
// Beneath MKL: the memory it draws on, one policy per file.
pub mod backing;
pub use backing::{block_cache, huge_pages};
// Bindings and helpers.
mod env;
pub mod ffi;
mod sync;
mod sys;

pub use allocator::{MAX_ALIGN, MIN_ALIGN, MklAllocator};
#[cfg(loom)]
#[doc(hidden)]
pub use backing::block_cache::shards::Cache;
#[cfg(loom)]
#[doc(hidden)]
pub use backing::chunks::{Chunk, Table as ChunkTable, home as chunk_home};
#[cfg(loom)]
#[doc(hidden)]
pub use c_heap::bin::Bin;
#[cfg(loom)]
#[doc(hidden)]
pub use shared_vec::Mutant;
pub use shared_vec::{ArcView, Export, SharedMklVec, SharedVecError, View, ViewMut};
pub use split::{DEFAULT_SPLIT_THRESHOLD, MklSplitAllocator, SPLIT_MAX_SMALL_ALIGN};

// The README's code blocks are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
