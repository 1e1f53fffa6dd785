//! Model-based property test of `SharedMklVec` (issue 5, item 1b): random
//! sequences of operations (shared views taken and dropped, owned `ArcView`s,
//! a mutable view taken / written / dropped, every `try_` resize, copies,
//! serde round trips, `&mut` operations) run against the real vector and
//! against a plain model: a `Vec<T>` plus the live views, the mutable view
//! and the alignment. After every step the test checks that
//!
//! * the result, including every error variant and its fields, is the one
//!   the model predicts (`CapacityOverflow` for sizes too large, alone or
//!   added to the length, first, then `Busy` / `Exported { views }`, then
//!   `AllocFailed { bytes, align }`);
//! * `len`, `view_count`, `heap_size` and the `Debug` output agree with the
//!   model; `capacity >= len`, the capacity follows the documented policy
//!   (exact for `reserve_exact` / `shrink_to_fit`, geometric like `Vec`
//!   otherwise, kept on truncate and on every error);
//! * `as_ptr` is aligned to `max(alignment, align_of::<T>(), 64)` and does
//!   not move unless the capacity changed;
//! * the contents, read through a fresh view (or the live mutable view), and
//!   through every live view, equal the model's;
//! * at the end MKL holds exactly the blocks it held before the case.
//!
//! Three element types: `u32`, `u8` (different minimum capacity) and `Wide`
//! (128 bytes, aligned to 128: the block alignment must be raised to it).
//!
//! Cases: `PROPTEST_CASES` if set (each of the three tests runs that many),
//! else 10,000 (`u32`) + 2,500 + 2,500: about 30 s for the whole file in a
//! debug build on the shared 2-core machine; 32 with
//! `MKL_ALLOC_TEST_SCALE=small` (valgrind). `PROPTEST_CASES=10000` with
//! `--release` runs 30,000 cases in about 5 s.

#![cfg(not(loom))]

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard};

use mkl_alloc::{ArcView, SharedMklVec, SharedVecError, View, ViewMut, manager};
use proptest::prelude::*;

// ---------------------------------------------------------------- configuration

fn cases(default: u32) -> u32 {
    if let Some(n) = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return n;
    }
    if std::env::var_os("MKL_ALLOC_TEST_SCALE").is_some_and(|v| v == "small") {
        32
    } else if cfg!(debug_assertions) {
        // A newcomer's `cargo test`: a tenth (the full count took a minute
        // of CI's time there; CI's release model step runs 10,000).
        default / 10
    } else {
        default
    }
}

/// The tests compare MKL's process-wide counters before and after each case:
/// one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Requests of at least this many bytes must fail with `AllocFailed`: more
/// than any address space (47 or 57 bits) can map, whatever the overcommit
/// policy. Everything the strategies ask for below it is tiny and must succeed.
const UNSATISFIABLE: usize = 1 << 58;

// ---------------------------------------------------------------- element types

#[cfg(feature = "serde")]
trait SerdeBound: serde::Serialize + serde::de::DeserializeOwned {}
#[cfg(feature = "serde")]
impl<T: serde::Serialize + serde::de::DeserializeOwned> SerdeBound for T {}
#[cfg(not(feature = "serde"))]
trait SerdeBound {}
#[cfg(not(feature = "serde"))]
impl<T> SerdeBound for T {}

trait Elem: Copy + PartialEq + Debug + Send + Sync + SerdeBound + 'static {
    fn from_u32(x: u32) -> Self;
    /// `SharedMklVec::zeroed_with_alignment`, where the type allows it.
    #[cfg(feature = "bytemuck")]
    fn zeroed(len: usize, align: usize) -> Result<SharedMklVec<Self>, SharedVecError>;
}

impl Elem for u32 {
    fn from_u32(x: u32) -> Self {
        x
    }
    #[cfg(feature = "bytemuck")]
    fn zeroed(len: usize, align: usize) -> Result<SharedMklVec<Self>, SharedVecError> {
        SharedMklVec::zeroed_with_alignment(len, align)
    }
}

impl Elem for u8 {
    fn from_u32(x: u32) -> Self {
        x as u8
    }
    #[cfg(feature = "bytemuck")]
    fn zeroed(len: usize, align: usize) -> Result<SharedMklVec<Self>, SharedVecError> {
        SharedMklVec::zeroed_with_alignment(len, align)
    }
}

/// 128 bytes, aligned to 128: more than MKL's 64.
#[derive(Clone, Copy, PartialEq, Debug, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "bytemuck", derive(bytemuck::Zeroable))]
#[repr(C, align(128))]
struct Wide {
    x: u32,
    y: u64,
}

