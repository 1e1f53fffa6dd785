"""Peak RSS and CPU time of real NumPy workloads under mkl_alloc's handler (issue 54).

    python python/benchmarks/workloads.py [--rounds 5] [--modes M,...] [--workloads W,...] [--threads 1] [--json PATH]

retention.py and numpy_time.py measure arrays made and dropped in a loop;
this measures what real programs built on NumPy keep and cost. Each
workload is a few seconds of scikit-learn or pandas on synthetic data
(fixed seeds) that peaks at a few hundred MiB:

- ``kmeans``: ``KMeans`` (k-means++ then Lloyd) on ``make_blobs`` data;
- ``random_forest``: ``RandomForestClassifier`` fit and ``predict_proba`` on
  ``make_classification`` data;
- ``pca``: ``StandardScaler`` and ``PCA`` (randomized SVD), fit, transform
  and inverse transform, on ``make_classification`` data;
- ``sgd``: ``StandardScaler`` and ``SGDClassifier`` (hinge loss) fit and
  score on ``make_classification`` data;
- ``pandas``: a few million rows through ``groupby``/``agg``, ``merge``
  with a dimension table, ``pivot_table``, ``sort_values`` and a rolling
  mean per group.

Each (mode, workload, round) runs in a fresh Python process, which
imports what the workload needs, warms NumPy up, runs the workload between
two ``time.process_time()`` calls (user + system CPU of every thread:
imports are not counted), drops everything, runs ``gc.collect()``, sleeps
1.5 s (so that mkl_alloc's background decay can return cached memory) and
reads ``/proc/self/status``: the peak resident set of the whole process
(``VmHWM``, imports included) and the resident set left (``VmRSS``). Modes:

- ``default``: NumPy's own allocator (glibc), ``mkl_alloc`` not imported;
- ``mkl_alloc``: ``mkl_alloc`` imported first (before anything calls MKL),
  then ``mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler())``, with the
  package's defaults (every ``MKL_ALLOC_*`` variable removed from the
  child's environment);
- ``mkl_alloc-cache-off``: the same with ``MKL_ALLOC_BLOCK_CACHE=off``
  (freed chunks of 1 MiB and more are unmapped at once): the gap to
  ``mkl_alloc`` is what the block cache holds;
- ``jemalloc``, ``mimalloc``: NumPy's allocator with Debian's libjemalloc2 or
  libmimalloc2.0 in ``LD_PRELOAD`` (``apt-get install libjemalloc2
  libmimalloc2.0``), ``mkl_alloc`` not imported; left out with a message
  where the library is not installed.

A sixth, pseudo workload, ``bare``, does no work: it imports NumPy (and in
the mkl_alloc modes ``mkl_alloc``, setting the handler) and nothing else.
Its peak under ``mkl_alloc`` minus its peak under ``default`` is what
loading MKL costs, the allowance of issue 54's goal ("the real workloads'
peak RSS at most NumPy's default's plus what loading MKL costs").

Children get ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
``MKL_NUM_THREADS`` set to ``--threads`` (default 1): on a small shared
machine, spinning BLAS and OpenMP threads make CPU times noisy, and with
one thread every NumPy allocation is made in the thread the handler was
set in. Rounds run every (workload, mode) pair in a shuffled order; the
table shows per workload and mode the median peak RSS, its median ratio to
``default`` over the rounds, the median per-round ratio of CPU times to
``default``'s, and the median RSS after the drop. 705 s at 5 rounds,
every mode, on the shared 2-core machine (load 4). The package must be
installed (not run from this source tree), e.g. ``target/wl-venv/bin/python
python/benchmarks/workloads.py``, with scikit-learn and pandas.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

# Run as a script, this file's folder comes first on sys.path; python/ (the
# package's source tree) must not shadow the installed package.
_here = os.path.dirname(os.path.abspath(__file__))
_src = os.path.dirname(_here)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) not in (_here, _src)]

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
MIMALLOC = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"

# (name, title, LD_PRELOAD library or None)
MODES = [
    ("default", "NumPy default (glibc)", None),
    ("mkl_alloc", "mkl_alloc handler", None),
    ("mkl_alloc-cache-off", "mkl_alloc, MKL_ALLOC_BLOCK_CACHE=off", None),
    ("jemalloc", "jemalloc (LD_PRELOAD)", JEMALLOC),
    ("mimalloc", "mimalloc (LD_PRELOAD)", MIMALLOC),
]


def status_kib(field):
    """A ``kB`` field of ``/proc/self/status`` (``VmHWM``, ``VmRSS``), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def wl_bare():
    """No work: the ``bare`` pseudo workload (imports only)."""


