//! How the cache's lock files are opened and taken: read-write, so that the
//! lock works where `flock` is emulated with POSIX locks (NFS), and with
//! `flock`, whose lock belongs to the open file and so is dropped by the
//! kernel (or the NFS lock manager) when its build exits or is killed.
//!
//! Compiled into the build script and into `tests/build_locks.rs` (std and
//! libc only): build scripts have no test harness.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Opens a lock file for reading and writing, creating it if `create`.
///
/// Read-write, not read-only: the Linux NFS client emulates `flock` with a
/// POSIX (`fcntl`) write lock, which needs a file opened for writing. On a
/// read-only file every try fails (`EBADF`), as if someone held the lock.
pub fn open_lock(path: &Path, create: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)
}

/// `flock(LOCK_EX | LOCK_NB)`: whether this process now holds the lock.
pub fn try_flock(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor this File owns; no memory involved.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}
