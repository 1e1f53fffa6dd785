"""MKLMemory without NumPy: construction, attributes, buffer protocol,
realloc, pickling, copies, size and repr (issue 9's list, including the
reference design's review)."""

import copy
import pickle
import sys

import pytest
from conftest import (
    PyBUF_FULL_RO,
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    get_buffer,
    release_buffer,
)

import mkl_alloc
from mkl_alloc import MAX_ALIGNMENT, MKLMemory

HUGE = 2**62  # fits an int64, no MKL can provide it


# --- construction -----------------------------------------------------------


def test_int_source_gives_zeroed_bytes_of_that_size():
    m = MKLMemory(1000)
    assert m.nbytes == len(m) == 1000
    assert m.tobytes() == bytes(1000)
    assert m.alignment == 64
    assert m._pointer % 64 == 0
    assert m.exports == 0


@pytest.mark.parametrize("bad", [3, 5, 12, 24, 96, 100, 129, 1000, 2**29 + 1, 2**30 - 1])
def test_refused_alignments_are_value_errors_naming_the_value(bad):
    # Below 1 and above 2**30: mkl-service's messages, in test_seed_compat.py.
    with pytest.raises(ValueError, match=rf"alignment={bad}\): the alignment must be a power of two"):
        MKLMemory(16, alignment=bad)


def test_alignment_is_checked_before_anything_is_allocated():
    # A size MKL cannot give would be a MemoryError: the alignment comes first.
    with pytest.raises(ValueError, match="alignment=3"):
        MKLMemory(HUGE, alignment=3)


@pytest.mark.parametrize("exp", range(21))
def test_every_power_of_two_up_to_2_pow_20_is_honoured(exp):
    a = 2**exp
    blocks = [MKLMemory(1024, alignment=a) for _ in range(8)]
    assert all(b._pointer % a == 0 for b in blocks)
    assert all(b.alignment == a for b in blocks)
    # Kept across reallocations, growing and shrinking.
    for _ in range(2):
        m = blocks.pop()  # out of the list: realloc refuses an object a list holds
        m.realloc(1 << 16)
        assert m._pointer % a == 0
        m.realloc(100)
        assert m._pointer % a == 0


def test_the_largest_alignment_is_honoured():
    m = MKLMemory(64, alignment=MAX_ALIGNMENT)
    assert MAX_ALIGNMENT == 2**30
    assert m._pointer % 2**30 == 0


def test_alignment_must_be_an_int():
    with pytest.raises(TypeError, match="alignment must be an int, not str"):
        MKLMemory(16, alignment="64")


@pytest.mark.parametrize("alignment", [2**31, 2**40, 2**64])
def test_alignments_past_2_30_are_refused_whatever_the_size(alignment):
    # Also for the smallest block and the zeroed form: nothing is allocated,
    # and the message says what was asked and the rule it breaks.
    before = mkl_alloc.mem_stat()
    for make in (lambda: MKLMemory(1, alignment=alignment), lambda: MKLMemory(1, 1, alignment=alignment),
                 lambda: MKLMemory(b"x", alignment=alignment)):
        with pytest.raises(ValueError, match=rf"MKLMemory\(alignment={alignment}\): the alignment must not exceed 2\*\*30"):
            make()
    with pytest.raises(ValueError, match=rf"numpy_handler\(alignment={alignment}\): .*must not exceed 2\*\*30"):
        mkl_alloc.numpy_handler(alignment)
    assert mkl_alloc.mem_stat() == before


@pytest.mark.parametrize("value", ["no", None, 1.0, [True]])
def test_realloc_refcheck_of_the_wrong_type_is_a_type_error_naming_the_call(value):
    m = MKLMemory(16)
    # None too: the default is True, by omission, and None is not False.
    with pytest.raises(TypeError) as e:
        m.realloc(32, refcheck=value)
    assert str(e.value) == (
        f"MKLMemory.realloc(refcheck={value!r}): refcheck must be True or False, "
        f"not {type(value).__name__}"
    )
    assert len(m) == 16
    m.realloc(32, refcheck=False)
    assert len(m) == 32


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"max_version": "1.0"}, "MKLMemory.__dlpack__(max_version='1.0'): max_version must be a (major, minor) tuple or None, not str"),
        ({"dl_device": 1}, "MKLMemory.__dlpack__(dl_device=1): dl_device must be a (device_type, device_id) tuple or None, not int"),
        ({"copy": "yes"}, "MKLMemory.__dlpack__(copy='yes'): copy must be True, False or None, not str"),
    ],
)
def test_dlpack_arguments_of_the_wrong_type_are_type_errors_naming_the_call(kwargs, expected):
    m = MKLMemory(16)
    with pytest.raises(TypeError) as e:
        m.__dlpack__(**kwargs)
    assert str(e.value) == expected
    assert m.exports == 0


