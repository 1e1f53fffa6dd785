"""MKL-allocated memory for Python, exported to NumPy without copies.

``MKLMemory`` is a block of Intel oneMKL memory (``mkl_malloc``-family,
aligned to any power of two up to 2**30) that exports itself through the
buffer protocol (``memoryview``, ``np.frombuffer``, ``np.asarray``) and
DLPack (``np.from_dlpack``), and counts its live exports so that
``realloc`` is refused (``BufferError``) while any of them lives. It takes
the constructor forms of the ``MKLMemory`` proposed for mkl-service (a pull
request never released: mkl-service 2.8.0 has no such class),
``MKLMemory(nbytes)``, ``MKLMemory(num, size)`` (zeroed) and
``MKLMemory(other)`` (a copy), plus a copy of any buffer, all with a
keyword-only ``alignment=64``; and that proposal's ``realloc`` reference
check (``refcheck=True``). It is built on the Rust crate mkl-alloc's
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

The settings the environment gives at import (the block cache's budget,
the huge-page threshold) and the cache's decay time are read with
``settings()`` and changed at run time with ``configure()``, with the
variables' rules; ``show_config()`` (``python -m mkl_alloc``) reports them
and where each came from.

The import starts the crate's background decay thread unless
``MKL_ALLOC_BACKGROUND=off``: cached memory unused for the decay time is
given back to the system even while the process allocates nothing (an idle
worker, a notebook between cells). ``background_stop()``,
``background_start()`` and ``background_running()`` control it at run time;
a child made by ``os.fork()`` starts its own.
"""

from __future__ import annotations

import os
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

# The MKL_ALLOC_* variables as the crate reads them: the extension's setup
# (its ELF constructor, and the import below) reads the process environment,
# which os.environ's changes made before this import reach (putenv). Later
# changes reach nothing (configure() changes the settings at run time):
# show_config() reports these values.
_ENV_AT_IMPORT = {k: v for k, v in os.environ.items() if k.startswith("MKL_ALLOC_")}

try:
    from . import _native
except ImportError as _e:
    if "libmkl_rt" not in str(_e):
        raise
    _load_mkl_rt()
    from . import _native

from ._native import MAX_ALIGNMENT, MKLMemory, SizeOverflowError, backing, free_buffers, peak_mem_usage
from ._native import _background_start, _background_stop, _configure, _mem_stat, _mkl_info, _settings
from ._native import background_running

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
    "show_config",
    "Settings",
    "settings",
    "configure",
    "background_start",
    "background_stop",
    "background_running",
]

__version__ = "0.1.0"

# --- MKL_ALLOC_* variables ---------------------------------------------------

# What the package reads at run time (the crate's setup: docs/tuning.md,
# "Environment variables").
_RUNTIME_ENV = (
    "MKL_ALLOC_BACKING",
    "MKL_ALLOC_BLOCK_CACHE",
    "MKL_ALLOC_HUGE_PAGES",
    "MKL_ALLOC_BACKGROUND",
    "MKL_ALLOC_MEDIUM",
)
# Read elsewhere, never by the installed package: the crate's build script
# (docs/linking.md), its benches, examples and tests, the scripts, and this
# package's tests (the NumPy-suite plugin, the Dask tests). Known, so that a
# shell that exports them for those is not warned about.
# tests/test_show_config.py checks that every name in docs/tuning.md and in
# the Python and shell sources is here.
_OTHER_ENV = (
    "MKL_ALLOC_CACHE",
    "MKL_ALLOC_NO_DOWNLOAD",
    "MKL_ALLOC_BENCH_LONG",
    "MKL_ALLOC_TEST_SCALE",
    "MKL_ALLOC_MIRI_MODE",
    "MKL_ALLOC_SUITE_HANDLER",
    "MKL_ALLOC_SUITE_ALIGNMENT",
    "MKL_ALLOC_FORKS",
    "MKL_ALLOC_FORK_COUNT_ALL",
    "MKL_ALLOC_FORK_DEADLINE_MS",
    "MKL_ALLOC_STRESS_OPS",
    "MKL_ALLOC_STRESS_GENERATIONS",
    "MKL_ALLOC_STRESS_READS",
    "MKL_ALLOC_WINE_DLLS",
    "MKL_ALLOC_WINEDEBUG",
    "MKL_ALLOC_REQUIRE_DASK",
    "MKL_ALLOC_REQUIRE_RAY",
)


