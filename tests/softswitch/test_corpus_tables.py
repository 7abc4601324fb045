"""The table and header-choice corpus programs on the embedded target alone, against bmv2's semantics written
out by hand (the bmv2 or PI source named in each comment): LPM const entries, keys on isValid(), `?:`
between headers, the optional match kind, and a P4Info table the bmv2 JSON lacks.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import grpc
import pytest
from finsy.proto import p4r
from google.protobuf import text_format

from corpus_cases import CASES, CORPUS, pipeline, schema
from corpus_table_cases import BY_MEMBER, eth, opt_probe, probe
from dpu_softswitch.errors import ProgramError, UnsupportedConstruct
from dpu_softswitch.program import Program
from dpu_softswitch.server import Device
from helpers.p4rt import Client, connect

InProcess = tuple[Device, grpc.aio.Channel]
INT_MAX = (1 << 31) - 1


async def programmed(target: InProcess, name: str) -> tuple[Device, Client]:
    """The in-process target with corpus program `name` set and its case's entries written."""
    device, channel = target
    c = await connect(channel, 5)
    await c.responses.get()
    await c.set_pipeline(pipeline(name))
    await CASES[name].setup(c, schema(name))
    return device, c


def outputs(device: Device, name: str) -> list[list[tuple[int, bytes]]]:
    """Every frame of the case through the device, in order."""
    return [device.process(port, frame) for port, frame in CASES[name].frames]


def doc(name: str) -> dict[str, Any]:
    """A corpus program's bmv2 JSON."""
    return json.loads((CORPUS / f"{name}.json").read_text())  # type: ignore[no-any-return]


def table_json(d: dict[str, Any], name: str) -> dict[str, Any]:
    """A table of the JSON by name."""
    return next(t for p in d["pipelines"] for t in p["tables"] if t["name"] == name)


# ---------------------------------------------------------------- LPM const entries


def test_const_lpm_values_are_cut_to_their_prefix() -> None:
    """bmv2's LPM trie compares only the prefix's bits (lookup_structures.cpp): 0x11/4 matches 0x10..0x1F."""
    table = Program(doc("lpm_const")).tables["I.prefixes"].table
    assert sorted(e.match for e in table.entries.values()) == [((0x10, 4),), ((0x17, 8),), ((0xC0, 2),)]
    for value, hit in ((0x10, 0x10), (0x1E, 0x10), (0x17, 0x17), (0xFF, 0xC0), (0x20, None)):
        entry = table.lookup((value,))
        assert (entry.match[0][0] if entry else None) == hit


def test_const_entries_equal_past_their_prefix_are_refused() -> None:
    """bmv2 refuses a program whose initializer holds a key twice (P4Objects::init_pipelines)."""
    d = doc("lpm_const")
    table_json(d, "I.prefixes")["entries"][1]["match_key"][0].update(key="0x12", prefix_length=4)
    with pytest.raises(ProgramError, match="duplicate entries"):
        Program(d)


def test_optional_in_the_json_is_refused_as_bmv2_does() -> None:
    """p4c writes optional keys as ternary; bmv2 has no "optional" match type (match_name_to_match_type)."""
    d = doc("optional_match")
    table_json(d, "I.opt")["key"][0]["match_type"] = "optional"
    with pytest.raises(UnsupportedConstruct, match="match kind optional"):
        Program(d)


