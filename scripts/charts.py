"""Draws docs/charts/*.svg from the JSON results of examples/perf and
python/bench_numpy.py.

The data in docs/data/ and the charts in docs/charts/ are regenerated, from
the repository root, by (times on a shared 2-core machine)::

    cargo build --release --examples                          # the perf and workload_* binaries
    cargo run --release --example perf -- --json docs/data/perf.json \\
        config workload > docs/data/perf.md                  # 13-19 minutes
    cargo run --release --example perf -- --json docs/data/workload.json \\
        workload > docs/data/workload.md                     # 8-10 minutes
    python3 -m venv target/bench-venv
    target/bench-venv/bin/pip install ./python numpy          # builds the extension: about 2 minutes
    target/bench-venv/bin/python python/bench_numpy.py \\
        --json docs/data/numpy.json > docs/data/numpy.md      # about a minute
    python3 scripts/charts.py                                 # seconds (the first time: installs matplotlib)

Run nothing else heavy while measuring. This script creates a virtual
environment in target/charts-venv the first time, installs the pinned
matplotlib of scripts/charts-requirements.txt there from the package
registry (no other network), and re-runs itself inside it. ``--png DIR``
also writes PNG copies, to look at the charts.

Charts: big-buffers.svg (issue 21's large-buffer rows: time relative to
System, and resident growth), small-blocks.svg (alloc+free 16 B .. 1 MiB,
ns per pair), whole-program.svg (the workload group: service work alone and
the mixed workload at 8 and 64 MiB buffers, CPU time and peak RSS relative to
System, under every global allocator), numpy.svg (NumPy under the
mkl_alloc handler relative to NumPy's allocator, and np.zeros's resident
growth). Each names the
machine, the date and the commit the JSON records.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "charts-venv")
REQUIREMENTS = os.path.join(ROOT, "scripts", "charts-requirements.txt")

SYSTEM, MIMALLOC, DEFAULTS, OFF, RAW = "System", "mimalloc", "MKL defaults", "MKL everything off", "raw MKL_malloc/MKL_free"
NUMPY = "NumPy's allocator"
H_DEFAULTS, H_OFF = "mkl_alloc handler, MKL defaults", "mkl_alloc handler, MKL everything off"
JEMALLOC, MKL_ALL = "jemalloc", "MklAllocator, MKL defaults"
SPLIT, SPLIT_MI, SPLIT_JE = (
    "MklSplitAllocator, MKL defaults",
    "MklSplitAllocator<MiMalloc>, MKL defaults",
    "MklSplitAllocator<Jemalloc>, MKL defaults",
)
COLORS = {
    SYSTEM: "#7f7f7f",
    MIMALLOC: "#9467bd",
    DEFAULTS: "#1f77b4",
    OFF: "#aec7e8",
    RAW: "#ff7f0e",
    NUMPY: "#7f7f7f",
    H_DEFAULTS: "#1f77b4",
    H_OFF: "#aec7e8",
    JEMALLOC: "#8c564b",
    SPLIT: "#1f77b4",
    SPLIT_MI: "#17becf",
    SPLIT_JE: "#2ca02c",
    MKL_ALL: "#ff7f0e",
}


def ensure_venv():
    """Re-runs this script inside target/charts-venv (made on first use)."""
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        print(f"charts: creating {VENV} and installing matplotlib …", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "-r", REQUIREMENTS], check=True)
    os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:]])


def load(path):
    """The JSON document at ``path``, or None if there is none."""
    if not os.path.exists(path):
        print(f"charts: no {path}; its chart is skipped", file=sys.stderr)
        return None
    with open(path) as f:
        return json.load(f)


def find(doc, prefix, competitor):
    """The row whose workload starts with ``prefix``, for ``competitor``."""
    for r in doc["rows"]:
        if r["workload"].startswith(prefix) and r["competitor"] == competitor:
            return r
    return None


def spread(row):
    """(lower, upper) error of a row's ratio: its per-round ratios' quartiles."""
    rs = [x for x in row.get("ratios") or [] if x is not None]
    if len(rs) < 3:
        return 0.0, 0.0
    q1, _, q3 = statistics.quantiles(rs, n=4)
    return max(row["ratio"] - q1, 0.0), max(q3 - row["ratio"], 0.0)


def subtitle(doc, what):
    """One line naming the machine, the date and the commit of ``doc``."""
    m = doc["machine"]
    kernel = m.get("kernel", "?").split("-")[0]
    parts = [
        f"{m.get('cpu', '?')}, {m.get('logical_cores', '?')} logical cores, THP {m.get('thp', '?')}",
        f"Linux {kernel}, glibc {m.get('glibc', '?')}",
        f"{m.get('date', '?')[:10]}",
        f"commit {m.get('commit', '?')[:10]}",
        f"load {m.get('loadavg_start', '?').split(' ')[0]}",
    ]
    return f"{what}\n" + " · ".join(parts)


def fmt(x):
    """A short number for a bar label."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 0.095:
        return f"{x:.2f}"
    return f"{x:.1g}"


