//! SharedMklVec: the reference design's test list (mkl-service's MKLMemory
//! and its review), translated, plus the holes the review found.

#![cfg(not(loom))] // loom atomics only work inside a loom model: see loom_tests/.

use std::sync::{Arc, Barrier};
use std::thread;

use mkl_alloc::{MAX_ALIGN, SharedMklVec, SharedVecError};

fn contents<T: Copy>(v: &SharedMklVec<T>) -> Vec<T> {
    v.view().expect("view").to_vec()
}

// ---------------------------------------------------------------- construction

#[test]
fn invalid_alignments_are_refused_everywhere() {
    let src = SharedMklVec::from_slice(&[1u8, 2, 3]);
    for align in [0, 3, 5, 12, 24, 96, 100, 129, 1000, 1usize << 31] {
        let want = SharedVecError::InvalidAlignment(align);
        assert_eq!(
            SharedMklVec::<u8>::with_alignment(16, align).unwrap_err(),
            want
        );
        assert_eq!(
            SharedMklVec::<u8>::with_alignment(0, align).unwrap_err(),
            want
        );
        assert_eq!(
            SharedMklVec::from_slice_with_alignment(&[1.0f64], align).unwrap_err(),
            want
        );
        assert_eq!(src.try_clone_with_alignment(align).unwrap_err(), want);
        let msg = want.to_string();
        assert!(msg.contains(&align.to_string()), "{msg}");
        if align.is_power_of_two() {
            assert!(msg.contains("exceeds"), "{msg}");
        } else {
            assert!(msg.contains("not a power of two"), "{msg}");
        }
    }
    assert!(
        SharedMklVec::<u8>::with_alignment(1, MAX_ALIGN).is_ok() || {
            // 2^30 is valid; only MKL may fail to find such a block.
            matches!(
                SharedMklVec::<u8>::with_alignment(1, MAX_ALIGN),
                Err(SharedVecError::AllocFailed { .. })
            )
        }
    );
}

#[test]
fn every_power_of_two_alignment_is_honoured_across_reallocs() {
    for shift in 0..=20 {
        let align = 1usize << shift;
        let v = SharedMklVec::<u32>::with_alignment(5, align).unwrap();
        assert_eq!(v.alignment(), align);
        assert_eq!(v.as_ptr() as usize % align, 0, "align {align}");
        v.try_extend_from_slice(&[7; 5]).unwrap();
        v.try_reserve(1000).unwrap(); // a growth MKL_realloc serves by moving
        assert_eq!(v.as_ptr() as usize % align, 0, "align {align} after grow");
        v.try_shrink_to_fit().unwrap();
        assert_eq!(v.as_ptr() as usize % align, 0, "align {align} after shrink");
        assert_eq!(contents(&v), [7; 5]);
        // Empty buffers hold no block, yet their pointer is aligned too.
        let e = SharedMklVec::<u32>::with_alignment(0, align).unwrap();
        assert_eq!(e.as_ptr() as usize % align, 0);
        assert_eq!(e.capacity(), 0);
    }
}

#[test]
fn defaults() {
    let v = SharedMklVec::<f64>::new();
    assert_eq!((v.len(), v.capacity(), v.alignment()), (0, 0, 64));
    assert!(v.is_empty());
    assert_eq!(v.as_ptr() as usize % 64, 0);
    let v = SharedMklVec::<f64>::with_capacity(33);
    assert!(v.capacity() >= 33);
    assert_eq!(v.as_ptr() as usize % 64, 0);
    let v = SharedMklVec::<f64>::default();
    assert_eq!(v.len(), 0);
}

#[cfg(feature = "bytemuck")]
#[test]
fn zeroed_is_really_zero() {
    // Dirty MKL's cache first, so that a non-zeroing calloc would show.
    for _ in 0..4 {
        let d = SharedMklVec::from_slice(&[u64::MAX; 4096]);
        drop(d);
    }
    let v = SharedMklVec::<u64>::zeroed(4096);
    assert_eq!(v.len(), 4096);
    assert!(v.view().unwrap().iter().all(|&x| x == 0));
    let v = SharedMklVec::<u64>::zeroed_with_alignment(4096, 1 << 16).unwrap();
    assert_eq!(v.as_ptr() as usize % (1 << 16), 0);
    assert!(v.view().unwrap().iter().all(|&x| x == 0));
    #[derive(Clone, Copy, bytemuck::Zeroable, PartialEq, Debug)]
    #[repr(C)]
    struct P {
        x: f32,
        y: u16,
    }
    let v = SharedMklVec::<P>::zeroed(3);
    assert_eq!(contents(&v), [P { x: 0.0, y: 0 }; 3]);
    assert_eq!(
        SharedMklVec::<u8>::zeroed_with_alignment(1, 24).unwrap_err(),
        SharedVecError::InvalidAlignment(24)
    );
}

