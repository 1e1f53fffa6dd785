"""CPU time of retention.py's NumPy workload, mkl_alloc's handler against glibc (issue 42).

    python python/benchmarks/numpy_time.py [--mib 256] [--reps 4] [--rounds 9]

retention.py measures what stays resident; this measures what the same
work costs. For each block size of retention.py (48 KiB, 160 KiB, 4 KiB-1
MiB mixed) and each mode, a fresh Python process makes ``--mib`` MiB of
arrays (``np.ones``: every page written) with a short ``str`` kept after
every second array, then drops every array, ``--reps`` times over, and
reports the CPU time (user + system, ``time.process_time``) of those
repetitions alone: imports and first use are not counted. Modes:

- ``glibc``: NumPy's own allocator, ``mkl_alloc`` not imported;
- ``mkl_alloc``: ``mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler())``
  with the package's defaults (every ``MKL_ALLOC_*`` variable removed from
  the child's environment, so the background decay thread runs).

Rounds interleave the modes in a shuffled order; the table shows the
median of the per-round ratios mkl_alloc / glibc, and each mode's median
time. The package must be installed (not run from this source tree).
"""

import argparse
import importlib.util
import os
import random
import statistics
import sys
import time

_here = os.path.dirname(os.path.abspath(__file__))
_src = os.path.dirname(_here)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) not in (_here, _src)]

# The workload's array lengths are retention.py's (the same plan, seed and
# sizes), loaded from beside this file.
_spec = importlib.util.spec_from_file_location("_retention", os.path.join(_here, "retention.py"))
retention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(retention)

MODES = [("glibc", "NumPy default (glibc)"), ("mkl_alloc", "mkl_alloc handler")]


def child(mode, sizes, mib, reps):
    import numpy as np

    if mode == "mkl_alloc":
        import mkl_alloc

        mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler())
    lengths = retention.plan(sizes, mib)
    np.ones(512)
    np.ones(4096)
    t0 = time.process_time()
    for _ in range(reps):
        arrays = [None] * len(lengths)
        strings = []
        for i, n in enumerate(lengths):
            arrays[i] = np.ones(n)
            if i % 2 == 1:
                strings.append("s%d" % i)
        for i in range(len(arrays)):
            arrays[i] = None
    print(time.process_time() - t0)


def run(mode, sizes, mib, reps):
    return float(retention.run_child(__file__, mode, sizes, mib, reps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB of arrays per repetition (default 256)")
    ap.add_argument("--reps", type=int, default=4, help="repetitions per process (default 4)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]), int(a.child[3]))
        return
    times = {(m, s): [] for m, _ in MODES for s, _ in retention.SIZES}
    order = random.Random(42)
    t0 = time.time()
    for _ in range(a.rounds):
        for s, _ in retention.SIZES:
            for m, _ in order.sample(MODES, len(MODES)):
                times[(m, s)].append(run(m, s, a.mib, a.reps))
    print(f"Python {sys.version.split()[0]}, NumPy {__import__('numpy').__version__}; {a.reps} x {a.mib} MiB of arrays per process; {a.rounds} interleaved rounds; {time.time() - t0:.0f} s.\n")
    print("| block sizes | glibc, s | mkl_alloc, s | mkl_alloc / glibc (median of rounds; range) |")
    print("|---|---:|---:|---|")
    for s, title in retention.SIZES:
        g, k = times[("glibc", s)], times[("mkl_alloc", s)]
        ratios = [b / a_ for a_, b in zip(g, k)]
        print(f"| {title} | {statistics.median(g):.3f} | {statistics.median(k):.3f} | {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