def ratio_panel(ax, doc, cats, names, title, targets=None, quantity="time", better="faster", labels_of=None):
    """Horizontal bars of each competitor's ratio per category (log x).

    ``cats``: (label, workload prefix); ``names``: competitors in bar
    order, the baseline first (drawn as the line at 1); ``targets``:
    {label: limit} drawn as a red tick across the category; ``quantity``
    and ``better`` name the axis; ``labels_of``: legend names by
    competitor."""
    import numpy as np

    cats = [(lab, p) for lab, p in cats if find(doc, p, names[1])]
    bars = names[1:]
    h = 0.8 / len(bars)
    ys = np.arange(len(cats))[::-1]
    lo_all, hi_all = 1.0, 1.0
    labels = []
    for j, name in enumerate(bars):
        vals, errs = [], [[], []]
        for lab, p in cats:
            r = find(doc, p, name)
            v = r["ratio"] if r and r["ratio"] is not None else float("nan")
            lo, hi = spread(r) if r else (0.0, 0.0)
            vals.append(v)
            errs[0].append(lo)
            errs[1].append(hi)
        y = ys + 0.4 - h * (j + 0.5)
        label = (labels_of or {}).get(name, name)
        ax.barh(y, vals, h * 0.92, color=COLORS.get(name), label=label, xerr=errs, error_kw={"elinewidth": 0.8, "ecolor": "#333", "capsize": 1.5}, left=0)
        labels.append((y, vals, errs[1]))
        lo_all = min([lo_all] + [v for v in vals if v == v])
        hi_all = max([hi_all] + [v + e for v, e in zip(vals, errs[1]) if v == v])
    log = hi_all / lo_all > 8
    for y, vals, ups in labels:
        for yy, v, up in zip(y, vals, ups):
            if v == v:
                x = (v + up) * 1.07 if log else v + up + hi_all * 0.01
                ax.text(x, yy, f"{fmt(v)}×", va="center", fontsize=8)
    for (lab, _), y in zip(cats, ys):
        if targets and lab in targets:
            t = targets[lab]
            ax.plot([t, t], [y - 0.45, y + 0.45], color="#d62728", lw=1.6, ls="--")
    ax.axvline(1.0, color="#333", lw=1, label=f"{names[0]} (= 1)")
    if targets:
        ax.plot([], [], color="#d62728", lw=1.6, ls="--", label="limit (MKL defaults)")
    if log:
        ax.set_xscale("log")
        ax.set_xlim(min(lo_all, 0.5) / 1.6, hi_all * 4)
        scale = "log scale; "
    else:
        ax.set_xlim(0, hi_all * 1.18)
        scale = ""
    ax.set_yticks(ys, [lab for lab, _ in cats])
    ax.set_ylim(-0.6, len(cats) - 0.4)
    ax.set_xlabel(f"{quantity} relative to {names[0]} ({scale}1 = {names[0]}; lower is {better})")
    ax.set_title(title, fontsize=11, loc="left")
    ax.grid(axis="x", which="both", color="#ddd", lw=0.5)
    ax.set_axisbelow(True)


