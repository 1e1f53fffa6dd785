"""The module functions mirroring mkl-service's (names and meanings)."""

import pytest

import mkl_alloc
from mkl_alloc import MKLMemory


def test_mem_stat_counts_mklmemory_blocks():
    before = mkl_alloc.mem_stat()
    nbytes, nbuffers = before
    assert isinstance(nbytes, int) and isinstance(nbuffers, int)
    m = MKLMemory(1 << 20)
    during = mkl_alloc.mem_stat()
    # MKL counts each block with its own bookkeeping (88 bytes were observed).
    assert 1 << 20 <= during.allocated_bytes - before.allocated_bytes < (1 << 20) + 4096
    assert during.allocated_buffers - before.allocated_buffers == 1
    del m
    assert mkl_alloc.mem_stat() == before


def test_mem_stat_reads_like_mkl_services_dict_too():
    s = mkl_alloc.mem_stat()
    assert s["allocated_bytes"] == s[0] and s["allocated_buffers"] == s[1]
    assert s[-1] == s.allocated_buffers and s[:] == tuple(s)
    for key in ["bytes", "count", "index", "_fields", "__len__"]:
        with pytest.raises(KeyError):
            s[key]


def test_peak_mem_usage_tracks_growth():
    assert mkl_alloc.peak_mem_usage("enable") is not None
    m = MKLMemory(2 << 20)
    assert mkl_alloc.peak_mem_usage("peak_mem") >= 2 << 20
    del m
    assert mkl_alloc.peak_mem_usage("peak_mem_reset") >= 2 << 20
    assert mkl_alloc.peak_mem_usage("peak_mem") < 2 << 20
    mkl_alloc.peak_mem_usage("disable")
    assert mkl_alloc.peak_mem_usage("peak_mem") is None


@pytest.mark.parametrize("bad", ["bogus", "", 1, None])
def test_peak_mem_usage_refuses_unknown_constants_naming_them(bad):
    with pytest.raises(ValueError, match=f"peak_mem_usage\\({bad!r}\\).*'enable'"):
        mkl_alloc.peak_mem_usage(bad)


def test_free_buffers_keeps_live_blocks():
    m = MKLMemory(b"alive")
    assert mkl_alloc.free_buffers() is None
    assert m.tobytes() == b"alive"
