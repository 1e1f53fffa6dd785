//! **Modes.** The environment variable `MKL_ALLOC_MIRI_MODE`, read once (with
//! libc's `getenv`, which does not allocate: the emulation may be serving a
//! `#[global_allocator]`), chooses how blocks are placed and resized, so that
//! Miri also walks the crate's branches that the default never takes. Miri
//! passes it to the program only with `-Zmiri-env-forward=MKL_ALLOC_MIRI_MODE`
//! (scripts/miri.sh does). Any other value aborts.
//!
//! | `MKL_ALLOC_MIRI_MODE` | `MKL_malloc` / `MKL_calloc` | `MKL_realloc` |
//! |---|---|---|
//! | unset, empty, `default` | exact blocks | always moves |
//! | `in-place` | `size` bytes handed out, with room behind them (below) | in place whenever the room allows: every shrink, and growth up to the room; else moves |
//! | `exact-align` | exact blocks at an address that is a multiple of the alignment and *not* of twice it | always moves, to an address aligned exactly to the block's alignment |
//! | `misaligned-realloc` | as `exact-align` | always moves, to an address aligned exactly to 64 whatever the block's alignment |
//!
//! For large blocks the memory `i_malloc` returns places them, in every
//! mode (in a chunk, up to 1 MiB, that is exactly the alignment, never
//! twice it). Their resizes: in the default mode and `exact-align`, every
//! `MKL_realloc` is an `i_realloc` (the strict case: the hooks' shrinks
//! run too, which MKL itself, keeping a shrunk block whole, never asks
//! for); in `in-place`, MKL's measured rule: a shrink, or a growth within
//! what MKL asked `i_malloc` for, stays without a call, anything else is
//! an `i_realloc`; in `misaligned-realloc`, an `i_realloc` after which a
//! block aligned above 64 is moved, within its memory, to the first address
//! aligned to exactly 64.
//!
//! `in-place` follows MKL (which keeps a shrunk block whole and grows it in
//! place while the new size fits what it holds), so that the crate's
//! "resized in place" branches run (`RawBuf`'s growth keeping its pointer
//! and its count). Growth in place needs room the caller may not touch, and
//! Miri bounds accesses by allocations, not by what the emulation said: a
//! fresh block is allocated with room for its size again (at most
//! [`MAX_SLACK`](super::placement::MAX_SLACK)) behind it. What keeps overruns visible anyway:
//! - the caller never gets the allocation's own pointer, but one made from a
//!   reference to the block's current `size` bytes (fresh at every resize).
//!   Under Stacked Borrows its provenance covers those bytes only, so an
//!   access past the block's size (into the room, or into the part a shrink
//!   gave up) is reported as a tag missing from the borrow stack, and a
//!   pointer kept from before the resize is invalid. Tree Borrows bounds a
//!   pointer by its allocation only: there an overrun into the room goes
//!   unseen (the default mode, under both models, sees it). So scripts/miri.sh
//!   runs this mode under Stacked Borrows.
//! - the bytes a growth in place adds are made uninitialised again (as C's
//!   `realloc` leaves them), so reading them before writing is reported.
//!
//! `exact-align` takes away accidental extra alignment (`System`, like
//! glibc, often returns addresses aligned to more than asked): a code path
//! that works only because a 64-aligned block happened to be 128-aligned
//! fails here. Blocks stay exact: the emulation allocates at the alignment
//! and retries while the address is also aligned to twice it (about every
//! second address is not).
//!
//! `misaligned-realloc` breaks MKL's contract on purpose: the measured MKL
//! keeps a block's alignment across `MKL_realloc` (see `raw_realloc` in
//! src/allocator.rs), but `MKL_realloc` takes no alignment, and the crate
//! does not rely on it: a block that comes back misaligned is moved into an
//! aligned one (`realign`). Here every block `MKL_realloc` moves comes back
//! at MKL's default alignment only (64, not 128), so that Miri walks that
//! path for every alignment above 64.

use core::ffi::{CStr, c_void};
use core::sync::atomic::{AtomicU8, Ordering};

/// How blocks are placed and resized (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Default,
    InPlace,
    ExactAlign,
    MisalignedRealloc,
}

/// The variable that chooses the [`Mode`].
const MODE_VAR: &CStr = c"MKL_ALLOC_MIRI_MODE";

/// The mode once read: 0 before, else its index in [`Mode::ALL`] plus one.
static MODE: AtomicU8 = AtomicU8::new(0);

impl Mode {
    const ALL: [Mode; 4] = [
        Mode::Default,
        Mode::InPlace,
        Mode::ExactAlign,
        Mode::MisalignedRealloc,
    ];

    /// The mode a value of [`MODE_VAR`] names (`None`: unset); `None` if
    /// it names none.
    pub(super) fn parse(value: Option<&[u8]>) -> Option<Mode> {
        match value {
            None | Some(b"" | b"default") => Some(Mode::Default),
            Some(b"in-place") => Some(Mode::InPlace),
            Some(b"exact-align") => Some(Mode::ExactAlign),
            Some(b"misaligned-realloc") => Some(Mode::MisalignedRealloc),
            Some(_) => None,
        }
    }

    /// Whether blocks are placed at exactly their alignment.
    pub(super) fn exact_align(self) -> bool {
        matches!(self, Mode::ExactAlign | Mode::MisalignedRealloc)
    }
}

/// The mode [`MODE_VAR`] chooses, read at the first call; aborts on a value
/// that names no mode.
pub(super) fn mode() -> Mode {
    if let Some(i) = MODE.load(Ordering::Relaxed).checked_sub(1) {
        return Mode::ALL[usize::from(i)];
    }
    // SAFETY: a NUL-terminated name; getenv returns null or a NUL-terminated
    // string, read at once (the tests under Miri set no variables).
    let value = unsafe {
        let v = libc::getenv(MODE_VAR.as_ptr());
        (!v.is_null()).then(|| CStr::from_ptr(v).to_bytes())
    };
    let Some(m) = Mode::parse(value) else {
        const MSG: &[u8] =
            b"MKL emulation (Miri): MKL_ALLOC_MIRI_MODE is default, in-place, exact-align or misaligned-realloc\n";
        // SAFETY: writes a static buffer to stderr (no allocation: this may
        // be the global allocator).
        unsafe { libc::write(2, MSG.as_ptr().cast::<c_void>(), MSG.len()) };
        std::process::abort();
    };
    let i = Mode::ALL.iter().position(|&x| x == m).expect("one of ALL");
    MODE.store(i as u8 + 1, Ordering::Relaxed);
    m
}
