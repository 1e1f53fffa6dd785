//! SharedMklVec at the edges (issue 5, item 4): a zero-length vector viewed,
//! resized, copied and serialised; views held across a panic in another
//! thread; alignment 2^30 (accepted) and 2^31 (refused); a reservation of
//! more memory than the machine has.
//!
//! Every test compares MKL's process-wide counters before and after, so
//! they run one at a time.

#![cfg(not(loom))]

use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::thread;

use mkl_alloc::{MAX_ALIGN, SharedMklVec, SharedVecError, manager};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // The serialised tests compare MKL's counts block for block; the block
    // cache (on by default) keeps freed blocks of 1 MiB and more, counted
    // by MKL, so it is off here (tests/block_cache.rs covers it).
    mkl_alloc::block_cache::disable();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn contents<T: Copy>(v: &SharedMklVec<T>) -> Vec<T> {
    v.view().expect("view").to_vec()
}

/// Pointer, length, capacity and contents: what a refusal must not change.
fn snapshot<T: Copy>(v: &SharedMklVec<T>) -> (usize, usize, usize, Vec<T>) {
    (v.as_ptr() as usize, v.len(), v.capacity(), contents(v))
}

// ---------------------------------------------------------------- zero length

/// Checks a vector that must be empty and hold no MKL block.
#[track_caller]
fn assert_empty_without_block<T: Copy>(v: &SharedMklVec<T>, align: usize) {
    assert_eq!((v.len(), v.capacity()), (0, 0));
    assert!(v.is_empty());
    assert_eq!(v.alignment(), align);
    // No block: the pointer is dangling, aligned, and exactly the block alignment.
    let block_align = align.max(align_of::<T>()).max(64);
    assert_eq!(v.as_ptr() as usize, block_align);
    assert_eq!(v.heap_size(), size_of::<SharedMklVec<T>>());
    assert_eq!(v.view_count(), 0);
}