// ---------------------------------------------------------------- copies

#[test]
fn copy_is_distinct_equal_independent_and_aligned() {
    let a = SharedMklVec::from_slice_with_alignment(&[1u32, 2, 3, 4], 1 << 12).unwrap();
    let b = a.try_clone().unwrap();
    assert_ne!(a.as_ptr(), b.as_ptr());
    assert_eq!(contents(&a), contents(&b));
    assert_eq!(b.alignment(), 1 << 12);
    assert_eq!(b.as_ptr() as usize % (1 << 12), 0);

    b.try_view_mut().unwrap()[0] = 100;
    b.try_push(5).unwrap();
    assert_eq!(contents(&a), [1, 2, 3, 4]);
    assert_eq!(contents(&b), [100, 2, 3, 4, 5]);
    a.try_truncate(1).unwrap();
    assert_eq!(contents(&b), [100, 2, 3, 4, 5]);

    let c = a.try_clone_with_alignment(1 << 16).unwrap();
    assert_eq!(c.alignment(), 1 << 16);
    assert_eq!(c.as_ptr() as usize % (1 << 16), 0);
    assert_eq!(contents(&c), [1]);
    let d = a.try_clone_with_alignment(8).unwrap();
    assert_eq!(d.alignment(), 8);

    // Empty copies hold no block and are still distinct objects.
    let e = SharedMklVec::<u8>::new().try_clone().unwrap();
    assert_eq!((e.len(), e.capacity()), (0, 0));
}

#[test]
fn copy_is_refused_while_the_source_is_held_exclusively() {
    let a = SharedMklVec::from_slice(&[1u8, 2]);
    let m = a.try_view_mut().unwrap();
    assert_eq!(a.try_clone().unwrap_err(), SharedVecError::Busy);
    drop(m);
    assert_eq!(contents(&a.try_clone().unwrap()), [1, 2]);
}

// ---------------------------------------------------------------- views vs resize

/// Every &self resize method, on a vector of u16.
type Resize = fn(&SharedMklVec<u16>) -> Result<(), SharedVecError>;

fn resizes() -> Vec<(&'static str, Resize)> {
    vec![
        ("try_push", |v| v.try_push(9)),
        ("try_resize grow", |v| v.try_resize(v.len() + 10, 9)),
        ("try_resize shrink", |v| v.try_resize(1, 9)),
        ("try_reserve", |v| v.try_reserve(1000)),
        ("try_reserve_exact", |v| v.try_reserve_exact(1000)),
        ("try_extend_from_slice", |v| {
            v.try_extend_from_slice(&[9, 9])
        }),
        ("try_truncate", |v| v.try_truncate(1)),
        ("try_clear", |v| v.try_clear()),
        ("try_shrink_to_fit", |v| v.try_shrink_to_fit()),
    ]
}

#[test]
fn resize_is_refused_while_one_or_two_views_live_then_succeeds() {
    for (name, op) in resizes() {
        let v = SharedMklVec::<u16>::with_capacity(64);
        v.try_extend_from_slice(&[1, 2, 3]).unwrap();
        let before = (v.as_ptr(), v.len(), v.capacity());

        let a = v.view().unwrap();
        assert_eq!(op(&v), Err(SharedVecError::Exported { views: 1 }), "{name}");
        let b = v.view().unwrap();
        assert_eq!(op(&v), Err(SharedVecError::Exported { views: 2 }), "{name}");
        assert_eq!(v.view_count(), 2);
        assert_eq!((v.as_ptr(), v.len(), v.capacity()), before, "{name}");
        assert_eq!((&*a, &*b), (&[1, 2, 3][..], &[1, 2, 3][..]), "{name}");
        drop(a);
        assert_eq!(op(&v), Err(SharedVecError::Exported { views: 1 }), "{name}");
        drop(b);
        assert_eq!(v.view_count(), 0);
        assert_eq!(op(&v), Ok(()), "{name}");
    }
}

