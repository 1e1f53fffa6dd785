//! Allocation sequences with arbitrary sizes and alignments through
//! `MklAllocator` and `MklSplitAllocator`, over System and over mimalloc
//! (both interfaces: allocator-api2's `Allocator` and `GlobalAlloc`),
//! blocks freed in any order. Every block is
//! filled with its own byte and checked whenever it is grown, shrunk or
//! freed; alignments the allocators cannot honour must be refused, never
//! served misaligned.
#![no_main]

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::NonNull;

use allocator_api2::alloc::Allocator;
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mkl_alloc::{MAX_ALIGN, MklAllocator, MklSplitAllocator};
use std::alloc::System;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Which {
    Mkl,
    Split,
    /// A low threshold, so that small blocks change sides on growth.
    Split256,
    /// The split over mimalloc, a small side that is not System.
    SplitMimalloc,
    SplitMimalloc256,
}

const SPLIT256: MklSplitAllocator<System, 256> = MklSplitAllocator.with_threshold();
const SPLIT_MI: MklSplitAllocator<mimalloc::MiMalloc> = MklSplitAllocator::over(mimalloc::MiMalloc);
const SPLIT_MI256: MklSplitAllocator<mimalloc::MiMalloc, 256> =
    MklSplitAllocator::over(mimalloc::MiMalloc).with_threshold();

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Api {
    Allocator,
    Global,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc {
        which: Which,
        api: Api,
        size: u32,
        align_log2: u8,
        zeroed: bool,
    },
    Free {
        index: u8,
    },
    Resize {
        index: u8,
        size: u32,
        zeroed: bool,
    },
}

struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    which: Which,
    api: Api,
    fill: u8,
}

/// Sizes: mostly below 8 KiB (both sides of the split threshold), some up
/// to 64 KiB, a few up to 256 KiB (every byte is written and checked, so
/// large blocks are kept rare: a run then does many operations).
fn size_of_input(size: u32) -> usize {
    match size >> 28 {
        0 => 0,
        1..=13 => (size & 0x1fff) as usize,
        14 => (size & 0xffff) as usize,
        _ => (size & 0x3_ffff) as usize,
    }
}

/// Alignments: mostly up to 2^12, a few up to 2^21 (each such block costs
/// MKL `align` extra bytes: kept rare so that a run stays fast), and a few
/// beyond MAX_ALIGN.
fn align_of_input(log2: u8) -> usize {
    match log2 % 64 {
        63 => MAX_ALIGN << 1, // beyond MKL: must be refused
        l @ 58..=62 => 1 << (13 + 2 * (l - 58)),
        l => 1 << (l % 13),
    }
}

fn global(which: Which) -> &'static dyn GlobalAlloc {
    match which {
        Which::Mkl => &MklAllocator,
        Which::Split => &MklSplitAllocator,
        Which::Split256 => &SPLIT256,
        Which::SplitMimalloc => &SPLIT_MI,
        Which::SplitMimalloc256 => &SPLIT_MI256,
    }
}

fn with_allocator<R>(which: Which, f: impl FnOnce(&dyn AllocatorDyn) -> R) -> R {
    match which {
        Which::Mkl => f(&MklAllocator),
        Which::Split => f(&MklSplitAllocator),
        Which::Split256 => f(&SPLIT256),
        Which::SplitMimalloc => f(&SPLIT_MI),
        Which::SplitMimalloc256 => f(&SPLIT_MI256),
    }
}

/// allocator-api2's `Allocator` is not object safe through `grow` & co.
/// generics; this is the part used here, as a trait object.
trait AllocatorDyn {
    fn alloc(&self, layout: Layout, zeroed: bool) -> Option<NonNull<[u8]>>;
    /// # Safety
    /// `ptr` is a live block of `old` from this allocator.
    unsafe fn resize(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
        zeroed: bool,
    ) -> Option<NonNull<[u8]>>;
    /// # Safety
    /// `ptr` is a live block of `layout` from this allocator.
    unsafe fn free(&self, ptr: NonNull<u8>, layout: Layout);
}

impl<A: Allocator> AllocatorDyn for A {
    fn alloc(&self, layout: Layout, zeroed: bool) -> Option<NonNull<[u8]>> {
        if zeroed {
            self.allocate_zeroed(layout).ok()
        } else {
            self.allocate(layout).ok()
        }
    }

    unsafe fn resize(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
        zeroed: bool,
    ) -> Option<NonNull<[u8]>> {
        // SAFETY: the caller's contract; the sizes are compared first.
        unsafe {
            if new.size() >= old.size() {
                if zeroed {
                    self.grow_zeroed(ptr, old, new).ok()
                } else {
                    self.grow(ptr, old, new).ok()
                }
            } else {
                self.shrink(ptr, old, new).ok()
            }
        }
    }

    unsafe fn free(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's contract.
        unsafe { self.deallocate(ptr, layout) }
    }
}

