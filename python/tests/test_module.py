"""The module functions mirroring mkl-service's (names and meanings)."""

import copy
import pickle

import pytest
from conftest import block_cache_on

import mkl_alloc
from mkl_alloc import MKLMemory


def test_mem_stat_counts_mklmemory_blocks():
    mkl_alloc.free_buffers()  # no cached block that could serve m
    before = mkl_alloc.mem_stat()
    nbytes, nbuffers = before
    assert isinstance(nbytes, int) and isinstance(nbuffers, int)
    m = MKLMemory(1 << 20)
    during = mkl_alloc.mem_stat()
    # MKL counts each block with its own bookkeeping (88 bytes were observed).
    assert 1 << 20 <= during.allocated_bytes - before.allocated_bytes < (1 << 20) + 4096
    assert during.allocated_buffers - before.allocated_buffers == 1
    assert during.live_bytes - before.live_bytes == during.allocated_bytes - before.allocated_bytes
    del m
    after = mkl_alloc.mem_stat()
    # A freed block leaves MKL's count at once: its chunk (1 MiB plus MKL's
    # 88 bytes, in whole pages) is the block cache's, beneath MKL.
    assert after == before
    assert (after.live_bytes, after.live_buffers) == tuple(before)
    if block_cache_on():
        assert (after.cached_bytes, after.cached_buffers) == ((1 << 20) + 4096, 1)
    else:
        assert (after.cached_bytes, after.cached_buffers) == (0, 0)
    mkl_alloc.free_buffers()
    assert mkl_alloc.mem_stat() == before
    assert mkl_alloc.mem_stat().cached_bytes == 0


def test_mem_stat_tells_cached_from_live_bytes():
    mkl_alloc.free_buffers()
    s = mkl_alloc.mem_stat()
    assert (s.cached_bytes, s.cached_buffers) == (0, 0)
    assert (s.live_bytes, s.live_buffers) == tuple(s)
    blocks = [MKLMemory(n * (1 << 20)) for n in (2, 3)]
    held = mkl_alloc.mem_stat()
    del blocks
    s = mkl_alloc.mem_stat()
    assert (s.live_bytes, s.live_buffers) == tuple(s)
    # MKL's count is back where it was before the blocks: the cache keeps
    # their chunks apart (each 88 bytes of MKL's more, in whole pages).
    assert held.allocated_buffers - s.allocated_buffers == 2
    assert held.allocated_bytes - s.allocated_bytes >= 5 << 20
    if block_cache_on():
        assert s.cached_buffers == 2 and s.cached_bytes == (5 << 20) + 2 * 4096
    else:
        assert s.cached_bytes == 0
    assert repr(s) == (
        f"MemStat(allocated_bytes={s[0]}, allocated_buffers={s[1]}, "
        f"cached_bytes={s.cached_bytes}, cached_buffers={s.cached_buffers}, "
        f"slack_bytes={s.slack_bytes}, medium_dirty_bytes={s.medium_dirty_bytes}, "
        f"medium_clean_bytes={s.medium_clean_bytes})"
    )
    mkl_alloc.free_buffers()


def test_mem_stat_is_a_read_only_record_that_copies_whole():
    s = mkl_alloc.MemStat(100, 3, 40, 1, 24)
    assert len(s) == 2 and tuple(s) == (100, 3) and s == (100, 3)
    assert (s.cached_bytes, s.cached_buffers, s.live_bytes, s.live_buffers) == (40, 1, 100, 3)
    assert s.slack_bytes == 24 and s._replace(slack_bytes=0).slack_bytes == 0
    m = mkl_alloc.MemStat(100, 3, 40, 1, 24, 8192, 4096)
    assert (m.medium_dirty_bytes, m.medium_clean_bytes) == (8192, 4096) and m == (100, 3)
    assert m._replace(medium_dirty_bytes=0).medium_dirty_bytes == 0
    assert pickle.loads(pickle.dumps(m)).medium_clean_bytes == 4096
    assert (s.medium_dirty_bytes, s.medium_clean_bytes) == (0, 0)
    assert s._asdict() == {"allocated_bytes": 100, "allocated_buffers": 3}
    for copied in (pickle.loads(pickle.dumps(s)), copy.copy(s), copy.deepcopy(s),
                   s._replace()):
        assert type(copied) is mkl_alloc.MemStat and repr(copied) == repr(s)
    assert s._replace(cached_bytes=0).live_bytes == 100
    assert s._replace(allocated_bytes=7).live_bytes == 7
    assert mkl_alloc.MemStat._make([5, 1]).cached_bytes == 0
    for name in ["allocated_bytes", "cached_bytes", "live_bytes", "other"]:
        with pytest.raises(AttributeError):
            setattr(s, name, 0)
    # The cache's counts are apart from MKL's: they may exceed them.
    assert mkl_alloc.MemStat(10, 1, 20, 2).live_bytes == 10


def test_mem_stat_reads_like_mkl_services_dict_too():
    s = mkl_alloc.mem_stat()
    assert s["allocated_bytes"] == s[0] and s["allocated_buffers"] == s[1]
    assert s[-1] == s.allocated_buffers and s[:] == tuple(s)
    for key in ["bytes", "count", "index", "_fields", "__len__"]:
        with pytest.raises(KeyError):
            s[key]


def test_peak_mem_usage_tracks_growth():
    # MKL's peak is the growth of its count from "enable" on: no block that
    # existed before may be freed while it tracks (the peak stays wrong
    # after), and m's block must leave MKL's count, not the block cache's.
    mkl_alloc.free_buffers()
    assert mkl_alloc.peak_mem_usage("enable") is not None
    m = MKLMemory(2 << 20)
    assert mkl_alloc.peak_mem_usage("peak_mem") >= 2 << 20
    del m
    mkl_alloc.free_buffers()
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
