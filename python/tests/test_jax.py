"""A DLPack consumer other than NumPy: JAX (CPU, from the `jax` extra).
`jax.numpy.from_dlpack(m)` shares the MKL block (same address) and holds
one export exactly as long as the JAX array lives."""

import gc

import numpy as np
import pytest

from conftest import LINUX, require
from mkl_alloc import MKLMemory

if not LINUX:
    pytest.skip("Linux only: the jax extra is tested on Linux", allow_module_level=True)
require("jax")
import jax.numpy as jnp  # noqa: E402


@pytest.mark.parametrize("alignment", [64, 4096])
def test_from_dlpack_shares_the_block_and_releases_the_export_when_the_array_dies(alignment):
    m = MKLMemory(8 * 1000, alignment=alignment)
    np.frombuffer(m, dtype=np.float64)[:] = np.arange(1000.0)
    x = jnp.from_dlpack(m)
    assert x.unsafe_buffer_pointer() == m._pointer  # no copy
    assert x.dtype == jnp.uint8 and x.shape == (8000,)
    assert m.exports == 1
    with pytest.raises(BufferError, match="1 export"):
        m.realloc(16 * 1000)
    # Same memory: a write through NumPy is seen by the JAX array.
    np.frombuffer(m, dtype=np.uint8)[8] = 42
    assert int(x[8]) == 42
    assert bytes(np.asarray(x)) == m.tobytes()
    del x
    gc.collect()
    assert m.exports == 0
    m.realloc(16 * 1000)
    assert m.tobytes()[8] == 42


def test_a_derived_jax_array_is_a_copy_and_holds_no_export():
    m = MKLMemory(bytes(range(256)))
    x = jnp.from_dlpack(m)
    y = x.astype(jnp.int32) * 2  # a new JAX buffer: the block is not needed
    del x
    gc.collect()
    assert m.exports == 0
    m.realloc(512)
    assert np.array_equal(np.asarray(y), np.arange(256) * 2)
