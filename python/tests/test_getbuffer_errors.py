"""``__getbuffer__`` follows CPython's contract on failure (issue 18):
``view->obj`` is NULL whenever it fails, and a NULL ``view`` is never
written through."""

import array
import ctypes
import subprocess
import sys
import textwrap

import pytest

from mkl_alloc import MKLMemory

PyBUF_READ = 0x100
PyBUF_WRITE = 0x200


class RawPyBuffer(ctypes.Structure):
    """Py_buffer with ``obj`` as a plain address, so a test can plant
    garbage in it and see what the exporter left there."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


# Own function objects (indexing makes a fresh one): the attribute form is
# shared with conftest.py, whose argtypes differ.
_get_buffer = ctypes.pythonapi["PyObject_GetBuffer"]
_get_buffer.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release = ctypes.pythonapi["PyBuffer_Release"]
_release.argtypes = [ctypes.c_void_p]
_release.restype = None


def _fill_info_rejects(flags):
    """Whether this CPython's PyBuffer_FillInfo refuses ``flags`` (3.12+
    refuses PyBUF_READ and PyBUF_WRITE); checked on a bytes object, whose
    getbuffer is PyBuffer_FillInfo."""
    view = RawPyBuffer()
    try:
        _get_buffer(b"x", ctypes.addressof(view), flags)
    except SystemError:
        return True
    _release(ctypes.addressof(view))
    return False


def _exporter_sees(flags):
    """Whether ``PyObject_GetBuffer`` hands ``flags`` to the exporter at
    all: CPython 3.13 refuses PyBUF_READ and PyBUF_WRITE itself, before any
    exporter runs, so MKLMemory's refusal cannot be reached there. Checked
    on an ``array.array``, whose getbuffer accepts any flags."""
    view = RawPyBuffer()
    try:
        _get_buffer(array.array("b", b"x"), ctypes.addressof(view), flags)
    except SystemError:
        return False
    _release(ctypes.addressof(view))
    return True


@pytest.mark.parametrize("flags", [PyBUF_READ, PyBUF_WRITE])
def test_a_refused_request_leaves_obj_null(flags):
    if not _fill_info_rejects(flags):
        pytest.skip(f"CPython {sys.version_info[:2]} accepts flags {flags:#x} (3.12+ refuses them)")
    m = MKLMemory(16)
    if not _exporter_sees(flags):
        # CPython 3.13 and later refuse these flags themselves, before any
        # exporter runs: the request fails the same way, MKLMemory never
        # sees it, and nothing is counted.
        view = RawPyBuffer()
        with pytest.raises(SystemError):
            _get_buffer(m, ctypes.addressof(view), flags)
        assert m.exports == 0
        m.realloc(32, refcheck=False)
        return
    view = RawPyBuffer()
    view.obj = 0xDEADBEEF
    with pytest.raises(SystemError):
        _get_buffer(m, ctypes.addressof(view), flags)
    assert view.obj is None, f"view->obj left at {view.obj:#x} after a failed getbuffer"
    assert m.exports == 0
    m.realloc(32, refcheck=False)


def test_a_null_view_is_refused_not_written():
    m = MKLMemory(16)
    with pytest.raises(BufferError, match="NULL"):
        _get_buffer(m, None, 0)
    assert m.exports == 0
    m.realloc(32)


def test_a_null_view_during_a_realloc_is_not_written():
    """The refusal while another thread reallocates used to write
    ``view->obj`` through the NULL view (a segfault): run in a child, racing
    reallocs against NULL-view requests until the refusal was seen."""
    script = textwrap.dedent(
        """
        import ctypes, threading, time
        from mkl_alloc import MKLMemory
        get = ctypes.pythonapi["PyObject_GetBuffer"]
        get.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
        m = MKLMemory(1 << 25)
        stop = False
        def churn():
            n = 1 << 25
            while not stop:
                n = (1 << 26) if n == (1 << 25) else (1 << 25)
                try:
                    # refcheck=False: m is shared with the main thread on
                    # purpose, whose GetBuffer call holds a reference to it
                    # at times (the reference check would refuse those).
                    m.realloc(n, refcheck=False)
                except BufferError:
                    pass
        t = threading.Thread(target=churn)
        t.start()
        busy, deadline = 0, time.monotonic() + 60
        while busy < 20 and time.monotonic() < deadline:
            try:
                get(m, None, 0)
            except BufferError as e:
                busy += "reallocating" in str(e)
        stop = True
        t.join()
        print(busy)
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"the child died ({run.returncode}): {run.stderr[-2000:]}"
    assert int(run.stdout) >= 20, "no request met a realloc in progress: the race was not exercised"
