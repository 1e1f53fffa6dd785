//! The size classes of medium blocks: eight per doubling from 4 KiB to
//! 32 KiB (4, 4.5, ..., 7.5, 8, 9, ..., 15, 16, 18, ..., 30 KiB), four
//! above (32, 40, 48, 56, 64, 80, ..., 896 KiB), each plus [`HEADROOM`]
//! (128 bytes); then 1024 KiB, which needs none (every request it serves
//! is below 1 MiB).
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
//! A request takes the smallest class that holds it. Below 32 KiB its
//! waste shares pages with the neighbouring blocks, so it is resident:
//! eight classes per doubling keep it under an eighth (a class a page
//! apart made a 4,200-byte array take 8 KiB, 1.98x, and 5,000 bytes
//! 1.66x). Above, the waste (under a quarter) lies mostly in whole pages
//! past what the block's owner writes, never faulted in.

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
pub const CLASSES: usize = 45;

// Every class is larger than a page: no two blocks start in one page,
// whose metadata entry names the block (`heap`).
const _: () = assert!(SIZES[0] as usize > PAGE);

/// Bytes each class holds beyond its steps: MKL's 88 bytes of header and
/// alignment, rounded up to keep blocks 64-byte aligned.
pub(crate) const HEADROOM: usize = 128;

/// The granule of the class sizes (less [`HEADROOM`]): every class but
/// the last is a multiple of it plus the headroom.
const STEP: usize = 512;
const STEP_SHIFT: u32 = STEP.trailing_zeros();

/// Each class's block size in bytes: eight classes per doubling from
/// 4 KiB to 32 KiB (4, 4.5, 5, ..., 7.5 KiB; 8, 9, ..., 15 KiB; 16, 18,
/// ..., 30 KiB), then four (32, 40, 48, 56, 64, 80, ..., 896 KiB), each
/// plus [`HEADROOM`]; then 1 MiB, which needs none (every request it
/// serves is below [`END`], header included, and four of its blocks fill
/// a span).
const SIZES: [u32; CLASSES] = sizes();

const fn sizes() -> [u32; CLASSES] {
    let mut out = [0u32; CLASSES];
    let mut i = 0;
    let mut base = MIN;
    // Eight per doubling below 32 KiB: there a block's slack shares its
    // pages with its neighbours, so all of it is resident.
    while base < 32 << 10 {
        let mut k = 0;
        while k < 8 {
            out[i] = (base + base / 8 * k + HEADROOM) as u32;
            i += 1;
            k += 1;
        }
        base *= 2;
    }
    // Four per doubling above: a block's slack beyond its written bytes
    // lies in whole pages no one touches.
    while i < CLASSES {
        let mut k = 0;
        while k < 4 && i < CLASSES {
            out[i] = (base + base / 4 * k + HEADROOM) as u32;
            i += 1;
            k += 1;
        }
        base *= 2;
    }
    out[CLASSES - 1] = END as u32;
    out
}

/// The class of a request of `u` steps beyond the headroom, for `u` in
/// `0..=END / STEP`.
const BY_STEPS: [u8; END / STEP + 1] = by_steps();

const fn by_steps() -> [u8; END / STEP + 1] {
    let mut out = [0u8; END / STEP + 1];
    let mut u = 0;
    let mut class = 0;
    while u < out.len() {
        while class < CLASSES - 1 && (SIZES[class] as usize - HEADROOM) < u * STEP {
            class += 1;
        }
        out[u] = class as u8;
        u += 1;
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
    Some(BY_STEPS[(n - HEADROOM + STEP - 1) >> STEP_SHIFT] as usize)
}

/// The block size of class `k`, in bytes.
#[inline(always)]
pub const fn size(k: usize) -> usize {
    SIZES[k] as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classes_are_the_documented_ones() {
        assert!((0..CLASSES - 1).all(|k| size(k) % STEP == HEADROOM && size(k) % 64 == 0));
        let bytes: Vec<usize> = (0..CLASSES).map(|k| size(k) - HEADROOM).collect();
        assert_eq!(
            &bytes[..9],
            [4096, 4608, 5120, 5632, 6144, 6656, 7168, 7680, 8192]
        );
        assert_eq!(&bytes[16..18], [16384, 18432]);
        let kib: Vec<usize> = bytes[24..CLASSES - 1].iter().map(|b| b >> 10).collect();
        assert_eq!(
            kib,
            [
                32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640,
                768, 896
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
        assert_eq!(of(2 * MIN + 88), Some(8)); // 8 KiB beneath MKL
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
            // Waste: at most an eighth below 32 KiB (where it is
            // resident), a quarter above (whole untouched pages).
            let most = if n < 32 << 10 {
                n / 8 + HEADROOM
            } else {
                n / 4 + PAGE
            };
            assert!(size(k) - n <= most, "{n}: class {}", size(k));
        }
    }
}
