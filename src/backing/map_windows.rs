//! Chunks from the system on Windows: `VirtualAlloc`ed regions on 2 MiB
//! boundaries, given back with `VirtualFree(MEM_RELEASE)`.
//!
//! The same contract as Linux's `map.rs`, with what Windows offers:
//!
//! - **Alignment.** `VirtualAlloc` places regions on 64 KiB boundaries, so
//!   a chunk is found as mimalloc finds an aligned one: reserve the size
//!   plus 2 MiB, note the first 2 MiB boundary inside, release the whole
//!   reservation, and allocate the chunk at that address; another thread
//!   can take the range in between, so this is tried a few times.
//! - **Resizing in place.** A shrink decommits the chunk's tail (still
//!   reserved: `MEM_RELEASE` later frees the whole reservation, so nothing
//!   needs recording); a growth commits the pages after the chunk again
//!   only if they are that decommitted tail, still reserved in the same
//!   allocation (`VirtualQuery`). Nothing else can grow in place.
//! - **No moving.** Windows has no `mremap`: [`move_onto`] always fails,
//!   and the caller copies.
//! - **Lazy free** is `MEM_RESET`: the system may drop the pages' contents
//!   instead of writing them to the paging file; they then read as
//!   anything (not necessarily zero), which is why a cached chunk is never
//!   taken as fresh.
//!
//! - **Large pages.** Where the process holds `SeLockMemoryPrivilege`
//!   ([`crate::sys::large_pages`]), a fresh chunk under the huge-page
//!   policy is allocated with `MEM_LARGE_PAGES` ([`map_large`]), at its
//!   size rounded up to the large-page minimum (2 MiB on x86-64, and such
//!   allocations are aligned to it); it is committed at once, never paged
//!   out, and cannot be decommitted or reset: a shrink keeps it whole, the
//!   cache does not reset it, lazy zeroing writes it (`discard_to_zero`
//!   checks), and it grows by copying. `MEM_RELEASE` frees it as any
//!   other. Where the system has no contiguous physical memory for one,
//!   the chunk is an ordinary one.
//!
//! Fresh committed pages read as zero, large pages too, as a fresh mapping
//! does on Linux.

use core::ffi::c_void;
use core::ptr;

use windows_sys::Win32::System::Memory::{
    MEM_COMMIT, MEM_DECOMMIT, MEM_LARGE_PAGES, MEM_RELEASE, MEM_RESERVE, MEM_RESET,
    MEMORY_BASIC_INFORMATION, PAGE_NOACCESS, PAGE_READWRITE, VirtualAlloc, VirtualFree,
    VirtualQuery,
};

use super::PAGE;
use super::chunks::CHUNK_ALIGN;

/// Attempts at taking the aligned range before giving up (another thread
/// may reserve it between the probe's release and the allocation).
const ATTEMPTS: usize = 4;

/// `size` rounded up to whole pages; `None` past what can be mapped.
#[inline]
pub(crate) fn round(size: usize) -> Option<usize> {
    let s = size.checked_add(PAGE - 1)? & !(PAGE - 1);
    (s <= isize::MAX as usize / 2).then_some(s)
}

/// A fresh chunk of `size` bytes (a multiple of [`PAGE`]) on a
/// [`CHUNK_ALIGN`] boundary, committed read-write, or null. Its pages read
/// as zero.
pub(crate) fn map(size: usize) -> *mut u8 {
    let Some(span) = size.checked_add(CHUNK_ALIGN) else {
        return ptr::null_mut();
    };
    for _ in 0..ATTEMPTS {
        // SAFETY: a reservation at an address of the system's choice
        // touches no existing memory.
        let probe = unsafe { VirtualAlloc(ptr::null(), span, MEM_RESERVE, PAGE_NOACCESS) };
        if probe.is_null() {
            return ptr::null_mut();
        }
        let start = (probe as usize).next_multiple_of(CHUNK_ALIGN);
        // SAFETY: the reservation just made, which nothing else knows of.
        unsafe { VirtualFree(probe, 0, MEM_RELEASE) };
        // SAFETY: a new allocation at a given address fails (null) unless
        // the whole range is free; it changes no memory of anyone's.
        let p = unsafe {
            VirtualAlloc(
                start as *const c_void,
                size,
                MEM_RESERVE | MEM_COMMIT,
                PAGE_READWRITE,
            )
        };
        if !p.is_null() {
            return p.cast();
        }
    }
    ptr::null_mut()
}

