"""NumPy under the mkl_alloc handler against NumPy's default allocator, with
the library's defaults and with everything off, in one interleaved run.

    python python/bench_numpy.py [--rounds 25] [--json PATH]

The package must be installed (not run from this source tree), e.g.::

    python3 -m venv target/bench-venv
    target/bench-venv/bin/pip install ./python numpy
    target/bench-venv/bin/python python/bench_numpy.py --json docs/data/numpy.json

(about a minute on a shared 2-core machine). Two configurations (issue
21), each in worker processes of its own: "MKL defaults" has every
``MKL_ALLOC_*`` variable removed from its environment (the library's
defaults of the installed version), "MKL everything off" has
``MKL_ALLOC_BLOCK_CACHE=off MKL_ALLOC_HUGE_PAGES=off``.

Workloads, timed in a long-lived worker per configuration, which times
each under the handler and under NumPy's own allocator back to back (the
order alternating by round): ``a + b*c`` on 10**7 float64 (two 80 MB
temporaries per evaluation: page faults, huge pages, the block cache),
``np.empty(16)`` created and dropped (the small-block path), a 1 MiB
``np.ones``, and a ``np.concatenate`` growth loop. Every round runs every
workload in every configuration, configurations in a shuffled order.

``np.zeros(2**26)`` (512 MiB) is created and dropped in a fresh process
(after a 16-element and a 1 MiB array, so that the allocator's first use
does not count) for every measurement (NumPy's allocator, the handler with MKL defaults,
the handler with everything off, interleaved by round): the time, and the
growth of the resident set (``/proc/self/statm``) while the array lives
(untouched zeros should cost no memory).

Prints Markdown tables of rows (the median round; each ratio is the median
over rounds of handler / NumPy for the two timings made moments apart in
the same process) and of targets, and writes the same as JSON with
``--json`` (the format of ``examples/perf``'s; ``scripts/charts.py`` reads
it). Times are this thread's CPU time (user + system, page faults
included), not wall time: time spent descheduled by other processes is not
counted. NumPy's ufuncs run single-threaded, so CPU time is the work done.
"""

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

# Run as a script, this file's folder (python/, the package's source tree)
# would come first on sys.path and shadow the installed package.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

CONFIGS = [("MKL defaults", {}), ("MKL everything off", {"MKL_ALLOC_BLOCK_CACHE": "off", "MKL_ALLOC_HUGE_PAGES": "off"})]
NUMPY = "NumPy's allocator"


def handler_name(config):
    """The row name of the handler under ``config``."""
    return f"mkl_alloc handler, {config}"


