//! Intel oneMKL's memory manager behind Rust's allocator interfaces.
//!
//! - [`MklAllocator`]: `GlobalAlloc` and allocator-api2's `Allocator` on
//!   `MKL_malloc` / `MKL_calloc` / `MKL_realloc` / `MKL_free`; every block is
//!   aligned to at least 64 bytes.
//! - [`manager`]: MKL's memory statistics, peak usage and buffer caches.
//! - [`ffi`]: the raw bindings (upper-case `MKL_*` names only).
//!
//! MKL itself is found or provisioned by the build script; see the README.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

// Links MKL's archives when it found an installed MKL (see build.rs).
extern crate intel_mkl_src as _;

mod allocator;
pub mod ffi;
pub mod manager;

pub use allocator::{MAX_ALIGN, MIN_ALIGN, MklAllocator};