@pytest.mark.parametrize("n", [0, -1, -(2**70)])
def test_sizes_below_one_are_value_errors(n):
    with pytest.raises(ValueError, match=f"at least 1 byte, got {n}"):
        MKLMemory(n)


@pytest.mark.parametrize("n", [HUGE, 2**63 - 1, 2**63, 2**200])
def test_sizes_mkl_cannot_give_are_memory_errors(n):
    with pytest.raises(MemoryError, match=str(n)):
        MKLMemory(n)


@pytest.mark.parametrize("src", [1.5, "abc", None, [1, 2]])
def test_non_int_non_buffer_sources_are_type_errors(src):
    with pytest.raises(TypeError, match=f"an MKLMemory or another object exporting a buffer .*, not {type(src).__name__}"):
        MKLMemory(src)


def test_empty_buffer_source_is_a_value_error():
    with pytest.raises(ValueError, match="0 bytes"):
        MKLMemory(b"")


def test_buffer_sources_are_copied(pattern):
    for src in (pattern, bytearray(pattern), memoryview(pattern), MKLMemory(pattern)):
        m = MKLMemory(src, alignment=256)
        assert m.tobytes() == pattern
        assert m._pointer % 256 == 0


def test_non_contiguous_source_is_copied_in_c_order(pattern):
    src = memoryview(pattern)[::3]
    assert not src.c_contiguous
    assert MKLMemory(src).tobytes() == src.tobytes()
    cast = memoryview(pattern).cast("B", (16, 16))[::2]
    assert MKLMemory(cast).tobytes() == cast.tobytes()


def test_source_export_is_released_after_the_copy(pattern):
    src = bytearray(pattern)
    MKLMemory(src)
    src.extend(b"x")  # a bytearray refuses this while exported
    src = MKLMemory(pattern)
    MKLMemory(src)
    assert src.exports == 0


def test_copy_construction_gives_a_distinct_block_with_equal_bytes(pattern):
    m1 = MKLMemory(pattern, alignment=128)
    m2 = MKLMemory(m1)
    assert m2.tobytes() == m1.tobytes()
    assert m2._pointer != m1._pointer
    assert m2.nbytes == m1.nbytes
    assert m1.exports == 0


# --- attributes ------------------------------------------------------------


def test_attributes_are_read_only():
    m = MKLMemory(8)
    for name in ("nbytes", "alignment", "_pointer", "exports"):
        with pytest.raises(AttributeError):
            setattr(m, name, 1)


def test_repr_shows_nbytes_alignment_and_exports():
    m = MKLMemory(10, alignment=512)
    with memoryview(m):
        assert repr(m) == "MKLMemory(nbytes=10, alignment=512, exports=1)"

    class Sub(MKLMemory):
        pass

    assert repr(Sub(3)) == "test_repr_shows_nbytes_alignment_and_exports.<locals>.Sub(nbytes=3, alignment=64, exports=0)"


def test_sizeof_counts_the_object_and_the_block():
    m = MKLMemory(100_000)
    assert m.__sizeof__() > 100_000
    assert sys.getsizeof(m) > m.__sizeof__() - 1
    assert object.__sizeof__(m) < m.__sizeof__() - 100_000 + 1
    small = m.__sizeof__()
    m.realloc(200_000)
    assert m.__sizeof__() == small + 100_000


