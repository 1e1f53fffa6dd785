//! The block cache's default budget: an eighth of the memory the process
//! may use, which inside a container is the cgroup's limit, not the host's
//! memory.
//!
//! The limit is read from the cgroup the process is in (`/proc/self/cgroup`)
//! and every ancestor of it, the smallest winning: cgroup v2's `memory.max`
//! under `/sys/fs/cgroup`, and v1's `memory.limit_in_bytes` under
//! `/sys/fs/cgroup/memory`. Values meaning "unlimited" (`max`, or v1's
//! page-counter maximum) are ignored. No allocator reads these (jemalloc,
//! mimalloc, tcmalloc, glibc keep what the host could hold), and programs
//! in containers are OOM-killed for it; a cache that keeps freed memory
//! must.
//!
//! This runs inside the global allocator's first call, so nothing here
//! allocates: the files are read with `open`/`read` into stack buffers.

use super::block_cache::MIN_BLOCK;

/// An eighth of `min(physical memory, the cgroup's limit)`, at least
/// [`MIN_BLOCK`]; 1 GiB where physical memory cannot be read.
pub(crate) fn default_budget() -> usize {
    let limit = match (physical(), cgroup_limit()) {
        (Some(p), Some(c)) => p.min(c),
        (Some(p), None) => p,
        (None, Some(c)) => c,
        (None, None) => 8 << 30,
    };
    (limit / 8).max(MIN_BLOCK)
}

fn physical() -> Option<usize> {
    if cfg!(miri) {
        return None;
    }
    crate::sys::physical_memory()
}

/// The smallest memory limit of this process's cgroups, if any is set
/// (cgroups are Linux's: `None` elsewhere).
#[cfg(not(target_os = "linux"))]
fn cgroup_limit() -> Option<usize> {
    None
}

/// The smallest memory limit of this process's cgroups, if any is set.
#[cfg(target_os = "linux")]
fn cgroup_limit() -> Option<usize> {
    if cfg!(miri) {
        return None;
    }
    let mut buf = [0u8; 4096];
    let n = read_file(b"/proc/self/cgroup", &mut buf)?;
    limit_from(&buf[..n], &mut |path| {
        let mut text = [0u8; 64];
        let n = read_file(path, &mut text)?;
        parse_limit(&text[..n])
    })
}

/// The smallest limit that `read` finds for the cgroups `/proc/self/cgroup`
/// lists (`cgroups`: that file's contents) and their ancestors. `read`
/// gets each limit file's path and returns its parsed value.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // tested everywhere
pub(crate) fn limit_from(
    cgroups: &[u8],
    read: &mut dyn FnMut(&[u8]) -> Option<usize>,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    for line in cgroups.split(|&b| b == b'\n') {
        // hierarchy-id:controllers:path
        let mut parts = line.splitn(3, |&b| b == b':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (root, file): (&[u8], &[u8]) = if controllers.is_empty() {
            (b"/sys/fs/cgroup", b"/memory.max")
        } else if controllers.split(|&b| b == b',').any(|c| c == b"memory") {
            (b"/sys/fs/cgroup/memory", b"/memory.limit_in_bytes")
        } else {
            continue;
        };
        // The cgroup itself, then each ancestor up to the root.
        let mut dir = path.strip_suffix(b"/").unwrap_or(path);
        loop {
            let mut full = [0u8; 4096];
            if let Some(p) = join(&mut full, &[root, dir, file]) {
                if let Some(limit) = read(p) {
                    best = Some(best.map_or(limit, |b| b.min(limit)));
                }
            }
            match dir.iter().rposition(|&b| b == b'/') {
                Some(i) => dir = &dir[..i],
                None => break,
            }
        }
    }
    best
}

