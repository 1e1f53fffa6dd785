"""What the fork tests share: their programs (fork_stress.py,
test_fork_mkl_first.py, test_fork_foreign_mkl.py) each fork children and
wait for them with a deadline, printing a hung child's stacks; their tests
run those programs in a fresh interpreter and read the summary line."""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable


def stack_of(pid: int) -> str:
    """Every thread's stack of a hung process, from gdb (if it is there)."""
    try:
        r = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
            capture_output=True, text=True, timeout=60,
        )
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no stack: {e!r})"


def wait_with_deadline(pid: int, deadline: float) -> int | None:
    """The child's wait status, or None if it has not exited by the deadline.
    Blocks in select() on a pidfd (the interpreter detached) where there is
    one, else polls waitpid(WNOHANG)."""
    end = time.monotonic() + deadline
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        pause = 0.0002
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return status
            left = end - time.monotonic()
            if left <= 0:
                return None
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(pause, left))
                pause = min(pause * 2, 0.02)
    finally:
        if fd is not None:
            os.close(fd)


def hung(i: int, pid: int, deadline: float) -> str:
    """The failure of fork ``i``'s child still running after ``deadline``:
    its stacks, then the child killed and reaped."""
    failure = f"fork {i}: child {pid} still running after {deadline} s; its stack:\n{stack_of(pid)}"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return failure


def fork_one(child: Callable[[], None]) -> int:
    """Forks; the child runs ``child()`` and ``_exit``s with 0, or with 3
    after printing the traceback if it raised. Returns the child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            child()
        except BaseException:  # noqa: BLE001 - the exit status tells the parent
            traceback.print_exc()
            code = 3
        os._exit(code)
    return pid


def fork_children(forks: int, child: Callable[[], None],
                  deadline: float = 5.0) -> tuple[int, str | None]:
    """Forks ``forks`` times, one child at a time, each running ``child()``
    (see ``fork_one``). Returns the forks
    made and the first failure: a child that ended otherwise, or one still
    running after ``deadline`` seconds (see ``hung``)."""
    done = 0
    for i in range(forks):
        pid = fork_one(child)
        done += 1
        status = wait_with_deadline(pid, deadline)
        if status is None:
            return done, hung(i, pid, deadline)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            return done, f"fork {i}: child {pid} ended with wait status {status:#x}"
    return done, None


def mkl_rt() -> ctypes.CDLL:
    """The `mkl` wheel's libmkl_rt.so.3 (the library the extension links),
    with the DFTI entries the tests call declared."""
    for f in importlib.metadata.distribution("mkl").files or []:
        if f.name == "libmkl_rt.so.3":
            rt = ctypes.CDLL(str(f.locate()), mode=ctypes.RTLD_GLOBAL)
            rt.DftiCreateDescriptor_d_1d.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                                     ctypes.c_int, ctypes.c_long]
            rt.DftiCreateDescriptor_d_1d.restype = ctypes.c_long
            rt.DftiCommitDescriptor.argtypes = [ctypes.c_void_p]
            rt.DftiCommitDescriptor.restype = ctypes.c_long
            rt.DftiComputeForward.restype = ctypes.c_long
            rt.DftiFreeDescriptor.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            rt.DftiFreeDescriptor.restype = ctypes.c_long
            return rt
    raise RuntimeError("the `mkl` package is installed without libmkl_rt.so.3")


def run_program(path: str, *args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Runs ``python path args...`` in a fresh interpreter; fails the test
    if it runs over ``timeout`` seconds or exits non-zero; returns its last
    line of output (the summary)."""
    import pytest

    try:
        r = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{os.path.basename(path)} {' '.join(args)} ran over {timeout} s:\n"
                    f"{e.stdout}\n{e.stderr}")
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1]