async def test_lpm_const_program(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "lpm_const")
    hits = [
        (0x01, 0, 0, 0),
        (0x01, 0, 0, 0),
        (0x02, 0, 0, 0),
        (0xEE, 1, 0, 0),
        (0xEE, 2, 0, 0),
        (0xEE, 1, 0, 0),
        (0xEE, 3, 0, 0),
        (0x03, 0, 0, 0),
        (0xEE, 0, 1, 0),
        (0xEE, 0, 1, 0),
        (0xEE, 0, 2, 0),
        (0xEE, 0, 2, 2),
        (0xEE, 0, 0, 1),
        (0xEE, 0, 0, 3),
        (0xEE, 0, 0, 0),
    ]
    frames = CASES["lpm_const"].frames
    want = [[(1, f[:17] + bytes(h) + f[21:])] for (_, f), h in zip(frames[:-1], hits, strict=True)]
    assert outputs(device, "lpm_const") == [*want, []]
    assert frames[0][1][14:21] == probe(0x10, 0x0001)
    state = await CASES["lpm_const"].state(c, schema("lpm_const"))
    # PI's answers (device_mgr.cpp, set_lpm_match): INVALID_ARGUMENT for trailing bits, prefix 0 and a prefix
    # past the width; ALREADY_EXISTS for a key written before.
    assert [state[k] for k in ("unmasked", "prefix 0", "prefix 17", "exists")] == [
        "UNKNOWN [3]",
        "UNKNOWN [3]",
        "UNKNOWN [3]",
        "UNKNOWN [6]",
    ]
    # An LPM table's const entries read back as bmv2 stores them, bits past the prefix included; a ternary
    # table's are masked (bmv2 masks a ternary key), and carry PI's inverted priority.
    prefixes = " ".join(state["I.prefixes"])  # type: ignore[arg-type]
    assert 'lpm { value: "\\021" prefix_len: 4 }' in prefixes and "priority" not in prefixes
    assert 'lpm { value: "\\305" prefix_len: 2 }' in prefixes
    mixed = state["I.mixed"]
    assert isinstance(mixed, list) and len(mixed) == 2
    assert f"priority: {INT_MAX - 1}" in " ".join(mixed) and 'lpm { value: "0" prefix_len: 4 }' in " ".join(mixed)
    by_b = state["I.by_b"]
    assert isinstance(by_b, list) and sum("lpm" not in e for e in by_b) == 1  # (0x0002, _): prefix 0 left out


# ---------------------------------------------------------------- isValid() keys


async def test_keys_on_union_member_validity(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "union_valid_key")
    frames = [f for _, f in CASES["union_valid_key"].frames]
    lg = bytes([7]) + (0x0102030405060708).to_bytes(8, "big")
    tail = b"union-tail"

    def report(first: int, second: int) -> bytes:
        return bytes([first, second])

    s_bytes, l_bytes = frames[1][16:21], frames[2][16:25]
    assert (
        outputs(device, "union_valid_key")
        == [
            [(1, frames[0][:14] + report(0x10, 1) + lg + tail)],  # no member: to_long makes l valid
            [(1, frames[1][:14] + report(1, 2) + s_bytes + tail)],
            [(1, frames[2][:14] + report(2, 1) + l_bytes + tail)],
            [(1, frames[3][:14] + report(2, 1) + l_bytes + tail)],  # s displaced by l
            [(1, frames[4][:14] + lg + tail)],  # no report: no const entry matches
        ]
    )
    state = await CASES["union_valid_key"].state(c, schema("union_valid_key"))
    # Written and const entries on booleans read back as one-byte exact values.
    again = [text_format.Parse(e, p4r.Entity()).table_entry for e in state["I.again"]]  # type: ignore[union-attr]
    keys = sorted(tuple(m.exact.value for m in te.match) for te in again)
    assert keys == [(b"\0", b"\0", b"\1"), (b"\0", b"\1", b"\1"), (b"\1", b"\0", b"\1")]
    assert all(te.priority == 0 for te in again)
    assert len(state[BY_MEMBER]) == 3  # type: ignore[arg-type]


# ---------------------------------------------------------------- `?:` between headers


def mux_expected(c: int, d: int, a: bytes, b: bytes) -> bytes:
    """What header_mux.p4's pipeline emits after sel: bmv2's assign_header copies a valid source and only
    invalidates the destination for an invalid one."""
    ha = a if d & 1 else None
    hb = b if d & 2 else None
    out = ha if c == 1 else hb
    out2 = None
    if d in (1, 3):
        out2 = ha if c == 1 else (hb if c == 2 else out)
        if out2 is not None:
            x, y = struct.unpack("!HH", out2)
            out2 = struct.pack("!HH", x, (y + 1) & 0xFFFF)
    elif d == 2:
        out2 = hb if c == 1 else ha
    return b"".join(h for h in (ha, hb, out, out2) if h is not None)


