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
import importlib.metadata
import os
import subprocess
import sys
import threading
import time
import warnings

# 2,000; 300 at the small scale of CI's later runs of the suite (see
# test_fork.py).
FORKS = 300 if os.environ.get("MKL_ALLOC_TEST_SCALE") == "small" else 2000
CHILD_DEADLINE = 5.0


def mkl_rt() -> ctypes.CDLL:
    """The `mkl` wheel's libmkl_rt.so.3: the library the extension links."""
    for f in importlib.metadata.distribution("mkl").files or []:
        if f.name == "libmkl_rt.so.3":
            return ctypes.CDLL(str(f.locate()), mode=ctypes.RTLD_GLOBAL)
    raise RuntimeError("the `mkl` package is installed without libmkl_rt.so.3")


def fft_first(rt: ctypes.CDLL) -> None:
    """One complex double-precision 1-D FFT through DFTI, as mkl_fft makes:
    MKL's first calls of the process, its memory manager's among them."""
    handle = ctypes.c_void_p()
    rt.DftiCreateDescriptor_d_1d.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                             ctypes.c_long]
    rt.DftiCreateDescriptor_d_1d.restype = ctypes.c_long
    rt.DftiCommitDescriptor.argtypes = [ctypes.c_void_p]
    rt.DftiCommitDescriptor.restype = ctypes.c_long
    rt.DftiComputeForward.restype = ctypes.c_long
    rt.DftiFreeDescriptor.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    rt.DftiFreeDescriptor.restype = ctypes.c_long
    DFTI_COMPLEX = 32
    n = 64
    assert rt.DftiCreateDescriptor_d_1d(ctypes.byref(handle), DFTI_COMPLEX, n) == 0
    assert rt.DftiCommitDescriptor(handle) == 0
    data = (ctypes.c_double * (2 * n))(*([1.0, 0.0] * n))
    assert rt.DftiComputeForward(handle, data) == 0
    assert abs(data[0] - n) < 1e-9 and abs(data[2]) < 1e-9  # the transform of ones
    assert rt.DftiFreeDescriptor(ctypes.byref(handle)) == 0


def stack_of(pid: int) -> str:
    try:
        r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                           capture_output=True, text=True, timeout=60)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no stack: {e!r})"


def wait_with_deadline(pid: int, deadline: float) -> int | None:
    end = time.monotonic() + deadline
    pause = 0.0002
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return status
        if time.monotonic() > end:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def fork_children(forks: int, child) -> tuple[int, str | None]:
    """Forks ``forks`` times; each child runs ``child()`` and ``_exit``s with
    0 (3 if it raised). Returns the forks made and the first failure: a
    child that ended otherwise, or one still running after
    ``CHILD_DEADLINE`` (its stack, then killed)."""
    done = 0
    for i in range(forks):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                child()
            except BaseException:  # noqa: BLE001 - the exit status tells the parent
                code = 3
            os._exit(code)
        done += 1
        status = wait_with_deadline(pid, CHILD_DEADLINE)
        if status is None:
            failure = (f"fork {i}: child {pid} still running after {CHILD_DEADLINE} s; "
                       f"its stack:\n{stack_of(pid)}")
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return done, failure
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            return done, f"fork {i}: child {pid} ended with wait status {status:#x}"
    return done, None


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

    done, failure = fork_children(forks, child)
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
    try:
        r = subprocess.run([sys.executable, __file__, str(FORKS)], capture_output=True,
                           text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"ran over 300 s:\n{e.stdout}\n{e.stderr}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"forks={FORKS} failures=0" in r.stdout, r.stdout + r.stderr


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else FORKS))
