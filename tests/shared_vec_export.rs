//! `SharedMklVec::export` (owned, counted exports for raw writers) and
//! `try_resize_exact` (one claim, exact capacity).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mkl_alloc::{Export, SharedMklVec, SharedVecError};

fn contents<T: Copy>(v: &SharedMklVec<T>) -> Vec<T> {
    v.view().unwrap().to_vec()
}

#[test]
fn export_counts_in_the_view_word_and_refuses_every_resize() {
    let v = Arc::new(SharedMklVec::from_slice(&[1u8, 2, 3]));
    let a = SharedMklVec::export(&v).unwrap();
    let view = v.view().unwrap();
    let b = SharedMklVec::export(&v).unwrap();
    assert_eq!(v.view_count(), 3);
    let exported = Err(SharedVecError::Exported { views: 3 });
    assert_eq!(v.try_push(4), exported);
    assert_eq!(v.try_resize(10, 0), exported);
    assert_eq!(v.try_resize_exact(10, 0), exported);
    assert_eq!(v.try_shrink_to_fit(), exported);
    assert_eq!(v.try_truncate(0), exported);
    assert!(matches!(
        v.try_view_mut(),
        Err(SharedVecError::Exported { views: 3 })
    ));
    drop((a, view));
    assert_eq!(v.try_push(4), Err(SharedVecError::Exported { views: 1 }));
    drop(b);
    assert_eq!(v.view_count(), 0);
    v.try_push(4).unwrap();
    assert_eq!(contents(&v), [1, 2, 3, 4]);
}

#[test]
fn export_is_refused_while_the_buffer_is_held_exclusively() {
    let v = Arc::new(SharedMklVec::from_slice(&[1u8]));
    let guard = v.try_view_mut().unwrap();
    assert_eq!(SharedMklVec::export(&v).unwrap_err(), SharedVecError::Busy);
    drop(guard);
    assert_eq!(v.view_count(), 0);
    assert!(SharedMklVec::export(&v).is_ok());
}

#[test]
fn export_pointer_and_length_come_from_the_block() {
    let v = Arc::new(SharedMklVec::<u64>::with_alignment(100, 4096).unwrap());
    v.try_resize(37, 5).unwrap();
    let e = SharedMklVec::export(&v).unwrap();
    assert_eq!(e.len(), 37);
    assert!(!e.is_empty());
    assert_eq!(e.as_mut_ptr().cast_const(), v.as_ptr());
    assert_eq!(e.as_ptr(), v.as_ptr());
    assert_eq!(e.as_ptr() as usize % 4096, 0);
    assert!(Arc::ptr_eq(Export::owner(&e), &v));
    let empty = Arc::new(SharedMklVec::<u64>::new());
    let e = SharedMklVec::export(&empty).unwrap();
    assert!(e.is_empty());
    assert_eq!(e.as_ptr() as usize % 64, 0);
}

#[test]
fn export_keeps_the_block_alive_after_the_last_other_owner() {
    let v = Arc::new(SharedMklVec::from_slice(&[9u32; 1000]));
    let e = SharedMklVec::export(&v).unwrap();
    let weak = Arc::downgrade(&v);
    drop(v);
    assert!(weak.upgrade().is_some());
    // SAFETY: 1000 initialised elements kept alive by `e`; no other access.
    let sum: u32 = (0..e.len())
        .map(|i| unsafe { e.as_ptr().add(i).read() })
        .sum();
    assert_eq!(sum, 9000);
    drop(e);
    assert!(weak.upgrade().is_none());
}

#[test]
fn writes_through_an_export_on_another_thread_are_seen_after_it_drops() {
    fn assert_send_static<X: Send + Sync + 'static>(_: &X) {}
    let v = Arc::new(SharedMklVec::from_slice(&[0u8; 4096]));
    let e = SharedMklVec::export(&v).unwrap();
    assert_send_static(&e);
    std::thread::spawn(move || {
        // SAFETY: e.len() bytes, no View of `v` is alive, one writer.
        unsafe { e.as_mut_ptr().write_bytes(0xab, e.len()) };
    })
    .join()
    .unwrap();
    assert_eq!(v.view_count(), 0);
    assert!(contents(&v).iter().all(|&b| b == 0xab));
}

#[test]
fn try_clone_copies_while_an_export_is_alive() {
    let v = Arc::new(SharedMklVec::from_slice_with_alignment(&[1u16, 2, 3], 512).unwrap());
    let e = SharedMklVec::export(&v).unwrap();
    // SAFETY: 3 elements, no View alive, one writer, nothing concurrent.
    unsafe { e.as_mut_ptr().add(1).write(20) };
    let c = v.try_clone().unwrap();
    assert_eq!(contents(&c), [1, 20, 3]);
    assert_eq!(c.alignment(), 512);
    assert_ne!(c.as_ptr(), v.as_ptr());
    assert_eq!(v.view_count(), 1, "the clone's own view was given back");
}