def wl_kmeans():
    """KMeans, 20 clusters, 30 Lloyd iterations, on 300,000 x 50 float64 blobs (120 MB), then predict and transform."""
    from sklearn.cluster import KMeans
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(n_samples=300_000, n_features=50, centers=20, cluster_std=4.0, random_state=0)
    km = KMeans(n_clusters=20, n_init=1, max_iter=30, tol=0.0, random_state=0).fit(X)
    km.predict(X)
    km.transform(X[:100_000])


def wl_random_forest():
    """RandomForestClassifier, 5 trees of depth 12 at most, on 150,000 x 40 float64 (48 MB), then predict_proba."""
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier

    X, y = make_classification(n_samples=150_000, n_features=40, n_informative=12, n_classes=4, random_state=0)
    rf = RandomForestClassifier(n_estimators=5, max_depth=12, max_features=0.15, random_state=0).fit(X, y)
    rf.predict_proba(X)


def wl_pca():
    """StandardScaler and PCA (randomized SVD, 30 components) on 100,000 x 160 float64 (128 MB)."""
    from sklearn.datasets import make_classification
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    X, _ = make_classification(n_samples=100_000, n_features=160, n_informative=40, random_state=0)
    Xs = StandardScaler().fit_transform(X)
    del X
    pca = PCA(n_components=30, svd_solver="randomized", random_state=0)
    Z = pca.fit_transform(Xs)
    pca.inverse_transform(Z)


def wl_sgd():
    """StandardScaler and SGDClassifier (hinge, 5 epochs) on 250,000 x 80 float64 (160 MB)."""
    from sklearn.datasets import make_classification
    from sklearn.linear_model import SGDClassifier
    from sklearn.preprocessing import StandardScaler

    X, y = make_classification(n_samples=250_000, n_features=80, n_informative=30, random_state=0)
    Xs = StandardScaler().fit_transform(X)
    del X
    clf = SGDClassifier(max_iter=5, tol=None, random_state=0).fit(Xs, y)
    clf.score(Xs, y)


