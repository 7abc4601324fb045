"""The data-semantics corpus programs on the embedded target alone, against bmv2's semantics written out by
hand (the bmv2 source named in each comment): varbit fields, signed fields, saturating arithmetic, the
parser's advance, and header stacks assigned whole. No P4Runtime: each program's own const entries do.
"""

from __future__ import annotations

import copy
import json
import struct
from typing import Any

import pytest

from corpus_semantics_cases import program_json, signed_nums, varbit_probe
from corpus_table_cases import eth
from dpu_softswitch.errors import ProgramError, UnsupportedConstruct
from dpu_softswitch.program import Program
from dpu_softswitch.switch.packet import Packet


def doc(name: str) -> dict[str, Any]:
    """A corpus program's bmv2 JSON (stack_copy_whole: stack_copy's, rewritten)."""
    return json.loads(program_json(name))  # type: ignore[no-any-return]


def run(program: Program, frame: bytes, port: int = 0) -> list[tuple[int, bytes]]:
    """One frame through the program."""
    return program.process(port, frame)


# ---------------------------------------------------------------- varbit

OPT = bytes([0x12]) + bytes(range(0xA0, 0xA8))
TAIL = b"tail-bytes"


def varbit_out(nbits: int, op: int, body: bytes, err: int = 0) -> bytes:
    """varbit.p4's output frame: the probe (err set), then `body`."""
    probe = bytearray(varbit_probe(nbits, op))
    probe[2] = err
    return eth(0x9700, bytes(probe) + body)


