"""mkl_alloc.dask against real Dask (distributed): the plugin on a cluster of
process workers, the module as a preload (LocalCluster's, a scheduler's, a
client's, and the CLI's `dask worker --preload`), the mkl_alloc_* metrics
the scheduler shows, teardown, and the example. Each way is checked against
tasks without it, which allocate on NumPy's default memory.

One cluster of process workers serves most tests; the file takes ~30 s."""

import asyncio
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import linux_only, require_dask

distributed = require_dask()

import dask  # noqa: E402
import numpy as np  # noqa: E402
from distributed import Client, LocalCluster, Nanny  # noqa: E402

import mkl_alloc  # noqa: E402
import mkl_alloc.dask as mkl_dask  # noqa: E402

pytestmark = linux_only("Dask's process workers are tested on Linux")

PYTHON_DIR = pathlib.Path(__file__).resolve().parent.parent
TASKS = 40
MiB = 1 << 20
# The schedulers' and workers' HTTP servers (health, metrics; the dashboard
# where bokeh is installed): on 127.0.0.1 (Dask's CLI and thread workers
# bind theirs to every interface otherwise), at a free port (not Dask's
# 8787, which another cluster may hold).
HTTP = "127.0.0.1:0"


def probe(i, delay=0.05):
    """Whether a new array in this task is on MKL memory, its address, and
    where the task ran (worker process, thread). The delay spreads the
    tasks over every thread of every worker."""
    time.sleep(delay)
    a = np.ones(1000)
    return mkl_alloc.is_mkl_array(a), a.ctypes.data, os.getpid(), threading.get_ident()


async def async_probe(i):
    """probe() as an ``async def`` task: it runs on the worker's event loop,
    in the asyncio task's context."""
    a = np.ones(1000)
    return mkl_alloc.is_mkl_array(a), a.ctypes.data, os.getpid(), threading.get_ident()


def run_probes(client, **kwargs):
    """TASKS probes, each a task of its own."""
    return client.gather(client.map(probe, range(TASKS), pure=False, **kwargs))


def threads_of(client):
    """(pid, thread) of every thread of every worker's default executor."""
    def executor_threads(dask_worker):
        return [(os.getpid(), t.ident) for t in dask_worker.executors["default"]._threads]

    return {t for threads in client.run(executor_threads).values() for t in threads}


def assert_all_on_mkl(client, results, nthreads):
    """40 of 40 on MKL memory, on every thread of every worker."""
    assert [r[0] for r in results] == [True] * TASKS
    used = {(r[2], r[3]) for r in results}
    assert len(used) == nthreads
    assert used == threads_of(client)


def wait_for_metrics(client, present=True, timeout=15):
    """The scheduler's view of each worker's metrics, once every worker's
    shows the mkl_alloc_* figures (or, with present=False, none of them)."""
    deadline = time.monotonic() + timeout
    while True:
        workers = client.scheduler_info()["workers"]
        shown = {w: {k: v for k, v in info["metrics"].items() if k.startswith("mkl_alloc_")}
                 for w, info in workers.items()}
        if workers and all(bool(m) == present for m in shown.values()):
            return shown
        if time.monotonic() > deadline:
            raise AssertionError(f"mkl_alloc_* metrics not {'shown' if present else 'gone'}: {shown}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def client():
    """A cluster of 2 process workers of 2 threads each, on 127.0.0.1."""
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      host="127.0.0.1", dashboard_address=HTTP) as cluster:
        with Client(cluster) as c:
            yield c


@pytest.fixture
def plugin(client):
    """NumpyOnMKL registered on the cluster for one test, then removed."""
    client.register_plugin(mkl_dask.NumpyOnMKL())
    yield
    if mkl_dask.PLUGIN_NAME in client.run_on_scheduler(
            lambda dask_scheduler: list(dask_scheduler.worker_plugins)):
        client.unregister_worker_plugin(mkl_dask.PLUGIN_NAME)


def test_without_the_plugin_no_task_is_on_mkl(client):
    # The control, and the finding: a handler set by client.run
    # (in the worker's main thread) reaches no task either.
    client.run(lambda: mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler()) and None)
    assert [r[0] for r in run_probes(client)] == [False] * TASKS