impl Elem for Wide {
    fn from_u32(x: u32) -> Self {
        Wide {
            x,
            y: u64::from(x).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        }
    }
    #[cfg(feature = "bytemuck")]
    fn zeroed(len: usize, align: usize) -> Result<SharedMklVec<Self>, SharedVecError> {
        SharedMklVec::zeroed_with_alignment(len, align)
    }
}

// ---------------------------------------------------------------- operations

/// An alignment to ask for: a valid power of two `2^k` or a bad value.
#[derive(Clone, Copy, Debug)]
enum Align {
    Pow2(u32),
    Bad(usize),
}

impl Align {
    fn value(self) -> usize {
        match self {
            Align::Pow2(k) => 1 << k,
            Align::Bad(a) => a,
        }
    }
    fn is_valid(self) -> bool {
        matches!(self, Align::Pow2(_))
    }
}

fn align() -> impl Strategy<Value = Align> {
    prop_oneof![
        8 => (0..=16u32).prop_map(Align::Pow2),
        1 => prop::sample::select(vec![0usize, 3, 48, 100, 1000, 1 << 31, 1 << 40, usize::MAX])
            .prop_map(Align::Bad),
    ]
}

/// An element count for the size-taking operations. The huge ones are
/// symbolic, resolved against `T` and the current length when applied, so
/// that shrinking never lands in "might or might not be allocatable".
#[derive(Clone, Copy, Debug)]
enum Count {
    Small(usize),
    /// `UNSATISFIABLE` bytes' worth: valid, but MKL must fail.
    Unsatisfiable,
    /// The most elements whose bytes fit in `isize::MAX` (MKL must fail).
    AtIsizeMax,
    /// One element more than fits in `isize::MAX` bytes on its own.
    OverflowAlone,
    /// Fits on its own, overflows once added to the current length
    /// (reserve only; `OverflowAlone` when the vector is empty).
    OverflowWithLen,
    UsizeMax,
}

fn count() -> impl Strategy<Value = Count> {
    prop_oneof![
        20 => (0..=96usize).prop_map(Count::Small),
        1 => Just(Count::Unsatisfiable),
        1 => Just(Count::AtIsizeMax),
        1 => Just(Count::OverflowAlone),
        1 => Just(Count::OverflowWithLen),
        1 => Just(Count::UsizeMax),
    ]
}

#[derive(Clone, Copy, Debug)]
enum Ctor {
    New,
    Default,
    WithCapacity(usize),
    WithAlignment(usize, Align),
    FromSlice,
    FromSliceWithAlignment(Align),
    #[cfg(feature = "bytemuck")]
    Zeroed(usize, Align),
}

fn ctor() -> impl Strategy<Value = Ctor> {
    let base = prop_oneof![
        Just(Ctor::New),
        Just(Ctor::Default),
        (0..40usize).prop_map(Ctor::WithCapacity),
        (0..40usize, align()).prop_map(|(c, a)| Ctor::WithAlignment(c, a)),
        Just(Ctor::FromSlice),
        align().prop_map(Ctor::FromSliceWithAlignment),
    ];
    #[cfg(feature = "bytemuck")]
    let base =
        prop_oneof![6 => base, 1 => (0..40usize, align()).prop_map(|(n, a)| Ctor::Zeroed(n, a))];
    base
}

/// An operation through `&mut SharedMklVec` (needs every guard gone: the
/// sequence drops them all first, as a program would have to).
#[derive(Clone, Debug)]
enum MutOp {
    Push(u32),
    Resize(usize, u32),
    Reserve(usize),
    Extend(Vec<u32>),
    Truncate(usize),
    Clear,
    ShrinkToFit,
    Write {
        index: usize,
        value: u32,
    },
    /// `reserve(usize::MAX)`: must panic with "capacity overflow", unchanged.
    ReserveOverflowPanics,
}

#[derive(Clone, Debug)]
enum Op {
    View,
    ArcView,
    /// Drops the live view at this index (modulo the number alive).
    DropView(usize),
    ViewMut,
    /// Writes through the live mutable view (if any) at index mod len.
    WriteMut {
        index: usize,
        value: u32,
    },
    DropViewMut,
    Resize(Count, u32),
    Reserve(Count),
    ReserveExact(Count),
    Push(u32),
    Extend(Vec<u32>),
    /// `try_extend_from_slice` with a slice borrowed from a live view.
    ExtendFromOwnView,
    Truncate(usize),
    Clear,
    ShrinkToFit,
    /// `try_clone` (`None`) or `try_clone_with_alignment`; `adopt` continues
    /// the sequence on the copy (after dropping every guard of the original).
    Clone {
        align: Option<Align>,
        adopt: bool,
    },
    /// serde_json round trip; `adopt` as for `Clone`.
    #[cfg(feature = "serde")]
    Serde {
        adopt: bool,
    },
    Mut(MutOp),
}

