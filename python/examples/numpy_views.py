"""MKLMemory with NumPy, typed: views that share the block, a realloc refused
while they live, DLPack, pickling and MKL's own statistics.

    python python/examples/numpy_views.py

Checked by ``mypy --strict`` and run by python/tests/test_typing.py.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import numpy.typing as npt

import mkl_alloc
from mkl_alloc import MAX_ALIGNMENT, MemStat, MKLMemory


def as_float64(m: MKLMemory) -> npt.NDArray[np.float64]:
    """The block as float64s: a view, no copy (it counts as an export)."""
    return np.frombuffer(m, dtype=np.float64)


def main() -> None:
    before: MemStat = mkl_alloc.mem_stat()

    m = MKLMemory(8 * 1000, alignment=4096)  # 1000 float64 zeros, 4 KiB-aligned
    assert len(m) == m.nbytes == 8000 and m.alignment == 4096 <= MAX_ALIGNMENT
    assert m._pointer % 4096 == 0

    a = as_float64(m)
    a[:] = np.arange(1000.0)
    assert a.ctypes.data == m._pointer and m.exports == 1
    try:
        m.realloc(16 * 1000)
    except BufferError as e:
        print("refused while exported:", e)
    else:
        raise AssertionError("realloc allowed while a NumPy view is alive")
    del a
    # refcheck=False: `m` is this function's alone, but CPython 3.14 and
    # later cannot always tell a local from another holder (NumPy's
    # ndarray.resize refuses the same); the export check above still runs.
    m.realloc(16 * 1000, refcheck=False)  # contents kept, new bytes zero, still aligned
    assert m._pointer % 4096 == 0

    # The buffer protocol directly, and DLPack.
    with memoryview(m) as view:
        assert view.nbytes == 16 * 1000 and not view.readonly
    d = np.from_dlpack(m)
    assert d.ctypes.data == m._pointer and d.dtype == np.uint8
    del d

    # Copies are new blocks with the same contents and alignment.
    clone: MKLMemory = pickle.loads(pickle.dumps(m, protocol=5))
    shallow = copy.copy(m)
    for c in (clone, shallow):
        assert c.tobytes() == m.tobytes() and c.alignment == 4096
        assert c._pointer != m._pointer
    assert as_float64(clone)[:1000].sum() == 999 * 1000 / 2

    during = mkl_alloc.mem_stat()
    assert during.allocated_buffers >= before.allocated_buffers + 3
    assert during["allocated_bytes"] >= before["allocated_bytes"] + 3 * 16 * 1000
    del m, clone, shallow, c
    after = mkl_alloc.mem_stat()
    assert after == before, (before, after)

    # Arrays NumPy allocates itself, on MKL memory (NEP 49 handler).
    with mkl_alloc.numpy_memory(alignment=4096):
        z: npt.NDArray[np.float64] = np.zeros(1 << 16)
    assert mkl_alloc.is_mkl_array(z) and z.ctypes.data % 4096 == 0
    del z

    if mkl_alloc.peak_mem_usage("enable") is not None:
        big = MKLMemory(1 << 20)
        peak = mkl_alloc.peak_mem_usage("peak_mem")
        assert peak is not None and peak >= 1 << 20
        del big
        mkl_alloc.peak_mem_usage("disable")
    mkl_alloc.free_buffers()
    print("ok:", mkl_alloc.mem_stat())


if __name__ == "__main__":
    main()
