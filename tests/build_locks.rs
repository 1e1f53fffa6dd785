//! The build script's cache locks and work-folder sweep (build/locks.rs,
//! build/workdir.rs), compiled here with std and libc only: build scripts
//! have no test harness. Threads play concurrent builds (`flock`s of two
//! opens conflict within one process too). Temporary folders live in
//! cargo's `CARGO_TARGET_TMPDIR`.
//!
//! Unix only: the locks are `flock`s and the sweep reads `/proc`, the build
//! script's code for a Unix host (a cross-build for Windows runs it on Linux).
#![cfg(unix)]

#[allow(dead_code)]
#[path = "../build/locks.rs"]
mod locks;
#[allow(dead_code)]
#[path = "../build/workdir.rs"]
mod workdir;

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant, SystemTime};

use locks::open_lock;
use workdir::{Owner, Sweep, WorkDir, pid_alive};

/// A folder of its own per test, emptied first and removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("build_locks")
            .join(name);
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// NFS's `flock` as the Linux client emulates it (without `local_lock`): a
/// whole-file POSIX write lock, which needs the file open for writing. The
/// open-file-description flavour (`F_OFD_SETLK`) has the same need and,
/// like `flock`, conflicts between two opens in one process, which lets a
/// single test process play both builds.
fn posix_write_lock(file: &File) -> bool {
    let lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0, // to the end: the whole file
        l_pid: 0, // required for OFD locks
    };
    // SAFETY: fcntl on a descriptor this File owns, reading a flock struct
    // that lives across the call.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) == 0 }
}

/// A PID no process has: a child that has exited and been waited for.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert!(!pid_alive(pid), "PID {pid} was reused at once");
    pid
}

/// A work folder as a build leaves it: `owner` (if given) and a `lock` no
/// one holds.
fn work_folder(cache: &Path, name: &str, owner: Option<&Owner>) -> PathBuf {
    let dir = cache.join(format!(".work-{name}"));
    fs::create_dir_all(dir.join("wheels")).unwrap();
    if let Some(owner) = owner {
        fs::write(dir.join("owner"), owner.record()).unwrap();
    }
    File::create(dir.join("lock")).unwrap();
    dir
}

/// Dates the folder's last change `age` back.
fn age(dir: &Path, age: Duration) {
    let then = SystemTime::now() - age;
    File::open(dir).unwrap().set_modified(then).unwrap();
}

const TWO_DAYS: Duration = Duration::from_secs(2 * 24 * 60 * 60);

fn another_host() -> Owner {
    Owner {
        host: "otherhost".into(),
        boot: "00000000-0000-0000-0000-000000000000".into(),
        pid_ns: "pid:[1]".into(),
        pid: std::process::id(), // alive here, but that means nothing there
    }
}

#[test]
fn lock_files_are_opened_read_write_so_the_nfs_emulation_can_lock_them() {
    let scratch = Scratch::new("read_write");
    let path = scratch.0.join("lock");
    let file = open_lock(&path, true).unwrap();
    // SAFETY: F_GETFL on a descriptor this File owns.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    assert_eq!(flags & libc::O_ACCMODE, libc::O_RDWR);
    assert!(
        posix_write_lock(&file),
        "a POSIX write lock on the lock file failed"
    );
    // Opening an existing lock file (the sweep's way) does not create one.
    assert!(open_lock(&scratch.0.join("none"), false).is_err());
    assert!(open_lock(&path, false).is_ok());
}

#[test]
fn under_nfs_flock_emulation_a_dead_local_folder_is_swept() {
    let scratch = Scratch::new("nfs_dead_local");
    let owner = Owner {
        pid: dead_pid(),
        ..Owner::this()
    };
    let dead = work_folder(&scratch.0, "dead", Some(&owner));
    let nfs = Sweep {
        try_lock: posix_write_lock,
        ..Sweep::default()
    };
    assert_eq!(nfs.run(&scratch.0), vec![dead.clone()]);
    assert!(!dead.exists());
}

#[test]
fn a_dead_local_folder_is_swept_and_a_live_local_one_never() {
    let scratch = Scratch::new("local");
    let dead = work_folder(
        &scratch.0,
        "dead",
        Some(&Owner {
            pid: dead_pid(),
            ..Owner::this()
        }),
    );
    // A live local owner whose lock is free (locks that do not work here):
    // kept, even when old.
    let live = work_folder(&scratch.0, "live", Some(&Owner::this()));
    age(&live, TWO_DAYS);
    assert_eq!(Sweep::default().run(&scratch.0), vec![dead]);
    assert!(live.join("lock").exists());
}

