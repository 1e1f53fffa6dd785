//! Links the extension so that it finds the `mkl` wheel's `libmkl_rt.so.3`
//! the way the wheel's other consumers (mkl-service) do: RUNPATH
//! `$ORIGIN/../../..`, which from
//! `<prefix>/lib/python3.X/site-packages/mkl_alloc/` is `<prefix>/lib`,
//! where the `mkl` wheel installs its libraries. One process, one MKL.
//!
//! Also sets PyO3's cfgs for the interpreter built for (`Py_3_14`,
//! `Py_LIMITED_API`, `Py_GIL_DISABLED`, ...): `realloc`'s reference rule
//! depends on the CPython version, as mkl-service's does.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    pyo3_build_config::use_pyo3_cfgs();
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN/../../..");
    }
}
