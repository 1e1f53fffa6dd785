"""mkl_alloc.configure() and mkl_alloc.settings() (issue 44): the block
cache's budget and decay and the huge-page threshold, set at run time with
the environment variables' rules; each takes effect, a bad value is refused
with a message naming the call and why and changes nothing, and
show_config() then reports the setting "set by the program".

The settings are process-wide: every test here puts back what it found
(the `restore` fixture); the source checks run in fresh interpreters."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mkl_alloc
from conftest import MiB

ACTIVE = mkl_alloc.backing() == "active"
needs_backing = pytest.mark.skipif(
    not ACTIVE, reason="the block cache and huge pages act only where MKL is on the crate's chunks"
)
DEFAULT_BUDGET = mkl_alloc._settings()["block_cache_default_budget"]
DEFAULT_THRESHOLD = 4 * MiB


@pytest.fixture(autouse=True)
def restore():
    """Each test leaves the settings as it found them."""
    previous = mkl_alloc.configure()
    yield
    mkl_alloc.configure(**previous._asdict())


def freed_array_cached_bytes():
    """Frees an 8 MiB NumPy array made under the MKL handler; cached_bytes after."""
    mkl_alloc.free_buffers()  # an empty cache to start from
    with mkl_alloc.numpy_memory():
        a = np.ones(MiB, dtype=np.float64)  # 8 MiB
    assert mkl_alloc.is_mkl_array(a)
    del a
    return mkl_alloc.mem_stat().cached_bytes


def test_configure_without_keywords_reads_and_changes_nothing():
    before = mkl_alloc.settings()
    assert mkl_alloc.configure() == before == mkl_alloc.settings()
    assert before._fields == ("block_cache", "huge_pages", "decay_ms")


@needs_backing
def test_budget_off_keeps_no_freed_array_and_256_mib_keeps_it():
    mkl_alloc.configure(block_cache="off")
    assert mkl_alloc.settings().block_cache is None
    assert freed_array_cached_bytes() == 0
    mkl_alloc.configure(block_cache=256 * MiB)
    assert mkl_alloc.settings().block_cache == 256 * MiB
    assert freed_array_cached_bytes() >= 8 * MiB
    mkl_alloc.configure(block_cache=0)  # 0 is off, as MKL_ALLOC_BLOCK_CACHE=0
    assert mkl_alloc.settings().block_cache is None
    mkl_alloc.configure(block_cache="256M")  # a unit, as MKL_ALLOC_BLOCK_CACHE=256M
    assert mkl_alloc.settings().block_cache == 256 * MiB
    mkl_alloc.configure(block_cache="1GiB")
    assert mkl_alloc.settings().block_cache == 1024 * MiB
    mkl_alloc.configure(block_cache="off")
    assert mkl_alloc.mem_stat().cached_bytes == 0  # turning it off unmaps what it held
    assert freed_array_cached_bytes() == 0


@needs_backing
def test_budget_smaller_than_the_block_keeps_nothing():
    mkl_alloc.configure(block_cache=2 * MiB)
    assert freed_array_cached_bytes() == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("off", None),
        ("OFF", None),
        (False, None),
        (None, None),
        (0, None),
        ("0", None),
        ("on", DEFAULT_BUDGET),
        ("On", DEFAULT_BUDGET),
        ("", DEFAULT_BUDGET),
        (True, DEFAULT_BUDGET),
        (str(64 * MiB), 64 * MiB),
        (np.int64(32 * MiB), 32 * MiB),
    ],
)
def test_block_cache_takes_the_environment_forms(value, expected):
    mkl_alloc.configure(block_cache=value)
    assert mkl_alloc.settings().block_cache == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("off", None), (False, None), (0, None), ("on", DEFAULT_THRESHOLD), (True, DEFAULT_THRESHOLD),
     (64 * MiB, 64 * MiB), (str(2 * MiB), 2 * MiB)],
)
def test_huge_page_threshold_reads_back(value, expected):
    mkl_alloc.configure(huge_pages=value)
    assert mkl_alloc.settings().huge_pages == expected
    threshold = mkl_alloc.show_config(mode="dicts")["huge_pages"]["threshold"]
    assert threshold["value"] == expected
    assert threshold["source"] == "set by the program"


@needs_backing
@pytest.mark.skipif(
    mkl_alloc._settings()["huge_pages_kernel"] not in ("always", "madvise"),
    reason="the kernel has no transparent huge pages to advise",
)
def test_huge_page_threshold_decides_which_chunks_are_advised():
    def advised_by_a_fresh_16_mib_array():
        before = mkl_alloc.show_config(mode="dicts")["huge_pages"]["advised_bytes"]
        a = mkl_alloc.MKLMemory(16 * MiB)  # a fresh chunk: the cache is off
        after = mkl_alloc.show_config(mode="dicts")["huge_pages"]["advised_bytes"]
        del a
        return after - before

    mkl_alloc.configure(block_cache="off", huge_pages=64 * MiB)
    assert advised_by_a_fresh_16_mib_array() == 0
    mkl_alloc.configure(huge_pages="off")
    assert advised_by_a_fresh_16_mib_array() == 0
    mkl_alloc.configure(huge_pages=4 * MiB)
    assert advised_by_a_fresh_16_mib_array() >= 14 * MiB


def test_decay_reads_back():
    mkl_alloc.configure(decay_ms=10_000)
    assert mkl_alloc.settings().decay_ms == 10_000
    decay = mkl_alloc.show_config(mode="dicts")["block_cache"]["decay_ms"]
    assert decay["value"] == 10_000 and decay["source"] == "set by the program"


@needs_backing
def test_decay_takes_effect():
    # The decay at the allocator's own calls: without the background
    # thread, which would unmap a block cached under decay_ms=0 at any time.
    was = mkl_alloc.background_running()
    mkl_alloc.background_stop()
    try:
        # A large free checks the decay (`other`, made first: a large
        # allocation after the array would be served from its cached chunk,
        # cut down, since caching never raises the peak).
        mkl_alloc.configure(block_cache=256 * MiB, decay_ms=60_000)
        other = mkl_alloc.MKLMemory(2 * MiB)
        assert freed_array_cached_bytes() >= 8 * MiB
        del other
        assert mkl_alloc.mem_stat().cached_bytes >= 8 * MiB  # a minute not yet passed
        mkl_alloc.configure(decay_ms=0)
        other = mkl_alloc.MKLMemory(2 * MiB)
        assert freed_array_cached_bytes() >= 8 * MiB
        del other
        # Unused 0 ms or more: the array's chunk unmapped (`other`'s may
        # just have been cached).
        assert mkl_alloc.mem_stat().cached_bytes < 8 * MiB
    finally:
        if was:
            mkl_alloc.background_start()


@pytest.mark.parametrize(
    ("keywords", "error", "why"),
    [
        ({"block_cache": -1}, ValueError, "a byte count cannot be negative"),
        ({"block_cache": -(2**70)}, ValueError, "a byte count cannot be negative"),
        ({"block_cache": "-5"}, ValueError, "a byte count cannot be negative"),
        ({"block_cache": "lots"}, ValueError, "not off, on or a byte count"),
        ({"block_cache": "256MB"}, ValueError, "not off, on or a byte count"),
        ({"block_cache": "1.5G"}, ValueError, "not off, on or a byte count"),
        ({"block_cache": " on"}, ValueError, "not off, on or a byte count"),
        ({"block_cache": 2**64}, ValueError, "at most 18446744073709551615"),
        ({"block_cache": "99999999999999999999999"}, ValueError, "at most 18446744073709551615"),
        ({"block_cache": 1.5}, TypeError, "must be an int"),
        ({"block_cache": [1]}, TypeError, "must be an int"),
        ({"huge_pages": -4096}, ValueError, "a byte count cannot be negative"),
        ({"huge_pages": "yes"}, ValueError, "not off, on or a byte count"),
        ({"huge_pages": 4.0}, TypeError, "must be an int"),
        ({"decay_ms": -1}, ValueError, "the decay time (milliseconds) cannot be negative"),
        ({"decay_ms": 2**64}, ValueError, "at most 18446744073709551615"),
        ({"decay_ms": "1000"}, TypeError, "the decay time must be an int"),
        ({"decay_ms": True}, TypeError, "the decay time must be an int"),
        ({"decay_ms": None}, TypeError, "must be an int"),
        ({"decay_ms": 0.5}, TypeError, "must be an int"),
    ],
)
def test_bad_values_are_refused_naming_the_call_and_change_nothing(keywords, error, why):
    (name, value), = keywords.items()
    mkl_alloc.configure(block_cache=128 * MiB, huge_pages=8 * MiB, decay_ms=1234)
    before = mkl_alloc.settings()
    with pytest.raises(error) as e:
        # A good value beside the bad one is not set either.
        mkl_alloc.configure(**{"block_cache": 64 * MiB, "huge_pages": 16 * MiB, "decay_ms": 99, **keywords})
    message = str(e.value)
    assert message.startswith(f"mkl_alloc.configure({name}={value!r}) refused: ")
    assert why in message
    assert message.endswith("nothing was changed")
    assert mkl_alloc.settings() == before


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="budget"):
        mkl_alloc.configure(budget=1)  # type: ignore[call-arg]


def test_configure_returns_the_previous_settings_to_restore():
    start = mkl_alloc.settings()
    previous = mkl_alloc.configure(block_cache=96 * MiB, huge_pages="off", decay_ms=4321)
    assert previous == start
    assert mkl_alloc.settings() == (96 * MiB, None, 4321)
    assert mkl_alloc.configure(**previous._asdict()) == (96 * MiB, None, 4321)
    assert mkl_alloc.settings() == start


# In a fresh interpreter: the sources before and after configure(), even
# where configure() sets the value the environment or the default gave.
SOURCES = """
import json, mkl_alloc
def sources():
    c = mkl_alloc.show_config(mode="dicts")
    return [c["block_cache"]["budget"]["source"], c["block_cache"]["decay_ms"]["source"],
            c["huge_pages"]["threshold"]["source"]]