def _unknown_env() -> list[str]:
    """The MKL_ALLOC_* names set at import that nothing of mkl-alloc reads."""
    known = set(_RUNTIME_ENV) | set(_OTHER_ENV)
    return sorted(k for k in _ENV_AT_IMPORT if k not in known)


def _warn_unknown_env() -> None:
    """Warns, once (at import), about each MKL_ALLOC_* variable that
    nothing reads: most likely a misspelt name, whose setting is then
    silently not in force."""
    import difflib
    import warnings

    for name in _unknown_env():
        close = difflib.get_close_matches(name, _RUNTIME_ENV + _OTHER_ENV, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        warnings.warn(
            f"mkl_alloc: the environment variable {name} is not one mkl-alloc reads, "
            f"so it has no effect{hint}; at run time it reads {', '.join(_RUNTIME_ENV)}",
            RuntimeWarning,
            stacklevel=3,
        )


_warn_unknown_env()


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
    - ``medium_dirty_bytes``, ``medium_clean_bytes``: freed medium blocks
      (4 KiB to 1 MiB beneath MKL, Linux) kept resident for reuse under the
      same budget, and those given back to the kernel after the decay time
      (address space only); live medium blocks are in MKL's count;
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
    _cached: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)

    def __new__(
        cls,
        allocated_bytes: int,
        allocated_buffers: int,
        cached_bytes: int = 0,
        cached_buffers: int = 0,
        slack_bytes: int = 0,
        medium_dirty_bytes: int = 0,
        medium_clean_bytes: int = 0,
    ) -> Self:
        self = super().__new__(cls, allocated_bytes, allocated_buffers)
        object.__setattr__(
            self,
            "_cached",
            (cached_bytes, cached_buffers, slack_bytes, medium_dirty_bytes, medium_clean_bytes),
        )
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
    def medium_dirty_bytes(self) -> int:
        """Bytes of freed medium blocks kept resident for reuse (not in MKL's count)."""
        return self._cached[3]

    @property
    def medium_clean_bytes(self) -> int:
        """Bytes of freed medium blocks given back to the kernel (address space only)."""
        return self._cached[4]

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
            f"slack_bytes={self.slack_bytes}, medium_dirty_bytes={self.medium_dirty_bytes}, "
            f"medium_clean_bytes={self.medium_clean_bytes})"
        )

    def __reduce__(self) -> tuple[type[Self], tuple[int, int, int, int, int, int, int]]:
        return (type(self), (*self, *self._cached))

    def _replace(self, **changes: Any) -> Self:
        """A copy with some of the seven counts changed."""
        fields = {
            "allocated_bytes": self.allocated_bytes,
            "allocated_buffers": self.allocated_buffers,
            "cached_bytes": self.cached_bytes,
            "cached_buffers": self.cached_buffers,
            "slack_bytes": self.slack_bytes,
            "medium_dirty_bytes": self.medium_dirty_bytes,
            "medium_clean_bytes": self.medium_clean_bytes,
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
    ``cached_bytes``, ``cached_buffers``, ``slack_bytes``,
    ``medium_dirty_bytes``, ``medium_clean_bytes``, ``live_bytes``,
    ``live_buffers``

    Bytes and blocks MKL's memory manager has allocated right now and not
    freed (``MKL_Mem_Stat``: each live block's size plus MKL's header and
    alignment padding), every ``MKLMemory``'s block and every array under
    the NumPy handler included. Freed blocks are not in it: those of 1 MiB
    or more that the block cache keeps beneath MKL for reuse are counted
    apart, in ``cached_bytes`` and ``cached_buffers`` (at the chunks' true
    sizes), and what live chunks keep beyond their size for growth in
    ``slack_bytes``. **The memory the program holds is ``allocated_bytes``**
    (``live_bytes`` is the same number); what the package keeps besides is
    ``cached_bytes + slack_bytes + medium_dirty_bytes`` (freed medium
    blocks kept for reuse; ``medium_clean_bytes`` were given back). So ``allocated_bytes`` may be 0 while
    ``cached_bytes`` is not (every block freed, the cache still holding
    them). The tuple is the same two numbers as mkl-service's
    ``mkl.mem_stat()``, which returns them as a dict with these keys. See
    ``MemStat``.
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


# --- The report: show_config() and `python -m mkl_alloc` ---------------------

_INTERFACE_LAYERS = {0: "LP64", 1: "ILP64", 2: "GNU LP64", 3: "GNU ILP64"}
_THREADING_LAYERS = {0: "intel", 1: "sequential", 2: "pgi", 3: "gnu", 4: "tbb"}


_SIZE_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40, "kib": 10, "mib": 20, "gib": 30, "tib": 40}


