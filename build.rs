//! Build-time provisioning of Intel oneMKL.
//!
//! 1. Look for MKL exactly as `intel-mkl-src` does (pkg-config, `$MKLROOT`,
//!    `/opt/intel`, through the `intel-mkl-tool` crate). If one is found,
//!    `intel-mkl-src` links it and there is nothing left to do here.
//! 2. Otherwise use (or create) a per-user cache holding the three static
//!    archives and the headers from the pinned `mkl-static` / `mkl-include`
//!    wheels, fetched once with `python3 -m pip download` (so the user's own
//!    index and proxy settings apply) and checked against pinned sha256s.
//! 3. Either way, check the prototypes `src/ffi.rs` binds against the
//!    `mkl_service.h` of the MKL that is linked.
//!
//! Environment: `MKL_ALLOC_CACHE` (cache directory), `MKL_ALLOC_NO_DOWNLOAD=1`
//! or `CARGO_NET_OFFLINE=true` (never fetch).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

const MKL_VERSION: &str = "2026.2.0";

struct Wheel {
    project: &'static str,
    file: &'static str,
    sha256: &'static str,
}

const WHEELS: [Wheel; 2] = [
    Wheel {
        project: "mkl-static",
        file: "mkl_static-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
        sha256: "090e439bf202b45579c75d2ba50ff7ead05752d553a06aba79c3ed2b5247921b",
    },
    Wheel {
        project: "mkl-include",
        file: "mkl_include-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
        sha256: "889cc72057a1671fee1e9a8beb2fc4e0d222ba78c08b6d69584dae03fbec4822",
    },
];

/// What the link needs, in link order (LP64 interface, sequential threading).
const LIBS: [&str; 3] = ["mkl_intel_lp64", "mkl_sequential", "mkl_core"];

/// Written last into a complete cache; its absence means a half-written one.
const STAMP: &str = "mkl-alloc-complete";

/// The prototypes `src/ffi.rs` binds, as `mkl_service.h` spells them
/// (whitespace-insensitive). A mismatch is a build error, not a segfault.
const PROTOTYPES: [&str; 10] = [
    "void* MKL_malloc(size_t size, int align);",
    "void* MKL_calloc(size_t num, size_t size, int align);",
    "void* MKL_realloc(void *ptr, size_t size);",
    "void MKL_free(void *ptr);",
    "MKL_INT64 MKL_Mem_Stat(int* nbuffers);",
    "MKL_INT64 MKL_Peak_Mem_Usage(int reset);",
    "void MKL_Free_Buffers(void);",
    "void MKL_Thread_Free_Buffers(void);",
    "int MKL_Disable_Fast_MM(void);",
    "int MKL_Set_Memory_Limit(int mem_type, size_t limit);",
];

type Result<T> = std::result::Result<T, String>;

