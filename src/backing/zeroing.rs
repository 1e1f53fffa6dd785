//! Zeroed memory that costs nothing until touched.
//!
//! `MKL_calloc` writes every byte of the block, so a large zeroed buffer
//! (`vec![0.0; n]`, `alloc_zeroed`, NumPy's `zeros` under the handler) is
//! faulted in and resident before the program reads a single element.
//! glibc's `calloc` of a fresh mapping writes nothing: the kernel's pages
//! already read as zero. This module gives every large MKL block that
//! property, fresh, cached or advised onto huge pages alike: the block's
//! page-aligned interior is released with `madvise(MADV_DONTNEED)` (its
//! pages then read as zero, and cost a page fault only when touched), and
//! only the partial pages at its two ends are written.
//!
//! Why that is sound: the range is private anonymous memory (a chunk of
//! the crate's beneath MKL, or the C runtime's heap or `mmap` chunks for a
//! block MKL took from it); after `MADV_DONTNEED` such pages read as zero.
//! The interior lies wholly inside the caller's block, so no other block
//! and none of the C library's bookkeeping (which sits outside the block)
//! is touched. The granule matters: the crate's chunks are on 4 KiB pages,
//! but a C runtime may put its heap on hugetlb pages
//! (`GLIBC_TUNABLES=glibc.malloc.hugetlb=2`), where the kernel rounds the
//! end of `MADV_DONTNEED` down to a 2 MiB boundary and still returns 0. A
//! block that is not the crate's is therefore released only between 2 MiB
//! boundaries ([`FOREIGN_GRANULE`]), and written elsewhere.
//! Measured on a 512 MiB MKL block (2-core AMD EPYC VM): 0.03 ms fresh,
//! 21 ms dirty, against 160 ms for `memset`. A chunk fresh from the kernel
//! needs none of this: it reads as zero already (the allocator above skips
//! the call).
//!
//! Blocks under [`LAZY_ZERO_MIN`] are written (a system call and the page
//! faults after it cost more than writing a few pages that are likely
//! resident already). Under Miri, which has no `madvise`, every block is
//! written.

/// Zeroed blocks of at least this many bytes are zeroed lazily (1 MiB).
pub(crate) const LAZY_ZERO_MIN: usize = 1 << 20;

/// The granule for memory that is not the crate's: a huge page, the
/// largest page a C runtime's heap is put on here.
pub(crate) const FOREIGN_GRANULE: usize = 2 << 20;

/// A granule no block's interior spans (2^62): the block is written whole.
const WRITE_WHOLE: usize = 1 << (usize::BITS - 2);

/// The granule for a block that is not the crate's chunk (MKL took it from
/// the functions beneath it): [`FOREIGN_GRANULE`] where those are the C
/// library's own (or, on Windows, where `discard_to_zero` checks each
/// range's kind itself), whose blocks are private anonymous memory. Other
/// functions (a program's own `i_malloc`) may hand out shared or
/// file-backed memory, whose released pages do not read as zero: there the
/// block is written whole.
pub(crate) fn foreign_granule() -> usize {
    if super::foreign_is_anonymous() {
        FOREIGN_GRANULE
    } else {
        WRITE_WHOLE
    }
}

/// The granule for a block of `size` bytes in a reused chunk of the
/// crate's: a page, or 2 MiB where the huge-page policy covers the block.
/// Such a chunk is advised onto huge pages but for its first 2 MiB, kept on
/// 4 KiB pages (`hooks::new_chunk`): releasing a partial huge page at
/// either end would split it, and releasing the first 2 MiB past MKL's
/// header would cost 511 page faults when the block is filled; written
/// instead, those pages (resident already in a reused chunk) cost no fault.
/// Measured on `vec![0.0; 2 << 20]` filled, freed and made again 16 times
/// (2-core AMD EPYC VM, THP `madvise`): 518 page faults a round at a page's
/// granule, 7 at 2 MiB.
pub(crate) fn chunk_granule(size: usize) -> usize {
    if super::huge_pages::applies(size) {
        super::huge_pages::HUGE_PAGE_SIZE
    } else {
        super::PAGE
    }
}

/// Makes `[ptr, ptr + size)` read as zero: written below [`LAZY_ZERO_MIN`],
/// otherwise its ends written and its `granule`-aligned interior released.
/// `granule` is at least the page size of the memory: [`chunk_granule`]
/// for a chunk of the crate's, [`FOREIGN_GRANULE`] for anything else.
///
/// # Safety
/// `[ptr, ptr + size)` is a live block (or the tail of one) that the
/// caller owns and may write, private anonymous memory on pages of at most
/// `granule` bytes (a power of two): a chunk, or a block of the C
/// runtime's.
pub(crate) unsafe fn zero(ptr: *mut u8, size: usize, granule: usize) {
    let addr = ptr as usize;
    let start = addr.next_multiple_of(granule);
    let end = (addr + size) & !(granule - 1);
    if cfg!(miri) || size < LAZY_ZERO_MIN || end <= start {
        // SAFETY: the caller owns and may write the whole range.
        unsafe { ptr.write_bytes(0, size) };
        return;
    }
    // SAFETY: [addr, start) and [end, addr + size) lie inside the caller's
    // range (start ≤ end within it), which the caller may write.
    unsafe {
        ptr.write_bytes(0, start - addr);
        ptr.add(end - addr).write_bytes(0, addr + size - end);
    }
    // SAFETY: [start, end) is page-aligned and inside the caller's private
    // anonymous range: releasing it changes no other memory, and its pages
    // read as zero afterwards.
    let released = unsafe { crate::sys::discard_to_zero(ptr.add(start - addr), end - start) };
    if !released {
        // Never expected for malloc'd memory; writing is always correct.
        // SAFETY: as above, the interior is the caller's to write.
        unsafe { ptr.add(start - addr).write_bytes(0, end - start) };
    } else {
        // memcheck does not know that released pages read as zero.
        super::valgrind::mark_defined(start, end - start);
    }
}
