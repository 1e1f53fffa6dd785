//! Which MKL link mode the crate's features select: exactly one of
//! intel-mkl-src's eight configurations (forwarded to intel-mkl-src only
//! with the `intel-mkl-src` feature), or `mkl-rt`.

use std::env;
use std::str::FromStr;

use crate::Result;

/// intel-mkl-src's configurations, each also a feature of this crate.
pub const CONFIGS: [&str; 8] = [
    "mkl-static-lp64-seq",
    "mkl-static-lp64-iomp",
    "mkl-static-ilp64-seq",
    "mkl-static-ilp64-iomp",
    "mkl-dynamic-lp64-seq",
    "mkl-dynamic-lp64-iomp",
    "mkl-dynamic-ilp64-seq",
    "mkl-dynamic-ilp64-iomp",
];

/// How MKL is linked, from the crate's features.
pub enum Mode {
    /// One of intel-mkl-src's configurations.
    Config(intel_mkl_tool::Config),
    /// The single dynamic library, `libmkl_rt`.
    Rt,
}

fn feature(name: &str) -> bool {
    let var = format!("CARGO_FEATURE_{}", name.to_uppercase().replace('-', "_"));
    env::var_os(var).is_some()
}

pub fn mode() -> Result<Mode> {
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
        ([], true) if crate::one_mkl::intel_mkl_src_in_graph() => Err(
            "mkl-alloc: the intel-mkl-src feature needs one of the configurations \
             (the same as the graph's intel-mkl-src), not mkl-rt: intel-mkl-src would \
             link an MKL of its own beside libmkl_rt"
                .to_string(),
        ),
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
