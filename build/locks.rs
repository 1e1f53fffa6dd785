//! Who may write a part of the cache, and when: a fetch holds the part's
//! lock from the check of its stamp to the new stamp, and no stamp is ever
//! removed. Also how the cache's lock files are opened and taken.
//!
//! The cache is shared by concurrent builds (cargo runs several build
//! scripts at once; other checkouts, other hosts on an NFS home). Before
//! these locks, two builds that found a part missing both fetched it, and
//! the second removed the stamp the first had written while it renamed
//! identical files into place: an offline build in that window found the
//! part incomplete and failed. Now:
//! - a build that finds parts missing takes their locks (exclusive,
//!   waiting, in path order, so that two builds never wait for each other),
//!   checks their stamps again, and fetches only what is still missing: a
//!   build that waited for another's fetch of the same part fetches nothing;
//! - a part is installed under its lock, files first and stamp last, and
//!   the new stamp replaces the old one by a rename: a stamp that matches
//!   its files keeps matching throughout (see [`install`]).
//!
//! An offline build takes no lock: it only reads stamps, and a complete
//! part stays complete while any fetch runs. Lock files
//! (`<part folder>/.lock-<first file>`, empty) stay in place, also after a
//! failed fetch: removing one while another build waits on it would let a
//! third create and lock a new file, and two builds would hold "the" lock.
//!
//! Locks are `flock`s, which belong to the open file and so are dropped by
//! the kernel (or the NFS lock manager) when their build exits or is
//! killed. On a Windows host they are `LockFileEx` locks of the whole
//! file, which belong to the handle and are dropped the same way (the lock
//! files are empty and never written, so the locks' being mandatory does
//! not matter). Lock files are opened read-write, so that `flock` also works
//! where it is emulated with POSIX locks (NFS). Where locks are local to
//! each host (NFS's `local_lock=flock`), fetches on two hosts may overlap;
//! they still never remove a stamp.
//!
//! Compiled into the build script and into `tests/build_locks.rs` (std and
//! libc only; Unix hosts): build scripts have no test harness.

use std::fs::{self, File, OpenOptions};
use std::io;
#[cfg(unix)]
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

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
#[cfg(unix)]
pub fn try_flock(file: &File) -> bool {
    // SAFETY: flock on a file descriptor this File owns; no memory involved.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// `flock(LOCK_EX)`, waiting while another holds the lock.
#[cfg(unix)]
fn flock_wait(file: &File) -> io::Result<()> {
    // SAFETY: flock on a file descriptor this File owns; no memory involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An exclusive `LockFileEx` of the whole file, without waiting: whether
/// this process now holds the lock.
#[cfg(windows)]
pub fn try_flock(file: &File) -> bool {
    use windows_sys::Win32::Storage::FileSystem::LOCKFILE_FAIL_IMMEDIATELY;
    lock_file_ex(file, LOCKFILE_FAIL_IMMEDIATELY).is_ok()
}

/// An exclusive `LockFileEx` of the whole file, waiting while another
/// holds it.
#[cfg(windows)]
fn flock_wait(file: &File) -> io::Result<()> {
    lock_file_ex(file, 0)
}

#[cfg(windows)]
fn lock_file_ex(file: &File, extra_flags: u32) -> io::Result<()> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{LOCKFILE_EXCLUSIVE_LOCK, LockFileEx};
    use windows_sys::Win32::System::IO::OVERLAPPED;
    // SAFETY: an all-zero OVERLAPPED is a valid one (offset 0, no event).
    let mut overlapped: OVERLAPPED = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is this File's, open for the call; the range is
    // the whole file; `overlapped` lives through the call, which is
    // synchronous (the file is not opened for overlapped I/O).
    let ok = unsafe {
        LockFileEx(
            file.as_raw_handle(),
            LOCKFILE_EXCLUSIVE_LOCK | extra_flags,
            0,
            u32::MAX,
            u32::MAX,
            &mut overlapped,
        )
    };
    if ok != 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Takes the lock at `path` (creating the file and its folder), waiting
/// while another build holds it; held until the returned file is dropped.
pub fn lock_wait(path: &Path) -> Result<File, String> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)
            .map_err(|e| format!("mkl-alloc: cannot create {}: {e}", dir.display()))?;
    }
    let file = open_lock(path, true).map_err(|e| {
        format!(
            "mkl-alloc: cannot open the lock file {}: {e}",
            path.display()
        )
    })?;
    loop {
        let Err(e) = flock_wait(&file) else {
            return Ok(file);
        };
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(format!(
                "mkl-alloc: cannot lock {} (builds hold it while they fetch that part \
                 of the cache): {e}",
                path.display()
            ));
        }
    }
}

/// Fetches the parts in `missing` (found without their stamps) under their
/// locks: takes every part's lock in path order, checks each stamp again,
/// and calls `fetch` with the parts still missing, if any. The locks are
/// held until `fetch` has returned, so its installs and stamps are done.
pub fn fetch_missing<T>(
    missing: &[&T],
    lock_path: impl Fn(&T) -> PathBuf,
    is_complete: impl Fn(&T) -> bool,
    fetch: impl FnOnce(&[&T]) -> Result<(), String>,
) -> Result<(), String> {
    let mut paths: Vec<PathBuf> = missing.iter().map(|part| lock_path(part)).collect();
    paths.sort();
    paths.dedup();
    let _held = paths
        .iter()
        .map(|path| lock_wait(path))
        .collect::<Result<Vec<File>, String>>()?;
    // Another build may have completed some while this one waited.
    let still: Vec<&T> = missing
        .iter()
        .copied()
        .filter(|part| !is_complete(part))
        .collect();
    if still.is_empty() {
        return Ok(());
    }
    fetch(&still)
}

/// Moves a part's unpacked files into its folder `dir` (renames within the
/// cache), then writes its stamp with `stamp_text(files)`: a part is never
/// seen complete before it is. Called with the part's lock held.
///
/// No stamp is removed: the new one is written under a temporary name and
/// renamed over the old. The files renamed over an earlier install's are
/// the same pinned wheel's, so a stamp that matched keeps matching
/// throughout, and an old one that did not (a part cut short) matches only
/// once every file it lists is whole.
pub fn install(
    unpacked: &Path,
    dir: &Path,
    stamp: &Path,
    stamp_text: impl FnOnce(&[String]) -> Result<String, String>,
) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("mkl-alloc: {}: {e}", dir.display()))?;
    let mut files: Vec<String> = fs::read_dir(unpacked)
        .map_err(|e| format!("mkl-alloc: {}: {e}", unpacked.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    for file in &files {
        fs::rename(unpacked.join(file), dir.join(file))
            .map_err(|e| format!("mkl-alloc: cannot move {file} into {}: {e}", dir.display()))?;
    }
    let text = stamp_text(&files)?;
    let tmp = dir.join(format!(".stamp-{}", std::process::id()));
    fs::write(&tmp, text).map_err(|e| format!("mkl-alloc: {}: {e}", tmp.display()))?;
    fs::rename(&tmp, stamp).map_err(|e| format!("mkl-alloc: {}: {e}", stamp.display()))
}
