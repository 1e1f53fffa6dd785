//! The results: the markdown tables on stdout and the same rows and
//! targets, with the machine's description, as JSON (`--json PATH`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::harness::{Series, difference, med, ratio, ratios};

/// One row of the table: a competitor's median in one workload.
pub struct Row {
    group: String,
    workload: String,
    competitor: String,
    median: f64,
    unit: String,
    /// Median of the per-round ratios to the baseline (1 for the baseline).
    ratio: f64,
    baseline: String,
    values: Vec<f64>,
    ratios: Vec<f64>,
}

/// One goal: `a / b <= limit` (a ratio) or `a - b <= limit` (a difference).
pub struct Target {
    group: String,
    what: String,
    a: String,
    b: String,
    difference: bool,
    value: f64,
    limit: f64,
    unit: String,
}

impl Target {
    fn met(&self) -> bool {
        self.value <= self.limit
    }
}

/// Everything perf measured in this run.
#[derive(Default)]
pub struct Table {
    /// The group now running (its name in perf's list).
    pub group: String,
    rows: Vec<Row>,
    targets: Vec<Target>,
    /// What each configuration's child process reported of the policies.
    pub configurations: serde_json::Map<String, Value>,
}

impl Table {
    /// Rows for `series`, ratios to `series[base]`.
    pub fn group(&mut self, title: &str, unit: &str, series: &[Series], base: usize) {
        for (i, s) in series.iter().enumerate() {
            let (r, rs) = if i == base {
                (1.0, vec![])
            } else {
                (ratio(s, &series[base]), ratios(s, &series[base]))
            };
            self.rows.push(Row {
                group: self.group.clone(),
                workload: title.to_string(),
                competitor: s.name.clone(),
                median: med(s),
                unit: unit.to_string(),
                ratio: r,
                baseline: series[base].name.clone(),
                values: s.values.clone(),
                ratios: rs,
            });
        }
    }

    /// Rows for `series` without a baseline (quantities such as resident
    /// memory, where a ratio to a value that may be 0 says nothing): the
    /// table shows "-" for their ratio, the JSON `null`.
    pub fn values(&mut self, title: &str, unit: &str, series: &[Series]) {
        for s in series {
            self.rows.push(Row {
                group: self.group.clone(),
                workload: title.to_string(),
                competitor: s.name.clone(),
                median: med(s),
                unit: unit.to_string(),
                ratio: f64::NAN,
                baseline: String::new(),
                values: s.values.clone(),
                ratios: vec![],
            });
        }
    }

    /// A row whose value is not a median of rounds (e.g. the slowest run).
    pub fn row(&mut self, title: &str, name: &str, value: f64, unit: &str, ratio: f64, base: &str) {
        self.rows.push(Row {
            group: self.group.clone(),
            workload: title.to_string(),
            competitor: name.to_string(),
            median: value,
            unit: unit.to_string(),
            ratio,
            baseline: base.to_string(),
            values: vec![value],
            ratios: vec![],
        });
    }

    /// The goal `a / b <= limit`, with the median of the per-round ratios.
    pub fn target(&mut self, what: &str, a: &Series, b: &Series, limit: f64) {
        let r = ratio(a, b);
        if std::env::var_os("PERF_VERBOSE").is_some() {
            let per_round: Vec<String> = ratios(a, b).iter().map(|x| format!("{x:.3}")).collect();
            eprintln!("perf: {what}: per-round ratios {}", per_round.join(" "));
        }
        self.push_target(what, a, b, false, r, limit, "");
    }

    /// The goal `a - b <= limit` (in `unit`), with the median of the
    /// per-round differences.
    pub fn target_diff(&mut self, what: &str, a: &Series, b: &Series, limit: f64, unit: &str) {
        let d = difference(a, b);
        self.push_target(what, a, b, true, d, limit, unit);
    }

    #[allow(clippy::too_many_arguments)]
    fn push_target(
        &mut self,
        what: &str,
        a: &Series,
        b: &Series,
        difference: bool,
        value: f64,
        limit: f64,
        unit: &str,
    ) {
        self.targets.push(Target {
            group: self.group.clone(),
            what: what.to_string(),
            a: a.name.clone(),
            b: b.name.clone(),
            difference,
            value,
            limit,
            unit: unit.to_string(),
        });
    }

    /// The markdown tables, as perf prints them.
    pub fn markdown(&self, machine: &Machine) -> String {
        let mut s = format!(
            "Machine: {}, {} logical cores, THP {}, Linux {}, glibc {}; {}. Medians of interleaved rounds; ratios are medians of per-round ratios.\n\n",
            machine.cpu, machine.cores, machine.thp, machine.kernel, machine.glibc, machine.date
        );
        s += "| Workload | Competitor | Median | Ratio to baseline |\n|---|---|---:|---:|\n";
        for r in &self.rows {
            let ratio = if r.baseline.is_empty() {
                "-".to_string()
            } else if r.competitor == r.baseline {
                "1.00 (baseline)".to_string()
            } else {
                format!("{:.2}", r.ratio)
            };
            s += &format!(
                "| {} | {} | {} {} | {ratio} |\n",
                r.workload,
                r.competitor,
                fmt_num(r.median),
                r.unit
            );
        }
        s += "\n| Target (issues 4, 10, 15, 21) | Ratio of | Ratio | Limit | Status |\n";
        s += "|---|---|---:|---:|---|\n";
        for t in &self.targets {
            let status = if t.met() { "**met**" } else { "**missed**" };
            let (of, value, limit) = if t.difference {
                (
                    format!("{} − {}", t.a, t.b),
                    format!("{:+.1} {}", t.value, t.unit),
                    format!("≤ +{:.0} {}", t.limit, t.unit),
                )
            } else {
                (
                    format!("{} / {}", t.a, t.b),
                    format!("{:.4}", t.value),
                    format!("≤ {:.2}", t.limit),
                )
            };
            s += &format!("| {} | {of} | {value} | {limit} | {status} |\n", t.what);
        }
        s
    }

