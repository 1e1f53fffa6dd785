"""mkl_alloc.pools: NumPy's arrays on MKL memory in concurrent.futures and
multiprocessing pools (one initializer per pool) and in threads of one's
own (on_mkl), each checked against the same pool or thread without it."""

import multiprocessing
import os
import pickle
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest
from conftest import linux_only

import mkl_alloc
from mkl_alloc import is_mkl_array, pools

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # NumPy 1.x
    from numpy.core.multiarray import get_handler_name

THREADS = 3
TASKS = 30


@pytest.fixture(autouse=True)
def default_handler_around_each_test():
    """Every test starts and must end on NumPy's default handler."""
    assert get_handler_name() == "default_allocator"
    yield
    assert get_handler_name() == "default_allocator", "a test left a handler installed"


def probe(_=None):
    """Whether a new array here is on MKL memory, its address, and where it
    was made (process, thread)."""
    a = np.ones(1000)
    return is_mkl_array(a), a.ctypes.data, os.getpid(), threading.get_ident()


def probe_after(barrier, _=None):
    """probe(), once ``barrier`` lets every pool thread through together:
    each of the first THREADS tasks then runs on a thread of its own."""
    barrier.wait(timeout=30)
    return probe()


def run_in_thread_pool(**kwargs):
    """TASKS probes in a ThreadPoolExecutor of THREADS threads (its first
    THREADS tasks held at a barrier, so that every thread runs one)."""
    barrier = threading.Barrier(THREADS)
    with ThreadPoolExecutor(THREADS, **kwargs) as ex:
        first = [ex.submit(probe_after, barrier) for _ in range(THREADS)]
        rest = [ex.submit(probe) for _ in range(TASKS - THREADS)]
        return [f.result() for f in first + rest]


def test_thread_pool_without_the_initializer_is_on_numpy_memory():
    # The control: a handler set in the submitting thread does not reach
    # the pool's threads (each starts on an empty context).
    with mkl_alloc.numpy_memory():
        results = run_in_thread_pool()
    assert [r[0] for r in results] == [False] * TASKS


def test_thread_pool_initializer_puts_every_task_of_every_thread_on_mkl():
    results = run_in_thread_pool(initializer=pools.initializer())
    assert [r[0] for r in results] == [True] * TASKS
    assert len({r[3] for r in results}) == THREADS
    # The submitting thread is untouched.
    assert not is_mkl_array(np.ones(1000))


def test_thread_pool_initializer_alignment():
    results = run_in_thread_pool(initializer=pools.initializer(alignment=1 << 16))
    assert all(ok and address % (1 << 16) == 0 for ok, address, _, _ in results)


@pytest.mark.parametrize("bad", [0, 3, 48, 2**31])
def test_a_bad_alignment_is_refused_at_once(bad):
    with pytest.raises(ValueError):
        pools.initializer(bad)
    with pytest.raises(ValueError):
        pools.on_mkl(probe, bad)
    with pytest.raises(ValueError):
        pools.use_numpy_on_mkl(bad)


def test_on_mkl_refuses_what_is_not_callable():
    with pytest.raises(TypeError, match="must be callable, not int"):
        pools.on_mkl(3)


def test_the_initializer_and_on_mkl_pickle():
    init = pickle.loads(pickle.dumps(pools.initializer(128)))
    fn = pickle.loads(pickle.dumps(pools.on_mkl(probe, 128)))
    ok, address, _, _ = fn()
    assert ok and address % 128 == 0
    assert not is_mkl_array(np.ones(1000))  # on_mkl put the default back
    box = []
    t = threading.Thread(target=lambda: (init(), box.append(probe())))
    t.start()
    t.join()
    assert box[0][0]


def test_a_user_thread_through_on_mkl():
    seen = {}

    def work(name):
        seen[name] = probe()[0]
        return name

    threads = [threading.Thread(target=pools.on_mkl(work), args=("mkl",)),
               threading.Thread(target=work, args=("plain",))]
    with mkl_alloc.numpy_memory():  # not inherited by the plain thread
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert seen == {"mkl": True, "plain": False}


def test_on_mkl_returns_the_result_and_restores_the_handler_through_an_exception():
    def fails():
        assert is_mkl_array(np.ones(10))
        raise KeyError("from fn")

    assert pools.on_mkl(lambda x, y=1: x + y)(2, y=3) == 5
    with pytest.raises(KeyError, match="from fn"):
        pools.on_mkl(fails)()
    assert get_handler_name() == "default_allocator"


def test_use_numpy_on_mkl_sets_the_handler_in_this_context_for_good():
    box = []

    def thread():
        pools.use_numpy_on_mkl(256)
        a, b = np.ones(1000), np.zeros(3000)
        box.append((is_mkl_array(a), is_mkl_array(b), b.ctypes.data % 256))

    t = threading.Thread(target=thread)
    t.start()
    t.join()
    assert box == [(True, True, 0)]


# Process pools: spawned interpreters, which unpickle the initializer (a
# fork would also inherit the parent's context by copying its memory).
PROCESSES = 2


@linux_only("process pools are checked with Linux's spawn start method")
def test_process_pool_executor_initializer():
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(PROCESSES, mp_context=ctx) as ex:
        plain = list(ex.map(probe, range(8)))
    with ProcessPoolExecutor(PROCESSES, mp_context=ctx,
                             initializer=pools.initializer(4096)) as ex:
        on_mkl = list(ex.map(probe, range(TASKS)))
        # on_mkl() pickles into a worker as a single task's wrapper too.
        one = ex.submit(pools.on_mkl(probe, 1 << 20)).result()
    assert [r[0] for r in plain] == [False] * 8
    assert [r[0] for r in on_mkl] == [True] * TASKS
    assert all(r[1] % 4096 == 0 for r in on_mkl)
    assert os.getpid() not in {r[2] for r in on_mkl}
    assert one[0] and one[1] % (1 << 20) == 0


@linux_only("process pools are checked with Linux's spawn start method")
def test_multiprocessing_pool_initializer():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES, initializer=pools.initializer()) as pool:
        results = pool.map(probe, range(TASKS), chunksize=1)
    assert [r[0] for r in results] == [True] * TASKS
    assert os.getpid() not in {r[2] for r in results}