fn values() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(any::<u32>(), 0..24)
}

fn mut_op() -> impl Strategy<Value = MutOp> {
    prop_oneof![
        any::<u32>().prop_map(MutOp::Push),
        (0..128usize, any::<u32>()).prop_map(|(n, v)| MutOp::Resize(n, v)),
        (0..96usize).prop_map(MutOp::Reserve),
        values().prop_map(MutOp::Extend),
        (0..128usize).prop_map(MutOp::Truncate),
        Just(MutOp::Clear),
        Just(MutOp::ShrinkToFit),
        (any::<usize>(), any::<u32>()).prop_map(|(index, value)| MutOp::Write { index, value }),
        Just(MutOp::ReserveOverflowPanics),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let ops = prop_oneof![
        6 => Just(Op::View),
        3 => Just(Op::ArcView),
        8 => any::<usize>().prop_map(Op::DropView),
        3 => Just(Op::ViewMut),
        3 => (any::<usize>(), any::<u32>()).prop_map(|(index, value)| Op::WriteMut { index, value }),
        3 => Just(Op::DropViewMut),
        4 => (count(), any::<u32>()).prop_map(|(c, v)| Op::Resize(c, v)),
        3 => count().prop_map(Op::Reserve),
        3 => count().prop_map(Op::ReserveExact),
        6 => any::<u32>().prop_map(Op::Push),
        4 => values().prop_map(Op::Extend),
        1 => Just(Op::ExtendFromOwnView),
        2 => (0..128usize).prop_map(Op::Truncate),
        1 => Just(Op::Clear),
        2 => Just(Op::ShrinkToFit),
        2 => (prop::option::of(align()), any::<bool>())
            .prop_map(|(align, adopt)| Op::Clone { align, adopt }),
        3 => mut_op().prop_map(Op::Mut),
    ];
    #[cfg(feature = "serde")]
    let ops = prop_oneof![30 => ops, 1 => any::<bool>().prop_map(|adopt| Op::Serde { adopt })];
    ops
}

// ---------------------------------------------------------------- the model

/// A live shared view and the contents it must show.
enum Held<'a, T: Copy> {
    Borrowed(View<'a, T>),
    Owned(ArcView<T>),
}

impl<T: Copy> Held<'_, T> {
    fn slice(&self) -> &[T] {
        match self {
            Held::Borrowed(v) => v,
            Held::Owned(v) => v,
        }
    }
}

/// What the real vector must look like.
struct Model<T> {
    items: Vec<T>,
    /// The alignment asked for (`alignment()`).
    align: usize,
    /// Capacity and pointer last observed (checked against the policy).
    cap: usize,
    ptr: usize,
    /// Live shared views and whether a mutable view is alive.
    views: usize,
    exclusive: bool,
}

impl<T: Elem> Model<T> {
    const SIZE: usize = size_of::<T>();

    fn block_align(&self) -> usize {
        self.align.max(align_of::<T>()).max(64)
    }

    /// `Vec`'s minimum non-zero capacity, which `SharedMklVec` mirrors.
    fn min_cap() -> usize {
        match Self::SIZE {
            1 => 8,
            n if n <= 1024 => 4,
            _ => 1,
        }
    }

    fn fits(n: usize) -> bool {
        n.checked_mul(Self::SIZE)
            .is_some_and(|b| b <= isize::MAX as usize)
    }

    /// The refusal the state word gives a claim right now, if any.
    fn claim_refusal(&self) -> Option<SharedVecError> {
        if self.exclusive {
            Some(SharedVecError::Busy)
        } else if self.views > 0 {
            Some(SharedVecError::Exported { views: self.views })
        } else {
            None
        }
    }

    /// Resolves a symbolic count for this element type and length.
    fn resolve(&self, c: Count) -> usize {
        let at_max = isize::MAX as usize / Self::SIZE;
        match c {
            Count::Small(n) => n,
            Count::Unsatisfiable => UNSATISFIABLE / Self::SIZE,
            Count::AtIsizeMax => at_max,
            Count::OverflowAlone => at_max + 1,
            Count::OverflowWithLen => (at_max + 1 - self.items.len()).max(1),
            Count::UsizeMax => usize::MAX,
        }
    }

    /// The capacity a geometric grow to `required > cap` asks for.
    fn grown(&self, required: usize) -> usize {
        let amortized = required
            .max(self.cap.saturating_mul(2))
            .max(Self::min_cap());
        if Self::fits(amortized) {
            amortized
        } else {
            required
        }
    }