async def test_header_assigned_from_a_choice(in_process_target: InProcess) -> None:
    device, _ = await programmed(in_process_target, "header_mux")
    a, b = struct.pack("!HH", 0x0A0A, 0x0A01), struct.pack("!HH", 0x0B0B, 0x0B01)
    frames = [f for _, f in CASES["header_mux"].frames]
    want = [
        [(1, eth(0x9500, bytes([c, d]) + mux_expected(c, d, a, b) + b"mux-tail"))] for c in (1, 2, 3) for d in range(4)
    ]
    assert outputs(device, "header_mux") == [*want, [(1, frames[-1])]]


# ---------------------------------------------------------------- optional


async def test_optional_match_kind(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "optional_match")
    hits = [(1, 1), (2, 1), (2, 2), (3, 4), (4, 3), (0, 3), (0, 1)]
    rows = [(0x0800, 1, 0x001), (0x0800, 1, 0x123), (0x1234, 1, 0x123), (0x1234, 2, 0x555)]
    rows += [(0x86DD, 2, 0xFFF), (0x86DD, 3, 0xFFF), (0x0800, 3, 0x123)]
    want = [[(1, eth(0x9600, opt_probe(*row)[:5] + bytes(h) + b"opt-tail"))] for row, h in zip(rows, hits, strict=True)]
    assert outputs(device, "optional_match") == want
    state = await CASES["optional_match"].state(c, schema("optional_match"))
    opt = " ".join(state["I.opt"])  # type: ignore[arg-type]
    # Written entries read back as written: optional fields, the left-out ones absent.
    assert opt.count("optional {") == 4 and "ternary" not in opt
    # Const entries: PI renders an optional field from bmv2's ternary one, a zero mask as left out.
    const = state["I.opt_const"]
    assert isinstance(const, list) and sorted(e.count("optional {") for e in const) == [0, 1, 1, 2]


async def test_optional_entries_are_ternary_to_the_table(in_process_target: InProcess) -> None:
    """PI's MatchKey::set_optional: a value with an all-ones mask, a wildcard with mask 0 (priority needed)."""
    device, _ = await programmed(in_process_target, "optional_match")
    assert device.pipeline is not None
    table = device.pipeline.program.tables["I.opt"].table
    assert table.needs_priority
    assert sorted(e.match for e in table.entries.values())[0] == ((0, 0), 1, (0x123, 0xFFF))


# ---------------------------------------------------------------- a table the JSON lacks


def test_dead_table_is_in_the_p4info_only() -> None:
    info = (CORPUS / "dead_table.p4info.txtpb").read_text()
    in_json = {t["name"] for p in doc("dead_table")["pipelines"] for t in p["tables"]}
    assert '"I.dead"' in info and "I.dead" not in in_json and "I.live" in in_json


async def test_table_missing_from_the_json(in_process_target: InProcess) -> None:
    """simple_switch_grpc loads it; PI fails what needs the table in bmv2 (INVALID_TABLE_NAME) with UNKNOWN,
    finds no entry to modify or delete (NOT_FOUND), and reads nothing by key."""
    device, c = await programmed(in_process_target, "dead_table")
    frames = [f for _, f in CASES["dead_table"].frames]
    assert outputs(device, "dead_table") == [[(1, frames[0])], [(2, frames[1])], [(0, frames[2])]]
    state = await CASES["dead_table"].state(c, schema("dead_table"))
    live = state.pop("live")
    assert state == {
        "insert": "UNKNOWN [2]",
        "modify": "UNKNOWN [5]",
        "delete": "UNKNOWN [5]",
        "set default": "UNKNOWN [2]",
        "reset default": "UNKNOWN [2]",
        "read table": "UNKNOWN",
        "read by key": "0 entities",
        "read default": "UNKNOWN",
        "read all tables": "UNKNOWN",
    }
    assert isinstance(live, list) and len(live) == 2
