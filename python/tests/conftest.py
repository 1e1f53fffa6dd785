"""Shared helpers for the mkl_alloc tests."""

import ctypes
import importlib
import importlib.util
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


# Test dependencies with no wheel for the newest CPythons, which the extras
# leave out there by an environment marker (python/pyproject.toml): the
# first CPython without one. Lift an entry when its wheel is published.
NO_WHEEL_FROM = {"jax": (3, 15), "mkl": (3, 15)}


def no_wheel_here(module):
    """Why ``module`` cannot be installed on this interpreter ("jaxlib has no
    CPython 3.15 wheel"), or None where it can."""
    since = NO_WHEEL_FROM.get(module)
    if since is None or sys.version_info[:2] < since or importlib.util.find_spec(module):
        return None
    name = {"jax": "jaxlib", "mkl": "mkl-service"}[module]
    return f"{name} has no CPython {sys.version_info[0]}.{sys.version_info[1]} wheel"


def require(module):
    """Imports an optional test dependency (mpi4py, jax): the test is
    skipped where it is not installed, except under CI=true, where a missing
    one fails the run instead of skipping quietly; on a CPython the module
    has no wheel for (``NO_WHEEL_FROM``) it is skipped, saying so, also
    under CI (scripts/python-next-check.sh allows exactly those skips)."""
    reason = no_wheel_here(module)
    if reason:
        pytest.skip(reason, allow_module_level=True)
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


# mkl-service publishes no wheel for CPython 3.15 yet (the test extra leaves
# it out there: python/pyproject.toml). The tests that compare with it then
# ask the process's own libmkl_rt.so.3 the same questions through ctypes,
# as mkl-service itself does through Cython: the same MKL functions, so the
# same facts, with mkl-service's return values.


class MklRt:
    """mkl-service's ``mem_stat``, ``peak_mem_usage`` and ``get_max_threads``
    on the process's libmkl_rt.so.3, for a Python mkl-service has no wheel
    for. The library is the one the `mkl` wheel installed (found through its
    file list, as mkl_alloc itself finds it), already loaded in the process
    once mkl_alloc is imported: the same MKL, by its soname."""

    _MODES = {"enable": 1, "disable": 0, "peak_mem": 2, "peak_mem_reset": -1}

    def __init__(self):
        import importlib.metadata

        (path,) = [str(f.locate()) for f in importlib.metadata.distribution("mkl").files
                   if f.name == "libmkl_rt.so.3"]
        rt = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        rt.MKL_Mem_Stat.restype = ctypes.c_int64
        rt.MKL_Mem_Stat.argtypes = [ctypes.POINTER(ctypes.c_int)]
        rt.MKL_Peak_Mem_Usage.restype = ctypes.c_int64
        rt.MKL_Peak_Mem_Usage.argtypes = [ctypes.c_int]
        rt.MKL_Get_Max_Threads.restype = ctypes.c_int
        rt.MKL_Get_Max_Threads.argtypes = []
        self._rt = rt

    def mem_stat(self):
        """``{"allocated_bytes": ..., "allocated_buffers": ...}``, as mkl-service's."""
        buffers = ctypes.c_int(0)
        allocated = self._rt.MKL_Mem_Stat(ctypes.byref(buffers))
        return {"allocated_bytes": allocated, "allocated_buffers": buffers.value}

    def peak_mem_usage(self, mode):
        """MKL_Peak_Mem_Usage for mkl-service's mode names; "error" where MKL
        returns -1 (tracking off), as mkl-service does."""
        value = self._rt.MKL_Peak_Mem_Usage(self._MODES[mode])
        return "error" if value == -1 else value

    def get_max_threads(self):
        return self._rt.MKL_Get_Max_Threads()


def mkl_service():
    """mkl-service's module where the test extra installs it (CPython 3.10 to
    3.14; under CI=true it must be there), else :class:`MklRt`."""
    if not no_wheel_here("mkl"):
        return importlib.import_module("mkl")
    return MklRt()


# Dask (tests/test_dask.py) comes with the package's `dask` extra, which
# only .ci/run's main venv installs; it sets MKL_ALLOC_REQUIRE_DASK=1 there,
# so that a missing distributed fails the run. Elsewhere (the wheel, sdist,
# next-Python and Windows checks install the test extra alone, some under
# CI=true) test_dask.py is not collected where distributed is missing, and
# pytest's header says so: not a skip, since those runs fail on skips that
# a missing wheel does not explain. Run on its own, it skips, saying why.
# Ray (tests/test_ray.py, the `ray` extra) likewise, with
# MKL_ALLOC_REQUIRE_RAY=1.
DASK_REQUIRED = os.environ.get("MKL_ALLOC_REQUIRE_DASK") == "1"
DASK_MISSING = importlib.util.find_spec("distributed") is None
RAY_REQUIRED = os.environ.get("MKL_ALLOC_REQUIRE_RAY") == "1"
RAY_MISSING = importlib.util.find_spec("ray") is None
collect_ignore = ["test_dask.py"] if DASK_MISSING and not DASK_REQUIRED else []
if RAY_MISSING and not RAY_REQUIRED:
    collect_ignore.append("test_ray.py")


def pytest_report_header(config):
    """Says that test_dask.py or test_ray.py is left out, and why, where it is."""
    lines = []
    if "test_dask.py" in collect_ignore:
        lines.append("mkl_alloc: test_dask.py not collected: distributed is not installed "
                     "(the dask extra; MKL_ALLOC_REQUIRE_DASK=1 makes that a failure)")
    if "test_ray.py" in collect_ignore:
        lines.append("mkl_alloc: test_ray.py not collected: ray is not installed "
                     "(the ray extra; MKL_ALLOC_REQUIRE_RAY=1 makes that a failure)")
    return lines or None


def require_ray():
    """Imports ``ray`` for test_ray.py: where it is missing, the module is
    skipped, except under MKL_ALLOC_REQUIRE_RAY=1 (.ci/run's main venv,
    which installs the ray extra), where that fails."""
    if RAY_REQUIRED:
        try:
            return importlib.import_module("ray")
        except ImportError as e:
            raise ImportError(
                f"MKL_ALLOC_REQUIRE_RAY=1 asks for the Ray tests, but ray cannot be "
                f"imported ({e}): pip install './python[test,ray]'"
            ) from e
    return pytest.importorskip("ray", reason="ray is not installed (the ray extra: pip install './python[test,ray]')")


def require_dask():
    """Imports ``distributed`` for test_dask.py: where it is missing, the
    module is skipped, except under MKL_ALLOC_REQUIRE_DASK=1 (.ci/run's
    main venv, which installs the dask extra), where that fails."""
    if DASK_REQUIRED:
        try:
            return importlib.import_module("distributed")
        except ImportError as e:
            raise ImportError(
                f"MKL_ALLOC_REQUIRE_DASK=1 asks for the Dask tests, but distributed "
                f"cannot be imported ({e}): pip install './python[test,dask]'"
            ) from e
    return pytest.importorskip(
        "distributed", reason="distributed is not installed (the dask extra: pip install './python[test,dask]')")