fn main() {
    for var in [
        "MKLROOT",
        "PKG_CONFIG_PATH",
        "MKL_ALLOC_CACHE",
        "MKL_ALLOC_NO_DOWNLOAD",
        "CARGO_NET_OFFLINE",
        "XDG_CACHE_HOME",
        "HOME",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    if let Err(message) = provision() {
        for line in message.lines() {
            println!("cargo::error={line}");
        }
    }
}

fn provision() -> Result<()> {
    let config = intel_mkl_tool::Config::from_str("mkl-static-lp64-seq")
        .map_err(|e| format!("mkl-alloc: bad MKL config: {e}"))?;
    if let Ok(lib) = intel_mkl_tool::Library::new(config) {
        // intel-mkl-src finds the same library and emits the link lines.
        return check_prototypes(&lib.include_dir.join("mkl_service.h"));
    }

    let cache = cache_dir()?;
    if !is_complete(&cache) {
        if offline() {
            return Err(not_found_help(&cache, "fetching is turned off"));
        }
        fetch_into(&cache)
            .map_err(|e| format!("{e}\n{}", not_found_help(&cache, "the fetch failed")))?;
    }
    check_prototypes(&cache.join("include").join("mkl_service.h"))?;

    // A deleted or replaced cache must re-run this script.
    println!("cargo:rerun-if-changed={}", cache.join(STAMP).display());
    println!(
        "cargo:rustc-link-search=native={}",
        cache.join("lib").display()
    );
    // `-bundle`: linked from the cache at the final link (which pulls only
    // the objects used), not copied (600 MB) into this crate's rlib.
    for lib in LIBS {
        println!("cargo:rustc-link-lib=static:-bundle={lib}");
    }
    Ok(())
}

fn offline() -> bool {
    let set = |var: &str, on: &[&str]| env::var(var).is_ok_and(|v| on.contains(&v.trim()));
    set("MKL_ALLOC_NO_DOWNLOAD", &["1", "true", "yes"]) || set("CARGO_NET_OFFLINE", &["true", "1"])
}

fn cache_dir() -> Result<PathBuf> {
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

/// The stamp names every archive with its size: a cache whose stamp is
/// missing, or whose files do not match it, is half-written.
fn stamp_text(cache: &Path) -> Result<String> {
    let mut text = format!("mkl {MKL_VERSION}\n");
    for wheel in &WHEELS {
        text += &format!("{} {}\n", wheel.file, wheel.sha256);
    }
    for lib in LIBS {
        let path = cache.join("lib").join(format!("lib{lib}.a"));
        let len = fs::metadata(&path)
            .map_err(|e| format!("mkl-alloc: {}: {e}", path.display()))?
            .len();
        text += &format!("lib{lib}.a {len}\n");
    }
    Ok(text)
}

fn is_complete(cache: &Path) -> bool {
    let Ok(stamp) = fs::read_to_string(cache.join(STAMP)) else {
        return false;
    };
    cache.join("include").join("mkl.h").is_file()
        && stamp_text(cache).is_ok_and(|expected| expected == stamp)
}

fn fetch_into(cache: &Path) -> Result<()> {
    let parent = cache
        .parent()
        .ok_or_else(|| format!("mkl-alloc: cache {} has no parent", cache.display()))?;
    fs::create_dir_all(parent)
        .map_err(|e| format!("mkl-alloc: cannot create {}: {e}", parent.display()))?;
    // Work in a private directory and rename it into place at the end, so a
    // killed build leaves debris that is never mistaken for a cache.
    let name = cache.file_name().unwrap_or_default().to_string_lossy();
    let work = parent.join(format!(".{name}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let wheels = work.join("wheels");
    fs::create_dir_all(&wheels).map_err(|e| format!("mkl-alloc: {}: {e}", wheels.display()))?;

    println!(
        "cargo:warning=mkl-alloc: no MKL found (pkg-config, MKLROOT, /opt/intel); fetching \
         mkl-static and mkl-include {MKL_VERSION} with pip (about 250 MB, once) into {}",
        cache.display()
    );
    let requirements = work.join("requirements.txt");
    let pins: String = WHEELS
        .iter()
        .map(|w| format!("{}=={MKL_VERSION} --hash=sha256:{}\n", w.project, w.sha256))
        .collect();
    fs::write(&requirements, pins).map_err(|e| format!("mkl-alloc: {e}"))?;
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args([
            "--platform",
            "manylinux_2_28_x86_64",
            "--require-hashes",
            "-d",
        ])
        .arg(&wheels)
        .arg("-r")
        .arg(&requirements)
        .status()
        .map_err(|e| format!("mkl-alloc: cannot run `{python} -m pip`: {e}"))?;
    if !status.success() {
        return Err(format!(
            "mkl-alloc: `{python} -m pip download` failed ({status})"
        ));
    }

    // Verify (again: pip did too) and unpack only what the link needs.
    let script = r#"
import hashlib, os, shutil, sys, zipfile
wheels, out, libs = sys.argv[1], sys.argv[2], set(sys.argv[3].split(','))
for arg in sys.argv[4:]:
    name, want = arg.split('=')
    path = os.path.join(wheels, name)
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    if h.hexdigest() != want:
        sys.exit(f'{name}: sha256 {h.hexdigest()} is not the pinned {want}')
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            base = info.filename.rsplit('/', 1)[-1]
            if '/data/lib/' in info.filename and base in libs:
                dest = os.path.join(out, 'lib', base)
            elif '/data/include/' in info.filename and base.startswith('mkl') and base.endswith('.h'):
                dest = os.path.join(out, 'include', base)
            else:
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, 'wb') as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
"#;
    let lib_files: Vec<String> = LIBS.iter().map(|l| format!("lib{l}.a")).collect();
    let status = Command::new(&python)
        .args(["-c", script])
        .arg(&wheels)
        .arg(&work)
        .arg(lib_files.join(","))
        .args(WHEELS.iter().map(|w| format!("{}={}", w.file, w.sha256)))
        .status()
        .map_err(|e| format!("mkl-alloc: cannot run {python}: {e}"))?;
    if !status.success() {
        let _ = fs::remove_dir_all(&work);
        return Err(format!(
            "mkl-alloc: verifying or unpacking the wheels failed ({status})"
        ));
    }
    fs::remove_dir_all(&wheels).map_err(|e| format!("mkl-alloc: {e}"))?;
    let _ = fs::remove_file(&requirements);
    let stamp = stamp_text(&work)?;
    fs::write(work.join(STAMP), stamp).map_err(|e| format!("mkl-alloc: {e}"))?;

    // Replace a half-written cache; lose gracefully to a concurrent build.
    if cache.exists() && !is_complete(cache) {
        let _ = fs::remove_dir_all(cache);
    }
    if let Err(e) = fs::rename(&work, cache) {
        let _ = fs::remove_dir_all(&work);
        if !is_complete(cache) {
            return Err(format!(
                "mkl-alloc: cannot move the unpacked MKL to {}: {e}",
                cache.display()
            ));
        }
    }
    println!(
        "cargo:warning=mkl-alloc: MKL {MKL_VERSION} is ready in {}",
        cache.display()
    );
    Ok(())
}

fn check_prototypes(header: &Path) -> Result<()> {
    println!("cargo:rerun-if-changed={}", header.display());
    let text = fs::read_to_string(header)
        .map_err(|e| format!("mkl-alloc: cannot read {}: {e}", header.display()))?;
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    let text = squash(&text);
    for proto in PROTOTYPES {
        if !text.contains(&squash(proto)) {
            return Err(format!(
                "mkl-alloc: {} does not declare `{proto}`, which src/ffi.rs binds; \
                 this MKL is not supported",
                header.display()
            ));
        }
    }
    Ok(())
}

fn not_found_help(cache: &Path, why: &str) -> String {
    format!(
        "mkl-alloc: Intel oneMKL was not found and {why}.\n\
         Provide MKL in one of these ways, then build again:\n\
         - set MKLROOT to an MKL installation that has lib/libmkl_core.a and include/mkl.h;\n\
         - make `pkg-config mkl-static-lp64-seq` find one (PKG_CONFIG_PATH);\n\
         - `python3 -m pip download --no-deps mkl-static=={MKL_VERSION} mkl-include=={MKL_VERSION}`, \
         unzip both wheels into one directory and set MKLROOT to it;\n\
         - or allow the build to fetch them (unset MKL_ALLOC_NO_DOWNLOAD and CARGO_NET_OFFLINE); \
         the cache is {}.",
        cache.display()
    )
}
