//! Provisioning for one of intel-mkl-src's eight configurations: the
//! installed MKL intel-mkl-src finds, else the cache's parts for the
//! configuration; and who emits the link lines (this script, unless the
//! `intel-mkl-src` feature puts intel-mkl-src in the graph, its build script
//! is not overridden, and it found an installed MKL).

use crate::Result;
use crate::cache::{self, Part};
use crate::link::{emit_links, link_farm, report_lib_dir};
use crate::one_mkl::{intel_mkl_src_links, one_mkl};
use crate::pins::{DYNAMIC_RUNTIME, INTEL_OPENMP, MKL_DYNAMIC, MKL_STATIC, MKL_VERSION};
use crate::prototypes;

pub fn provision(config: intel_mkl_tool::Config) -> Result<()> {
    use intel_mkl_tool::{LinkType, Threading};
    let windows = crate::windows::target_is_windows();
    if windows {
        crate::windows::check_config(config)?;
    }
    if config.link == LinkType::Dynamic {
        // src/lib.rs keeps the core, threading and OpenMP libraries linked.
        println!("cargo:rustc-cfg=mkl_dynamic");
        if config.parallel == Threading::OpenMP {
            println!("cargo:rustc-cfg=mkl_dynamic_iomp");
        }
    }
    // Without the `intel-mkl-src` feature (the default), or with its
    // `links = "mkl_core"` overridden (see `one_mkl`), intel-mkl-src's build
    // script does not run for this crate and links nothing: this script
    // links every MKL, and intel-mkl-src's ocipkg folder does not matter.
    let links_here = !intel_mkl_src_links();
    if let Ok(lib) = intel_mkl_tool::Library::new(config) {
        // intel-mkl-src, when it runs, finds the same library and emits the
        // link lines; otherwise they are emitted here.
        if config.link == LinkType::Dynamic {
            report_lib_dir(&lib.library_dir);
        }
        prototypes::check(&lib.include_dir.join("mkl_service.h"))?;
        if !links_here {
            return one_mkl(
                config,
                &format!("the installed MKL in {}", lib.library_dir.display()),
            );
        }
        let mut dirs = vec![lib.library_dir.clone()];
        dirs.extend(
            lib.iomp5_static_dir
                .iter()
                .chain(&lib.iomp5_dynamic_dir)
                .cloned(),
        );
        emit_links(config, &dirs);
        return Ok(());
    }

    if windows {
        return Err(crate::windows::no_cache_for_config(config));
    }
    let libs = intel_mkl_tool::mkl_libs(config);
    let iomp = config.parallel == Threading::OpenMP;
    let mut parts = vec![Part::headers()];
    match config.link {
        LinkType::Static => {
            for lib in &libs {
                parts.push(Part::libs(&MKL_STATIC, "static", &[&format!("lib{lib}.a")]));
            }
            if iomp {
                parts.push(Part::libs(&INTEL_OPENMP, "static", &["libiomp5.a"]));
            }
        }
        LinkType::Dynamic => {
            parts.push(Part::libs(&MKL_DYNAMIC, "dynamic", &DYNAMIC_RUNTIME));
            if iomp {
                parts.push(Part::libs(&INTEL_OPENMP, "dynamic", &["libiomp5.so"]));
            }
        }
    }
    let what = config.to_string();
    let cache = cache::ensure(&parts, &what)?;
    prototypes::check(&cache.join("include").join("mkl_service.h"))?;
    if !links_here {
        one_mkl(
            config,
            &format!(
                "MKL {MKL_VERSION}, which mkl-alloc provisioned in {}",
                cache.display()
            ),
        )?;
    }

    match config.link {
        LinkType::Static => emit_links(config, &[cache.join("static")]),
        LinkType::Dynamic => {
            report_lib_dir(&cache.join("dynamic"));
            let dir = link_farm(&cache.join("dynamic"))?;
            emit_links(config, &[dir]);
        }
    }
    Ok(())
}
