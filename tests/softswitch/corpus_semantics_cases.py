"""Corpus cases about bmv2's data semantics: varbit fields, signed fields, saturating arithmetic, the
parser's advance, and whole header stacks (and union stacks) assigned at once.

corpus_cases.py makes each into a Case (frames, entries, the state both targets must read back alike).
"""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finsy import P4Schema

from corpus_table_cases import Frames, eth, ins
from helpers.p4rt import Client

CORPUS = Path(__file__).resolve().parent / "corpus"


def committed(name: str) -> str:
    """The committed corpus program whose JSON (rewritten, for a DERIVED one) and P4Info `name` runs."""
    return DERIVED[name][0] if name in DERIVED else name


def program_json(name: str) -> bytes:
    """A corpus program's bmv2 JSON: the committed one, or the rewrite of one (DERIVED)."""
    data = (CORPUS / f"{committed(name)}.json").read_bytes()
    return json.dumps(DERIVED[name][1](json.loads(data))).encode() if name in DERIVED else data


# ---------------------------------------------------------------- varbit


def varbit_probe(nbits: int, op: int) -> bytes:
    """varbit.p4's probe header: the option's data length in bits, the op, err and csum zero."""
    return struct.pack("!BBBH", nbits, op, 0, 0)


def varbit_frames() -> Frames:
    """Each op at data widths 0 to 64 bits; widths that are no multiple of 8 (ParserInvalidArgument), past
    max_length (HeaderTooShort) and past the frame (PacketTooShort); extracts into a stack (StackOutOfBounds
    past it) and a union stack; a frame without the probe."""
    opt = bytes([0x12]) + bytes(range(0xA0, 0xA8))
    rows = [(16, op) for op in range(9)] + [(0, op) for op in (0, 1, 2, 4, 6, 8)]
    rows += [(64, 1), (64, 2), (64, 7), (8, 6), (8, 8), (12, 0), (12, 1), (72, 0), (72, 4)]
    # Into a stack (two, then one too many) and a union stack's members; 56 + 64 bits run past max_length.
    rows += [(nbits, op) for nbits in (0, 16, 56) for op in (9, 10, 11)] + [(12, 9), (12, 11)]
    frames = [(0, eth(0x9700, varbit_probe(nbits, op) + opt + b"after-header" + b"tail")) for nbits, op in rows]
    frames += [(0, eth(0x9700, varbit_probe(40, 1) + opt[:3])), (0, eth(0x9700, varbit_probe(16, 7) + opt[:3]))]
    return frames + [(1, eth(0x0800, b"no probe"))]


# ---------------------------------------------------------------- signed


async def signed_setup(c: Client, sch: P4Schema) -> None:
    await c.write(
        ins(sch, "I.by_a", "I.set_param", {"hdr.nums.a": 0xFB}, p=0xFD),  # a = -5: p = -3
        ins(sch, "I.by_a", "I.set_param", {"hdr.nums.a": 0x03}, p=0x64),
        ins(sch, "I.by_a", "I.set_param", {"hdr.nums.a": 0x80}, p=0x7F),
    )


def signed_nums(a: int, b: int, wide: int, u: int, n4: int) -> bytes:
    """signed.p4's nums header (values as signed ints, written in two's complement) and a zero res header."""
    return struct.pack("!bbhBB", a, b, wide, u, (n4 & 0xF) << 4 | 0x5) + bytes(12)


def signed_frames() -> Frames:
    """Positive, negative and extreme values of each field; hits on the table's negative, positive and
    most negative keys; a frame without the header."""
    rows = [
        (3, 5, 1000, 1, 1),
        (-5, 3, -300, 0x80, -3),
        (-5, -128, -299, 0xFF, -8),
        (-128, -1, -32768, 0x7F, 7),
        (127, 127, 32767, 0, -2),
        (-1, -1, -1, 0xFE, -1),
        (100, -100, 255, 0x81, -4),
        (0, 0, 0, 0, 0),
    ]
    return [(0, eth(0x9800, signed_nums(*row) + b"signed-tail")) for row in rows] + [(1, eth(0x0800, b"none"))]


# ---------------------------------------------------------------- saturating


async def saturating_setup(c: Client, sch: P4Schema) -> None:
    # s is int<8>: 0x9C is -100 to P4, but bmv2's action data are unsigned, so `sa |-| s` subtracts 156.
    await c.write(
        ins(sch, "I.params", "I.with_param", {"hdr.sat.ua": 0x10}, u=0x05, s=0x9C),
        ins(sch, "I.params", "I.with_param", {"hdr.sat.ua": 0xF0}, u=0x20, s=0x10),
    )


