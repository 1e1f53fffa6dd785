//! `SharedMklVec` operation sequences from arbitrary bytes against a `Vec`
//! model: shared, owned and mutable views, exports (and writes through
//! them), push, extend, reserve, resize (geometric and exact), truncate,
//! clear, shrink, clone. After every step the vector must equal the model,
//! every refused resize must be refused for the right reason (live views or
//! exports: `Exported`, a mutable view: `Busy`), and every live view must
//! still read the model's contents.
#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mkl_alloc::{ArcView, Export, SharedMklVec, SharedVecError, View, ViewMut};

type T = u32;

#[derive(Arbitrary, Debug)]
enum Op {
    View,
    DropView(u8),
    ViewArc,
    DropArcView(u8),
    Export,
    DropExport(u8),
    /// Writes `value` at `index` through the export `which`.
    WriteExport {
        which: u8,
        index: u16,
        value: T,
    },
    /// Takes a mutable view and writes through it, keeping it if `keep`.
    ViewMut {
        index: u16,
        value: T,
        keep: bool,
    },
    DropViewMut,
    Push(T),
    Extend(Vec<T>),
    Reserve(u16),
    ReserveExact(u16),
    Resize(u16, T),
    ResizeExact(u16, T),
    Truncate(u16),
    Clear,
    ShrinkToFit,
    Clone,
}

#[derive(Arbitrary, Debug)]
struct Input {
    align_log2: u8,
    initial: Vec<T>,
    ops: Vec<Op>,
}

/// What a resize must answer given the live views, exports and mutable view.
fn expected_refusal(counted: usize, mutable: bool) -> Option<SharedVecError> {
    if mutable {
        Some(SharedVecError::Busy)
    } else if counted > 0 {
        Some(SharedVecError::Exported { views: counted })
    } else {
        None
    }
}

/// Checks the outcome of a resize-like operation against `refusal`; on
/// success `apply` updates the model.
fn settle(
    model: &mut Vec<T>,
    refusal: Option<SharedVecError>,
    result: Result<(), SharedVecError>,
    apply: impl FnOnce(&mut Vec<T>),
) {
    match (result, refusal) {
        (Ok(()), None) => apply(model),
        (Err(e), Some(want)) => assert_eq!(e, want),
        (Err(SharedVecError::CapacityOverflow | SharedVecError::AllocFailed { .. }), None) => {}
        (got, want) => panic!("resize answered {got:?}, expected refusal {want:?}"),
    }
}

