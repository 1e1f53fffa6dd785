//! Provisioning for `mkl-rt`, the single dynamic library `libmkl_rt`: an
//! installed one (pkg-config `mkl-sdl`, `$MKLROOT`, the build's Python
//! environment), else the cache's; linked through the folder of links.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Result;
use crate::cache::{self, Part};
use crate::fetch::python;
use crate::link::{link_farm, report_lib_dir};
use crate::pins::{DYNAMIC_RUNTIME, INTEL_OPENMP, MKL_DYNAMIC};
use crate::prototypes;

pub fn provision() -> Result<()> {
    let (lib_dir, include_dir) = match find_installed_rt() {
        Some(found) => found,
        None => {
            let parts = [
                Part::headers(),
                Part::libs(&MKL_DYNAMIC, "dynamic", &DYNAMIC_RUNTIME),
                Part::libs(&INTEL_OPENMP, "dynamic", &["libiomp5.so"]),
            ];
            let cache = cache::ensure(&parts, "mkl-rt")?;
            (cache.join("dynamic"), cache.join("include"))
        }
    };
    prototypes::check(&include_dir.join("mkl_service.h"))?;
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
    let cache = cache::ensure(&[Part::headers()], "mkl-rt (headers)").ok()?;
    Some((lib, cache.join("include")))
}
