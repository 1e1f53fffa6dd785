"""What an MKLMemory really holds (issue 18): a shrinking ``realloc`` gives
MKL's memory back, and ``__sizeof__`` matches what ``mem_stat()`` counts."""

import gc

import pytest

import mkl_alloc
from mkl_alloc import MKLMemory


def _bytes():
    gc.collect()
    mkl_alloc.free_buffers()
    return mkl_alloc.mem_stat().allocated_bytes


@pytest.mark.parametrize("alignment", [64, 4096])
def test_shrinking_realloc_gives_memory_back(alignment):
    block = 1 << 26  # 64 MiB
    m = MKLMemory(block, alignment=alignment)
    m_view = memoryview(m)
    m_view[:] = b"\x5a" * block
    m_view.release()
    held = _bytes()
    m.realloc(1 << 10)
    back = held - _bytes()
    assert back >= block * 3 // 4, (
        f"MKLMemory({block}).realloc(1024) gave back {back} bytes of MKL's count; "
        f"at least {block * 3 // 4} expected"
    )
    assert bytes(m) == b"\x5a" * (1 << 10)
    assert m._pointer % alignment == 0


def test_sizeof_matches_mem_stat():
    """__sizeof__ minus the object is the block as MKL counts it plus a fixed
    handle (the Arc header and SharedMklVec, a multiple of 64 bytes), for any
    size and alignment: MKL's alignment padding and header included."""
    handles = set()
    for alignment in [1, 64, 128, 4096, 1 << 16, 1 << 20]:
        for n in [1, 100, 4096, 100_000, 1 << 20]:
            before = _bytes()
            m = MKLMemory(n, alignment=alignment)
            counted = _bytes() - before
            handles.add(m.__sizeof__() - object.__sizeof__(m) - counted)
            del m
    assert len(handles) == 1, f"__sizeof__ is off MKL's count by varying amounts: {handles}"
    (handle,) = handles
    assert handle >= 128 and handle % 64 == 0, handle


def test_sizeof_follows_an_in_place_shrink():
    """A small shrink stays in place, and MKL keeps counting the old size:
    so does __sizeof__."""
    m = MKLMemory(10_000)
    base = m.__sizeof__() - _bytes()
    m.realloc(100)
    assert m.__sizeof__() - _bytes() == base
    m.realloc(1 << 20)  # moves: counted afresh
    assert m.__sizeof__() - _bytes() == base
