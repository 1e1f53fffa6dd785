"""Fork beside threads that call MKL without mkl_alloc (issue 41): MKL's
FFT allocating its workspace inside DFTI's calls, and code calling
``MKL_malloc`` / ``MKL_free`` itself (through ctypes here, as a C
extension linked to MKL would). Each of those takes its thread's account
lock in MKL's memory manager for a few instructions, and MKL has no fork
handler: before the fix a child forked in that window hung in its first
``mem_stat()``. Now each fork holds MKL's locks (the crate's
``fork_guard::mkl_locks``; ``show_config()`` says "fork holds locks").

This file is also the program the test runs in a fresh interpreter
(``python test_fork_foreign_mkl.py N``): two threads run those loops; the
main thread forks N times; each child reads ``mem_stat()``, frees MKL's
buffers, makes an ``MKLMemory`` and exits. A child still running after
``CHILD_DEADLINE`` is hung: its stack (gdb) is printed and the program
exits 1."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import warnings

from forking import fork_children, mkl_rt, run_program

# 1,000 (issue 41's count); 150 at the small scale of CI's later runs.
FORKS = 150 if os.environ.get("MKL_ALLOC_TEST_SCALE") == "small" else 1000


def fft_loop(rt: ctypes.CDLL, stop: threading.Event, counts: list[int]) -> None:
    """Complex double 1-D FFTs of a few sizes, each descriptor created,
    committed (MKL allocates its workspace), used and freed."""
    data = (ctypes.c_double * (2 * 4096))()
    k = 0
    while not stop.is_set():
        n = (64, 1000, 4096)[k % 3]
        handle = ctypes.c_void_p()
        assert rt.DftiCreateDescriptor_d_1d(ctypes.byref(handle), 32, n) == 0  # DFTI_COMPLEX
        assert rt.DftiCommitDescriptor(handle) == 0
        assert rt.DftiComputeForward(handle, data) == 0
        assert rt.DftiFreeDescriptor(ctypes.byref(handle)) == 0
        k += 1
    counts[0] = k


def malloc_loop(rt: ctypes.CDLL, stop: threading.Event, counts: list[int]) -> None:
    """``MKL_malloc`` and ``MKL_free`` called directly, 16 B to 63 KiB."""
    rt.MKL_malloc.restype = ctypes.c_void_p
    rt.MKL_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
    rt.MKL_free.argtypes = [ctypes.c_void_p]
    k = 0
    while not stop.is_set():
        p = rt.MKL_malloc(16 + (k % 64) * 1000, 64)
        assert p
        rt.MKL_free(p)
        k += 1
    counts[1] = k


def main(forks: int) -> int:
    import mkl_alloc

    rt = mkl_rt()
    warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork\(\)",
                            category=DeprecationWarning)
    stop = threading.Event()
    counts = [0, 0]
    threads = [threading.Thread(target=f, args=(rt, stop, counts), daemon=True)
               for f in (fft_loop, malloc_loop)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    started = time.monotonic()

    def child() -> None:
        assert mkl_alloc.mem_stat().live_bytes >= 0
        mkl_alloc.free_buffers()
        mkl_alloc.MKLMemory(64)

    done, failure = fork_children(forks, child)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    if failure:
        print(failure, file=sys.stderr)
    print(f"forks={done} failures={int(failure is not None)} ffts={counts[0]} "
          f"mallocs={counts[1]} seconds={time.monotonic() - started:.1f}")
    return 1 if failure else 0


def test_fork_beside_threads_calling_mkl_without_mkl_alloc() -> None:
    import pytest

    if not hasattr(os, "fork"):
        pytest.skip("no os.fork on this platform (Windows has no fork)")
    summary = run_program(__file__, str(FORKS), timeout=300)
    assert f"forks={FORKS} failures=0" in summary, summary
    # Both loops ran around the forks.
    counts = dict(part.split("=") for part in summary.split())
    assert int(counts["ffts"]) > 0 and int(counts["mallocs"]) > 0, summary


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else FORKS))
