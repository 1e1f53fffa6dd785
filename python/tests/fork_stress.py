"""Fork while threads allocate MKL memory (issue 21): the program that
test_fork.py runs in a subprocess, once per environment.

    python fork_stress.py forks [N]   # the main thread forks N times (1000)
    python fork_stress.py pool        # a fork-context multiprocessing Pool

Worker threads (``THREADS``) allocate and free large (1 to 5 MiB: the block
cache's sizes and, from 4 MiB, huge pages') and small blocks through every
path: ``MKLMemory`` (allocated and reallocated with the interpreter
detached, so truly concurrently with a fork), ``realloc`` across the 1 MiB
and 4 MiB thresholds, and, inside ``numpy_memory()`` entered in each thread
(handlers are per context), ``np.empty``, ``np.zeros`` and
``ndarray.resize``.

``forks``: meanwhile the main thread forks N times, one child at a time.
The workers run for 0.5 to 3 ms before each fork and pause while the child
runs (on two cores they would otherwise take most of its time). Each child
allocates, checks and frees through every path, large and small, reads
``mem_stat()``, calls ``free_buffers()`` and leaves with ``os._exit(0)``;
the parent waits for it with a deadline (``CHILD_DEADLINE``). A child that
does not exit by then is hung: its stack (gdb, every thread) is printed, it
is killed, and the program exits 1.

``pool``: a ``multiprocessing`` Pool with the fork start method, made and
used under ``numpy_memory()`` while the threads allocate, maps tasks that
allocate MKL-backed arrays; ``maxtasksperchild`` makes it fork new workers
during the map. It must finish within ``POOL_DEADLINE``.

The last line printed is a summary; any failure exits non-zero.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sys
import threading
import time
import warnings

import numpy as np

import mkl_alloc
from mkl_alloc import MKLMemory, is_mkl_array, numpy_memory

from forking import fork_one, hung, wait_with_deadline

# CPython 3.12+ warns when a multi-threaded process forks; forking from
# threads is exactly what is tested here.
warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork\(\)", category=DeprecationWarning)

KiB, MiB = 1 << 10, 1 << 20
THREADS = 2
CHILD_DEADLINE = 10.0  # seconds a child may take before it counts as hung
POOL_DEADLINE = 60.0
POOL_TASKS = 36


def large(rng: random.Random) -> int:
    """1 to 5 MiB: the block cache's sizes, and from 4 MiB huge pages'. A few
    sizes, each with a little jitter, so that the cache reuses its blocks
    (it serves n bytes from a block of n to n + n/8) and the process stays
    small: a fork's cost grows with the memory it has touched."""
    base = rng.choice([MiB, 3 * MiB // 2, 2 * MiB, 3 * MiB, 9 * MiB // 2])
    return base + rng.randrange(0, base // 16, 4096)


def small(rng: random.Random) -> int:
    return rng.choice([rng.randrange(8, 1025, 8), rng.randrange(4 * KiB, 256 * KiB, 64)])


class Worker(threading.Thread):
    """Allocates and frees through every path until stopped, while ``go`` is
    set; keeps a few blocks alive so that frees come in mixed order and
    sizes."""

    def __init__(self, seed: int, stop: threading.Event, go: threading.Event) -> None:
        super().__init__(daemon=True)
        self.rng = random.Random(seed)
        self.stop = stop
        self.go = go
        self.ops = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        held: list[object] = []
        try:
            with numpy_memory():
                while not self.stop.is_set():
                    self.go.wait()
                    held.append(self.step())
                    if len(held) > 2:
                        held.pop(self.rng.randrange(len(held)))
                    self.ops += 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.error = e

    def step(self) -> object:
        rng = self.rng
        n = large(rng) if rng.random() < 0.5 else small(rng)
        op = rng.randrange(5)
        if op == 0:  # MKLMemory: MKL_calloc'd, with the interpreter detached
            m = MKLMemory(n, alignment=rng.choice([64, 4096]))
            memoryview(m)[-1] = 7
            return m
        if op == 1:  # realloc (detached) across the cache's and huge pages' thresholds
            m = MKLMemory(n)
            # refcheck=False here and below: the blocks are this thread's
            # own, but CPython 3.14+ cannot tell a local that its compiler
            # loads with a strong reference from another holder (NumPy's
            # resize refuses the same); the fork, not that rule, is tested.
            m.realloc(large(rng) if n < MiB else small(rng), refcheck=False)
            m.realloc(rng.choice([small(rng), large(rng), 6 * MiB]), refcheck=False)
            return m
        if op == 2:  # NumPy's malloc through the handler
            a = np.empty(n // 8 + 1)
            a[0] = a[-1] = 1.0
            return a
        if op == 3:  # NumPy's calloc (large zeroed blocks zeroed lazily)
            a = np.zeros(n // 8 + 1)
            assert a[-1] == 0.0
            return a
        a = np.empty(n // 8 + 1)  # NumPy's realloc through the handler
        a.resize(large(rng) // 8 if n < MiB else small(rng) // 8, refcheck=False)
        return a


def child_work() -> None:
    """What every child does: allocate, check and free through each path,
    large and small, then give everything back. Kept small, touching few
    pages: a child's cost is mostly its page faults."""
    m = MKLMemory(MiB + 4096, alignment=4096)  # the block cache's sizes
    view = memoryview(m)
    assert view[0] == 0 and view[-1] == 0
    view[-1] = 1
    view.release()
    m.realloc(MiB + MiB // 4, refcheck=False)  # grows a large block
    view = memoryview(m)
    assert view[MiB + 4095] == 1 and view[-1] == 0
    view.release()
    m.realloc(100, refcheck=False)
    s = MKLMemory(b"child")
    s.realloc(MiB + 8192, refcheck=False)  # small to large
    with memoryview(s) as view:
        assert view[:5] == b"child"
    with numpy_memory():
        a = np.empty(4 * MiB // 8)  # huge pages' sizes: one element touched
        a[-1] = 2.0
        z = np.zeros(MiB // 8 + 512)
        r = np.empty(1000)
        r.resize(MiB // 8 + 4096, refcheck=False)  # small to large
        t = np.arange(64.0)
        u = t * 2 + 1
        assert z[-1] == 0.0 and u[-1] == 127.0
        assert all(is_mkl_array(x) for x in (a, z, r, t, u))
    del m, s, a, z, r, t, u
    assert mkl_alloc.mem_stat().live_bytes >= 0
    mkl_alloc.free_buffers()


def start_workers() -> tuple[threading.Event, threading.Event, list[Worker]]:
    """THREADS workers, running (``go`` set) once this returns."""
    stop, go = threading.Event(), threading.Event()
    go.set()
    workers = [Worker(seed, stop, go) for seed in range(THREADS)]
    for w in workers:
        w.start()
    while any(w.ops == 0 and w.error is None for w in workers):
        time.sleep(0.001)  # every thread is in its loop before the first fork
    return stop, go, workers


def stop_workers(stop: threading.Event, go: threading.Event, workers: list[Worker]) -> list[str]:
    stop.set()
    go.set()
    for w in workers:
        w.join(timeout=30)
    problems = [f"worker {i} hung" for i, w in enumerate(workers) if w.is_alive()]
    problems += [f"worker {i}: {w.error!r}" for i, w in enumerate(workers) if w.error]
    return problems


def run_forks(n: int) -> int:
    """Forks n times while the workers allocate. The workers pause while a
    child runs (it would otherwise share two cores with them: most of the
    time is the child's), and run for 0.5 to 3 ms before each fork, so that
    each fork lands among their allocations and frees."""
    stop, go, workers = start_workers()
    rng = random.Random(1)
    started = time.monotonic()
    failures: list[str] = []
    forks = busy_forks = ops = 0
    for i in range(n):
        before = sum(w.ops for w in workers)
        go.set()
        time.sleep(rng.uniform(0.0005, 0.003))
        pid = fork_one(child_work)
        go.clear()
        forks += 1
        status = wait_with_deadline(pid, CHILD_DEADLINE)
        after = sum(w.ops for w in workers)
        busy_forks += after > before
        ops += after - before
        if status is None:
            failures.append(hung(i, pid, CHILD_DEADLINE))
            break
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            failures.append(f"fork {i}: child {pid} ended with wait status {status:#x}")
            break
    elapsed = time.monotonic() - started
    failures += stop_workers(stop, go, workers)
    for f in failures:
        print(f, file=sys.stderr)
    print(f"forks={forks} failures={len(failures)} busy_forks={busy_forks} worker_ops={ops} "
          f"seconds={elapsed:.1f} MKL_ALLOC_BLOCK_CACHE={os.environ.get('MKL_ALLOC_BLOCK_CACHE')!r}")
    return 1 if failures or forks < n else 0


def pool_task(i: int) -> tuple[bool, float]:
    """One task in a pool worker: MKL-backed arrays, large and small."""
    with numpy_memory():
        a = np.full((2 + i % 3) * MiB // 8, float(i))
        b = a[:1000] * 2
        m = MKLMemory(a)  # a copy of the array's bytes
        ok = is_mkl_array(a) and is_mkl_array(b) and m.nbytes == a.nbytes
        return ok, float(b.sum())


def run_pool() -> int:
    stop, go, workers = start_workers()
    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    started = time.monotonic()
    with numpy_memory():
        pool = ctx.Pool(processes=2, maxtasksperchild=3)
        try:
            result = pool.map_async(pool_task, range(POOL_TASKS), chunksize=1)
            try:
                got = result.get(timeout=POOL_DEADLINE)
            except multiprocessing.TimeoutError:
                got = None
                stacks = "\n".join(stack_of(p.pid) for p in list(pool._pool))  # type: ignore[attr-defined]
                failures.append(f"the pool did not finish {POOL_TASKS} tasks in "
                                f"{POOL_DEADLINE} s; its workers' stacks:\n{stacks}")
            want = [(True, 2000.0 * i) for i in range(POOL_TASKS)]
            if got is not None and got != want:
                failures.append(f"pool results differ: {got} != {want}")
        finally:
            pool.terminate()
            pool.join()
    elapsed = time.monotonic() - started
    failures += stop_workers(stop, go, workers)
    for f in failures:
        print(f, file=sys.stderr)
    print(f"pool_tasks={POOL_TASKS} failures={len(failures)} seconds={elapsed:.1f}")
    return 1 if failures else 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "forks"
    if mode == "forks":
        sys.exit(run_forks(int(sys.argv[2]) if len(sys.argv) > 2 else 1000))
    if mode == "pool":
        sys.exit(run_pool())
    sys.exit(f"usage: {sys.argv[0]} forks [N] | pool")