#[test]
fn zero_length_vec_is_viewed_resized_copied_and_serialised() {
    let _g = serial();
    let before = manager::stats();
    #[allow(clippy::type_complexity)]
    let makers: Vec<(&str, usize, fn() -> SharedMklVec<u32>)> = vec![
        ("new", 64, SharedMklVec::new),
        ("default", 64, SharedMklVec::default),
        ("with_capacity(0)", 64, || SharedMklVec::with_capacity(0)),
        ("with_alignment(0, 4096)", 4096, || {
            SharedMklVec::with_alignment(0, 4096).unwrap()
        }),
        ("from_slice(&[])", 64, || SharedMklVec::from_slice(&[])),
        ("from_slice_with_alignment(&[], 2^16)", 1 << 16, || {
            SharedMklVec::from_slice_with_alignment(&[], 1 << 16).unwrap()
        }),
        ("with_alignment(0, 8)", 8, || {
            SharedMklVec::with_alignment(0, 8).unwrap()
        }),
        #[cfg(feature = "bytemuck")]
        ("zeroed(0)", 64, || SharedMklVec::zeroed(0)),
    ];
    for (name, align, make) in makers {
        let v = make();
        assert_empty_without_block(&v, align);
        assert_eq!(
            manager::stats().mkl_held(),
            before.mkl_held(),
            "{name}: an empty vector holds a block"
        );

        // Viewed: empty slices, counted like any view, refusing every resize
        // (even those that would change nothing).
        let a = v.view().unwrap();
        let arc = Arc::new(make());
        let owned = SharedMklVec::view_arc(&arc).unwrap();
        assert!(a.is_empty() && owned.is_empty(), "{name}");
        assert_eq!(a.as_ptr(), v.as_ptr());
        assert_eq!(v.view_count(), 1);
        assert_eq!(arc.view_count(), 1);
        let exported = Err(SharedVecError::Exported { views: 1 });
        assert_eq!(v.try_truncate(0), exported, "{name}");
        assert_eq!(v.try_clear(), exported, "{name}");
        assert_eq!(v.try_reserve(0), exported, "{name}");
        assert_eq!(v.try_resize(0, 1), exported, "{name}");
        assert_eq!(v.try_shrink_to_fit(), exported, "{name}");
        assert_eq!(v.try_extend_from_slice(&[]), exported, "{name}");
        assert_eq!(arc.try_push(1), exported, "{name}");
        assert_eq!(
            v.try_view_mut().unwrap_err(),
            SharedVecError::Exported { views: 1 }
        );
        // Copied and serialised while viewed: allowed, nothing allocated.
        let c = v.try_clone().unwrap();
        assert_empty_without_block(&c, align);
        let c2 = v.try_clone_with_alignment(1 << 20).unwrap();
        assert_empty_without_block(&c2, 1 << 20);
        #[cfg(feature = "serde")]
        {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!(r#"{{"alignment":{align},"data":[]}}"#));
            let back: SharedMklVec<u32> = serde_json::from_str(&json).unwrap();
            assert_empty_without_block(&back, align);
            let json = serde_json::to_string(&*arc).unwrap();
            let back: SharedMklVec<u32> = serde_json::from_str(&json).unwrap();
            assert_empty_without_block(&back, align);
        }
        assert_eq!(v.view_count(), 1, "{name}: copies gave their views back");
        drop((a, owned));
        assert_eq!(Arc::strong_count(&arc), 1);

        // Resized through no-op sizes: still no block, pointer unmoved.
        v.try_truncate(5).unwrap();
        v.try_clear().unwrap();
        v.try_reserve(0).unwrap();
        v.try_reserve_exact(0).unwrap();
        v.try_resize(0, 9).unwrap();
        v.try_shrink_to_fit().unwrap();
        v.try_extend_from_slice(&[]).unwrap();
        assert_empty_without_block(&v, align);
        {
            let mut m = v.try_view_mut().unwrap();
            assert!(m.is_empty());
            m.fill(7); // writes nothing
        }
        assert_eq!(
            manager::stats().mkl_held(),
            before.mkl_held(),
            "{name}: a no-op resize allocated"
        );

        // Grown from nothing (the first block: an allocation, not a
        // realloc), then back to nothing.
        v.try_push(42).unwrap();
        assert_eq!(contents(&v), [42]);
        assert!(v.capacity() >= 1);
        assert_eq!(v.as_ptr() as usize % align.max(64), 0);
        assert_eq!(manager::stats().buffers, before.buffers + 1, "{name}");
        v.try_clear().unwrap();
        v.try_shrink_to_fit().unwrap();
        assert_empty_without_block(&v, align);
        v.try_resize(3, 5).unwrap();
        assert_eq!(contents(&v), [5, 5, 5]);
        v.try_resize(0, 5).unwrap();
        v.try_shrink_to_fit().unwrap();
        assert_empty_without_block(&v, align);

        // Through &mut as well.
        let mut w = v;
        assert_eq!(w.as_slice(), &[] as &[u32]);
        assert!(w.as_mut_slice().is_empty());
        w.truncate(0);
        w.shrink_to_fit();
        w.reserve(0);
        assert_empty_without_block(&w, align);
        drop((w, c, c2, arc));
        assert_eq!(
            manager::stats().mkl_held(),
            before.mkl_held(),
            "{name}: blocks left behind"
        );
    }

    // Zero-sized elements never have a block, whatever their length.
    let z = SharedMklVec::<()>::from_slice(&[]);
    assert_eq!((z.len(), z.capacity()), (0, usize::MAX));
    assert!(z.view().unwrap().is_empty());
    assert_eq!(z.try_clone().unwrap().len(), 0);
    #[cfg(feature = "serde")]
    {
        let json = serde_json::to_string(&z).unwrap();
        let back: SharedMklVec<()> = serde_json::from_str(&json).unwrap();
        assert_eq!((back.len(), back.alignment()), (0, 64));
    }
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

// ---------------------------------------------------------------- panics

/// Runs `hold` on a spawned thread, which then waits for the main thread's
/// checks (`during`) and panics; returns once it has unwound.
fn panic_while_holding(hold: impl FnOnce(&Barrier) + Send, during: impl FnOnce()) {
    let barrier = Barrier::new(2);
    thread::scope(|s| {
        let h = s.spawn(|| hold(&barrier));
        barrier.wait(); // the thread holds its guard
        during();
        barrier.wait(); // ...and now panics with it
        let err = h.join().expect_err("the holder must panic");
        assert_eq!(err.downcast_ref::<&str>(), Some(&"holder dies"));
    });
}

#[test]
fn views_held_across_a_panic_in_another_thread_are_released() {
    let _g = serial();
    let before = manager::stats();
    let v = Arc::new(SharedMklVec::from_slice(&[1u32, 2, 3]));
    // The main thread holds a view of its own throughout the first part:
    // the dying thread's count must go, and only its count.
    let mine = v.view().unwrap();

    // 1. A thread holding a borrowed view panics.
    panic_while_holding(
        |b| {
            let a = v.view().unwrap();
            b.wait();
            b.wait();
            assert_eq!(&*a, &[1, 2, 3]);
            panic!("holder dies");
        },
        || {
            assert_eq!(v.view_count(), 2);
            assert_eq!(v.try_push(4), Err(SharedVecError::Exported { views: 2 }));
        },
    );
    assert_eq!(
        v.view_count(),
        1,
        "the dead thread's view was not given back"
    );

    // 2. A thread holding an owned view (ArcView) panics: both the count
    //    and the Arc it held are given back.
    panic_while_holding(
        |b| {
            let owned = SharedMklVec::view_arc(&v).unwrap();
            b.wait();
            b.wait();
            assert_eq!(owned.len(), 3);
            panic!("holder dies");
        },
        || {
            assert_eq!(v.view_count(), 2);
            assert_eq!(Arc::strong_count(&v), 2);
        },
    );
    assert_eq!(v.view_count(), 1);
    assert_eq!(Arc::strong_count(&v), 1);
    drop(mine);
    assert_eq!(v.view_count(), 0);
    v.try_push(4).unwrap();

    // 3. A thread holding the mutable view panics halfway through writing:
    //    the claim is released; what it wrote stays (no poisoning).
    panic_while_holding(
        |b| {
            let mut m = v.try_view_mut().unwrap();
            m[0] = 10;
            b.wait();
            b.wait();
            m[1] = 20;
            panic!("holder dies");
        },
        || {
            assert_eq!(v.view().unwrap_err(), SharedVecError::Busy);
            assert_eq!(v.try_view_mut().unwrap_err(), SharedVecError::Busy);
            assert_eq!(v.try_push(5), Err(SharedVecError::Busy));
            assert_eq!(v.try_clone().unwrap_err(), SharedVecError::Busy);
            assert_eq!(v.view_count(), 0);
        },
    );
    assert!(format!("{v:?}").contains("exclusive: false"), "{v:?}");
    assert_eq!(contents(&v), [10, 20, 3, 4]);

    // 4. A thread panics in the middle of an operation on a view: the
    //    element's Debug panics while the View is being formatted.
    #[derive(Clone, Copy)]
    struct Bomb(u8);
    impl std::fmt::Debug for Bomb {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            if self.0 == 2 {
                panic!("holder dies");
            }
            write!(f, "{}", self.0)
        }
    }
    let bombs = SharedMklVec::from_slice(&[Bomb(1), Bomb(2), Bomb(3)]);
    let r = thread::scope(|s| s.spawn(|| format!("{:?}", bombs.view().unwrap())).join());
    assert!(r.is_err());
    assert_eq!(bombs.view_count(), 0);
    bombs.try_push(Bomb(4)).unwrap();
    assert_eq!(bombs.len(), 4);

    // Afterwards everything works: views, resizes, a mutable view.
    v.try_resize(1000, 7).unwrap();
    v.try_shrink_to_fit().unwrap();
    v.try_view_mut().unwrap()[999] = 8;
    assert_eq!(&contents(&v)[..5], &[10, 20, 3, 4, 7]);
    assert_eq!(contents(&v)[999], 8);
    drop((v, bombs));
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

/// A panic in the middle of serialisation (the element's `Serialize`
/// panics while `SharedMklVec::serialize` holds its view).
#[cfg(feature = "serde")]
#[test]
fn a_panic_mid_serialisation_releases_the_view() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    #[derive(Clone, Copy)]
    struct Bomb(u8);
    impl serde::Serialize for Bomb {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            if self.0 == 2 {
                panic!("holder dies");
            }
            s.serialize_u8(self.0)
        }
    }
    let _g = serial();
    let v = SharedMklVec::from_slice(&[Bomb(1), Bomb(2), Bomb(3)]);
    let other = v.view().unwrap();
    let r = thread::scope(|s| s.spawn(|| serde_json::to_string(&v)).join());
    let err = r.expect_err("serialisation must panic");
    assert_eq!(err.downcast_ref::<&str>(), Some(&"holder dies"));
    assert_eq!(
        v.view_count(),
        1,
        "only the panicking serialiser's view goes"
    );
    drop(other);
    assert_eq!(v.view_count(), 0);
    v.try_push(Bomb(4)).unwrap();
    // In this thread too, under catch_unwind.
    let r = catch_unwind(AssertUnwindSafe(|| serde_json::to_string(&v)));
    assert!(r.is_err());
    assert_eq!(v.view_count(), 0);
    v.try_truncate(1).unwrap();
    assert_eq!(
        serde_json::to_string(&v).unwrap(),
        r#"{"alignment":64,"data":[1]}"#
    );
}