/// The size of a large-page chunk for `size` bytes on large pages of
/// `minimum` bytes: `size` rounded up to a whole number of them; `None`
/// if `minimum` is not a power of two, or the result is past what can be
/// mapped.
#[inline]
pub(crate) fn large_size(size: usize, minimum: usize) -> Option<usize> {
    if !minimum.is_power_of_two() {
        return None;
    }
    let s = size.checked_next_multiple_of(minimum)?;
    (s <= isize::MAX as usize / 2).then_some(s)
}

/// A fresh chunk for `size` bytes on large pages and its true size (see
/// [`large_size`]), on a [`CHUNK_ALIGN`] boundary, committed read-write,
/// reading as zero; `(null, 0)` where the process cannot allocate large
/// pages ([`crate::sys::large_pages`]) or the system has none free right
/// now (the caller then maps an ordinary chunk).
pub(crate) fn map_large(size: usize) -> (*mut u8, usize) {
    let Some(size) = crate::sys::large_pages()
        .ok()
        .and_then(|min| large_size(size, min))
    else {
        return (ptr::null_mut(), 0);
    };
    // SAFETY: an allocation at an address of the system's choice touches
    // no existing memory.
    let p = unsafe {
        VirtualAlloc(
            ptr::null(),
            size,
            MEM_RESERVE | MEM_COMMIT | MEM_LARGE_PAGES,
            PAGE_READWRITE,
        )
    };
    if p.is_null() {
        return (ptr::null_mut(), 0);
    }
    if p as usize % CHUNK_ALIGN != 0 {
        // Large pages smaller than 2 MiB (none known on x86-64): not a
        // chunk. SAFETY: the allocation just made, known to no one else.
        unsafe { VirtualFree(p, 0, MEM_RELEASE) };
        return (ptr::null_mut(), 0);
    }
    (p.cast(), size)
}

/// Gives the chunk back to the system: its whole reservation, including a
/// tail decommitted by a shrink.
///
/// # Safety
/// `[p, p + size)` is a chunk of the crate's that nothing uses any more.
pub(crate) unsafe fn unmap(p: *mut u8, size: usize) {
    let _ = size;
    // SAFETY: the caller's contract: `p` is the base of a chunk's
    // allocation (map made it), ours and unused.
    unsafe { VirtualFree(p.cast(), 0, MEM_RELEASE) };
}

/// Gives back the tail `[p + new, p + old)` of the chunk `p` of `old`
/// bytes: decommitted (kept reserved: a later growth recommits it), never
/// on large pages. Returns whether it did.
///
/// # Safety
/// `[p, p + old)` is a live chunk of the crate's, whose tail past `new`
/// nothing uses.
pub(crate) unsafe fn trim_tail(p: *mut u8, old: usize, new: usize) -> bool {
    // SAFETY: the caller's contract; a shrink decommits only the tail.
    new < old && unsafe { resize_in_place(p, old, new) }
}

