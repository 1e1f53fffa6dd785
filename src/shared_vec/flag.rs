//! The one-word protocol that makes views and resizes mutually exclusive.
//!
//! # Encoding
//!
//! Every [`SharedMklVec`](super::SharedMklVec) owns one `AtomicUsize`, its
//! *state*:
//!
//! ```text
//!   bit  usize::BITS-1    bits 0 ..= usize::BITS-2
//!   +---------------+-------------------------------------------+
//!   |   EXCLUSIVE   |   count                                   |
//!   +---------------+-------------------------------------------+
//!   0               0           free: no view, nobody resizing
//!   0               1..=MAX     that many live views (shared `&[T]`)
//!   1               anything    one exclusive holder: a resize in
//!                               progress or a live mutable view
//! ```
//!
//! Only the exclusive holder may write the buffer's pointer, length and
//! capacity cell (and the elements); views only read them. Nothing waits:
//! every conflict is reported at once and the caller decides whether to retry.
//!
//! * **Take a view**: `fetch_add(1, Acquire)`, atomic_refcell's scheme: one
//!   uncontended RMW, like `Arc::clone`. If the word had EXCLUSIVE set the
//!   view is refused (`Busy`) and its increment is *left behind*: backing it
//!   out could land after the holder's release and wrap 0 into EXCLUSIVE.
//!   The holder's release wipes such stray increments, and every reader of
//!   the count masks them while EXCLUSIVE is set, so `view_count()` and
//!   `Exported { views }` only ever report live views. If the count was
//!   already `MAX_VIEWS` the view is refused (`TooManyViews`) and backs its
//!   increment out: safe there, because while that increment is in the word
//!   no exclusive claim can succeed. A live count therefore never exceeds
//!   `MAX_VIEWS` plus the threads caught between those two instructions, far
//!   below EXCLUSIVE; strays could reach it only after 2^63 refusals during
//!   one exclusive hold. The view increments *before* it reads the pointer
//!   and length.
//! * **Drop a view**: `fetch_sub(1, Release)`.
//! * **Claim exclusively** (resize, mutable view): `compare_exchange(0,
//!   EXCLUSIVE, Acquire, Relaxed)`; it fails while any view or holder exists.
//! * **Release the claim**: `swap(0, Release)`, which also wipes the strays.
//!   A plain `store(0, Release)` is equally correct under the Rust/C++
//!   memory model, and costs the same here (once per resize), but loom 0.7
//!   does not model a plain store racing RMWs faithfully (tokio-rs/loom#254:
//!   with the store the models fail on executions the memory model forbids).
//!   With `swap` every write to the word is an RMW, which loom does model,
//!   so the protocol loom checks is the one that ships.
//!
//! The orderings are justified once, at each operation below. The loom
//! models in `loom_tests/` check them, and check that weakening them to
//! `Relaxed`, or replacing the claim by a load-then-store, is caught.
//!
//! A compare-exchange loop for views (refusing without writing, so no
//! strays) is the other known sound design. Measured with
//! `cargo run --release --example perf -- views` (2 threads taking and
//! dropping views of one buffer, ratio to `Arc::clone` + drop on the same
//! machine in the same run): the loop 1.8x, since failed compare-exchanges
//! retry; `fetch_add` 1.0-1.6x while the word shared a cache line with the
//! pointer and length each view reads next, and 0.89-1.03x once the word got
//! a line of its own (`BorrowFlag` is 64-byte aligned). Uncontended, all
//! of them cost about what `Arc` does. So: `fetch_add`, on its own line.

use super::SharedVecError;
use crate::sync::{AtomicUsize, Ordering};

/// The exclusive bit: the word's top bit.
pub(crate) const EXCLUSIVE: usize = 1 << (usize::BITS - 1);

/// The most views that may be alive at once. Far below EXCLUSIVE so that
/// transient over-increments by refused views (module docs) never reach it.
#[cfg(not(loom))]
pub(crate) const MAX_VIEWS: usize = EXCLUSIVE >> 1;
/// Tiny under loom so that the models explore the refusal at the limit.
#[cfg(loom)]
pub(crate) const MAX_VIEWS: usize = 2;

/// Deliberately broken protocols, built only under `cfg(loom)` so that the
/// loom suite can show it catches them (issue 3, loom test 9).
#[cfg(loom)]
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mutant {
    /// The protocol as documented.
    #[default]
    None,
    /// Every ordering weakened to `Relaxed`.
    RelaxedOrderings,
    /// The exclusive claim as "load, and if 0 store EXCLUSIVE" (not atomic).
    CheckThenAct,
}

/// The state word. See the module documentation for the encoding.
///
/// Alone on its cache line: every view writes the word, and the pointer and
/// length it then reads (and the mirrors) would otherwise share that
/// contended line.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct BorrowFlag {
    state: AtomicUsize,
    #[cfg(loom)]
    mutant: Mutant,
}

