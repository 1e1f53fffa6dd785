# Types of the Rust extension mkl_alloc._native (python/src/lib.rs and its modules), checked
# against the built module by `python -m mypy.stubtest mkl_alloc`
# (python/tests/test_typing.py). Users import these names from mkl_alloc.
#
# typing_extensions is only read by type checkers here (it ships with them):
# Buffer is PEP 688's collections.abc.Buffer (3.12+), CapsuleType is
# types.CapsuleType (3.13+).

from typing import Any, Final, Literal, SupportsIndex, overload

from typing_extensions import Buffer, CapsuleType, Self, disjoint_base

# As the module's own __all__ (PyO3 lists every name it adds, in order).
__all__ = [
    "MKLMemory",
    "_mem_stat",
    "peak_mem_usage",
    "free_buffers",
    "backing",
    "MAX_ALIGNMENT",
    "numpy_handler",
    "set_numpy_handler",
    "_is_mkl_dlpack",
    "SizeOverflowError",
    "_settings",
    "_mkl_info",
    "_configure",
    "_background_start",
    "_background_stop",
    "background_running",
]

MAX_ALIGNMENT: Final[int]
"""The largest alignment MKLMemory accepts: 2**30."""

class SizeOverflowError(OverflowError, MemoryError):
    """A size past Py_ssize_t (2**63 bytes or more) asked of MKLMemory or its
    realloc: an OverflowError, as mkl-service raises for it, and a
    MemoryError, as no block can be that large."""

# A native class with its own instance layout: it cannot be a second base
# beside another such class (PEP 800).
@disjoint_base
class MKLMemory:
    """MKL-allocated memory exported through the buffer protocol and DLPack."""

    # mkl-service's three forms, and a copy of any other buffer. `alignment`
    # is keyword-only (a second positional int is `size`); None, the
    # runtime's default, means 64, or `other.alignment` for a copy of `other`.
    @overload
    def __new__(cls, nbytes: SupportsIndex, /, *, alignment: SupportsIndex | None = None) -> Self:
        """`nbytes` zero bytes."""
    @overload
    def __new__(
        cls, num: SupportsIndex, size: SupportsIndex, /, *, alignment: SupportsIndex | None = None
    ) -> Self:
        """`num * size` zero bytes (mkl_calloc), zeroed lazily when large."""
    @overload
    def __new__(cls, other: MKLMemory, /, *, alignment: SupportsIndex | None = None) -> Self:
        """A copy of `other` in a new block, at `other.alignment` unless given."""
    @overload
    def __new__(cls, source: Buffer, /, *, alignment: SupportsIndex | None = None) -> Self:
        """A copy of `source`'s bytes (C order) in a new block."""
    @property
    def nbytes(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def alignment(self) -> int: ...
    @property
    def _pointer(self) -> int: ...
    @property
    def exports(self) -> int: ...
    def __len__(self) -> int: ...
    def tobytes(self) -> bytes: ...
    def realloc(self, new_nbytes: SupportsIndex, *, refcheck: bool = True) -> None: ...
    # The buffer protocol (PEP 688): what makes `memoryview(m)`,
    # `np.frombuffer(m)` and mpi4py's buffer arguments type-check. The
    # extension fills the C slots (bf_getbuffer/bf_releasebuffer); CPython
    # 3.12+ shows them as these two methods, 3.10 and 3.11 have no such
    # attributes (see stubtest-allowlist-before-3.12.txt).
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...
    # DLPack: `stream` must be None (CPU memory), `dl_device` (1, 0).
    def __dlpack__(
        self,
        *,
        stream: None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    # Pickling and copies: same type, alignment and contents, a new block.
    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]: ...
    def __copy__(self) -> Self: ...
    def __deepcopy__(self, memo: dict[int, Any]) -> Self: ...
    def __sizeof__(self) -> int: ...

def _mem_stat() -> tuple[int, int, int, int, int, int, int]: ...
def peak_mem_usage(
    mem_const: Literal["enable", "disable", "peak_mem", "peak_mem_reset"],
) -> int | None: ...
def free_buffers() -> None: ...
def backing() -> Literal["active", "mkl-ran-first", "off", "unset"]:
    """Whether MKL allocates from the crate's memory: "active", "mkl-ran-first"
    (MKL was called before mkl_alloc was imported), "off" or "unset"."""

# NumPy's data-memory handlers (NEP 49): "mem_handler" capsules.
def numpy_handler(alignment: int = 64) -> CapsuleType: ...
def set_numpy_handler(handler: CapsuleType | None) -> CapsuleType: ...
def _is_mkl_dlpack(obj: object) -> bool: ...

# What mkl_alloc.show_config() reports (python/src/memory_manager.rs).
def _settings() -> dict[str, Any]: ...
def _mkl_info() -> tuple[str, int, int, int]: ...

# Behind mkl_alloc.configure(): sets the settings named in `changes`
# ("block_cache", "huge_pages", "decay_ms"), all checked before any is set.
def _configure(changes: dict[str, object]) -> None: ...

def _background_start() -> None:
    """Starts the background decay thread unless it runs; OSError if refused."""

def _background_stop() -> None:
    """Stops the background decay thread and joins it."""

def background_running() -> bool:
    """Whether mkl-alloc's background decay thread runs in this process."""