    /// Predicts a capacity change to `new_cap` elements: Ok, CapacityOverflow
    /// or AllocFailed (the strategies only ask for tiny or impossible sizes).
    fn realloc_result(&self, new_cap: usize) -> Result<(), SharedVecError> {
        if !Self::fits(new_cap) {
            return Err(SharedVecError::CapacityOverflow);
        }
        let bytes = new_cap * Self::SIZE;
        if bytes >= UNSATISFIABLE / 2 {
            Err(SharedVecError::AllocFailed {
                bytes,
                align: self.block_align(),
            })
        } else {
            Ok(())
        }
    }
}

/// Everything one case needs: the vector, the model and the live guards.
struct Case<'a, T: Elem> {
    vec: &'a Arc<SharedMklVec<T>>,
    model: &'a mut Model<T>,
    views: Vec<Held<'a, T>>,
    view_mut: Option<ViewMut<'a, T>>,
}

/// What a step asks of the loop: go on, or end the segment (drop every
/// guard) and then run a `&mut` op or adopt a new vector.
enum Next<T: Copy> {
    Continue,
    Mut,
    Adopt(SharedMklVec<T>),
}

/// Checks a vector (the main one or a copy) against the model's contents and
/// alignment, without touching its guards.
fn check_copy<T: Elem>(
    copy: &SharedMklVec<T>,
    items: &[T],
    align: usize,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(copy.alignment(), align);
    prop_assert_eq!(copy.len(), items.len());
    prop_assert!(copy.capacity() >= copy.len());
    let want = align.max(align_of::<T>()).max(64);
    prop_assert_eq!(copy.as_ptr() as usize % want, 0, "copy misaligned");
    prop_assert_eq!(copy.view_count(), 0);
    let view = copy
        .view()
        .map_err(|e| TestCaseError::fail(format!("{e}")))?;
    prop_assert_eq!(&*view, items);
    Ok(())
}

impl<'a, T: Elem> Case<'a, T> {
    fn state_ptr(&self) -> usize {
        self.vec.as_ptr() as usize
    }

    /// Every observable property against the model, after every step.
    fn check(&mut self, step: &Op) -> Result<(), TestCaseError> {
        let v = &**self.vec;
        let m = &*self.model;
        prop_assert_eq!(v.len(), m.items.len(), "len after {:?}", step);
        prop_assert!(v.capacity() >= v.len(), "capacity < len after {:?}", step);
        prop_assert_eq!(v.alignment(), m.align);
        prop_assert_eq!(
            v.as_ptr() as usize % m.block_align(),
            0,
            "as_ptr misaligned after {:?}",
            step
        );
        prop_assert_eq!(
            v.view_count(),
            if m.exclusive { 0 } else { m.views },
            "view_count after {:?}",
            step
        );
        prop_assert_eq!(self.views.len(), m.views);
        // heap_size counts the block as MKL does (exactly: tests/heap_size.rs),
        // which after an in-place resize is the size MKL held before (more
        // than the capacity after a shrink, less after a growth in place):
        // no block means the handle alone; a block, at least 1 byte, MKL's
        // 64-byte minimum alignment padding and its 24-byte header.
        let block = v.capacity() * Model::<T>::SIZE;
        let handle = size_of::<SharedMklVec<T>>();
        if block == 0 {
            prop_assert_eq!(v.heap_size(), handle);
        } else {
            prop_assert!(
                v.heap_size() > 64 + 24 + handle,
                "heap_size {} for a block of {} bytes",
                v.heap_size(),
                block
            );
        }
        let dbg = format!("{v:?}");
        prop_assert!(
            dbg.contains(&format!("exclusive: {}", m.exclusive)),
            "{}",
            dbg
        );
        // Every live view still shows the current contents (no resize could
        // have happened while it lived), at the vector's current address.
        for held in &self.views {
            prop_assert_eq!(held.slice(), &m.items[..], "a live view changed");
            prop_assert_eq!(held.slice().as_ptr() as usize, v.as_ptr() as usize);
        }
        match &self.view_mut {
            Some(vm) => {
                prop_assert_eq!(&vm[..], &m.items[..], "contents through the mutable view");
                prop_assert_eq!(v.view().err(), Some(SharedVecError::Busy));
            }
            None => {
                let fresh = v
                    .view()
                    .map_err(|e| TestCaseError::fail(format!("check view: {e}")))?;
                prop_assert_eq!(&*fresh, &m.items[..], "contents after {:?}", step);
                prop_assert_eq!(fresh.as_ptr() as usize, v.as_ptr() as usize);
            }
        }
        Ok(())
    }

