"""Export + release cost: MKLMemory against bytearray, measured in one
interleaved run (the machine may be shared and noisy: every round times
every case once, in turn, and the median round is reported).

    python python/bench_exports.py [--rounds 21] [--loops 100000] [--nbytes 4096]

Prints a Markdown table: nanoseconds per export+release (median and best
round) and the ratio of each MKLMemory case to its bytearray counterpart.
"""

import argparse
import os
import platform
import statistics
import sys
import time

# Run as a script, this file's folder (python/, the package's source tree,
# which holds no built extension or a stale development build) would come
# first on sys.path and shadow the installed package.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

import numpy as np  # noqa: E402

import mkl_alloc  # noqa: E402
from mkl_alloc import MKLMemory  # noqa: E402


def memoryview_release(obj, loops):
    for _ in range(loops):
        memoryview(obj).release()


def frombuffer_release(obj, loops):
    frombuffer, uint8 = np.frombuffer, np.uint8
    for _ in range(loops):
        a = frombuffer(obj, uint8)
        del a


def from_dlpack_release(obj, loops):
    from_dlpack = np.from_dlpack
    for _ in range(loops):
        a = from_dlpack(obj)
        del a


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--loops", type=int, default=100_000)
    p.add_argument("--nbytes", type=int, default=4096)
    args = p.parse_args()

    m = MKLMemory(args.nbytes)
    b = bytearray(args.nbytes)
    cases = [
        ("memoryview(x).release()", memoryview_release, m, b),
        ("np.frombuffer(x, np.uint8); del", frombuffer_release, m, b),
    ]
    # Every case, both objects, in turn in every round.
    runs = [(name, kind, f, obj) for name, f, mm, bb in cases for kind, obj in (("MKLMemory", mm), ("bytearray", bb))]
    runs.append(("np.from_dlpack(x); del", "MKLMemory", from_dlpack_release, m))
    times = {(name, kind): [] for name, kind, _, _ in runs}
    for name, kind, f, obj in runs:  # warm-up
        f(obj, args.loops // 10)
    for _ in range(args.rounds):
        for name, kind, f, obj in runs:
            t0 = time.perf_counter_ns()
            f(obj, args.loops)
            times[(name, kind)].append((time.perf_counter_ns() - t0) / args.loops)
    assert m.exports == 0

    print(f"mkl_alloc from {os.path.dirname(mkl_alloc.__file__)}")
    print(
        f"Python {platform.python_version()}, NumPy {np.__version__}, mkl_alloc "
        f"{mkl_alloc.__version__}, {args.nbytes}-byte buffers, {args.rounds} interleaved "
        f"rounds of {args.loops} export+release each ({platform.machine()})\n"
    )
    print("| export + release | MKLMemory (ns) | bytearray (ns) | ratio |")
    print("|---|---:|---:|---:|")
    for name, _, _, _ in cases:
        mk, ba = times[(name, "MKLMemory")], times[(name, "bytearray")]
        med_m, med_b = statistics.median(mk), statistics.median(ba)
        print(
            f"| `{name}` | {med_m:.0f} (best {min(mk):.0f}) | {med_b:.0f} (best {min(ba):.0f}) "
            f"| {med_m / med_b:.2f}x |"
        )
    dl = times[("np.from_dlpack(x); del", "MKLMemory")]
    print(
        f"| `np.from_dlpack(x); del` | {statistics.median(dl):.0f} (best {min(dl):.0f}) "
        f"| (no DLPack) | |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