def test_docstrings_everywhere():
    import mkl_alloc

    for obj in (
        MKLMemory,
        MKLMemory.realloc,
        MKLMemory.tobytes,
        MKLMemory.__dlpack__,
        MKLMemory.__dlpack_device__,
        MKLMemory.__reduce_ex__,
        MKLMemory.__copy__,
        MKLMemory.__deepcopy__,
        MKLMemory.__sizeof__,
        MKLMemory.nbytes,
        MKLMemory.size,
        MKLMemory.alignment,
        MKLMemory._pointer,
        MKLMemory.exports,
        mkl_alloc,
        mkl_alloc.mem_stat,
        mkl_alloc.peak_mem_usage,
        mkl_alloc.free_buffers,
    ):
        assert obj.__doc__ and len(obj.__doc__) > 20, obj


# --- buffer protocol --------------------------------------------------------


def test_memoryview_is_1d_unsigned_bytes_writable():
    m = MKLMemory(64)
    with memoryview(m) as mv:
        assert (mv.format, mv.itemsize, mv.ndim, mv.shape) == ("B", 1, 1, (64,))
        assert mv.strides == (1,) and mv.c_contiguous
        assert not mv.readonly
        assert m.exports == 1
        mv[3] = 200
        mv[10:12] = b"hi"
    assert m.exports == 0
    data = m.tobytes()
    assert data[3] == 200 and data[10:12] == b"hi"


def test_writable_and_read_only_requests_are_both_served():
    m = MKLMemory(b"abc")
    for flags in (PyBUF_SIMPLE, PyBUF_WRITABLE, PyBUF_FULL_RO, PyBUF_FULL_RO | PyBUF_WRITABLE):
        view = get_buffer(m, flags)
        assert view.len == 3 and view.buf == m._pointer
        assert m.exports == 1
        release_buffer(view)
        assert m.exports == 0
    with memoryview(m).toreadonly() as ro:
        with pytest.raises(TypeError):
            ro[0] = 1
        assert bytes(ro) == b"abc"
    assert bytes(m) == b"abc"
    assert m.exports == 0


def test_exports_are_counted_across_slices_and_released_once():
    m = MKLMemory(100)
    mv = memoryview(m)
    a, b = mv[10:20], mv[::2]
    assert m.exports == 1  # slices share the one export
    mv2 = memoryview(m)
    assert m.exports == 2
    del mv, a
    assert m.exports == 2
    b.release()
    assert m.exports == 1
    mv2.release()
    assert m.exports == 0


def test_buffer_keeps_the_object_alive():
    mv = memoryview(MKLMemory(b"kept"))
    assert bytes(mv) == b"kept"
    assert mv.obj.exports == 1


# --- realloc ---------------------------------------------------------------


def test_realloc_grows_keeping_contents_and_zero_filling(pattern):
    m = MKLMemory(pattern, alignment=4096)
    m.realloc(10_000)
    assert m.nbytes == 10_000
    data = m.tobytes()
    assert data[:256] == pattern and data[256:] == bytes(10_000 - 256)
    assert m._pointer % 4096 == 0


def test_realloc_shrinks_keeping_the_prefix(pattern):
    m = MKLMemory(pattern)
    m.realloc(10)
    assert m.tobytes() == pattern[:10]
    m.realloc(20)
    assert m.tobytes() == pattern[:10] + bytes(10)


def test_realloc_new_bytes_are_zero_even_after_shrink_and_regrow():
    m = MKLMemory(b"\xff" * 4096)
    m.realloc(1)
    m.realloc(4096)
    assert m.tobytes() == b"\xff" + bytes(4095)


@pytest.mark.parametrize(
    "export",
    [memoryview, lambda m: m.__dlpack__(), lambda m: m.__dlpack__(max_version=(1, 0))],
    ids=["memoryview", "dlpack", "dlpack_versioned"],
)
def test_exports_block_realloc_until_released(export):
    m = MKLMemory(b"data")
    e = export(m)
    with pytest.raises(BufferError, match=r"realloc\(8\).*1 export"):
        m.realloc(8)
    e2 = export(m)
    with pytest.raises(BufferError, match="2 export"):
        m.realloc(8)
    del e, e2
    assert m.exports == 0
    m.realloc(8)
    assert m.tobytes() == b"data" + bytes(4)


def test_realloc_zero_is_a_value_error_even_while_exported():
    m = MKLMemory(16)
    with memoryview(m):
        with pytest.raises(ValueError, match=r"realloc\(new_nbytes\).*at least 1 byte, got 0"):
            m.realloc(0)
        with pytest.raises(ValueError):
            m.realloc(-3)
        with pytest.raises(TypeError, match="must be an int, not float"):
            m.realloc(3.0)


