//! Byte patterns for the tests' blocks, written and checked 4 KiB at a
//! time: one copy or one comparison per chunk instead of a loop over bytes.
//! Under Miri, which interprets a byte loop instruction by instruction and
//! a copy or comparison as one step, this is what makes blocks of many KiB
//! affordable; natively it is only faster. Every byte is still written and
//! checked.
#![allow(dead_code)] // each test binary uses some of these

#[cfg(unix)]
pub mod child;

/// Bytes written or compared at once: a multiple of the patterns' period
/// (`byte(i)` may depend on `i % 256` only: it is given `i as u8`).
const CHUNK: usize = 4096;

/// The pattern's first `min(len, CHUNK)` bytes (256 computed, the rest
/// copied).
fn period(byte: impl Fn(u8) -> u8, len: usize) -> Vec<u8> {
    let n = len.min(CHUNK);
    let mut pat: Vec<u8> = (0..n.min(256)).map(|i| byte(i as u8)).collect();
    while pat.len() < n {
        let more = pat.len().min(n - pat.len());
        pat.extend_from_within(..more);
    }
    pat
}

/// Writes `byte(i as u8)` to `p + i` for every `i < len`.
///
/// # Safety
/// `p` is valid for writes of `len` bytes.
pub unsafe fn fill(p: *mut u8, len: usize, byte: impl Fn(u8) -> u8) {
    let pat = period(byte, len);
    for start in (0..len).step_by(CHUNK) {
        let n = CHUNK.min(len - start);
        // SAFETY: start + n <= len: inside the caller's range; `pat` is a
        // local vector, disjoint from it.
        unsafe { core::ptr::copy_nonoverlapping(pat.as_ptr(), p.add(start), n) };
    }
}

/// Panics, naming the first wrong byte, unless `p + i` holds `byte(i as u8)`
/// for every `i < len`.
///
/// # Safety
/// `p` is valid for reads of `len` initialised bytes, which nothing
/// writes meanwhile.
#[track_caller]
pub unsafe fn check(p: *const u8, len: usize, byte: impl Fn(u8) -> u8) {
    let pat = period(byte, len);
    // SAFETY: the caller's contract.
    let bytes = unsafe { core::slice::from_raw_parts(p, len) };
    for (k, chunk) in bytes.chunks(CHUNK).enumerate() {
        if chunk != &pat[..chunk.len()] {
            let j = chunk.iter().zip(&pat).position(|(a, b)| a != b).unwrap();
            let i = k * CHUNK + j;
            panic!(
                "byte {i} of {len} lost: {:#04x}, expected {:#04x}",
                chunk[j], pat[j]
            );
        }
    }
}

/// `check` over a slice.
#[track_caller]
pub fn check_slice(v: &[u8], byte: impl Fn(u8) -> u8) {
    // SAFETY: a slice is valid for reads of its initialised bytes, and the
    // shared borrow keeps writers away.
    unsafe { check(v.as_ptr(), v.len(), byte) }
}

/// A `Vec` of `len` bytes holding the pattern.
pub fn pattern_vec(len: usize, byte: impl Fn(u8) -> u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: `len` bytes of capacity, all written before they count as
    // elements.
    unsafe {
        fill(v.as_mut_ptr(), len, byte);
        v.set_len(len);
    }
    v
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One test at a time among the tests of MKL's process-wide state (the
/// block cache, MKL's counts), starting with the cache and huge pages off
/// and empty, and a decay time no test reaches (a slow run, under valgrind
/// say, must not see blocks decay).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    mkl_alloc::block_cache::disable();
    mkl_alloc::huge_pages::disable();
    mkl_alloc::block_cache::set_decay_ms(3_600_000);
    g
}

/// Whether a child run of one test binary (`--exact NAME --ignored`)
/// passed its one test, with its stdout and stderr for the message.
pub fn child_passed(out: &std::process::Output) -> (bool, String) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && text.contains("1 passed"), text)
}

/// Runs the ignored test `name` of the calling test binary alone in a fresh
/// process, with `unset` removed from its environment and `env` set;
/// panics with its output unless it passed, and returns the output.
#[allow(dead_code)] // not every test binary runs children
pub fn run_ignored_alone(name: &str, unset: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ]);
    cmd.env_remove(unset);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (ok, out) = child_passed(&cmd.output().unwrap());
    assert!(ok, "{name} {env:?}:\n{out}");
    out
}