#[test]
fn resize_exact_grows_and_shrinks_to_exact_capacity() {
    let v = SharedMklVec::from_slice_with_alignment(&[1u32, 2, 3], 1024).unwrap();
    v.try_resize_exact(1000, 7).unwrap();
    assert_eq!((v.len(), v.capacity()), (1000, 1000));
    let c = contents(&v);
    assert_eq!(&c[..4], &[1, 2, 3, 7]);
    assert!(c[3..].iter().all(|&x| x == 7));
    assert_eq!(v.as_ptr() as usize % 1024, 0);
    v.try_resize_exact(2, 0).unwrap();
    assert_eq!((v.len(), v.capacity()), (2, 2));
    assert_eq!(contents(&v), [1, 2]);
    assert_eq!(v.as_ptr() as usize % 1024, 0);
    // Same length, larger capacity: only the capacity changes.
    v.try_reserve(100).unwrap();
    assert!(v.capacity() > 2);
    v.try_resize_exact(2, 0).unwrap();
    assert_eq!((v.len(), v.capacity()), (2, 2));
    v.try_resize_exact(0, 0).unwrap();
    assert_eq!((v.len(), v.capacity()), (0, 0));
    v.try_resize_exact(3, 4).unwrap();
    assert_eq!(contents(&v), [4, 4, 4]);
}

#[test]
fn resize_exact_failure_changes_nothing() {
    let v = SharedMklVec::from_slice_with_alignment(&[1u8, 2, 3, 4, 5], 256).unwrap();
    v.try_reserve_exact(20).unwrap();
    let (ptr, len, cap) = (v.as_ptr(), v.len(), v.capacity());
    // Shrinking below the length, then MKL failing: the truncation is undone.
    let huge = isize::MAX as usize / 2;
    assert!(matches!(
        v.try_resize_exact(huge, 0),
        Err(SharedVecError::AllocFailed { .. })
    ));
    assert_eq!((v.as_ptr(), v.len(), v.capacity()), (ptr, len, cap));
    assert_eq!(contents(&v), [1, 2, 3, 4, 5]);
    assert_eq!(
        v.try_resize_exact(usize::MAX, 0),
        Err(SharedVecError::CapacityOverflow)
    );
    // Overflow is reported before the state is looked at.
    let view = v.view().unwrap();
    assert_eq!(
        v.try_resize_exact(usize::MAX, 0),
        Err(SharedVecError::CapacityOverflow)
    );
    assert_eq!(
        v.try_resize_exact(1, 0),
        Err(SharedVecError::Exported { views: 1 })
    );
    drop(view);
    assert_eq!((v.as_ptr(), v.len(), v.capacity()), (ptr, len, cap));
    assert_eq!(contents(&v), [1, 2, 3, 4, 5]);
}

#[test]
fn resize_exact_shrink_keeps_exactly_the_prefix() {
    let v = SharedMklVec::from_slice(&(0u16..100).collect::<Vec<_>>());
    v.try_resize_exact(10, 0).unwrap();
    assert_eq!(contents(&v), (0u16..10).collect::<Vec<_>>());
    assert_eq!(v.capacity(), 10);
}

#[test]
fn resize_exact_of_zero_sized_elements() {
    let v = SharedMklVec::<()>::new();
    v.try_resize_exact(5, ()).unwrap();
    assert_eq!(v.len(), 5);
    assert_eq!(v.capacity(), usize::MAX);
    v.try_resize_exact(1, ()).unwrap();
    assert_eq!(v.len(), 1);
}

#[test]
fn exporters_racing_an_exact_resizer_see_whole_buffers() {
    // Exporters take exports and read through them while one thread resizes
    // exactly between two lengths whose contents differ: every export sees
    // one whole state, and the word ends at 0.
    let v = Arc::new(SharedMklVec::from_slice(&[1u8; 1000]));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (v, stop) = (Arc::clone(&v), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut seen = 0u64;
                // At least one round, however late this thread starts.
                loop {
                    if let Ok(e) = SharedMklVec::export(&v) {
                        let len = e.len();
                        assert!(len == 1000 || len == 3000, "length {len}");
                        // SAFETY: len bytes kept alive by `e`; the only
                        // writer is the resizer, which `e` keeps out.
                        let last = unsafe { e.as_ptr().add(len - 1).read() };
                        assert_eq!(last, if len == 1000 { 1 } else { 2 });
                        seen += 1;
                    }
                    // Leave the resizer windows with no export alive.
                    std::thread::yield_now();
                    if stop.load(Ordering::Relaxed) && seen > 0 {
                        break;
                    }
                }
                seen
            })
        })
        .collect();
    let (mut resized, mut attempts) = (0, 0u64);
    // Under Miri (interpreted) fewer rounds of the same race.
    let rounds = if cfg!(miri) { 10 } else { 200 };
    while resized < rounds && attempts < 100_000_000 {
        attempts += 1;
        let target = if v.len() == 1000 { 3000 } else { 1000 };
        match v.try_resize_exact(target, 2) {
            Ok(()) => {
                assert_eq!(v.capacity(), target);
                resized += 1;
            }
            Err(SharedVecError::Exported { .. }) => {}
            Err(e) => panic!("only exports compete with the resizer: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let seen: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(seen > 0 && resized > 0, "seen {seen}, resized {resized}");
    assert_eq!(v.view_count(), 0);
}