def value_panel(ax, doc, cats, names, title, xlabel, unit, log=False, limit=None):
    """Horizontal bars of each competitor's median per category, in ``unit``;
    ``limit(baseline median)`` gives where a red dashed limit line goes."""
    import numpy as np

    cats = [(lab, p) for lab, p in cats if find(doc, p, names[0])]
    h = 0.8 / len(names)
    ys = np.arange(len(cats))[::-1]
    top, bottom = 1.0, float("inf")
    lims = []
    for _, p in cats:
        base = find(doc, p, names[0])
        lims.append(limit(base["median"]) if limit and base else None)
    for j, name in enumerate(names):
        vals = []
        for _, p in cats:
            r = find(doc, p, name)
            vals.append(r["median"] if r else float("nan"))
        y = ys + 0.4 - h * (j + 0.5)
        ax.barh(y, vals, h * 0.92, color=COLORS.get(name), label=name)
        for yy, v in zip(y, vals):
            if v == v:
                top, bottom = max(top, v), min(bottom, max(v, 1e-3))
        for yy, v, lim in zip(y, vals, lims):
            if v == v:
                x = max(v, bottom) * 1.1 if log else max(v, 0) + top * 0.02
                if lim is not None and v < lim:  # clear of the limit line
                    x = max(x, lim * 1.15 if log else lim + top * 0.045)
                ax.text(x, yy, f"{fmt(v)} {unit}", va="center", fontsize=8)
    for lim, y in zip(lims, ys):
        if lim is not None:
            ax.plot([lim, lim], [y - 0.45, y + 0.45], color="#d62728", lw=1.6, ls="--")
    ax.set_yticks(ys, [lab for lab, _ in cats])
    ax.set_ylim(-0.6, len(cats) - 0.4)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(bottom / 2, top * 12)
    else:
        ax.set_xlim(0, top * 1.35)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=11, loc="left")
    ax.grid(axis="x", which="both", color="#ddd", lw=0.5)
    ax.set_axisbelow(True)


def policies(doc):
    """What "MKL defaults" meant in ``doc``'s run, from its configurations."""
    c = doc.get("configurations", {}).get(DEFAULTS)
    if not c:
        return ""
    cache = c.get("block_cache_budget")
    hp = c.get("huge_pages_threshold")
    cache = "off" if cache is None else f"on ({cache / 2**30:.1f} GiB budget)"
    hp = "off" if hp is None else f"on from {hp / 2**20:.0f} MiB"
    return f'\n"MKL defaults" (no MKL_ALLOC_* variable) in this run: block cache {cache}, huge pages {hp}'


def big_buffers(plt, doc, out):
    """docs/charts/big-buffers.svg."""
    z = "21. vec![0.0f64; 1 << 26] (512 MiB)"
    cats = [
        ("8 × 64 MiB temporaries\n(alloc, write, free)", "21. 64 MiB temporaries"),
        ("Vec<f64> push to 10^7\n(second push in a process)", "21. Vec<f64> push to 10^7, the second time"),
        ("Vec<f64> push to 10^8\n(second push in a process)", "21. Vec<f64> push to 10^8, the second time"),
        ("vec![0.0; 2^26], untouched\n(alloc + free)", f"{z}, untouched: alloc + free"),
        ("vec![0.0; 2^26],\nzeroed then filled", f"{z}, zeroed then filled"),
        ("vec![0.0; 2^26],\n1% of pages written", f"{z}, 1% of pages written"),
    ]
    targets = {cats[0][0]: 0.5, cats[1][0]: 1.0, cats[2][0]: 1.0, cats[3][0]: 1.2, cats[4][0]: 1.0}
    names = [SYSTEM, MIMALLOC, DEFAULTS, OFF]
    fig = plt.figure(figsize=(13, 7))
    grid = fig.add_gridspec(2, 2, width_ratios=[1.7, 1])
    a1 = fig.add_subplot(grid[:, 0])
    a2 = fig.add_subplot(grid[0, 1])
    a3 = fig.add_subplot(grid[1, 1], sharex=a2)
    ratio_panel(a1, doc, cats, names, "Time relative to System (red dashes: issue 21's limit for MKL defaults)", targets)
    rc = [
        ("untouched", f"{z}, untouched: resident growth"),
        ("1% of pages\nwritten", f"{z}, 1% of pages written: resident growth"),
    ]
    xl = "resident set growth while the array lives (MiB)"
    value_panel(a2, doc, rc[:1], names, "vec![0.0; 2^26] (512 MiB): resident growth", "", "MiB", limit=lambda b: b + 16)
    value_panel(a3, doc, rc[1:], names, "", xl, "MiB")
    handles, labels = a1.get_legend_handles_labels()
    order = [labels.index(n) for n in [f"{SYSTEM} (= 1)", MIMALLOC, DEFAULTS, OFF, "limit (MKL defaults)"] if n in labels]
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="lower center", ncols=len(order), fontsize=9, frameon=False)
    what = "Big buffers: MklAllocator with the library's defaults and with everything off, against System and mimalloc"
    fig.suptitle(subtitle(doc, what) + policies(doc), fontsize=10.5, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.04, 1, 0.98))
    save(fig, out, "big-buffers")