def _parse_env_size(value: str | None, on: int) -> int | None:
    """A size setting as the crate parses it (``src/env.rs``): unset,
    empty or ``on`` (any case) is ``on``, ``off`` or ``0`` is None (off), a
    decimal byte count, optionally with a binary unit (``K``, ``M``, ``G``,
    ``T`` or ``KiB``, ``MiB``, ``GiB``, ``TiB``, any case: ``256M`` is 256
    MiB), is itself; anything else raises ValueError (the crate then keeps
    the default, with a line on stderr)."""
    if value is None or value == "" or value.lower() == "on":
        return on
    if value.lower() == "off":
        return None
    digits = len(value) - len(value.lstrip("0123456789"))
    unit = value[digits:].lower()
    if digits == 0 or not value.isascii() or unit not in _SIZE_UNITS:
        raise ValueError(value)
    n = int(value[:digits]) << _SIZE_UNITS[unit]
    if n >= 2**64:
        raise ValueError(value)
    return n if n > 0 else None


def _size_setting(name: str, in_force: int | None, default: int, program: bool) -> dict[str, Any]:
    """One size setting: the value in force and where it came from
    (``program``: the crate says the program set it, with ``configure()``
    or the crate's setters)."""
    raw = _ENV_AT_IMPORT.get(name)
    try:
        from_env = _parse_env_size(raw, default)
        understood = True
    except ValueError:
        from_env, understood = default, False
    if raw is None:
        source = "default"
    elif not understood:
        source = f"default ({name}={raw!r} is not off, on or a byte count, so it was ignored)"
    else:
        source = f"environment ({name}={raw!r})"
    if program or in_force != from_env:
        source = "set by the program"
    return {"value": in_force, "default": default, "source": source, "variable": name}


def _backing_setting(state: str) -> dict[str, Any]:
    """MKL_ALLOC_BACKING: the switch, where it came from, and why the
    backing is in ``state``."""
    raw = _ENV_AT_IMPORT.get("MKL_ALLOC_BACKING")
    if raw is None:
        value, source = "on", "default"
    elif raw == "" or raw.lower() == "on":
        value, source = "on", f"environment (MKL_ALLOC_BACKING={raw!r})"
    elif raw.lower() in ("off", "0"):
        value, source = "off", f"environment (MKL_ALLOC_BACKING={raw!r})"
    else:
        value = "on"
        source = f"default (MKL_ALLOC_BACKING={raw!r} is not on or off, so it was ignored)"
    why = {
        "active": "MKL's memory functions (i_malloc & co.) are the crate's: MKL's blocks of "
        "1 MiB or more are its chunks (block cache, huge pages, mremap growth)",
        "mkl-ran-first": "something called MKL before mkl_alloc was imported, so MKL kept the "
        "C runtime's memory functions: no block cache, no huge pages for MKL's blocks; "
        "import mkl_alloc before anything that calls MKL",
        "unset": "the crate's setup has not run",
    }.get(state, "")
    if state == "off":
        if value == "off":
            why = "MKL_ALLOC_BACKING=off: MKL runs on the C runtime's memory, by choice"
        elif sys.platform == "win32":
            why = "no chunks on Windows yet: MKL runs on the C runtime's memory"
        else:
            why = "MKL runs on the C runtime's memory"
    return {"value": value, "source": source, "variable": "MKL_ALLOC_BACKING", "why": why}


