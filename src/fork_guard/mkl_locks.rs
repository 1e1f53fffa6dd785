//! MKL's own memory-manager locks, held by the prepare handler across a
//! `fork`, as a fork handler of MKL's would (MKL has none).
//!
//! **Why.** The gate (the parent module) keeps every MKL call the crate
//! makes out of MKL at a fork. Code that reaches MKL's memory manager
//! without the crate cannot be gated: MKL's FFT and BLAS allocating their
//! workspace inside a routine, or a library calling `MKL_malloc` itself.
//! Each of those takes its thread's account lock for a few instructions
//! (after `i_malloc` returns, to count the block); a fork in that window
//! copies the lock taken, and the child spins for ever at its first
//! `MKL_Mem_Stat` or `MKL_Free_Buffers` (issue 41: a thread calling
//! `MKL_malloc` in a loop hung a child within 3 forks).
//!
//! **What.** In oneMKL 2026.2's memory manager (`mkl_memory_patched.o`)
//! the locks are words of one array: a global lock (a reader count in
//! steps of 2 for threads past the 1,024th, 1 for the writer, who leaves
//! by taking 1 away) and one spin lock per account, 1,024 of them, 64
//! bytes apart, each 0 when free, taken by a compare-exchange 0 → 1 and
//! released by storing 0. `MKL_Mem_Stat`, `MKL_Free_Buffers`
//! and a thread's clean-up take the global lock and then every account in
//! order; the prepare handler does the same, so it orders itself with
//! them, and holds all until the parent's and child's handlers store 0.
//!
//! **Finding them** without a symbol (they are local to MKL's object): the
//! code of `mkl_serv_malloc`, which releases the caller's account lock
//! with `movl $0, 0x200(%rcx,%rdx)` after computing the array's address
//! from the GOT and a 64-bit offset, and enters the global lock as a
//! reader at `0x1c0` of the same array. The setup reads those
//! instructions, byte for byte (only the addresses the linker filled in
//! may differ), and takes the array's address from them. Any other MKL
//! (another version, another build of the library, `mkl-rt` where the
//! core is not visible) does not match, and then nothing is held: the
//! fork guard covers the crate's own calls only, as documented.
//!
//! **Bounded.** A fork from a signal handler that interrupted its own
//! thread inside an MKL call of the crate's does not hold them (the parent
//! module knows that case). One that interrupted a call the crate does not
//! see could wait on itself: a lock is waited for at most [`WAIT_NS`], and
//! past it everything taken is given back and the fork goes on unprotected
//! from foreign calls, as before.

use core::sync::atomic::{
    AtomicBool, AtomicU32, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

/// Accounts in MKL's table (`cmp $0x3ff` in the matched code).
const ACCOUNTS: usize = 1024;
/// Bytes between two accounts' locks (`shl $6`).
const STRIDE: usize = 64;
/// Offset of the first account's lock in MKL's array.
const FIRST_ACCOUNT: usize = 0x200;
/// Offset of the global lock in MKL's array.
const GLOBAL: usize = 0x1c0;
/// How long the prepare handler waits for one lock before it gives up
/// holding MKL's locks for this fork (see the module docs).
const WAIT_NS: u64 = 500_000_000;

/// The address of MKL's lock array (`.ldata` of its memory manager), or 0
/// where it was not found.
static ARRAY: AtomicUsize = AtomicUsize::new(0);
/// Whether the prepare handler holds every lock (for the after-fork
/// handlers).
static HELD: AtomicBool = AtomicBool::new(false);

/// The instructions matched in `mkl_serv_malloc` (see the module docs):
/// `None` bytes are filled in by the linker.
///
/// ```text
/// lea    disp32(%rip),%rdx        ; the GOT
/// mov    -0x8(%rcx),%ecx          ; the account's number, from 1
/// dec    %ecx
/// cmp    $0x3ff,%ecx
/// ja     rel32                    ; past the table: the global lock
/// mov    %ecx,%ecx
/// movabs $imm64,%rsi              ; the array, from the GOT
/// add    %rsi,%rdx
/// shl    $0x6,%rcx
/// movl   $0x0,0x200(%rcx,%rdx,1)  ; the account's lock released
/// ```
const RELEASE_ACCOUNT: [Option<u8>; 52] = pattern(
    "48 8d 15 __ __ __ __  8b 49 f8  ff c9  81 f9 ff 03 00 00  0f 87 __ __ __ __  89 c9 \
     48 be __ __ __ __ __ __ __ __  48 01 f2  48 c1 e1 06  c7 84 11 00 02 00 00 00 00",
);

/// `movabs $imm64,%rcx; lock addl $-2,0x1c0(%rdx,%rcx,1)`: a thread past
/// the table leaving the global lock, which it held as a reader.
const LEAVE_GLOBAL: [Option<u8>; 19] =
    pattern("48 b9 __ __ __ __ __ __ __ __  f0 83 84 0a c0 01 00 00 fe");

/// An instruction pattern from its bytes as objdump prints them, `__` for
/// a byte the linker fills in; the length is checked when compiled.
const fn pattern<const N: usize>(text: &str) -> [Option<u8>; N] {
    const fn nibble(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("a pattern byte is two lowercase hex digits or __"),
        }
    }
    let t = text.as_bytes();
    let mut out = [None; N];
    let (mut i, mut n) = (0, 0);
    while i < t.len() {
        if t[i] == b' ' || t[i] == b'\n' {
            i += 1;
            continue;
        }
        assert!(n < N, "the pattern has more bytes than its type");
        out[n] = if t[i] == b'_' && t[i + 1] == b'_' {
            None
        } else {
            Some(nibble(t[i]) << 4 | nibble(t[i + 1]))
        };
        n += 1;
        i += 2;
    }
    assert!(n == N, "the pattern has fewer bytes than its type");
    out
}