def small_blocks(plt, doc, out):
    """docs/charts/small-blocks.svg."""
    import numpy as np

    sizes = ["16 B", "256 B", "4 KiB", "64 KiB", "1 MiB"]
    names = [RAW, DEFAULTS, OFF, SYSTEM, MIMALLOC]
    labels = {DEFAULTS: "MklAllocator, MKL defaults", OFF: "MklAllocator, MKL everything off"}
    sizes = [s for s in sizes if find(doc, f"21. alloc+free {s} (align 64)", RAW)]
    fig, ax = plt.subplots(figsize=(12, 5.6))
    w = 0.8 / len(names)
    xs = np.arange(len(sizes))
    for j, name in enumerate(names):
        vals = []
        for s in sizes:
            r = find(doc, f"21. alloc+free {s} (align 64)", name)
            vals.append(r["median"] if r else float("nan"))
        x = xs - 0.4 + w * (j + 0.5)
        ax.bar(x, vals, w * 0.92, color=COLORS[name], label=labels.get(name, name))
        for xx, v in zip(x, vals):
            if v == v:
                ax.text(xx, v * 1.08, fmt(v), ha="center", va="bottom", fontsize=7.5, rotation=90)
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"{s}, align 64" for s in sizes])
    ax.set_ylabel("ns per alloc + free (log scale; lower is faster)")
    ax.set_ylim(top=ax.get_ylim()[1] * 3)
    ax.grid(axis="y", which="both", color="#ddd", lw=0.5)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, ncols=5, loc="upper left")
    t = next((t for t in doc["targets"] if t["target"].startswith("16 B alloc+free")), None)
    note = f"; 16 B: MKL defaults / raw MKL = {t['value']:.3f} (limit {t['limit']})" if t else ""
    ax.set_title(f"Median of interleaved rounds, each a fresh process{note}", fontsize=10, loc="left")
    what = "Small blocks: alloc + free of one block, MklAllocator against raw MKL_malloc/MKL_free, System and mimalloc"
    fig.suptitle(subtitle(doc, what) + policies(doc), fontsize=10.5, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    save(fig, out, "small-blocks")


def numpy_chart(plt, doc, out):
    """docs/charts/numpy.svg."""
    cats = [
        ("a + b*c, 10^7 float64", "`a + b*c`"),
        ("np.empty(16)\ncreate + drop", "`np.empty(16)`"),
        ("np.ones, 1 MiB", "`np.ones` 1 MiB"),
        ("np.concatenate growth\n100 steps to 800 KB", "`np.concatenate`"),
    ]
    targets = {cats[0][0]: 0.95, cats[1][0]: 1.1}
    names = [NUMPY, H_DEFAULTS, H_OFF]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 6.6), width_ratios=[1.5, 1, 1])
    ratio_panel(a1, doc, cats, names, "Time relative to NumPy's allocator", targets)
    z = [("np.zeros(2**26)", "`np.zeros(2**26)` (512 MiB)")]
    title = "np.zeros(2**26), 512 MiB:\ncreate + drop"
    value_panel(a2, doc, z, names, title, "thread CPU time, ms (log scale)", "ms", log=True, limit=lambda b: 1.2 * b)
    zr = [("np.zeros(2**26)", "`np.zeros(2**26)`: resident growth")]
    xl = "resident set growth while the array lives (MiB)"
    value_panel(a3, doc, zr, names, "np.zeros(2**26):\nresident growth", xl, "MiB", limit=lambda b: b + 16)
    for ax in (a2, a3):
        ax.set_yticks([])
    handles, labels = a2.get_legend_handles_labels()
    h1, l1 = a1.get_legend_handles_labels()
    extra = [(h, lab) for h, lab in zip(h1, l1) if lab not in labels]
    fig.legend(handles + [h for h, _ in extra], labels + [lab for _, lab in extra], loc="lower center", ncols=5, fontsize=9, frameon=False)
    m = doc["machine"]
    what = f"NumPy {m.get('numpy', '?')} (Python {m.get('python', '?')}) under the mkl_alloc handler, with the library's defaults and with everything off"
    hp = "on" if m.get("numpy_madvise_hugepage") else "off"
    fig.suptitle(subtitle(doc, what) + f"\nNumPy's huge-page switch {hp}; each ratio pairs the handler with NumPy's allocator timed moments apart in one process", fontsize=10.5, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.06, 1, 0.86))
    fig.subplots_adjust(top=0.80)  # room for the three-line title above the panels' own
    save(fig, out, "numpy")


