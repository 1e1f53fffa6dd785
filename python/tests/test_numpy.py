"""MKLMemory with NumPy: zero-copy buffer and DLPack exports, writes
visible both ways, the DLPack structures themselves."""

import ctypes
import gc

import numpy as np
import pytest

from conftest import numpy_at_least
from mkl_alloc import MKLMemory

needs_numpy_2_1 = pytest.mark.skipif(
    not numpy_at_least("2.1.0"),
    reason=f"NumPy {np.__version__}: np.from_dlpack's writable arrays and copy= are NumPy 2.1's",
)


def test_frombuffer_shares_the_block_and_writes_go_both_ways():
    m = MKLMemory(8 * 100, alignment=4096)
    a = np.frombuffer(m, dtype=np.float64)
    assert a.ctypes.data == m._pointer
    assert a.flags.writeable and a.shape == (100,)
    a[:] = np.arange(100)
    assert np.frombuffer(m.tobytes(), np.float64).tolist() == list(range(100))
    with memoryview(m) as mv:
        mv[0:8] = np.float64(-1.0).tobytes()
    assert a[0] == -1.0
    assert m.exports == 1
    del a
    assert m.exports == 0


def test_asarray_is_zero_copy():
    m = MKLMemory(b"\x01\x02\x03")
    a = np.asarray(m)
    assert a.dtype == np.uint8 and a.tolist() == [1, 2, 3]
    assert a.ctypes.data == m._pointer
    a[1] = 9
    assert m.tobytes() == b"\x01\x09\x03"


def test_ndarray_blocks_realloc_until_deleted():
    m = MKLMemory(64)
    a = np.frombuffer(m, np.int32).reshape(4, 4)
    view_of_view = a[1:, ::2]
    del a
    with pytest.raises(BufferError, match="1 export"):
        m.realloc(128)
    del view_of_view
    m.realloc(128)
    assert m.nbytes == 128


@needs_numpy_2_1
def test_from_dlpack_is_zero_copy_and_counted():
    m = MKLMemory(np.arange(16, dtype=np.uint8), alignment=256)
    d = np.from_dlpack(m)
    assert d.dtype == np.uint8 and d.shape == (16,)
    assert d.ctypes.data == m._pointer
    assert m.exports == 1
    d[0] = 200
    assert m.tobytes()[0] == 200
    with pytest.raises(BufferError):
        m.realloc(1)
    del d
    gc.collect()
    assert m.exports == 0
    m.realloc(1)


def test_from_dlpack_of_a_legacy_capsule():
    m = MKLMemory(b"legacy")

    class LegacyOnly:
        """Hands NumPy the capsule MKLMemory makes when no version is asked."""

        def __dlpack__(self, **kwargs):
            return m.__dlpack__()

        def __dlpack_device__(self):
            return m.__dlpack_device__()

    d = np.from_dlpack(LegacyOnly())
    assert bytes(d) == b"legacy" and d.ctypes.data == m._pointer
    assert m.exports == 1
    del d
    assert m.exports == 0


def test_dlpack_device_is_cpu():
    assert MKLMemory(1).__dlpack_device__() == (1, 0)


# --- the DLPack structures, read through ctypes -------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.argtypes = [ctypes.py_object]
_get_name.restype = ctypes.c_char_p
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_pointer.restype = ctypes.c_void_p
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name.restype = ctypes.c_int

DELETER_LEGACY = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DELETER_VERSIONED = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))


def check_tensor(t, m):
    assert t.data == m._pointer and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (1, 0)
    assert t.ndim == 1
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (1, 8, 1)  # kDLUInt
    assert t.shape[0] == m.nbytes
    assert not t.strides or t.strides[0] == 1


@pytest.mark.parametrize("kwargs", [{}, {"max_version": (0, 8)}, {"stream": None}])
def test_legacy_capsule_structure(kwargs):
    m = MKLMemory(333, alignment=128)
    cap = m.__dlpack__(**kwargs)
    assert _get_name(cap) == b"dltensor"
    t = DLManagedTensor.from_address(_get_pointer(cap, b"dltensor"))
    check_tensor(t.dl_tensor, m)
    assert t.deleter
    assert m.exports == 1
    del cap, t  # never consumed: the capsule's destructor releases the export
    assert m.exports == 0