/// Checks that the first `len` bytes of the block all hold `fill`.
fn check(ptr: NonNull<u8>, len: usize, fill: u8, what: &str) {
    // SAFETY: callers pass a live block of at least `len` initialised bytes.
    let bytes = unsafe { core::slice::from_raw_parts(ptr.as_ptr(), len) };
    if let Some(i) = bytes.iter().position(|&b| b != fill) {
        panic!(
            "{what}: byte {i} of {len} is {:#x}, not {fill:#x}",
            bytes[i]
        );
    }
}

fn free(block: Block) {
    check(block.ptr, block.layout.size(), block.fill, "before free");
    match block.api {
        // SAFETY: a live block of this layout from this allocator.
        Api::Allocator => unsafe {
            with_allocator(block.which, |a| a.free(block.ptr, block.layout))
        },
        // SAFETY: a live block of this layout from this GlobalAlloc.
        Api::Global => unsafe { global(block.which).dealloc(block.ptr.as_ptr(), block.layout) },
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut blocks: Vec<Block> = Vec::new();
    for (step, op) in ops.into_iter().enumerate().take(256) {
        let fill = (step as u8).wrapping_mul(31).wrapping_add(1);
        match op {
            Op::Alloc {
                which,
                api,
                size,
                align_log2,
                zeroed,
            } => {
                let size = size_of_input(size);
                let align = align_of_input(align_log2);
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                let ptr = match api {
                    Api::Allocator => {
                        with_allocator(which, |a| a.alloc(layout, zeroed)).map(|p| p.cast::<u8>())
                    }
                    Api::Global if size == 0 => continue, // GlobalAlloc forbids it
                    // SAFETY: a non-zero size.
                    Api::Global => NonNull::new(unsafe {
                        if zeroed {
                            global(which).alloc_zeroed(layout)
                        } else {
                            global(which).alloc(layout)
                        }
                    }),
                };
                // Zero-sized blocks are dangling pointers, never MKL's.
                if align > MAX_ALIGN && size > 0 {
                    assert!(
                        ptr.is_none(),
                        "alignment {align} above MAX_ALIGN was served"
                    );
                    if let Some(ptr) = ptr {
                        free(Block {
                            ptr,
                            layout,
                            which,
                            api,
                            fill: 0,
                        });
                    }
                    continue;
                }
                let Some(ptr) = ptr else {
                    continue; // refused: allowed (the fuzzer's RSS limit)
                };
                assert_eq!(ptr.as_ptr() as usize % align, 0, "{layout:?} misaligned");
                if zeroed {
                    check(ptr, size, 0, "fresh zeroed block");
                }
                // SAFETY: a fresh block of `size` bytes.
                unsafe { ptr.as_ptr().write_bytes(fill, size) };
                blocks.push(Block {
                    ptr,
                    layout,
                    which,
                    api,
                    fill,
                });
            }
            Op::Free { index } => {
                if !blocks.is_empty() {
                    let i = index as usize % blocks.len();
                    free(blocks.swap_remove(i));
                }
            }
            Op::Resize {
                index,
                size,
                zeroed,
            } => {
                if blocks.is_empty() {
                    continue;
                }
                let i = index as usize % blocks.len();
                let block = &mut blocks[i];
                let size = size_of_input(size);
                let Ok(new) = Layout::from_size_align(size, block.layout.align()) else {
                    continue;
                };
                let old = block.layout;
                check(block.ptr, old.size(), block.fill, "before resize");
                let moved = match block.api {
                    // SAFETY: a live block of `old` from this allocator.
                    Api::Allocator => unsafe {
                        with_allocator(block.which, |a| a.resize(block.ptr, old, new, zeroed))
                    }
                    .map(|p| p.cast::<u8>()),
                    Api::Global if size == 0 => continue,
                    // SAFETY: as above; a non-zero new size.
                    Api::Global => NonNull::new(unsafe {
                        global(block.which).realloc(block.ptr.as_ptr(), old, size)
                    }),
                };
                let Some(ptr) = moved else {
                    // Refused: the old block must be intact.
                    check(block.ptr, old.size(), block.fill, "after a refused resize");
                    continue;
                };
                assert_eq!(ptr.as_ptr() as usize % new.align(), 0, "{new:?} misaligned");
                let kept = old.size().min(size);
                check(ptr, kept, block.fill, "kept by resize");
                if zeroed && size > old.size() && matches!(block.api, Api::Allocator) {
                    // SAFETY: the grown block holds `size` bytes.
                    let grown = unsafe { NonNull::new_unchecked(ptr.as_ptr().add(kept)) };
                    check(grown, size - kept, 0, "grown zeroed part");
                }
                // SAFETY: the block holds `size` bytes.
                unsafe { ptr.as_ptr().write_bytes(block.fill, size) };
                block.ptr = ptr;
                block.layout = new;
            }
        }
    }
    for block in blocks {
        free(block);
    }
});
