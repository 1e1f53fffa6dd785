"""The type information shipped with the package: `py.typed` and stubs that
match the built extension (mypy's stubtest), and typed examples that pass
`mypy --strict` and run."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

import mkl_alloc
from conftest import numpy_at_least

if not numpy_at_least("2.0.0"):
    import numpy

    pytest.skip(
        f"mypy checks mkl_alloc against NumPy 2's stubs (numpy._core); NumPy {numpy.__version__} has none",
        allow_module_level=True,
    )

PYTHON_DIR = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = PYTHON_DIR / "examples"
# Only before 3.12: see the file.
ALLOWLIST = PYTHON_DIR / "stubtest-allowlist-before-3.12.txt"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One mypy cache for the module's runs (NumPy's stubs are read once)."""
    return str(tmp_path_factory.mktemp("mypy-cache"))


def run(args, cwd):
    # From an empty directory, so that mypy sees the installed package (not
    # python/mkl_alloc) and leaves its cache outside the checkout.
    r = subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    return r.returncode, r.stdout + r.stderr


def test_the_installed_package_ships_py_typed_and_the_extensions_stub():
    package = pathlib.Path(mkl_alloc.__file__).parent
    assert (package / "py.typed").is_file()
    assert (package / "_native.pyi").is_file()


def test_stubs_match_the_built_module(tmp_path):
    args = ["mypy.stubtest", "mkl_alloc"]
    if sys.version_info < (3, 12):
        args += ["--allowlist", str(ALLOWLIST)]
    if importlib.util.find_spec("distributed") is None:
        # mkl_alloc.dask is the `dask` extra's: without distributed its
        # import fails, on purpose, with an ImportError naming the extra.
        extra = tmp_path / "allowlist-without-distributed.txt"
        extra.write_text("mkl_alloc.dask\n")
        args += ["--allowlist", str(extra)]
    rc, out = run(args, tmp_path)
    assert rc == 0, out


# NumPy's stubs accept any buffer (PEP 688's Buffer, hence MKLMemory) in
# np.frombuffer only when checking for Python 3.12+; for 3.10 and 3.11 they
# list the built-in buffer types. The examples are checked for 3.12.
def test_examples_pass_mypy_strict(tmp_path, cache):
    examples = sorted(str(p) for p in EXAMPLES.glob("*.py"))
    assert len(examples) >= 2
    rc, out = run(
        ["mypy", "--strict", "--python-version", "3.12", "--cache-dir", cache,
         *examples],
        tmp_path,
    )
    assert rc == 0, out


def test_the_installed_package_passes_mypy_strict(tmp_path, cache):
    """Its Python part (MemStat, mem_stat, ...) against the extension's stub."""
    rc, out = run(["mypy", "--strict", "--cache-dir", cache, "-p", "mkl_alloc"],
                  tmp_path)
    assert rc == 0, out


def test_mypy_rejects_a_misuse_of_mklmemory(tmp_path, cache):
    """The stubs are what mypy reads: a wrong call is an error (not Any)."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from mkl_alloc import MKLMemory, peak_mem_usage\n"
        "m = MKLMemory(16, alignment=64)\n"
        "m.realloc('32')\n"
        "n: str = m.nbytes\n"
        "peak_mem_usage('peak')\n"
        "m.exports = 3\n"
        "MKLMemory(b'bytes', 64)\n"  # alignment is keyword-only
        "m.realloc(8, False)\n"  # so is refcheck
        "MKLMemory(1, 2, 3)\n"
    )
    rc, out = run(["mypy", "--strict", "--python-version", "3.12", "--cache-dir", cache,
                   str(bad)], tmp_path)
    assert rc == 1, out
    for line in (3, 4, 5, 6, 7, 8, 9):
        assert f"bad.py:{line}: error" in out, out


def test_each_constructor_form_passes_mypy_strict(tmp_path, cache):
    """mkl-service's three forms, the copy of any buffer, ``size`` and
    ``realloc(refcheck=)``, as the stubs' overloads type them (3.12: bytes
    and NumPy arrays as PEP 688 buffers)."""
    forms = tmp_path / "forms.py"
    forms.write_text(
        "import numpy as np\n"
        "from mkl_alloc import MKLMemory\n"
        "a: MKLMemory = MKLMemory(1024)\n"
        "b = MKLMemory(1024, alignment=4096)\n"
        "c = MKLMemory(32, 32)\n"
        "d = MKLMemory(np.int64(32), 32, alignment=128)\n"
        "e = MKLMemory(c)\n"
        "f = MKLMemory(c, alignment=256)\n"
        "g = MKLMemory(b'bytes', alignment=64)\n"
        "h = MKLMemory(np.arange(4))\n"
        "n: int = a.size + a.nbytes + b.alignment\n"
        "a.realloc(2048)\n"
        "a.realloc(4096, refcheck=False)\n"
        "class Sub(MKLMemory):\n"
        "    pass\n"
        "s: Sub = Sub(8, 8)\n"
        "t: Sub = Sub(s)\n"
    )
    rc, out = run(["mypy", "--strict", "--python-version", "3.12", "--cache-dir", cache,
                   str(forms)], tmp_path)
    assert rc == 0, out


def test_numpy_example_runs(tmp_path):
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "numpy_views.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused while exported" in r.stdout and "ok:" in r.stdout
