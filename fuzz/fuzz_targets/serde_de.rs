//! Deserialises `SharedMklVec`s of several element types from arbitrary
//! JSON: anything may be refused, nothing may crash, leak or come back
//! wrong. What is accepted must hold a valid alignment, be aligned to it,
//! and survive a serialise/deserialise round trip unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mkl_alloc::SharedMklVec;
use serde::Serialize;
use serde::de::DeserializeOwned;

fn check<T>(input: &[u8])
where
    T: Copy + PartialEq + core::fmt::Debug + Serialize + DeserializeOwned,
{
    let Ok(mut v) = serde_json::from_slice::<SharedMklVec<T>>(input) else {
        return;
    };
    let align = v.alignment();
    assert!(
        align.is_power_of_two() && align <= mkl_alloc::MAX_ALIGN,
        "alignment {align}"
    );
    assert!(v.capacity() >= v.len());
    if v.capacity() > 0 {
        assert_eq!(
            v.as_ptr() as usize % align,
            0,
            "block not aligned to {align}"
        );
    }
    let text = serde_json::to_string(&v).expect("an accepted vector serialises");
    let mut back: SharedMklVec<T> = serde_json::from_str(&text).expect("and deserialises back");
    assert_eq!(back.alignment(), align);
    assert_eq!(back.as_slice(), v.as_slice());
}

fuzz_target!(|input: &[u8]| {
    // The first byte picks the element type, the rest is the document.
    let Some((&kind, doc)) = input.split_first() else {
        return;
    };
    match kind % 4 {
        0 => check::<u8>(doc),
        1 => check::<i32>(doc),
        2 => check::<u64>(doc),
        _ => check::<(u16, bool)>(doc),
    }
});