// ---------------------------------------------------------------- serde: alignment first

/// An element whose deserialisation panics: proof that no element was read.
#[cfg(feature = "serde")]
#[derive(Clone, Copy, Debug)]
struct Tripwire;

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Tripwire {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        panic!("an element was read although the alignment was bad");
    }
}

/// Issue 11, item 6: a bad alignment is rejected as soon as it is read,
/// before any element is read and before anything is allocated for the data.
#[cfg(feature = "serde")]
#[test]
fn serde_rejects_a_bad_alignment_before_reading_the_data() {
    let _g = serial();
    let before = manager::stats();
    for (doc, align) in [
        (r#"{"alignment":96,"data":[1,2,3]}"#, 96usize),
        (r#"{"alignment":2147483648,"data":[1]}"#, 1 << 31),
        (r#"[96,[1,2,3]]"#, 96),
        (r#"{"alignment":0,"data":[]}"#, 0),
    ] {
        let err = serde_json::from_str::<SharedMklVec<Tripwire>>(doc).unwrap_err();
        assert!(
            err.to_string().contains(&format!("alignment {align} ")),
            "{doc}: {err}"
        );
    }
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "nothing allocated, nothing leaked"
    );
}

/// The elements go straight into the MKL block: while the last element is
/// being read, MKL already holds the block with all the earlier ones (with
/// a temporary `Vec` it would hold nothing yet).
#[cfg(feature = "serde")]
#[test]
fn serde_reads_the_elements_straight_into_the_mkl_block() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static BLOCKS: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);
    #[derive(Clone, Copy)]
    struct Probe(u32);
    impl<'de> serde::Deserialize<'de> for Probe {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let now = manager::stats();
            BLOCKS.store(now.buffers, Relaxed);
            BYTES.store(now.bytes, Relaxed);
            u32::deserialize(d).map(Probe)
        }
    }
    let _g = serial();
    // Under Miri fewer elements: each is parsed and counted interpreted.
    let n: u32 = if cfg!(miri) { 300 } else { 10_000 };
    let doc = format!(
        r#"{{"alignment":4096,"data":[{}]}}"#,
        (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
    );
    let before = manager::stats();
    let v: SharedMklVec<Probe> = serde_json::from_str(&doc).unwrap();
    assert_eq!(
        BLOCKS.load(Relaxed),
        before.buffers + 1,
        "one MKL block while reading"
    );
    assert!(
        BYTES.load(Relaxed) >= before.bytes + u64::from(n - 1) * 4,
        "the first {} elements already in MKL memory while the last is read",
        n - 1
    );
    assert_eq!(v.alignment(), 4096);
    assert_eq!(v.as_ptr() as usize % 4096, 0);
    assert!(
        v.view()
            .unwrap()
            .iter()
            .enumerate()
            .all(|(i, p)| p.0 == i as u32)
    );
    drop(v);
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

/// `data` before `alignment` (a hand-written document) is still read: the
/// alignment is then checked when it arrives, and the data moved to it.
#[cfg(feature = "serde")]
#[test]
fn serde_accepts_data_before_alignment_and_checks_it_late() {
    let _g = serial();
    let before = manager::stats();
    let v: SharedMklVec<u16> =
        serde_json::from_str(r#"{"data":[1,2,3],"alignment":1024}"#).unwrap();
    assert_eq!((v.alignment(), v.as_ptr() as usize % 1024), (1024, 0));
    assert_eq!(contents(&v), [1, 2, 3]);
    let small: SharedMklVec<u16> = serde_json::from_str(r#"{"data":[4],"alignment":8}"#).unwrap();
    assert_eq!((small.alignment(), contents(&small)), (8, vec![4]));
    let err =
        serde_json::from_str::<SharedMklVec<u16>>(r#"{"data":[1,2],"alignment":96}"#).unwrap_err();
    assert!(err.to_string().contains("alignment 96 "), "{err}");
    drop((v, small));
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "the early block was freed"
    );
}

/// A format's length hint reserves at most 1 MiB ahead: a sequence that
/// claims 2^40 elements but holds three gets a small block, not a failed
/// (or enormous) allocation.
#[cfg(feature = "serde")]
#[test]
fn serde_caps_the_reservation_from_a_length_hint() {
    use serde::de::value::{Error, SeqAccessDeserializer};
    use serde::de::{DeserializeSeed, IntoDeserializer, SeqAccess};

    /// Claims 2^40 elements, yields `left` of them.
    struct Liar(u8);
    impl<'de> SeqAccess<'de> for Liar {
        type Error = Error;
        fn next_element_seed<S: DeserializeSeed<'de>>(
            &mut self,
            seed: S,
        ) -> Result<Option<S::Value>, Error> {
            if self.0 == 0 {
                return Ok(None);
            }
            self.0 -= 1;
            seed.deserialize(self.0.into_deserializer()).map(Some)
        }
        fn size_hint(&self) -> Option<usize> {
            Some(1 << 40)
        }
    }
    /// `[alignment, data]` with the lying data sequence.
    struct Outer(u8);
    impl<'de> SeqAccess<'de> for Outer {
        type Error = Error;
        fn next_element_seed<S: DeserializeSeed<'de>>(
            &mut self,
            seed: S,
        ) -> Result<Option<S::Value>, Error> {
            self.0 += 1;
            match self.0 {
                1 => seed.deserialize(64usize.into_deserializer()).map(Some),
                2 => seed
                    .deserialize(SeqAccessDeserializer::new(Liar(3)))
                    .map(Some),
                _ => Ok(None),
            }
        }
    }
    let _g = serial();
    let before = manager::stats();
    let v: SharedMklVec<u8> =
        serde::Deserialize::deserialize(SeqAccessDeserializer::new(Outer(0))).unwrap();
    assert_eq!(contents(&v), [2, 1, 0]);
    assert_eq!(v.capacity(), 1 << 20, "reserved 1 MiB ahead, no more");
    drop(v);
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

// ---------------------------------------------------------------- alignment 2^30 / 2^31

/// 128 bytes aligned to 128, so the element's own alignment is above MKL's 64.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(128))]
struct Wide(u64);

#[test]
fn alignment_2_pow_30_is_accepted_and_kept() {
    let _g = serial();
    let before = manager::stats();
    assert_eq!(MAX_ALIGN, 1 << 30);
    let align = MAX_ALIGN;

    // Empty: valid, no block, the dangling pointer itself is 2^30-aligned.
    let e = SharedMklVec::<u8>::with_alignment(0, align).unwrap();
    assert_empty_without_block(&e, align);

    let v = match SharedMklVec::<u64>::with_alignment(4, align) {
        Ok(v) => v,
        Err(SharedVecError::AllocFailed { bytes, align: a }) => {
            // Valid, but MKL found no such block (its reserve is ~1 GiB of
            // address space): the one acceptable refusal.
            assert_eq!((bytes, a), (32, align));
            eprintln!("note: MKL could not provide a 2^30-aligned block here");
            return;
        }
        Err(e) => panic!("alignment 2^30 refused: {e}"),
    };
    assert_eq!(v.alignment(), align);
    assert_eq!(v.as_ptr() as usize % align, 0);
    v.try_extend_from_slice(&[1, 2, 3, 4]).unwrap();
    // Grown past its block (MKL_realloc moves it) and shrunk: still 2^30.
    v.try_reserve(10_000).unwrap();
    assert_eq!(
        v.as_ptr() as usize % align,
        0,
        "realloc lost the 2^30 alignment"
    );
    v.try_shrink_to_fit().unwrap();
    assert_eq!(
        v.as_ptr() as usize % align,
        0,
        "shrink lost the 2^30 alignment"
    );
    assert_eq!(contents(&v), [1, 2, 3, 4]);
    // Copies at 2^30, both ways.
    let c = v.try_clone().unwrap();
    assert_eq!((c.alignment(), c.as_ptr() as usize % align), (align, 0));
    assert_ne!(c.as_ptr(), v.as_ptr());
    let small = SharedMklVec::from_slice(&[9u64]);
    let c2 = small.try_clone_with_alignment(align).unwrap();
    assert_eq!((c2.alignment(), c2.as_ptr() as usize % align), (align, 0));
    assert_eq!(contents(&c2), [9]);
    // An element type aligned to 128 asking for 2^30: the larger wins.
    let w = SharedMklVec::from_slice_with_alignment(&[Wide(5)], align).unwrap();
    assert_eq!(w.as_ptr() as usize % align, 0);
    assert_eq!(contents(&w), [Wide(5)]);
    #[cfg(feature = "bytemuck")]
    {
        let z = SharedMklVec::<u32>::zeroed_with_alignment(16, align).unwrap();
        assert_eq!(z.as_ptr() as usize % align, 0);
        assert_eq!(contents(&z), [0; 16]);
    }
    #[cfg(feature = "serde")]
    {
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(json, r#"{"alignment":1073741824,"data":[1,2,3,4]}"#);
        let back: SharedMklVec<u64> = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (back.alignment(), back.as_ptr() as usize % align),
            (align, 0)
        );
        assert_eq!(contents(&back), [1, 2, 3, 4]);
    }
    drop((v, c, c2, w, e, small));
    assert_eq!(
        manager::stats().mkl_held(),
        before.mkl_held(),
        "a 2^30-aligned block leaked"
    );
}

#[test]
fn alignment_2_pow_31_is_refused_with_nothing_allocated() {
    let _g = serial();
    let before = manager::stats();
    let src = SharedMklVec::from_slice(&[1u64, 2, 3]);
    let src_before = snapshot(&src);
    let stats_with_src = manager::stats();
    for align in [1usize << 31, 1 << 32, 1 << 63, (1 << 30) + (1 << 29)] {
        let want = SharedVecError::InvalidAlignment(align);
        for cap in [0, 1, 1000] {
            assert_eq!(
                SharedMklVec::<u64>::with_alignment(cap, align).unwrap_err(),
                want
            );
            assert_eq!(
                SharedMklVec::<Wide>::with_alignment(cap, align).unwrap_err(),
                want
            );
        }
        assert_eq!(
            SharedMklVec::from_slice_with_alignment(&[1u8], align).unwrap_err(),
            want
        );
        assert_eq!(
            SharedMklVec::<u8>::from_slice_with_alignment(&[], align).unwrap_err(),
            want
        );
        assert_eq!(src.try_clone_with_alignment(align).unwrap_err(), want);
        // Alignment is checked before the state: refused so even while
        // another thread would have made the copy Busy.
        {
            let _m = src.try_view_mut().unwrap();
            assert_eq!(src.try_clone_with_alignment(align).unwrap_err(), want);
        }
        #[cfg(feature = "bytemuck")]
        assert_eq!(
            SharedMklVec::<u32>::zeroed_with_alignment(4, align).unwrap_err(),
            want
        );
        #[cfg(feature = "serde")]
        {
            let json = format!(r#"{{"alignment":{align},"data":[1,2]}}"#);
            let err = serde_json::from_str::<SharedMklVec<u8>>(&json).unwrap_err();
            assert!(err.to_string().contains(&align.to_string()), "{err}");
        }
        assert_eq!(
            manager::stats(),
            stats_with_src,
            "a refused alignment allocated"
        );
    }
    assert_eq!(snapshot(&src), src_before);
    assert_eq!(src.view_count(), 0);
    drop(src);
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}

// ---------------------------------------------------------------- more than the machine has

/// RAM + swap in bytes, from /proc/meminfo (None elsewhere).
fn machine_bytes() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<usize> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) * 1024)
}

/// Byte counts no allocation can get here: twice RAM + swap (refused by
/// Linux's default heuristic overcommit; skipped when the kernel is told to
/// promise anything, `vm.overcommit_memory = 1`), and 2^58 (more than any
/// 47- or 57-bit address space).
fn impossible_sizes() -> Vec<usize> {
    let mut sizes = vec![1usize << 58];
    let always =
        std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "1");
    if let (Some(m), false) = (machine_bytes(), always) {
        sizes.insert(0, 2 * m);
    }
    sizes
}