@pytest.mark.parametrize("version", [(1, 0), (1, 5), (2, 0)])
def test_versioned_capsule_structure(version):
    m = MKLMemory(77)
    cap = m.__dlpack__(max_version=version, dl_device=(1, 0), copy=False)
    assert _get_name(cap) == b"dltensor_versioned"
    t = DLManagedTensorVersioned.from_address(_get_pointer(cap, b"dltensor_versioned"))
    assert (t.version.major, t.version.minor) == (1, 0)
    assert t.flags == 0  # writable, not a copy
    check_tensor(t.dl_tensor, m)
    del cap, t
    assert m.exports == 0


@pytest.mark.parametrize("versioned", [False, True])
def test_consumed_capsule_is_released_by_the_deleter_not_the_capsule(versioned):
    m = MKLMemory(10)
    if versioned:
        cap = m.__dlpack__(max_version=(1, 0))
        name, struct, deleter_type = b"dltensor_versioned", DLManagedTensorVersioned, DELETER_VERSIONED
    else:
        cap = m.__dlpack__()
        name, struct, deleter_type = b"dltensor", DLManagedTensor, DELETER_LEGACY
    address = _get_pointer(cap, name)
    # Consume it as a DLPack consumer does: rename, then own the tensor.
    assert _set_name(cap, b"used_" + name) == 0
    del cap
    assert m.exports == 1, "a consumed capsule must not free the tensor"
    t = struct.from_address(address)
    deleter_type(t.deleter)(ctypes.cast(address, ctypes.POINTER(struct)))
    assert m.exports == 0


@needs_numpy_2_1
def test_dlpack_copy_true_exports_a_copy():
    m = MKLMemory(b"copy me")
    cap = m.__dlpack__(max_version=(1, 0), copy=True)
    t = DLManagedTensorVersioned.from_address(_get_pointer(cap, b"dltensor_versioned"))
    assert t.flags & 2  # DLPACK_FLAG_BITMASK_IS_COPIED
    assert t.dl_tensor.data != m._pointer
    assert ctypes.string_at(t.dl_tensor.data, 7) == b"copy me"
    assert m.exports == 0  # the copy is not an export of m
    m.realloc(100)
    del cap, t
    d = np.from_dlpack(m, copy=True)
    assert d.ctypes.data != m._pointer and m.exports == 0


def test_dlpack_refuses_other_devices_and_streams():
    m = MKLMemory(4)
    with pytest.raises(BufferError, match=r"dl_device=\(2, 0\)"):
        m.__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="stream must be None"):
        m.__dlpack__(stream=1)
    assert m.exports == 0


def test_dlpack_capsule_outlives_the_object():
    m = MKLMemory(b"survivor")
    pointer = m._pointer
    d = np.from_dlpack(m)
    del m
    gc.collect()
    assert bytes(d) == b"survivor" and d.ctypes.data == pointer


def test_copied_tensors_deleted_on_threads_without_the_interpreter_free_their_blocks():
    # A copy=True tensor holds the only reference to its block, so its
    # deleter frees MKL memory: here called as a consumer's runtime threads
    # would, through ctypes (which detaches from the interpreter for the
    # call), four threads at once. The deleter passes the fork gate (issue
    # 29); this checks that every block is freed and nothing waits there.
    import threading

    import mkl_alloc

    gc.collect()
    mkl_alloc.free_buffers()
    baseline = mkl_alloc.mem_stat()
    m = MKLMemory(b"copied" * 1000)
    tensors = []
    for _ in range(4 * 50):
        cap = m.__dlpack__(max_version=(1, 0), copy=True)
        address = _get_pointer(cap, b"dltensor_versioned")
        assert _set_name(cap, b"used_dltensor_versioned") == 0  # consumed
        tensors.append(address)
    del cap
    assert m.exports == 0  # copies: no export of m

    def delete(addresses):
        for address in addresses:
            t = DLManagedTensorVersioned.from_address(address)
            DELETER_VERSIONED(t.deleter)(ctypes.cast(address, ctypes.POINTER(DLManagedTensorVersioned)))

    threads = [threading.Thread(target=delete, args=(tensors[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a deleter hung"
    del m
    gc.collect()
    mkl_alloc.free_buffers()
    assert mkl_alloc.mem_stat() == baseline
