//! The settings in force, set at run time and reported: the block cache's
//! budget and decay, the huge-page threshold, each with where it came from
//! ([`Source`]), read together by [`settings`], whose `Display` is one line
//! per setting (Rust's counterpart of Python's `mkl_alloc.show_config()`).
//!
//! The setters ([`set_block_cache`], [`set_decay_ms`], [`set_huge_pages`])
//! are the modules' own (`block_cache::enable`, `huge_pages::enable`...)
//! that also record that the program chose the value; [`parse_size`] reads
//! a value as `MKL_ALLOC_BLOCK_CACHE` and `MKL_ALLOC_HUGE_PAGES` are read,
//! saying why one is refused. Re-exported from [`manager`](crate::manager).

use core::fmt;
#[cfg(not(loom))]
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

pub use crate::env::Source;

/// Why [`parse_size`] refused a value; its `Display` says so in words.
///
/// ```
/// use mkl_alloc::manager::{SizeValueError, parse_size};
///
/// assert_eq!(parse_size("-1", 1), Err(SizeValueError::Negative));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SizeValueError {
    /// A minus sign before the digits.
    Negative,
    /// More bytes than a `usize` holds.
    TooLarge,
    /// Neither `off`, `on` nor a byte count (`2MB`, `1.5G`, `yes`, ` on`).
    NotASize,
}

impl fmt::Display for SizeValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeValueError::Negative => f.write_str("a byte count cannot be negative"),
            SizeValueError::TooLarge => {
                write!(
                    f,
                    "a byte count must be at most {} (usize::MAX)",
                    usize::MAX
                )
            }
            SizeValueError::NotASize => f.write_str(
                "the value is not off, on or a byte count (decimal digits, \
                     optionally with K, M, G or T, or KiB, MiB, GiB or TiB: powers of 1024)",
            ),
        }
    }
}

impl std::error::Error for SizeValueError {}

/// Reads `value` as the crate reads `MKL_ALLOC_BLOCK_CACHE` and
/// `MKL_ALLOC_HUGE_PAGES`: empty or `on` (any case) is `Some(on)`, `off`
/// (any case) or `0` is `None` (off), decimal digits are a byte count,
/// optionally followed by a binary unit (`K`, `M`, `G`, `T` or `KiB`,
/// `MiB`, `GiB`, `TiB`, any case: `256M` is 256 MiB); the error says why
/// anything else is refused (the environment's reader keeps
/// the default there instead, with a line on stderr).
///
/// ```
/// use mkl_alloc::{block_cache, manager};
///
/// let on = block_cache::default_budget();
/// assert_eq!(manager::parse_size("ON", on), Ok(Some(on)));
/// assert_eq!(manager::parse_size("off", on), Ok(None));
/// assert_eq!(manager::parse_size("0", on), Ok(None));
/// assert_eq!(manager::parse_size("268435456", on), Ok(Some(256 << 20)));
/// assert_eq!(manager::parse_size("256M", on), Ok(Some(256 << 20)));
/// assert_eq!(manager::parse_size("1GiB", on), Ok(Some(1 << 30)));
/// assert!(manager::parse_size("256MB", on).is_err());
/// ```
pub fn parse_size(value: &str, on: usize) -> Result<Option<usize>, SizeValueError> {
    crate::env::parse(value.as_bytes(), on).map_err(|()| {
        // A count the parser refused although it has the right shape
        // (digits and a known unit, or none) is too large.
        let count = |s: &str| {
            let digits = s.bytes().take_while(u8::is_ascii_digit).count();
            digits > 0 && crate::env::parse(format!("1{}", &s[digits..]).as_bytes(), 1).is_ok()
        };
        match value.strip_prefix('-') {
            Some(rest) if count(rest) => SizeValueError::Negative,
            _ if count(value) => SizeValueError::TooLarge,
            _ => SizeValueError::NotASize,
        }
    })
}

/// Which of the block cache's settings a setter of this module set (bits).
/// (Under loom the block cache has no settings: loom models its shards.)
#[cfg(not(loom))]
static SET_HERE: AtomicU8 = AtomicU8::new(0);
#[cfg(not(loom))]
const BUDGET_SET: u8 = 1;
#[cfg(not(loom))]
const DECAY_SET: u8 = 2;

/// Turns the block cache on with a budget of `budget` bytes
/// (`block_cache::enable`; `Some(0)` keeps nothing) or, with `None`, off
/// (`block_cache::disable`, which unmaps every cached chunk); [`settings`]
/// then reports the budget as [`Source::Program`].
///
/// ```
/// use mkl_alloc::manager::{self, Source};
///
/// manager::set_block_cache(Some(256 << 20));
/// let s = manager::settings();
/// assert_eq!(s.block_cache_budget, Some(256 << 20));
/// assert_eq!(s.block_cache_source, Source::Program);
/// manager::set_block_cache(None);
/// assert_eq!(manager::settings().block_cache_budget, None);
/// ```
#[cfg(not(loom))]
pub fn set_block_cache(budget: Option<usize>) {
    SET_HERE.fetch_or(BUDGET_SET, Relaxed);
    match budget {
        Some(b) => crate::block_cache::enable(b),
        None => crate::block_cache::disable(),
    }
}

