"""NumPy arrays on MKL memory: the NEP 49 handler (numpy_handler,
set_numpy_handler, numpy_memory, is_mkl_array)."""

import asyncio
import gc
import inspect
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import huge_page_threshold, mkl_service

import mkl_alloc
from mkl_alloc import (
    MKLMemory,
    is_mkl_array,
    numpy_handler,
    numpy_memory,
    set_numpy_handler,
)

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # NumPy 1.x
    from numpy.core.multiarray import get_handler_name

MiB = 1 << 20
mkl = mkl_service()  # mkl-service, or the same questions through ctypes on 3.15
ALIGNMENTS = [1 << k for k in range(6, 22)]  # 64 .. 2 MiB


def address(a):
    return a.__array_interface__["data"][0]


@pytest.fixture(autouse=True)
def default_handler_around_each_test():
    """Every test starts and must end on NumPy's default handler."""
    assert get_handler_name() == "default_allocator"
    yield
    assert get_handler_name() == "default_allocator", "a test left a handler installed"


def test_one_immortal_handler_per_alignment():
    h = numpy_handler()
    assert h is numpy_handler(64) is numpy_handler(alignment=64)
    assert numpy_handler(128) is numpy_handler(128)
    assert numpy_handler(128) is not h
    assert type(h).__name__ == "PyCapsule"
    assert 'capsule object "mem_handler"' in repr(h)
    with numpy_memory(4096):
        assert get_handler_name() == "mkl_alloc"
        a = np.empty(10)
        assert get_handler_name(a) == "mkl_alloc"


@pytest.mark.parametrize("bad", [0, 3, 48, -64, 2**31, 2**64, -(2**70)])
def test_bad_alignments_are_value_errors(bad):
    for call in (numpy_handler, numpy_memory):
        with pytest.raises(ValueError, match=r"power of two from 1 to 2\*\*30"):
            call(bad)
    assert get_handler_name() == "default_allocator"


@pytest.mark.parametrize("bad", [64.0, "64", None, [64]])
def test_non_int_alignments_are_type_errors(bad):
    if bad is None:  # None is the keyword's default: 64
        assert numpy_handler(None) is numpy_handler(64)
        return
    with pytest.raises(TypeError, match="must be an int"):
        numpy_handler(bad)


def test_set_numpy_handler_returns_the_previous_and_none_means_default():
    default = set_numpy_handler(numpy_handler(256))
    try:
        assert get_handler_name() == "mkl_alloc"
        assert address(np.empty(3)) % 256 == 0
        prev = set_numpy_handler(numpy_handler(512))
        assert prev is numpy_handler(256)
        prev = set_numpy_handler(None)
        assert prev is numpy_handler(512)
        assert get_handler_name() == "default_allocator"
        # The default handler NumPy returned can be reinstalled.
        set_numpy_handler(numpy_handler())
        assert set_numpy_handler(default) is numpy_handler()
        assert get_handler_name() == "default_allocator"
    finally:
        set_numpy_handler(None)


def test_anything_but_a_mem_handler_capsule_is_refused_and_nothing_changes():
    with numpy_memory(128):
        for bad in (42, object(), "mem_handler", np.empty(3)):
            with pytest.raises(TypeError, match="mem_handler"):
                set_numpy_handler(bad)
            assert address(np.empty(5)) % 128 == 0
        # Capsules of another kind: DLPack's, NumPy's C-API table.
        other = [MKLMemory(8).__dlpack__(), np._core._multiarray_umath._ARRAY_API]
        for bad in other:
            with pytest.raises(ValueError, match="not a \"mem_handler\" capsule"):
                set_numpy_handler(bad)
            assert get_handler_name() == "mkl_alloc"
            assert address(np.empty(5)) % 128 == 0


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_alignment_kept_through_resize(alignment):
    with numpy_memory(alignment):
        a = np.arange(1000, dtype=np.float64)
        assert address(a) % alignment == 0
        for n in (10, 100_000, 300_000, 7, 0, 50):
            old = a.copy()
            a.resize(n, refcheck=False)
            assert address(a) % alignment == 0, (alignment, n)
            k = min(len(old), n)
            assert np.array_equal(a[:k], old[:k])
            a[:] = np.arange(n)
            assert is_mkl_array(a)
    # Outlives the context, still MKL memory, freed later through its handler.
    assert is_mkl_array(a) and a.sum() == sum(range(50))
    del a
    gc.collect()


def test_every_buffer_numpy_allocates_in_the_context_is_mkl_memory():
    with numpy_memory(64):
        a = np.ones(1000)
        made = [
            np.empty(0),  # NumPy asks for 1 byte
            np.empty((0, 5)),
            np.zeros(17),
            a + 1,  # ufunc output
            a * a + a,  # temporaries
            a.copy(),
            np.concatenate([a, a]),
            a.astype(np.float32),
            np.array([1, 2, 3]),
            np.arange(10)[::-1].copy(),
        ]
        for arr in made:
            assert is_mkl_array(arr), arr
            assert address(arr) % 64 == 0
    assert not is_mkl_array(np.ones(10))