@pytest.mark.parametrize(
    ("nbits", "op", "body", "err"),
    [
        (16, 0, OPT[:3], 0),  # emitted at the extracted width
        (16, 1, OPT[:3] + OPT[:3], 0),  # assign_header copies the width (Field::assign_VL)
        (16, 2, OPT[:3] + bytes([0xC0]) + OPT[1:3], 0),  # setValid zeroes, assign_VL copies
        (16, 3, b"", 0),
        (16, 4, OPT[:3] + bytes([0x05]), 0),  # setValid on a never-extracted varbit: 0 bits
        (16, 5, b"", 0),  # an invalid source only invalidates the destination
        (16, 6, OPT[:3] + bytes(3), 0),  # setValid after setInvalid zeroes the data, keeps its width
        (12, 0, b"", 6),  # ParserInvalidArgument: the header stays invalid, its bytes payload
        (72, 0, b"", 4),  # HeaderTooShort: 10 bytes against max_length 9
    ],
)
def test_varbit_extract_emit_and_assign(nbits: int, op: int, body: bytes, err: int) -> None:
    program = Program(doc("varbit"))
    rest = (OPT if err else OPT[1 + nbits // 8 :]) + TAIL
    want = varbit_out(nbits, op, body + rest, err)
    assert run(program, eth(0x9700, varbit_probe(nbits, op) + OPT + TAIL)) == [(1, want)]


def test_varbit_checksum_counts_the_extracted_width() -> None:
    """bmv2's BufBuilder deparses a varbit field at get_nbits() (calculations.cpp)."""
    program = Program(doc("varbit"))
    ((_, out),) = run(program, eth(0x9700, varbit_probe(8, 8) + OPT[:2] + TAIL))
    words = (0x12A0, 0x0800)  # kind, flags, the 8 data bits, then nbits and the zero padding
    total = sum(words)
    assert out[17:19] == ((~(total + (total >> 16))) & 0xFFFF).to_bytes(2, "big")


def test_varbit_packet_too_short_and_width_reset_per_packet() -> None:
    program = Program(doc("varbit"))
    short = eth(0x9700, varbit_probe(40, 1) + OPT[:3])
    assert run(program, short) == [(1, varbit_out(40, 1, OPT[:3], 1))]
    # The next packet starts with every varbit at 0 bits (bmv2's PHV::reset resets VL headers).
    assert run(program, eth(0x9700, varbit_probe(0, 4) + OPT[:1] + TAIL)) == [
        (1, varbit_out(0, 4, OPT[:1] + bytes([0x05]) + TAIL))
    ]


def test_varbit_in_stacks() -> None:
    """extract_VL into a stack (bmv2's ParserOpExtractStack); push_front moves an element's width with it
    (Field::swap_values); a third extract into two elements is StackOutOfBounds, before any length check."""
    program = Program(doc("varbit"))
    frame = eth(0x9700, varbit_probe(16, 9) + OPT + TAIL)
    assert run(program, frame) == [(1, varbit_out(16, 9, OPT[:3] + OPT[3:6] + TAIL[1:]))]
    frame = eth(0x9700, varbit_probe(16, 10) + OPT + TAIL)
    assert run(program, frame) == [(1, varbit_out(16, 10, OPT[:9] + TAIL, 3))]
    # A union stack: us[0].small, then us[1].opt (not us[0].opt, which would invalidate us[0].small), so
    # the deparser's order gives the bytes back.
    frame = eth(0x9700, varbit_probe(16, 11) + OPT + TAIL)
    assert run(program, frame) == [(1, frame)]


def test_varbit_refusals() -> None:
    """bmv2 refuses 'extract' of a varbit header and extract_VL of a fixed one (P4Objects::init_parsers)."""
    d = doc("varbit")
    ops = d["parsers"][0]["parse_states"][1]["parser_ops"]
    bad = copy.deepcopy(d)
    extract = {"op": "extract", "parameters": [ops[2]["parameters"][0]]}
    bad["parsers"][0]["parse_states"][1]["parser_ops"] = [ops[0], extract]
    with pytest.raises(ProgramError, match="'extract' of varbit header"):
        Program(bad)
    bad = copy.deepcopy(d)
    bad["parsers"][0]["parse_states"][1]["parser_ops"][2]["parameters"][0]["value"] = "after"
    with pytest.raises(ProgramError, match="extract_VL needs a varbit header"):
        Program(bad)
    bad = copy.deepcopy(d)
    bad["parsers"][0]["parse_states"][1]["parser_ops"][2]["parameters"][0]["type"] = "field"
    with pytest.raises(UnsupportedConstruct, match="extract of field"):
        Program(bad)


# ---------------------------------------------------------------- signed


def signed_res(a: int, b: int, wide: int, u: int, n4: int) -> bytes:
    """signed.p4's res header worked out with two's-complement arithmetic (no table hit: param, hit zero)."""

    def s8(x: int) -> int:
        return (x + 128) % 256 - 128

    cmp = (a < b) | (a >= 0) << 1 | (wide > -300) << 2 | (s8(u) < 0) << 3 | (n4 < -2) << 4
    cmp |= (n4 == b) << 5 | (a > s8(wide & 0xFF)) << 6
    ext = (a + wide + 0x8000) % 0x10000 - 0x8000
    # Python's >> is arithmetic, as bmv2's on a negative Bignum: -5 >> 2 is -2.
    return struct.pack(
        "!bbbbhBbBbbB", s8(a + b), s8(a - b), s8(a >> 2), s8(a << 3), ext, wide & 0xFF, s8(-b), cmp, 0, s8(a * b), 0
    )


@pytest.mark.parametrize(
    "row", [(3, 5, 1000, 1, 1), (-5, 3, -300, 0x80, -3), (-128, -1, -32768, 0x7F, 7), (100, -100, 255, 0x81, -4)]
)
def test_signed_arithmetic_comparisons_shifts_and_casts(row: tuple[int, int, int, int, int]) -> None:
    program = Program(doc("signed"))
    frame = eth(0x9800, signed_nums(*row) + b"tail")
    ((port, out),) = run(program, frame)
    assert (port, out[14:20], out[20:32], out[32:]) == (1, frame[14:20], signed_res(*row), b"tail")


def test_signed_fields_hold_their_bits() -> None:
    """An int<N> field's slot holds its two's-complement bits (what keys, checksums and the deparser use, as
    bmv2's bytes); only expressions read it as a signed value."""
    program = Program(doc("signed"))
    assert program.layout.field_index[("nums", "a")] in program.layout.signed
    frame = eth(0x9800, signed_nums(-1, -128, -2, 0, -8) + b"t")
    ((_, out),) = run(program, frame)
    assert out[14:20] == frame[14:20] == bytes([0xFF, 0x80, 0xFF, 0xFE, 0x00, 0x85])


# ---------------------------------------------------------------- saturating


def test_saturating_operators_clamp() -> None:
    """bmv2's Data::usat_cast and sat_cast clamp to the type's range; the default action's params: 200, 100."""
    program = Program(doc("saturating"))
    cases = [
        ((0x10, 0x20, 100, 27, 0xFFF0), (0x30, 0x00, 127, 73, 0xFFFF, 0xD8, 0)),
        ((0xF0, 0x20, -100, -29, 0x0100), (0xFF, 0xD0, -128, -71, 0x0120, 0xFF, -128)),
        ((0x00, 0x01, -128, 1, 0), (0x01, 0x00, -127, -128, 0x0001, 200, -128)),
    ]
    for row, res in cases:
        frame = eth(0x9900, struct.pack("!BBbbH", *row) + bytes(8) + b"tail")
        ((_, out),) = run(program, frame)
        assert out[14:20] == frame[14:20] and out[20:28] == struct.pack("!BBbbHBb", *res)


# ---------------------------------------------------------------- advance

BODY = bytes(range(0x40, 0x50)) + b"tail"


@pytest.mark.parametrize(
    ("how", "bits", "skipped", "err"),
    [(1, 0, 2, 0), (2, 0, 0, 0), (2, 64, 8, 0), (3, 12, 4, 0), (2, 12, 0, 6), (3, 3, 0, 6), (2, 255, 0, 6)],
)
def test_advance_skips_bytes_that_leave_the_packet(how: int, bits: int, skipped: int, err: int) -> None:
    """bmv2's ParserOpAdvance: whole bytes only (else ParserInvalidArgument), the skipped ones dropped."""
    program = Program(doc("advance"))
    ((_, out),) = run(program, eth(0x9A00, bytes([how, bits, 0]) + BODY))
    rest = BODY if err else BODY[skipped:]  # `after` extracted: its 2 bytes stay where they were
    assert out[14:] == bytes([how, bits, err]) + rest


def test_advance_past_the_frame_and_by_an_expression() -> None:
    d = doc("advance")
    program = Program(d)
    ((_, out),) = run(program, eth(0x9A00, bytes([1, 0, 0, 0xAA])))
    assert out[14:] == bytes([1, 0, 1, 0xAA])  # PacketTooShort: nothing skipped
    # bmv2 also takes an expression (P4Objects::init_parsers), which p4c 1.2.4 writes as a temporary.
    state = next(s for s in d["parsers"][0]["parse_states"] if s["name"] == "by_expr")
    state["parser_ops"] = [{"op": "advance", "parameters": [state["parser_ops"][0]["parameters"][1]]}]
    ((_, out),) = run(Program(d), eth(0x9A00, bytes([3, 4, 0]) + BODY))
    assert out[14:] == bytes([3, 4, 0]) + BODY[2:]


# ---------------------------------------------------------------- stack_copy


def tags(n: int, base: int = 0x30) -> bytes:
    """n tags as stack_copy.p4 parses them (more set on all but the last)."""
    return b"".join(bytes([1 if k < n - 1 else 0, base + k]) for k in range(n))


@pytest.mark.parametrize(
    ("op", "n", "dst", "udst"),
    [
        (0, 2, b"", b""),
        (1, 2, tags(2), b""),
        (1, 3, tags(3), b""),
        (2, 2, bytes([0, 0xEE]) + tags(2), b""),  # the copy pushed once: element 2 falls off
        (2, 3, bytes([0, 0xEE]) + tags(3)[:4], b""),
        (3, 1, tags(1), b""),  # dst[1] was made valid, src[1] is invalid: dst[1] becomes invalid
        (4, 2, tags(2), b"\xa0\xa0\x02"),  # union members: a copied (b invalidated), then b copied
        (5, 1, tags(1), b"\xa0\xa0"),  # usrc[1].b invalid: udst[1].b made invalid
    ],
)
def test_whole_stack_assignments(op: int, n: int, dst: bytes, udst: bytes) -> None:
    """bmv2's assign_header_stack and assign_union_stack (core/primitives.cpp): element by element with
    assign_header's rules; ops 4 and 5 also copy the tag stack (op 4 or 5 makes no dst copy: dst stays empty)."""
    for name in ("stack_copy", "stack_copy_whole"):  # p4c's element-wise copies, then the whole-stack ones
        program = Program(doc(name))
        ((_, out),) = run(program, eth(0x9B00, bytes([op, n]) + tags(n) + b"tail"))
        want_dst = b"" if op in (0, 4, 5) else dst
        assert out[14:] == bytes([op, n]) + tags(n) + want_dst + udst + b"tail"


def test_whole_stack_assignment_copies_the_next_index() -> None:
    """dst.next = src.next before the elements (bmv2's assign_header_stack)."""
    program = Program(doc("stack_copy_whole"))
    ops = {a["name"]: [p["op"] for p in a["primitives"]] for a in doc("stack_copy_whole")["actions"]}
    action = next(a for a in program.actions.values() if ops[a.name] == ["assign_header_stack"])
    p = Packet([0] * program.layout.nfields, [False] * len(program.layout.header_list), 0, [2, 0, 0, 0])
    p.v[program.layout.headers["src[0]"].index] = True
    action.body(p, [])
    assert p.stk[:2] == [2, 2] and p.v[program.layout.headers["dst[0]"].index]


def test_whole_stack_assignment_json_is_p4cs_rewritten() -> None:
    """The rewritten JSON holds the two primitives in place of every assign_header p4c wrote."""
    d = doc("stack_copy_whole")
    ops = {p["op"] for a in d["actions"] for p in a["primitives"]}
    assert {"assign_header_stack", "assign_union_stack"} <= ops and "assign_header" not in ops
