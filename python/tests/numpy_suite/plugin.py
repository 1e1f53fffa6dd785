"""pytest plugin: run NumPy's own test suite with every array on MKL memory.

Loaded with ``-p plugin`` (this directory on ``PYTHONPATH``; see
``scripts/numpy-suite.sh``). It installs ``mkl_alloc.numpy_handler()`` for
the whole session before any test module is imported, and at the end checks
that the handler is still the one in force and still serving arrays: a
test that swapped it out (or a handler that stopped working) fails the run.

``MKL_ALLOC_SUITE_HANDLER=off`` loads the plugin without installing the
handler: the baseline run the script compares with.
"""

import os

import pytest

_ACTIVE = os.environ.get("MKL_ALLOC_SUITE_HANDLER", "on") != "off"
_ALIGNMENT = int(os.environ.get("MKL_ALLOC_SUITE_ALIGNMENT", "64"))
_previous = None


def _handler_name():
    from numpy._core.multiarray import get_handler_name

    return get_handler_name()


def pytest_configure(config):
    global _previous
    if not _ACTIVE:
        return
    import mkl_alloc

    _previous = mkl_alloc.set_numpy_handler(mkl_alloc.numpy_handler(_ALIGNMENT))
    assert _handler_name() == "mkl_alloc"


def pytest_report_header(config):
    if _ACTIVE:
        return f"mkl_alloc: NumPy arrays on MKL memory (numpy_handler({_ALIGNMENT}))"
    return "mkl_alloc: NumPy's default handler (baseline run)"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if not _ACTIVE:
        return
    import numpy as np

    import mkl_alloc

    problems = []
    if _handler_name() != "mkl_alloc":
        problems.append(f"the handler in force at the end is {_handler_name()!r}")
    a = np.empty(1000)
    if not mkl_alloc.is_mkl_array(a) or a.ctypes.data % _ALIGNMENT:
        problems.append("a new array is not on aligned MKL memory")
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.ensure_newline()
    if problems:
        if tr is not None:
            tr.write_line("mkl_alloc handler check FAILED: " + "; ".join(problems), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif tr is not None:
        tr.write_line("mkl_alloc handler check: still in force at the end of the session")
    mkl_alloc.set_numpy_handler(_previous)
