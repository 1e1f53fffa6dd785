"""One MKL per process: MKLMemory, mkl-service and the module functions all
see the `mkl` wheel's libmkl_rt.so.3 (the extension links it through its
RUNPATH and bundles no copy). Where mkl-service has no wheel (CPython 3.15),
the same questions go to that libmkl_rt through ctypes (conftest.MklRt)."""

import os
import sys

import pytest

import mkl_alloc
from conftest import mkl_service
from mkl_alloc import MKLMemory

MiB = 1 << 20
mkl = mkl_service()
# MKL counts each block with its own bookkeeping (88 bytes were observed).
OVERHEAD = 4096


def grew_by(before, after, nbytes):
    """MKL's count grew by ``nbytes``, plus its bookkeeping."""
    delta = after["allocated_bytes"] - before["allocated_bytes"]
    return nbytes <= delta < nbytes + OVERHEAD


def test_64_mib_in_mklmemory_moves_mkl_service_mem_stat_by_that_much():
    mkl_alloc.free_buffers()
    before = mkl.mem_stat()
    m = MKLMemory(64 * MiB)
    during = mkl.mem_stat()
    assert grew_by(before, during, 64 * MiB), (before, during)
    assert during["allocated_buffers"] - before["allocated_buffers"] == 1
    # A growing realloc is seen at once (the chunk beneath MKL grows with
    # mremap). A shrinking one is not: MKL_realloc shrinks in place and
    # keeps counting the block's original size.
    m.realloc(96 * MiB)
    assert grew_by(before, mkl.mem_stat(), 96 * MiB)
    # Freed, it leaves mkl-service's count at once, though the block cache
    # beneath MKL keeps its chunk.
    del m
    assert mkl.mem_stat() == before
    mkl_alloc.free_buffers()
    assert mkl.mem_stat() == before


def test_module_functions_report_the_same_mkl_as_mkl_service():
    m = MKLMemory(3 * MiB)
    ours = mkl_alloc.mem_stat()
    theirs = mkl.mem_stat()
    assert (ours.allocated_bytes, ours.allocated_buffers) == (
        theirs["allocated_bytes"],
        theirs["allocated_buffers"],
    )
    assert ours["allocated_bytes"] == ours[0] == theirs["allocated_bytes"]
    del m


def test_peak_tracking_is_shared_with_mkl_service():
    # As test_module's peak test: nothing older freed while MKL tracks, and
    # m's block given back by the block cache before the reset.
    mkl_alloc.free_buffers()
    assert mkl_alloc.peak_mem_usage("enable") is not None
    m = MKLMemory(5 * MiB)
    del m
    mkl_alloc.free_buffers()
    # Tracking turned on here is seen by mkl-service's function, and back.
    assert mkl.peak_mem_usage("peak_mem") >= 5 * MiB
    assert mkl_alloc.peak_mem_usage("peak_mem_reset") >= 5 * MiB
    assert mkl_alloc.peak_mem_usage("peak_mem") < 5 * MiB
    mkl.peak_mem_usage("disable")
    assert mkl_alloc.peak_mem_usage("peak_mem") is None
    assert mkl.peak_mem_usage("peak_mem") == "error"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_exactly_one_libmkl_rt_is_mapped_and_it_is_the_wheels():
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libmkl_rt" in line}
    assert len(paths) == 1, paths
    (path,) = paths
    assert os.path.realpath(os.path.dirname(path)) == os.path.realpath(
        os.path.join(sys.prefix, "lib")
    )
    package = os.path.dirname(mkl_alloc.__file__)
    assert not any("libmkl" in name for name in os.listdir(package)), "libmkl_rt bundled"
