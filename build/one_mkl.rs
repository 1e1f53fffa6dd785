//! Whether a static build would link two MKLs: intel-mkl-src's ocipkg
//! fallback (MKL 2020.1) beside ours. Such a build stops, saying how to
//! resolve it; an override of intel-mkl-src's build script makes this
//! script the one that links every MKL. All of this only with the
//! `intel-mkl-src` feature: without it (the default) intel-mkl-src is not
//! this crate's dependency, its build script does not run for it, and this
//! script links MKL alone.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use crate::Result;
use crate::cache::cache_dir;

/// The metadata key of a `[target.<triple>.mkl_core]` override that tells
/// this script intel-mkl-src's build script was replaced (and so links no MKL).
const OVERRIDE_KEY: &str = "provided-by";

/// Whether intel-mkl-src is this crate's dependency: the `intel-mkl-src`
/// feature, for a graph that has it anyway (ndarray-linalg & co.). Its build
/// script then runs before this one, with this crate's configuration.
pub fn intel_mkl_src_in_graph() -> bool {
    env::var_os("CARGO_FEATURE_INTEL_MKL_SRC").is_some()
}

/// Whether intel-mkl-src's build script runs and may emit link lines: it is
/// a dependency (`intel_mkl_src_in_graph`) and not overridden with
/// `provided-by = "mkl-alloc"` (cargo then passes `DEP_MKL_CORE_PROVIDED_BY`).
/// When false, this script emits every link line.
pub fn intel_mkl_src_links() -> bool {
    if !intel_mkl_src_in_graph() {
        return false;
    }
    println!("cargo:rerun-if-env-changed=DEP_MKL_CORE_PROVIDED_BY");
    !env::var("DEP_MKL_CORE_PROVIDED_BY").is_ok_and(|v| v == "mkl-alloc")
}

/// The folders where intel-mkl-src 0.8's fallback keeps (and from where it
/// links) the MKL 2020.1 it downloads with ocipkg for a static
/// configuration: `<data>/ocipkg/<registry>/rust-math/rust-mkl/linux/<config>/__<tag>`,
/// `<data>` being `$XDG_DATA_HOME` (if absolute) or `~/.local/share`, as
/// ocipkg computes it. Any registry and tag folder counts; returns those
/// that hold a static library (ocipkg links every `lib*.a` there).
fn ocipkg_mkls(config: intel_mkl_tool::Config) -> Vec<PathBuf> {
    // Read only here: a default build does not depend on it.
    println!("cargo:rerun-if-env-changed=XDG_DATA_HOME");
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
pub fn one_mkl(config: intel_mkl_tool::Config, ours: &str) -> Result<()> {
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
         - removing {theirs} alone helps only where intel-mkl-src cannot download it again;\n\
         - if nothing else in the graph depends on intel-mkl-src, drop mkl-alloc's \
         `intel-mkl-src` feature: mkl-alloc then links its MKL alone."
    ))
}
