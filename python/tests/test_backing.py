"""mkl_alloc.backing(): whether MKL allocates from the crate's memory.

In this process mkl_alloc was imported before anything called MKL, so the
backing is active. In subprocesses: MKL called first (through ctypes, or
mkl-service), then mkl_alloc imported: "mkl-ran-first", with MKL's counts
still right and nothing cached beneath MKL; and MKL_ALLOC_BACKING=off:
"off"."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import mkl_alloc
from conftest import LINUX, MiB, linux_only
from mkl_alloc import MKLMemory

STATES = {"active", "mkl-ran-first", "off", "unset"}


def test_backing_is_active_after_a_large_block():
    m = MKLMemory(8 * MiB)
    try:
        state = mkl_alloc.backing()
        if LINUX:
            assert state == "active"
        else:
            # Windows: no chunks yet ("off"), or chunks ("active").
            assert state in ("active", "off"), state
    finally:
        del m
    assert mkl_alloc.backing() == state


def test_backing_is_one_of_the_documented_strings():
    assert mkl_alloc.backing() in STATES
    assert "backing" in mkl_alloc.__all__
    doc = mkl_alloc.backing.__doc__ or ""
    for state in STATES:
        assert f'"{state}"' in doc, state


# The child's part after MKL's first call: import mkl_alloc, check the
# state, then an MKLMemory of 16 MiB through its life, and print what it
# saw as JSON for the parent's assertions (which then name the numbers).
AFTER_MKL = """
import json, sys
assert "mkl_alloc" not in sys.modules
import mkl_alloc

def stat():
    s = mkl_alloc.mem_stat()
    return [s.allocated_bytes, s.allocated_buffers, s.cached_bytes]

out = {"before": stat()}
m = mkl_alloc.MKLMemory(16 << 20)
out["state"] = mkl_alloc.backing()
out["live"] = stat()
view = memoryview(m)
view[:: 1 << 20] = bytes(range(16))
del view
m.realloc(32 << 20)
out["kept"] = m.tobytes()[: 16 << 20 : 1 << 20] == bytes(range(16))
out["grown"] = stat()
del m
out["after"] = stat()
mkl_alloc.free_buffers()
out["emptied"] = stat()
out["libmkl_rt"] = []
if sys.platform.startswith("linux"):
    with open("/proc/self/maps") as f:
        out["libmkl_rt"] = sorted({l.split()[-1] for l in f if "libmkl_rt" in l})
print(json.dumps(out))
"""

# Loads the `mkl` wheel's libmkl_rt.so.3 as the package itself finds it
# (mkl_alloc._load_mkl_rt: the distribution's file list), without importing
# mkl_alloc; CALL_MKL says whether MKL is then called.
CTYPES_FIRST = """
import ctypes, importlib.metadata
(path,) = [str(f.locate()) for f in importlib.metadata.distribution("mkl").files
           if f.name == "libmkl_rt.so.3"]
rt = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
if CALL_MKL:
    rt.MKL_malloc.restype = ctypes.c_void_p
    rt.MKL_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int]
    rt.MKL_free.argtypes = [ctypes.c_void_p]
    p = rt.MKL_malloc(8 << 20, 64)
    assert p, "MKL_malloc(8 MiB, 64) returned NULL"
    ctypes.memset(p, 1, 8 << 20)
    rt.MKL_free(p)
"""

MKL_SERVICE_FIRST = """
import mkl  # mkl-service
mkl.get_max_threads()  # an MKL call: MKL copies its memory pointers now
"""


def run_child(prelude, env=None):
    script = textwrap.dedent(prelude) + AFTER_MKL
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, f"child failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def expected_library():
    import importlib.metadata

    (path,) = [
        os.path.realpath(str(f.locate()))
        for f in importlib.metadata.distribution("mkl").files or []
        if f.name == "libmkl_rt.so.3"
    ]
    return path


def check_counts(out):
    """MKL's count holds the 16 MiB block (then 32 MiB) while it lives and
    drops back when it is freed; each is MKL's own bookkeeping within 4 KiB."""
    before, live, grown, after = out["before"], out["live"], out["grown"], out["after"]
    assert 16 * MiB <= live[0] - before[0] < 16 * MiB + 4096, out
    assert live[1] - before[1] == 1, out
    assert 32 * MiB <= grown[0] - before[0] < 32 * MiB + 4096, out
    assert grown[1] - before[1] == 1, out
    assert after[:2] == before[:2], out
    assert out["kept"], out


@linux_only("MKL on the crate's memory is Linux-only; without it there is nothing MKL could skip")
@pytest.mark.parametrize(
    "first",
    [
        pytest.param("CALL_MKL = True\n" + CTYPES_FIRST, id="ctypes-MKL_malloc"),
        pytest.param(MKL_SERVICE_FIRST, id="mkl-service"),
    ],
)
def test_mkl_called_before_the_import_is_reported(first):
    out = run_child(first)
    assert out["state"] == "mkl-ran-first", out
    check_counts(out)
    # MKL never calls the crate's hooks: nothing is cached beneath it.
    for key in ("before", "live", "grown", "after", "emptied"):
        assert out[key][2] == 0, (key, out)
    # The one MKL: the extension found the library the child loaded.
    assert [os.path.realpath(p) for p in out["libmkl_rt"]] == [expected_library()], out


@linux_only("MKL on the crate's memory is Linux-only")
def test_libmkl_rt_loaded_first_but_not_called_leaves_the_backing_active():
    """The control for the test above: loading libmkl_rt before mkl_alloc is
    harmless; only a call into MKL before the import takes the backing away."""
    out = run_child("CALL_MKL = False\n" + CTYPES_FIRST)
    assert out["state"] == "active", out
    check_counts(out)
    # MKL's freed chunk is kept beneath it, outside MKL's count, until
    # free_buffers() (unless the environment turned the block cache off).
    if os.environ.get("MKL_ALLOC_BLOCK_CACHE", "") not in ("off", "0"):
        assert out["after"][2] >= 32 * MiB, out
    assert out["emptied"][2] == 0, out


def test_backing_off_in_the_environment():
    out = run_child("", env={"MKL_ALLOC_BACKING": "off"})
    assert out["state"] == "off", out
    check_counts(out)
    for key in ("before", "live", "grown", "after", "emptied"):
        assert out[key][2] == 0, (key, out)