def wl_pandas():
    """A pandas pipeline over 3,000,000 rows: groupby/agg, merge, pivot_table, sort, rolling."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 3_000_000
    df = pd.DataFrame(
        {
            "store": rng.integers(0, 500, n),
            "product": rng.integers(0, 2_000, n),
            "day": rng.integers(0, 365, n),
            "qty": rng.integers(1, 20, n),
            "price": rng.random(n) * 100.0,
        }
    )
    df["revenue"] = df["qty"] * df["price"]
    products = pd.DataFrame({"product": np.arange(2_000), "category": rng.integers(0, 40, 2_000), "cost": rng.random(2_000) * 50.0})
    stores = pd.DataFrame({"store": np.arange(500), "region": rng.integers(0, 12, 500)})
    by_store = df.groupby(["store", "day"]).agg(qty=("qty", "sum"), revenue=("revenue", "sum"), price=("price", "mean")).reset_index()
    m = df.merge(products, on="product").merge(stores, on="store")
    m["margin"] = m["revenue"] - m["qty"] * m["cost"]
    pivot = m.pivot_table(index="region", columns="category", values="margin", aggfunc="sum")
    top = m.sort_values(["region", "margin"], ascending=[True, False]).groupby("region").head(100)
    by_store = by_store.sort_values(["store", "day"])
    by_store["rolling"] = by_store.groupby("store")["revenue"].transform(lambda s: s.rolling(7, min_periods=1).mean())
    del df, m, pivot, top, by_store


# name -> (function, modules imported before the timed part)
WORKLOADS = {
    "bare": (wl_bare, []),
    "kmeans": (wl_kmeans, ["sklearn.cluster", "sklearn.datasets"]),
    "random_forest": (wl_random_forest, ["sklearn.datasets", "sklearn.ensemble"]),
    "pca": (wl_pca, ["sklearn.datasets", "sklearn.decomposition", "sklearn.preprocessing"]),
    "sgd": (wl_sgd, ["sklearn.datasets", "sklearn.linear_model", "sklearn.preprocessing"]),
    "pandas": (wl_pandas, ["pandas"]),
}


def child(mode, workload):
    """Runs ``workload`` in this (fresh) process under ``mode`` and prints one
    JSON line: peak and after-drop RSS (MiB), CPU seconds of the workload,
    and for the mkl_alloc modes ``mem_stat()``'s cached bytes after the drop
    and after the pause."""
    import gc
    import importlib

    mkl_alloc = None
    if mode.startswith("mkl_alloc"):
        import mkl_alloc

        mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler())
    import numpy as np

    fn, modules = WORKLOADS[workload]
    for name in modules:
        importlib.import_module(name)
    # First use (NumPy's and the handler's) is not what is measured.
    np.ones(512)
    np.ones(4096)
    assert mkl_alloc is None or mkl_alloc.is_mkl_array(np.ones(4096)), "the handler is not in force"
    start = status_kib("VmRSS")
    t0 = time.process_time()
    fn()
    cpu = time.process_time() - t0
    gc.collect()
    out = {"cpu_s": cpu, "start_mib": start / 1024}
    if mkl_alloc is not None:
        out["cached_mib_dropped"] = mkl_alloc.mem_stat().cached_bytes / 2**20
    time.sleep(1.5)
    out["after_mib"] = status_kib("VmRSS") / 1024
    out["peak_mib"] = status_kib("VmHWM") / 1024
    if mkl_alloc is not None:
        out["cached_mib_idle"] = mkl_alloc.mem_stat().cached_bytes / 2**20
    print(json.dumps(out))


def run(mode, workload, threads):
    """The JSON line of a fresh child running ``workload`` under ``mode``,
    with no ``MKL_ALLOC_*``, ``MALLOC_*`` or ``LD_PRELOAD`` of this process's
    but what ``mode`` sets; exits with the child's error if it failed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_ALLOC_", "MALLOC_", "MIMALLOC_", "JE_MALLOC_")) and k not in ("LD_PRELOAD", "MALLOC_CONF")}
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    if mode == "mkl_alloc-cache-off":
        env["MKL_ALLOC_BLOCK_CACHE"] = "off"
    lib = {m: p for m, _, p in MODES}[mode]
    if lib:
        env["LD_PRELOAD"] = lib
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", mode, workload],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        sys.exit(f"workloads.py: the {mode} {workload} child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    """Parses the options, runs the rounds and prints the table (and the JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--modes", help="comma-separated modes (default: all; default is always run)")
    ap.add_argument("--workloads", help="comma-separated workloads (default: all; bare is always run)")
    ap.add_argument("--threads", type=int, default=1, help="OMP/OpenBLAS/MKL threads in the children (default 1)")
    ap.add_argument("--json", help="also write every value as JSON to this path")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "WORKLOAD"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    names = [m for m, _, _ in MODES]
    modes = names if not a.modes else ["default"] + [m for m in a.modes.split(",") if m != "default"]
    for m in modes:
        if m not in names:
            ap.error(f"unknown mode {m!r} (known: {', '.join(names)})")
    for m, _, lib in MODES:
        if m in modes and lib and not os.path.exists(lib):
            print(f"workloads.py: {lib} is not installed: no {m} row", file=sys.stderr)
            modes.remove(m)
    workloads = list(WORKLOADS) if not a.workloads else ["bare"] + [w for w in a.workloads.split(",") if w != "bare"]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r} (known: {', '.join(WORKLOADS)})")
    results = {(m, w): [] for m in modes for w in workloads}
    pairs = [(m, w) for w in workloads for m in modes]
    order = random.Random(42)
    t0 = time.time()
    for r in range(a.rounds):
        for m, w in order.sample(pairs, len(pairs)):
            results[(m, w)].append(run(m, w, a.threads))
        print(f"round {r + 1}/{a.rounds} done, {time.time() - t0:.0f} s", file=sys.stderr)
    elapsed = time.time() - t0

    def med(m, w, k):
        """Median over the rounds of mode m's value k for workload w."""
        return statistics.median(x[k] for x in results[(m, w)])

    def ratio(m, w, k):
        """Median over the rounds of mode m's value k over default's, same round."""
        return statistics.median(x[k] / d[k] for x, d in zip(results[(m, w)], results[("default", w)]))

    title = {m: t for m, t, _ in MODES}
    import numpy

    print(f"Python {sys.version.split()[0]}, NumPy {numpy.__version__}; {a.threads} thread(s); medians of {a.rounds} interleaved round(s); {elapsed:.0f} s.\n")
    mkl_cost = None
    if "mkl_alloc" in modes:
        mkl_cost = statistics.median(k["peak_mib"] - d["peak_mib"] for k, d in zip(results[("mkl_alloc", "bare")], results[("default", "bare")]))
        print(
            f"Loading MKL (bare: import numpy, mkl_alloc, set the handler, no work): peak {med('mkl_alloc', 'bare', 'peak_mib'):.1f} MiB against {med('default', 'bare', 'peak_mib'):.1f} MiB for NumPy alone: **{mkl_cost:+.1f} MiB** (median of the per-round differences).\n"
        )
    print("| workload | mode | peak RSS, MiB | peak / default | peak - default, MiB | CPU s | CPU / default (range) | RSS after, MiB |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for w in workloads:
        if w == "bare":
            continue
        for m in modes:
            rs = [x["cpu_s"] / d["cpu_s"] for x, d in zip(results[(m, w)], results[("default", w)])]
            diff = statistics.median(x["peak_mib"] - d["peak_mib"] for x, d in zip(results[(m, w)], results[("default", w)]))
            print(
                f"| {w} | {title[m]} | {med(m, w, 'peak_mib'):,.0f} | {ratio(m, w, 'peak_mib'):.2f} | {diff:+,.0f} | {med(m, w, 'cpu_s'):.2f} | {statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f}) | {med(m, w, 'after_mib'):,.0f} |"
            )
    if mkl_cost is not None:
        print(f"\nmkl_alloc's peak within default's + {mkl_cost:.1f} MiB (loading MKL):")
        for w in workloads:
            if w == "bare":
                continue
            pairs_w = list(zip(results[("mkl_alloc", w)], results[("default", w)]))
            diff = statistics.median(x["peak_mib"] - d["peak_mib"] for x, d in pairs_w)
            # What the work itself adds: its rise from the RSS before it
            # (imports done, MKL loaded) to the peak, over default's rise.
            start = statistics.median(x["start_mib"] - d["start_mib"] for x, d in pairs_w)
            work = statistics.median((x["peak_mib"] - x["start_mib"]) - (d["peak_mib"] - d["start_mib"]) for x, d in pairs_w)
            print(
                f"- {w}: {diff:+.1f} MiB (median of the per-round differences): {'yes' if diff <= mkl_cost else 'NO'}; "
                f"before the work {start:+.1f} MiB, the work's own rise {work:+.1f} MiB over default's"
            )
    if a.json:
        doc = {
            "tool": "python/benchmarks/workloads.py",
            "rounds": a.rounds,
            "threads": a.threads,
            "python": sys.version,
            "numpy": numpy.__version__,
            "seconds": elapsed,
            "mkl_load_mib": mkl_cost,
            "results": [{"mode": m, "workload": w, "runs": results[(m, w)]} for m in modes for w in workloads],
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
