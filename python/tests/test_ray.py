"""mkl_alloc.ray against real Ray: a local cluster (``ray.init`` on this
machine, no dashboard) per job, tasks and actors in worker processes of a
job with the package's ``runtime_env``, checked against the same work in a
job without it, which allocates on NumPy's default memory. Collected only where Ray is
installed (the ``ray`` extra), like test_dask.py; ~20 s, most of it Ray's
start."""

import os
import sys

import pytest
from conftest import linux_only, require_ray

ray = require_ray()

import numpy as np  # noqa: E402

import mkl_alloc  # noqa: E402
import mkl_alloc.pools  # noqa: E402
import mkl_alloc.ray as mkl_ray  # noqa: E402

pytestmark = linux_only("Ray's local cluster is tested on Linux")

# The workers cannot import this test module (python/tests is not on their
# path): its functions and classes go to them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TASKS = 40


def probe(_i=0):
    """Whether a new array in this task is on MKL memory, its address
    modulo 4096, and the worker process it ran in."""
    a = np.ones(1000)
    return mkl_alloc.is_mkl_array(a), a.ctypes.data % 4096, os.getpid()


class Holder:
    """An actor that keeps the arrays it makes."""

    def __init__(self):
        self.arrays = []

    def make(self, n):
        a = np.ones(n)
        self.arrays.append(a)
        return mkl_alloc.is_mkl_array(a), float(a.sum())


class AsyncHolder:
    """An async actor: Ray runs its methods on an event loop thread of its
    own, which the setup hook's handler does not reach."""

    async def make(self, n, recipe):
        if recipe:
            # The documented recipe for such actors.
            mkl_alloc.pools.use_numpy_on_mkl()
        return mkl_alloc.is_mkl_array(np.ones(n))


def run_job(runtime_env):
    """A local Ray cluster (2 CPUs, no dashboard, a small object store)
    whose job has ``runtime_env``: TASKS probes as tasks, and three arrays
    made by an actor; then the cluster is shut down. Ray takes a
    ``worker_process_setup_hook`` from the job's runtime_env only."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=128 << 20,
        log_to_driver=False,
        runtime_env=runtime_env,
    )
    try:
        tasks = ray.get([ray.remote(probe).remote(i) for i in range(TASKS)])
        h = ray.remote(Holder).remote()
        made = ray.get([h.make.remote(n) for n in (10, 1000, 100_000)])
        a = ray.remote(AsyncHolder).remote()
        made_async = ray.get([a.make.remote(1000, False), a.make.remote(1000, True)])
        return tasks, made, made_async
    finally:
        ray.shutdown()


def test_tasks_and_an_actor_allocate_on_mkl_memory_with_the_runtime_env():
    tasks, made, made_async = run_job(mkl_ray.runtime_env())
    assert [t[0] for t in tasks] == [True] * TASKS
    assert made == [(True, 10.0), (True, 1000.0), (True, 100_000.0)]
    # An async actor's methods: not reached by the hook; the recipe works.
    assert made_async == [False, True]


def test_without_it_they_allocate_on_numpys_memory():
    tasks, made, _ = run_job(None)
    assert [t[0] for t in tasks] == [False] * TASKS
    assert [m[0] for m in made] == [False] * 3


def test_the_hook_by_name_and_another_alignment():
    tasks, made, _ = run_job({"worker_process_setup_hook": "mkl_alloc.ray.setup_hook"})
    assert all(t[0] for t in tasks) and all(m[0] for m in made)
    tasks, made, _ = run_job(mkl_ray.runtime_env(4096))
    assert all(t[0] for t in tasks) and all(m[0] for m in made)
    # Every array's data at a page boundary: the handler's alignment.
    assert {t[1] for t in tasks} == {0}


def test_runtime_env_checks_its_arguments():
    with pytest.raises(ValueError, match="power of two"):
        mkl_ray.runtime_env(48)
    with pytest.raises(ValueError, match="worker_process_setup_hook"):
        mkl_ray.runtime_env(worker_process_setup_hook="my.hook")
    env = mkl_ray.runtime_env(env_vars={"OMP_NUM_THREADS": "1"})
    assert env == {"env_vars": {"OMP_NUM_THREADS": "1"}, "worker_process_setup_hook": "mkl_alloc.ray.setup_hook"}
