"""MKL memory as MPI buffers (mpi4py), typed:

    mpiexec -n 4 python python/examples/mpi_allreduce.py

Every rank sums NumPy arrays over MKLMemory blocks with Allreduce and
receives rank 0's MKLMemory with Bcast. mpi4py holds a buffer export only
for the duration of each call, so ``realloc`` works right after it (with
``refcheck=False``: the module holds the blocks, which CPython 3.14 and
later cannot tell from another holder; see python/README.md).
Checked by ``mypy --strict`` and run under ``mpiexec -n 4`` by
python/tests/test_mpi.py.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from mkl_alloc import MKLMemory

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n = 1 << 16  # float64s per rank

# Allreduce between NumPy arrays that live in MKL memory.
send_block = MKLMemory(8 * n, alignment=4096)
recv_block = MKLMemory(8 * n, alignment=4096)
send = np.frombuffer(send_block, dtype=np.float64)
recv = np.frombuffer(recv_block, dtype=np.float64)
send[:] = rank + 1.0
comm.Allreduce(send, recv, op=MPI.SUM)
assert (recv == size * (size + 1) / 2).all()
del send, recv  # the arrays were the blocks' only exports

# Bcast straight into an MKLMemory (mpi4py reads it as bytes, MPI.BYTE).
m = MKLMemory(b"rank 0 says hello" if rank == 0 else bytes(17))
comm.Bcast(m, root=0)
assert m.tobytes() == b"rank 0 says hello"
assert m.exports == 0  # no export outlives the call...
m.realloc(1 << 20, refcheck=False)  # ...so the block can grow right away

# A typed buffer spec: the block's bytes as float64s, reduced in place.
comm.Allreduce(MPI.IN_PLACE, [recv_block, MPI.DOUBLE], op=MPI.MAX)
recv_block.realloc(16 * n, refcheck=False)
if rank == 0:
    print(f"{size} ranks: Allreduce, Bcast and realloc on MKL memory: ok")
