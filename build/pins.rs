//! What the cache is filled from: the pinned MKL version, its wheels (file
//! names and sha256s: four for Linux, three for Windows), and the libraries
//! a dynamic MKL loads at run time.

pub const MKL_VERSION: &str = "2026.2.0";

pub struct Wheel {
    pub project: &'static str,
    pub file: &'static str,
    pub sha256: &'static str,
}

impl Wheel {
    /// The wheel's platform tag, the last of its file name (what `pip
    /// download --platform` asks for): `manylinux_2_28_x86_64`, `win_amd64`.
    pub fn platform(&self) -> &'static str {
        let stem = self.file.strip_suffix(".whl").unwrap_or(self.file);
        stem.rsplit('-').next().unwrap_or(stem)
    }
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

/// The Windows x86-64 wheels: the DLLs (`Library/bin/`), and `mkl-devel`'s
/// import library `mkl_rt.lib` for the MSVC linker (the GNU linker links
/// against the DLL itself). The headers are the same files on every
/// platform: `MKL_INCLUDE` serves Windows too.
pub const MKL_DYNAMIC_WIN: Wheel = Wheel {
    project: "mkl",
    file: "mkl-2026.2.0-py2.py3-none-win_amd64.whl",
    sha256: "5f2c187f0dda47efa19c1922cb3c8815924b8e5ed1613d28a3a69ec2327d4045",
};
pub const MKL_DEVEL_WIN: Wheel = Wheel {
    project: "mkl-devel",
    file: "mkl_devel-2026.2.0-py2.py3-none-win_amd64.whl",
    sha256: "06d0d20dd119b1960fc4224adc9d09b5f0dd7295e45fd27ecef9e1b409758f55",
};
pub const INTEL_OPENMP_WIN: Wheel = Wheel {
    project: "intel-openmp",
    file: "intel_openmp-2026.2.0-py2.py3-none-win_amd64.whl",
    sha256: "0fcd60701d6dcf8f17cd40c9733d7046ff3b82921a0a039bea2e6a68fb12c152",
};

/// What `mkl_rt.3.dll` loads at run time on Windows: the core, both
/// threading layers it may pick (`MKL_THREADING_LAYER`), and the
/// CPU-specific kernels (the Windows wheel has no interface DLLs).
pub const WINDOWS_RUNTIME: [&str; 15] = [
    "mkl_rt.3.dll",
    "mkl_core.3.dll",
    "mkl_sequential.3.dll",
    "mkl_intel_thread.3.dll",
    "mkl_def.3.dll",
    "mkl_mc3.3.dll",
    "mkl_avx2.3.dll",
    "mkl_avx512.3.dll",
    "mkl_avx10.3.dll",
    "mkl_vml_def.3.dll",
    "mkl_vml_mc3.3.dll",
    "mkl_vml_avx2.3.dll",
    "mkl_vml_avx512.3.dll",
    "mkl_vml_avx10.3.dll",
    "mkl_vml_cmpt.3.dll",
];