/// Bytes of `mkl_serv_malloc` searched (the function is 0x16e long).
const SEARCH: usize = 0x200;

/// Whether `code` holds `pattern` at `at`.
fn matches(code: &[u8], at: usize, pattern: &[Option<u8>]) -> bool {
    code.get(at..at + pattern.len()).is_some_and(|c| {
        c.iter()
            .zip(pattern)
            .all(|(b, p)| p.is_none_or(|p| *b == p))
    })
}

/// The array's address from `code`, the first [`SEARCH`] bytes of
/// `mkl_serv_malloc` as loaded at `base`: both patterns found once, naming
/// the same array; `None` otherwise.
fn array_in(code: &[u8], base: usize) -> Option<usize> {
    let at = |p: &[Option<u8>]| {
        let mut found = (0..code.len()).filter(|&i| matches(code, i, p));
        match (found.next(), found.next()) {
            (Some(i), None) => Some(i),
            _ => None,
        }
    };
    let i = at(&RELEASE_ACCOUNT)?;
    let j = at(&LEAVE_GLOBAL)?;
    let word = |k: usize, n: usize| {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&code[k..k + n]);
        u64::from_le_bytes(v)
    };
    // lea: the GOT is the next instruction's address plus disp32.
    let got = (base + i + 7).wrapping_add_signed(word(i + 3, 4) as u32 as i32 as isize);
    let array = got.wrapping_add(word(i + 28, 8) as usize);
    // The global lock's code names the array by the same offset from the GOT.
    (word(j + 2, 8) == word(i + 28, 8) && array % 4 == 0 && array != 0).then_some(array)
}

#[cfg(not(feature = "mkl-rt"))]
unsafe extern "C" {
    /// MKL's allocation routine behind `MKL_malloc` (in `libmkl_core`,
    /// static or shared): only its code is read, never called here.
    fn mkl_serv_malloc(size: usize, align: core::ffi::c_int) -> *mut core::ffi::c_void;
}

/// `mkl_serv_malloc`'s address: linked where the core is, looked up where
/// `libmkl_rt` loaded it (null if it is not visible).
fn serv_malloc() -> *const u8 {
    #[cfg(not(feature = "mkl-rt"))]
    {
        mkl_serv_malloc as *const u8
    }
    #[cfg(feature = "mkl-rt")]
    {
        // SAFETY: looks a symbol up by a NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mkl_serv_malloc".as_ptr()) }.cast()
    }
}

/// Once, at the setup (after MKL is loaded): finds MKL's lock array, if
/// this MKL is the one matched ([`found`] says whether it was).
pub(crate) fn find() {
    if found() {
        return;
    }
    let f = serv_malloc();
    if f.is_null() {
        return;
    }
    // SAFETY: `f` is the entry of a function of a loaded library, in its
    // mapped, readable text; the function and what follows it in the
    // same text segment span more than SEARCH bytes (MKL's core is
    // megabytes of code, and this function is not its last).
    let code = unsafe { core::slice::from_raw_parts(f, SEARCH) };
    if let Some(array) = array_in(code, f.addr()) {
        ARRAY.store(array, Relaxed);
    }
}

/// Whether MKL's locks were found (and are held across forks).
pub(super) fn found() -> bool {
    ARRAY.load(Relaxed) != 0
}

/// The lock word at `offset` in the array at `array`.
fn word(array: usize, offset: usize) -> &'static AtomicU32 {
    // SAFETY: `array` was matched as MKL's lock array, a static of MKL's
    // memory manager that lives as long as the process; the offsets are
    // the global lock's and the accounts' (see the constants), 4-aligned.
    unsafe { &*(array as *const AtomicU32).byte_add(offset) }
}

/// The locks in MKL's own order: the global lock, then each account.
fn offsets() -> impl DoubleEndedIterator<Item = usize> {
    core::iter::once(GLOBAL).chain((0..ACCOUNTS).map(|i| FIRST_ACCOUNT + i * STRIDE))
}

