"""MKL-allocated memory for Python, exported to NumPy without copies.

``MKLMemory(source, alignment=64)`` is a block of Intel oneMKL memory
(``mkl_malloc``-family, aligned to any power of two up to 2**30) that
exports itself through the buffer protocol (``memoryview``,
``np.frombuffer``, ``np.asarray``) and DLPack (``np.from_dlpack``), and
counts its live exports so that ``realloc`` is refused (``BufferError``)
while any of them lives. It is built on the Rust crate mkl-alloc's
``SharedMklVec``, whose one-word view/resize protocol is checked by loom,
so the count and the realloc cannot race, with or without the GIL.

The module functions ``mem_stat()``, ``peak_mem_usage(mem_const)`` and
``free_buffers()`` mirror mkl-service's functions of the same names and act
on the same MKL (the ``mkl`` wheel's ``libmkl_rt.so.3``).

``numpy_handler``, ``set_numpy_handler``, ``numpy_memory`` and
``is_mkl_array`` put the data of the arrays NumPy itself allocates on MKL
memory (a NEP 49 data-memory handler); see their docstrings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple, SupportsIndex, TypeVar, overload

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from types import TracebackType

    import numpy.typing as npt
    from typing_extensions import Buffer, CapsuleType


def _load_mkl_rt() -> None:
    """Loads the `mkl` wheel's libmkl_rt.so.3, found through its installed
    file list, for extensions whose RUNPATH does not lead to it (an editable
    install keeps the extension in the source tree). The extension then
    finds it already loaded, by its soname: still the one MKL."""
    import ctypes
    import importlib.metadata

    for f in importlib.metadata.distribution("mkl").files or []:
        if f.name == "libmkl_rt.so.3":
            # RTLD_GLOBAL, as mkl-service loads it.
            ctypes.CDLL(str(f.locate()), mode=ctypes.RTLD_GLOBAL)
            return
    raise ImportError("the `mkl` package is installed without libmkl_rt.so.3")


try:
    from . import _native
except ImportError as _e:
    if "libmkl_rt" not in str(_e):
        raise
    _load_mkl_rt()
    from . import _native

from ._native import MAX_ALIGNMENT, MKLMemory, free_buffers, peak_mem_usage
from ._native import _mem_stat

__all__ = [
    "MKLMemory",
    "MemStat",
    "mem_stat",
    "peak_mem_usage",
    "free_buffers",
    "MAX_ALIGNMENT",
    "numpy_handler",
    "set_numpy_handler",
    "numpy_memory",
    "is_mkl_array",
]

__version__ = "0.1.0"


class MemStat(NamedTuple):
    """What MKL's memory manager has allocated: ``(bytes, buffers)``.

    A tuple, so ``nbytes, nbuffers = mem_stat()`` works; it can also be
    read by mkl-service's dict keys: ``mem_stat()["allocated_bytes"]``.
    """

    allocated_bytes: int
    allocated_buffers: int

    @overload
    def __getitem__(self, key: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> tuple[int, ...]: ...
    @overload
    def __getitem__(self, key: str) -> int: ...
    def __getitem__(self, key: SupportsIndex | slice | str) -> int | tuple[int, ...]:
        if isinstance(key, str):
            # Only the two field names: not the tuple's other attributes.
            if key not in self._fields:
                raise KeyError(key)
            value: int = getattr(self, key)
            return value
        return tuple.__getitem__(self, key)


def mem_stat() -> MemStat:
    """mem_stat() -> MemStat(allocated_bytes, allocated_buffers)

    Bytes and blocks MKL's memory manager has allocated right now
    (``MKL_Mem_Stat``), including every ``MKLMemory``'s block. As
    mkl-service's ``mkl.mem_stat()``, which returns the same two numbers as
    a dict with these keys.
    """
    return MemStat(*_mem_stat())


_M = TypeVar("_M", bound=MKLMemory)


def _rebuild(cls: type[_M], data: Buffer, alignment: int) -> _M:
    """Pickling and copy constructor: ``cls`` (MKLMemory or a subclass)
    holding a copy of ``data``'s bytes at ``alignment``, built without
    calling ``cls.__init__`` (as pickle does for ordinary classes)."""
    if not (isinstance(cls, type) and issubclass(cls, MKLMemory)):
        raise TypeError(f"_rebuild: {cls!r} is not MKLMemory or a subclass of it")
    return MKLMemory.__new__(cls, data, alignment)


# --- NumPy arrays on MKL memory (NEP 49) -----------------------------------

from ._native import numpy_handler, set_numpy_handler  # noqa: E402


class _NumpyMemory:
    """The context manager ``numpy_memory()`` returns (one per ``with``)."""

    __slots__ = ("_handler", "_previous", "_entered")

    def __init__(self, handler: CapsuleType) -> None:
        self._handler = handler
        self._previous: CapsuleType | None = None
        self._entered = False

    def __enter__(self) -> CapsuleType:
        if self._entered:
            raise RuntimeError(
                "numpy_memory(): this context manager is already in use; "
                "call numpy_memory() again for each with-statement"
            )
        self._previous = set_numpy_handler(self._handler)
        self._entered = True
        return self._handler

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        previous, self._previous = self._previous, None
        self._entered = False
        set_numpy_handler(previous)
        return False


def numpy_memory(alignment: int = 64) -> AbstractContextManager[CapsuleType]:
    """numpy_memory(alignment=64) -> context manager

    Inside ``with numpy_memory():`` every data buffer NumPy allocates in the
    current context (this thread, or this asyncio task) is MKL memory
    aligned to ``alignment``; on exit, also through an exception, the
    handler in force before is back. Contexts nest. Arrays made inside stay
    valid after the block and may be freed on any thread.

    Threads started inside the block start on NumPy's default handler
    (before CPython 3.14's ``thread_inherit_context``): enter
    ``numpy_memory()`` in each thread. ``alignment`` is checked at once
    (``ValueError`` for anything but a power of two from 1 to 2**30).
    """
    return _NumpyMemory(numpy_handler(alignment))


def _handler_name(a: npt.NDArray[Any]) -> str | None:
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import get_handler_name  # type: ignore[no-redef]
    return get_handler_name(a)


def is_mkl_array(a: object) -> bool:
    """is_mkl_array(a) -> bool

    Whether the memory under the array ``a`` is MKL memory from this
    package: data allocated by an mkl_alloc NumPy handler, or an
    ``MKLMemory`` seen through ``np.frombuffer`` / ``np.asarray`` (a
    ``memoryview`` base) or ``np.from_dlpack``. Views are followed through
    ``.base`` to the array that owns the memory.
    """
    import numpy as np

    obj: object = a
    while obj is not None:
        if isinstance(obj, MKLMemory):
            return True
        if isinstance(obj, np.ndarray):
            if obj.flags.owndata:
                return _handler_name(obj) == "mkl_alloc"
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        else:
            return _native._is_mkl_dlpack(obj)
    return False
