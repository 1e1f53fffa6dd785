//! Links the extension so that it finds the `mkl` wheel's `libmkl_rt.so.3`
//! the way the wheel's other consumers (mkl-service) do: RUNPATH
//! `$ORIGIN/../../..`, which from
//! `<prefix>/lib/python3.X/site-packages/mkl_alloc/` is `<prefix>/lib`,
//! where the `mkl` wheel installs its libraries. One process, one MKL.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN/../../..");
    }
}
