"""`python -m mkl_alloc` and `mkl_alloc.show_config()` (issue 44): the report
of versions, MKL's layers, the backing, the settings in force with their
sources and the figures, in text and JSON; and the warning about unknown
`MKL_ALLOC_*` variables. Each case runs in a fresh interpreter, whose
environment the crate reads once, at import."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import mkl_alloc

REPO = pathlib.Path(__file__).resolve().parents[2]


def child_env(**variables):
    """This environment without any MKL_ALLOC_* variable, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MKL_ALLOC_")}
    env.update(variables)
    return env


def run(args, **variables):
    """Runs the interpreter with `args` in a clean environment; the result."""
    r = subprocess.run(
        [sys.executable, *args],
        env=child_env(**variables),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def report(**variables):
    """`python -m mkl_alloc --json`, parsed."""
    return json.loads(run(["-m", "mkl_alloc", "--json"], **variables).stdout)


def test_json_report_holds_every_part_with_the_defaults():
    c = report()
    assert c["mkl_alloc"]["version"] == mkl_alloc.__version__
    assert c["mkl"]["version"].startswith("Intel(R) oneAPI Math Kernel Library Version")
    if sys.platform == "win32":
        # Windows' MKL_Set_Interface_Layer(-1) answers -1 until a layer is
        # chosen: the report says "not reported" (None) rather than guess.
        assert c["mkl"]["interface_layer"] in ("LP64", None)
    else:
        assert c["mkl"]["interface_layer"] == "LP64"
    assert c["mkl"]["threading_layer"] in ("intel", "sequential", "gnu", "tbb", "pgi")
    assert c["mkl"]["max_threads"] >= 1
    if sys.platform == "linux":
        assert c["backing"]["state"] == "active"
        assert re.search(r"libmkl_rt\.so", c["mkl"]["library"])
        # The pinned MKL's memory-manager locks are recognised (issue 41).
        assert c["mkl"]["fork_holds_locks"] is True
    else:
        assert c["mkl"]["fork_holds_locks"] is False
    assert c["backing"]["value"] == "on" and c["backing"]["source"] == "default"
    assert c["backing"]["why"]
    budget = c["block_cache"]["budget"]
    assert budget["source"] == "default"
    assert budget["value"] == budget["default"] >= 1 << 20
    decay = c["block_cache"]["decay_ms"]
    assert decay["value"] == decay["default"] == 1000 and decay["source"] == "default"
    threshold = c["huge_pages"]["threshold"]
    assert threshold == {
        "value": 4 << 20,
        "default": 4 << 20,
        "source": "default",
        "variable": "MKL_ALLOC_HUGE_PAGES",
    }
    assert c["environment"] == {"read_at_import": {}, "unknown": []}


def test_json_report_names_the_variables_that_set_each_value():
    c = report(
        MKL_ALLOC_BLOCK_CACHE=str(256 << 20),
        MKL_ALLOC_HUGE_PAGES="off",
        MKL_ALLOC_BACKING="on",
    )
    budget = c["block_cache"]["budget"]
    assert budget["value"] == 256 << 20
    assert budget["source"] == f"environment (MKL_ALLOC_BLOCK_CACHE='{256 << 20}')"
    threshold = c["huge_pages"]["threshold"]
    assert threshold["value"] is None
    assert threshold["source"] == "environment (MKL_ALLOC_HUGE_PAGES='off')"
    assert c["backing"]["source"] == "environment (MKL_ALLOC_BACKING='on')"
    assert c["environment"]["read_at_import"] == {
        "MKL_ALLOC_BACKING": "on",
        "MKL_ALLOC_BLOCK_CACHE": str(256 << 20),
        "MKL_ALLOC_HUGE_PAGES": "off",
    }


def test_json_report_says_when_a_value_was_not_understood():
    c = report(MKL_ALLOC_BLOCK_CACHE="lots", MKL_ALLOC_HUGE_PAGES="0")
    budget = c["block_cache"]["budget"]
    # The crate keeps its default (and says so on stderr); so does the report.
    assert budget["value"] == budget["default"]
    assert budget["source"].startswith("default (MKL_ALLOC_BLOCK_CACHE='lots' is not off, on")
    assert c["huge_pages"]["threshold"]["value"] is None


@pytest.mark.skipif(sys.platform == "win32", reason="no chunks on Windows: the backing is off")
def test_json_report_of_the_backing_switched_off():
    c = report(MKL_ALLOC_BACKING="off")
    assert c["backing"]["state"] == "off"
    assert c["backing"]["value"] == "off"
    assert "MKL_ALLOC_BACKING=off" in c["backing"]["why"]


def test_json_report_shows_the_medium_blocks_setting_and_its_source():
    c = report()["medium_blocks"]
    assert c["variable"] == "MKL_ALLOC_MEDIUM" and c["source"] == "default"
    assert (c["fallbacks"], c["fallback_bytes"]) == (0, 0)
    if sys.platform == "linux":
        assert c["value"] == "on" and c["why"] == ""
    else:
        assert c["value"] == "off" and "Linux" in c["why"]
    off = report(MKL_ALLOC_MEDIUM="off")["medium_blocks"]
    assert off["value"] == "off"
    assert off["source"] == "environment (MKL_ALLOC_MEDIUM='off')"
    bad = report(MKL_ALLOC_MEDIUM="sometimes")["medium_blocks"]
    assert bad["source"].startswith("default (MKL_ALLOC_MEDIUM='sometimes' is not on or off")


# In the child: blocks held and freed, then the report beside mem_stat() and
# backing() read right after it (nothing allocates in between).
FIGURES = """
import json, mkl_alloc
held = [mkl_alloc.MKLMemory(3 << 20), mkl_alloc.MKLMemory(5000)]
freed = mkl_alloc.MKLMemory(2 << 20)
del freed
c = mkl_alloc.show_config(mode="dicts")
s = mkl_alloc.mem_stat()
print(json.dumps({"report": c, "mem_stat": [*s, s.cached_bytes, s.cached_buffers, s.slack_bytes,
                                              s.medium_dirty_bytes, s.medium_clean_bytes],
                  "backing": mkl_alloc.backing()}))
"""


def test_report_figures_are_mem_stat_and_backing():
    out = json.loads(run(["-c", FIGURES]).stdout)
    figures = out["report"]["mem_stat"]
    assert [
        figures["allocated_bytes"],
        figures["allocated_buffers"],
        figures["cached_bytes"],
        figures["cached_buffers"],
        figures["slack_bytes"],
        figures["medium_dirty_bytes"],
        figures["medium_clean_bytes"],
    ] == out["mem_stat"]
    assert figures["allocated_buffers"] >= 2
    assert figures["allocated_bytes"] >= (3 << 20) + 5000
    if out["backing"] == "active":
        assert figures["cached_buffers"] == 1 and figures["cached_bytes"] >= 2 << 20
    assert out["report"]["backing"]["state"] == out["backing"]


def test_text_report_is_one_screen_with_values_and_sources():
    out = run(["-m", "mkl_alloc"], MKL_ALLOC_BLOCK_CACHE=str(64 << 20)).stdout
    lines = out.splitlines()
    assert len(lines) <= 40
    assert lines[0].startswith(f"mkl_alloc {mkl_alloc.__version__} (Python ")
    assert "Intel(R) oneAPI Math Kernel Library Version" in out
    assert re.search(r"^  medium blocks      (on  \[default\]|off  \[default\]: .+)$", out, re.M)
    assert re.search(r"^  medium fallbacks   0$", out, re.M)
    assert re.search(r"^  block cache budget 67,108,864 bytes \(64\.0 MiB\)  "
                     r"\[environment \(MKL_ALLOC_BLOCK_CACHE='67108864'\)\]$", out, re.M)
    assert re.search(r"^  huge pages from    4,194,304 bytes \(4\.0 MiB\)  \[default\]$", out, re.M)
    assert re.search(r"^  state              (active|off|mkl-ran-first): \S", out, re.M)
    assert re.search(r"^  allocated \(live\)   [\d,]+ bytes", out, re.M)


def test_show_config_prints_the_text_report_and_refuses_unknown_modes(capsys):
    assert mkl_alloc.show_config() is None
    out = capsys.readouterr().out
    assert "Settings in force" in out and "Figures (mem_stat())" in out
    with pytest.raises(ValueError, match=r"show_config\(mode='yaml'\): mode must be"):
        mkl_alloc.show_config(mode="yaml")  # type: ignore[call-overload]


def test_module_help_and_unknown_options():
    r = run(["-m", "mkl_alloc", "--help"])
    assert "--json" in r.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "mkl_alloc", "--jsn"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "unrecognized arguments: --jsn" in bad.stderr


# --- Unknown MKL_ALLOC_* variables -------------------------------------------

IMPORT = "import warnings; warnings.simplefilter('default'); import mkl_alloc"


def test_a_misspelt_variable_is_warned_about_once_at_import():
    # The report, made after the import, names it again, without warning.
    code = IMPORT + "; print(mkl_alloc.show_config(mode='dicts')['environment']['unknown'])"
    r = run(["-c", code], MKL_ALLOC_BLOK_CACHE="off")
    assert r.stdout.strip() == "['MKL_ALLOC_BLOK_CACHE']"
    warnings_seen = [line for line in r.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warnings_seen) == 1, r.stderr
    w = warnings_seen[0]
    assert "MKL_ALLOC_BLOK_CACHE is not one mkl-alloc reads" in w
    assert "did you mean MKL_ALLOC_BLOCK_CACHE?" in w
    for known in ("MKL_ALLOC_BACKING", "MKL_ALLOC_BLOCK_CACHE", "MKL_ALLOC_HUGE_PAGES"):
        assert known in w
    # Pointed at the importing line, not at the package.
    assert w.startswith("<string>:1: RuntimeWarning")


def test_known_variables_are_not_warned_about():
    r = run(
        ["-W", "error::RuntimeWarning", "-c", "import mkl_alloc"],
        MKL_ALLOC_BLOCK_CACHE="on",
        MKL_ALLOC_HUGE_PAGES="on",
        MKL_ALLOC_BACKING="on",
        MKL_ALLOC_CACHE="/tmp/nowhere",
        MKL_ALLOC_TEST_SCALE="small",
    )
    assert "RuntimeWarning" not in r.stderr


def test_every_documented_variable_is_known():
    # docs/tuning.md's table of environment variables is the list of names:
    # a name added there and not here would be warned about.
    table = (REPO / "docs" / "tuning.md").read_text(encoding="utf-8")
    section = table.split("## Environment variables", 1)[1]
    documented = set(re.findall(r"`(MKL_ALLOC_[A-Z0-9_]+)", section))
    assert {"MKL_ALLOC_BACKING", "MKL_ALLOC_BLOCK_CACHE", "MKL_ALLOC_HUGE_PAGES"} <= documented
    known = set(mkl_alloc._RUNTIME_ENV) | set(mkl_alloc._OTHER_ENV)
    assert documented <= known, documented - known


def test_every_variable_the_scripts_and_python_sources_use_is_known():
    # What a Python process may find in its environment: the names the
    # package, its tests and the scripts (.ci/, scripts/) set or read. This
    # file's misspellings are the exception.
    here = pathlib.Path(__file__).resolve()
    sources = [
        *(REPO / "python").rglob("*.py"),
        *(REPO / "scripts").rglob("*"),
        *(REPO / ".ci").rglob("*"),
    ]
    used = set()
    for f in sources:
        if f.is_file() and f != here and "target" not in f.parts:
            used |= set(re.findall(r"\bMKL_ALLOC_[A-Z][A-Z0-9_]*", f.read_text(errors="replace")))
    assert "MKL_ALLOC_BLOCK_CACHE" in used
    known = set(mkl_alloc._RUNTIME_ENV) | set(mkl_alloc._OTHER_ENV)
    assert used <= known, used - known
