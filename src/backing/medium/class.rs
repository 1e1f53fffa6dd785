//! The size classes of medium blocks: whole pages plus [`HEADROOM`] (128
//! bytes), a page apart up to 32 KiB and four per doubling above (4, 8,
//! 12, ..., 32, 40, 48, 56, 64, 80, ..., 896 KiB, each plus 128 B; then
//! 1024 KiB, which needs none: every request it serves is below 1 MiB).
//!
//! **Why the headroom.** MKL adds 88 bytes to every request (its header
//! and alignment): a 4096-byte `MKL_malloc` asks `i_malloc` for 4184. With
//! classes of whole pages that took an 8 KiB block and made two pages
//! resident for one page of data (2.0x for 4 KiB arrays, 1.5x for 8 KiB).
//! A class of a page plus 128 bytes holds it, and blocks of a class lie
//! back to back in their span, so that live blocks every byte of which is
//! written are resident at their size (1.03x for 4 KiB). Blocks are then
//! 64-byte aligned, not page-aligned (MKL aligns what it hands out
//! itself), and a block's first and last pages may be shared with its
//! neighbours: the heap gives back a page only when every block on it is
//! free (`heap`).
//!
//! A request takes the smallest class that holds it; its waste is at most
//! a quarter of the block (a page below 32 KiB), and only address space:
//! the pages of a block past what its owner touches are never faulted in.

use super::super::PAGE;

/// Page size as a shift.
pub(crate) const PAGE_SHIFT: u32 = PAGE.trailing_zeros();

/// The smallest request served (4 KiB, the split allocator's threshold):
/// below it, blocks stay with the functions beneath the hooks.
pub(crate) const MIN: usize = PAGE;

/// Requests of this many bytes and more are chunks, not medium blocks
/// (`backing::MIN_CHUNK`, 1 MiB).
pub(crate) const END: usize = super::super::MIN_CHUNK;

/// How many classes there are.
pub const CLASSES: usize = 28;

/// Bytes each class holds beyond its whole pages: MKL's 88 bytes of
/// header and alignment, rounded up to keep blocks 64-byte aligned.
pub(crate) const HEADROOM: usize = 128;

/// Each class's block size, in pages.
pub(crate) const PAGES: [u16; CLASSES] = pages();

const fn pages() -> [u16; CLASSES] {
    let mut out = [0u16; CLASSES];
    // 1..=8 pages: a page apart.
    let mut i = 0;
    while i < 8 {
        out[i] = (i + 1) as u16;
        i += 1;
    }
    // Then four per doubling, from 8 pages up to 256 (1 MiB).
    let mut base = 8u16;
    while i < CLASSES {
        let step = base / 4;
        let mut k = 1;
        while k <= 4 {
            out[i] = base + step * k;
            i += 1;
            k += 1;
        }
        base *= 2;
    }
    out
}

/// The class of a request of `p` pages, for `p` in `0..=END / PAGE`.
const BY_PAGES: [u8; END / PAGE + 1] = by_pages();

const fn by_pages() -> [u8; END / PAGE + 1] {
    let mut out = [0u8; END / PAGE + 1];
    let mut p = 0;
    let mut class = 0;
    while p < out.len() {
        while (PAGES[class] as usize) < p {
            class += 1;
        }
        out[p] = class as u8;
        p += 1;
    }
    out
}

/// The class serving a request of `n` bytes: `None` outside
/// `MIN..END`. One table load.
#[inline(always)]
pub(crate) fn of(n: usize) -> Option<usize> {
    if n.wrapping_sub(MIN) >= END - MIN {
        return None;
    }
    Some(BY_PAGES[(n - HEADROOM + PAGE - 1) >> PAGE_SHIFT] as usize)
}

/// The block size of class `k`, in bytes.
#[inline(always)]
pub fn size(k: usize) -> usize {
    SIZES[k] as usize
}

/// Each class's block size: its pages plus [`HEADROOM`], but the last
/// class's (1 MiB: every request it serves is below [`END`], header
/// included, so it needs none, and four of its blocks fill a span).
const SIZES: [u32; CLASSES] = sizes();

const fn sizes() -> [u32; CLASSES] {
    let mut out = [0u32; CLASSES];
    let mut k = 0;
    while k < CLASSES {
        out[k] = ((PAGES[k] as u32) << PAGE_SHIFT) + HEADROOM as u32;
        k += 1;
    }
    out[CLASSES - 1] = END as u32;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classes_are_the_documented_ones() {
        assert!((0..CLASSES - 1).all(|k| size(k) % 1024 == HEADROOM && size(k) % 64 == 0));
        let kib: Vec<usize> = (0..CLASSES).map(|k| size(k) >> 10).collect();
        assert_eq!(
            kib,
            [
                4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
                320, 384, 448, 512, 640, 768, 896, 1024
            ]
        );
        assert_eq!(size(CLASSES - 1), END);
    }

    #[test]
    fn a_request_takes_the_smallest_class_that_holds_it() {
        assert_eq!(of(0), None);
        assert_eq!(of(MIN - 1), None);
        assert_eq!(of(END), None);
        assert_eq!(of(usize::MAX), None);
        assert_eq!(of(MIN), Some(0));
        assert_eq!(of(MIN + 88), Some(0)); // MKL_malloc(4096, 64) beneath MKL
        assert_eq!(of(MIN + HEADROOM), Some(0));
        assert_eq!(of(MIN + HEADROOM + 1), Some(1));
        assert_eq!(of(2 * MIN + 88), Some(1)); // 8 KiB beneath MKL
        assert_eq!(of(END - 1), Some(CLASSES - 1));
        // Every size (by 61 bytes, plus each class's edges) against a scan.
        let edges = (0..CLASSES).flat_map(|k| [size(k) - 1, size(k), size(k) + 1]);
        for n in (MIN..END)
            .step_by(61)
            .chain(edges.filter(|&n| (MIN..END).contains(&n)))
        {
            let k = of(n).unwrap();
            assert!(size(k) >= n, "{n}");
            assert!(k == 0 || size(k - 1) < n, "{n}");
            // Waste: at most a page below 32 KiB, a quarter above.
            assert!(size(k) - n < PAGE.max(n / 4 + PAGE), "{n}");
        }
    }
}
