"""Dask workers on MKL memory: a local cluster of process workers, the
plugin registered on it, every task's new NumPy arrays on MKL memory, and
the package's figures in each worker's metrics, as the scheduler shows them.

    pip install 'mkl-alloc[dask]'
    python python/examples/dask_numpy_on_mkl.py

Checked by ``mypy --strict`` (python/tests/test_typing.py) and run by
python/tests/test_dask.py. See docs/dask.md.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import mkl_alloc

# The ignores: mypy checks the examples also where the dask extra is not
# installed (there distributed's names are Any).
from distributed import Client, LocalCluster  # type: ignore[import-not-found,unused-ignore]
from mkl_alloc.dask import NumpyOnMKL


def task(i: int) -> bool:
    """A task that makes an array: is its data on MKL memory?"""
    a = np.full(100_000, float(i))
    return mkl_alloc.is_mkl_array(a)


def main() -> None:
    # distributed's constructors have no type annotations (mypy --strict).
    with LocalCluster(  # type: ignore[no-untyped-call,unused-ignore]
            n_workers=2, threads_per_worker=2, processes=True,
            host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client:  # type: ignore[no-untyped-call,unused-ignore]
        before: list[bool] = client.gather(client.map(task, range(40), pure=False))
        print(f"without the plugin: {sum(before)} of {len(before)} tasks on MKL memory")

        client.register_plugin(NumpyOnMKL(alignment=64))
        after: list[bool] = client.gather(client.map(task, range(40), pure=False))
        print(f"with NumpyOnMKL: {sum(after)} of {len(after)} tasks on MKL memory")
        assert all(after) and not any(before)

        # Kept on the workers: 8 MB of MKL memory each, in their metrics.
        kept = client.map(np.ones, [1_000_000] * 2, pure=False)
        client.gather(kept)
        time.sleep(1.5)  # a heartbeat or two: the scheduler's view catches up
        workers: dict[str, Any] = client.scheduler_info()["workers"]
        for address, info in sorted(workers.items()):
            figures = {k: v for k, v in info["metrics"].items() if k.startswith("mkl_alloc_")}
            print(address, figures)

        client.unregister_worker_plugin("mkl_alloc.dask.NumpyOnMKL")
        later: list[bool] = client.gather(client.map(task, range(40), pure=False))
        print(f"after teardown: {sum(later)} of {len(later)} tasks on MKL memory")


if __name__ == "__main__":
    main()