#[test]
fn owned_views_block_resizes_from_another_thread() {
    let v = Arc::new(SharedMklVec::from_slice(&[1u64, 2, 3]));
    let owned = SharedMklVec::view_arc(&v).unwrap();
    assert_eq!(v.view_count(), 1);
    assert_eq!(v.try_push(4), Err(SharedVecError::Exported { views: 1 }));
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = thread::spawn(move || {
        rx.recv().unwrap();
        owned.iter().sum::<u64>()
    });
    assert_eq!(v.try_push(4), Err(SharedVecError::Exported { views: 1 }));
    tx.send(()).unwrap();
    assert_eq!(reader.join().unwrap(), 6);
    v.try_push(4).unwrap();
    assert_eq!(contents(&v), [1, 2, 3, 4]);
}

#[test]
fn mutable_view_excludes_views_resizes_and_other_mutable_views() {
    let v = SharedMklVec::from_slice(&[1i32, 2, 3]);
    {
        let mut m = v.try_view_mut().unwrap();
        m[2] = 30;
        assert_eq!(v.view().unwrap_err(), SharedVecError::Busy);
        assert_eq!(v.try_view_mut().unwrap_err(), SharedVecError::Busy);
        assert_eq!(v.try_push(4), Err(SharedVecError::Busy));
        assert_eq!(v.view_count(), 0);
        // Refused view attempts must not count as views.
        assert!(format!("{v:?}").contains("views: 0"));
    }
    let a = v.view().unwrap();
    assert_eq!(&*a, &[1, 2, 30]);
    assert_eq!(v.view_count(), 1);
    assert_eq!(
        v.try_view_mut().unwrap_err(),
        SharedVecError::Exported { views: 1 }
    );
    drop(a);
    assert_eq!(v.view_count(), 0);
    v.try_push(4).unwrap();
}

#[test]
fn guards_are_released_when_their_holder_panics() {
    let v = SharedMklVec::from_slice(&[1u8, 2]);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _m = v.try_view_mut().unwrap();
        panic!("holder dies");
    }));
    assert!(r.is_err());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _a = v.view().unwrap();
        panic!("reader dies");
    }));
    assert!(r.is_err());
    assert_eq!(v.view_count(), 0);
    v.try_push(3).unwrap();
    assert_eq!(contents(&v), [1, 2, 3]);
}

#[test]
fn extending_from_own_view_is_refused() {
    let v = SharedMklVec::from_slice(&[1u8, 2]);
    let a = v.view().unwrap();
    assert_eq!(
        v.try_extend_from_slice(&a),
        Err(SharedVecError::Exported { views: 1 })
    );
}

// ---------------------------------------------------------------- validation order, failures

#[test]
fn size_is_validated_before_state() {
    let v = SharedMklVec::from_slice(&[1u64, 2, 3]);
    let over = (isize::MAX as usize) / 8 + 1;
    {
        let _a = v.view().unwrap();
        assert_eq!(
            v.try_resize(usize::MAX, 0),
            Err(SharedVecError::CapacityOverflow)
        );
        assert_eq!(v.try_resize(over, 0), Err(SharedVecError::CapacityOverflow));
        assert_eq!(
            v.try_reserve(usize::MAX),
            Err(SharedVecError::CapacityOverflow)
        );
        assert_eq!(
            v.try_reserve_exact(over),
            Err(SharedVecError::CapacityOverflow)
        );
        // ...and a size that is fine is refused for the state.
        assert_eq!(
            v.try_resize(0, 0),
            Err(SharedVecError::Exported { views: 1 })
        );
    }
    {
        let _m = v.try_view_mut().unwrap();
        assert_eq!(
            v.try_reserve(usize::MAX),
            Err(SharedVecError::CapacityOverflow)
        );
        assert_eq!(v.try_resize(0, 0), Err(SharedVecError::Busy));
    }
    // Overflow only together with the current length: refused, nothing changes.
    assert_eq!(
        v.try_reserve(over - 2),
        Err(SharedVecError::CapacityOverflow)
    );
    assert_eq!(contents(&v), [1, 2, 3]);
    assert_eq!(
        SharedMklVec::<u64>::with_alignment(over, 64).unwrap_err(),
        SharedVecError::CapacityOverflow
    );
}