/// Nanoseconds on the monotonic clock (async-signal-safe).
fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the time into our stack variable.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The prepare handler's step (after the gate, before the block cache):
/// takes MKL's global lock and every account's, in MKL's order, each as
/// MKL does (compare-exchange 0 → 1). Gives all back and holds none if
/// one is not free within [`WAIT_NS`].
pub(crate) fn hold() {
    let array = ARRAY.load(Relaxed);
    if array == 0 {
        return;
    }
    let start = now_ns();
    let mut spins = 0u32;
    for (n, off) in offsets().enumerate() {
        let w = word(array, off);
        while w.compare_exchange_weak(0, 1, Acquire, Relaxed).is_err() {
            spins = spins.saturating_add(1);
            if spins < 64 {
                core::hint::spin_loop();
                continue;
            }
            std::thread::yield_now();
            if now_ns() - start > WAIT_NS {
                for off in offsets().take(n) {
                    give_back(array, off, false);
                }
                return;
            }
        }
    }
    HELD.store(true, Relaxed);
}

/// The parent's and the child's handler (`child`): gives back what
/// [`hold`] took, in reverse order (see [`give_back`]). The global lock is
/// also a reader count: threads past the 1,024th add 2 and wait while the
/// writer's bit is set, so in the parent it is released as MKL's writers
/// release it.
pub(crate) fn release(child: bool) {
    if !HELD.swap(false, Relaxed) {
        return;
    }
    let array = ARRAY.load(Relaxed);
    for off in offsets().rev() {
        give_back(array, off, child);
    }
}

/// Releases the lock at `off` that [`hold`] took: an account's by storing
/// 0, as MKL does; the global one, also a reader count, by taking 1 away
/// in the parent (`child` false; keeping the readers that came meanwhile)
/// and by storing 0 in the child (where those readers do not exist).
fn give_back(array: usize, off: usize, child: bool) {
    let w = word(array, off);
    if off == GLOBAL && !child {
        w.fetch_sub(1, Release);
    } else {
        w.store(0, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instructions as oneMKL 2026.2's static `libmkl_core.a` holds
    /// them once linked: the account lock's release at 0x10 and the global
    /// lock's reader exit at 0x60, in a function loaded at 0x1000.
    fn linked(got_disp: i32, offset: u64) -> Vec<u8> {
        let mut code = vec![0x90u8; SEARCH];
        let mut release: Vec<u8> = vec![0x48, 0x8d, 0x15];
        release.extend(got_disp.to_le_bytes());
        release.extend([0x8b, 0x49, 0xf8, 0xff, 0xc9, 0x81, 0xf9, 0xff, 0x03, 0, 0]);
        release.extend([0x0f, 0x87, 0x83, 0, 0, 0, 0x89, 0xc9, 0x48, 0xbe]);
        release.extend(offset.to_le_bytes());
        release.extend([0x48, 0x01, 0xf2, 0x48, 0xc1, 0xe1, 0x06]);
        release.extend([0xc7, 0x84, 0x11, 0x00, 0x02, 0, 0, 0, 0, 0, 0]);
        code[0x10..0x10 + release.len()].copy_from_slice(&release);
        let mut leave = vec![0x48, 0xb9];
        leave.extend(offset.to_le_bytes());
        leave.extend([0xf0, 0x83, 0x84, 0x0a, 0xc0, 0x01, 0, 0, 0xfe]);
        code[0x60..0x60 + leave.len()].copy_from_slice(&leave);
        code
    }

    #[test]
    fn the_array_is_the_got_plus_the_offset() {
        let code = linked(0x2009, 0x40);
        // lea at 0x1010, next instruction at 0x1017: GOT 0x3020.
        assert_eq!(array_in(&code, 0x1000), Some(0x3020 + 0x40));
        let code = linked(-0x117, 0x5_0000);
        assert_eq!(
            array_in(&code, 0x10_0000),
            Some(0x10_0000 + 0x5_0000 - 0x100)
        );
        // A misaligned address is not MKL's array of lock words.
        assert_eq!(array_in(&linked(0x2000, 0x40), 0x1000), None);
    }

    #[test]
    fn other_code_is_not_matched() {
        // A different stride, an offset that disagrees, a pattern twice,
        // one missing: not this MKL's memory manager, nothing held.
        let mut code = linked(0x2009, 0x40);
        code[0x10 + 42] = 0x07;
        assert_eq!(array_in(&code, 0x1000), None);
        let mut code = linked(0x2009, 0x40);
        code[0x62] = 0x48;
        assert_eq!(array_in(&code, 0x1000), None);
        let mut code = linked(0x2009, 0x40);
        let copy = code[0x10..0x44].to_vec();
        code[0xa0..0xd4].copy_from_slice(&copy);
        assert_eq!(array_in(&code, 0x1000), None);
        assert_eq!(array_in(&[0x90; SEARCH], 0x1000), None);
    }
}
