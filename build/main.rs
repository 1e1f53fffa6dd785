//! Build-time provisioning of Intel oneMKL, for every way of linking it:
//! this file decides only the order; each step is a module.
//!
//! The crate's features choose the link mode (`mode`): one of intel-mkl-src's
//! eight configurations (`mkl-{static,dynamic}-{lp64,ilp64}-{seq,iomp}`), or
//! `mkl-rt`, the single dynamic library `libmkl_rt`. intel-mkl-src is in the
//! graph only with the `intel-mkl-src` feature (beside ndarray-linalg & co.),
//! which forwards the configuration to it; by default this script alone
//! provisions and links MKL, so `cargo add mkl-alloc` needs nothing else.
//!
//! 1. An installed MKL wins: for a configuration, found exactly as
//!    intel-mkl-src finds it (pkg-config, `$MKLROOT`, `/opt/intel`, through
//!    `intel-mkl-tool`), and linked by this script, or by intel-mkl-src when
//!    the feature puts it in the graph (`config`);
//!    for `mkl-rt`, pkg-config `mkl-sdl`, `$MKLROOT`, then the `mkl` wheel of
//!    the Python environment the build runs in, so a Python extension links
//!    the very library its process loads (`rt`).
//! 2. Otherwise a per-user cache holds the files the mode needs (`cache`),
//!    unpacked from the pinned `mkl-static` / `mkl` / `intel-openmp` /
//!    `mkl-include` wheels (`pins`), fetched with `python3 -m pip download`
//!    (the user's own index and proxy settings apply) and checked against
//!    pinned sha256s (`fetch`). Each part of the cache carries a stamp written
//!    last; a part without a matching stamp is refetched, never used.
//!    Fetches of a part are serialized by its lock and never remove a stamp
//!    (`locks`); each works in a folder of its own, swept if its build dies
//!    (`workdir`). A failed fetch leaves no file behind but the parts'
//!    empty lock files.
//! 3. Either way, the prototypes `src/ffi.rs` binds are checked against the
//!    `mkl_service.h` of the MKL that is linked (`prototypes`).
//! 4. With the `intel-mkl-src` feature, a static build stops if
//!    intel-mkl-src's own fallback (an ocipkg download of MKL 2020.1, linked
//!    by its build script, which runs first) is present: two MKLs are never
//!    linked together (`one_mkl`). With intel-mkl-src's build script
//!    overridden (`[target.<triple>.mkl_core]` with `provided-by =
//!    "mkl-alloc"`), this script links every MKL, as it does by default.
//!
//! Dynamic modes link through a folder of links in `OUT_DIR` (`link`): the
//! linker finds the unversioned names the wheels lack, and because that
//! folder is inside the target directory, `cargo run` / `cargo test` put it
//! on the library path of every program that depends on this crate.
//!
//! A Windows target (`CARGO_CFG_TARGET_OS`, not the host: cross-builds run
//! this script on Linux) takes the win_amd64 wheels' DLLs for `mkl-rt`, and
//! an installed MKL for the configurations; static ones are refused on the
//! GNU target (`windows`).
//!
//! With `DOCS_RS` set nothing is provisioned or linked (`cargo doc` needs no MKL);
//! nor under Miri (`CARGO_CFG_MIRI`, set for build scripts by `cargo miri`),
//! where `src/ffi/miri/` emulates MKL and nothing is linked.
//!
//! Environment: `MKL_ALLOC_CACHE` (cache directory), `MKL_ALLOC_NO_DOWNLOAD=1`
//! or `CARGO_NET_OFFLINE=true` (never fetch), `PYTHON` (the interpreter that
//! runs pip; `PYO3_PYTHON` first where set, as maturin does).

mod cache;
mod config;
mod fetch;
mod imalloc;
mod link;
mod locks;
mod mode;
mod one_mkl;
mod pins;
mod prototypes;
mod rt;
mod windows;
mod workdir;

use std::env;
use std::process::Command;

/// Errors are the lines of a `cargo::error`, each saying what was asked and
/// why it failed.
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
        "DOCS_RS",
        "PYTHON",
        "PYO3_PYTHON",
        "VIRTUAL_ENV",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // The folder: cargo re-runs the script when any file in it changes.
    println!("cargo:rerun-if-changed=build");

    // On a nightly compiler the crate turns `allocator_api` on, because a
    // graph may switch on allocator-api2 0.2's `nightly` feature (hashbrown
    // 0.14's `nightly` does), which makes the trait we implement core's
    // unstable one: without the gate this crate would stop compiling.
    if rustc_is_nightly() {
        println!("cargo:rustc-cfg=mkl_alloc_nightly");
    }

    let result = mode::mode().and_then(|mode| {
        if env::var_os("DOCS_RS").is_some() {
            return Ok(()); // docs need no MKL: link nothing, fetch nothing
        }
        if env::var_os("CARGO_CFG_MIRI").is_some() {
            return Ok(()); // Miri runs src/ffi/miri/, not MKL: nothing to link
        }
        // By the target, not the host: a cross-build for Windows runs this
        // script on Linux.
        match mode {
            mode::Mode::Config(config) => config::provision(config),
            mode::Mode::Rt if windows::target_is_windows() => windows::provision_rt(),
            mode::Mode::Rt => rt::provision(),
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
