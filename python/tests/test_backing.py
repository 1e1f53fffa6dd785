"""mkl_alloc.backing(): whether MKL allocates from the crate's memory.

In this process mkl_alloc was imported before anything called MKL, so the
backing is active. In subprocesses: MKL called first (through ctypes, or
mkl-service), then mkl_alloc imported: "mkl-ran-first", with MKL's counts
still right and nothing cached beneath MKL; libmkl_rt loaded first but not
called: "active"; and MKL_ALLOC_BACKING=off: "off". Each child runs with the
block cache and huge pages set explicitly (on, or both off: the hooks then
take only blocks of 32 MiB and more, so the child's block is that large)."""

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
    state = mkl_alloc.backing()
    if os.environ.get("MKL_ALLOC_BACKING") in ("off", "0"):
        assert state == "off"
    elif LINUX:
        assert state == "active"
    else:
        # Windows: no chunks yet ("off"), or chunks ("active").
        assert state in ("active", "off"), state
    del m
    assert mkl_alloc.backing() == state


def test_backing_is_one_of_the_documented_strings():
    assert mkl_alloc.backing() in STATES
    assert "backing" in mkl_alloc.__all__
    doc = mkl_alloc.backing.__doc__ or ""
    for state in STATES:
        assert f'"{state}"' in doc, state


# NO_REFCHECK: the children's blocks are held by their module alone, which
# CPython 3.14 and later cannot tell from another holder ("may be
# referenced ... false positive", as NumPy's ndarray.resize); these tests
# are about the backing, not that rule (test_seed_compat.py is), so their
# reallocs pass refcheck=False. The export check still runs.

# The child's part after MKL's first call: import mkl_alloc, check the
# state after an MKLMemory of SIZE bytes, follow the block through its life
# (written, grown to twice SIZE, freed), and print what it saw as JSON for
# the parent's assertions (which then name the numbers).
AFTER_MKL = """
import json, sys
assert "mkl_alloc" not in sys.modules
import mkl_alloc

def stat():
    s = mkl_alloc.mem_stat()
    return [s.allocated_bytes, s.allocated_buffers, s.cached_bytes]

out = {"before": stat()}
m = mkl_alloc.MKLMemory(SIZE)
out["state"] = mkl_alloc.backing()
out["live"] = stat()
view = memoryview(m)
view[:: 1 << 20] = bytes(range(SIZE >> 20))
del view
m.realloc(2 * SIZE, refcheck=False)  # the module holds m: see NO_REFCHECK
out["kept"] = m.tobytes()[: SIZE : 1 << 20] == bytes(range(SIZE >> 20))
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

# mkl-service's get_max_threads, an MKL call that allocates nothing: MKL
# copies its memory pointers now. Where mkl-service has no wheel (CPython
# 3.15: conftest.NO_WHEEL_FROM) the child makes the same call,
# MKL_Get_Max_Threads, through ctypes on the same libmkl_rt.
MKL_SERVICE_FIRST = """
import sys
if sys.version_info < (3, 15):
    import mkl  # mkl-service
    mkl.get_max_threads()
else:
    import ctypes, importlib.metadata
    (path,) = [str(f.locate()) for f in importlib.metadata.distribution("mkl").files
               if f.name == "libmkl_rt.so.3"]
    assert ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL).MKL_Get_Max_Threads() >= 1