/// Issue 11, item 1: an overflow that needs the current length to be seen
/// (`len + additional`) is still reported as `CapacityOverflow`, not as the
/// state's `Exported` / `Busy`, by every `try_` method that grows.
#[test]
fn overflow_with_the_length_is_reported_before_views_and_mutable_views() {
    let overflow = Err(SharedVecError::CapacityOverflow);
    // The review's case: 10 bytes, then isize::MAX more.
    let v = SharedMklVec::from_slice(&[7u8; 10]);
    let past = isize::MAX as usize;
    assert!(
        past.checked_add(10).is_some(),
        "overflows only with the length"
    );
    let check = |what: &str| {
        assert_eq!(v.try_reserve(past), overflow, "try_reserve, {what}");
        assert_eq!(
            v.try_reserve_exact(past),
            overflow,
            "try_reserve_exact, {what}"
        );
        assert_eq!(v.try_resize(past + 1, 0), overflow, "try_resize, {what}");
    };
    check("no view");
    {
        let _view = v.view().unwrap();
        check("one view");
        let _second = v.view().unwrap();
        check("two views");
        // A size that fits is refused for the state, as before.
        assert_eq!(v.try_reserve(1), Err(SharedVecError::Exported { views: 2 }));
    }
    {
        let _m = v.try_view_mut().unwrap();
        check("a mutable view");
        assert_eq!(v.try_reserve(1), Err(SharedVecError::Busy));
    }
    assert_eq!(contents(&v), [7; 10]);

    // Zero-sized elements: the length itself can reach usize::MAX, so push
    // and extend can overflow too.
    let z = SharedMklVec::<()>::new();
    z.try_resize(usize::MAX, ()).unwrap();
    let check_zst = |what: &str| {
        assert_eq!(z.try_push(()), overflow, "try_push, {what}");
        assert_eq!(
            z.try_extend_from_slice(&[()]),
            overflow,
            "try_extend_from_slice, {what}"
        );
        assert_eq!(z.try_reserve(1), overflow, "try_reserve, {what}");
        assert_eq!(
            z.try_reserve_exact(1),
            overflow,
            "try_reserve_exact, {what}"
        );
    };
    check_zst("no view");
    {
        let _view = z.view().unwrap();
        check_zst("one view");
    }
    {
        let _m = z.try_view_mut().unwrap();
        check_zst("a mutable view");
    }
    assert_eq!(z.len(), usize::MAX);
    // Below the limit the state decides again.
    z.try_truncate(usize::MAX - 1).unwrap();
    let view = z.view().unwrap();
    assert_eq!(z.try_push(()), Err(SharedVecError::Exported { views: 1 }));
    drop(view);
    z.try_push(()).unwrap();
    assert_eq!(z.len(), usize::MAX);
}

/// Issue 11, item 2: the view limit the failure table quotes
/// (docs/failures.md) is the one the code enforces.
#[test]
fn the_failure_table_quotes_the_view_limit_the_code_enforces() {
    let max = SharedMklVec::<u8>::MAX_VIEWS;
    assert_eq!(max, 1 << (usize::BITS - 2));
    let readme = include_str!("../docs/failures.md");
    let row = readme
        .lines()
        .find(|l| l.contains("TooManyViews"))
        .expect("docs/failures.md's failure table has a TooManyViews row");
    let quoted = format!("(2^{} on 64-bit targets)", max.trailing_zeros());
    if usize::BITS == 64 {
        assert!(
            row.contains(&quoted),
            "docs/failures.md row {row:?} does not quote {quoted}"
        );
    }
    assert!(
        row.contains("MAX_VIEWS"),
        "docs/failures.md row {row:?} does not name the constant"
    );
    assert!(
        SharedVecError::TooManyViews { max }
            .to_string()
            .contains(&max.to_string())
    );
}

