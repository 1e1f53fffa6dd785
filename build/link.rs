//! What the linker and dependents are told: the link lines of a
//! configuration, the folder of links dynamic modes link through, and the
//! library folder reported to dependents' build scripts.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use crate::Result;

/// Tells dependents' build scripts (`DEP_MKL_ALLOC_LIB_DIR`) where the
/// dynamic MKL libraries are, e.g. to give a binary an rpath to them.
pub fn report_lib_dir(dir: &Path) {
    println!("cargo::metadata=lib_dir={}", dir.display());
}

/// The link lines of a configuration, its libraries searched in `dirs`.
pub fn emit_links(config: intel_mkl_tool::Config, dirs: &[PathBuf]) {
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

/// A folder in `OUT_DIR` with a link to every MKL / OpenMP library of `dir`,
/// plus the unversioned name (`libmkl_core.so` for `libmkl_core.so.3`) the
/// linker looks for. Being inside the target directory, cargo puts it on the
/// library path when it runs a dependent's binaries and tests (`PATH` on
/// Windows, which is where Windows looks for DLLs).
///
/// Windows libraries (`mkl_*.dll`, `libiomp5md.dll`, `mkl_rt.lib`) keep
/// their names: the GNU linker's `-lmkl_rt.3` finds `mkl_rt.3.dll`. The
/// links are symbolic where the build runs on Unix (a cross-build for
/// Windows included: wine follows them), and hard links, or copies where
/// the cache is on another volume, where it runs on Windows (which needs a
/// privilege for symbolic links).
pub fn link_farm(dir: &Path) -> Result<PathBuf> {
    let out = PathBuf::from(env::var_os("OUT_DIR").ok_or("mkl-alloc: OUT_DIR is not set")?)
        .join("mkl-lib");
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).map_err(|e| format!("mkl-alloc: {}: {e}", out.display()))?;
    let entries = fs::read_dir(dir).map_err(|e| format!("mkl-alloc: {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let unix =
            (name.starts_with("libmkl_") || name.starts_with("libiomp")) && name.contains(".so");
        let windows = (name.starts_with("mkl_") || name.starts_with("libiomp5md"))
            && (name.ends_with(".dll") || name.ends_with(".lib"));
        if !unix && !windows {
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
                place(&target, &link).map_err(|e| format!("mkl-alloc: {}: {e}", link.display()))?;
            }
        }
    }
    println!("cargo:rerun-if-changed={}", dir.display());
    Ok(out)
}

/// `link` made to stand for `target`: a symbolic link on a Unix host.
#[cfg(unix)]
fn place(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// `link` made to stand for `target`: a hard link, or a copy across volumes.
#[cfg(not(unix))]
fn place(target: &Path, link: &Path) -> std::io::Result<()> {
    fs::hard_link(target, link).or_else(|_| fs::copy(target, link).map(|_| ()))
}