def test_zeros_are_zero_small_blocks_reused_and_large_calloc():
    with numpy_memory():
        for _ in range(50):
            dirty = np.empty(100)
            dirty.fill(np.nan)
            del dirty
            z = np.zeros(100)
            assert not z.any()
        big = np.zeros(5 * MiB)  # NumPy may release the GIL around it
        assert not big.any() and is_mkl_array(big)
        huge = np.zeros((3, 4 * MiB // 8))
        assert not huge.any()


def test_fromstring_and_fromfile_grow_through_the_handler(tmp_path):
    values = np.arange(5000, dtype=np.float64) / 7
    text = " ".join(repr(float(v)) for v in values)
    f = tmp_path / "numbers.txt"
    f.write_text(text)
    with numpy_memory(1 << 12):
        # With sep and no count NumPy grows its buffer with realloc.
        a = np.fromstring(text, sep=" ")
        b = np.fromfile(f, sep=" ")
        c = np.fromfile(f, sep=" ", count=-1, dtype=np.float32)
    for arr in (a, b):
        assert np.array_equal(arr, values)
    assert np.allclose(c, values.astype(np.float32))
    for arr in (a, b, c):
        assert is_mkl_array(arr) and address(arr) % 4096 == 0


def test_memory_error_and_the_process_goes_on():
    with numpy_memory():
        with pytest.raises(MemoryError):
            np.empty(2**60, dtype=np.uint8)
        with pytest.raises(MemoryError):
            np.zeros((2**31, 2**31), dtype=np.uint8)  # nelem * elsize > isize
        a = np.ones(1000)
        assert a.sum() == 1000 and is_mkl_array(a)


def test_nesting_and_exceptions_restore_the_previous_handler():
    with numpy_memory(64) as outer:
        assert outer is numpy_handler(64)
        with pytest.raises(KeyError):
            with numpy_memory(1 << 16):
                assert address(np.empty(3)) % (1 << 16) == 0
                raise KeyError("inside")
        assert get_handler_name() == "mkl_alloc"
        with numpy_memory(1 << 10):
            with numpy_memory(1 << 20):
                assert address(np.empty(3)) % (1 << 20) == 0
            assert address(np.empty(3)) % (1 << 10) == 0
        assert is_mkl_array(np.empty(3))
    assert get_handler_name() == "default_allocator"
    # One manager per with-statement: reuse while entered is refused.
    cm = numpy_memory()
    with cm:
        with pytest.raises(RuntimeError, match="already in use"):
            cm.__enter__()
    with cm:  # reusable once exited
        assert get_handler_name() == "mkl_alloc"


def test_eight_threads_each_in_its_own_context_freed_on_other_threads():
    made = [None] * 8
    errors = []
    barrier = threading.Barrier(8)

    def work(i):
        try:
            # A new thread starts on NumPy's default handler, unless
            # sys.flags.thread_inherit_context (3.14+, default only when
            # free-threaded) gives it a copy of its starter's context.
            assert get_handler_name() in ("default_allocator", "mkl_alloc")
            alignment = 64 << i
            with numpy_memory(alignment):
                barrier.wait()
                arrs = [np.full(n, i, dtype=np.int64) for n in (1, 16, 1000, 200_000)]
                arrs.append(np.concatenate(arrs))
                for a in arrs:
                    assert address(a) % alignment == 0 and is_mkl_array(a)
                    assert get_handler_name() == "mkl_alloc"
            made[i] = arrs
            barrier.wait()
            # Free another thread's arrays here.
            theirs = made[(i + 3) % 8]
            made[(i + 3) % 8] = None
            assert all((a == (i + 3) % 8).all() for a in theirs)
            del theirs
            # Churn small blocks freed by everyone into the bins.
            for _ in range(200):
                with numpy_memory(alignment):
                    x = np.empty(10)
                del x
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(m is None for m in made)


def test_a_new_thread_starts_on_the_default_handler():
    seen = []
    with numpy_memory():
        t = threading.Thread(target=lambda: seen.append(is_mkl_array(np.empty(4))))
        t.start()
        t.join()
    import sys

    inherits = getattr(sys.flags, "thread_inherit_context", 0)
    assert seen == [bool(inherits)]


def test_asyncio_tasks_keep_their_own_handler():
    async def task(alignment, out):
        if alignment:
            with numpy_memory(alignment):
                for _ in range(5):
                    await asyncio.sleep(0)
                    out.append((get_handler_name(), address(np.empty(3)) % alignment))
        else:
            for _ in range(5):
                await asyncio.sleep(0)
                out.append((get_handler_name(), is_mkl_array(np.empty(3))))

    async def main():
        a, b, c = [], [], []
        await asyncio.gather(task(1 << 12, a), task(None, b), task(1 << 14, c))
        return a, b, c

    a, b, c = asyncio.run(main())
    assert a == [("mkl_alloc", 0)] * 5
    assert b == [("default_allocator", False)] * 5
    assert c == [("mkl_alloc", 0)] * 5


def test_is_mkl_array_follows_views_buffers_and_dlpack():
    m = MKLMemory(4096)
    assert is_mkl_array(np.frombuffer(m, dtype=np.float64))
    assert is_mkl_array(np.asarray(m))
    assert is_mkl_array(np.asarray(memoryview(m)).view(np.int32)[3:])
    assert is_mkl_array(np.from_dlpack(m))
    assert is_mkl_array(np.from_dlpack(m)[::2].reshape(-1, 2).T)
    with numpy_memory():
        a = np.arange(100.0)
    for v in (a, a[::3], a.reshape(10, 10).T, a.view(np.int64), np.frombuffer(a, np.uint8)):
        assert is_mkl_array(v)
    plain = np.arange(100.0)
    for v in (plain, plain[1:], np.frombuffer(bytearray(64)), np.frombuffer(b"abcd", np.uint8),
              np.from_dlpack(plain), np.empty(0)):
        assert not is_mkl_array(v)


def test_mem_stat_agrees_with_mkl_service_and_free_buffers_gives_back():
    mkl_alloc.free_buffers()
    gc.collect()
    before = mkl.mem_stat()
    assert isinstance(before, dict)
    with numpy_memory():
        a = np.ones(MiB)  # 8 MiB
        during = mkl.mem_stat()
        assert dict(mkl_alloc.mem_stat()._asdict()) == during
        grew = during["allocated_bytes"] - before["allocated_bytes"]
        # MKL counts the block, its alignment and its header: no 2 MiB of
        # padding for huge pages (the chunk beneath MKL is on a 2 MiB
        # boundary already).
        assert 8 * MiB <= grew <= 8 * MiB + 8192, grew
        smalls = [np.empty(n) for n in range(1, 100)]
    del a, smalls
    cached = mkl.mem_stat()
    assert cached["allocated_bytes"] > before["allocated_bytes"], "small blocks kept in bins"
    mkl_alloc.free_buffers()
    assert mkl.mem_stat() == before


def _vm_flags(addr):
    """The VmFlags of the mapping holding ``addr`` (/proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


needs_thp = pytest.mark.skipif(
    # Linux first: under wine, "/sys/..." is the Z: drive's, Linux's own.
    not sys.platform.startswith("linux")
    or not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
    reason="the kernel has no transparent huge pages (Linux's madvise and /proc smaps)",
)

# In a process of its own, with the crate's huge-page policy off
# (MKL_ALLOC_HUGE_PAGES=off), where NumPy's switch alone decides: "hg", the
# mapping is madvise(MADV_HUGEPAGE)d. 40 MiB: above glibc's largest mmap
# threshold (32 MiB), so a fresh mapping each time once the block cache has
# given back the previous one, never a reused, earlier-advised one.
_SWITCH_CHILD = inspect.getsource(_vm_flags) + """
import numpy as np
import mkl_alloc
from numpy._core.multiarray import _set_madvise_hugepage

for on in (False, True):
    _set_madvise_hugepage(on)
    with mkl_alloc.numpy_memory(4096):
        a = np.empty(40 * 2**20 // 8)
    advised = "hg" in _vm_flags(a.ctypes.data + 20 * 2**20)
    assert advised == on, f"NumPy's switch {on}, advised {advised}"
    del a
    mkl_alloc.free_buffers()
print("ok")
"""


@needs_thp
def test_large_arrays_follow_numpy_huge_page_switch_read_on_install():
    env = {**os.environ, "MKL_ALLOC_HUGE_PAGES": "off"}
    r = subprocess.run([sys.executable, "-c", _SWITCH_CHILD], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@needs_thp
def test_large_arrays_are_advised_under_the_crates_policy_whatever_numpys_switch():
    """The crate's own huge-page policy (on by default from 4 MiB) advises
    every large MKL block, the handler's too, with NumPy's switch off."""
    from numpy._core.multiarray import _get_madvise_hugepage, _set_madvise_hugepage

    threshold = huge_page_threshold()
    if threshold is None or threshold > 40 * MiB:
        pytest.skip(f"MKL_ALLOC_HUGE_PAGES={os.environ.get('MKL_ALLOC_HUGE_PAGES')!r}")
    was = _get_madvise_hugepage()
    try:
        _set_madvise_hugepage(False)
        mkl_alloc.free_buffers()
        with numpy_memory(4096):
            a = np.empty(40 * MiB // 8)
        assert "hg" in _vm_flags(address(a) + 20 * MiB)
        del a
    finally:
        _set_madvise_hugepage(was)