#[test]
#[cfg_attr(
    mkl_alloc_wine,
    ignore = "wine reserves 2^45+ bytes that Windows refuses; touching them gets the process killed"
)]
fn failed_realloc_leaves_everything_unchanged() {
    let v = SharedMklVec::<u8>::with_capacity(100);
    v.try_extend_from_slice(&(0..100).collect::<Vec<u8>>())
        .unwrap();
    let before = (v.as_ptr(), v.len(), v.capacity());
    let huge = 1usize << 45; // far more than this machine can give

    let err = v.try_reserve(huge).unwrap_err();
    assert_eq!(
        err,
        SharedVecError::AllocFailed {
            bytes: 100 + huge,
            align: 64
        }
    );
    assert!(err.to_string().contains(&(100 + huge).to_string()), "{err}");
    assert_eq!((v.as_ptr(), v.len(), v.capacity()), before);
    assert_eq!(contents(&v), (0..100).collect::<Vec<u8>>());

    assert!(matches!(
        v.try_resize(huge, 1),
        Err(SharedVecError::AllocFailed { .. })
    ));
    assert_eq!((v.as_ptr(), v.len(), v.capacity()), before);
    assert_eq!(contents(&v), (0..100).collect::<Vec<u8>>());

    // The claim was given back: the buffer still works.
    assert_eq!(v.view_count(), 0);
    v.try_push(100).unwrap();
    assert_eq!(contents(&v).len(), 101);

    let aligned = SharedMklVec::<u8>::with_alignment(1, 1 << 12).unwrap();
    assert_eq!(
        aligned.try_reserve_exact(huge),
        Err(SharedVecError::AllocFailed {
            bytes: huge,
            align: 1 << 12
        })
    );
    assert_eq!(
        SharedMklVec::<u8>::with_alignment(huge, 64).unwrap_err(),
        SharedVecError::AllocFailed {
            bytes: huge,
            align: 64
        }
    );
}

// ---------------------------------------------------------------- growth and shrinking

#[test]
fn grow_and_shrink_keep_data_and_alignment() {
    for align in [1, 64, 4096, 1 << 16] {
        let v = SharedMklVec::<u32>::with_alignment(0, align).unwrap();
        let mut caps = 0;
        let mut last_cap = v.capacity();
        // Under Miri (interpreted) fewer pushes: still 7 reallocations.
        let pushes = if cfg!(miri) { 300 } else { 2000 };
        for i in 0..pushes {
            v.try_push(i).unwrap();
            if v.capacity() != last_cap {
                caps += 1;
                last_cap = v.capacity();
                assert_eq!(v.as_ptr() as usize % align.max(64), 0);
                let c = contents(&v);
                assert!(c.iter().copied().eq(0..=i), "align {align} at {i}");
            }
        }
        assert!(caps >= 5, "grows geometrically, reallocating several times");
        v.try_truncate(10).unwrap();
        assert_eq!(v.capacity(), last_cap);
        v.try_shrink_to_fit().unwrap();
        assert_eq!(v.capacity(), 10);
        assert_eq!(v.as_ptr() as usize % align.max(64), 0);
        assert_eq!(contents(&v), (0..10).collect::<Vec<_>>());
        v.try_resize(12, 7).unwrap();
        assert_eq!(&contents(&v)[8..], &[8, 9, 7, 7]);
        v.try_resize(3, 0).unwrap();
        assert_eq!(contents(&v), [0, 1, 2]);
        v.try_clear().unwrap();
        v.try_shrink_to_fit().unwrap();
        assert_eq!((v.len(), v.capacity()), (0, 0));
        assert_eq!(v.as_ptr() as usize % align.max(64), 0);
        v.try_push(5).unwrap();
        assert_eq!(contents(&v), [5]);
    }
}

#[test]
fn exclusive_borrow_methods() {
    let mut v = SharedMklVec::new();
    v.push(1u16);
    v.extend_from_slice(&[2, 3]);
    v.resize(5, 9);
    assert_eq!(v.as_slice(), &[1, 2, 3, 9, 9]);
    v.as_mut_slice()[0] = 10;
    v.truncate(4);
    v.reserve(100);
    assert!(v.capacity() >= 104);
    v.shrink_to_fit();
    assert_eq!(v.capacity(), 4);
    assert_eq!(contents(&v), [10, 2, 3, 9]);
    // SAFETY: index 1 is in bounds and `&mut v` excludes every other access.
    unsafe { *v.as_mut_ptr().add(1) = 20 };
    assert_eq!(v.as_slice(), &[10, 20, 3, 9]);
    v.clear();
    assert!(v.is_empty());
}

#[test]
#[should_panic(expected = "capacity overflow")]
fn exclusive_borrow_methods_panic_on_overflow() {
    let mut v = SharedMklVec::from_slice(&[1u64]);
    v.reserve(usize::MAX);
}

