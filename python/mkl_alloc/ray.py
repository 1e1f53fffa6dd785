"""Ray workers on MKL memory: every task's new NumPy arrays (docs/dask.md, "Ray").

Ray runs a worker process's tasks, and the methods of a plain actor, in
the process's main thread. Its ``worker_process_setup_hook`` runs once in
that thread as the process starts, before its first task, so NumPy's
handler (a ``contextvars.ContextVar``, see :mod:`mkl_alloc.pools`) set
there reaches every one of them::

    import ray
    import mkl_alloc.ray

    ray.init(runtime_env=mkl_alloc.ray.runtime_env())
    # or, in a runtime_env of your own, with the default alignment:
    # {"worker_process_setup_hook": "mkl_alloc.ray.setup_hook"}

Ray takes the hook from the job's ``runtime_env`` only (``ray.init``'s, or
a submitted job's): in a task's or an actor's ``.options(runtime_env=...)``
it is not run (Ray 2.60). Not covered: the driver itself (call
:func:`mkl_alloc.pools.use_numpy_on_mkl` there), and actors whose methods
Ray runs on a thread of its own, an ``async`` actor (any ``async def``
method) or one with ``max_concurrency`` above one: there, call
``use_numpy_on_mkl()`` at the top of each method (it sets the handler in
that call's own context).

This module imports nothing of Ray's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mkl_alloc
from mkl_alloc.pools import use_numpy_on_mkl

__all__ = ["setup_hook", "runtime_env"]


def setup_hook() -> None:
    """setup_hook() -> None

    The ``worker_process_setup_hook`` that puts a Ray worker process's
    NumPy arrays on MKL memory aligned to 64 bytes: its name,
    ``"mkl_alloc.ray.setup_hook"``, goes in a ``runtime_env``. For another
    alignment, :func:`runtime_env`."""
    use_numpy_on_mkl(64)


def runtime_env(alignment: int = 64, **other: Any) -> dict[str, Any]:
    """runtime_env(alignment=64, **other) -> dict

    A Ray ``runtime_env`` whose ``worker_process_setup_hook`` puts every
    task's new NumPy arrays on MKL memory aligned to ``alignment`` in each
    worker process it starts, with ``other``'s entries beside it
    (``env_vars=...``, ``pip=...``). ``alignment`` is checked here
    (``ValueError`` for anything but a power of two from 1 to 2**30);
    ``ValueError`` too if ``other`` has a setup hook of its own."""
    mkl_alloc.numpy_handler(alignment)  # checks it now, not in each worker
    if "worker_process_setup_hook" in other:
        raise ValueError(
            "mkl_alloc.ray.runtime_env: a worker_process_setup_hook was given "
            f"({other['worker_process_setup_hook']!r}); Ray takes one: call "
            "mkl_alloc.pools.use_numpy_on_mkl() from yours instead"
        )
    hook: Any = "mkl_alloc.ray.setup_hook" if alignment == 64 else _aligned_hook(alignment)
    return {**other, "worker_process_setup_hook": hook}


def _aligned_hook(alignment: int) -> Callable[[], None]:
    """A setup hook for ``alignment``: a named function (Ray exports a hook
    by its ``__name__``, which ``functools.partial`` lacks), sent to the
    workers by value with its closure."""

    def setup_hook_aligned() -> None:
        use_numpy_on_mkl(alignment)

    return setup_hook_aligned
