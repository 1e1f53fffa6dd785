//! `serde` support: a `SharedMklVec<T>` is the struct
//! `{ "alignment": usize, "data": [T] }`, so a round trip restores the
//! length, the contents and the alignment (the element type is the one the
//! caller deserialises into).
//!
//! The alignment is serialised *before* the data, so that deserialisation
//! can check it as soon as it is read: an alignment that is not a power of
//! two, or above 2^30, is rejected before a single element is read and
//! before anything is allocated for the data. A valid alignment sizes an
//! MKL block at once, and the elements are read straight into it (reserved
//! from the format's length hint, at most 1 MiB ahead, then grown like a
//! `Vec`): no temporary `Vec`, no second copy of the data in memory.
//!
//! Field order on input: both orders are accepted, in maps (self-describing
//! formats such as JSON, where a hand-written document may put `data` first)
//! and — by position — in sequences (alignment first, as always written).
//! A map with `data` first cannot be checked early: its elements are read
//! into an MKL block aligned to 64, and when the alignment follows it is
//! checked (a bad one is rejected then, and the block freed) and the data
//! moved to a block of that alignment if it needs a different one.

use core::fmt;
use core::marker::PhantomData;
use core::mem::size_of;
use core::ptr::NonNull;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Error as _, Serialize, SerializeSeq, SerializeStruct, Serializer};

use super::{MIN_ALIGN, SharedMklVec, check_alignment};

const FIELDS: &[&str] = &["alignment", "data"];

/// The most bytes reserved ahead from a format's length hint (serde's own
/// "cautious" bound): a hostile hint cannot make us allocate more than this
/// before elements actually arrive.
const MAX_PREALLOC_BYTES: usize = 1 << 20;

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<T: Copy + Serialize> Serialize for SharedMklVec<T> {
    /// Serialises under a view, so a concurrent resize is refused meanwhile;
    /// fails (with the [`SharedVecError`](super::SharedVecError) message) if
    /// the buffer is held exclusively. The alignment is written first. The
    /// elements are read one by one through the raw pointer, never as a
    /// `&[T]`, since an [`Export`](super::Export) may be writing them (see
    /// its docs).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let view = self.view().map_err(S::Error::custom)?;
        let mut state = serializer.serialize_struct("SharedMklVec", 2)?;
        state.serialize_field("alignment", &self.alignment())?;
        state.serialize_field(
            "data",
            &RawElements {
                ptr: view.ptr,
                len: view.len,
            },
        )?;
        state.end()
    }
}

/// The elements of a view, serialised as a sequence read through the raw
/// pointer. Only built while that view is alive.
struct RawElements<T> {
    ptr: NonNull<T>,
    len: usize,
}

impl<T: Copy + Serialize> Serialize for RawElements<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len))?;
        for i in 0..self.len {
            // SAFETY: the enclosing view keeps `ptr` live with `len`
            // initialised, aligned elements; `read` copies one out without
            // forming a reference to the block.
            let item = unsafe { self.ptr.as_ptr().add(i).read() };
            seq.serialize_element(&item)?;
        }
        seq.end()
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de, T: Copy + Deserialize<'de>> Deserialize<'de> for SharedMklVec<T> {
    /// Rebuilds the buffer at its recorded alignment; an alignment MKL cannot
    /// honour, or a failed allocation, is a deserialisation error. The
    /// alignment is checked as soon as it is read, before the data.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("SharedMklVec", FIELDS, SharedMklVecVisitor(PhantomData))
    }
}

/// Reads an alignment and checks it at once.
fn checked_alignment<E: de::Error>(alignment: usize) -> Result<usize, E> {
    check_alignment(alignment).map_err(E::custom)?;
    Ok(alignment)
}

struct SharedMklVecVisitor<T>(PhantomData<fn() -> T>);

impl<'de, T: Copy + Deserialize<'de>> Visitor<'de> for SharedMklVecVisitor<T> {
    type Value = SharedMklVec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a SharedMklVec: { alignment, data }")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let alignment = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let alignment = checked_alignment(alignment)?;
        seq.next_element_seed(Data::<T>::new(alignment))?
            .ok_or_else(|| de::Error::invalid_length(1, &self))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut alignment: Option<usize> = None;
        let mut data: Option<SharedMklVec<T>> = None;
        while let Some(key) = map.next_key::<Field>()? {
            match key {
                Field::Alignment if alignment.is_some() => {
                    return Err(de::Error::duplicate_field("alignment"));
                }
                Field::Alignment => alignment = Some(checked_alignment(map.next_value()?)?),
                Field::Data if data.is_some() => return Err(de::Error::duplicate_field("data")),
                // The alignment came first (as written): straight into its
                // block. Otherwise into a default one, re-aligned below.
                Field::Data => {
                    data =
                        Some(map.next_value_seed(Data::<T>::new(alignment.unwrap_or(MIN_ALIGN)))?)
                }
            }
        }
        let alignment = alignment.ok_or_else(|| de::Error::missing_field("alignment"))?;
        let data = data.ok_or_else(|| de::Error::missing_field("data"))?;
        if data.alignment() == alignment {
            Ok(data)
        } else {
            // Only for `data` before `alignment`: one copy to the alignment
            // asked for (a fresh block; the default one is freed).
            data.try_clone_with_alignment(alignment)
                .map_err(de::Error::custom)
        }
    }
}

/// The `data` field: a sequence of `T` read straight into a fresh
/// `SharedMklVec` aligned to `align` (already checked).
struct Data<T> {
    align: usize,
    _elements: PhantomData<fn() -> T>,
}

impl<T> Data<T> {
    fn new(align: usize) -> Self {
        Self {
            align,
            _elements: PhantomData,
        }
    }
}

impl<'de, T: Copy + Deserialize<'de>> DeserializeSeed<'de> for Data<T> {
    type Value = SharedMklVec<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, T: Copy + Deserialize<'de>> Visitor<'de> for Data<T> {
    type Value = SharedMklVec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence of elements")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let ahead = seq
            .size_hint()
            .unwrap_or(0)
            .min(MAX_PREALLOC_BYTES / size_of::<T>().max(1));
        let mut v = SharedMklVec::with_alignment(ahead, self.align).map_err(de::Error::custom)?;
        while let Some(element) = seq.next_element()? {
            // `&mut v`: no other reference exists, so no protocol is needed.
            v.exclusive_mut(|raw| raw.push(element))
                .map_err(de::Error::custom)?;
        }
        Ok(v)
    }
}

enum Field {
    Alignment,
    Data,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`alignment` or `data`")
            }
            fn visit_str<E: de::Error>(self, value: &str) -> Result<Field, E> {
                match value {
                    "alignment" => Ok(Field::Alignment),
                    "data" => Ok(Field::Data),
                    _ => Err(de::Error::unknown_field(value, FIELDS)),
                }
            }
        }
        deserializer.deserialize_identifier(FieldVisitor)
    }
}
