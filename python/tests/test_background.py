"""The background decay thread: on after import, off with
MKL_ALLOC_BACKGROUND=off, controlled by background_start()/background_stop(),
restarted in a child made by os.fork(), and an idle process's cache given
back with it (and kept without it: the same idle, no allocation)."""

import os
import subprocess
import sys
import textwrap

import pytest

import mkl_alloc
from conftest import block_cache_on, linux_only


def child_env(**variables):
    """This environment without any MKL_ALLOC_* variable, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MKL_ALLOC_")}
    env.update(variables)
    return env


def run(code, **variables):
    """Runs `code` in a fresh interpreter; its stdout's last line."""
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(**variables),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1], r.stderr


RUNNING = "import mkl_alloc; print(mkl_alloc.background_running())"


SETTING = "import mkl_alloc; s = mkl_alloc._background_setting(); print(s['running'], '|', s['source'])"


def test_on_by_default_after_import():
    assert run(SETTING)[0] == "True | default (on in the Python package)"


def test_off_with_the_variable():
    out = run(SETTING, MKL_ALLOC_BACKGROUND="OFF")[0]
    assert out == "False | environment (MKL_ALLOC_BACKGROUND='OFF')"


def test_show_config_reports_it(capsys):
    mkl_alloc.show_config()
    on = "on" if mkl_alloc.background_running() else "off"
    assert f"  background decay   {on}  [" in capsys.readouterr().out


def test_a_bad_value_keeps_the_default_with_a_line_on_stderr():
    out, err = run(RUNNING, MKL_ALLOC_BACKGROUND="yes")
    assert out == "True"
    assert "MKL_ALLOC_BACKGROUND must be on or off" in err


def test_stop_and_start():
    was = mkl_alloc.background_running()
    try:
        mkl_alloc.background_stop()
        assert not mkl_alloc.background_running()
        mkl_alloc.background_stop()  # idempotent
        mkl_alloc.background_start()
        mkl_alloc.background_start()  # idempotent
        assert mkl_alloc.background_running()
        c = mkl_alloc.show_config(mode="dicts")["background"]
        assert c == {"running": True, "source": "set by the program", "variable": "MKL_ALLOC_BACKGROUND"}
    finally:
        (mkl_alloc.background_start if was else mkl_alloc.background_stop)()


IDLE = """
import time, mkl_alloc
mkl_alloc.configure(block_cache=256 << 20, decay_ms=3_600_000)
m = mkl_alloc.MKLMemory(16 << 20)
del m
assert mkl_alloc.mem_stat().cached_bytes >= 16 << 20, mkl_alloc.mem_stat()
mkl_alloc.configure(decay_ms=100)
deadline = time.monotonic() + {wait}
while mkl_alloc.mem_stat().cached_bytes and time.monotonic() < deadline:
    time.sleep(0.01)
print(mkl_alloc.mem_stat().cached_bytes)
"""


@linux_only("the block cache's chunks beneath MKL")
@pytest.mark.skipif(not block_cache_on(), reason="the block cache is off")
def test_an_idle_process_gives_its_cache_back():
    # Without further allocation: the loop only reads mem_stat() (MKL's
    # statistics) and sleeps.
    assert run(IDLE.format(wait=2.0))[0] == "0"
    # The same idle without the thread keeps it: what the thread adds.
    assert int(run(IDLE.format(wait=0.5), MKL_ALLOC_BACKGROUND="off")[0]) >= 16 << 20


@linux_only("os.fork")
def test_a_forked_child_starts_its_own():
    code = """
    import os, mkl_alloc
    assert mkl_alloc.background_running()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if mkl_alloc.background_running() else 1)
    _, status = os.waitpid(pid, 0)
    mkl_alloc.background_stop()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not mkl_alloc.background_running() else 1)
    _, stopped = os.waitpid(pid, 0)
    print(status, stopped)
    """
    assert run(code)[0] == "0 0"