fuzz_target!(|input: Input| {
    let align = 1usize << (input.align_log2 % 13); // up to 4 KiB
    let vec = Arc::new(
        SharedMklVec::from_slice_with_alignment(&input.initial, align).expect("a valid alignment"),
    );
    let mut model: Vec<T> = input.initial.clone();
    let mut views: Vec<View<'_, T>> = Vec::new();
    let mut arc_views: Vec<ArcView<T>> = Vec::new();
    let mut exports: Vec<Export<T>> = Vec::new();
    let mut mutable: Option<ViewMut<'_, T>> = None;

    for op in input.ops.into_iter().take(200) {
        let counted = views.len() + arc_views.len() + exports.len();
        let refusal = expected_refusal(counted, mutable.is_some());
        match op {
            Op::View => match vec.view() {
                Ok(v) => {
                    assert!(mutable.is_none(), "a view beside a mutable view");
                    views.push(v);
                }
                Err(e) => assert_eq!((e, mutable.is_some()), (SharedVecError::Busy, true)),
            },
            Op::DropView(i) if !views.is_empty() => {
                views.swap_remove(i as usize % views.len());
            }
            Op::ViewArc => match SharedMklVec::view_arc(&vec) {
                Ok(v) => arc_views.push(v),
                Err(e) => assert_eq!((e, mutable.is_some()), (SharedVecError::Busy, true)),
            },
            Op::DropArcView(i) if !arc_views.is_empty() => {
                arc_views.swap_remove(i as usize % arc_views.len());
            }
            Op::Export => match SharedMklVec::export(&vec) {
                Ok(e) => {
                    assert_eq!(e.len(), model.len());
                    exports.push(e);
                }
                Err(e) => assert_eq!((e, mutable.is_some()), (SharedVecError::Busy, true)),
            },
            Op::DropExport(i) if !exports.is_empty() => {
                exports.swap_remove(i as usize % exports.len());
            }
            Op::WriteExport {
                which,
                index,
                value,
            } if !exports.is_empty() && !model.is_empty() => {
                let e = &exports[which as usize % exports.len()];
                let i = index as usize % model.len();
                // SAFETY: `i` < len; no view is dereferenced meanwhile and this
                // thread is the only writer (the export's contract).
                unsafe { e.as_mut_ptr().add(i).write(value) };
                model[i] = value;
            }
            Op::ViewMut { index, value, keep } => {
                if mutable.is_none() {
                    match vec.try_view_mut() {
                        Ok(m) => {
                            assert_eq!(counted, 0, "a mutable view beside {counted} views");
                            mutable = Some(m);
                        }
                        Err(e) => {
                            assert_eq!(e, SharedVecError::Exported { views: counted });
                            continue;
                        }
                    }
                } else {
                    assert_eq!(vec.try_view_mut().unwrap_err(), SharedVecError::Busy);
                }
                let m = mutable.as_mut().expect("taken above");
                assert_eq!(&**m, &model[..]);
                if !model.is_empty() {
                    let i = index as usize % model.len();
                    m[i] = value;
                    model[i] = value;
                }
                if !keep {
                    mutable = None;
                }
            }
            Op::DropViewMut => mutable = None,
            Op::Push(x) => settle(&mut model, refusal, vec.try_push(x), |m| m.push(x)),
            Op::Extend(items) => settle(
                &mut model,
                refusal,
                vec.try_extend_from_slice(&items),
                |m| m.extend_from_slice(&items),
            ),
            Op::Reserve(n) => {
                let n = n as usize;
                settle(&mut model, refusal, vec.try_reserve(n), |_| {});
                if refusal.is_none() {
                    assert!(vec.capacity() >= model.len() + n);
                }
            }
            Op::ReserveExact(n) => {
                let n = n as usize;
                settle(&mut model, refusal, vec.try_reserve_exact(n), |_| {});
                if refusal.is_none() {
                    assert!(vec.capacity() >= model.len() + n);
                }
            }
            Op::Resize(n, x) => settle(&mut model, refusal, vec.try_resize(n as usize, x), |m| {
                m.resize(n as usize, x)
            }),
            Op::ResizeExact(n, x) => {
                settle(
                    &mut model,
                    refusal,
                    vec.try_resize_exact(n as usize, x),
                    |m| m.resize(n as usize, x),
                );
                if refusal.is_none() {
                    assert_eq!(vec.capacity(), n as usize);
                }
            }
            Op::Truncate(n) => settle(&mut model, refusal, vec.try_truncate(n as usize), |m| {
                m.truncate(n as usize)
            }),
            Op::Clear => settle(&mut model, refusal, vec.try_clear(), |m| m.clear()),
            Op::ShrinkToFit => {
                settle(&mut model, refusal, vec.try_shrink_to_fit(), |_| {});
                if refusal.is_none() {
                    assert_eq!(vec.capacity(), model.len());
                }
            }
            Op::Clone => match vec.try_clone() {
                Ok(mut copy) => {
                    assert!(mutable.is_none(), "cloned beside a mutable view");
                    assert_eq!(copy.alignment(), vec.alignment());
                    assert_eq!(copy.as_slice(), &model[..]);
                    // The copy is independent of the original.
                    copy.push(7);
                    copy.as_mut_slice().fill(0);
                }
                Err(e) => assert_eq!((e, mutable.is_some()), (SharedVecError::Busy, true)),
            },
            _ => {} // a drop or write with nothing to act on
        }

        // Invariants after every step.
        assert_eq!(vec.len(), model.len());
        assert!(vec.capacity() >= model.len());
        if vec.capacity() > 0 {
            assert_eq!(vec.as_ptr() as usize % vec.alignment(), 0);
        }
        if mutable.is_none() {
            assert_eq!(
                vec.view_count(),
                views.len() + arc_views.len() + exports.len()
            );
            assert_eq!(&*vec.view().expect("no mutable view"), &model[..]);
        } else {
            assert_eq!(vec.view().unwrap_err(), SharedVecError::Busy);
        }
        for v in &views {
            assert_eq!(&**v, &model[..]);
        }
        for v in &arc_views {
            assert_eq!(&**v, &model[..]);
        }
        for e in &exports {
            assert_eq!(e.len(), model.len());
            assert_eq!(e.as_ptr(), vec.as_ptr());
        }
    }
    drop(mutable);
    drop(views);
    drop(arc_views);
    drop(exports);
    let mut vec = Arc::into_inner(vec).expect("every owned view and export was dropped");
    assert_eq!(vec.as_slice(), &model[..]);
});
