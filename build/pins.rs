//! What the cache is filled from: the pinned MKL version, its four wheels
//! (file names and sha256s), and the libraries a dynamic MKL loads at run
//! time.

pub const MKL_VERSION: &str = "2026.2.0";

pub struct Wheel {
    pub project: &'static str,
    pub file: &'static str,
    pub sha256: &'static str,
}

pub const MKL_STATIC: Wheel = Wheel {
    project: "mkl-static",
    file: "mkl_static-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
    sha256: "090e439bf202b45579c75d2ba50ff7ead05752d553a06aba79c3ed2b5247921b",
};
pub const MKL_DYNAMIC: Wheel = Wheel {
    project: "mkl",
    file: "mkl-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
    sha256: "eaab1875ce9f47ab3c66d5632cef06baf768c05781f2f28847bdbc4343500ed7",
};
pub const INTEL_OPENMP: Wheel = Wheel {
    project: "intel-openmp",
    file: "intel_openmp-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
    sha256: "2308a1a3e74718a9cd8cccf218c34d8cd80b43d3b89dfbb01b38dee205c50980",
};
pub const MKL_INCLUDE: Wheel = Wheel {
    project: "mkl-include",
    file: "mkl_include-2026.2.0-py2.py3-none-manylinux_2_28_x86_64.whl",
    sha256: "889cc72057a1671fee1e9a8beb2fc4e0d222ba78c08b6d69584dae03fbec4822",
};

/// What a dynamic MKL loads at run time besides the libraries linked by
/// name: every interface and threading layer `libmkl_rt` may pick, and the
/// CPU-specific kernels `libmkl_core` opens by itself.
pub const DYNAMIC_RUNTIME: [&str; 17] = [
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
