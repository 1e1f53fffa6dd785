"""NumPy under the mkl_alloc handler against NumPy's default allocator, in
one interleaved run (every round times every workload under both handlers,
in turn; the median round is reported, the best in parentheses).

    python python/bench_numpy.py [--rounds 15]

Workloads: ``a + b*c`` on 10**7 float64 (two 80 MB temporaries per
evaluation: page faults and huge pages), ``np.empty(16)`` created and
dropped (the small-block path), a 1 MiB ``np.ones``, and a
``np.concatenate`` growth loop. Prints a Markdown table with the ratio
handler / default (below 1: the handler is faster): the median over rounds
of each round's ratio, so that the two timings compared ran back to back
(on a shared, loaded machine the load drifts between rounds). Times are
this thread's CPU time (user + system, page faults included), not wall
time: time spent descheduled by other processes is not counted. NumPy's
ufuncs run single-threaded, so CPU time is the work done.
"""

import argparse
import os
import platform
import statistics
import sys
import time

# Run as a script, this file's folder (python/, the package's source tree)
# would come first on sys.path and shadow the installed package.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

import numpy as np  # noqa: E402

import mkl_alloc  # noqa: E402

try:
    from numpy._core.multiarray import _get_madvise_hugepage, get_handler_name
except ImportError:  # NumPy 1.x
    from numpy.core.multiarray import _get_madvise_hugepage, get_handler_name


def expression(loops, a, b, c):
    for _ in range(loops):
        r = a + b * c
        del r


def empty16(loops):
    empty = np.empty
    for _ in range(loops):
        x = empty(16)
        del x


def ones_1mib(loops):
    ones = np.ones
    for _ in range(loops):
        x = ones(1 << 17)  # 1 MiB of float64
        del x


def concat_growth(loops):
    piece = np.arange(1000.0)
    concatenate = np.concatenate
    for _ in range(loops):
        acc = piece
        for _ in range(100):  # 8 KB to 800 KB
            acc = concatenate([acc, piece])
        del acc


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--alignment", type=int, default=64)
    args = p.parse_args()

    n = 10**7
    a, b, c = (np.random.default_rng(i).random(n) for i in range(3))
    workloads = [
        ("`a + b*c`, 10^7 float64", "ms", 1e6, 5, lambda k: expression(k, a, b, c)),
        ("`np.empty(16)` create + drop", "ns", 1, 200_000, empty16),
        ("`np.ones` 1 MiB", "us", 1e3, 400, ones_1mib),
        ("`np.concatenate` growth, 100 steps to 800 KB", "ms", 1e6, 5, concat_growth),
    ]
    handler = mkl_alloc.numpy_handler(args.alignment)
    kinds = [("mkl_alloc", handler), ("default", None)]
    times = {(w[0], k): [] for w in workloads for k, _ in kinds}

    def timed(h, f, loops):
        prev = mkl_alloc.set_numpy_handler(h)
        try:
            assert get_handler_name() == ("mkl_alloc" if h is not None else "default_allocator")
            t0 = time.thread_time_ns()
            f(loops)
            return (time.thread_time_ns() - t0) / loops
        finally:
            mkl_alloc.set_numpy_handler(prev)

    for _, _, _, loops, f in workloads:  # warm-up
        for _, h in kinds:
            timed(h, f, max(1, loops // 5))
    for r in range(args.rounds):
        for name, _, _, loops, f in workloads:
            # Alternate which handler goes first.
            for kind, h in kinds if r % 2 == 0 else kinds[::-1]:
                times[(name, kind)].append(timed(h, f, loops))

    print(
        f"Python {platform.python_version()}, NumPy {np.__version__}, mkl_alloc "
        f"{mkl_alloc.__version__}, numpy_handler({args.alignment}), NumPy huge pages "
        f"{'on' if _get_madvise_hugepage() else 'off'}, MKL_ALLOC_BLOCK_CACHE="
        f"{os.environ.get('MKL_ALLOC_BLOCK_CACHE') or 'off'}, {args.rounds} interleaved rounds "
        f"({platform.machine()})\n"
    )
    print("| workload | NumPy default | mkl_alloc handler | handler / default |")
    print("|---|---|---|---|")
    for name, unit, scale, _, _ in workloads:
        d, m = times[(name, "default")], times[(name, "mkl_alloc")]
        md, mm = statistics.median(d) / scale, statistics.median(m) / scale
        ratio = statistics.median(x / y for x, y in zip(m, d))
        print(
            f"| {name} | {md:.3g} {unit} ({min(d) / scale:.3g}) | "
            f"{mm:.3g} {unit} ({min(m) / scale:.3g}) | **{ratio:.2f}x** |"
        )


if __name__ == "__main__":
    main()
