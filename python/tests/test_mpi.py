"""MKL memory as MPI buffers, across 4 processes: mpi4py under the `mpiexec`
of the environment (the `mpich` wheel's, from the `test` extra). Each rank
program runs with `python -m mpi4py`, which aborts every rank on an uncaught
exception, so a failed assertion on any rank fails the run."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import LINUX, require

if not LINUX:
    pytest.skip("Linux only: the `mpich` wheel of the test extra, and its mpiexec, are Linux's",
                allow_module_level=True)
require("mpi4py")

PYTHON_DIR = pathlib.Path(__file__).resolve().parent.parent
RANKS = 4

# Every collective and point-to-point call on MKL memory, and the rule that
# matters: an export lives exactly as long as mpi4py needs the buffer (the
# call, or a nonblocking request until it completes), never longer, so
# realloc works right after and is refused while a request is pending.
# The blocks are held by the rank program's module alone, which CPython 3.14
# and later cannot tell from another holder (realloc's reference check then
# refuses, "may be referenced ... false positive", as NumPy's resize does):
# every realloc passes refcheck=False, which skips only that check; the
# export check, what this program is about, still runs.
RANK_PROGRAM = r"""
import numpy as np
from mpi4py import MPI

import mkl_alloc
from mkl_alloc import MKLMemory

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 4, size
triangle = size * (size + 1) / 2

# Allreduce between plain NumPy arrays (the reference: NumPy's own memory).
a = np.arange(1000.0) * (rank + 1)
out = np.empty_like(a)
comm.Allreduce(a, out, op=MPI.SUM)
assert np.array_equal(out, np.arange(1000.0) * triangle)

# Allreduce in place in NumPy arrays over MKLMemory blocks (small and
# page-aligned); each array is its block's one export, released with it.
for alignment in (64, 4096):
    block = MKLMemory(8 * 1000, alignment=alignment)
    x = np.frombuffer(block, dtype=np.float64)
    x[:] = np.arange(1000.0) * (rank + 1)
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    assert np.array_equal(x, np.arange(1000.0) * triangle)
    assert block.exports == 1
    del x
    assert block.exports == 0
    block.realloc(16 * 1000, refcheck=False)
    assert block.tobytes()[: 8 * 1000] == (np.arange(1000.0) * triangle).tobytes()
    assert block._pointer % alignment == 0

# Allreduce into arrays NumPy allocates itself under numpy_memory() (the
# NEP 49 handler).
before = mkl_alloc.mem_stat()
with mkl_alloc.numpy_memory():
    s = np.full(1 << 16, rank + 1.0)
    r = np.empty_like(s)
assert mkl_alloc.is_mkl_array(s) and mkl_alloc.is_mkl_array(r)
assert mkl_alloc.mem_stat().allocated_buffers >= before.allocated_buffers + 2
comm.Allreduce(s, r, op=MPI.SUM)
assert (r == triangle).all()
del s, r
print(f"rank {rank}: numpy_memory Allreduce ok")

# Bcast into an MKLMemory: rank 0's bytes everywhere, no export left, and
# the block grows right after, keeping them.
pattern = bytes((i * 37 + 11) % 251 for i in range(4096))
m = MKLMemory(pattern if rank == 0 else 4096, alignment=256)
comm.Bcast(m, root=0)
assert m.exports == 0
assert m.tobytes() == pattern
m.realloc(1 << 22, refcheck=False)
assert m.tobytes()[:4096] == pattern and m._pointer % 256 == 0

# Point to point, both buffers MKLMemory: a ring.
src = MKLMemory(bytes([rank]) * 1000)
dst = MKLMemory(1000)
comm.Sendrecv(src, dest=(rank + 1) % size, recvbuf=dst, source=(rank - 1) % size)
assert dst.tobytes() == bytes([(rank - 1) % size]) * 1000
assert src.exports == dst.exports == 0
dst.realloc(2000, refcheck=False)

# Nonblocking: the request holds the export until it completes, so realloc
# is refused while MPI may still write the block.
n = MKLMemory(pattern if rank == 0 else 4096)
request = comm.Ibcast(n, root=0)
assert n.exports == 1
try:
    n.realloc(8192, refcheck=False)
except BufferError:
    pass
else:
    raise AssertionError("realloc allowed while an Ibcast request is pending")
request.Wait()
assert n.exports == 0 and n.tobytes() == pattern
n.realloc(8192, refcheck=False)

print(f"rank {rank}: ok")
"""


def mpiexec(script, tmp_path):
    """Runs `script` on RANKS processes; returns its output."""
    launcher = pathlib.Path(sys.prefix) / "bin" / "mpiexec"
    if not launcher.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no {launcher}: the `mpich` wheel is not installed")
        pytest.skip(f"no {launcher} (install the `mpich` wheel)")
    r = subprocess.run(
        [str(launcher), "-n", str(RANKS), sys.executable, "-m", "mpi4py", str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_mkl_memory_in_collectives_point_to_point_and_nonblocking_calls(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANK_PROGRAM)
    out = mpiexec(script, tmp_path)
    assert sorted(re.findall(r"rank (\d): ok", out)) == ["0", "1", "2", "3"], out
    assert len(re.findall(r"numpy_memory Allreduce ok", out)) == RANKS, out


def test_mpi_example_runs_on_4_ranks(tmp_path):
    out = mpiexec(PYTHON_DIR / "examples" / "mpi_allreduce.py", tmp_path)
    assert "4 ranks: Allreduce, Bcast and realloc on MKL memory: ok" in out, out


def docs_mpi_blocks():
    """The MPI example of docs/python.md (python/README.md links it), where
    this is a checkout (an sdist holds only the package)."""
    doc = PYTHON_DIR.parent / "docs" / "python.md"
    text = doc.read_text() if doc.exists() else ""
    return [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "mpi4py" in b]


@pytest.mark.skipif(not (PYTHON_DIR.parent / "docs" / "python.md").exists(),
                    reason="docs/ is the repository's, not in an sdist")
def test_docs_mpi_example_runs_on_4_ranks(tmp_path):
    (block,) = docs_mpi_blocks()
    script = tmp_path / "readme_mpi.py"
    script.write_text(block)
    mpiexec(script, tmp_path)
