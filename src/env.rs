//! Size policies read from the environment (`MKL_ALLOC_HUGE_PAGES`,
//! `MKL_ALLOC_BLOCK_CACHE`): unset (the default), `off`, `on` or a byte
//! count, and the switch `MKL_ALLOC_BACKING` (`off` or `on`), read once (`sys::env_var`: libc's `getenv`, or
//! `GetEnvironmentVariableW` on Windows). The readers run inside the global
//! allocator, so nothing here allocates: a byte parser, and one raw write
//! to stderr for the warning.

use core::ffi::CStr;
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Parses a policy value: `Ok(None)` for off (`off`, `0`), `Ok(Some(on))`
/// for `on` (any case) and for an empty value, `Ok(Some(n))` for a decimal
/// byte count `n > 0`, `Err(())` for anything else.
pub(crate) fn parse(v: &[u8], on: usize) -> Result<Option<usize>, ()> {
    if v.is_empty() || v.eq_ignore_ascii_case(b"on") {
        return Ok(Some(on));
    }
    if v.eq_ignore_ascii_case(b"off") {
        return Ok(None);
    }
    let mut n: usize = 0;
    for &c in v {
        if !c.is_ascii_digit() {
            return Err(());
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(usize::from(c - b'0')))
            .ok_or(())?;
    }
    Ok(if n == 0 { None } else { Some(n) })
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
        assert_eq!(parse(b"2M", ON), Err(()));
        assert_eq!(parse(b"-1", ON), Err(()));
        assert_eq!(parse(b" on", ON), Err(()));
        assert_eq!(parse(b"99999999999999999999999", ON), Err(()));
    }
}
