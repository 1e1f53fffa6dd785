//! Telling Valgrind's memcheck what the kernel did where its model of the
//! address space misses it (`scripts/valgrind.sh` runs the tests under
//! memcheck), with `valgrind.h`'s client request: no dependency, and on a
//! real processor a few cycles that change nothing.
//!
//! Two places need it:
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
/// misses it). The client-request
/// sequence of `valgrind.h` (amd64): four rotations of `rdi` that add up
/// to none, then `xchg rbx, rbx`; on a real processor it does nothing
/// (a few cycles), under Valgrind it is the request.
#[inline]
pub(crate) fn mark_defined(addr: usize, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        /// memcheck's `VG_USERREQ__MAKE_MEM_DEFINED`: tool base ('M','C') + 2.
        const MAKE_MEM_DEFINED: usize = 0x4D43_0002;
        let args: [usize; 6] = [MAKE_MEM_DEFINED, addr, len, 0, 0, 0];
        // SAFETY: rotating rdi by 3 + 13 + 61 + 51 = 128 bits leaves it
        // unchanged, and `xchg rbx, rbx` exchanges a register with itself:
        // outside Valgrind the sequence changes no register but the flags,
        // and no memory. Under Valgrind it reads the six words at rax
        // (a live local array) and writes its answer to rdx (declared).
        unsafe {
            core::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") 0usize => _,
                inout("rdi") 0usize => _,
                options(nostack, readonly),
            );
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = (addr, len);
}
