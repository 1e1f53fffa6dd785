//! `libimalloc.dll` for a Windows target: where MKL's DLLs look for
//! replacement memory functions.
//!
//! On Windows MKL does not read `i_malloc` & co. from its own DLLs (none
//! exports them): at its first call `mkl_core.3.dll` runs
//! `LoadLibraryExA("libimalloc.dll")` and `GetProcAddress` for the data
//! symbols `i_malloc_dll`, `i_calloc_dll`, `i_realloc_dll` and
//! `i_free_dll` (measured with oneMKL 2026.2's DLLs: the strings and the
//! code reading them are in mkl_core; with all four found and non-null it
//! copies their values, else it keeps its own functions). `libimalloc.dll`
//! is the Intel compilers' runtime DLL; a module of that name already
//! loaded is found by its name, wherever it was loaded from.
//!
//! Where no such DLL is at hand, this writes a minimal one next to MKL's
//! DLLs in the folder of links: no code, no imports, no entry point, just
//! the four exported pointers (null), which the crate's setup loads and
//! sets before MKL's first call (src/backing/hooks.rs). The bytes are
//! built here, so no compiler or linker for the target is needed.

use std::fs;
use std::path::Path;

use crate::Result;

/// The exports, in the order of the export name table (sorted).
const NAMES: [&str; 4] = [
    "i_calloc_dll",
    "i_free_dll",
    "i_malloc_dll",
    "i_realloc_dll",
];
/// The slot of each sorted name: slots are laid out in `i_malloc` order
/// (malloc, calloc, realloc, free), as MKL reads them.
const SLOT_OF: [u32; 4] = [1, 3, 0, 2];

const FILE_ALIGN: usize = 0x200;
const SECTION_RVA: u32 = 0x1000;

/// Writes `libimalloc.dll` into `dir` unless one is there (an installed
/// MKL's folder may bring the Intel runtime's own).
pub fn provide(dir: &Path) -> Result<()> {
    let path = dir.join("libimalloc.dll");
    if path.exists() {
        return Ok(());
    }
    fs::write(&path, image()).map_err(|e| format!("mkl-alloc: {}: {e}", path.display()))
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The DLL's bytes: headers, then one read-write `.data` section holding
/// the four slots, the export directory and one empty relocation block
/// (so that the loader may place it anywhere: it has nothing to fix up).
fn image() -> Vec<u8> {
    // The section, at RVA 0x1000: slots (32 bytes), then the export
    // directory (40), its three tables, the strings; then the relocations.
    let mut sec = vec![0u8; 32 + 40];
    let dir_at = 32;
    let funcs_at = sec.len();
    sec.resize(funcs_at + 16 + 16 + 8, 0);
    let (names_at, ords_at) = (funcs_at + 16, funcs_at + 32);
    let dll_name_at = sec.len();
    sec.extend_from_slice(b"libimalloc.dll\0");
    for (i, name) in NAMES.iter().enumerate() {
        let at = sec.len() as u32;
        sec.extend_from_slice(name.as_bytes());
        sec.push(0);
        put32(&mut sec, funcs_at + 4 * i, SECTION_RVA + 8 * SLOT_OF[i]);
        put32(&mut sec, names_at + 4 * i, SECTION_RVA + at);
        put16(&mut sec, ords_at + 2 * i, i as u16);
    }
    let export_size = (sec.len() - dir_at) as u32;
    let rva = |at: usize| SECTION_RVA + at as u32;
    put32(&mut sec, dir_at + 12, rva(dll_name_at)); // Name
    put32(&mut sec, dir_at + 16, 1); // Base
    put32(&mut sec, dir_at + 20, 4); // NumberOfFunctions
    put32(&mut sec, dir_at + 24, 4); // NumberOfNames
    put32(&mut sec, dir_at + 28, rva(funcs_at));
    put32(&mut sec, dir_at + 32, rva(names_at));
    put32(&mut sec, dir_at + 36, rva(ords_at));
    sec.resize(sec.len().next_multiple_of(4), 0);
    // One base-relocation block with two padding entries (type 0).
    let reloc_at = sec.len();
    sec.extend_from_slice(&SECTION_RVA.to_le_bytes());
    sec.extend_from_slice(&12u32.to_le_bytes());
    sec.extend_from_slice(&[0; 4]);
    let virtual_size = sec.len() as u32;
    let raw_size = sec.len().next_multiple_of(FILE_ALIGN);
    sec.resize(raw_size, 0);

    let mut h = vec![0u8; FILE_ALIGN];
    h[0..2].copy_from_slice(b"MZ");
    put32(&mut h, 0x3C, 0x40); // e_lfanew
    h[0x40..0x44].copy_from_slice(b"PE\0\0");
    let coff = 0x44;
    put16(&mut h, coff, 0x8664); // x86-64
    put16(&mut h, coff + 2, 1); // one section
    put16(&mut h, coff + 16, 240); // SizeOfOptionalHeader
    put16(&mut h, coff + 18, 0x2022); // DLL | LARGE_ADDRESS_AWARE | EXECUTABLE_IMAGE
    let opt = coff + 20;
    put16(&mut h, opt, 0x20B); // PE32+
    put32(&mut h, opt + 8, raw_size as u32); // SizeOfInitializedData
    put64(&mut h, opt + 24, 0x1_8000_0000); // ImageBase
    put32(&mut h, opt + 32, 0x1000); // SectionAlignment
    put32(&mut h, opt + 36, FILE_ALIGN as u32);
    put16(&mut h, opt + 40, 6); // MajorOperatingSystemVersion
    put16(&mut h, opt + 48, 6); // MajorSubsystemVersion
    let image_size = (SECTION_RVA + virtual_size).next_multiple_of(0x1000);
    put32(&mut h, opt + 56, image_size);
    put32(&mut h, opt + 60, FILE_ALIGN as u32); // SizeOfHeaders
    put16(&mut h, opt + 68, 3); // Subsystem: console
    put16(&mut h, opt + 70, 0x0160); // HIGH_ENTROPY_VA | DYNAMIC_BASE | NX_COMPAT
    put64(&mut h, opt + 72, 0x10_0000); // stack reserve
    put64(&mut h, opt + 80, 0x1000); // stack commit
    put64(&mut h, opt + 88, 0x10_0000); // heap reserve
    put64(&mut h, opt + 96, 0x1000); // heap commit
    put32(&mut h, opt + 108, 16); // NumberOfRvaAndSizes
    let dirs = opt + 112;
    put32(&mut h, dirs, rva(dir_at)); // export directory
    put32(&mut h, dirs + 4, export_size);
    put32(&mut h, dirs + 5 * 8, rva(reloc_at)); // base relocations
    put32(&mut h, dirs + 5 * 8 + 4, 12);
    let sh = opt + 240;
    h[sh..sh + 5].copy_from_slice(b".data");
    put32(&mut h, sh + 8, virtual_size);
    put32(&mut h, sh + 12, SECTION_RVA);
    put32(&mut h, sh + 16, raw_size as u32);
    put32(&mut h, sh + 20, FILE_ALIGN as u32); // PointerToRawData
    put32(&mut h, sh + 36, 0xC000_0040); // initialised data, read, write
    h.extend_from_slice(&sec);
    h
}