before = sources()
s = mkl_alloc.settings()
mkl_alloc.configure(block_cache=s.block_cache, huge_pages=s.huge_pages, decay_ms=s.decay_ms)
after = sources()
try:
    mkl_alloc.configure(block_cache="lots")
except ValueError:
    pass
print(json.dumps({"before": before, "after": after, "unchanged": mkl_alloc.settings() == s,
                  "text": mkl_alloc._text(mkl_alloc._config())}))
"""


def run_sources(**variables):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MKL_ALLOC_")}
    env.update(variables)
    r = subprocess.run([sys.executable, "-c", SOURCES], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_source_becomes_the_program_after_configure_even_for_the_same_value():
    out = run_sources()
    assert out["before"] == ["default", "default", "default"]
    assert out["after"] == ["set by the program"] * 3
    assert out["unchanged"]
    assert "block cache budget" in out["text"]
    assert out["text"].count("[set by the program]") == 3


def test_a_size_with_a_unit_in_the_environment_is_understood():
    # The crate takes 64M as 64 MiB, and the report says so (the value in
    # force equals what the variable says: its source is the environment).
    out = run_sources(MKL_ALLOC_BLOCK_CACHE="64M", MKL_ALLOC_HUGE_PAGES="8MiB")
    assert out["before"] == [
        "environment (MKL_ALLOC_BLOCK_CACHE='64M')",
        "default",
        "environment (MKL_ALLOC_HUGE_PAGES='8MiB')",
    ]


def test_source_from_the_environment_then_the_program():
    out = run_sources(MKL_ALLOC_BLOCK_CACHE=str(64 * MiB), MKL_ALLOC_HUGE_PAGES="off")
    assert out["before"] == [
        f"environment (MKL_ALLOC_BLOCK_CACHE='{64 * MiB}')",
        "default",
        "environment (MKL_ALLOC_HUGE_PAGES='off')",
    ]
    assert out["after"] == ["set by the program"] * 3
