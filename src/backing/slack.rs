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
//! It is counted in the cache's own budget word (`Cache::reserve`), so
//! that a chunk entering the cache and slack being kept are checked against
//! the budget by one compare-and-swap (issue 41: two words let two threads
//! freeing at the budget's edge both pass). Changed only where a chunk's
//! slack changes (an exact fit, the common case, writes nothing). Every
//! chunk's slack is reserved before the chunk is handed to MKL and given
//! back after MKL gave the chunk back, so the count never goes below zero;
//! a thread lost to a `fork` between the two leaves it too high, which
//! only makes the cache keep less.

use super::block_cache;
use super::chunks::Chunk;

/// The slack of a chunk recorded as `c`.
#[inline]
pub(crate) fn of(c: Chunk) -> usize {
    c.size - c.asked
}

/// A chunk's slack changed from `old` to `new` bytes (0 for a chunk that
/// appears or leaves), whether or not the rise fits the budget: for slack
/// that cannot be given back (see [`try_add`] for the rest).
#[inline]
pub(crate) fn change(old: usize, new: usize) {
    if new > old {
        block_cache::reserve_slack_anyway(new - old);
    } else if old > new {
        block_cache::unreserve_slack(old - new);
    }
}

/// Reserves `extra` more bytes of slack if they fit the budget beside the
/// cache and the slack there is (one compare-and-swap on the cache's word);
/// `false`: nothing reserved, and the caller keeps no such slack.
#[inline]
pub(crate) fn try_add(extra: usize) -> bool {
    block_cache::reserve_slack(extra)
}

/// Bytes of slack in live chunks.
#[inline]
pub(crate) fn bytes() -> usize {
    block_cache::slack_bytes()
}
