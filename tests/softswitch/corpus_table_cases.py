"""Corpus cases about tables and header choices: LPM const entries, keys on isValid(), `?:` between headers,
the optional match kind, and a table p4c kept in the P4Info but left out of the bmv2 JSON.

corpus_cases.py makes each into a Case (frames, entries, the state both targets must read back alike).
Also home of the frame and entry helpers the whole corpus shares (eth, ins).
"""

from __future__ import annotations

import struct

import grpc
from finsy import P4Schema
from finsy.proto import p4r
from google.protobuf import text_format
from scapy.layers.l2 import Ether

from helpers.p4rt import Client, detail_codes, table_entry, update

MAC_A, MAC_B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
Frames = list[tuple[int, bytes]]


def eth(ethertype: int, payload: bytes = b"", src: str = MAC_A, dst: str = MAC_B) -> bytes:
    """An Ethernet frame of `ethertype` carrying `payload` (no padding)."""
    return bytes(Ether(src=src, dst=dst, type=ethertype)) + payload


def ins(sch: P4Schema, table: str, action: str, match: dict[str, object], **params: int) -> p4r.Update:
    """An INSERT of one table entry."""
    return update(p4r.Update.INSERT, table_entry(sch, table, action, match, params))


def entry(
    sch: P4Schema, table: str, matches: list[p4r.FieldMatch], action: str = "", priority: int = 0, **params: int
) -> p4r.Entity:
    """A table entry built field by field (byte strings exactly as given), with an action by name."""
    te = p4r.TableEntry(table_id=sch.tables[table].id, priority=priority)
    te.match.extend(matches)
    if action:
        info = sch.actions[action]
        a = te.action.action
        a.action_id = info.id
        for name, value in params.items():
            p = info.params[name]
            a.params.add(param_id=p.id, value=value.to_bytes((p.bitwidth + 7) // 8, "big"))
    return p4r.Entity(table_entry=te)


def field(sch: P4Schema, table: str, name: str) -> tuple[int, int]:
    """A match field's id and its width in bytes."""
    mf = sch.tables[table].match_fields[name]
    return mf.id, (mf.bitwidth + 7) // 8


def lpm(sch: P4Schema, table: str, name: str, value: int, plen: int) -> p4r.FieldMatch:
    """An LPM field match, the value as given (masked or not)."""
    fid, n = field(sch, table, name)
    return p4r.FieldMatch(field_id=fid, lpm=p4r.FieldMatch.LPM(value=value.to_bytes(n, "big"), prefix_len=plen))


def exact(sch: P4Schema, table: str, name: str, value: int) -> p4r.FieldMatch:
    """An exact field match."""
    fid, n = field(sch, table, name)
    return p4r.FieldMatch(field_id=fid, exact=p4r.FieldMatch.Exact(value=value.to_bytes(n, "big")))


def optional(sch: P4Schema, table: str, name: str, value: int) -> p4r.FieldMatch:
    """An optional field match."""
    fid, n = field(sch, table, name)
    return p4r.FieldMatch(field_id=fid, optional=p4r.FieldMatch.Optional(value=value.to_bytes(n, "big")))


async def table_text(c: Client, sch: P4Schema, table: str) -> list[str]:
    """Every entry of `table` as a read returns it, in text, sorted."""
    entities = await c.read(p4r.Entity(table_entry=p4r.TableEntry(table_id=sch.tables[table].id)))
    return sorted(text_format.MessageToString(e, as_one_line=True) for e in entities)


async def write_outcome(c: Client, *updates: p4r.Update) -> str:
    """OK, or the failed Write's code and the code of each update."""
    try:
        await c.write(*updates)
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name} {detail_codes(exc)}"
    return "OK"


async def read_outcome(c: Client, entity: p4r.Entity) -> str:
    """How many entities a read returns, or its error code."""
    try:
        return f"{len(await c.read(entity))} entities"
    except grpc.aio.AioRpcError as exc:
        return exc.code().name


# ---------------------------------------------------------------- lpm_const

ROUTES = "I.routes"


def probe(a: int, b: int) -> bytes:
    """lpm_const.p4's probe header (hit1..hit4 zero)."""
    return struct.pack("!BHBBBB", a, b, 0, 0, 0, 0)


async def lpm_setup(c: Client, sch: P4Schema) -> None:
    key = "hdr.probe.b"
    await c.write(
        *(
            update(p4r.Update.INSERT, entry(sch, ROUTES, [lpm(sch, ROUTES, key, value, plen)], "I.mark4", v=v))
            for value, plen, v in ((0x0A00, 8, 1), (0x0A80, 9, 2), (0xFFFF, 16, 3))
        )
    )


def lpm_frames() -> Frames:
    """Each table's entries hit inside and outside the bits their prefixes leave out, the longer prefix and
    the earlier ternary entry winning; misses; a frame without the probe (dropped)."""
    pairs = [
        (0x10, 0x0001),
        (0x1F, 0x0001),
        (0x17, 0x0001),
        (0x20, 0x0001),
        (0x2D, 0x0001),
        (0x27, 0x0001),
        (0x99, 0x0002),
        (0xC0, 0x0102),
        (0x35, 0x01AB),
        (0x3E, 0x01AB),
        (0x3E, 0x0200),
        (0x3D, 0x0A81),
        (0x00, 0x0A01),
        (0x00, 0xFFFF),
        (0x7F, 0x0B00),
    ]
    return [(0, eth(0x9300, probe(a, b) + b"tail")) for a, b in pairs] + [(1, eth(0x0800, b"not a probe"))]


async def lpm_state(c: Client, sch: P4Schema) -> dict[str, object]:
    """The four tables read back (const entries as bmv2 holds them), and what PI says to LPM writes: a value
    with bits past its prefix, prefix lengths 0 and 17, and an entry that exists."""
    out: dict[str, object] = {t: await table_text(c, sch, t) for t in ("I.prefixes", "I.by_b", "I.mixed", ROUTES)}
    key = "hdr.probe.b"
    for name, value, plen in (("unmasked", 0x0A01, 8), ("prefix 0", 0, 0), ("prefix 17", 0x0A00, 17)):
        bad = entry(sch, ROUTES, [lpm(sch, ROUTES, key, value, plen)], "I.mark4", v=9)
        out[name] = await write_outcome(c, update(p4r.Update.INSERT, bad))
    again = entry(sch, ROUTES, [lpm(sch, ROUTES, key, 0x0A00, 8)], "I.mark4", v=9)
    out["exists"] = await write_outcome(c, update(p4r.Update.INSERT, again))
    return out


# ---------------------------------------------------------------- union_valid_key

BY_MEMBER = "I.by_member"


async def union_key_setup(c: Client, sch: P4Schema) -> None:
    s, lg = (mf.name for mf in sch.tables[BY_MEMBER].match_fields)  # the names p4c gives the isValid() keys
    await c.write(
        ins(sch, BY_MEMBER, "I.saw", {s: 1, lg: 0}, v=1),
        ins(sch, BY_MEMBER, "I.saw", {s: 0, lg: 1}, v=2),
        ins(sch, BY_MEMBER, "I.to_long", {s: 0, lg: 0}),
    )


def union_key_frames() -> Frames:
    """No member (to_long makes l valid), s, l, s displaced by l in the parser, and no report header."""
    report = b"\x00\x00"
    s = bytes([3]) + (0x0A000001).to_bytes(4, "big")
    lg = bytes([5]) + (0xFD00000000000002).to_bytes(8, "big")
    tail = b"union-tail"
    return [
        (0, eth(0x9400, report + tail)),
        (0, eth(0x9404, report + s + tail)),
        (0, eth(0x9408, report + lg + tail)),
        (0, eth(0x940C, report + s + lg + tail)),
        (0, eth(0x0800, tail)),
    ]


async def union_key_state(c: Client, sch: P4Schema) -> dict[str, object]:
    return {t: await table_text(c, sch, t) for t in (BY_MEMBER, "I.again")}


# ---------------------------------------------------------------- header_mux


async def mux_setup(c: Client, sch: P4Schema) -> None:
    key = "hdr.sel.d"
    await c.write(
        ins(sch, "I.pick", "I.nested", {key: 1}),
        ins(sch, "I.pick", "I.swapped", {key: 2}),
        ins(sch, "I.pick", "I.nested", {key: 3}),
    )


def mux_frames() -> Frames:
    """Every choice (c 1, 2, 3) with neither, one or both of a and b in the frame; a frame without sel."""
    a, b = struct.pack("!HH", 0x0A0A, 0x0A01), struct.pack("!HH", 0x0B0B, 0x0B01)
    carried = {0: b"", 1: a, 2: b, 3: a + b}
    return [(0, eth(0x9500, bytes([c, d]) + carried[d] + b"mux-tail")) for c in (1, 2, 3) for d in (0, 1, 2, 3)] + [
        (0, eth(0x0800, b"no sel"))
    ]


# ---------------------------------------------------------------- optional_match

OPT = "I.opt"


def opt_probe(kind: int, flags: int, vid: int) -> bytes:
    """optional_match.p4's probe header (pad, hit and hit2 zero)."""
    return struct.pack("!HBHBB", kind, flags, vid << 4, 0, 0)


async def optional_setup(c: Client, sch: P4Schema) -> None:
    kind, flags, vid = "hdr.probe.kind", "hdr.probe.flags", "hdr.probe.vid"
    rows = [  # (kind or None, flags, vid or None, priority, mark)
        (0x0800, 1, None, 10, 1),
        (None, 1, 0x123, 20, 2),
        (None, 2, None, 5, 3),
        (0x86DD, 2, 0xFFF, 30, 4),
    ]
    updates = []
    for k, f, v, prio, mark in rows:
        matches = [exact(sch, OPT, flags, f)]
        matches += [optional(sch, OPT, kind, k)] if k is not None else []
        matches += [optional(sch, OPT, vid, v)] if v is not None else []
        updates.append(update(p4r.Update.INSERT, entry(sch, OPT, matches, "I.mark", prio, v=mark)))
    await c.write(*updates)


def optional_frames() -> Frames:
    """Hits on one entry, on two (the higher priority wins), on none; the const table's entries likewise."""
    rows = [
        (0x0800, 1, 0x001),
        (0x0800, 1, 0x123),
        (0x1234, 1, 0x123),
        (0x1234, 2, 0x555),
        (0x86DD, 2, 0xFFF),
        (0x86DD, 3, 0xFFF),
        (0x0800, 3, 0x123),
    ]
    return [(0, eth(0x9600, opt_probe(*row) + b"opt-tail")) for row in rows]


async def optional_state(c: Client, sch: P4Schema) -> dict[str, object]:
    return {t: await table_text(c, sch, t) for t in (OPT, "I.opt_const")}


# ---------------------------------------------------------------- dead_table

DEAD = "I.dead"


async def dead_setup(c: Client, sch: P4Schema) -> None:
    key = "hdr.ethernet.etherType"
    await c.write(
        ins(sch, "I.live", "I.fwd", {key: 0x0800}, port=1), ins(sch, "I.live", "I.fwd", {key: 0x0806}, port=2)
    )


def dead_frames() -> Frames:
    """Two hits on the live table and a miss (egress_spec stays 0)."""
    return [(1, eth(0x0800, b"ip")), (1, eth(0x0806, b"arp")), (1, eth(0x1234, b"other"))]


async def dead_state(c: Client, sch: P4Schema) -> dict[str, object]:
    """What each write and read of the table the JSON lacks answers, and the live table read back."""
    key = [exact(sch, DEAD, "hdr.ethernet.srcAddr", 0x02000000000A)]
    dead = entry(sch, DEAD, key, "I.retag", t=0x9999)
    default = entry(sch, DEAD, [], "I.retag", t=0x9999)
    default.table_entry.is_default_action = True
    reset = entry(sch, DEAD, [])
    reset.table_entry.is_default_action = True
    table_id = sch.tables[DEAD].id
    return {
        "insert": await write_outcome(c, update(p4r.Update.INSERT, dead)),
        "modify": await write_outcome(c, update(p4r.Update.MODIFY, dead)),
        "delete": await write_outcome(c, update(p4r.Update.DELETE, dead)),
        "set default": await write_outcome(c, update(p4r.Update.MODIFY, default)),
        "reset default": await write_outcome(c, update(p4r.Update.MODIFY, reset)),
        "read table": await read_outcome(c, p4r.Entity(table_entry=p4r.TableEntry(table_id=table_id))),
        "read by key": await read_outcome(c, dead),
        "read default": await read_outcome(c, default),
        "read all tables": await read_outcome(c, p4r.Entity(table_entry=p4r.TableEntry())),
        "live": await table_text(c, sch, "I.live"),
    }
