//! The per-user cache of MKL files and when a part of it counts as
//! complete: where the cache is, what a part is, its stamp (written last,
//! matched against the files on disk) and lock, and whether a missing part
//! may be fetched (under its lock) or the build stops with help.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use crate::Result;
use crate::fetch::fetch;
use crate::locks;
use crate::pins::{MKL_INCLUDE, MKL_VERSION, Wheel};

/// One part of the cache: files unpacked from one wheel into one folder,
/// complete only when its stamp (written last) matches the files on disk.
pub struct Part {
    pub wheel: &'static Wheel,
    pub dir: &'static str,
    /// File names under the wheel's `data/lib/` (`data/Library/bin/` and
    /// `data/Library/lib/` in a Windows wheel); empty means every `mkl*.h`
    /// under `data/include/`.
    pub files: Vec<String>,
}

impl Part {
    pub fn headers() -> Self {
        Part {
            wheel: &MKL_INCLUDE,
            dir: "include",
            files: Vec::new(),
        }
    }

    pub fn libs(wheel: &'static Wheel, dir: &'static str, files: &[&str]) -> Self {
        Part {
            wheel,
            dir,
            files: files.iter().map(|f| f.to_string()).collect(),
        }
    }

    fn id(&self) -> &str {
        self.files.first().map_or("headers", String::as_str)
    }

    pub fn stamp(&self, cache: &Path) -> PathBuf {
        cache
            .join(self.dir)
            .join(format!(".complete-{}", self.id()))
    }

    /// The lock a fetch of this part holds (`locks`), beside its stamp.
    pub fn lock(&self, cache: &Path) -> PathBuf {
        cache.join(self.dir).join(format!(".lock-{}", self.id()))
    }
}

fn offline() -> bool {
    let set = |var: &str, on: &[&str]| env::var(var).is_ok_and(|v| on.contains(&v.trim()));
    set("MKL_ALLOC_NO_DOWNLOAD", &["1", "true", "yes"]) || set("CARGO_NET_OFFLINE", &["true", "1"])
}

pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = env::var_os("MKL_ALLOC_CACHE").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let base = env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or("mkl-alloc: neither MKL_ALLOC_CACHE, XDG_CACHE_HOME nor HOME is set")?;
    Ok(base.join("mkl-alloc").join(MKL_VERSION))
}

/// The stamp of a complete part: the wheel, then every file with its size.
pub fn stamp_text(part: &Part, dir: &Path, files: &[String]) -> Result<String> {
    let mut text = format!("{} {}\n", part.wheel.file, part.wheel.sha256);
    for file in files {
        let path = dir.join(file);
        let len = fs::metadata(&path)
            .map_err(|e| format!("mkl-alloc: {}: {e}", path.display()))?
            .len();
        text += &format!("{file} {len}\n");
    }
    Ok(text)
}

fn is_complete(part: &Part, cache: &Path) -> bool {
    let Ok(stamp) = fs::read_to_string(part.stamp(cache)) else {
        return false;
    };
    let mut lines = stamp.lines();
    let wheel = format!("{} {}", part.wheel.file, part.wheel.sha256);
    if lines.next() != Some(wheel.as_str()) {
        return false;
    }
    let dir = cache.join(part.dir);
    let mut listed = 0;
    for line in lines {
        let Some((file, len)) = line.rsplit_once(' ') else {
            return false;
        };
        let on_disk = fs::metadata(dir.join(file)).map(|m| m.len().to_string());
        if on_disk.ok().as_deref() != Some(len) {
            return false;
        }
        listed += 1;
    }
    listed > 0
        && part
            .files
            .iter()
            .all(|f| stamp.contains(&format!("\n{f} ")))
}

/// Makes every part complete in the cache (fetching what is missing) and
/// returns the cache folder.
pub fn ensure(parts: &[Part], what: &str) -> Result<PathBuf> {
    let cache = cache_dir()?;
    let missing: Vec<&Part> = parts.iter().filter(|p| !is_complete(p, &cache)).collect();
    if !missing.is_empty() {
        if offline() {
            return Err(not_found_help(&cache, what, "fetching is turned off"));
        }
        // Under the parts' locks: a build that waited for another's fetch
        // finds the stamps written and fetches nothing.
        locks::fetch_missing(
            &missing,
            |part| part.lock(&cache),
            |part| is_complete(part, &cache),
            |still| fetch(&cache, still, what),
        )
        .map_err(|e| format!("{e}\n{}", not_found_help(&cache, what, "the fetch failed")))?;
    }
    for part in parts {
        // A deleted or replaced part must re-run this script.
        println!("cargo:rerun-if-changed={}", part.stamp(&cache).display());
    }
    Ok(cache)
}

fn not_found_help(cache: &Path, what: &str, why: &str) -> String {
    let (wheels, pkg) = if what.starts_with("mkl-rt") {
        ("mkl, intel-openmp and mkl-include", "mkl-sdl")
    } else if what.contains("static") {
        ("mkl-static, mkl-include (and intel-openmp for iomp)", what)
    } else {
        ("mkl, mkl-include (and intel-openmp for iomp)", what)
    };
    format!(
        "mkl-alloc: Intel oneMKL ({what}) was not found and {why}.\n\
         Provide MKL in one of these ways, then build again:\n\
         - set MKLROOT to an MKL installation (lib/ and include/mkl.h);\n\
         - make `pkg-config {pkg}` find one (PKG_CONFIG_PATH);\n\
         - `python3 -m pip download --no-deps` the {MKL_VERSION} wheels {wheels} \
         (e.g. mkl-static=={MKL_VERSION}), unzip them into one directory and set MKLROOT to it;\n\
         - or allow the build to fetch them (unset MKL_ALLOC_NO_DOWNLOAD and CARGO_NET_OFFLINE) \
         with a python3 that has pip (Debian's needs python3-pip; PYTHON=/path/to/python picks \
         another); the cache is {}.",
        cache.display()
    )
}