def test_the_plugin_puts_every_task_on_every_thread_on_mkl(client, plugin):
    assert_all_on_mkl(client, run_probes(client), nthreads=4)
    # An async task runs in the asyncio task's context: also on MKL.
    assert all(r[0] for r in client.gather(client.map(async_probe, range(4), pure=False)))


def test_the_scheduler_shows_each_workers_mkl_alloc_metrics(client, plugin):
    # 16 MiB on MKL memory kept on each worker: its live bytes show it.
    held = {w: client.submit(np.ones, 2 * MiB, workers=[w], pure=False)
            for w in client.scheduler_info()["workers"]}
    distributed.wait(list(held.values()))
    deadline = time.monotonic() + 15
    while True:
        shown = wait_for_metrics(client)
        if all(m["mkl_alloc_live_bytes"] >= 16 * MiB for m in shown.values()):
            break
        assert time.monotonic() < deadline, shown
        time.sleep(0.2)
    assert set(shown) == set(held)
    for m in shown.values():
        assert set(m) == set(mkl_dask.METRICS)
        assert all(isinstance(v, int) and v >= 0 for v in m.values()), m
        assert m["mkl_alloc_live_buffers"] >= 1
    del held


def test_a_worker_that_joins_later_gets_the_plugin(client, plugin):
    cluster = client.cluster
    before = set(client.scheduler_info()["workers"])
    cluster.scale(3)
    client.wait_for_workers(3, timeout=60)
    try:
        (new,) = set(client.scheduler_info()["workers"]) - before
        results = run_probes(client, workers=[new])
        assert [r[0] for r in results] == [True] * TASKS
    finally:
        cluster.scale(2)
        deadline = time.monotonic() + 30
        while len(client.scheduler_info()["workers"]) > 2 and time.monotonic() < deadline:
            time.sleep(0.1)


def test_registering_again_replaces_the_plugin(client, plugin):
    client.register_plugin(mkl_dask.NumpyOnMKL(alignment=1 << 16))
    results = run_probes(client)
    assert all(ok and address % (1 << 16) == 0 for ok, address, _, _ in results)


def test_teardown_puts_later_tasks_back_and_keeps_earlier_arrays(client, plugin):
    (w, *_) = client.scheduler_info()["workers"]
    before = client.submit(np.arange, 1_000_000, workers=[w], pure=False)
    assert client.submit(mkl_alloc.is_mkl_array, before, workers=[w]).result()
    wait_for_metrics(client)
    client.unregister_worker_plugin(mkl_dask.PLUGIN_NAME)
    assert [r[0] for r in run_probes(client)] == [False] * TASKS
    # The array made before is still MKL memory, and still good.
    assert client.submit(mkl_alloc.is_mkl_array, before, workers=[w]).result()
    assert client.submit(lambda a: int(a.sum()), before, workers=[w]).result() == 499999500000
    wait_for_metrics(client, present=False)
    # Each worker's execute is its class's again.
    assert set(client.run(lambda dask_worker: "execute" in vars(dask_worker)).values()) == {False}


def test_a_bad_alignment_is_refused_on_the_client():
    with pytest.raises(ValueError):
        mkl_dask.NumpyOnMKL(alignment=3)
    for bad in (0, -1.0, "1", True):
        with pytest.raises(ValueError, match="trim_after"):
            mkl_dask.NumpyOnMKL(trim_after=bad)


def trims(client):
    return client.run(lambda dask_worker: dask_worker.plugins[mkl_dask.PLUGIN_NAME].trims)


def wait_for_trims(client, least, timeout=15):
    deadline = time.monotonic() + timeout
    while True:
        counts = trims(client)
        if all(n >= least.get(w, 1) for w, n in counts.items()):
            return counts
        assert time.monotonic() < deadline, f"no idle trim: {counts}, expected {least}"
        time.sleep(0.1)


