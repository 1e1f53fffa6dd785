//! [`SharedVecError`]: every way a `SharedMklVec` operation can be refused.

use core::fmt;

use crate::MAX_ALIGN;

/// Why a [`SharedMklVec`](super::SharedMklVec) operation was refused.
///
/// Every refusal is immediate (nothing blocks) and changes nothing: the
/// buffer's pointer, length, capacity and contents are exactly as before.
///
/// ```
/// use mkl_alloc::{SharedMklVec, SharedVecError};
///
/// let v = SharedMklVec::from_slice(&[1u32, 2, 3]);
/// let view = v.view().unwrap();
/// let err = v.try_push(4).unwrap_err();
/// assert_eq!(err, SharedVecError::Exported { views: 1 });
/// assert_eq!(
///     err.to_string(),
///     "cannot resize the buffer while 1 view(s) of it are alive"
/// );
/// drop(view);
/// v.try_push(4).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SharedVecError {
    /// A resize or mutable view was refused because this many shared views
    /// of the buffer are alive (a resize would free the memory they read).
    Exported {
        /// Live views when the claim was refused.
        views: usize,
    },
    /// The buffer is held exclusively (a resize in progress on another
    /// thread, or a live mutable view), so it can be neither viewed nor
    /// resized right now.
    Busy,
    /// A view was refused because the buffer already has the most live
    /// views the state word can count.
    TooManyViews {
        /// The limit.
        max: usize,
    },
    /// The alignment asked for is not a power of two, or exceeds
    /// [`MAX_ALIGN`] (2^30), the largest MKL can express.
    InvalidAlignment(usize),
    /// The length or capacity asked for, in bytes, exceeds `isize::MAX`
    /// (or, for zero-sized elements, the element count exceeds `usize::MAX`).
    CapacityOverflow,
    /// MKL could not provide a block of this many bytes at this alignment.
    AllocFailed {
        /// Bytes asked of MKL.
        bytes: usize,
        /// Alignment asked of MKL.
        align: usize,
    },
}

impl fmt::Display for SharedVecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Exported { views } => write!(
                f,
                "cannot resize the buffer while {views} view(s) of it are alive"
            ),
            Self::Busy => f.write_str(
                "the buffer is held exclusively (a resize or a mutable view is in progress)",
            ),
            Self::TooManyViews { max } => {
                write!(f, "the buffer already has the maximum of {max} live views")
            }
            Self::InvalidAlignment(align) if !align.is_power_of_two() => {
                write!(f, "alignment {align} is not a power of two")
            }
            Self::InvalidAlignment(align) => write!(
                f,
                "alignment {align} exceeds the largest MKL can honour, {MAX_ALIGN} (2^30)"
            ),
            Self::CapacityOverflow => {
                f.write_str("capacity overflow: the requested size exceeds isize::MAX bytes")
            }
            Self::AllocFailed { bytes, align } => write!(
                f,
                "MKL could not allocate {bytes} bytes aligned to {align}; the buffer is unchanged"
            ),
        }
    }
}

impl std::error::Error for SharedVecError {}