/// Sets the block cache's decay time (`block_cache::set_decay_ms`): a
/// cached chunk unused for `ms` milliseconds is unmapped (0: at the next
/// check); [`settings`] then reports it as [`Source::Program`].
///
/// ```
/// use mkl_alloc::{block_cache, manager};
///
/// manager::set_decay_ms(10_000);
/// assert_eq!(manager::settings().decay_ms, 10_000);
/// manager::set_decay_ms(block_cache::DECAY_MS);
/// ```
#[cfg(not(loom))]
pub fn set_decay_ms(ms: usize) {
    SET_HERE.fetch_or(DECAY_SET, Relaxed);
    crate::block_cache::set_decay_ms(ms);
}

/// Turns huge pages on for chunks of at least `threshold` bytes
/// (`huge_pages::enable`) or, with `None`, off (`huge_pages::disable`);
/// the threshold's source is then [`Source::Program`].
///
/// ```
/// use mkl_alloc::{huge_pages, manager};
///
/// manager::set_huge_pages(Some(64 << 20));
/// assert_eq!(huge_pages::threshold(), Some(64 << 20));
/// manager::set_huge_pages(None);
/// assert_eq!(manager::settings().huge_pages_threshold, None);
/// ```
pub fn set_huge_pages(threshold: Option<usize>) {
    match threshold {
        Some(t) => crate::huge_pages::enable(t),
        None => crate::huge_pages::disable(),
    }
}

/// The settings in force and where each came from ([`settings`]). Its
/// `Display` prints one line per setting, `name: value [source]`.
///
/// ```
/// let s = mkl_alloc::manager::settings();
/// println!("{s}");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// The block cache's budget in bytes, `None` while the cache is off.
    pub block_cache_budget: Option<usize>,
    /// Where the budget came from. A program that called
    /// `block_cache::enable`/`disable` directly (not [`set_block_cache`])
    /// is seen only where the budget differs from what the environment
    /// gives now (`MKL_ALLOC_BLOCK_CACHE`, or the default).
    pub block_cache_source: Source,
    /// The decay time in milliseconds.
    pub decay_ms: usize,
    /// [`Source::Default`] or [`Source::Program`]: no variable sets it.
    pub decay_source: Source,
    /// The huge-page threshold in bytes, `None` while the policy is off.
    pub huge_pages_threshold: Option<usize>,
    /// Where the threshold came from (`huge_pages::source`).
    pub huge_pages_source: Source,
    /// The kernel's transparent-huge-page mode (`huge_pages::status`).
    pub huge_pages_status: crate::huge_pages::Status,
    /// Whether MKL allocates from the crate's memory (`backing::state`).
    pub backing: crate::backing::Backing,
    /// Whether MKL's own caches are known to be off
    /// ([`fast_mm_disabled`](crate::manager::fast_mm_disabled)).
    pub fast_mm_disabled: bool,
    /// Whether the background decay thread runs
    /// ([`background::is_running`](crate::background::is_running)).
    pub background: bool,
    /// Where that came from: `MKL_ALLOC_BACKGROUND`, the default (off), or
    /// the program ([`background::start`](crate::background::start) or
    /// [`stop`](crate::background::stop)).
    pub background_source: Source,
    /// Whether MKL's blocks of 4 KiB up to 1 MiB are medium blocks of the
    /// crate's, given back to the kernel after the decay time (Linux, MKL on
    /// the crate's memory, not turned off: see `backing`). `false` after
    /// `MKL_ALLOC_MEDIUM=off`, where no region of address space could be
    /// reserved, and on Windows.
    ///
    /// ```
    /// let s = mkl_alloc::manager::settings();
    /// if s.medium_blocks {
    ///     assert_eq!(s.backing, mkl_alloc::backing::Backing::Active);
    /// }
    /// ```
    pub medium_blocks: bool,
    /// [`Source::Environment`] where `MKL_ALLOC_MEDIUM=off` turned them
    /// off, else [`Source::Default`].
    pub medium_source: Source,
    /// Whether a `fork` holds MKL's own memory-manager locks, so that a
    /// child never inherits one taken by a thread that reached MKL without
    /// the crate (MKL's FFT or BLAS allocating their workspace, a library
    /// calling `MKL_malloc` itself). `true` on Linux with the MKL the crate
    /// pins (oneMKL 2026.2, whose locks it recognises in MKL's code);
    /// `false` with another MKL or where MKL's core is not visible (see
    /// docs/reliability.md, "Fork"): there the fork guard covers the
    /// crate's own MKL calls only.
    ///
    /// ```
    /// let s = mkl_alloc::manager::settings();
    /// println!("forks hold MKL's locks: {}", s.fork_holds_mkl_locks);
    /// ```
    pub fork_holds_mkl_locks: bool,
}