    /// The JSON document `--json` writes.
    pub fn json(&self, machine: &Machine, args: &[String], seconds: f64) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "group": r.group, "workload": r.workload, "competitor": r.competitor,
                    "median": r.median, "unit": r.unit, "ratio": r.ratio,
                    "baseline": r.baseline, "values": r.values, "ratios": r.ratios,
                })
            })
            .collect();
        let targets: Vec<Value> = self
            .targets
            .iter()
            .map(|t| {
                json!({
                    "group": t.group, "target": t.what, "a": t.a, "b": t.b,
                    "kind": if t.difference { "difference" } else { "ratio" },
                    "value": t.value, "limit": t.limit, "unit": t.unit,
                    "met": t.met(),
                })
            })
            .collect();
        json!({
            "schema": 1,
            "tool": "examples/perf",
            "args": args,
            "seconds": seconds,
            "machine": machine.json(),
            "configurations": self.configurations,
            "rows": rows,
            "targets": targets,
        })
    }
}

pub fn fmt_num(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// What the results were measured on.
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub thp: String,
    pub thp_defrag: String,
    pub kernel: String,
    pub glibc: String,
    pub rustc: String,
    pub date: String,
    pub commit: String,
    pub mem_total_kib: u64,
    pub loadavg_start: String,
    pub loadavg_end: String,
}

impl Machine {
    pub fn probe() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        // "always [madvise] never" -> "madvise"
        let bracketed = |s: String| {
            s.split_whitespace()
                .find_map(|w| w.strip_prefix('[')?.strip_suffix(']').map(str::to_string))
                .unwrap_or_else(|| "unknown".into())
        };
        let mem_total_kib = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        Self {
            cpu,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            thp: bracketed(read("/sys/kernel/mm/transparent_hugepage/enabled")),
            thp_defrag: bracketed(read("/sys/kernel/mm/transparent_hugepage/defrag")),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            glibc: glibc_version(),
            rustc: command_line(
                &std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()),
                &["-V"],
            ),
            date: utc_now(),
            commit: git_commit(),
            mem_total_kib,
            loadavg_start: loadavg(),
            loadavg_end: String::new(),
        }
    }

    fn json(&self) -> Value {
        json!({
            "cpu": self.cpu, "logical_cores": self.cores, "thp": self.thp,
            "thp_defrag": self.thp_defrag, "kernel": self.kernel, "glibc": self.glibc,
            "rustc": self.rustc, "date": self.date, "commit": self.commit,
            "mem_total_kib": self.mem_total_kib, "mkl_link": mkl_link(),
            "loadavg_start": self.loadavg_start, "loadavg_end": self.loadavg_end,
        })
    }
}

/// The first three fields of `/proc/loadavg` (1, 5, 15 minutes).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc_version() -> String {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    let p = unsafe { libc::gnu_get_libc_version() };
    // SAFETY: as above: valid, NUL-terminated, never freed.
    unsafe { core::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc_version() -> String {
    "none".into()
}

/// The link mode this perf was built with (a cargo feature).
fn mkl_link() -> &'static str {
    if cfg!(feature = "mkl-static-lp64-seq") {
        "mkl-static-lp64-seq"
    } else if cfg!(feature = "mkl-static-lp64-iomp") {
        "mkl-static-lp64-iomp"
    } else if cfg!(feature = "mkl-static-ilp64-seq") {
        "mkl-static-ilp64-seq"
    } else if cfg!(feature = "mkl-static-ilp64-iomp") {
        "mkl-static-ilp64-iomp"
    } else if cfg!(feature = "mkl-dynamic-lp64-seq") {
        "mkl-dynamic-lp64-seq"
    } else if cfg!(feature = "mkl-dynamic-lp64-iomp") {
        "mkl-dynamic-lp64-iomp"
    } else if cfg!(feature = "mkl-rt") {
        "mkl-rt"
    } else {
        "other"
    }
}

/// The first line `prog args` prints, or "unknown".
fn command_line(prog: &str, args: &[&str]) -> String {
    Command::new(prog)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The checkout's commit, with "-dirty" if tracked files differ from it
/// (docs/data/ aside: the run may be writing its results there).
fn git_commit() -> String {
    let head = command_line("git", &["rev-parse", "HEAD"]);
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no", "--", "."])
        .arg(":(exclude)docs/data")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    if dirty { format!("{head}-dirty") } else { head }
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ` (civil date from days since 1970).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Writes `doc` to `path` (creating its folder), pretty-printed.
pub fn write_json(path: &Path, doc: &Value) -> std::io::Result<PathBuf> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut text = serde_json::to_string_pretty(doc).expect("serialise results");
    text.push('\n');
    std::fs::write(path, text)?;
    Ok(path.to_path_buf())
}