#[test]
fn a_live_build_s_folder_is_never_swept() {
    let scratch = Scratch::new("held");
    let work = WorkDir::create(&scratch.0).unwrap();
    assert!(work.path.join("lock").exists() && work.path.join("owner").exists());
    // Its owner recorded as another host's and old: only its held lock saves it.
    fs::write(work.path.join("owner"), another_host().record()).unwrap();
    age(&work.path, TWO_DAYS);
    let sweep = Sweep {
        max_age: Duration::ZERO,
        ..Sweep::default()
    };
    assert!(sweep.run(&scratch.0).is_empty());
    let path = work.path.clone();
    drop(work);
    assert!(!path.exists(), "a work folder outlived its fetch");
}

#[test]
fn another_host_s_folder_with_a_free_lock_goes_only_when_old() {
    // With NFS's local_lock=flock, another host's live build's lock can be
    // taken here: its folder is kept while it is recent.
    let scratch = Scratch::new("remote");
    let recent = work_folder(&scratch.0, "recent", Some(&another_host()));
    let old = work_folder(&scratch.0, "old", Some(&another_host()));
    age(&old, TWO_DAYS);
    // No owner (older builds): the same.
    let anonymous = work_folder(&scratch.0, "anonymous", None);
    assert_eq!(Sweep::default().run(&scratch.0), vec![old]);
    assert!(recent.exists());
    age(&anonymous, TWO_DAYS);
    assert_eq!(Sweep::default().run(&scratch.0), vec![anonymous]);
    assert!(recent.exists());
}

#[test]
fn folders_without_a_lock_go_only_when_old_and_older_builds_folders_never() {
    let scratch = Scratch::new("no_lock");
    let young = scratch.0.join(".work-young");
    let killed = scratch.0.join(".work-killed");
    let partial = scratch.0.join(".partial-999999999");
    for dir in [&young, &killed, &partial] {
        fs::create_dir_all(dir).unwrap();
        age(dir, TWO_DAYS);
    }
    age(&young, Duration::ZERO);
    assert_eq!(Sweep::default().run(&scratch.0), vec![killed]);
    assert!(young.exists() && partial.exists());
}

#[test]
fn owner_records_read_back() {
    let here = Owner::this();
    assert_eq!(Owner::parse(&here.record()), Some(here.clone()));
    assert!(here.is_local(&here) && !another_host().is_local(&here));
    assert!(pid_alive(here.pid));
    assert_eq!(Owner::parse("host h\nboot b\npid 12\n"), None);
    assert_eq!(Owner::parse("host h\nboot b\npidns n\npid x\n"), None);
}

/// A part as the cache keeps it, for the fetch races: `FILES` files of one
/// size each, and a stamp listing them, written by `locks::install`.
struct FakePart {
    dir: PathBuf,
}

const FILES: usize = 64;

impl FakePart {
    fn stamp(&self) -> PathBuf {
        self.dir.join(".complete-x")
    }

    fn lock(&self) -> PathBuf {
        self.dir.join(".lock-x")
    }

    fn is_complete(&self) -> bool {
        let Ok(stamp) = fs::read_to_string(self.stamp()) else {
            return false;
        };
        stamp.lines().count() == FILES
            && stamp.lines().all(|line| {
                let (file, len) = line.rsplit_once(' ').unwrap();
                fs::metadata(self.dir.join(file)).is_ok_and(|m| m.len().to_string() == len)
            })
    }

    /// What a fetch does after its download (`delay`): unpack into a work
    /// folder of its own, then install; fails if the install removed the
    /// stamp of a part that was complete.
    fn fetch(&self, work: &Path, delay: Duration) -> Result<(), String> {
        std::thread::sleep(delay);
        fs::create_dir_all(work).unwrap();
        for i in 0..FILES {
            fs::write(work.join(format!("lib{i}.a")), [7u8; 100]).unwrap();
        }
        // Called after the files are in place, before the new stamp: a
        // stamp that matched before the install must still be there.
        let was_complete = self.is_complete();
        locks::install(work, &self.dir, &self.stamp(), |files| {
            if was_complete && !self.stamp().exists() {
                return Err("the install removed the stamp of a complete part".into());
            }
            Ok(files.iter().map(|f| format!("{f} 100\n")).collect())
        })
    }

