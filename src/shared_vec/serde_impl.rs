//! `serde` support: a `SharedMklVec<T>` is the struct
//! `{ "alignment": usize, "data": [T] }`, so a round trip restores the
//! length, the contents and the alignment (the element type is the one the
//! caller deserialises into).

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Error as _, Serialize, SerializeSeq, SerializeStruct, Serializer};

use super::SharedMklVec;

const FIELDS: &[&str] = &["alignment", "data"];

impl<T: Copy + Serialize> Serialize for SharedMklVec<T> {
    /// Serialises under a view, so a concurrent resize is refused meanwhile;
    /// fails (with the [`SharedVecError`](super::SharedVecError) message) if
    /// the buffer is held exclusively. The elements are read one by one
    /// through the raw pointer, never as a `&[T]`, since an
    /// [`Export`](super::Export) may be writing them (see its docs).
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

impl<'de, T: Copy + Deserialize<'de>> Deserialize<'de> for SharedMklVec<T> {
    /// Rebuilds the buffer at its recorded alignment; an alignment MKL cannot
    /// honour, or a failed allocation, is a deserialisation error.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("SharedMklVec", FIELDS, SharedMklVecVisitor(PhantomData))
    }
}

struct SharedMklVecVisitor<T>(PhantomData<fn() -> T>);

fn build<T: Copy, E: de::Error>(alignment: usize, data: Vec<T>) -> Result<SharedMklVec<T>, E> {
    SharedMklVec::from_slice_with_alignment(&data, alignment).map_err(E::custom)
}

impl<'de, T: Copy + Deserialize<'de>> Visitor<'de> for SharedMklVecVisitor<T> {
    type Value = SharedMklVec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a SharedMklVec: { alignment, data }")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let alignment = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let data: Vec<T> = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(1, &self))?;
        build(alignment, data)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut alignment = None;
        let mut data: Option<Vec<T>> = None;
        while let Some(key) = map.next_key::<Field>()? {
            match key {
                Field::Alignment if alignment.is_some() => {
                    return Err(de::Error::duplicate_field("alignment"));
                }
                Field::Alignment => alignment = Some(map.next_value()?),
                Field::Data if data.is_some() => return Err(de::Error::duplicate_field("data")),
                Field::Data => data = Some(map.next_value()?),
            }
        }
        let alignment = alignment.ok_or_else(|| de::Error::missing_field("alignment"))?;
        let data = data.ok_or_else(|| de::Error::missing_field("data"))?;
        build(alignment, data)
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