/// A limit file's value: `None` for "unlimited" (`max`, or a value of
/// 2^62 and more: v1 writes its page-counter maximum, 9223372036854771712)
/// and for anything unreadable.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn parse_limit(text: &[u8]) -> Option<usize> {
    let text = text.trim_ascii();
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: u64 = 0;
    for &c in text {
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    (n < 1 << 62).then_some(n as usize)
}

/// `parts` concatenated into `buf`, or `None` if they do not fit.
fn join<'a>(buf: &'a mut [u8], parts: &[&[u8]]) -> Option<&'a [u8]> {
    let mut len = 0;
    for p in parts {
        buf.get_mut(len..len + p.len())?.copy_from_slice(p);
        len += p.len();
    }
    Some(&buf[..len])
}

/// Reads up to `buf.len() - 1` bytes of the file at `path` into `buf`,
/// without allocating (`open`/`read` into the caller's buffer).
#[cfg(target_os = "linux")]
pub(super) fn read_file(path: &[u8], buf: &mut [u8]) -> Option<usize> {
    let mut name = [0u8; 4097];
    name.get_mut(..path.len())?.copy_from_slice(path);
    // SAFETY: `name` is NUL-terminated (zeroed past `path`, which holds no
    // NUL of its own in any path built here); `open` allocates nothing.
    let fd = unsafe { libc::open(name.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut len = 0;
    while len + 1 < buf.len() {
        // SAFETY: reads into the unfilled part of `buf`, which we own.
        let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - 1 - len) };
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: `fd` is the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    Some(len)
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    fn limits<'a>(files: &'a [(&'a str, &'a str)]) -> impl FnMut(&[u8]) -> Option<usize> + 'a {
        move |path| {
            files
                .iter()
                .find(|(p, _)| p.as_bytes() == path)
                .and_then(|(_, v)| parse_limit(v.as_bytes()))
        }
    }

    #[test]
    fn unlimited_values_are_ignored() {
        assert_eq!(parse_limit(b"max\n"), None);
        assert_eq!(parse_limit(b"9223372036854771712\n"), None);
        assert_eq!(parse_limit(b"536870912\n"), Some(512 << 20));
        assert_eq!(parse_limit(b""), None);
        assert_eq!(parse_limit(b"12ab"), None);
    }

    #[test]
    fn v2_limit_of_the_cgroup_or_an_ancestor() {
        let cg = b"0::/a/b\n";
        let files = [
            ("/sys/fs/cgroup/a/b/memory.max", "max\n"),
            ("/sys/fs/cgroup/a/memory.max", "1073741824\n"),
        ];
        assert_eq!(limit_from(cg, &mut limits(&files)), Some(1 << 30));
        let files = [("/sys/fs/cgroup/a/b/memory.max", "536870912\n")];
        assert_eq!(limit_from(cg, &mut limits(&files)), Some(512 << 20));
        assert_eq!(limit_from(b"0::/\n", &mut limits(&[])), None);
    }

    #[test]
    fn v1_memory_controller_in_a_hybrid_layout() {
        let cg = b"9:name=systemd:/\n4:memory:/ci/job\n1:cpu,cpuacct:/\n0::/\n";
        let files = [
            (
                "/sys/fs/cgroup/memory/ci/job/memory.limit_in_bytes",
                "536870912\n",
            ),
            (
                "/sys/fs/cgroup/memory/ci/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ];
        assert_eq!(limit_from(cg, &mut limits(&files)), Some(512 << 20));
        // A controller list naming memory among others counts too.
        let cg = b"4:cpu,memory:/x\n";
        let files = [("/sys/fs/cgroup/memory/x/memory.limit_in_bytes", "4096\n")];
        assert_eq!(limit_from(cg, &mut limits(&files)), Some(4096));
    }

    #[test]
    fn the_budget_is_an_eighth_of_the_smaller() {
        let b = default_budget();
        assert!(b >= MIN_BLOCK);
        if let Some(p) = physical() {
            assert!(b <= (p / 8).max(MIN_BLOCK));
        }
    }
}
