"""Shared helpers for the mkl_alloc tests."""

import ctypes
import importlib
import os
import sys

import pytest

PyBUF_SIMPLE = 0
PyBUF_WRITABLE = 0x0001
PyBUF_FORMAT = 0x0004
PyBUF_ND = 0x0008
PyBUF_STRIDES = 0x0010 | PyBUF_ND
PyBUF_FULL_RO = PyBUF_STRIDES | 0x0100 | PyBUF_FORMAT


class Py_buffer(ctypes.Structure):
    """CPython's Py_buffer (stable layout since 3.3)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(Py_buffer)]
_release_buffer.restype = None


def get_buffer(obj, flags):
    """PyObject_GetBuffer(obj, flags) through ctypes: a filled Py_buffer
    (release it with release_buffer) or the exporter's exception."""
    view = Py_buffer()
    if _get_buffer(obj, ctypes.byref(view), flags) != 0:
        raise AssertionError("unreachable: ctypes.pythonapi raises the error")
    return view


def release_buffer(view):
    _release_buffer(ctypes.byref(view))


@pytest.fixture
def pattern():
    """256 distinct-enough bytes."""
    return bytes((i * 37 + 11) % 256 for i in range(256))


def require(module):
    """Imports an optional test dependency (mpi4py, jax): the test is
    skipped where it is not installed, except under CI=true, where a missing
    one fails the run instead of skipping quietly."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (see python/README.md)")


MiB = 1 << 20

# The tests that need Linux itself (fork, /proc, madvise, the MPI and JAX
# wheels of the test extras) are skipped elsewhere, each with its reason:
# scripts/windows-python-check.sh runs the rest on Windows CPython.
LINUX = sys.platform.startswith("linux")


def linux_only(reason):
    """A skip marker for a test that needs Linux: `reason` says what of it."""
    return pytest.mark.skipif(not LINUX, reason=f"Linux only: {reason}")


def numpy_at_least(version):
    """Whether the installed NumPy is `version` ("2.1.0") or later. Under
    wine the Windows tests run NumPy 1.26 (NumPy 2's Windows wheels need a
    C runtime function wine 8 lacks), so tests of NumPy 2 features say so."""
    import numpy as np

    return np.lib.NumpyVersion(np.__version__) >= version


def block_cache_on():
    """Whether the crate's block cache keeps freed blocks of 1 MiB and more,
    as MKL_ALLOC_BLOCK_CACHE sets it: on unless "off" or "0" (unset, empty,
    "on" or a byte count: on; any other value keeps the default, on).
    On Windows the cache is beneath MKL too: MKL takes its memory functions
    from the libimalloc.dll that the mkl wheel installs beside mkl_rt.3.dll
    (Library\\bin), whose pointers the crate sets at import.
    """
    return (LINUX or sys.platform == "win32") and os.environ.get(
        "MKL_ALLOC_BLOCK_CACHE", ""
    ) not in ("off", "0")


def huge_page_threshold():
    """The smallest block the crate's huge-page policy asks of MKL at a
    2 MiB boundary (MKL then counts the 2 MiB of alignment in mem_stat()),
    as MKL_ALLOC_HUGE_PAGES sets it: 4 MiB when unset, empty or "on" (and
    for any value it does not understand), None when "off" or "0", else the
    byte count it holds."""
    value = os.environ.get("MKL_ALLOC_HUGE_PAGES", "")
    if value in ("off", "0"):
        return None
    if value.isdigit():
        return int(value)
    return 4 * MiB
