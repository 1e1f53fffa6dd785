//! Two words the stores beneath MKL share with the layers above, kept here
//! so that the stores never import those layers: the layers above write
//! or read them, the stores read or write them.
//!
//! - **The allocation path's word.** Every allocation of the crate's
//!   allocators compares its size with one relaxed word ([`slow`]): below
//!   it the call goes straight to MKL, at or above it the allocator has
//!   work of its own. The process setup (`process`) [`open`]s it at its
//!   threshold; until then it is 0, so the first call takes the slow path
//!   and runs the setup. The medium heap's let-go flag ([`all_slow`]) sets
//!   it to 0 while a program that let go of its work has dirty blocks to
//!   give back, so that the flag costs the fast path nothing.
//! - **Who drives decay.** While the background thread (`background`)
//!   runs it says so here ([`set_driven`]); the block cache's small-free
//!   countdown and the medium heap's let-go rule step aside then
//!   ([`driven`]), since the thread decays on its own clock.
//!
//! ```text
//! process ──open──▶ WORD ◀──all_slow── medium      allocators ──slow──▶ WORD
//! background ──set_driven──▶ DRIVEN ◀──driven── block_cache, medium
//! ```

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

/// The allocation path's word and what it is made of.
struct PathWord {
    /// Sizes at or above this take the allocators' slow path (0 until
    /// [`open`], and while the let-go flag is set).
    slow: AtomicUsize,
    /// The word's value once open (0 until then).
    threshold: AtomicUsize,
    /// The medium heap's let-go flag, as last given to [`all_slow`].
    all_slow: AtomicBool,
}

impl PathWord {
    const fn new() -> Self {
        Self {
            slow: AtomicUsize::new(0),
            threshold: AtomicUsize::new(0),
            all_slow: AtomicBool::new(false),
        }
    }

    #[inline(always)]
    fn slow(&self, size: usize) -> bool {
        size >= self.slow.load(Relaxed)
    }

    fn open(&self, threshold: usize) {
        debug_assert!(threshold > 0);
        self.threshold.store(threshold, Relaxed);
        let on = self.all_slow.load(Relaxed);
        self.slow.store(if on { 0 } else { threshold }, Relaxed);
    }

    fn all_slow(&self, on: bool) {
        self.all_slow.store(on, Relaxed);
        let threshold = self.threshold.load(Relaxed);
        if threshold != 0 {
            self.slow.store(if on { 0 } else { threshold }, Relaxed);
        }
    }
}

/// The process's word.
static WORD: PathWord = PathWord::new();

/// The background thread runs in this process and decays.
static DRIVEN: AtomicBool = AtomicBool::new(false);

/// Whether an allocation of `size` bytes must take the slow path: one
/// relaxed load and a comparison.
#[inline(always)]
pub(crate) fn slow(size: usize) -> bool {
    WORD.slow(size)
}

/// The setup ran: sizes below `threshold` (non-zero) take the fast path
/// from now on, unless the let-go flag is set.
pub(crate) fn open(threshold: usize) {
    WORD.open(threshold);
}

/// Every allocation takes the slow path while `on`; else the word is back
/// at its threshold. Before [`open`] the word stays 0 either way.
#[cfg_attr(loom, allow(dead_code))] // loom's medium heap is its model's own
pub(crate) fn all_slow(on: bool) {
    WORD.all_slow(on);
}

/// The background thread starts (`true`) or stops, or the process is a
/// fork's child, where it does not exist (`false`).
pub(crate) fn set_driven(on: bool) {
    DRIVEN.store(on, Relaxed);
}

/// Whether the background thread decays for this process: one relaxed
/// load.
#[inline(always)]
pub(crate) fn driven() -> bool {
    DRIVEN.load(Relaxed)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::PathWord;

    /// The word stays shut until opened, whatever the flag does; the flag
    /// set before the opening survives it; clearing it restores the
    /// threshold. (A word of its own: the process's is the library tests'
    /// allocation path, which must not open before the setup runs.)
    #[test]
    fn the_let_go_flag_and_the_threshold_combine() {
        let w = PathWord::new();
        w.all_slow(true);
        w.all_slow(false);
        assert!(w.slow(16), "the word opened before the setup");
        w.all_slow(true);
        w.open(1 << 20);
        assert!(w.slow(16), "the flag was lost when the word opened");
        w.all_slow(false);
        assert!(!w.slow(16) && w.slow(1 << 20));
        w.all_slow(true);
        assert!(w.slow(16));
    }
}
