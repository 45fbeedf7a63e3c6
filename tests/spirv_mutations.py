"""Well-formed but type-confused SPIR-V, made from a real kernel: every id stays defined,
so structural validation accepts it, yet the driver's compiler may crash on it (docs/design.md §4:
measured SIGSEGV in-process with the bookworm driver, SIGABRT/SIGSEGV in ocloc)."""

from __future__ import annotations

import random
import struct
from typing import Iterator, List, Tuple

OP_TYPE_FIRST, OP_TYPE_LAST = 19, 39  # OpTypeVoid .. OpTypeForwardPointer
OP_TYPE_POINTER = 32
# Instructions laid out as (result type, result id, value operands...): negation and
# arithmetic, conversions, bitwise and shift operations.
VALUE_OPS = set(range(126, 142)) | set(range(109, 125)) | set(range(194, 200))


def _instructions(words: List[int]) -> Iterator[Tuple[int, int, int]]:
    """(index, opcode, word count) of each instruction after the header."""
    i = 5
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            return
        yield i, opcode, count
        i += count


def mutants(spirv: bytes, n: int, seed: int = 0) -> List[Tuple[str, bytes]]:
    """``n`` distinct mutants: a type id in place of a value operand, or a pointer type as
    an arithmetic result's type. Deterministic for a given seed."""
    words = list(struct.unpack(f"<{len(spirv) // 4}I", spirv))
    types, pointers, sites = [], [], []
    for i, opcode, count in _instructions(words):
        if OP_TYPE_FIRST <= opcode <= OP_TYPE_LAST and count >= 2:
            types.append(words[i + 1])
            if opcode == OP_TYPE_POINTER:
                pointers.append(words[i + 1])
        elif opcode in VALUE_OPS and count >= 4:
            sites.append((i, count))
    rng = random.Random(seed)
    found: dict = {}
    for _ in range(n * 50):
        if len(found) >= n:
            break
        i, count = rng.choice(sites)
        mutated = list(words)
        if pointers and rng.random() < 0.3:
            mutated[i + 1] = rng.choice(pointers)
            what = f"result type of instruction at word {i} -> pointer type"
        else:
            pos = rng.randrange(3, count)
            mutated[i + pos] = rng.choice(types)
            what = f"operand {pos - 2} of instruction at word {i} -> type id"
        blob = struct.pack(f"<{len(mutated)}I", *mutated)
        if blob != spirv:
            found.setdefault(blob, what)
    return [(what, blob) for blob, what in found.items()]
