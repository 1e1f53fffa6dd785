//! The kernel's limit on a process's mappings (`vm.max_map_count`, 65,530
//! by default), which every `mmap` of the process counts against: past it
//! every `mmap` fails, the C library's and the program's too. Each chunk
//! is a mapping of its own (on a 2 MiB boundary, with holes beside it, it
//! never merges with its neighbours), or two where it grew onto a cached
//! chunk (`hooks::grow_chunk`, which copies rather than add a third:
//! `chunks::Chunk::split`): so the crate keeps at most a quarter of the
//! limit in chunks, live and cached, and with that its mappings within
//! half of it. Beyond, `map::map` refuses, and the hooks serve the request
//! from the C runtime (a new block, or a growth copied there).
//!
//! The limit is read once, at the first mapping, with `open`/`read` into a
//! stack buffer (this runs inside MKL's calls, under the global
//! allocator); one atomic counter of chunks, which a `fork` leaves as it
//! was (at worst too high in the child: it maps less).

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// `vm.max_map_count` where it cannot be read: the kernel's default.
const DEFAULT_MAX_MAP_COUNT: usize = 65_530;

/// Chunks the crate has mapped and not unmapped (live and cached).
static CHUNKS: AtomicUsize = AtomicUsize::new(0);
/// The most chunks there may be; 0 until the limit was read.
static LIMIT: AtomicUsize = AtomicUsize::new(0);

/// The most chunks the crate keeps: a quarter of `vm.max_map_count`.
pub(crate) fn max_chunks() -> usize {
    match LIMIT.load(Relaxed) {
        0 => {
            let l = (max_map_count() / 4).max(1);
            LIMIT.store(l, Relaxed);
            l
        }
        l => l,
    }
}

/// `vm.max_map_count`, read without allocating.
fn max_map_count() -> usize {
    let mut buf = [0u8; 32];
    super::budget::read_file(b"/proc/sys/vm/max_map_count", &mut buf)
        .and_then(|n| super::budget::parse_limit(&buf[..n]))
        .unwrap_or(DEFAULT_MAX_MAP_COUNT)
}

/// Claims room for one more chunk; `false` if the crate keeps as many as
/// it may (the caller then maps nothing).
pub(crate) fn claim() -> bool {
    let max = max_chunks();
    CHUNKS
        .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
        .is_ok()
}

/// One chunk fewer: unmapped, or moved into another (`mremap` onto a
/// cached chunk).
pub(crate) fn release() {
    CHUNKS.fetch_sub(1, Relaxed);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_quarter_of_the_kernels_limit() {
        let max = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .map_or(super::DEFAULT_MAX_MAP_COUNT, |t| t.trim().parse().unwrap());
        assert_eq!(super::max_chunks(), max / 4);
    }
}