/// Resizes the chunk `p` of `old` bytes to `new` bytes (multiples of
/// [`PAGE`]) in place: a shrink decommits the tail, except on large pages
/// (never decommitted: `false`, the chunk whole); a growth works only into
/// the chunk's own decommitted tail (see the module docs), which a
/// large-page chunk never has. Returns whether it did.
///
/// # Safety
/// `[p, p + old)` is a live chunk of the crate's.
pub(crate) unsafe fn resize_in_place(p: *mut u8, old: usize, new: usize) -> bool {
    if new <= old {
        if new < old {
            if crate::sys::on_large_pages(p) {
                return false;
            }
            // SAFETY: the chunk's own tail, given up by its owner; the
            // range stays reserved, so nothing else can be placed there.
            return unsafe { VirtualFree(p.add(new).cast(), old - new, MEM_DECOMMIT) } != 0;
        }
        return true;
    }
    // SAFETY: `p + old` is one past the live chunk (the caller's contract).
    let after = unsafe { p.add(old) };
    let mut info = MEMORY_BASIC_INFORMATION::default();
    // SAFETY: VirtualQuery writes at most the given length into `info`.
    let n = unsafe {
        VirtualQuery(
            after.cast::<c_void>(),
            &mut info,
            size_of::<MEMORY_BASIC_INFORMATION>(),
        )
    };
    if n == 0
        || info.AllocationBase != p.cast::<c_void>()
        || info.State != MEM_RESERVE
        || info.RegionSize < new - old
    {
        return false;
    }
    // SAFETY: the pages are the chunk's own reserved, uncommitted tail
    // (the query above: the same allocation, reserved only); committing
    // them touches no other memory.
    !unsafe { VirtualAlloc(after.cast(), new - old, MEM_COMMIT, PAGE_READWRITE) }.is_null()
}

/// Windows cannot move pages from one range to another: always null (the
/// caller copies; the chunk is untouched).
///
/// # Safety
/// As Linux's: `[p, p + old)` is a live chunk; `[target, target + new)` is
/// memory of the crate's that nothing uses.
pub(crate) unsafe fn move_onto(p: *mut u8, old: usize, new: usize, target: *mut u8) -> *mut u8 {
    let _ = (p, old, new, target);
    ptr::null_mut()
}

/// Tells the system the contents of `[p, p + size)` are of no interest
/// (`MEM_RESET`): it may drop the pages instead of paging them out; they
/// stay committed and usable, their contents undefined. Large pages are
/// never paged out, so there is nothing to tell: they are left as they are.
///
/// # Safety
/// `[p, p + size)` is a committed chunk of the crate's whose contents
/// nobody needs.
pub(crate) unsafe fn lazy_free(p: *mut u8, size: usize) {
    if crate::sys::on_large_pages(p) {
        return;
    }
    // SAFETY: the caller's contract; MEM_RESET changes only what an unused
    // committed range may read back (the protection argument is ignored).
    unsafe { VirtualAlloc(p.cast::<c_void>(), size, MEM_RESET, PAGE_NOACCESS) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_page_chunk_is_whole_large_pages() {
        const MIB: usize = 1 << 20;
        assert_eq!(large_size(4 * MIB, 2 * MIB), Some(4 * MIB));
        assert_eq!(large_size(4 * MIB + PAGE, 2 * MIB), Some(6 * MIB));
        assert_eq!(large_size(1, 2 * MIB), Some(2 * MIB));
        assert_eq!(large_size(5 * MIB, 3 * MIB), None); // not a power of two
        assert_eq!(large_size(5 * MIB, 0), None);
        assert_eq!(large_size(usize::MAX - PAGE, 2 * MIB), None);
        assert_eq!(large_size(isize::MAX as usize / 2 + 1, 2 * MIB), None);
    }

    /// Where the process holds no `SeLockMemoryPrivilege` (wine's do not),
    /// there is no large-page chunk: the caller maps an ordinary one.
    #[test]
    fn without_the_privilege_no_large_page_chunk_is_made() {
        let (p, size) = map_large(8 << 20);
        match crate::sys::large_pages() {
            Err(_) => assert_eq!((p, size), (ptr::null_mut(), 0)),
            Ok(min) => {
                if !p.is_null() {
                    assert_eq!(p as usize % CHUNK_ALIGN, 0);
                    assert_eq!(size % min, 0);
                    assert!(crate::sys::on_large_pages(p));
                    // SAFETY: the chunk just made, ours and unused.
                    unsafe { unmap(p, size) };
                }
            }
        }
    }
}
