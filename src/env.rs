//! Size policies read from the environment (`MKL_ALLOC_HUGE_PAGES`,
//! `MKL_ALLOC_BLOCK_CACHE`): unset (the default), `off`, `on` or a byte
//! count (`268435456`, `256M`, `256MiB`), and the switch `MKL_ALLOC_BACKING` (`off` or `on`), read once (`sys::env_var`: libc's `getenv`, or
//! `GetEnvironmentVariableW` on Windows). The readers run inside the global
//! allocator, so nothing here allocates: a byte parser, and one raw write
//! to stderr for the warning.

use core::ffi::CStr;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Parses a policy value: `Ok(None)` for off (`off`, `0`), `Ok(Some(on))`
/// for `on` (any case) and for an empty value, `Ok(Some(n))` for a byte
/// count `n > 0`: decimal digits, optionally followed by a binary unit,
/// `K`, `M`, `G` or `T` (any case, `KiB`, `MiB`, `GiB`, `TiB` too: 2^10,
/// 2^20, 2^30, 2^40 bytes); `Err(())` for anything else (`KB` included,
/// which some read as 1000).
pub(crate) fn parse(v: &[u8], on: usize) -> Result<Option<usize>, ()> {
    if v.is_empty() || v.eq_ignore_ascii_case(b"on") {
        return Ok(Some(on));
    }
    if v.eq_ignore_ascii_case(b"off") {
        return Ok(None);
    }
    let digits = v.iter().take_while(|c| c.is_ascii_digit()).count();
    let (number, unit) = v.split_at(digits);
    if number.is_empty() {
        return Err(());
    }
    let shift = unit_shift(unit).ok_or(())?;
    let mut n: usize = 0;
    for &c in number {
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(usize::from(c - b'0')))
            .ok_or(())?;
    }
    if n.leading_zeros() < shift {
        return Err(()); // more bytes than a usize holds
    }
    n <<= shift;
    Ok(if n == 0 { None } else { Some(n) })
}

/// The shift of a byte count's unit (none: 0), any case; `None` if it is
/// not one.
fn unit_shift(unit: &[u8]) -> Option<u32> {
    let Some((&letter, rest)) = unit.split_first() else {
        return Some(0);
    };
    let shift = match letter.to_ascii_uppercase() {
        b'K' => 10,
        b'M' => 20,
        b'G' => 30,
        b'T' => 40,
        _ => return None,
    };
    (rest.is_empty() || rest.eq_ignore_ascii_case(b"ib")).then_some(shift)
}

/// Reads and parses the variable `name`: unset or empty is the default,
/// `on`; an unparsable value also keeps the default, with `warning` written
/// to stderr (a typo should not cost a program its defaults).
#[cfg_attr(loom, allow(dead_code))] // the block cache's, not built under loom
pub(crate) fn read(name: &CStr, on: usize, warning: &[u8]) -> Option<usize> {
    let mut buf = crate::sys::EnvBuf::new();
    let value = crate::sys::env_var(name, &mut buf);
    parse(value, on).unwrap_or_else(|()| {
        crate::sys::write_stderr(warning);
        Some(on)
    })
}

/// Reads the on/off switch `name` (`MKL_ALLOC_BACKING`): unset, empty or
/// `on` (any case) is on, `off` or `0` off; anything else (a byte count
/// included, which means nothing for a switch) keeps the default, on, with
/// `warning` written to stderr.
#[cfg_attr(loom, allow(dead_code))] // the hooks are not built under loom
pub(crate) fn read_switch(name: &CStr, warning: &[u8]) -> bool {
    let mut buf = crate::sys::EnvBuf::new();
    let value = crate::sys::env_var(name, &mut buf);
    parse_switch(value).unwrap_or_else(|()| {
        crate::sys::write_stderr(warning);
        true
    })
}

/// Parses a switch's value (see [`read_switch`]).
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn parse_switch(v: &[u8]) -> Result<bool, ()> {
    match parse(v, 1) {
        Ok(None) => Ok(false),
        Ok(Some(_)) if v.is_empty() || v.eq_ignore_ascii_case(b"on") => Ok(true),
        _ => Err(()),
    }
}

/// A size threshold set from the environment on first use, or by the
/// program: the policy word `huge_pages` and `block_cache` keep. `UNINIT`
/// (0, so that every size takes the slow path until the environment is
/// read), [`OFF`](Self::OFF) (larger than any block: a `Layout` size is at
/// most `isize::MAX`), or the threshold. The fast path is one relaxed load
/// and one comparison: `size >= word`.
pub(crate) struct SizePolicy {
    word: AtomicUsize,
}

impl SizePolicy {
    const UNINIT: usize = 0;
    /// No size reaches it.
    pub(crate) const OFF: usize = usize::MAX;

