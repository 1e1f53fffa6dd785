#!/usr/bin/env python3
"""Writes the seeds of fuzz/fuzz_targets/medium_ops.rs into medium_ops/.

Each seed is a sequence of the target's `Op`s as `arbitrary` 1.x decodes
them from the rest of the input: a byte whose low bit says "one more
element", then each enum's variant as a little-endian u32 (variant i of n
is the u32 x with x * n >> 32 == i), then its fields in order (u8, u16,
u32 little-endian; bool: a byte's low bit). Keep the tables below in the
target's order of variants and fields.
"""
import os
import struct

OP = ["Alloc", "Free", "Resize", "Point", "CrossFree"]
SIZE = ["Edge", "Class", "Medium", "Small", "Like"]
API = ["Mkl", "Hook"]
ALIGN = ["A8", "A64", "A4096"]
POINT = ["Decay0", "Decay1", "DecayDefault", "FreeBuffers", "BudgetOff",
         "BudgetZero", "BudgetSmall", "BudgetDefault"]


def variant(table, name):
    i, n = table.index(name), len(table)
    x = ((2 * i + 1) << 32) // (2 * n)
    assert (x * n) >> 32 == i
    return struct.pack("<I", x)


def size(kind, *args):
    b = variant(SIZE, kind)
    if kind in ("Edge", "Like"):
        b += bytes([args[0]])
    elif kind == "Class":
        b += bytes([args[0], args[1]])
    elif kind == "Medium":
        b += struct.pack("<I", args[0])
    else:
        b += struct.pack("<H", args[0])
    return b


def alloc(slot, sz, api="Hook", zeroed=False, align="A64"):
    return (variant(OP, "Alloc") + bytes([slot]) + sz + variant(API, api)
            + bytes([int(zeroed)]) + variant(ALIGN, align))


def free(slot):
    return variant(OP, "Free") + bytes([slot])


def resize(slot, sz, zeroed=False):
    return variant(OP, "Resize") + bytes([slot]) + sz + bytes([int(zeroed)])


def point(name):
    return variant(OP, "Point") + variant(POINT, name)


def cross(mask):
    return variant(OP, "CrossFree") + struct.pack("<I", mask)


def seq(*ops):
    return b"".join(b"\x01" + op for op in ops)


# Class 2 (12 KiB + 128): three neighbours back to back in their span.
C2 = size("Class", 2, 0)
# The size of the block in slot 0.
LIKE0 = size("Like", 0)
SEEDS = {
    # A block between two live neighbours given back by the decay (the
    # decay time set to 0, then a medium allocation), then taken again
    # zeroed through i_calloc: its bytes on the shared pages must be zero.
    "decay_between_live": seq(
        alloc(0, C2), alloc(1, C2), alloc(2, C2), free(1),
        point("Decay0"), alloc(3, size("Edge", 9)),
        alloc(1, C2, zeroed=True), point("DecayDefault")),
    # The same through free_buffers(), two classes, MklAllocator too.
    "free_buffers_between_live": seq(
        alloc(0, size("Class", 20, 0)), alloc(1, LIKE0), alloc(2, LIKE0),
        alloc(4, C2, "Mkl"), alloc(5, C2, "Mkl"), free(1), free(4), point("FreeBuffers"),
        alloc(1, size("Class", 20, 0), zeroed=True),
        alloc(4, C2, "Mkl", zeroed=True)),
    # MklAllocator across the boundaries: small, 4 KiB, 1 MiB, above.
    "mkl_resizes": seq(
        alloc(0, size("Small", 100), "Mkl"), resize(0, size("Edge", 0), True),
        resize(0, size("Edge", 2)), resize(0, size("Edge", 18), True),
        resize(0, size("Edge", 22), True), resize(0, size("Edge", 4)),
        resize(0, size("Small", 7)), alloc(1, size("Medium", 0x1234), "Mkl",
                                           True, "A4096")),
    # i_realloc across the boundaries, and blocks at every class edge.
    "hook_resizes": seq(
        alloc(0, size("Small", 4000)), resize(0, size("Edge", 3)),
        resize(0, size("Class", 27, 1)), resize(0, size("Edge", 22)),
        resize(0, size("Class", 19, 2)), resize(0, size("Small", 64)),
        alloc(1, size("Class", 8, 3)), alloc(2, size("Class", 8, 5)),
        alloc(3, size("Medium", 0x10004))),
    # Frees on a second thread, of both kinds of blocks, some parked.
    "cross_thread": seq(
        alloc(0, C2), alloc(1, C2), alloc(2, size("Class", 24, 0)),
        alloc(3, C2, "Mkl"), alloc(4, size("Edge", 14)), cross(0b01011),
        alloc(0, C2, zeroed=True), point("Decay0"), cross(0b10100),
        alloc(1, C2, zeroed=True)),
    # The budget: off, 0 (every free given back at once), small, back.
    "budget": seq(
        point("BudgetZero"), alloc(0, size("Class", 22, 0)),
        alloc(1, size("Class", 22, 0)), alloc(2, size("Class", 22, 0)),
        free(1), alloc(1, size("Class", 22, 0), zeroed=True),
        point("BudgetSmall"), free(0), free(2), point("Decay1"),
        alloc(3, size("Class", 22, 0), zeroed=True), point("BudgetOff"),
        free(3), point("BudgetDefault"), point("DecayDefault")),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "medium_ops")
for name, data in SEEDS.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)