def child_env(extra):
    """This process's environment without any ``MKL_ALLOC_*`` variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MKL_ALLOC_")}
    env.update(extra)
    return env


# --- the worker: runs in a subprocess, imports NumPy and the handler -------


def expression(loops, a, b, c):
    """``a + b*c`` ``loops`` times, each result dropped."""
    for _ in range(loops):
        r = a + b * c
        del r


def empty16(loops, np):
    """``np.empty(16)`` created and dropped ``loops`` times."""
    empty = np.empty
    for _ in range(loops):
        x = empty(16)
        del x


def ones_1mib(loops, np):
    """A 1 MiB ``np.ones`` created and dropped ``loops`` times."""
    ones = np.ones
    for _ in range(loops):
        x = ones(1 << 17)
        del x


def concat_growth(loops, np):
    """100 ``np.concatenate`` steps from 8 KB to 800 KB, ``loops`` times."""
    piece = np.arange(1000.0)
    concatenate = np.concatenate
    for _ in range(loops):
        acc = piece
        for _ in range(100):
            acc = concatenate([acc, piece])
        del acc


# (name, unit, ns per unit, loops per timing, target limit or None)
WORKLOADS = [
    ("`a + b*c`, 10^7 float64", "ms", 1e6, 5, 0.95),
    ("`np.empty(16)` create + drop", "ns", 1, 200_000, 1.1),
    ("`np.ones` 1 MiB", "us", 1e3, 400, None),
    ("`np.concatenate` growth, 100 steps to 800 KB", "ms", 1e6, 5, None),
]


def worker(alignment):
    """Answers ``<workload index> <handler|numpy> <loops>`` lines on stdin
    with the nanoseconds of thread CPU time per loop, one line each."""
    import numpy as np

    import mkl_alloc

    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import get_handler_name

    n = 10**7
    a, b, c = (np.random.default_rng(i).random(n) for i in range(3))
    funcs = [
        lambda k: expression(k, a, b, c),
        lambda k: empty16(k, np),
        lambda k: ones_1mib(k, np),
        lambda k: concat_growth(k, np),
    ]
    handler = mkl_alloc.numpy_handler(alignment)
    for line in sys.stdin:
        w, kind, loops = line.split()
        h = handler if kind == "handler" else None
        prev = mkl_alloc.set_numpy_handler(h)
        try:
            assert get_handler_name() == ("mkl_alloc" if h is not None else "default_allocator")
            t0 = time.thread_time_ns()
            funcs[int(w)](int(loops))
            ns = (time.thread_time_ns() - t0) / int(loops)
        finally:
            mkl_alloc.set_numpy_handler(prev)
        print(ns, flush=True)


def rss_mib():
    """This process's resident set in MiB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def zeros_child(kind, alignment):
    """Creates and drops ``np.zeros(2**26)`` once (under the handler if
    ``kind`` is ``handler``), after a small and a 1 MiB array; prints its
    time and resident growth."""
    import numpy as np

    import mkl_alloc

    if kind == "handler":
        mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler(alignment))
    # The allocator's first use (MKL's code pages and pools: about 10 MiB
    # resident under the handler) is not the array's cost.
    x = np.empty(16), np.empty(1 << 17)
    del x
    before = rss_mib()
    t0 = time.thread_time_ns()
    x = np.zeros(2**26)
    t1 = time.thread_time_ns()
    grown = rss_mib() - before
    t2 = time.thread_time_ns()
    del x
    t3 = time.thread_time_ns()
    print(f"ms={((t1 - t0) + (t3 - t2)) / 1e6} rss_mib={grown}")


# --- the parent: interleaves the rounds and reports -----------------------