def test_an_idle_worker_trims_the_c_heap_once_per_idle_spell(client):
    client.register_plugin(mkl_dask.NumpyOnMKL(trim_after=0.2))
    try:
        idle = wait_for_trims(client, {})
        time.sleep(1.0)  # five more checks, still idle: no second trim
        assert trims(client) == idle
        # Work on every worker, then idle again: one trim more each.
        run_probes(client)
        wait_for_trims(client, {w: n + 1 for w, n in idle.items()})
        time.sleep(1.0)
        assert all(n == idle[w] + 1 for w, n in trims(client).items()), (idle, trims(client))
    finally:
        client.unregister_worker_plugin(mkl_dask.PLUGIN_NAME)
    assert set(client.run(
        lambda dask_worker: mkl_dask.TRIM_CALLBACK in dask_worker.periodic_callbacks).values()) == {False}


def test_no_trim_when_turned_off(client):
    client.register_plugin(mkl_dask.NumpyOnMKL(trim_after=None))
    try:
        assert set(client.run(
            lambda dask_worker: mkl_dask.TRIM_CALLBACK in dask_worker.periodic_callbacks).values()) == {False}
    finally:
        client.unregister_worker_plugin(mkl_dask.PLUGIN_NAME)


def test_local_cluster_preload():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=HTTP, preload=["mkl_alloc.dask"]) as cluster, \
            Client(cluster) as c:
        assert_all_on_mkl(c, run_probes(c), nthreads=2)
        wait_for_metrics(c)


def test_scheduler_and_client_preloads():
    # A scheduler's preload registers the plugin for every worker; a
    # client's (the distributed.client.preload setting) with its cluster.
    # Thread workers: the same plugin, without starting processes.
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=HTTP, worker_dashboard_address=HTTP,
                      scheduler_kwargs={"preload": ["mkl_alloc.dask"]}) as cluster, \
            Client(cluster) as c:
        assert_all_on_mkl(c, run_probes(c), nthreads=2)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=HTTP, worker_dashboard_address=HTTP) as cluster:
        with Client(cluster) as c:
            assert [r[0] for r in run_probes(c)] == [False] * TASKS
        with dask.config.set({"distributed.client.preload": ["mkl_alloc.dask"]}), \
                Client(cluster) as c:
            assert_all_on_mkl(c, run_probes(c), nthreads=2)


def test_a_nanny_or_anything_else_is_refused_by_the_preload_hook():
    with pytest.raises(TypeError, match="--preload-nanny"):
        asyncio.run(mkl_dask.dask_setup(Nanny.__new__(Nanny)))
    with pytest.raises(TypeError, match="not object"):
        asyncio.run(mkl_dask.dask_setup(object()))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_cli_worker_preload(tmp_path):
    dask_cli = pathlib.Path(sys.executable).with_name("dask")
    # The scheduler and the worker unpickle this module's task functions by
    # reference, as LocalCluster's spawned workers do (they get pytest's
    # sys.path): they import it from here.
    path = [str(pathlib.Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("scheduler", "worker")}
    procs = []
    try:
        procs.append(subprocess.Popen(
            [str(dask_cli), "scheduler", "--host", "127.0.0.1", "--port", str(port),
             "--no-dashboard", "--dashboard-address", HTTP], stdout=logs["scheduler"], stderr=subprocess.STDOUT, env=env))
        procs.append(subprocess.Popen(
            # No nanny: one process to clean up (LocalCluster's workers above
            # have theirs, and take the preload through it).
            [str(dask_cli), "worker", address, "--host", "127.0.0.1", "--nthreads", "2",
             "--no-nanny", "--no-dashboard", "--dashboard-address", HTTP,
             "--preload", "mkl_alloc.dask"],
            stdout=logs["worker"], stderr=subprocess.STDOUT, env=env))
        with Client(address, timeout=60) as c:
            c.wait_for_workers(1, timeout=60)
            assert_all_on_mkl(c, run_probes(c), nthreads=2)
            wait_for_metrics(c)
    except BaseException:
        for name, f in logs.items():
            f.flush()
            print(f"--- dask {name}:\n{(tmp_path / f'{name}.log').read_text()}")
        raise
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()


def test_the_example_runs():
    r = subprocess.run([sys.executable, str(PYTHON_DIR / "examples" / "dask_numpy_on_mkl.py")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "40 of 40 tasks on MKL memory" in r.stdout, r.stdout


def test_import_without_distributed_names_the_extra():
    code = ("import sys; sys.modules['distributed'] = None\n"
            "try:\n    import mkl_alloc.dask\n"
            "except ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "pip install 'mkl-alloc[dask]'" in r.stdout, r.stdout
