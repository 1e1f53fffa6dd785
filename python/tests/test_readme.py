"""Every Python example of README.md, python/README.md and docs/*.md runs as
a user runs it: pasted into a script of its own and run at its top level,
in a fresh interpreter (on CPython 3.14 and later a module's own reference
to an object is what realloc's reference check cannot tell from another
holder's, so an example that works only inside a function or under exec
would be caught here). The MPI examples run on 4 ranks: test_mpi.py."""

import pathlib
import re
import subprocess
import sys

import pytest
from conftest import no_wheel_here

PYTHON_DIR = pathlib.Path(__file__).resolve().parent.parent
REPO = PYTHON_DIR.parent


def documents():
    """The documents with examples: the package's README always; the
    repository's README and docs/ where this is a checkout (an sdist holds
    only the package)."""
    docs = [PYTHON_DIR / "README.md", REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return [d for d in docs if d.exists()]


def examples():
    for doc in documents():
        blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
        for i, block in enumerate(blocks):
            if "mpi4py" not in block:
                name = doc.relative_to(REPO if doc.is_relative_to(REPO) else PYTHON_DIR)
                yield pytest.param(block, id=f"{name}-{i}")


def test_the_readmes_have_examples():
    # The package's README has at least its first example: a parse that
    # finds none would make every test below vanish.
    assert any("README.md" in p.id for p in examples())


@pytest.mark.parametrize("code", list(examples()))
def test_example_runs_as_a_script(code, tmp_path):
    if re.search(r"^import mkl\b(?!_)", code, re.M) and no_wheel_here("mkl"):
        pytest.skip(no_wheel_here("mkl"))
    script = tmp_path / "example.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{code}\n{r.stdout}\n{r.stderr}"
