"""MKL-allocated memory for Python, exported to NumPy without copies.

``MKLMemory`` is a block of Intel oneMKL memory (``mkl_malloc``-family,
aligned to any power of two up to 2**30) that exports itself through the
buffer protocol (``memoryview``, ``np.frombuffer``, ``np.asarray``) and
DLPack (``np.from_dlpack``), and counts its live exports so that
``realloc`` is refused (``BufferError``) while any of them lives. It takes
mkl-service's constructor forms, ``MKLMemory(nbytes)``,
``MKLMemory(num, size)`` (zeroed) and ``MKLMemory(other)`` (a copy), plus a
copy of any buffer, all with a keyword-only ``alignment=64``; and
mkl-service's ``realloc`` reference check (``refcheck=True``). It is built on the Rust crate mkl-alloc's
``SharedMklVec``, whose one-word view/resize protocol is checked by loom,
so the count and the realloc cannot race, with or without the GIL.

The module functions ``mem_stat()``, ``peak_mem_usage(mem_const)`` and
``free_buffers()`` mirror mkl-service's functions of the same names and act
on the same MKL (the ``mkl`` wheel's ``libmkl_rt.so.3``); ``mem_stat()``
counts the blocks the program holds, and reports the freed ones the block
cache keeps beneath MKL apart (``cached_bytes``).

Loading the extension sets up the crate's process-wide state before user
code can start threads or fork (``mkl_alloc::manager::init``, run by the
crate's ELF constructor and again at import): it reads
``MKL_ALLOC_BLOCK_CACHE`` and ``MKL_ALLOC_HUGE_PAGES``, points MKL's memory
functions (``i_malloc`` & co.) at the crate's backing, so that MKL's blocks
of 1 MiB or more, mkl-service's and NumPy's through the handler alike, are
the crate's chunks (cached, on huge pages, grown with ``mremap``), unless
MKL was called before the extension loaded (``backing()`` then says
``"mkl-ran-first"``: import ``mkl_alloc`` before anything that calls MKL);
and, on Linux, registers the fork handlers that keep the block cache
consistent in a child, and calls each MKL entry point the package uses
once, so that a child forked while other threads allocate never waits on
libmkl_rt's lazy resolution. That call allocates and frees one small MKL
block, so there mkl-service's
``disable_fast_mm()`` has to come before ``import mkl_alloc`` to take
effect (``MKL_DISABLE_FAST_MM=1`` in the environment works either way).
Windows has no fork, so neither is done there.

``numpy_handler``, ``set_numpy_handler``, ``numpy_memory`` and
``is_mkl_array`` put the data of the arrays NumPy itself allocates on MKL
memory (a NEP 49 data-memory handler); see their docstrings.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, SupportsIndex, TypeVar, overload

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from types import TracebackType

    import numpy.typing as npt
    from typing_extensions import Buffer, CapsuleType, Self, disjoint_base
else:

    def disjoint_base(cls: type) -> type:
        """typing_extensions.disjoint_base (PEP 800) for type checkers only."""
        return cls


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


def _add_mkl_dll_directories() -> list[Any]:
    """Windows: lets the extension find the `mkl` wheel's DLLs.

    The wheel installs mkl_rt.3.dll and the DLLs it loads into the
    environment's ``Library\\bin``, which Windows does not search for an
    extension's dependencies; ``os.add_dll_directory`` adds it, as
    mkl-service does for a venv. Here it is added whether or not the
    environment is a venv (``sys.exec_prefix\\Library\\bin``), and so is
    the folder where the installed ``mkl`` distribution's own file list puts
    mkl_rt.3.dll, where that differs (a ``--user`` or ``--target`` install).
    Returns the handles, kept for the process's life."""
    import importlib.metadata
    import os

    folders = [os.path.join(sys.exec_prefix, "Library", "bin")]
    try:
        files = importlib.metadata.distribution("mkl").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name.lower() == "mkl_rt.3.dll":
            folders.append(os.path.dirname(os.path.abspath(str(f.locate()))))
    handles = []
    seen = set()
    for folder in folders:
        key = os.path.normcase(os.path.abspath(folder))
        if key not in seen and os.path.isdir(folder):
            seen.add(key)
            handles.append(os.add_dll_directory(folder))  # type: ignore[attr-defined,unused-ignore]
    return handles


