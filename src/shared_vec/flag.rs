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
//! * **Take a view**: a compare-exchange loop from the observed count to
//!   count + 1 (`Acquire` on success). It refuses, without writing, when the
//!   word has EXCLUSIVE set (`Busy`) or the count is already `MAX_VIEWS`
//!   (`TooManyViews`), so the count can never run into the EXCLUSIVE bit and
//!   the word always holds exactly the live views. The view increments
//!   *before* it reads the pointer and length.
//! * **Drop a view**: `fetch_sub(1, Release)`.
//! * **Claim exclusively** (resize, mutable view): `compare_exchange(0,
//!   EXCLUSIVE, Acquire, Relaxed)`; it fails while any view or holder exists.
//! * **Release the claim**: `store(0, Release)`. While EXCLUSIVE is set nobody
//!   else writes the word (every other operation on it fails without
//!   writing), so a plain store is enough.
//!
//! The orderings are justified once, at each operation below. The loom
//! models in `loom_tests/` check them, and check that weakening them to
//! `Relaxed`, or replacing the claim by a load-then-store, is caught.
//!
//! ## Why a compare-exchange loop rather than `fetch_add`
//!
//! atomic_refcell takes a shared borrow with one `fetch_add(1, Acquire)` and,
//! when it finds the exclusive bit, leaves that increment behind for the
//! holder's release store to wipe. It is sound under the C++/Rust model, and
//! measured here it is a little cheaper (a view taken and dropped,
//! uncontended: about 0.83x an `Arc::clone` + drop, against 0.95-0.99x for
//! the loop, best of 9 rounds on the shared 2-core machine: about 3 ns of
//! roughly 20). But loom 0.7 does
//! not model read-modify-write atomicity against a concurrent plain store
//! (tokio-rs/loom#254, fix unmerged): with stray increments racing the
//! release store it explores executions the memory model forbids and fails
//! the model (the word ends at EXCLUSIVE + strays). A protocol the model
//! checker cannot check is not "proved with loom", and the loop also keeps
//! `view_count()` exact with no masking. So: the loop.

use super::SharedVecError;
use crate::sync::{AtomicUsize, Ordering};

/// The exclusive bit: the word's top bit.
pub(crate) const EXCLUSIVE: usize = 1 << (usize::BITS - 1);

/// The most views that may be alive at once: every count below EXCLUSIVE.
#[cfg(not(loom))]
pub(crate) const MAX_VIEWS: usize = EXCLUSIVE - 1;
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
#[derive(Debug)]
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
        // Relaxed: only a first guess at the count; the compare-exchange
        // below checks it and is what synchronises.
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if state & EXCLUSIVE != 0 {
                return Err(SharedVecError::Busy);
            }
            if state >= MAX_VIEWS {
                return Err(SharedVecError::TooManyViews { max: MAX_VIEWS });
            }
            // Acquire on success: pairs with the Release of the last
            // exclusive holder's store of 0 (and of every RMW after it, its
            // release sequence), so the pointer, length and elements that
            // holder wrote are visible to the reads this view makes next.
            // Relaxed on failure: we only retry with the value found.
            match self.state.compare_exchange_weak(
                state,
                state + 1,
                self.ord(Ordering::Acquire),
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => state = actual,
            }
        }
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
        // fetch_sub and of the previous holder's store of 0, so all their
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
        // or claimer.
        self.state.store(0, self.ord(Ordering::Release));
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

/// Live views encoded in `state` (none while EXCLUSIVE is set).
#[inline]
fn live_views(state: usize) -> usize {
    if state & EXCLUSIVE != 0 { 0 } else { state }
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
