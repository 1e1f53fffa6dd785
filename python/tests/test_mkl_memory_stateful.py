"""A hypothesis state machine of MKLMemory against a bytearray model.

Random sequences of: exports of every kind (memoryview, np.frombuffer,
np.asarray, np.from_dlpack, DLPack capsules legacy and versioned), their
release in any order, writes through writable exports, realloc (it must
succeed exactly when no export lives and raise BufferError, changing
nothing, otherwise), tobytes, pickling (protocols 2 to 5) and copies. After
every step the contents, the size, the alignment of the block and the export
count must match the model, and every live export must read the model.
"""

import copy
import gc
import os
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conftest import numpy_at_least
from mkl_alloc import MKLMemory

SIZES = st.integers(min_value=1, max_value=4096)
ALIGNMENTS = st.sampled_from([1, 2, 8, 64, 128, 4096, 1 << 16])

# Exports Python code can write through, and those it cannot (capsules).
# NumPy before 2.1 imports a DLPack tensor read-only: there from_dlpack is
# an export of the second kind.
NUMPY_2_1 = numpy_at_least("2.1.0")
_DLPACK = ["from_dlpack"]
WRITABLE_KINDS = ["memoryview", "frombuffer", "asarray"] + (_DLPACK if NUMPY_2_1 else [])
CAPSULE_KINDS = ["capsule_legacy", "capsule_versioned"] + ([] if NUMPY_2_1 else _DLPACK)


def make_export(m, kind):
    if kind == "memoryview":
        return memoryview(m)
    if kind == "frombuffer":
        return np.frombuffer(m, dtype=np.uint8)
    if kind == "asarray":
        return np.asarray(m)
    if kind == "from_dlpack":
        return np.from_dlpack(m)
    if kind == "capsule_legacy":
        return m.__dlpack__()
    if kind == "capsule_versioned":
        return m.__dlpack__(max_version=(1, 0))
    raise AssertionError(kind)


def release(kind, export):
    """Drops the last reference (a memoryview is released explicitly first:
    the export must be counted down then, not at garbage collection)."""
    if kind == "memoryview":
        export.release()


class MKLMemoryMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.m = None
        self.model = bytearray()
        self.exports = []  # (kind, object)

    @initialize(
        source=st.one_of(SIZES, st.binary(min_size=1, max_size=4096)),
        alignment=ALIGNMENTS,
    )
    def create(self, source, alignment):
        self.m = MKLMemory(source, alignment=alignment)
        self.model = bytearray(source) if isinstance(source, bytes) else bytearray(source)
        self.alignment = alignment

    # --- exports ----------------------------------------------------------

    @rule(kind=st.sampled_from(WRITABLE_KINDS + CAPSULE_KINDS))
    def export(self, kind):
        self.exports.append((kind, make_export(self.m, kind)))

    @precondition(lambda self: self.exports)
    @rule(data=st.data())
    def release_one(self, data):
        i = data.draw(st.integers(0, len(self.exports) - 1), label="export")
        kind, export = self.exports.pop(i)
        release(kind, export)
        del export

    @precondition(lambda self: any(k in WRITABLE_KINDS for k, _ in self.exports))
    @rule(data=st.data(), value=st.integers(0, 255))
    def write_through_export(self, data, value):
        kind, export = self.draw_writable(data)
        index = data.draw(st.integers(0, len(self.model) - 1), label="index")
        export[index] = value
        self.model[index] = value

    @precondition(lambda self: any(k in WRITABLE_KINDS for k, _ in self.exports))
    @rule(data=st.data(), fill=st.binary(min_size=1, max_size=64))
    def write_slice_through_export(self, data, fill):
        kind, export = self.draw_writable(data)
        start = data.draw(st.integers(0, len(self.model) - 1), label="start")
        fill = fill[: len(self.model) - start]
        if kind == "memoryview":
            export[start : start + len(fill)] = fill
        else:
            export[start : start + len(fill)] = np.frombuffer(fill, dtype=np.uint8)
        self.model[start : start + len(fill)] = fill

    def draw_writable(self, data):
        # An index, not the object: hypothesis keeps no reference to an export.
        writable = [i for i, (k, _) in enumerate(self.exports) if k in WRITABLE_KINDS]
        i = data.draw(st.sampled_from(writable), label="export")
        return self.exports[i]

    # --- realloc ----------------------------------------------------------

    # Every realloc here passes refcheck=False: this machine checks the
    # export protocol, and what references the interpreter's frames hold
    # depends on its version (on CPython 3.10 a caller's argument stays on
    # its stack during the call: one reference more than on 3.11+, which
    # the reference rule refuses). test_seed_compat.py checks that rule.
    @rule(n=SIZES)
    def realloc(self, n):
        live = len(self.exports)
        before = (self.m._pointer, self.m.tobytes())
        if live:
            with pytest.raises(BufferError, match=rf"refused while {live} export\(s\)"):
                self.m.realloc(n, refcheck=False)
            assert (self.m._pointer, self.m.tobytes()) == before
        else:
            self.m.realloc(n, refcheck=False)
            old = len(self.model)
            self.model = self.model[:n] + bytearray(max(0, n - old))

    @rule()
    def realloc_to_zero_is_refused(self):
        with pytest.raises(ValueError):
            self.m.realloc(0, refcheck=False)

    # --- copies -----------------------------------------------------------

    @rule(protocol=st.integers(2, 5))
    def pickle_round_trip(self, protocol):
        self.check_copy(pickle.loads(pickle.dumps(self.m, protocol=protocol)))

    @rule(deep=st.booleans())
    def copy(self, deep):
        self.check_copy(copy.deepcopy(self.m) if deep else copy.copy(self.m))

    @precondition(lambda self: NUMPY_2_1)  # from_dlpack(copy=) is NumPy 2.1's
    @rule()
    def dlpack_copy(self):
        d = np.from_dlpack(self.m, copy=True)
        assert d.tobytes() == bytes(self.model)
        d[:] = 0  # a copy: the original is untouched (checked by the invariants)

    def check_copy(self, back):
        assert type(back) is MKLMemory
        assert back.tobytes() == bytes(self.model)
        assert back.alignment == self.alignment
        assert back._pointer % self.alignment == 0
        assert back._pointer != self.m._pointer
        assert back.exports == 0
        # Independent of the original: write all of it, then drop it.
        with memoryview(back) as view:
            view[:] = bytes(len(back))
        back.realloc(len(back) + 1, refcheck=False)

    # --- invariants -------------------------------------------------------

    @invariant()
    def matches_the_model(self):
        if self.m is None:
            return
        assert len(self.m) == self.m.nbytes == len(self.model)
        assert self.m.tobytes() == bytes(self.model)
        assert self.m.alignment == self.alignment
        assert self.m._pointer % self.alignment == 0
        assert self.m.exports == len(self.exports)
        for kind, export in self.exports:
            if kind in WRITABLE_KINDS:
                assert export.tobytes() == bytes(self.model), kind

    def teardown(self):
        while self.exports:
            release(*self.exports.pop())
        gc.collect()
        if self.m is not None:
            assert self.m.exports == 0
            self.m.realloc(1, refcheck=False)  # every export gave its count back


MKLMemoryMachine.TestCase.settings = settings(
    # 100; 25 at the small scale of CI's later runs of the suite (see
    # test_fork.py).
    max_examples=25 if os.environ.get("MKL_ALLOC_TEST_SCALE") == "small" else 100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_mkl_memory_state_machine = MKLMemoryMachine.TestCase
