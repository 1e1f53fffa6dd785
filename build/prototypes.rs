//! Whether the MKL being linked declares, in its `mkl_service.h`, the
//! functions `src/ffi.rs` binds with the same signatures: a mismatch is a
//! build error, not a segfault.

use std::fs;
use std::path::Path;

use crate::Result;

/// The prototypes `src/ffi.rs` binds, as `mkl_service.h` spells them
/// (whitespace-insensitive). A mismatch is a build error, not a segfault.
const PROTOTYPES: [&str; 10] = [
    "void* MKL_malloc(size_t size, int align);",
    "void* MKL_calloc(size_t num, size_t size, int align);",
    "void* MKL_realloc(void *ptr, size_t size);",
    "void MKL_free(void *ptr);",
    "MKL_INT64 MKL_Mem_Stat(int* nbuffers);",
    "MKL_INT64 MKL_Peak_Mem_Usage(int reset);",
    "void MKL_Free_Buffers(void);",
    "void MKL_Thread_Free_Buffers(void);",
    "int MKL_Disable_Fast_MM(void);",
    "int MKL_Set_Memory_Limit(int mem_type, size_t limit);",
];

pub fn check(header: &Path) -> Result<()> {
    println!("cargo:rerun-if-changed={}", header.display());
    let text = fs::read_to_string(header)
        .map_err(|e| format!("mkl-alloc: cannot read {}: {e}", header.display()))?;
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    let text = squash(&text);
    for proto in PROTOTYPES {
        if !text.contains(&squash(proto)) {
            return Err(format!(
                "mkl-alloc: {} does not declare `{proto}`, which src/ffi.rs binds; \
                 this MKL is not supported",
                header.display()
            ));
        }
    }
    Ok(())
}
