"""Fork while threads exit, with MKL called before ``import mkl_alloc``
(issue 34). A library that calls MKL first (``mkl_fft`` imported and
called before ``mkl_alloc``: a common order) makes MKL create the
``pthread_key`` of its per-thread clean-up before the crate's; that
clean-up, which takes MKL's global lock and every thread account's lock,
then ran at a thread's exit before the crate had marked the thread, and a
child forked meanwhile hung in its first ``mem_stat()``.

This file is also the program that the test runs in a fresh interpreter
(``python test_fork_mkl_first.py N``): it calls MKL's DFT (DFTI) through
ctypes on the ``mkl`` wheel's libmkl_rt.so.3 (what mkl_fft does, without
the dependency), then imports mkl_alloc and starts two threads that keep
starting short threads,
each making one ``MKLMemory(64)`` and exiting. The main thread forks N
times; each child calls ``mem_stat()``, makes an ``MKLMemory`` and exits.
A child still running after ``CHILD_DEADLINE`` is hung: its stack (gdb)
is printed, it is killed, and the program exits 1."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import warnings

from forking import fork_children, mkl_rt, run_program

# 2,000; 300 at the small scale of CI's later runs of the suite (see
# test_fork.py).
FORKS = 300 if os.environ.get("MKL_ALLOC_TEST_SCALE") == "small" else 2000
CHILD_DEADLINE = 5.0


def fft_first(rt: ctypes.CDLL) -> None:
    """One complex double-precision 1-D FFT through DFTI, as mkl_fft makes:
    MKL's first calls of the process, its memory manager's among them."""
    handle = ctypes.c_void_p()
    DFTI_COMPLEX = 32
    n = 64
    assert rt.DftiCreateDescriptor_d_1d(ctypes.byref(handle), DFTI_COMPLEX, n) == 0
    assert rt.DftiCommitDescriptor(handle) == 0
    data = (ctypes.c_double * (2 * n))(*([1.0, 0.0] * n))
    assert rt.DftiComputeForward(handle, data) == 0
    assert abs(data[0] - n) < 1e-9 and abs(data[2]) < 1e-9  # the transform of ones
    assert rt.DftiFreeDescriptor(ctypes.byref(handle)) == 0


def main(forks: int) -> int:
    fft_first(mkl_rt())
    import mkl_alloc
    from mkl_alloc import MKLMemory

    # What makes MKL's clean-up key come first: MKL ran before the setup.
    warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork\(\)",
                            category=DeprecationWarning)
    stop = threading.Event()
    exits = [0, 0]

    def churn(i: int) -> None:
        while not stop.is_set():
            t = threading.Thread(target=MKLMemory, args=(64,))
            t.start()
            t.join()
            exits[i] += 1

    churners = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(2)]
    for c in churners:
        c.start()
    while 0 in exits:
        time.sleep(0.001)
    started = time.monotonic()

    def child() -> None:
        assert mkl_alloc.mem_stat().live_bytes >= 0
        MKLMemory(64)

    done, failure = fork_children(forks, child, CHILD_DEADLINE)
    stop.set()
    for c in churners:
        c.join(timeout=30)
    if failure:
        print(failure, file=sys.stderr)
    print(f"forks={done} failures={int(failure is not None)} thread_exits={sum(exits)} "
          f"seconds={time.monotonic() - started:.1f}")
    return 1 if failure else 0


def test_fork_while_threads_exit_after_mkl_ran_first() -> None:
    import pytest

    if not hasattr(os, "fork"):
        pytest.skip("no os.fork on this platform (Windows has no fork)")
    summary = run_program(__file__, str(FORKS), timeout=300)
    assert f"forks={FORKS} failures=0" in summary, summary


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else FORKS))