if sys.platform == "win32":
    _mkl_dll_directories = _add_mkl_dll_directories()

try:
    from . import _native
except ImportError as _e:
    if "libmkl_rt" not in str(_e):
        raise
    _load_mkl_rt()
    from . import _native

from ._native import MAX_ALIGNMENT, MKLMemory, SizeOverflowError, backing, free_buffers, peak_mem_usage
from ._native import _mem_stat

__all__ = [
    "MKLMemory",
    "SizeOverflowError",
    "MemStat",
    "mem_stat",
    "peak_mem_usage",
    "free_buffers",
    "backing",
    "MAX_ALIGNMENT",
    "numpy_handler",
    "set_numpy_handler",
    "numpy_memory",
    "is_mkl_array",
]

__version__ = "0.1.0"


class _MklCounts(NamedTuple):
    """MemStat's tuple part: MKL's two counts, as mkl-service reports them."""

    allocated_bytes: int
    allocated_buffers: int


class _MemStat(_MklCounts):
    """What MKL's memory manager holds, and how much of it the program holds.

    A tuple of MKL's two counts, ``(allocated_bytes, allocated_buffers)``, so
    ``nbytes, nbuffers = mem_stat()`` works and two ``MemStat`` compare by
    those counts; it can also be read by mkl-service's dict keys:
    ``mem_stat()["allocated_bytes"]``. Besides the tuple, attributes:

    - ``allocated_bytes``, ``allocated_buffers``: every block MKL counts
      (``MKL_Mem_Stat``): the live ones only, **the memory the program
      holds**. Freed blocks of 1 MiB or more leave MKL's count: MKL frees
      them into the block cache beneath it (on by default; ``free_buffers()``
      empties it, and the cache gives back on its own what it keeps unused);
    - ``cached_bytes``, ``cached_buffers``: what the block cache keeps
      beneath MKL, at the chunks' true sizes, apart from MKL's count;
    - ``slack_bytes``: what live chunks keep beyond the sizes MKL asked
      for (a block grown onto a larger cached chunk keeps the rest for its
      next growth), bounded with the cache by the one budget; what the
      crate keeps beneath MKL is ``cached_bytes + slack_bytes``;
    - ``live_bytes``, ``live_buffers``: the memory the program holds, MKL's
      count (the same as ``allocated_*``; kept for code that read them when
      MKL's count included the cache). Both count the small blocks (up to
      1024 bytes) that the NumPy handler keeps in its bins for reuse.

    The two counts and the cache's are read one after the other: while other
    threads allocate or free, they may be a moment apart.
    """

    # The cache's counts: a private tuple in the instance's __dict__ (a tuple
    # subclass cannot have slots of its own; MemStat below has the dict),
    # set once in __new__, read-only after. The class's (0, 0) stands for it
    # in an instance made without __new__ (namedtuple's _make, as
    # _make([bytes, buffers])).
    __slots__ = ()
    _cached: tuple[int, int, int] = (0, 0, 0)

    def __new__(
        cls,
        allocated_bytes: int,
        allocated_buffers: int,
        cached_bytes: int = 0,
        cached_buffers: int = 0,
        slack_bytes: int = 0,
    ) -> Self:
        self = super().__new__(cls, allocated_bytes, allocated_buffers)
        object.__setattr__(self, "_cached", (cached_bytes, cached_buffers, slack_bytes))
        return self

    @property
    def cached_bytes(self) -> int:
        """Bytes of freed chunks the block cache keeps beneath MKL (not in MKL's count)."""
        return self._cached[0]

    @property
    def cached_buffers(self) -> int:
        """Chunks the block cache keeps beneath MKL (not in MKL's count)."""
        return self._cached[1]

    @property
    def slack_bytes(self) -> int:
        """Bytes live chunks keep beyond what MKL asked for (growth slack, not in MKL's count)."""
        return self._cached[2]

    @property
    def live_bytes(self) -> int:
        """Memory the program holds: MKL's count of live bytes."""
        return self.allocated_bytes

    @property
    def live_buffers(self) -> int:
        """Blocks in use: MKL's count of live blocks."""
        return self.allocated_buffers

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"MemStat is read-only: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"MemStat is read-only: cannot delete {name!r}")

    def __repr__(self) -> str:
        return (
            f"MemStat(allocated_bytes={self.allocated_bytes}, "
            f"allocated_buffers={self.allocated_buffers}, "
            f"cached_bytes={self.cached_bytes}, cached_buffers={self.cached_buffers}, "
            f"slack_bytes={self.slack_bytes})"
        )

    def __reduce__(self) -> tuple[type[Self], tuple[int, int, int, int, int]]:
        return (type(self), (*self, *self._cached))

    def _replace(self, **changes: Any) -> Self:
        """A copy with some of the five counts changed."""
        fields = {
            "allocated_bytes": self.allocated_bytes,
            "allocated_buffers": self.allocated_buffers,
            "cached_bytes": self.cached_bytes,
            "cached_buffers": self.cached_buffers,
            "slack_bytes": self.slack_bytes,
        }
        unknown = changes.keys() - fields.keys()
        if unknown:
            raise ValueError(f"MemStat._replace: unknown field(s) {sorted(unknown)}")
        return type(self)(**{**fields, **changes})

    @overload
    def __getitem__(self, key: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> tuple[int, ...]: ...
    @overload
    def __getitem__(self, key: str) -> int: ...
    def __getitem__(self, key: SupportsIndex | slice | str) -> int | tuple[int, ...]:
        if isinstance(key, str):
            # Only mkl-service's two keys: not the tuple's other attributes.
            if key not in self._fields:
                raise KeyError(key)
            value: int = getattr(self, key)
            return value
        return tuple.__getitem__(self, key)


# MemStat is _MemStat with an instance __dict__ (for _cached). Before
# CPython 3.12 that dict gives the tuple a layout no other base can share
# (PEP 800's disjoint base, which stubtest checks); from 3.12 on the dict is
# managed outside the instance and the layout is the tuple's.
if sys.version_info >= (3, 12):

    class MemStat(_MemStat):
        __doc__ = _MemStat.__doc__ or ""

else:

    @disjoint_base
    class MemStat(_MemStat):
        __doc__ = _MemStat.__doc__ or ""


def mem_stat() -> MemStat:
    """mem_stat() -> MemStat(allocated_bytes, allocated_buffers), with
    ``cached_bytes``, ``cached_buffers``, ``live_bytes``, ``live_buffers``

    Bytes and blocks MKL's memory manager has allocated right now
    (``MKL_Mem_Stat``), including every ``MKLMemory``'s block and the freed
    blocks the block cache keeps for reuse, which ``cached_bytes`` and
    ``cached_buffers`` count apart. **The memory the program holds is
    ``live_bytes``** (``allocated_bytes - cached_bytes``). The tuple is the
    same two numbers as mkl-service's ``mkl.mem_stat()``, which returns them
    as a dict with these keys. See ``MemStat``.
    """
    return MemStat(*_mem_stat())


_M = TypeVar("_M", bound=MKLMemory)


def _rebuild(cls: type[_M], data: Buffer, alignment: int) -> _M:
    """Pickling and copy constructor: ``cls`` (MKLMemory or a subclass)
    holding a copy of ``data``'s bytes at ``alignment``, built without
    calling ``cls.__init__`` (as pickle does for ordinary classes)."""
    if not (isinstance(cls, type) and issubclass(cls, MKLMemory)):
        raise TypeError(f"_rebuild: {cls!r} is not MKLMemory or a subclass of it")
    return MKLMemory.__new__(cls, data, alignment=alignment)


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

    A new thread starts on NumPy's default handler, also one started inside
    the block: enter ``numpy_memory()`` in each thread. The exception is a
    thread started while ``sys.flags.thread_inherit_context`` is true
    (CPython 3.14 and later; on by default only in free-threaded builds,
    else with ``-X thread_inherit_context=1`` or
    ``PYTHON_THREAD_INHERIT_CONTEXT=1``): it starts on a copy of its
    starter's context, handler included. ``alignment`` is checked at once
    (``ValueError`` for anything but a power of two from 1 to 2**30).
    """
    return _NumpyMemory(numpy_handler(alignment))


def _handler_name(a: npt.NDArray[Any]) -> str | None:
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import get_handler_name  # type: ignore[no-redef, unused-ignore]
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