def _mkl_library() -> str | None:
    """The path of the libmkl_rt this process loaded (Linux: from
    /proc/self/maps), or None where it cannot be told."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith("libmkl_rt"):
                    return path
    except OSError:
        pass
    return None


def _config() -> dict[str, Any]:
    """The report's contents, as plain data (``show_config(mode="dicts")``)."""
    import importlib.metadata

    version, interface, threading, threads = _mkl_info()
    try:
        wheel: str | None = importlib.metadata.version("mkl")
    except importlib.metadata.PackageNotFoundError:
        wheel = None
    settings = _settings()
    state = backing()
    stat = mem_stat()
    return {
        "mkl_alloc": {
            "version": __version__,
            "path": os.path.dirname(os.path.abspath(__file__)),
            "python": sys.version.split()[0],
            "platform": sys.platform,
        },
        "mkl": {
            "version": version,
            "wheel": wheel,
            "library": _mkl_library(),
            "interface_layer": _INTERFACE_LAYERS.get(interface),
            "threading_layer": _THREADING_LAYERS.get(threading),
            "max_threads": threads,
            "fast_mm_disabled": settings["fast_mm_disabled"]
            or os.environ.get("MKL_DISABLE_FAST_MM") == "1",
            "fork_holds_locks": settings["fork_holds_mkl_locks"],
        },
        "backing": {"state": state, **_backing_setting(state)},
        "block_cache": {
            "budget": _size_setting(
                "MKL_ALLOC_BLOCK_CACHE",
                settings["block_cache_budget"],
                settings["block_cache_default_budget"],
                settings["block_cache_source"] == "program",
            ),
            "decay_ms": {
                "value": settings["block_cache_decay_ms"],
                "default": settings["block_cache_default_decay_ms"],
                "source": "set by the program"
                if settings["block_cache_decay_source"] == "program"
                else "default",
            },
        },
        "huge_pages": {
            "threshold": _size_setting(
                "MKL_ALLOC_HUGE_PAGES",
                settings["huge_pages_threshold"],
                settings["huge_pages_default_threshold"],
                settings["huge_pages_source"] == "program",
            ),
            "kernel": settings["huge_pages_kernel"],
            "unavailable": settings["huge_pages_unavailable"],
            "advised_bytes": settings["huge_pages_advised_bytes"],
        },
        "background": _background_setting(),
        "medium_blocks": _medium_setting(settings, state),
        "mem_stat": {
            "allocated_bytes": stat.allocated_bytes,
            "allocated_buffers": stat.allocated_buffers,
            "cached_bytes": stat.cached_bytes,
            "cached_buffers": stat.cached_buffers,
            "slack_bytes": stat.slack_bytes,
            "medium_dirty_bytes": stat.medium_dirty_bytes,
            "medium_clean_bytes": stat.medium_clean_bytes,
        },
        "environment": {
            "read_at_import": dict(sorted(_ENV_AT_IMPORT.items())),
            "unknown": _unknown_env(),
        },
    }


def _bytes(n: int | None) -> str:
    """``n`` bytes for a person: the exact count and a binary unit."""
    if n is None:
        return "off"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n:,} bytes ({n / (1 << shift):.1f} {unit})"
    return f"{n:,} bytes"