/// Reads the settings in force (reading the environment's policies first
/// if nothing did yet).
///
/// ```
/// use mkl_alloc::{block_cache, huge_pages, manager};
///
/// manager::set_decay_ms(2_000);
/// let s = manager::settings();
/// assert_eq!(s.block_cache_budget, block_cache::budget());
/// assert_eq!(s.huge_pages_threshold, huge_pages::threshold());
/// assert_eq!((s.decay_ms, s.decay_source), (2_000, manager::Source::Program));
/// let text = s.to_string();
/// assert!(text.contains("block cache decay: 2000 ms [set by the program]"));
/// manager::set_decay_ms(block_cache::DECAY_MS);
/// ```
#[cfg(not(loom))]
pub fn settings() -> Settings {
    use crate::{block_cache, huge_pages};

    let set = SET_HERE.load(Relaxed);
    let budget = block_cache::budget();
    let default = block_cache::default_budget();
    let (from_env, env_source) = match std::env::var("MKL_ALLOC_BLOCK_CACHE") {
        Ok(v) if !v.is_empty() => match parse_size(&v, default) {
            Ok(b) => (b, Source::Environment),
            Err(_) => (Some(default), Source::Default),
        },
        _ => (Some(default), Source::Default),
    };
    let block_cache_source = if set & BUDGET_SET != 0 || budget != from_env {
        Source::Program
    } else {
        env_source
    };
    let medium = crate::backing::medium::is_on();
    let decay_ms = block_cache::decay_ms();
    let decay_source = if set & DECAY_SET != 0 || decay_ms != block_cache::DECAY_MS {
        Source::Program
    } else {
        Source::Default
    };
    Settings {
        block_cache_budget: budget,
        block_cache_source,
        decay_ms,
        decay_source,
        huge_pages_threshold: huge_pages::threshold(),
        huge_pages_source: huge_pages::source(),
        huge_pages_status: huge_pages::status(),
        backing: crate::backing::state(),
        fast_mm_disabled: crate::manager::fast_mm_disabled(),
        background: crate::background::is_running(),
        background_source: background_source(),
        medium_blocks: medium.0 && crate::backing::state() == crate::backing::Backing::Active,
        medium_source: if medium.1 {
            Source::Environment
        } else {
            Source::Default
        },
        fork_holds_mkl_locks: crate::fork_guard::holds_mkl_locks(),
    }
}

/// Where the background thread's setting came from: the program if it
/// called `start`/`stop`, the variable if it holds a switch, else the
/// default.
#[cfg(not(loom))]
fn background_source() -> Source {
    use crate::background as bg;
    match bg::source() {
        bg::SOURCE_PROGRAM => Source::Program,
        _ if bg::env_setting().is_some() => Source::Environment,
        _ => Source::Default,
    }
}

/// `n` bytes, or `off`.
struct Bytes(Option<usize>);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("off"),
            Some(n) => write!(f, "{n} bytes"),
        }
    }
}

/// A source, naming the variable where it is the environment.
struct SourceOf(Source, &'static str);

impl fmt::Display for SourceOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Source::Environment => write!(f, "environment: {}", self.1),
            s => s.fmt(f),
        }
    }
}

impl fmt::Display for Settings {
    /// One line per setting, `name: value [source]`:
    ///
    /// ```text
    /// block cache budget: 268435456 bytes [environment: MKL_ALLOC_BLOCK_CACHE]
    /// block cache decay: 1000 ms [default]
    /// huge pages from: 4194304 bytes [default]
    /// huge pages kernel: Madvise
    /// backing: Active
    /// MKL fast memory manager: on
    /// background decay thread: off [default]
    /// medium blocks (4 KiB-1 MiB): on [default]
    /// fork holds MKL's locks: yes
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "block cache budget: {} [{}]",
            Bytes(self.block_cache_budget),
            SourceOf(self.block_cache_source, "MKL_ALLOC_BLOCK_CACHE")
        )?;
        writeln!(
            f,
            "block cache decay: {} ms [{}]",
            self.decay_ms, self.decay_source
        )?;
        writeln!(
            f,
            "huge pages from: {} [{}]",
            Bytes(self.huge_pages_threshold),
            SourceOf(self.huge_pages_source, "MKL_ALLOC_HUGE_PAGES")
        )?;
        writeln!(f, "huge pages kernel: {:?}", self.huge_pages_status)?;
        writeln!(f, "backing: {:?}", self.backing)?;
        writeln!(
            f,
            "MKL fast memory manager: {}",
            if self.fast_mm_disabled { "off" } else { "on" }
        )?;
        writeln!(
            f,
            "background decay thread: {} [{}]",
            if self.background { "on" } else { "off" },
            SourceOf(self.background_source, "MKL_ALLOC_BACKGROUND")
        )?;
        writeln!(
            f,
            "medium blocks (4 KiB-1 MiB): {} [{}]",
            if self.medium_blocks { "on" } else { "off" },
            SourceOf(self.medium_source, "MKL_ALLOC_MEDIUM")
        )?;
        write!(
            f,
            "fork holds MKL's locks: {}",
            if self.fork_holds_mkl_locks {
                "yes"
            } else {
                "no"
            }
        )
    }
}