    pub(crate) const fn new() -> Self {
        Self {
            word: AtomicUsize::new(Self::UNINIT),
        }
    }

    /// Whether `size` reaches the threshold; `read_env` runs once, the
    /// first time the word is needed (racing threads compute the same value;
    /// a `set` that happened meanwhile wins).
    #[inline(always)]
    pub(crate) fn covers(&self, size: usize, read_env: fn() -> usize) -> bool {
        size >= self.word.load(Relaxed) && size >= self.get(read_env)
    }

    /// The word (`OFF` or a threshold), reading the environment if nothing did.
    #[inline(always)]
    pub(crate) fn get(&self, read_env: fn() -> usize) -> usize {
        match self.word.load(Relaxed) {
            Self::UNINIT => self.init(read_env),
            w => w,
        }
    }

    #[cold]
    #[inline(never)]
    fn init(&self, read_env: fn() -> usize) -> usize {
        let w = read_env().max(1);
        match self
            .word
            .compare_exchange(Self::UNINIT, w, Relaxed, Relaxed)
        {
            Ok(_) => w,
            Err(set_meanwhile) => set_meanwhile,
        }
    }

    /// Sets the word: a threshold (1 ..= `OFF`; 0 is stored as 1, which
    /// selects the same sizes) or `OFF`.
    pub(crate) fn set(&self, w: usize) {
        self.word.store(w.max(1), Relaxed);
    }
}

/// Where a setting in force came from.
///
/// ```
/// use mkl_alloc::manager::Source;
///
/// assert_eq!(Source::Program.to_string(), "set by the program");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The crate's default: the variable unset, empty, or holding a value
    /// the crate ignored (with a line on stderr).
    Default,
    /// The variable (`MKL_ALLOC_BLOCK_CACHE`, `MKL_ALLOC_HUGE_PAGES`).
    Environment,
    /// A call of the program's: a setter of this module or of the
    /// setting's own module, even one that set the value the environment
    /// gave.
    Program,
}

impl core::fmt::Display for Source {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Source::Default => "default",
            Source::Environment => "environment",
            Source::Program => "set by the program",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, parse_switch};

    #[test]
    fn switch_values() {
        assert_eq!(parse_switch(b""), Ok(true));
        assert_eq!(parse_switch(b"on"), Ok(true));
        assert_eq!(parse_switch(b"ON"), Ok(true));
        assert_eq!(parse_switch(b"off"), Ok(false));
        assert_eq!(parse_switch(b"0"), Ok(false));
        assert_eq!(parse_switch(b"7"), Err(()));
        assert_eq!(parse_switch(b"1"), Err(()));
        assert_eq!(parse_switch(b"yes"), Err(()));
    }

    #[test]
    fn values() {
        const ON: usize = 2 << 20;
        assert_eq!(parse(b"", ON), Ok(Some(ON)));
        assert_eq!(parse(b"off", ON), Ok(None));
        assert_eq!(parse(b"OFF", ON), Ok(None));
        assert_eq!(parse(b"0", ON), Ok(None));
        assert_eq!(parse(b"on", ON), Ok(Some(ON)));
        assert_eq!(parse(b"On", ON), Ok(Some(ON)));
        assert_eq!(parse(b"67108864", ON), Ok(Some(64 << 20)));
        assert_eq!(parse(b"1", ON), Ok(Some(1)));
        assert_eq!(parse(b"2M", ON), Ok(Some(2 << 20)));
        assert_eq!(parse(b"256m", ON), Ok(Some(256 << 20)));
        assert_eq!(parse(b"64K", ON), Ok(Some(64 << 10)));
        assert_eq!(parse(b"1GiB", ON), Ok(Some(1 << 30)));
        assert_eq!(parse(b"1gib", ON), Ok(Some(1 << 30)));
        assert_eq!(parse(b"3MiB", ON), Ok(Some(3 << 20)));
        assert_eq!(parse(b"0M", ON), Ok(None));
        assert_eq!(parse(b"M", ON), Err(()));
        assert_eq!(parse(b"2MB", ON), Err(()));
        assert_eq!(parse(b"2 M", ON), Err(()));
        assert_eq!(parse(b"2Mi", ON), Err(()));
        assert_eq!(parse(b"2X", ON), Err(()));
        assert_eq!(parse(b"1.5G", ON), Err(()));
        if usize::BITS == 64 {
            assert_eq!(parse(b"16777215T", ON), Ok(Some(16777215 << 40)));
            assert_eq!(parse(b"16777216T", ON), Err(()));
        }
        assert_eq!(parse(b"-1", ON), Err(()));
        assert_eq!(parse(b" on", ON), Err(()));
        assert_eq!(parse(b"99999999999999999999999", ON), Err(()));
    }
}