@pytest.mark.parametrize("n", [HUGE, 2**63 - 1, 2**64])
def test_failed_huge_realloc_leaves_everything_unchanged(pattern, n):
    m = MKLMemory(pattern, alignment=1024)
    before = (m._pointer, m.nbytes, m.alignment, m.tobytes())
    with pytest.raises(MemoryError, match=str(n)):
        m.realloc(n)
    assert (m._pointer, m.nbytes, m.alignment, m.tobytes()) == before
    assert m.exports == 0
    m.realloc(300)  # still usable
    assert m.tobytes()[:256] == pattern


def test_refused_realloc_leaves_everything_unchanged(pattern):
    m = MKLMemory(pattern)
    before = (m._pointer, m.nbytes, m.alignment, m.tobytes())
    with memoryview(m):
        with pytest.raises(BufferError):
            m.realloc(1 << 20)
    assert (m._pointer, m.nbytes, m.alignment, m.tobytes()) == before


# --- pickling and copies ------------------------------------------------------


class Tagged(MKLMemory):
    """A subclass with instance state."""


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickle_round_trip_keeps_type_alignment_contents(pattern, protocol):
    m = MKLMemory(pattern, alignment=2048)
    r = pickle.loads(pickle.dumps(m, protocol=protocol))
    assert type(r) is MKLMemory
    assert (r.tobytes(), r.alignment, r.nbytes) == (pattern, 2048, 256)
    assert r._pointer % 2048 == 0 and r._pointer != m._pointer
    assert m.exports == 0 and r.exports == 0


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickle_keeps_subclass_and_its_dict(pattern, protocol):
    s = Tagged(pattern, alignment=128)
    s.label = "x"
    s.items = [1, 2]
    r = pickle.loads(pickle.dumps(s, protocol=protocol))
    assert type(r) is Tagged
    assert r.__dict__ == {"label": "x", "items": [1, 2]}
    assert (r.tobytes(), r.alignment) == (pattern, 128)


def test_pickle_protocol_5_out_of_band(pattern):
    m = MKLMemory(pattern * 64)
    buffers = []
    data = pickle.dumps(m, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1
    assert len(data) < 200  # the contents went out of band
    assert m.exports == 1  # the PickleBuffer holds an export
    with pytest.raises(BufferError):
        m.realloc(1)
    r = pickle.loads(data, buffers=buffers)
    assert r.tobytes() == pattern * 64 and r._pointer != m._pointer
    buffers[0].release()
    assert m.exports == 0


class NeedsArgs(MKLMemory):
    """A subclass whose constructor takes a required keyword-only argument."""

    def __new__(cls, source, *, alignment=64, extra):
        return super().__new__(cls, source, alignment=alignment)

    def __init__(self, source, *, alignment=64, extra):
        self.extra = extra


def test_pickle_rebuilds_without_calling_subclass_init(pattern):
    s = NeedsArgs(pattern, extra=5)
    for protocol in (2, 5):
        r = pickle.loads(pickle.dumps(s, protocol=protocol))
        assert type(r) is NeedsArgs and r.extra == 5 and r.tobytes() == pattern


def test_rebuild_refuses_unrelated_types():
    import mkl_alloc

    with pytest.raises(TypeError, match="not MKLMemory or a subclass"):
        mkl_alloc._rebuild(bytearray, b"x", 64)


@pytest.mark.parametrize("make_copy", [copy.copy, copy.deepcopy])
def test_copies_are_distinct_blocks_with_equal_contents(pattern, make_copy):
    s = Tagged(pattern, alignment=512)
    s.items = [1, [2]]
    c = make_copy(s)
    assert type(c) is Tagged
    assert c.tobytes() == s.tobytes() and c.alignment == 512
    assert c._pointer != s._pointer and c._pointer % 512 == 0
    assert c.items == s.items
    assert (c.items is s.items) == (make_copy is copy.copy)
    with memoryview(c) as mv:
        mv[0] ^= 0xFF
    assert s.tobytes() == pattern
    assert s.exports == 0


def test_deepcopy_memo_keeps_shared_references():
    m = MKLMemory(b"shared")
    a, b = copy.deepcopy([m, m])
    assert a is b and a is not m