    /// Checks a `&self` resize: its result, and the capacity and pointer
    /// against the previous ones. `want` is the model's prediction; on Ok
    /// the model's items were already updated by the caller.
    fn after_resize(
        &mut self,
        step: &Op,
        got: Result<(), SharedVecError>,
        want: Result<(), SharedVecError>,
        new_cap: CapRule,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(got, want, "result of {:?}", step);
        let (cap, ptr) = (self.vec.capacity(), self.state_ptr());
        let m = &mut *self.model;
        match (want, new_cap) {
            (Err(_), _) | (Ok(()), CapRule::Same) => {
                prop_assert_eq!(cap, m.cap, "capacity changed by {:?}", step);
                prop_assert_eq!(ptr, m.ptr, "pointer moved by {:?}", step);
            }
            (Ok(()), CapRule::Exactly(n)) => {
                prop_assert_eq!(cap, n, "capacity after {:?}", step);
                if n == m.cap {
                    prop_assert_eq!(ptr, m.ptr, "pointer moved by {:?}", step);
                }
            }
        }
        m.cap = cap;
        m.ptr = ptr;
        Ok(())
    }

    /// The rule for a geometric grow to `required` elements.
    fn grow_rule(&self, required: usize) -> (CapRule, Result<(), SharedVecError>) {
        let m = &*self.model;
        if required <= m.cap {
            (CapRule::Same, Ok(()))
        } else {
            let target = m.grown(required);
            (CapRule::Exactly(target), m.realloc_result(target))
        }
    }

