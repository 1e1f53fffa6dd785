//! Telling Valgrind's memcheck what the kernel did where its model of the
//! address space misses it (`scripts/valgrind.sh` runs the tests under
//! memcheck), with `valgrind.h`'s client request: no dependency, and on a
//! real processor a few cycles that change nothing.
//!
//! Three places need it:
//! - the medium region (`medium`): its blocks are heap blocks to memcheck
//!   (handed out and freed as `malloc`'s are), the rest of it
//!   inaccessible; without that, the region would be 32 GiB of defined
//!   memory that memcheck's leak search reads word by word at every
//!   process's exit;
//! - pages released to read as zero (`zeroing`): memcheck does not know
//!   they read as zero and would report every read as uninitialised;
//! - the tail of a chunk grown by `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)`
//!   onto a target of the crate's (`map::move_onto`): Valgrind 3.19 (the
//!   CI's, Debian bookworm) emulates that call itself and, in some address
//!   space layouts, leaves `[target + old, target + new)` marked
//!   inaccessible although the kernel mapped it zero-filled: the block
//!   cache's proptest sequences saw 1,300-2,600 false "invalid write"
//!   reports in about one run in three, every one past the moved part of a
//!   chunk, while the same sequences' contents checks pass natively.

/// Under Valgrind's memcheck, marks `[addr, addr + len)` addressable and
/// defined (memory the kernel maps and fills, where memcheck's model
/// misses it).
#[inline]
pub(crate) fn mark_defined(addr: usize, len: usize) {
    /// memcheck's `VG_USERREQ__MAKE_MEM_DEFINED`: tool base ('M','C') + 2.
    const MAKE_MEM_DEFINED: usize = 0x4D43_0002;
    request([MAKE_MEM_DEFINED, addr, len, 0, 0, 0]);
}

/// Under memcheck, marks `[addr, addr + len)` inaccessible: the medium
/// region where no block is live, so that a use after free is reported
/// and the leak search at exit skips the region's gigabytes (it skips
/// inaccessible 64 KiB stretches whole, but reads every defined word).
#[inline]
pub(crate) fn mark_noaccess(addr: usize, len: usize) {
    /// memcheck's `VG_USERREQ__MAKE_MEM_NOACCESS`: tool base + 0.
    const MAKE_MEM_NOACCESS: usize = 0x4D43_0000;
    request([MAKE_MEM_NOACCESS, addr, len, 0, 0, 0]);
}

/// Under Valgrind, `[addr, addr + len)` is a heap block handed out
/// (`VALGRIND_MALLOCLIKE_BLOCK`, no red zones): memcheck marks it
/// addressable, defined if `zeroed` (it reads as zero) and undefined
/// otherwise, and tracks it as it tracks `malloc`'s blocks (invalid frees,
/// leaks).
#[inline]
pub(crate) fn malloc_like(addr: usize, len: usize, zeroed: bool) {
    /// The core's `VG_USERREQ__MALLOCLIKE_BLOCK`.
    const MALLOCLIKE_BLOCK: usize = 0x1301;
    request([MALLOCLIKE_BLOCK, addr, len, 0, zeroed as usize, 0]);
}

/// Under Valgrind, the block [`malloc_like`] handed out at `addr` is freed
/// (`VALGRIND_FREELIKE_BLOCK`): memcheck marks it inaccessible.
#[inline]
pub(crate) fn free_like(addr: usize) {
    /// The core's `VG_USERREQ__FREELIKE_BLOCK`.
    const FREELIKE_BLOCK: usize = 0x1302;
    request([FREELIKE_BLOCK, addr, 0, 0, 0, 0]);
}

/// Whether this process runs under Valgrind (`RUNNING_ON_VALGRIND`).
#[cfg(test)]
pub(crate) fn running() -> bool {
    /// The core's `VG_USERREQ__RUNNING_ON_VALGRIND`.
    const RUNNING_ON_VALGRIND: usize = 0x1001;
    request([RUNNING_ON_VALGRIND, 0, 0, 0, 0, 0]) != 0
}

/// Under memcheck, whether every byte of `[addr, addr + len)` is
/// addressable (`VALGRIND_GET_VBITS`, which reports no error and copies
/// nothing when one is not); `len` at most 64.
#[cfg(test)]
pub(crate) fn addressable(addr: usize, len: usize) -> bool {
    /// memcheck's `VG_USERREQ__GET_VBITS`: tool base + 8.
    const GET_VBITS: usize = 0x4D43_0008;
    let vbits = [0u8; 64];
    assert!(len <= vbits.len());
    // 3: some byte is not addressable; 1: copied into `vbits`.
    request([GET_VBITS, addr, vbits.as_ptr().addr(), len, 0, 0]) != 3
}

/// A client request: the sequence of `valgrind.h` (amd64), four rotations
/// of `rdi` that add up to none, then `xchg rbx, rbx`, with `rax` pointing
/// at the request's six words. On a real processor it does nothing and
/// answers 0 (a few cycles); under Valgrind it is the request, answered
/// in `rdx`.
#[inline]
fn request(args: [usize; 6]) -> usize {
    #[allow(unused_mut)]
    let mut answer = 0usize;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: rotating rdi by 3 + 13 + 61 + 51 = 128 bits leaves it
        // unchanged, and `xchg rbx, rbx` exchanges a register with itself:
        // outside Valgrind the sequence changes no register but the flags,
        // and no memory. Under Valgrind it reads the six words at rax
        // (a live local array), writes its answer to rdx (declared) and,
        // for GET_VBITS, the bits into the caller's live array (hence no
        // `readonly`).
        unsafe {
            core::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") 0usize => answer,
                inout("rdi") 0usize => _,
                options(nostack),
            );
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = args;
    answer
}
