//! Growth slack: the bytes of live chunks beyond what MKL last asked for
//! (`Chunk::size - Chunk::asked`), mostly what a growth kept of a larger
//! cached chunk it moved onto (`block_cache::GROWTH_SLACK`), and a
//! reused chunk's fit waste (at most an eighth) or a mild shrink's tail.
//!
//! That memory is resident and the crate's choice, neither MKL's count
//! (`bytes`) nor the cache's (`cached_bytes`): it is counted here, reported
//! apart ([`MemStats::slack_bytes`](crate::manager::MemStats)), and bounded
//! with the cache by the cache's one budget (the cache keeps a freed chunk
//! only while `cached + slack` stays within it; a mild shrink gives its
//! tail back beyond it).
//!
//! One atomic word, changed only where a chunk's slack changes (an exact
//! fit, the common case, writes nothing). Every chunk's slack is added
//! before the chunk is handed to MKL and taken off after MKL gave it back,
//! so the word never goes below zero; a thread lost to a `fork` between
//! the two leaves it too high, which only makes the cache keep less.

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::chunks::Chunk;

static SLACK: AtomicUsize = AtomicUsize::new(0);

/// The slack of a chunk recorded as `c`.
#[inline]
pub(crate) fn of(c: Chunk) -> usize {
    c.size - c.asked
}

/// A chunk's slack changed from `old` to `new` bytes (0 for a chunk that
/// appears or leaves).
#[inline]
pub(crate) fn change(old: usize, new: usize) {
    if new > old {
        SLACK.fetch_add(new - old, Relaxed);
    } else if old > new {
        SLACK.fetch_sub(old - new, Relaxed);
    }
}

/// Bytes of slack in live chunks.
#[inline]
pub(crate) fn bytes() -> usize {
    SLACK.load(Relaxed)
}
