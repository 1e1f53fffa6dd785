//! The folder each fetch downloads and unpacks in, removed however the
//! fetch ends, and which such folders, left by builds that died mid-fetch,
//! a later fetch sweeps: those whose lock can be taken.

use std::fs;
use std::path::{Path, PathBuf};

/// A work folder inside the cache, removed however the fetch ends.
///
/// The cache may be shared by builds that cannot see each other's processes
/// (an NFS home used from several hosts, a cache bind-mounted into
/// containers with their own PID namespaces), so a folder's owner is not
/// told by its PID: each folder holds a `lock` file its build keeps
/// `flock`ed for as long as it lives. The kernel (or the NFS lock manager)
/// drops that lock when the build exits or is killed, so a folder whose lock
/// can be taken belongs to a dead build and may be swept; a live folder's
/// lock cannot be taken from any host or namespace. The lock file is locked
/// under a temporary name and then renamed to `lock`, so a `lock` that
/// exists is always held while its build lives.
pub struct WorkDir {
    pub path: PathBuf,
    /// Holds the `flock` (closed, and so unlocked, only after the folder is gone).
    _lock: fs::File,
}

/// Work folders start with this; the pre-lock `.partial-<pid>` folders of
/// older builds are never touched (they were swept by PID, unsafe here).
const WORK_PREFIX: &str = ".work-";

impl WorkDir {
    pub fn create(cache: &Path) -> Result<Self, String> {
        fs::create_dir_all(cache)
            .map_err(|e| format!("mkl-alloc: cannot create {}: {e}", cache.display()))?;
        let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host: String = host
            .trim()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let pid = std::process::id();
        for attempt in 0u32.. {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = cache.join(format!("{WORK_PREFIX}{host}-{pid}-{nanos}-{attempt}"));
            match fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    continue;
                }
                Err(e) => return Err(format!("mkl-alloc: cannot create {}: {e}", path.display())),
            }
            let tmp = path.join("lock.tmp");
            let lock = fs::File::create(&tmp)
                .map_err(|e| format!("mkl-alloc: cannot create {}: {e}", tmp.display()))?;
            if !try_flock(&lock) {
                let _ = fs::remove_dir_all(&path);
                return Err(format!("mkl-alloc: cannot lock {}", tmp.display()));
            }
            fs::rename(&tmp, path.join("lock"))
                .map_err(|e| format!("mkl-alloc: cannot rename {}: {e}", tmp.display()))?;
            return Ok(WorkDir { path, _lock: lock });
        }
        unreachable!("the loop returns")
    }

    /// Removes the work folders of builds that died mid-fetch: those whose
    /// `lock` file this build can lock. A folder without a `lock` (one being
    /// created right now) is left alone.
    pub fn sweep(cache: &Path) {
        let Ok(entries) = fs::read_dir(cache) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(WORK_PREFIX) {
                continue;
            }
            let Ok(lock) = fs::File::open(entry.path().join("lock")) else {
                continue;
            };
            if try_flock(&lock) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: whether this process now holds the lock.
fn try_flock(file: &fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor this File owns; no memory involved.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}