def _text(c: dict[str, Any]) -> str:
    """The report as one screen of plain text."""
    mkl, b, bc, hp, ms = c["mkl"], c["backing"], c["block_cache"], c["huge_pages"], c["mem_stat"]
    md = c["medium_blocks"]
    lines = [
        f"mkl_alloc {c['mkl_alloc']['version']} (Python {c['mkl_alloc']['python']}, "
        f"{c['mkl_alloc']['path']})",
        "",
        "MKL",
        f"  version            {mkl['version']}",
        f"  mkl wheel          {mkl['wheel'] or 'not installed as a distribution'}",
        f"  library            {mkl['library'] or 'unknown'}",
        f"  interface layer    {mkl['interface_layer'] or 'not reported'}",
        f"  threading layer    {mkl['threading_layer'] or 'not reported'}, "
        f"max {mkl['max_threads']} threads",
        f"  fast memory mgr    {'off' if mkl['fast_mm_disabled'] else 'on'}",
        f"  fork holds locks   {'yes' if mkl['fork_holds_locks'] else 'no'}",
        "",
        "Backing (MKL's memory from mkl-alloc's chunks)",
        f"  state              {b['state']}: {b['why']}",
        f"  MKL_ALLOC_BACKING  {b['value']}  [{b['source']}]",
        "",
        "Settings in force  [where each came from]",
        f"  block cache budget {_bytes(bc['budget']['value'])}  [{bc['budget']['source']}]",
        f"  block cache decay  {bc['decay_ms']['value']} ms  [{bc['decay_ms']['source']}]",
        f"  huge pages from    {_bytes(hp['threshold']['value'])}  [{hp['threshold']['source']}]",
        f"  huge pages kernel  {hp['kernel']}"
        + (f": {hp['unavailable']}" if hp["unavailable"] else ""),
        f"  background decay   {'on' if c['background']['running'] else 'off'}  "
        f"[{c['background']['source']}]",
        f"  medium blocks      {md['value']}  [{md['source']}]"
        + (f": {md['why']}" if md["why"] else ""),
        "",
        "Figures (mem_stat())",
        f"  allocated (live)   {_bytes(ms['allocated_bytes'])} in {ms['allocated_buffers']:,} blocks",
        f"  cached beneath MKL {_bytes(ms['cached_bytes'])} in {ms['cached_buffers']:,} chunks",
        f"  growth slack       {_bytes(ms['slack_bytes'])}",
        f"  medium, for reuse  {_bytes(ms['medium_dirty_bytes'])} "
        f"(given back: {_bytes(ms['medium_clean_bytes'])})",
        f"  medium fallbacks   {md['fallbacks']:,}"
        + (
            f" blocks, {_bytes(md['fallback_bytes'])} on the C runtime's heap: "
            "the medium heap had no room (ulimit -v?)"
            if md["fallbacks"]
            else ""
        ),
        f"  huge-page advised  {_bytes(hp['advised_bytes'])} so far",
    ]
    env = c["environment"]
    if env["read_at_import"]:
        lines += ["", "MKL_ALLOC_* at import"]
        lines += [f"  {k}={v!r}" for k, v in env["read_at_import"].items()]
    if env["unknown"]:
        lines.append(f"  unknown, ignored: {', '.join(env['unknown'])}")
    return "\n".join(lines)


@overload
def show_config(mode: Literal["stdout"] = "stdout") -> None: ...
@overload
def show_config(mode: Literal["dicts"]) -> dict[str, Any]: ...
def show_config(mode: Literal["stdout", "dicts"] = "stdout") -> dict[str, Any] | None:
    """show_config(mode="stdout") -> None, or the report as a dict

    What this process's mkl_alloc runs on, as ``numpy.show_config()``
    reports NumPy's build: the package's version, MKL's (its version string,
    interface and threading layers, threads, whether its own caches are
    off), the backing's state and why (``backing()``), the settings in
    force, the block cache's budget and decay, the huge-page threshold, each
    with where it came from (its ``MKL_ALLOC_*`` variable, the default, or
    the program: "set by the program" once ``configure()`` set it, even to
    the same value), and the figures (``mem_stat()``). ``mode="stdout"``
    prints one screen of text; ``mode="dicts"`` returns the same as a dict
    of plain values (what ``python -m mkl_alloc --json`` prints). Calling
    it calls MKL (its version and layers), nothing else changes.
    """
    if mode == "dicts":
        return _config()
    if mode != "stdout":
        raise ValueError(f"show_config(mode={mode!r}): mode must be 'stdout' or 'dicts'")
    print(_text(_config()))
    return None


