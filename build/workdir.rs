//! The folder each fetch downloads and unpacks in (hundreds of MB of
//! wheels), removed however the fetch ends; and which folders left by
//! builds that died mid-fetch a later fetch sweeps.
//!
//! The cache may be shared by builds that cannot see each other's processes
//! (an NFS home used from several hosts, a cache bind-mounted into
//! containers with their own PID namespaces). Each work folder holds
//! - `owner`: its build's host name, boot id, PID namespace and PID;
//! - `lock`: a file its build keeps `flock`ed for as long as it lives,
//!   locked under a temporary name and then renamed, after `owner` is
//!   written: a `lock` that exists is held while its build lives.
//!
//! Neither tells a dead build alone. The lock: on NFS, `flock` is either
//! emulated with POSIX locks, which the server's lock manager holds for
//! every host, or (mount option `local_lock=flock` or `all`) kept by each
//! client, where another host's live build's lock can be taken here. The
//! PID: it means nothing outside its host and PID namespace, and a dead
//! build's PID may be reused.
//!
//! The rule: a folder is swept only if its lock can be taken here, and
//! - if its owner is local (this boot of this host, this PID namespace):
//!   no process has its PID (a live one, or one that reused the PID, keeps
//!   the folder whatever its age);
//! - otherwise (another host or namespace, or no `owner`: older builds): it
//!   is older than [`MAX_AGE`], 24 hours since the folder last changed by
//!   this host's clock.
//!
//! A folder without `lock` (one being created, or whose build was killed
//! before its lock existed) goes by age alone. So a live build's folder is
//! never swept: not while its lock is seen held, not while its local PID
//! lives, and not before 24 hours, which no fetch of a few hundred MB takes.
//! The price: a dead folder of another host waits 24 hours where working
//! NFS locks alone would have allowed it at once (sweeps run only when a
//! fetch starts anyway).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::locks::{open_lock, try_flock};

/// How old a folder whose lock can be taken must be to be swept when its
/// owner is not local: far longer than any fetch.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// A work folder inside the cache, removed however the fetch ends.
pub struct WorkDir {
    pub path: PathBuf,
    /// Holds the `flock` (closed, and so unlocked, only after the folder is gone).
    _lock: File,
}

/// Work folders start with this; the pre-lock `.partial-<pid>` folders of
/// older builds are never touched (they were swept by PID, unsafe here).
const WORK_PREFIX: &str = ".work-";

impl WorkDir {
    pub fn create(cache: &Path) -> Result<Self, String> {
        fs::create_dir_all(cache)
            .map_err(|e| format!("mkl-alloc: cannot create {}: {e}", cache.display()))?;
        let owner = Owner::this();
        let host: String = owner
            .host
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let pid = std::process::id();
        for attempt in 0u32.. {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = cache.join(format!("{WORK_PREFIX}{host}-{pid}-{nanos}-{attempt}"));
            match fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    continue;
                }
                Err(e) => return Err(format!("mkl-alloc: cannot create {}: {e}", path.display())),
            }
            let record = path.join("owner");
            fs::write(&record, owner.record())
                .map_err(|e| format!("mkl-alloc: cannot write {}: {e}", record.display()))?;
            let tmp = path.join("lock.tmp");
            let lock = open_lock(&tmp, true)
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
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Who made a work folder, as its `owner` file records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// For people reading the folder; the rule does not use it (two hosts
    /// may share a name, containers often take their host's).
    pub host: String,
    /// `/proc/sys/kernel/random/boot_id`: this boot of this kernel, shared
    /// by its containers; empty where unknown.
    pub boot: String,
    /// `/proc/self/ns/pid`'s link, e.g. `pid:[4026531836]`; empty where unknown.
    pub pid_ns: String,
    pub pid: u32,
}

impl Owner {
    /// This process.
    pub fn this() -> Owner {
        let read = |path: &str| {
            fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let pid_ns = fs::read_link("/proc/self/ns/pid")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        Owner {
            host: read("/proc/sys/kernel/hostname"),
            boot: read("/proc/sys/kernel/random/boot_id"),
            pid_ns,
            pid: std::process::id(),
        }
    }

    /// The `owner` file's text: one `key value` line each.
    pub fn record(&self) -> String {
        let Owner {
            host,
            boot,
            pid_ns,
            pid,
        } = self;
        format!("host {host}\nboot {boot}\npidns {pid_ns}\npid {pid}\n")
    }

    /// An `owner` file's text read back; `None` if any line is missing.
    pub fn parse(text: &str) -> Option<Owner> {
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .map(str::to_string)
        };
        Some(Owner {
            host: field("host")?,
            boot: field("boot")?,
            pid_ns: field("pidns")?,
            pid: field("pid")?.parse().ok()?,
        })
    }

    /// Whether this owner's PID names a process in `here`'s PID namespace
    /// on the same boot of the same kernel.
    pub fn is_local(&self, here: &Owner) -> bool {
        !here.boot.is_empty()
            && !here.pid_ns.is_empty()
            && self.boot == here.boot
            && self.pid_ns == here.pid_ns
    }
}

/// Whether a process of this PID namespace has this PID. Any doubt (a PID
/// out of range, a process of another user) counts as alive.
#[cfg(unix)]
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true; // kill(0 or -n) would address process groups
    }
    // SAFETY: kill with signal 0 sends nothing: it only checks that the
    // process exists and may be signalled; no memory involved.
    let found = unsafe { libc::kill(pid, 0) } == 0;
    found || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// On a Windows host no owner is local (there is no `/proc` to tell the
/// boot and the PID namespace), so the sweep goes by age and never asks;
/// were it asked, doubt counts as alive.
#[cfg(not(unix))]
pub fn pid_alive(_pid: u32) -> bool {
    true
}

/// How a sweep decides (module comment); `Sweep::default()` is the build's.
pub struct Sweep {
    pub max_age: Duration,
    /// Takes a folder's lock without waiting: `try_flock`. A field so that
    /// a test can put NFS's emulation of `flock` (a POSIX write lock) there.
    pub try_lock: fn(&File) -> bool,
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep {
            max_age: MAX_AGE,
            try_lock: try_flock,
        }
    }
}

impl Sweep {
    /// Removes the work folders in `cache` that the rule lets go; returns them.
    pub fn run(&self, cache: &Path) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir(cache) else {
            return Vec::new();
        };
        let here = Owner::this();
        let mut swept = Vec::new();
        for entry in entries.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(WORK_PREFIX) {
                continue;
            }
            let dir = entry.path();
            let old = fs::metadata(&dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > self.max_age);
            // Held until the folder is gone.
            let lock = open_lock(&dir.join("lock"), false);
            let sweep = match &lock {
                Err(_) => old, // no lock yet: being created, or its build died first
                Ok(lock) if !(self.try_lock)(lock) => false, // held: its build lives
                Ok(_) => {
                    let owner = fs::read_to_string(dir.join("owner"))
                        .ok()
                        .and_then(|text| Owner::parse(&text));
                    match owner {
                        Some(owner) if owner.is_local(&here) => !pid_alive(owner.pid),
                        _ => old,
                    }
                }
            };
            if sweep && fs::remove_dir_all(&dir).is_ok() {
                swept.push(dir);
            }
        }
        swept
    }
}