#[test]
fn zero_sized_elements_need_no_block() {
    let v = SharedMklVec::<()>::new();
    assert_eq!(v.capacity(), usize::MAX);
    for _ in 0..1000 {
        v.try_push(()).unwrap();
    }
    assert_eq!(v.view().unwrap().len(), 1000);
    v.try_resize(usize::MAX, ()).unwrap();
    assert_eq!(v.len(), usize::MAX);
    assert_eq!(v.try_push(()), Err(SharedVecError::CapacityOverflow));
    assert_eq!(v.try_reserve(1), Err(SharedVecError::CapacityOverflow));
    v.try_shrink_to_fit().unwrap();
    assert_eq!(v.heap_size(), std::mem::size_of::<SharedMklVec<()>>());
    let c = v.try_clone().unwrap();
    assert_eq!(c.len(), usize::MAX);
}

#[test]
fn debug_heap_size_and_messages() {
    let v = SharedMklVec::<f64>::with_alignment(10, 128).unwrap();
    v.try_push(1.0).unwrap();
    let _a = v.view().unwrap();
    let d = format!("{v:?}");
    for part in [
        "len: 1",
        "capacity: 10",
        "alignment: 128",
        "views: 1",
        "ptr: 0x",
    ] {
        assert!(d.contains(part), "{d}");
    }
    // 80 bytes as MKL counts them: plus the 128-byte alignment and MKL's
    // 24-byte header (tests/heap_size.rs checks this against MKL_Mem_Stat).
    assert_eq!(
        v.heap_size(),
        80 + 128 + 24 + std::mem::size_of::<SharedMklVec<f64>>()
    );
    let msgs = [
        (SharedVecError::Exported { views: 3 }, "3"),
        (SharedVecError::TooManyViews { max: 7 }, "7"),
        (SharedVecError::InvalidAlignment(96), "96"),
        (
            SharedVecError::AllocFailed {
                bytes: 12345,
                align: 256,
            },
            "12345",
        ),
        (
            SharedVecError::AllocFailed {
                bytes: 12345,
                align: 256,
            },
            "256",
        ),
        (SharedVecError::Busy, "exclusively"),
        (SharedVecError::CapacityOverflow, "isize::MAX"),
    ];
    for (e, needle) in msgs {
        assert!(e.to_string().contains(needle), "{e}");
        let _: &dyn std::error::Error = &e;
    }
}

// ---------------------------------------------------------------- serde