SAVED = []


def whole_program(plt, doc, out):
    """docs/charts/whole-program.svg: issue 36's workload rows."""
    names = [SYSTEM, MIMALLOC, JEMALLOC, SPLIT, SPLIT_MI, SPLIT_JE, MKL_ALL]
    labels_of = {
        SPLIT: "split over System",
        SPLIT_MI: "split over mimalloc",
        SPLIT_JE: "split over jemalloc",
        MKL_ALL: "MklAllocator",
    }
    kinds = [
        ("service\n(small objects only)", "5. workload CPU time", "5. workload peak RSS"),
        ("mixed,\n8 MiB buffers", "5. mixed workload CPU time (10^6 entries, 8 MiB", "5. mixed workload peak RSS (8 MiB"),
        ("mixed,\n64 MiB buffers", "5. mixed workload CPU time (10^6 entries, 64 MiB", "5. mixed workload peak RSS (64 MiB"),
    ]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 6.5), sharey=True)
    ratio_panel(a1, doc, [(k, t) for k, t, _ in kinds], names, "CPU time (user + system) relative to System", labels_of=labels_of)
    ratio_panel(a2, doc, [(k, r) for k, _, r in kinds], names, "Peak RSS relative to System", quantity="peak RSS", better="smaller", labels_of=labels_of)
    handles, labels = a1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=4, fontsize=9, frameon=False)
    what = "The whole program: service work alone, and mixed with numeric rounds, under each global allocator (each run a fresh process)"
    fig.suptitle(subtitle(doc, what) + policies(doc), fontsize=10.5, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.07, 1, 0.98))
    save(fig, out, "whole-program")


def save(fig, out, name):
    """Writes ``name``.svg to ``out`` (and a PNG copy to --png's folder)."""
    path = os.path.join(out, f"{name}.svg")
    fig.savefig(path, metadata={"Date": None})
    SAVED.append(path)
    if ARGS.png:
        os.makedirs(ARGS.png, exist_ok=True)
        fig.savefig(os.path.join(ARGS.png, f"{name}.png"), dpi=110)
    print(f"charts: wrote {path}", file=sys.stderr)


ARGS = None


def main():
    """Parses the arguments and draws every chart whose data exists."""
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--perf", default=os.path.join(ROOT, "docs", "data", "perf.json"))
    p.add_argument("--workload", default=os.path.join(ROOT, "docs", "data", "workload.json"))
    p.add_argument("--numpy", default=os.path.join(ROOT, "docs", "data", "numpy.json"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "charts"))
    p.add_argument("--png", metavar="DIR", help="also write PNG copies to DIR")
    ARGS = p.parse_args()
    ensure_venv()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Reproducible SVGs: fixed ids, no date; text as paths (same look everywhere).
    plt.rcParams.update({"svg.hashsalt": "mkl-alloc", "svg.fonttype": "path", "font.size": 9})
    os.makedirs(ARGS.out, exist_ok=True)
    perf = load(ARGS.perf)
    if perf:
        big_buffers(plt, perf, ARGS.out)
        small_blocks(plt, perf, ARGS.out)
    workload = load(ARGS.workload)
    if workload:
        whole_program(plt, workload, ARGS.out)
    numpy_doc = load(ARGS.numpy)
    if numpy_doc:
        numpy_chart(plt, numpy_doc, ARGS.out)
    if not SAVED:
        sys.exit("charts: no data, no chart")


if __name__ == "__main__":
    main()