def saturating_frames() -> Frames:
    """Sums and differences inside the range, at its ends and past them either way; table hits and misses."""
    rows = [
        (0x10, 0x20, 100, 27, 0xFFF0),
        (0xF0, 0x20, -100, -29, 0x0100),
        (0xFF, 0xFF, 127, 127, 0xFFFF),
        (0x00, 0x01, -128, 1, 0),
        (0x80, 0x80, -128, -128, 0xFF80),
        (0x7F, 0x80, 64, -64, 0x1234),
    ]
    return [(0, eth(0x9900, struct.pack("!BBbbH", *row) + bytes(8) + b"sat-tail")) for row in rows] + [
        (1, eth(0x0800, b"none"))
    ]


# ---------------------------------------------------------------- advance


def advance_frames() -> Frames:
    """Each way of advancing, by 0 to 64 bits; amounts that are no multiple of 8 and past the frame."""
    body = bytes(range(0x40, 0x50)) + b"advance-tail"
    rows = [(0, 0), (1, 0), (2, 0), (2, 8), (2, 64), (3, 0), (3, 12), (2, 12), (3, 3), (2, 255), (3, 200)]
    frames = [(0, eth(0x9A00, bytes([how, bits, 0]) + body)) for how, bits in rows]
    return frames + [(0, eth(0x9A00, bytes([1, 0, 0, 0xAA]))), (1, eth(0x0800, b"none"))]


# ---------------------------------------------------------------- stack_copy


def whole_stack_assignments(doc: dict[str, Any]) -> dict[str, Any]:
    """p4c 1.2.4's JSON with each stack copy it lowered to assign_header element by element (member by member
    for a union stack) written back as bmv2's assign_header_stack (assign_union_stack), which p4c never emits.

    stack_copy.json is stack_copy.p4 compiled and passed through this (see stack_copy.p4)."""
    doc = copy.deepcopy(doc)
    runs: dict[tuple[str, ...], tuple[str, str, str]] = {}  # the lowered ops' (dst, src) names -> the whole op
    stacks = {s["name"]: len(s["header_ids"]) for s in doc.get("header_stacks", [])}
    members = {t["name"]: [m[0] for m in t["headers"]] for t in doc.get("header_union_types", [])}
    unions = {s["name"]: (len(s["header_union_ids"]), members[s["union_type"]]) for s in doc["header_union_stacks"]}
    for d in stacks:
        for s in stacks:
            if d != s and stacks[d] == stacks[s]:
                runs[tuple(f"{x}[{i}]" for i in range(stacks[d]) for x in (d, s))] = ("assign_header_stack", d, s)
    for d, (n, ms) in unions.items():
        for s, (n2, ms2) in unions.items():
            if d != s and (n, ms) == (n2, ms2):
                key = tuple(f"{x}[{i}].{m}" for i in range(n) for m in ms for x in (d, s))
                runs[key] = ("assign_union_stack", d, s)
    for action in doc["actions"]:
        prims, out = action["primitives"], []
        i = 0
        while i < len(prims):
            for key, (op, d, s) in runs.items():
                n = len(key) // 2
                names = tuple(
                    p["parameters"][k]["value"] for p in prims[i : i + n] if p["op"] == "assign_header" for k in (0, 1)
                )
                if names == key:
                    kind = "header_stack" if op == "assign_header_stack" else "header_union_stack"
                    params = [{"type": kind, "value": d}, {"type": kind, "value": s}]
                    out.append({"op": op, "parameters": params, "source_info": prims[i].get("source_info", {})})
                    i += n
                    break
            else:
                out.append(prims[i])
                i += 1
        action["primitives"] = out
    return doc


def stack_copy_frames() -> Frames:
    """Each op with 0 to 3 tags parsed into the source stack; a frame without the op header."""
    frames = []
    for op in range(6):
        for n in range(4):
            tags = b"".join(bytes([1 if k < n - 1 else 0, 0x30 + k]) for k in range(n))
            frames.append((0, eth(0x9B00, bytes([op, n]) + tags + b"stack-tail")))
    return frames + [(1, eth(0x0800, b"none"))]


# Programs whose JSON is a committed one rewritten (for what bmv2 runs but p4c 1.2.4 never writes): the
# committed program's name and the rewrite. The P4Info is the committed program's.
DERIVED: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "stack_copy_whole": ("stack_copy", whole_stack_assignments),
}