# --- settings at run time ------------------------------------------------------


class Settings(NamedTuple):
    """The settings ``configure()`` sets, in force: what ``settings()``
    returns, and ``configure()`` returns from before its call, so that
    ``configure(**previous._asdict())`` puts them back.

    - ``block_cache``: the block cache's budget in bytes, or ``None``
      while the cache is off (``MKL_ALLOC_BLOCK_CACHE``);
    - ``huge_pages``: the huge-page threshold in bytes (chunks at least
      this large are advised ``MADV_HUGEPAGE``), or ``None`` while off
      (``MKL_ALLOC_HUGE_PAGES``);
    - ``decay_ms``: how long a cached chunk may stay unused before it is
      unmapped, in milliseconds.
    """

    block_cache: int | None
    huge_pages: int | None
    decay_ms: int


def settings() -> Settings:
    """settings() -> Settings(block_cache, huge_pages, decay_ms)

    The block cache's budget (bytes, ``None`` while off), the huge-page
    threshold (bytes, ``None`` while off) and the cache's decay time (ms)
    in force now, whether they came from the environment, the defaults or
    ``configure()``; ``show_config()`` says which.
    """
    s = _settings()
    return Settings(s["block_cache_budget"], s["huge_pages_threshold"], s["block_cache_decay_ms"])


_UNCHANGED: Any = object()


def configure(
    *,
    block_cache: SupportsIndex | str | None = _UNCHANGED,
    huge_pages: SupportsIndex | str | None = _UNCHANGED,
    decay_ms: SupportsIndex = _UNCHANGED,
) -> Settings:
    """configure(*, block_cache=..., huge_pages=..., decay_ms=...) -> Settings

    Sets the crate's settings at run time, the ones the environment sets at
    import, and returns those in force before the call (``settings()``), so
    ``previous = configure(...)`` then ``configure(**previous._asdict())``
    restores them. Only the keywords given change. For the whole process,
    from the next allocation or free on (blocks already allocated keep what
    they had).

    - ``block_cache``: the block cache's budget, as ``MKL_ALLOC_BLOCK_CACHE``
      takes it: a byte count (an int, or a string of decimal digits), ``0``,
      ``"off"``, ``False`` or ``None`` to turn the cache off (which unmaps
      every cached chunk), ``"on"`` or ``True`` for the default budget (an
      eighth of the memory the process may use). Strings in any case.
    - ``huge_pages``: the huge-page threshold, as ``MKL_ALLOC_HUGE_PAGES``
      takes it: the same forms; ``"on"``/``True`` is 4 MiB, the default.
    - ``decay_ms``: a cached chunk unused this many milliseconds is unmapped
      (an int, at least 0; the default is 1000).

    A refused value raises ``ValueError`` (a negative count, a string that
    is not on, off or a byte count, a count past 2**64 - 1) or ``TypeError``
    (a float, or another type), naming the call and saying why; every value
    is checked before any is set, so nothing changes then. Afterwards
    ``show_config()`` gives each setting set here the source "set by the
    program".

    >>> import mkl_alloc
    >>> previous = mkl_alloc.configure(block_cache=256 << 20, decay_ms=5000)
    >>> mkl_alloc.settings().block_cache
    268435456
    >>> _ = mkl_alloc.configure(**previous._asdict())
    """
    previous = settings()
    changes: dict[str, object] = {
        name: value
        for name, value in (
            ("block_cache", block_cache),
            ("huge_pages", huge_pages),
            ("decay_ms", decay_ms),
        )
        if value is not _UNCHANGED
    }
    _configure(changes)
    return previous


# --- the background decay thread -------------------------------------------------

# Whether the program asked for the thread (the import's default, or
# background_start()) and has not stopped it since: a child made by
# os.fork() then starts its own. And whether the program itself called
# background_start()/background_stop() (show_config()'s source).
_background_wanted = False
_background_set_by_program = False


