"""Dask workers on MKL memory: every task's new NumPy arrays, and the
package's figures in each worker's metrics (docs/dask.md).

Three ways, all with the same effect on a worker:

- the plugin, on a running cluster, for its workers and those that join
  later: ``client.register_plugin(NumpyOnMKL())``;
- this module as a preload: ``dask worker --preload mkl_alloc.dask`` (the
  worker's own), ``dask scheduler --preload mkl_alloc.dask`` (every worker
  that registers with that scheduler), ``LocalCluster(preload=
  ["mkl_alloc.dask"])``, or the ``distributed.client.preload`` setting
  (the client registers the plugin as it connects): ``dask_setup`` adds a
  ``NumpyOnMKL()``;
- pools and threads outside Dask: :mod:`mkl_alloc.pools`.

Why a plugin cannot just call ``set_numpy_handler``: NumPy keeps its
data-memory handler in a ``contextvars.ContextVar``, and a Dask worker runs
each task in a copy of the context of the asyncio task that executes it
(``distributed.utils.run_in_executor_with_context``), not in the context of
the executor thread nor in the one where a plugin's ``setup`` or a
``client.run`` function runs. So the plugin sets the handler where each
task's context is copied from: in the asyncio task of ``Worker.execute``,
which it wraps, before the worker copies that context into the executor
thread (or runs an ``async def`` task in it). Arrays made before the plugin
is set up, data received from other workers (deserialised on the worker's
event loop), actors' methods (their executor takes no context) and tasks in
a process-pool executor stay on NumPy's default memory.

Needs Dask's distributed scheduler: ``pip install 'mkl-alloc[dask]'``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

# The ignores: mypy checks the package (`mypy -p mkl_alloc`) also where the
# extra is not installed; there distributed's names are Any.
try:
    import distributed  # type: ignore[import-not-found,unused-ignore]
    from distributed import WorkerPlugin  # type: ignore[import-not-found,unused-ignore]
    from distributed.protocol.pickle import dumps as _dumps  # type: ignore[import-not-found,unused-ignore]
except ImportError as _e:
    raise ImportError(
        "mkl_alloc.dask needs Dask's distributed scheduler (the `distributed` "
        "package), which cannot be imported here "
        f"({_e}); install the package's `dask` extra: pip install 'mkl-alloc[dask]'"
    ) from _e

import mkl_alloc

if TYPE_CHECKING:
    from distributed import Worker

__all__ = ["NumpyOnMKL", "PLUGIN_NAME", "METRICS", "TRIM_CALLBACK", "dask_setup"]

#: The name the plugin registers under, on the scheduler and on each worker:
#: registering a second ``NumpyOnMKL`` replaces the first (its teardown runs).
PLUGIN_NAME = "mkl_alloc.dask.NumpyOnMKL"


def _live_bytes(worker: Worker) -> int:
    """MKL's count of the bytes the worker process's program holds."""
    return mkl_alloc.mem_stat().live_bytes


def _live_buffers(worker: Worker) -> int:
    """MKL's count of the blocks the worker process's program holds."""
    return mkl_alloc.mem_stat().live_buffers


def _cached_bytes(worker: Worker) -> int:
    """Bytes of freed chunks the block cache keeps beneath MKL, for reuse."""
    return mkl_alloc.mem_stat().cached_bytes


def _cached_buffers(worker: Worker) -> int:
    """Freed chunks the block cache keeps beneath MKL, for reuse."""
    return mkl_alloc.mem_stat().cached_buffers


def _slack_bytes(worker: Worker) -> int:
    """Bytes live chunks keep beyond the sizes MKL asked for (growth slack)."""
    return mkl_alloc.mem_stat().slack_bytes


#: The figures the plugin adds to ``Worker.metrics`` (so to the scheduler's
#: worker info and heartbeats: ``client.scheduler_info()["workers"][address]
#: ["metrics"]``), each ``mkl_alloc.mem_stat()``'s field of the same name,
#: in the worker's process. What the crate keeps beneath MKL is
#: ``mkl_alloc_cached_bytes + mkl_alloc_slack_bytes +
#: mkl_alloc_medium_dirty_bytes``; ``mkl_alloc_medium_clean_bytes`` counts
#: freed medium blocks given back to the kernel (freed chunks the cache lets
#: go are unmapped, and counted nowhere).
def _medium_dirty_bytes(worker: Worker) -> int:
    """Freed medium blocks (4 KiB to 1 MiB) kept resident for reuse."""
    return mkl_alloc.mem_stat().medium_dirty_bytes


def _medium_clean_bytes(worker: Worker) -> int:
    """Freed medium blocks given back to the kernel after the decay time."""
    return mkl_alloc.mem_stat().medium_clean_bytes


METRICS: dict[str, Callable[[Worker], int]] = {
    "mkl_alloc_live_bytes": _live_bytes,
    "mkl_alloc_live_buffers": _live_buffers,
    "mkl_alloc_cached_bytes": _cached_bytes,
    "mkl_alloc_cached_buffers": _cached_buffers,
    "mkl_alloc_slack_bytes": _slack_bytes,
    "mkl_alloc_medium_dirty_bytes": _medium_dirty_bytes,
    "mkl_alloc_medium_clean_bytes": _medium_clean_bytes,
}


#: The name of the plugin's idle trim among ``Worker.periodic_callbacks``.
TRIM_CALLBACK = "mkl_alloc-idle-trim"


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is not glibc."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        f = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_size_t]
    f.restype = ctypes.c_int
    return cast("Callable[[int], int]", f)


class NumpyOnMKL(WorkerPlugin):  # type: ignore[misc,unused-ignore]
    """A ``distributed.WorkerPlugin`` that puts the data of the arrays
    NumPy allocates in every later task of a worker on MKL memory
    (``mkl_alloc.numpy_handler(alignment)``), on every thread of the
    worker's default executor, and adds the ``mkl_alloc_*`` figures
    (:data:`METRICS`) to the worker's metrics.

    ``client.register_plugin(NumpyOnMKL())`` sets it up on every worker of
    the cluster, including those that join later; ``alignment`` is checked
    at once (``ValueError`` for anything but a power of two from 1 to
    2**30). Teardown (``client.unregister_worker_plugin(PLUGIN_NAME)``, or
    the worker closing) puts later tasks back on NumPy's default handler
    and removes the metrics; arrays made before stay valid.

    ``trim_after`` (seconds, default 1): the period of the idle check on
    the worker's event loop. At the first check that finds no task has
    changed state since the one before and none running (one to two
    periods after the last task finished), the plugin calls glibc's
    ``malloc_trim(0)`` once, which gives back the free pages inside the C
    heap (what Dask's and Python's own objects for the released tasks left
    between live ones; the arrays' memory the crate gives back by itself).
    It runs again only after the worker has been busy. ``None`` turns it
    off, and where the C library is not glibc there is none.
    ``trims`` counts the trims this plugin ran on its worker.
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(self, alignment: int = 64, trim_after: float | None = 1.0) -> None:
        mkl_alloc.numpy_handler(alignment)  # checks it, on the client
        if trim_after is not None and (
            isinstance(trim_after, bool) or not (isinstance(trim_after, (int, float)) and trim_after > 0)
        ):
            raise ValueError(
                f"NumpyOnMKL(trim_after={trim_after!r}): the idle time before a trim is a "
                "number of seconds above 0, or None for no trim"
            )
        self.alignment = alignment
        self.trim_after = trim_after
        self.trims = 0
        self._seen: int | None = None
        self._trimmed = False
        self._active = False
        self._wrapper: Callable[..., Awaitable[Any]] | None = None
        self._previous: Callable[..., Awaitable[Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What is sent to the workers: the settings only (a plugin set up
        on one worker is never sent on)."""
        return {"alignment": self.alignment, "trim_after": self.trim_after}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A plugin not yet set up, from :meth:`__getstate__`'s state."""
        self.__init__(state["alignment"], state.get("trim_after", 1.0))  # type: ignore[misc,unused-ignore]

    def __repr__(self) -> str:
        return f"NumpyOnMKL(alignment={self.alignment}, trim_after={self.trim_after})"

    def _trim_if_idle(self, worker: Worker, trim: Callable[[int], int]) -> None:
        """The idle trim's check: trims once when no task has changed state
        since the last check and none runs."""
        state = worker.state
        seen = state.transition_counter
        if seen != self._seen:
            self._seen, self._trimmed = seen, False  # busy since the last check
            return
        if self._trimmed or state.executing_count or state.long_running:
            return
        trim(0)
        self._trimmed = True
        self.trims += 1

    def setup(self, worker: Worker) -> None:
        """Wraps ``worker.execute`` so that each task's asyncio task sets
        the handler in its own context before the worker copies that
        context for the task's thread, adds :data:`METRICS`, and starts the
        idle trim (``worker.periodic_callbacks[TRIM_CALLBACK]``)."""
        execute = getattr(worker, "execute", None)
        if execute is None or not callable(execute):
            raise RuntimeError(
                f"NumpyOnMKL.setup: this distributed ({getattr(distributed, '__version__', '?')}) has "
                "no Worker.execute to run tasks under mkl_alloc's NumPy handler"
            )
        handler = mkl_alloc.numpy_handler(self.alignment)

        async def execute_on_mkl(*args: Any, **kwargs: Any) -> Any:
            """Worker.execute, with NumPy's handler set to mkl_alloc's in this
            asyncio task's context (its own copy) while the plugin is active."""
            if self._active:
                mkl_alloc.set_numpy_handler(handler)
            return await execute(*args, **kwargs)

        self._previous = execute
        self._wrapper = execute_on_mkl
        self._active = True
        setattr(worker, "execute", execute_on_mkl)  # this worker's, not the class's
        worker.metrics.update(METRICS)
        trim = _malloc_trim() if self.trim_after is not None else None
        if trim is not None and self.trim_after is not None:
            from tornado.ioloop import PeriodicCallback  # type: ignore[import-not-found,unused-ignore]

            pc = PeriodicCallback(lambda: self._trim_if_idle(worker, trim), self.trim_after * 1000)
            worker.periodic_callbacks[TRIM_CALLBACK] = pc
            pc.start()

    def teardown(self, worker: Worker) -> None:
        """Puts later tasks back on NumPy's default handler (tasks already
        running keep theirs), removes :data:`METRICS` from the worker's
        metrics and stops the idle trim."""
        self._active = False
        if self._wrapper is not None and worker.__dict__.get("execute") is self._wrapper:
            previous = self._previous
            if getattr(previous, "__self__", None) is worker and getattr(
                previous, "__func__", None
            ) is getattr(type(worker), "execute", None):
                delattr(worker, "execute")  # the class's method again
            else:
                setattr(worker, "execute", previous)
        # Else something wrapped execute after the plugin: the wrapper stays
        # in its chain, inactive (it only calls on).
        self._wrapper = self._previous = None
        pc = worker.periodic_callbacks.pop(TRIM_CALLBACK, None)
        if pc is not None:
            pc.stop()
        for key, metric in METRICS.items():
            if worker.metrics.get(key) is metric:
                del worker.metrics[key]


async def dask_setup(dask_object: Any) -> None:
    """The preload hook (``--preload mkl_alloc.dask``): on a worker, sets up
    a ``NumpyOnMKL()`` there; on a scheduler, registers it for every worker
    that joins; on a client (the ``distributed.client.preload`` setting),
    registers it with the client's cluster. A nanny (``--preload-nanny``)
    runs no tasks: ``TypeError`` says to use ``--preload``."""
    from distributed import Client, Nanny, Scheduler, Worker

    plugin = NumpyOnMKL()
    dumps = cast("Callable[[object], bytes]", _dumps)
    if isinstance(dask_object, Worker):
        await dask_object.plugin_add(plugin=plugin, name=PLUGIN_NAME, catch_errors=False)
    elif isinstance(dask_object, Scheduler):
        await dask_object.register_worker_plugin(
            None, plugin=dumps(plugin), name=PLUGIN_NAME, idempotent=False
        )
    elif isinstance(dask_object, Client):
        scheduler = dask_object.scheduler
        if scheduler is None:
            raise RuntimeError(
                "mkl_alloc.dask preload: the client is not connected to a scheduler "
                "to register NumpyOnMKL with"
            )
        responses = await scheduler.register_worker_plugin(
            plugin=dumps(plugin), name=PLUGIN_NAME, idempotent=False
        )
        failed = {w: r for w, r in responses.items() if r.get("status") == "error"}
        if failed:
            raise RuntimeError(
                f"mkl_alloc.dask preload: NumpyOnMKL failed to set up on {sorted(failed)}: "
                + "; ".join(str(r.get("exception")) for r in failed.values())
            )
    elif isinstance(dask_object, Nanny):
        raise TypeError(
            "mkl_alloc.dask is a worker's preload, not a nanny's: a nanny runs no "
            "tasks; use `dask worker --preload mkl_alloc.dask`, not --preload-nanny"
        )
    else:
        raise TypeError(
            "mkl_alloc.dask preload: expected a distributed Worker, Scheduler or "
            f"Client to set up NumpyOnMKL on, not {type(dask_object).__name__}"
        )