#[cfg(feature = "serde")]
#[test]
fn serde_round_trip_keeps_length_contents_and_alignment() {
    let v = SharedMklVec::from_slice_with_alignment(&[1.5f64, -2.0, 3.25], 1 << 12).unwrap();
    let json = serde_json::to_string(&v).unwrap();
    assert_eq!(json, r#"{"alignment":4096,"data":[1.5,-2.0,3.25]}"#);
    let back: SharedMklVec<f64> = serde_json::from_str(&json).unwrap();
    assert_eq!(back.len(), 3);
    assert_eq!(back.alignment(), 1 << 12);
    assert_eq!(back.as_ptr() as usize % (1 << 12), 0);
    assert_eq!(contents(&back), [1.5, -2.0, 3.25]);
    assert_ne!(back.as_ptr(), v.as_ptr());

    let empty: SharedMklVec<u8> = serde_json::from_str(r#"{"alignment":64,"data":[]}"#).unwrap();
    assert!(empty.is_empty());
    let seq: SharedMklVec<u8> = serde_json::from_str(r#"[128,[1,2]]"#).unwrap();
    assert_eq!((seq.alignment(), contents(&seq)), (128, vec![1, 2]));

    let bad = serde_json::from_str::<SharedMklVec<u8>>(r#"{"alignment":96,"data":[1]}"#);
    assert!(bad.unwrap_err().to_string().contains("96"));
    assert!(serde_json::from_str::<SharedMklVec<u8>>(r#"{"data":[1]}"#).is_err());

    let _m = v.try_view_mut().unwrap();
    assert!(
        serde_json::to_string(&v).is_err(),
        "serialises only under a view"
    );
}

// ---------------------------------------------------------------- threads

#[test]
fn four_reader_threads() {
    // Under Miri (interpreted, ~1000x slower, every read of every thread
    // tracked by the race detector) fewer rounds over fewer elements.
    let (n, rounds) = if cfg!(miri) { (256, 4) } else { (4096, 200) };
    let v = SharedMklVec::from_slice(&(0..n).collect::<Vec<u32>>());
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..rounds {
                    let a = v.view().unwrap();
                    assert!(a.iter().copied().eq(0..n));
                    assert!(v.view_count() >= 1);
                }
            });
        }
    });
    assert_eq!(v.view_count(), 0);
    v.try_push(0).unwrap();
}

#[test]
fn three_readers_and_a_resizer_across_fifty_rounds() {
    // Invariant: the buffer always holds 0, 1, 2, …, len-1.
    let v = SharedMklVec::from_slice(&(0..64u64).collect::<Vec<_>>());
    let barrier = Barrier::new(4);
    // Under Miri fewer rounds (still one shrink, at round 9) of fewer tries.
    let (rounds, tries) = if cfg!(miri) { (10, 5) } else { (50, 20) };
    let (grown, refused) = thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..rounds {
                    barrier.wait();
                    for _ in 0..tries {
                        match v.view() {
                            Ok(a) => {
                                assert!(a.len() >= 64);
                                assert!(a.iter().copied().eq(0..a.len() as u64));
                            }
                            Err(SharedVecError::Busy) => {}
                            Err(e) => panic!("unexpected {e}"),
                        }
                    }
                    barrier.wait();
                    // The resizer grows the buffer alone.
                    barrier.wait();
                }
            });
        }
        let resizer = s.spawn(|| {
            let (mut grown, mut refused) = (0, 0);
            for round in 0..rounds {
                barrier.wait();
                for _ in 0..tries {
                    let n = v.len() as u64;
                    let more: Vec<u64> = (n..n + 1 + round % 7).collect();
                    match v.try_extend_from_slice(&more) {
                        Ok(()) => grown += 1,
                        Err(SharedVecError::Exported { views }) => {
                            assert!(views >= 1);
                            refused += 1;
                        }
                        Err(e) => panic!("unexpected {e}"),
                    }
                    if round % 10 == 9 {
                        // Shrinking is a realloc too.
                        let _ = v.try_shrink_to_fit();
                    }
                }
                barrier.wait();
                // No reader holds a view now: a growth must succeed. (How
                // many racing growths succeed is up to the scheduler; under
                // Miri's it can be none.)
                let n = v.len() as u64;
                v.try_extend_from_slice(&[n]).unwrap();
                barrier.wait();
            }
            (grown, refused)
        });
        resizer.join().unwrap()
    });
    assert_eq!(
        grown + refused,
        tries * rounds,
        "every racing growth is counted"
    );
    let all = contents(&v);
    assert!(all.iter().copied().eq(0..all.len() as u64));
    assert!(all.len() >= 64 + rounds as usize);
    assert_eq!(v.view_count(), 0);
}

#[test]
fn copies_racing_a_writer_are_never_torn() {
    use std::sync::atomic::{AtomicBool, Ordering};
    // The writer keeps every element equal to one value; a copy that raced
    // the writer (instead of holding a view) would mix two values.
    // Under Miri a smaller buffer and fewer copies of the same race.
    let (n, want) = if cfg!(miri) {
        (1 << 10, 3)
    } else {
        (1 << 16, 20)
    };
    let v = SharedMklVec::from_slice(&vec![0u32; n]);
    let copying = AtomicBool::new(true);
    let barrier = Barrier::new(2);
    let (copies, writes) = thread::scope(|s| {
        let copier = s.spawn(|| {
            barrier.wait();
            let mut copies = 0;
            while copies < want {
                match v.try_clone() {
                    Ok(c) => {
                        let c = contents(&c);
                        assert!(c.windows(2).all(|w| w[0] == w[1]), "torn copy");
                        copies += 1;
                    }
                    Err(SharedVecError::Busy) => thread::yield_now(),
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            copying.store(false, Ordering::Relaxed);
            copies
        });
        let writer = s.spawn(|| {
            barrier.wait();
            let (mut writes, mut current, mut k) = (0, 0, 0u32);
            while copying.load(Ordering::Relaxed) || writes == 0 {
                k += 1;
                if let Ok(mut m) = v.try_view_mut() {
                    m.fill(k);
                    current = k;
                    writes += 1;
                }
                let len = v.len();
                let new_len = if k % 2 == 0 {
                    len + 1000
                } else {
                    len.saturating_sub(1000)
                };
                let _ = v.try_resize(new_len, current);
                thread::yield_now();
            }
            writes
        });
        (copier.join().unwrap(), writer.join().unwrap())
    });
    assert!(
        copies >= 1 && writes >= 1,
        "{copies} copies, {writes} writes"
    );
    let all = contents(&v);
    assert!(all.windows(2).all(|w| w[0] == w[1]));
}