def background_start() -> None:
    """background_start() -> None

    Starts mkl-alloc's background decay thread unless it is running
    (``background_running()``). The import starts it unless
    ``MKL_ALLOC_BACKGROUND=off``. While it runs, cached memory beneath MKL
    unused for the decay time (``settings().decay_ms``, 1 s by default) is
    unmapped within about a quarter of that time, even while the process
    allocates nothing, and frees do no decay work of their own. A child made
    by ``os.fork()`` starts its own. Raises ``OSError``, saying why, if the
    system refuses a new thread (the cache then still decays at the
    process's allocations and frees).

    >>> import mkl_alloc
    >>> mkl_alloc.background_start()
    >>> mkl_alloc.background_running()
    True
    """
    global _background_wanted, _background_set_by_program
    _background_set_by_program = True
    _background_start()
    _background_wanted = True


def background_stop() -> None:
    """background_stop() -> None

    Stops the background decay thread and waits for it to end; nothing to do
    if it is not running. Cached memory then decays only at the process's
    own allocations and frees. ``background_start()`` starts it again.

    >>> import mkl_alloc
    >>> mkl_alloc.background_stop()
    >>> mkl_alloc.background_running()
    False
    >>> mkl_alloc.background_start()
    """
    global _background_wanted, _background_set_by_program
    _background_set_by_program = True
    _background_wanted = False
    _background_stop()


def _medium_setting(settings: dict[str, Any], state: str) -> dict[str, Any]:
    """MKL_ALLOC_MEDIUM: whether MKL's blocks of 4 KiB-1 MiB are the
    crate's medium blocks, where that came from, why not where they are
    off, and how many such blocks the C runtime served for lack of room."""
    raw = _ENV_AT_IMPORT.get("MKL_ALLOC_MEDIUM")
    on = bool(settings["medium_blocks"])
    if raw is None or raw == "":
        source = "default"
    elif settings["medium_source"] == "environment" or raw.lower() == "on":
        source = f"environment (MKL_ALLOC_MEDIUM={raw!r})"
    else:
        source = f"default (MKL_ALLOC_MEDIUM={raw!r} is not on or off, so it was ignored)"
    why = ""
    if not on:
        if settings["medium_source"] == "environment":
            why = "off by choice: MKL's blocks of 4 KiB-1 MiB stay on the C runtime's heap"
        elif sys.platform != "linux":
            why = "medium blocks are built for Linux only"
        elif state != "active":
            why = "MKL is not on the crate's memory (see Backing)"
        else:
            why = "no address space could be reserved for them"
    return {
        "value": "on" if on else "off",
        "source": source,
        "variable": "MKL_ALLOC_MEDIUM",
        "why": why,
        "fallbacks": settings["medium_fallbacks"],
        "fallback_bytes": settings["medium_fallback_bytes"],
    }


def _background_setting() -> dict[str, Any]:
    """MKL_ALLOC_BACKGROUND: whether the thread runs, where that came from."""
    raw = _ENV_AT_IMPORT.get("MKL_ALLOC_BACKGROUND")
    if _background_set_by_program:
        source = "set by the program"
    elif raw is None or raw == "":
        source = "default (on in the Python package)"
    elif raw.lower() in ("on", "off", "0"):
        source = f"environment (MKL_ALLOC_BACKGROUND={raw!r})"
    else:
        source = f"default (MKL_ALLOC_BACKGROUND={raw!r} is not on or off, so it was ignored)"
    return {
        "running": background_running(),
        "source": source,
        "variable": "MKL_ALLOC_BACKGROUND",
    }


def _background_after_fork_in_child() -> None:
    """os.fork()'s child: the parent's thread does not exist here; start
    the child's own if the parent wanted one."""
    if _background_wanted:
        try:
            _background_start()
        except OSError:
            pass  # the child decays at its allocations and frees


def _background_at_import() -> None:
    """On unless MKL_ALLOC_BACKGROUND=off (or 0): the package's default."""
    global _background_wanted
    if os.environ.get("MKL_ALLOC_BACKGROUND", "").lower() in ("off", "0"):
        return
    _background_start()
    _background_wanted = True


_background_at_import()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_background_after_fork_in_child)
