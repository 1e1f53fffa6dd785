"""The Python examples of python/README.md and README-section.md run."""

import pathlib
import re

import pytest

HERE = pathlib.Path(__file__).resolve().parent.parent
DOCS = [HERE / "README.md", HERE / "README-section.md"]


def examples():
    for doc in DOCS:
        if doc.exists():
            for i, block in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)):
                # MPI examples run on 4 ranks under mpiexec: test_mpi.py.
                if "mpi4py" not in block:
                    yield pytest.param(block, id=f"{doc.name}-{i}")


@pytest.mark.parametrize("code", list(examples()))
def test_example_runs(code):
    exec(compile(code, "<readme>", "exec"), {})