"""


# The crate's two policies, as each child runs (with MKL_ALLOC_BACKING=on,
# whatever pytest's environment says): (environment, the size of the
# child's block: one the hooks serve with a chunk under that policy).
POLICIES = {
    "defaults": ({"MKL_ALLOC_BLOCK_CACHE": "on", "MKL_ALLOC_HUGE_PAGES": "on"}, 16 * MiB),
    "cache-and-huge-pages-off": (
        {"MKL_ALLOC_BLOCK_CACHE": "off", "MKL_ALLOC_HUGE_PAGES": "off"},
        32 * MiB,
    ),
}


def run_child(prelude, policy="defaults", env=None):
    policy_env, size = POLICIES[policy]
    script = f"SIZE = {size}\n" + textwrap.dedent(prelude) + AFTER_MKL
    r = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MKL_ALLOC_BACKING": "on", **policy_env, **(env or {})},
    )
    assert r.returncode == 0, f"child failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["size"] = size
    return out


def expected_library():
    import importlib.metadata

    (path,) = [
        os.path.realpath(str(f.locate()))
        for f in importlib.metadata.distribution("mkl").files or []
        if f.name == "libmkl_rt.so.3"
    ]
    return path


def check_counts(out):
    """MKL's count holds the block (SIZE bytes, then twice that) while it
    lives and drops back when it is freed, within 4 KiB of MKL's own
    bookkeeping; the contents survive the growth."""
    before, live, grown, after = out["before"], out["live"], out["grown"], out["after"]
    size = out["size"]
    assert size <= live[0] - before[0] < size + 4096, out
    assert live[1] - before[1] == 1, out
    assert 2 * size <= grown[0] - before[0] < 2 * size + 4096, out
    assert grown[1] - before[1] == 1, out
    assert after[:2] == before[:2], out
    assert out["kept"], out


@linux_only("MKL on the crate's memory is Linux-only; without it there is nothing MKL could skip")
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize(
    "first",
    [
        pytest.param("CALL_MKL = True\n" + CTYPES_FIRST, id="ctypes-MKL_malloc"),
        pytest.param(MKL_SERVICE_FIRST, id="mkl-service"),
    ],
)
def test_mkl_called_before_the_import_is_reported(first, policy):
    out = run_child(first, policy)
    assert out["state"] == "mkl-ran-first", out
    check_counts(out)
    # MKL never calls the crate's hooks: nothing is cached beneath it.
    for key in ("before", "live", "grown", "after", "emptied"):
        assert out[key][2] == 0, (key, out)
    # The one MKL: the extension found the library the child loaded.
    assert [os.path.realpath(p) for p in out["libmkl_rt"]] == [expected_library()], out


@linux_only("MKL on the crate's memory is Linux-only")
@pytest.mark.parametrize("policy", list(POLICIES))
def test_libmkl_rt_loaded_first_but_not_called_leaves_the_backing_active(policy):
    """The control for the test above: loading libmkl_rt before mkl_alloc is
    harmless; only a call into MKL before the import takes the backing away."""
    out = run_child("CALL_MKL = False\n" + CTYPES_FIRST, policy)
    assert out["state"] == "active", out
    check_counts(out)
    if policy == "defaults":
        # MKL's freed chunk is kept beneath it, outside MKL's count, until
        # free_buffers().
        assert out["after"][2] >= 2 * out["size"], out
    else:
        for key in ("before", "live", "grown", "after"):
            assert out[key][2] == 0, (key, out)
    assert out["emptied"][2] == 0, out


@linux_only("MKL on the crate's memory is Linux-only")
def test_a_block_the_hooks_leave_to_the_c_runtime_is_not_mkl_ran_first():
    """With the block cache and huge pages off the hooks leave blocks under
    32 MiB to the C runtime: a 16 MiB one comes back without a chunk, and
    that alone must not read as "mkl-ran-first"."""
    script = """
        import mkl_alloc
        m = mkl_alloc.MKLMemory(16 << 20)
        print(mkl_alloc.backing())
    """
    env = {**os.environ, "MKL_ALLOC_BACKING": "on", **POLICIES["cache-and-huge-pages-off"][0]}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, f"child failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    assert r.stdout.split() == ["active"], r.stdout


def test_backing_off_in_the_environment():
    out = run_child("", env={"MKL_ALLOC_BACKING": "off"})
    assert out["state"] == "off", out
    check_counts(out)
    for key in ("before", "live", "grown", "after", "emptied"):
        assert out[key][2] == 0, (key, out)