class Worker:
    """A long-lived worker process in one configuration."""

    def __init__(self, extra_env, alignment):
        """Starts ``--worker`` with ``extra_env`` over a clean environment."""
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--alignment", str(alignment)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(extra_env),
        )

    def time(self, w, kind, loops):
        """Nanoseconds per loop of workload ``w`` under ``kind``."""
        self.p.stdin.write(f"{w} {kind} {loops}\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("bench_numpy worker died")
        return float(line)

    def close(self):
        """Ends the worker."""
        self.p.stdin.close()
        self.p.wait()


def run_zeros(extra_env, kind, alignment):
    """One ``np.zeros(2**26)`` in a fresh process: (ms, resident MiB)."""
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--zeros-child", kind, "--alignment", str(alignment)],
        env=child_env(extra_env),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    f = dict(kv.split("=") for kv in out.split())
    return float(f["ms"]), float(f["rss_mib"])


def first_line(cmd):
    """The first line ``cmd`` prints, or "unknown"."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=os.path.dirname(_here)).stdout
        return out.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def machine():
    """What the results were measured on (the fields of perf's JSON, plus Python's)."""
    import numpy as np

    import mkl_alloc

    def read(path):
        """The text of ``path``, or "" if it cannot be read."""
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    def bracketed(s):
        """The [chosen] word of a sysfs choice list."""
        return next((w[1:-1] for w in s.split() if w.startswith("[")), "unknown")

    cpu = next((ln.split(":", 1)[1].strip() for ln in read("/proc/cpuinfo").splitlines() if ln.startswith("model name")), "unknown")
    commit = first_line(["git", "rev-parse", "HEAD"])
    # docs/data/ aside: the run may be writing its results there.
    status = ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/data"]
    if first_line(status) not in ("unknown", ""):
        commit += "-dirty"
    try:
        from numpy._core.multiarray import _get_madvise_hugepage
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _get_madvise_hugepage
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "thp": bracketed(read("/sys/kernel/mm/transparent_hugepage/enabled")),
        "thp_defrag": bracketed(read("/sys/kernel/mm/transparent_hugepage/defrag")),
        "kernel": platform.release(),
        "glibc": platform.libc_ver()[1],
        "rustc": first_line(["rustc", "-V"]),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "mkl_alloc": mkl_alloc.__version__,
        "numpy_madvise_hugepage": bool(_get_madvise_hugepage()),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "loadavg_start": " ".join(read("/proc/loadavg").split()[:3]),
    }


def row(group, workload, name, values, unit, base_name, ratios, ratio=1.0):
    """One row of the JSON (the format of ``examples/perf``'s): ``ratio`` is
    the median of ``ratios`` if there are any, else the one given (1.0 for
    the baseline, None where no ratio means anything)."""
    return {
        "group": group,
        "workload": workload,
        "competitor": name,
        "median": statistics.median(values),
        "unit": unit,
        "ratio": statistics.median(ratios) if ratios else ratio,
        "baseline": base_name,
        "values": values,
        "ratios": ratios,
    }


def target(group, what, a, b, kind, value, limit, unit=""):
    """One target of the JSON."""
    return {"group": group, "target": what, "a": a, "b": b, "kind": kind, "value": value, "limit": limit, "unit": unit, "met": value <= limit}


def main():
    """Parses the arguments; runs a worker, a zeros child or the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--zeros-rounds", type=int, default=9)
    p.add_argument("--alignment", type=int, default=64)
    p.add_argument("--json", metavar="PATH", help="write the rows and targets as JSON")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--zeros-child", choices=["handler", "numpy"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.alignment)
    if args.zeros_child:
        return zeros_child(args.zeros_child, args.alignment)

    start = time.monotonic()
    info = machine()
    rng = random.Random(21)
    workers = {name: Worker(env, args.alignment) for name, env in CONFIGS}
    # times[(workload, config, kind)] per round
    times = {(w, c, k): [] for w in range(len(WORKLOADS)) for c, _ in CONFIGS for k in ("handler", "numpy")}
    for r in range(-1, args.rounds):  # round -1: warm-up, discarded
        for w, (_, _, _, loops, _) in enumerate(WORKLOADS):
            configs = [c for c, _ in CONFIGS]
            rng.shuffle(configs)
            for c in configs:
                kinds = ("handler", "numpy") if r % 2 == 0 else ("numpy", "handler")
                for k in kinds:
                    ns = workers[c].time(w, k, loops if r >= 0 else max(1, loops // 5))
                    if r >= 0:
                        times[(w, c, k)].append(ns)
    for wk in workers.values():
        wk.close()

    rows, targets = [], []
    defaults, off = CONFIGS[0][0], CONFIGS[1][0]
    for w, (name, unit, scale, _, limit) in enumerate(WORKLOADS):
        base = [x / scale for x in times[(w, defaults, "numpy")]]
        rows.append(row("numpy", name, NUMPY, base, unit, NUMPY, []))
        for c, _ in CONFIGS:
            h = [x / scale for x in times[(w, c, "handler")]]
            ratios = [x / y for x, y in zip(times[(w, c, "handler")], times[(w, c, "numpy")])]
            rows.append(row("numpy", name, handler_name(c), h, unit, NUMPY, ratios))
        if limit is not None:
            r = rows[-2]
            targets.append(target("numpy", f"{name} ≤ {limit}x NumPy's allocator (MKL defaults)", r["competitor"], NUMPY, "ratio", r["ratio"], limit))

    # np.zeros(2**26): a fresh process per measurement.
    who = [(NUMPY, {}, "numpy")] + [(handler_name(c), env, "handler") for c, env in CONFIGS]
    zt = {n: [] for n, _, _ in who}
    zr = {n: [] for n, _, _ in who}
    for _ in range(args.zeros_rounds):
        order = list(range(len(who)))
        rng.shuffle(order)
        for i in order:
            n, env, kind = who[i]
            ms, mib = run_zeros(env, kind, args.alignment)
            zt[n].append(ms)
            zr[n].append(mib)
    zname = "`np.zeros(2**26)` (512 MiB) create + drop, fresh process"
    for n, _, _ in who:
        ratios = [] if n == NUMPY else [x / y for x, y in zip(zt[n], zt[NUMPY])]
        rows.append(row("numpy zeros", zname, n, zt[n], "ms", NUMPY, ratios))
    rname = "`np.zeros(2**26)`: resident growth"
    for n, _, _ in who:
        # NumPy's untouched zeros grow the resident set by about nothing:
        # a ratio to it means nothing, the difference (the target) does.
        rows.append(row("numpy zeros", rname, n, zr[n], "MiB", NUMPY, [], 1.0 if n == NUMPY else None))
    hd = handler_name(defaults)
    tr = statistics.median(x / y for x, y in zip(zt[hd], zt[NUMPY]))
    targets.append(target("numpy zeros", "`np.zeros(2**26)` time ≤ 1.2x NumPy's allocator (MKL defaults)", hd, NUMPY, "ratio", tr, 1.2))
    dr = statistics.median(x - y for x, y in zip(zr[hd], zr[NUMPY]))
    targets.append(target("numpy zeros", "`np.zeros(2**26)` resident growth ≤ NumPy's + 16 MiB (MKL defaults)", hd, NUMPY, "difference", dr, 16.0, "MiB"))

    info["loadavg_end"] = " ".join(open("/proc/loadavg").read().split()[:3])
    seconds = time.monotonic() - start
    print_tables(info, rows, targets, args)
    print(f"\nTotal time: {seconds:.1f} s")
    if args.json:
        doc = {
            "schema": 1,
            "tool": "python/bench_numpy.py",
            "args": sys.argv[1:],
            "seconds": seconds,
            "machine": info,
            "configurations": {c: {"env": env} for c, env in CONFIGS},
            "rows": rows,
            "targets": targets,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True, allow_nan=False, default=str)
            f.write("\n")
        print(f"bench_numpy: wrote {args.json}", file=sys.stderr)


def print_tables(info, rows, targets, args):
    """The Markdown tables: rows (median, best in parentheses) and targets."""
    print(
        f"Python {info['python']}, NumPy {info['numpy']}, mkl_alloc {info['mkl_alloc']}, "
        f"numpy_handler({args.alignment}), NumPy huge pages {'on' if info['numpy_madvise_hugepage'] else 'off'}, "
        f"{args.rounds} interleaved rounds ({args.zeros_rounds} for np.zeros); {info['cpu']}, "
        f"{info['logical_cores']} logical cores, THP {info['thp']}, {info['date']}\n"
    )
    print("| workload | competitor | median (best) | ratio to NumPy's allocator |")
    print("|---|---|---|---|")
    for r in rows:
        if r["competitor"] == r["baseline"]:
            ratio = "1.00 (baseline)"
        elif r["ratio"] is None:
            ratio = ""
        else:
            ratio = f"**{r['ratio']:.2f}x**"
        print(f"| {r['workload']} | {r['competitor']} | {r['median']:.3g} {r['unit']} ({min(r['values']):.3g}) | {ratio} |")
    print("\n| Target (issue 21) | Value | Limit | Status |")
    print("|---|---:|---:|---|")
    for t in targets:
        if t["kind"] == "difference":
            value, limit = f"{t['value']:+.1f} {t['unit']}", f"≤ +{t['limit']:.0f} {t['unit']}"
        else:
            value, limit = f"{t['value']:.3f}", f"≤ {t['limit']:.2f}"
        print(f"| {t['target']} | {value} | {limit} | **{'met' if t['met'] else 'missed'}** |")


if __name__ == "__main__":
    main()