    /// `cache::ensure` for this one part: the stamp checked without a lock,
    /// then `locks::fetch_missing`; returns how many fetches it ran.
    fn ensure(&self, work: &Path, delay: Duration) -> Result<usize, String> {
        let missing: Vec<&FakePart> = [self].into_iter().filter(|p| !p.is_complete()).collect();
        if missing.is_empty() {
            return Ok(0);
        }
        let mut fetches = 0;
        locks::fetch_missing(&missing, FakePart::lock, FakePart::is_complete, |still| {
            assert!(still.iter().all(|p| !p.is_complete()));
            fetches += 1;
            self.fetch(work, delay)
        })?;
        Ok(fetches)
    }
}

/// Watches the stamp from its first appearance until `done`: whether it
/// was ever missing after that.
fn watch_stamp(stamp: PathBuf, done: Arc<AtomicBool>) -> std::thread::JoinHandle<bool> {
    std::thread::spawn(move || {
        while !stamp.exists() && !done.load(SeqCst) {
            std::thread::yield_now();
        }
        let mut vanished = false;
        while !done.load(SeqCst) {
            vanished |= !stamp.exists();
            std::thread::yield_now();
        }
        vanished
    })
}

#[test]
fn concurrent_fetches_of_a_part_are_serialized_and_the_stamp_never_vanishes() {
    let scratch = Scratch::new("race");
    let part = Arc::new(FakePart {
        dir: scratch.0.join("static"),
    });
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_stamp(part.stamp(), done.clone());
    let start = Instant::now();
    // Build A fetches for 300 ms; build B finds the part missing 100 ms in,
    // while A is still downloading.
    let builds: Vec<_> = [("a", 0), ("b", 100)]
        .into_iter()
        .map(|(name, after)| {
            let part = part.clone();
            let work = scratch.0.join(format!("work-{name}"));
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(after));
                let fetches = part.ensure(&work, Duration::from_millis(300));
                (fetches, start.elapsed())
            })
        })
        .collect();
    let results: Vec<_> = builds.into_iter().map(|b| b.join().unwrap()).collect();
    done.store(true, SeqCst);
    let vanished = watcher.join().unwrap();
    let (a, b) = (&results[0], &results[1]);
    assert_eq!(a.0, Ok(1), "build A fetched once");
    assert_eq!(
        b.0,
        Ok(0),
        "build B waited for A's fetch and fetched nothing"
    );
    assert!(
        b.1 >= Duration::from_millis(300),
        "B returned before A's stamp: {b:?}"
    );
    assert!(
        !vanished,
        "the stamp of a complete part vanished during a fetch"
    );
    assert!(part.is_complete());
}

#[test]
fn an_install_over_a_complete_part_never_removes_its_stamp() {
    // Fetches that overlap anyway (locks local to each host, NFS's
    // local_lock=flock): each install keeps the stamp in place.
    let scratch = Scratch::new("reinstall");
    let part = FakePart {
        dir: scratch.0.join("static"),
    };
    part.fetch(&scratch.0.join("work"), Duration::ZERO).unwrap();
    assert!(part.is_complete());
    let done = Arc::new(AtomicBool::new(false));
    let watcher = watch_stamp(part.stamp(), done.clone());
    for round in 0..5 {
        let work = scratch.0.join(format!("work-{round}"));
        part.fetch(&work, Duration::ZERO).unwrap();
    }
    done.store(true, SeqCst);
    assert!(!watcher.join().unwrap(), "an install removed a valid stamp");
    assert!(part.is_complete());
}

#[test]
fn builds_needing_the_same_parts_in_another_order_do_not_deadlock() {
    let scratch = Scratch::new("order");
    let parts: Vec<Arc<FakePart>> = ["x", "y"]
        .iter()
        .map(|d| {
            Arc::new(FakePart {
                dir: scratch.0.join(d),
            })
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, order) in [[0, 1], [1, 0]].into_iter().enumerate() {
        let (tx, parts) = (tx.clone(), parts.clone());
        let work = scratch.0.join(format!("work-{i}"));
        std::thread::spawn(move || {
            let wanted: Vec<&FakePart> = order.iter().map(|&k| &*parts[k]).collect();
            let result =
                locks::fetch_missing(&wanted, FakePart::lock, FakePart::is_complete, |still| {
                    for (k, part) in still.iter().enumerate() {
                        part.fetch(&work.join(k.to_string()), Duration::from_millis(50))?;
                    }
                    Ok(())
                });
            tx.send(result).unwrap();
        });
    }
    for _ in 0..2 {
        let result = rx.recv_timeout(Duration::from_secs(5));
        assert_eq!(result, Ok(Ok(())), "a build is stuck waiting for a lock");
    }
    assert!(parts.iter().all(|p| p.is_complete()));
}