    fn step(&mut self, step: &Op) -> Result<Next<T>, TestCaseError> {
        let vec: &'a SharedMklVec<T> = self.vec;
        match step {
            Op::View => {
                let got = vec.view();
                if self.model.exclusive {
                    prop_assert_eq!(got.err(), Some(SharedVecError::Busy));
                } else {
                    let view = got.map_err(|e| TestCaseError::fail(format!("view: {e}")))?;
                    self.views.push(Held::Borrowed(view));
                    self.model.views += 1;
                }
            }
            Op::ArcView => {
                let got = SharedMklVec::view_arc(self.vec);
                if self.model.exclusive {
                    prop_assert_eq!(got.err(), Some(SharedVecError::Busy));
                } else {
                    let view = got.map_err(|e| TestCaseError::fail(format!("view_arc: {e}")))?;
                    prop_assert!(Arc::ptr_eq(ArcView::owner(&view), self.vec));
                    self.views.push(Held::Owned(view));
                    self.model.views += 1;
                }
            }
            Op::DropView(i) => {
                if !self.views.is_empty() {
                    let i = i % self.views.len();
                    drop(self.views.swap_remove(i));
                    self.model.views -= 1;
                }
            }
            Op::ViewMut => {
                let got = vec.try_view_mut();
                match self.model.claim_refusal() {
                    Some(want) => prop_assert_eq!(got.err(), Some(want)),
                    None => {
                        let vm =
                            got.map_err(|e| TestCaseError::fail(format!("try_view_mut: {e}")))?;
                        prop_assert_eq!(vm.len(), self.model.items.len());
                        self.view_mut = Some(vm);
                        self.model.exclusive = true;
                    }
                }
            }
            Op::WriteMut { index, value } => {
                if let Some(vm) = &mut self.view_mut
                    && !vm.is_empty()
                {
                    let i = index % vm.len();
                    vm[i] = T::from_u32(*value);
                    self.model.items[i] = T::from_u32(*value);
                }
            }
            Op::DropViewMut => {
                if self.view_mut.take().is_some() {
                    self.model.exclusive = false;
                }
            }
            Op::Resize(c, value) => {
                let new_len = self.model.resolve(*c);
                let value = T::from_u32(*value);
                let got = vec.try_resize(new_len, value);
                let len = self.model.items.len();
                let (rule, want) = if !Model::<T>::fits(new_len) {
                    (CapRule::Same, Err(SharedVecError::CapacityOverflow))
                } else if let Some(e) = self.model.claim_refusal() {
                    (CapRule::Same, Err(e))
                } else if new_len <= len {
                    (CapRule::Same, Ok(()))
                } else {
                    self.grow_rule(new_len)
                };
                if want.is_ok() {
                    self.model.items.resize(new_len, value);
                }
                self.after_resize(step, got, want, rule)?;
            }
            Op::Reserve(c) | Op::ReserveExact(c) => {
                let exact = matches!(step, Op::ReserveExact(_));
                let additional = self.model.resolve(*c);
                let got = if exact {
                    vec.try_reserve_exact(additional)
                } else {
                    vec.try_reserve(additional)
                };
                let len = self.model.items.len();
                // Overflow of the length plus the growth comes first, even
                // while views or a mutable view are alive (issue 11, item 1).
                let required = len.checked_add(additional);
                let (rule, want) = if !required.is_some_and(Model::<T>::fits) {
                    (CapRule::Same, Err(SharedVecError::CapacityOverflow))
                } else if let Some(e) = self.model.claim_refusal() {
                    (CapRule::Same, Err(e))
                } else {
                    let required = len + additional; // checked above
                    if required <= self.model.cap {
                        (CapRule::Same, Ok(()))
                    } else if exact {
                        (
                            CapRule::Exactly(required),
                            self.model.realloc_result(required),
                        )
                    } else {
                        self.grow_rule(required)
                    }
                };
                self.after_resize(step, got, want, rule)?;
            }
            Op::Push(x) => {
                let value = T::from_u32(*x);
                let got = vec.try_push(value);
                let (rule, want) = match self.model.claim_refusal() {
                    Some(e) => (CapRule::Same, Err(e)),
                    None => self.grow_rule(self.model.items.len() + 1),
                };
                if want.is_ok() {
                    self.model.items.push(value);
                }
                self.after_resize(step, got, want, rule)?;
            }
            Op::Extend(xs) => {
                let items: Vec<T> = xs.iter().map(|&x| T::from_u32(x)).collect();
                let got = vec.try_extend_from_slice(&items);
                let (rule, want) = match self.model.claim_refusal() {
                    Some(e) => (CapRule::Same, Err(e)),
                    None => self.grow_rule(self.model.items.len() + items.len()),
                };
                if want.is_ok() {
                    self.model.items.extend_from_slice(&items);
                }
                self.after_resize(step, got, want, rule)?;
            }
            Op::ExtendFromOwnView => {
                if let Some(held) = self.views.first() {
                    let got = vec.try_extend_from_slice(held.slice());
                    let want = Err(SharedVecError::Exported {
                        views: self.model.views,
                    });
                    self.after_resize(step, got, want, CapRule::Same)?;
                }
            }
            Op::Truncate(_) | Op::Clear => {
                let n = match step {
                    Op::Truncate(n) => *n,
                    _ => 0,
                };
                let got = if matches!(step, Op::Clear) {
                    vec.try_clear()
                } else {
                    vec.try_truncate(n)
                };
                let want = match self.model.claim_refusal() {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
                if want.is_ok() {
                    self.model.items.truncate(n);
                }
                self.after_resize(step, got, want, CapRule::Same)?;
            }
            Op::ShrinkToFit => {
                let got = vec.try_shrink_to_fit();
                let len = self.model.items.len();
                let (rule, want) = match self.model.claim_refusal() {
                    Some(e) => (CapRule::Same, Err(e)),
                    None => (CapRule::Exactly(len), Ok(())),
                };
                self.after_resize(step, got, want, rule)?;
                if want.is_ok() && len == 0 {
                    // No block: the dangling pointer is the block alignment.
                    prop_assert_eq!(self.state_ptr(), self.model.block_align());
                }
            }
            Op::Clone { align, adopt } => {
                let got = match align {
                    None => vec.try_clone(),
                    Some(a) => vec.try_clone_with_alignment(a.value()),
                };
                let target_align = align.map_or(self.model.align, Align::value);
                let want_err = match align {
                    Some(a) if !a.is_valid() => Some(SharedVecError::InvalidAlignment(a.value())),
                    _ if self.model.exclusive => Some(SharedVecError::Busy),
                    _ => None,
                };
                // The copy's view was given back either way.
                prop_assert_eq!(
                    vec.view_count(),
                    if self.model.exclusive {
                        0
                    } else {
                        self.model.views
                    }
                );
                match want_err {
                    Some(e) => prop_assert_eq!(got.err(), Some(e)),
                    None => {
                        let copy =
                            got.map_err(|e| TestCaseError::fail(format!("{step:?}: {e}")))?;
                        check_copy(&copy, &self.model.items, target_align)?;
                        if copy.capacity() > 0 {
                            prop_assert_ne!(copy.as_ptr(), vec.as_ptr());
                        }
                        if *adopt {
                            return Ok(Next::Adopt(copy));
                        }
                    }
                }
            }
            #[cfg(feature = "serde")]
            Op::Serde { adopt } => {
                let json = serde_json::to_string(vec);
                if self.model.exclusive {
                    let e = json.err().map(|e| e.to_string()).unwrap_or_default();
                    prop_assert!(
                        e.contains("exclusively"),
                        "serialise under a mutable view: {}",
                        e
                    );
                } else {
                    let json = json.map_err(|e| TestCaseError::fail(format!("to_string: {e}")))?;
                    let head = format!("{{\"alignment\":{},", self.model.align);
                    prop_assert!(json.starts_with(&head), "{}", json);
                    let back: SharedMklVec<T> = serde_json::from_str(&json)
                        .map_err(|e| TestCaseError::fail(format!("from_str: {e}")))?;
                    check_copy(&back, &self.model.items, self.model.align)?;
                    if *adopt {
                        return Ok(Next::Adopt(back));
                    }
                }
            }
            Op::Mut(_) => return Ok(Next::Mut),
        }
        Ok(Next::Continue)
    }
}

#[derive(Clone, Copy, Debug)]
enum CapRule {
    Same,
    Exactly(usize),
}

/// Builds the vector a case starts from, checking the constructor's result.
fn construct<T: Elem>(
    ctor: Ctor,
    init: &[u32],
) -> Result<(SharedMklVec<T>, Model<T>), TestCaseError> {
    let items: Vec<T> = init.iter().map(|&x| T::from_u32(x)).collect();
    let empty = Vec::new();
    let (got, want_items, align, cap) = match ctor {
        Ctor::New => (Ok(SharedMklVec::new()), &empty, Align::Pow2(6), Some(0)),
        Ctor::Default => (Ok(SharedMklVec::default()), &empty, Align::Pow2(6), Some(0)),
        Ctor::WithCapacity(c) => (
            Ok(SharedMklVec::with_capacity(c)),
            &empty,
            Align::Pow2(6),
            Some(c),
        ),
        Ctor::WithAlignment(c, a) => (
            SharedMklVec::with_alignment(c, a.value()),
            &empty,
            a,
            Some(c),
        ),
        Ctor::FromSlice => (
            Ok(SharedMklVec::from_slice(&items)),
            &items,
            Align::Pow2(6),
            None,
        ),
        Ctor::FromSliceWithAlignment(a) => (
            SharedMklVec::from_slice_with_alignment(&items, a.value()),
            &items,
            a,
            None,
        ),
        #[cfg(feature = "bytemuck")]
        Ctor::Zeroed(n, a) => {
            let zeros = vec![T::from_u32(0); n];
            // `from_u32(0)` is all-zero bytes for every element type here
            // (Wide's padding aside, which is not compared).
            return match (T::zeroed(n, a.value()), a.is_valid()) {
                (Err(e), false) => {
                    prop_assert_eq!(e, SharedVecError::InvalidAlignment(a.value()));
                    Ok(fresh())
                }
                (Ok(v), true) => {
                    check_copy(&v, &zeros, a.value())?;
                    prop_assert_eq!(v.capacity(), n);
                    let model = Model::observe(&v, zeros, a.value());
                    Ok((v, model))
                }
                (r, _) => Err(TestCaseError::fail(format!(
                    "{ctor:?} gave {:?}",
                    r.map(|v| v.len())
                ))),
            };
        }
    };
    if !align.is_valid() {
        prop_assert_eq!(
            got.err(),
            Some(SharedVecError::InvalidAlignment(align.value()))
        );
        return Ok(fresh());
    }
    let v = got.map_err(|e| TestCaseError::fail(format!("{ctor:?}: {e}")))?;
    check_copy(&v, want_items, align.value())?;
    if let Some(c) = cap {
        prop_assert_eq!(v.capacity(), c, "{:?}", ctor);
    }
    let model = Model::observe(&v, want_items.clone(), align.value());
    Ok((v, model))
}

fn fresh<T: Elem>() -> (SharedMklVec<T>, Model<T>) {
    let v = SharedMklVec::new();
    let model = Model::observe(&v, Vec::new(), 64);
    (v, model)
}

impl<T: Elem> Model<T> {
    /// A model of a vector with no guards, taking its capacity and pointer.
    fn observe(v: &SharedMklVec<T>, items: Vec<T>, align: usize) -> Self {
        Model {
            items,
            align,
            cap: v.capacity(),
            ptr: v.as_ptr() as usize,
            views: 0,
            exclusive: false,
        }
    }
}

/// Runs one `&mut` op on a vector with no guard alive.
fn apply_mut<T: Elem>(
    v: &mut SharedMklVec<T>,
    model: &mut Model<T>,
    op: &MutOp,
) -> Result<(), TestCaseError> {
    let before_cap = v.capacity();
    match op {
        MutOp::Push(x) => {
            v.push(T::from_u32(*x));
            model.items.push(T::from_u32(*x));
        }
        MutOp::Resize(n, x) => {
            v.resize(*n, T::from_u32(*x));
            model.items.resize(*n, T::from_u32(*x));
        }
        MutOp::Reserve(n) => {
            v.reserve(*n);
            prop_assert!(v.capacity() >= model.items.len() + n);
        }
        MutOp::Extend(xs) => {
            let items: Vec<T> = xs.iter().map(|&x| T::from_u32(x)).collect();
            v.extend_from_slice(&items);
            model.items.extend_from_slice(&items);
        }
        MutOp::Truncate(n) => {
            v.truncate(*n);
            model.items.truncate(*n);
            prop_assert_eq!(v.capacity(), before_cap);
        }
        MutOp::Clear => {
            v.clear();
            model.items.clear();
            prop_assert_eq!(v.capacity(), before_cap);
        }
        MutOp::ShrinkToFit => {
            v.shrink_to_fit();
            prop_assert_eq!(v.capacity(), model.items.len());
        }
        MutOp::Write { index, value } => {
            if !model.items.is_empty() {
                let i = index % model.items.len();
                v.as_mut_slice()[i] = T::from_u32(*value);
                model.items[i] = T::from_u32(*value);
            }
        }
        MutOp::ReserveOverflowPanics => {
            let (ptr, cap) = (v.as_ptr(), v.capacity());
            let r = catch_unwind(AssertUnwindSafe(|| v.reserve(usize::MAX)));
            let msg = r
                .err()
                .and_then(|p| p.downcast::<String>().ok())
                .map(|s| *s)
                .unwrap_or_default();
            prop_assert!(msg.contains("capacity overflow"), "panic message {:?}", msg);
            prop_assert_eq!((v.as_ptr(), v.capacity()), (ptr, cap));
        }
    }
    prop_assert_eq!(v.as_slice(), &model.items[..], "contents after {:?}", op);
    prop_assert!(v.capacity() >= v.len());
    prop_assert_eq!(v.as_mut_ptr() as usize % model.block_align(), 0);
    model.cap = v.capacity();
    model.ptr = v.as_ptr() as usize;
    Ok(())
}

/// One whole case.
fn run<T: Elem>(ctor: Ctor, init: &[u32], ops: &[Op]) -> Result<(), TestCaseError> {
    let (v, mut model) = construct::<T>(ctor, init)?;
    let mut vec = Arc::new(v);
    let mut i = 0;
    while i < ops.len() {
        // A segment of `&self` steps, guards alive, up to a `&mut` step or
        // an adoption; then every guard is dropped.
        let next = {
            let mut case = Case {
                vec: &vec,
                model: &mut model,
                views: Vec::new(),
                view_mut: None,
            };
            let mut next = Next::Continue;
            while i < ops.len() {
                next = case.step(&ops[i])?;
                if !matches!(next, Next::Continue) {
                    break;
                }
                case.check(&ops[i])?;
                i += 1;
            }
            drop(case.views);
            drop(case.view_mut);
            next
        };
        model.views = 0;
        model.exclusive = false;
        prop_assert_eq!(vec.view_count(), 0, "guards dropped, count not back to 0");
        match next {
            Next::Continue => {}
            Next::Mut => {
                let Op::Mut(op) = &ops[i] else { unreachable!() };
                let v = Arc::get_mut(&mut vec)
                    .ok_or_else(|| TestCaseError::fail("an ArcView kept its Arc alive"))?;
                apply_mut(v, &mut model, op)?;
                i += 1;
            }
            Next::Adopt(copy) => {
                let align = copy.alignment();
                let items = std::mem::take(&mut model.items);
                model = Model::observe(&copy, items, align);
                vec = Arc::new(copy);
                i += 1;
            }
        }
    }
    // Nothing alive any more: the vector can be resized, and it holds the
    // model's contents.
    let v = Arc::get_mut(&mut vec).ok_or_else(|| TestCaseError::fail("Arc still shared"))?;
    prop_assert_eq!(v.as_slice(), &model.items[..]);
    prop_assert_eq!(vec.try_reserve(1), Ok(()));
    Ok(())
}

fn case<T: Elem>(ctor: Ctor, init: &[u32], ops: &[Op]) -> Result<(), TestCaseError> {
    let _g = serial();
    let before = manager::stats();
    run::<T>(ctor, init, ops)?;
    prop_assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "MKL blocks leaked or double-freed"
    );
    Ok(())
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(10_000), ..ProptestConfig::default() })]
    #[test]
    fn u32_sequences_match_the_model(ctor in ctor(), init in values(), ops in ops()) {
        case::<u32>(ctor, &init, &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(2_500), ..ProptestConfig::default() })]
    #[test]
    fn u8_sequences_match_the_model(ctor in ctor(), init in values(), ops in ops()) {
        case::<u8>(ctor, &init, &ops)?;
    }

    #[test]
    fn wide_aligned_sequences_match_the_model(ctor in ctor(), init in values(), ops in ops()) {
        case::<Wide>(ctor, &init, &ops)?;
    }
}