impl BorrowFlag {
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicUsize::new(0),
            #[cfg(loom)]
            mutant: Mutant::None,
        }
    }

    #[cfg(loom)]
    pub(crate) fn set_mutant(&mut self, mutant: Mutant) {
        self.mutant = mutant;
    }

    /// The ordering to use: `ord` itself, except in the loom-only mutant.
    #[inline(always)]
    fn ord(&self, ord: Ordering) -> Ordering {
        #[cfg(loom)]
        if self.mutant == Mutant::RelaxedOrderings {
            return Ordering::Relaxed;
        }
        ord
    }

    /// Registers a view. On `Ok` the caller may read the buffer's cell and
    /// elements until it calls [`release_view`](Self::release_view).
    #[inline]
    pub(crate) fn try_view(&self) -> Result<(), SharedVecError> {
        // Acquire: pairs with the Release of the last exclusive holder's
        // swap of 0 (and of every RMW after it, its release sequence), so
        // the pointer, length and elements that holder wrote are visible to
        // the reads this view makes next.
        let prev = self.state.fetch_add(1, self.ord(Ordering::Acquire));
        if prev & EXCLUSIVE != 0 {
            // A stray increment, wiped by the holder's release (module docs).
            return Err(SharedVecError::Busy);
        }
        if prev >= MAX_VIEWS {
            // Relaxed: this increment published nothing and read nothing;
            // as an RMW it still continues the release sequences in the word.
            self.state.fetch_sub(1, Ordering::Relaxed);
            return Err(SharedVecError::TooManyViews { max: MAX_VIEWS });
        }
        Ok(())
    }

    /// Unregisters a view taken with [`try_view`](Self::try_view).
    #[inline]
    pub(crate) fn release_view(&self) {
        // Release: this view's reads of the cell and elements happen-before
        // the next exclusive claim, whose Acquire compare-exchange can only
        // read 0 from this RMW or a later one in its release sequence.
        self.state.fetch_sub(1, self.ord(Ordering::Release));
    }

    /// Claims the buffer exclusively. On `Ok` the caller may write the cell
    /// and the elements until it calls [`release_exclusive`](Self::release_exclusive).
    #[inline]
    pub(crate) fn try_claim(&self) -> Result<(), SharedVecError> {
        #[cfg(loom)]
        if self.mutant == Mutant::CheckThenAct {
            return self.try_claim_check_then_act();
        }
        // Acquire on success: pairs with the Release of every view's
        // fetch_sub and of the previous holder's swap of 0, so all their
        // accesses happen-before our writes (no view still reads what we
        // are about to free). Relaxed on failure: we only report the value.
        match self.state.compare_exchange(
            0,
            EXCLUSIVE,
            self.ord(Ordering::Acquire),
            Ordering::Relaxed,
        ) {
            Ok(_) => Ok(()),
            Err(state) => Err(refusal(state)),
        }
    }

    /// The loom-only broken claim: a window between the check and the set.
    #[cfg(loom)]
    fn try_claim_check_then_act(&self) -> Result<(), SharedVecError> {
        let state = self.state.load(Ordering::Acquire);
        if state != 0 {
            return Err(refusal(state));
        }
        self.state.store(EXCLUSIVE, Ordering::Relaxed);
        Ok(())
    }

    /// Gives back an exclusive claim.
    #[inline]
    pub(crate) fn release_exclusive(&self) {
        // Release: our writes to the cell and the elements happen-before
        // whoever next reads this 0 (or an RMW after it) with Acquire, view
        // or claimer. A swap, not a store: see the module docs.
        self.state.swap(0, self.ord(Ordering::Release));
    }

    /// Live views right now (0 while the buffer is exclusively held).
    #[inline]
    pub(crate) fn views(&self) -> usize {
        // Relaxed: a report, not a synchronisation point.
        live_views(self.state.load(Ordering::Relaxed))
    }

    /// Whether an exclusive holder exists right now.
    #[inline]
    pub(crate) fn is_exclusive(&self) -> bool {
        // Relaxed: a report, not a synchronisation point.
        self.state.load(Ordering::Relaxed) & EXCLUSIVE != 0
    }

    /// The raw word (loom tests check it is back at 0).
    #[cfg(loom)]
    pub(crate) fn raw(&self) -> usize {
        self.state.load(Ordering::SeqCst)
    }
}

/// Live views encoded in `state`: strays masked while EXCLUSIVE is set, and
/// a refused acquirer's transient over-increment not counted.
#[inline]
fn live_views(state: usize) -> usize {
    if state & EXCLUSIVE != 0 {
        0
    } else {
        state.min(MAX_VIEWS)
    }
}

/// Why an exclusive claim failed, given the word it found.
#[cold]
fn refusal(state: usize) -> SharedVecError {
    if state & EXCLUSIVE != 0 {
        SharedVecError::Busy
    } else {
        SharedVecError::Exported {
            views: live_views(state),
        }
    }
}
