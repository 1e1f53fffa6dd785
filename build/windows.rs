//! Provisioning for a Windows target (`CARGO_CFG_TARGET_OS=windows`),
//! whatever the host: a cross-build on Linux runs this script on Linux.
//!
//! - `mkl-rt`: `mkl_rt.3.dll` and what it loads, from an installed MKL
//!   (`$MKLROOT` with `bin/` or `redist/intel64/`) or the cache's parts of
//!   the pinned win_amd64 wheels, linked through the folder of links. The
//!   GNU target links against the DLL itself (`-lmkl_rt.3`), the MSVC
//!   target against the import library `mkl_rt.lib` from `mkl-devel`.
//! - The eight configurations follow intel-mkl-src on Windows: an installed
//!   MKL that `intel-mkl-tool` finds. The cache holds no Windows files for
//!   them. A static one on the GNU target is refused: MKL's static libraries
//!   are MSVC's, and mingw links them only with CRT shims and
//!   `--allow-multiple-definition`.

use std::env;
use std::path::{Path, PathBuf};

use crate::Result;
use crate::cache::{self, Part};
use crate::link::{link_farm, report_lib_dir};
use crate::pins::{INTEL_OPENMP_WIN, MKL_DEVEL_WIN, MKL_DYNAMIC_WIN, WINDOWS_RUNTIME};
use crate::prototypes;

/// Whether the crate is being built for Windows.
pub fn target_is_windows() -> bool {
    env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "windows")
}

fn target_is_msvc() -> bool {
    env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|e| e == "msvc")
}

/// Links `mkl_rt.3.dll` for a Windows target.
pub fn provision_rt() -> Result<()> {
    let msvc = target_is_msvc();
    let (lib_dir, include_dir) = match installed_rt(msvc) {
        Some(found) => found,
        None => {
            let mut parts = vec![
                Part::headers(),
                Part::libs(&MKL_DYNAMIC_WIN, "windows", &WINDOWS_RUNTIME),
                Part::libs(&INTEL_OPENMP_WIN, "windows", &["libiomp5md.dll"]),
            ];
            if msvc {
                parts.push(Part::libs(&MKL_DEVEL_WIN, "windows", &["mkl_rt.lib"]));
            }
            let cache = cache::ensure(&parts, "mkl-rt (Windows)")?;
            (cache.join("windows"), cache.join("include"))
        }
    };
    prototypes::check(&include_dir.join("mkl_service.h"))?;
    report_lib_dir(&lib_dir);
    let dir = link_farm(&lib_dir)?;
    // Beside MKL's DLLs, where the crate's setup looks for it (see imalloc).
    crate::imalloc::provide(&dir)?;
    println!("cargo:rustc-link-search=native={}", dir.display());
    if msvc {
        println!("cargo:rustc-link-lib=dylib=mkl_rt");
    } else {
        println!("cargo:rustc-link-lib=dylib=mkl_rt.3");
    }
    Ok(())
}

/// An installed MKL for Windows under `$MKLROOT`: the folder holding
/// `mkl_rt.3.dll` (and, for MSVC, `lib/mkl_rt.lib` beside it in the
/// folder of links), and its headers. oneAPI installs put the DLLs in
/// `bin/` (older ones in `redist/intel64/`), the wheels in `Library/bin/`.
fn installed_rt(msvc: bool) -> Option<(PathBuf, PathBuf)> {
    let root = PathBuf::from(env::var_os("MKLROOT")?);
    let inc = [root.join("include"), root.join("Library").join("include")]
        .into_iter()
        .find(|d| d.join("mkl_service.h").is_file())?;
    let has = |dir: &Path, f: &str| dir.join(f).is_file();
    let bins = [
        root.join("bin"),
        root.join("redist").join("intel64"),
        root.join("Library").join("bin"),
    ];
    let bin = bins.into_iter().find(|d| has(d, "mkl_rt.3.dll"))?;
    // The MSVC linker needs the import library; the folder of links takes
    // one folder, so only a layout with both in one folder is used as is.
    if msvc && !has(&bin, "mkl_rt.lib") {
        return None;
    }
    Some((bin, inc))
}

/// One of intel-mkl-src's configurations for a Windows target: refuses the
/// static ones on the GNU target; otherwise `Ok(())` (the configuration
/// goes on as intel-mkl-src does).
pub fn check_config(config: intel_mkl_tool::Config) -> Result<()> {
    use intel_mkl_tool::LinkType;
    if config.link == LinkType::Static && !target_is_msvc() {
        return Err(format!(
            "mkl-alloc: {config} is not available for the GNU Windows target: MKL's static \
             libraries are built for the MSVC toolchain, and the GNU linker takes them only \
             with workarounds not fit to ship.\n\
             Use the x86_64-pc-windows-msvc target for a static MKL (found as intel-mkl-src \
             finds it: MKLROOT), or the feature mkl-rt (`default-features = false, \
             features = [\"mkl-rt\"]`), which this build provisions for Windows."
        ));
    }
    Ok(())
}

/// Why a configuration without an installed MKL cannot be provisioned for
/// Windows.
pub fn no_cache_for_config(config: intel_mkl_tool::Config) -> String {
    format!(
        "mkl-alloc: Intel oneMKL ({config}) was not found for Windows. For Windows the \
         configurations use an installed MKL, found as intel-mkl-src finds it (set MKLROOT \
         to an oneMKL installation); mkl-alloc provisions only mkl-rt for Windows (the \
         feature mkl-rt, with `default-features = false`)."
    )
}
