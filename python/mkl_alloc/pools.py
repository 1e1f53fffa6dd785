"""NumPy's arrays on MKL memory in worker pools and threads: one call per
pool, not one per thread or task (docs/dask.md; Dask: :mod:`mkl_alloc.dask`).

NumPy keeps its data-memory handler (NEP 49) in a ``contextvars``
``ContextVar``, and a new thread starts on an empty context, so a handler
set in the main thread does not reach a pool's workers. Where a pool runs
its tasks in its worker thread's own context, as ``concurrent.futures`` and
``multiprocessing`` do, setting the handler once in each worker, from the
pool's initializer, reaches every task that worker runs:

- ``ThreadPoolExecutor(initializer=initializer())``,
  ``ProcessPoolExecutor(initializer=initializer())`` and
  ``multiprocessing.Pool(initializer=initializer())`` (the process pools
  with any start method: the initializer pickles);
- a thread of your own: ``threading.Thread(target=on_mkl(work))``, or any
  one function run under the handler, wherever it runs (``on_mkl(f)``
  pickles too, as ``f`` does);
- the calling thread itself: :func:`use_numpy_on_mkl`, or
  ``with mkl_alloc.numpy_memory():`` for a block.

A pool that copies the submitter's context into each task (asyncio's
``to_thread``, Dask's workers) needs the handler set where the copy is
made instead: in the submitting context, or :mod:`mkl_alloc.dask` for Dask.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import mkl_alloc

__all__ = ["use_numpy_on_mkl", "initializer", "on_mkl"]

_T = TypeVar("_T")


def use_numpy_on_mkl(alignment: int = 64) -> None:
    """use_numpy_on_mkl(alignment=64) -> None

    Sets ``mkl_alloc.numpy_handler(alignment)`` as NumPy's data-memory
    handler in the current context (this thread's, or this asyncio task's)
    for good: every array NumPy allocates there after the call is MKL
    memory. ``ValueError`` for an alignment that is not a power of two from
    1 to 2**30, before anything changes."""
    mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler(alignment))


def initializer(alignment: int = 64) -> Callable[[], None]:
    """initializer(alignment=64) -> callable

    A pool initializer that puts each worker's NumPy arrays on MKL memory
    aligned to ``alignment``: pass it as ``initializer=`` to
    ``concurrent.futures.ThreadPoolExecutor`` or ``ProcessPoolExecutor``, or
    to ``multiprocessing.Pool``; each worker (thread or process) calls it
    once, before its first task, and every task it runs then allocates on
    MKL memory. It pickles, for process pools of any start method.
    ``alignment`` is checked here (``ValueError``). To run an initializer of
    your own as well, call :func:`use_numpy_on_mkl` from it instead."""
    mkl_alloc.numpy_handler(alignment)  # checks it now, not in each worker
    return functools.partial(use_numpy_on_mkl, alignment)


def _run_on_mkl(fn: Callable[..., _T], alignment: int, *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` inside ``mkl_alloc.numpy_memory(alignment)``."""
    with mkl_alloc.numpy_memory(alignment):
        return fn(*args, **kwargs)


def on_mkl(fn: Callable[..., _T], alignment: int = 64) -> Callable[..., _T]:
    """on_mkl(fn, alignment=64) -> callable

    ``fn`` run with NumPy's arrays on MKL memory: the returned callable
    takes ``fn``'s arguments and returns its result, and while ``fn`` runs,
    every array NumPy allocates in its thread is MKL memory aligned to
    ``alignment``; the handler in force before is back after it, also
    through an exception. For a thread of your own,
    ``threading.Thread(target=on_mkl(work))``; for a single task,
    ``executor.submit(on_mkl(f), x)``. It pickles where ``fn`` does.
    ``alignment`` is checked here (``ValueError``); a non-callable ``fn``
    is refused (``TypeError``)."""
    if not callable(fn):
        raise TypeError(f"on_mkl(fn): fn must be callable, not {type(fn).__name__}")
    mkl_alloc.numpy_handler(alignment)
    return functools.partial(_run_on_mkl, fn, alignment)
