"""What stays resident after NumPy arrays are freed (issue 42's table).

    python python/benchmarks/retention.py [--mib 1024] [--rounds 1] [--json PATH]

For each block size (48 KiB = 6,144 float64, 160 KiB = 20,480 float64,
and sizes log-uniform from 4 KiB to 1 MiB, a fixed seed) and each mode, a
fresh Python process makes about ``--mib`` MiB of arrays (``np.ones``:
every page written) with a short ``str`` kept alive after every second
array, drops every array, sleeps 2 s, and reports its resident set
(``/proc/self/statm``) beyond what it was before the first array; also
just after the drop, and at the peak. Modes:

- ``NumPy default (glibc)``: NumPy's own allocator, ``mkl_alloc`` not
  imported;
- ``mkl_alloc handler``: ``mkl_alloc.set_numpy_handler(
  mkl_alloc.numpy_handler())`` with the package's defaults (every
  ``MKL_ALLOC_*`` variable removed from the child's environment);
- ``glibc, MALLOC_TRIM_THRESHOLD_=65536``: NumPy's allocator, glibc told
  to trim the heap's top beyond 64 KiB;
- ``jemalloc (LD_PRELOAD)``: NumPy's allocator on Debian's libjemalloc2
  (``apt-get install libjemalloc2``), left out with a message where it is
  not installed.

The package must be installed (not run from this source tree), e.g.
``target/venv-h44/bin/python python/benchmarks/retention.py``. No
allocation is made after the pause: what is measured is what an idle
process keeps. Prints a Markdown table of medians (MiB) over ``--rounds``
rounds, modes interleaved in a shuffled order each round; about 3 s per
process, 80 s a round at 1 GiB on the shared 2-core machine.
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

SIZES = [
    ("48k", "48 KiB"),
    ("160k", "160 KiB"),
    ("mixed", "4 KiB-1 MiB mixed"),
]

MODES = [
    ("numpy", "NumPy default (glibc)"),
    ("mkl_alloc", "mkl_alloc handler"),
    ("trim", "glibc, MALLOC_TRIM_THRESHOLD_=65536"),
    ("jemalloc", "jemalloc (LD_PRELOAD)"),
]


def rss_mib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def plan(sizes, mib):
    """The arrays' lengths (float64 elements), about ``mib`` MiB in all."""
    r = random.Random(0x42)
    total, out = 0, []
    while total < mib << 20:
        if sizes == "48k":
            n = 6144
        elif sizes == "160k":
            n = 20480
        else:
            n = int(4096 * 256 ** r.random()) // 8
        out.append(n)
        total += n * 8
    return out


def child(mode, sizes, mib):
    import numpy as np

    if mode == "mkl_alloc":
        import mkl_alloc

        mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler())
    lengths = plan(sizes, mib)
    # First use (NumPy's and the handler's) is not what is measured.
    np.ones(512)
    np.ones(4096)
    arrays = [None] * len(lengths)
    strings = []
    start = rss_mib()
    for i, n in enumerate(lengths):
        arrays[i] = np.ones(n)
        if i % 2 == 1:
            strings.append("s%d" % i)
    peak = rss_mib() - start
    for i in range(len(arrays)):
        arrays[i] = None
    freed = rss_mib() - start
    time.sleep(2)
    idle = rss_mib() - start
    print(json.dumps({"rss_mib": idle, "freed_mib": freed, "peak_mib": peak, "arrays": len(lengths), "strings": len(strings)}))


def run_child(script, mode, *args):
    """The last line printed by ``python script --child mode args...``, run
    in a fresh process with no ``MKL_ALLOC_*``, ``MALLOC_TRIM_THRESHOLD_``
    or ``LD_PRELOAD`` of this one's, but what ``mode`` sets; exits with the
    child's error if it failed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MKL_ALLOC_") and k not in ("MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD")}
    if mode == "trim":
        env["MALLOC_TRIM_THRESHOLD_"] = "65536"
    if mode == "jemalloc":
        env["LD_PRELOAD"] = JEMALLOC
    out = subprocess.run(
        [sys.executable, os.path.abspath(script), "--child", mode, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        sys.exit(f"{os.path.basename(script)}: the {mode} {' '.join(map(str, args))} child failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


def run(mode, sizes, mib):
    return json.loads(run_child(__file__, mode, sizes, mib))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="MiB of arrays per process (default 1024)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds; the table shows medians (default 1)")
    ap.add_argument("--json", help="also write every value as JSON to this path")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "SIZES", "MIB"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]))
        return
    modes = list(MODES)
    if not os.path.exists(JEMALLOC):
        print(f"retention.py: {JEMALLOC} is not installed (apt-get install libjemalloc2): no jemalloc row", file=sys.stderr)
        modes = [m for m in modes if m[0] != "jemalloc"]
    results = {(m, s): [] for m, _ in modes for s, _ in SIZES}
    order = random.Random(42)
    t0 = time.time()
    for _ in range(a.rounds):
        for s, _ in SIZES:
            for m, _ in order.sample(modes, len(modes)):
                results[(m, s)].append(run(m, s, a.mib))
    med = lambda m, s, k: statistics.median(r[k] for r in results[(m, s)])  # noqa: E731
    print(f"Python {sys.version.split()[0]}, NumPy {__import__('numpy').__version__}; {a.mib} MiB of arrays, a short str after every second; medians of {a.rounds} round(s); {time.time() - t0:.0f} s.\n")
    print("MiB resident beyond the start after the drop and 2 s idle (just after the drop in parentheses):\n")
    print("| mode | " + " | ".join(t for _, t in SIZES) + " |")
    print("|---|" + "---:|" * len(SIZES))
    for m, name in modes:
        cells = [f"{med(m, s, 'rss_mib'):,.0f} ({med(m, s, 'freed_mib'):,.0f})" for s, _ in SIZES]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if a.json:
        doc = {
            "tool": "python/benchmarks/retention.py",
            "mib": a.mib,
            "rounds": a.rounds,
            "python": sys.version,
            "results": [{"mode": name, "sizes": s, "runs": results[(m, s)]} for m, name in modes for s, _ in SIZES],
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