#[test]
fn reserving_more_than_the_machine_has_fails_and_changes_nothing() {
    let _g = serial();
    let before = manager::stats();
    for bytes in impossible_sizes() {
        let huge = bytes / 8; // u64 elements

        // A vector with a block, at the default and at a large alignment.
        for align in [64, 1 << 12] {
            let v = SharedMklVec::<u64>::with_alignment(100, align).unwrap();
            v.try_extend_from_slice(&(0..100).collect::<Vec<_>>())
                .unwrap();
            let snap = snapshot(&v);
            let stats = manager::stats();
            let fail = |b| Err(SharedVecError::AllocFailed { bytes: b, align });
            assert_eq!(
                v.try_reserve(huge),
                fail((100 + huge) * 8),
                "reserve {bytes}"
            );
            assert_eq!(v.try_reserve_exact(huge), fail((100 + huge) * 8));
            assert_eq!(v.try_resize(huge, 1), fail(huge * 8));
            assert_eq!(snapshot(&v), snap, "a failed reserve changed the vector");
            assert_eq!(
                manager::stats(),
                stats,
                "a failed reserve changed MKL's holdings"
            );
            assert_eq!(v.view_count(), 0, "the claim was not given back");
            assert!(format!("{v:?}").contains("exclusive: false"));
            // The state is checked before the allocation: with a view alive
            // the answer is Exported, not AllocFailed.
            {
                let _a = v.view().unwrap();
                assert_eq!(
                    v.try_reserve(huge),
                    Err(SharedVecError::Exported { views: 1 })
                );
            }
            // Still fully usable.
            v.try_push(100).unwrap();
            v.try_reserve(1000).unwrap();
            assert_eq!(contents(&v), (0..=100).collect::<Vec<_>>());
            assert_eq!(v.as_ptr() as usize % align, 0);
        }

        // An empty vector (its first block would be an allocation, not a
        // realloc): stays empty, pointer still dangling.
        let e = SharedMklVec::<u64>::new();
        assert_eq!(
            e.try_reserve(huge),
            Err(SharedVecError::AllocFailed {
                bytes: huge * 8,
                align: 64
            })
        );
        assert_empty_without_block(&e, 64);
        e.try_push(1).unwrap();

        // Exactly that much, from no block at all.
        assert_eq!(
            SharedMklVec::<u64>::with_capacity(0).try_reserve_exact(huge),
            Err(SharedVecError::AllocFailed {
                bytes: huge * 8,
                align: 64
            })
        );
    }
    assert_eq!(manager::stats().mkl_held(), before.mkl_held());
}
