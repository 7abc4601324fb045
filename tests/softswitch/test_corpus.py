"""The corpus programs on the embedded target, against expectations written by hand from bmv2's semantics.

Each program is set through P4Runtime, programmed with the entries of its case (corpus_cases.py),
and fed its frames through Device.process; outputs, counters, meters, registers and value sets
are checked against what simple_switch would do (the bmv2 source named in each comment).
Over 600 lines on purpose: one test per program, each beside the bmv2 behaviour it pins down.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from finsy.proto import p4d, p4r
from google.protobuf import text_format
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

from corpus_cases import (
    CASES,
    CORPUS,
    CPU_PORT,
    ROUTER_SRC,
    classify_entry,
    digest_id,
    elem_a,
    elem_b,
    embedded_step,
    eth,
    info,
    long_,
    meta_id,
    mpls,
    pipeline,
    register_entity,
    schema,
    short,
    stat,
    stream_messages,
    stream_view,
    vset_update,
)
from dpu_softswitch.errors import UnsupportedConstruct
from dpu_softswitch.program import Program
from dpu_softswitch.server import Device
from helpers.p4rt import Client, connect, detail_codes, update

InProcess = tuple[Device, grpc.aio.Channel]


async def programmed(target: InProcess, name: str) -> tuple[Device, Client]:
    """The in-process target with corpus program `name` set and its case's entries written."""
    device, channel = target
    c = await connect(channel, 5)
    await c.responses.get()
    await c.set_pipeline(pipeline(name))
    case, sch = CASES[name], schema(name)
    await case.setup(c, sch)
    await case.extra_setup(c, sch)
    return device, c


def run(device: Device, name: str) -> list[list[tuple[int, bytes]]]:
    """Every frame of the case through the device, in order."""
    return [device.process(port, frame) for port, frame in CASES[name].frames]


def crc16_arc(data: bytes) -> int:
    """CRC-16/ARC bit by bit (bmv2's crc16: poly 0x8005, reflected, init 0); check value 0xBB3D."""
    crc = 0
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


def test_crc16_reference() -> None:
    assert crc16_arc(b"123456789") == 0xBB3D


async def test_ipv4_checksums_and_routing(in_process_target: InProcess) -> None:
    device, _ = await programmed(in_process_target, "ipv4_csum")
    out = run(device, "ipv4_csum")
    frames = CASES["ipv4_csum"].frames

    def routed(frame: bytes, dmac: str, fix_checksum: bool) -> bytes:
        pkt = Ether(frame)
        pkt.src, pkt.dst = pkt.dst, dmac
        pkt[IP].ttl -= 1
        if fix_checksum:
            del pkt[IP].chksum
        return bytes(pkt)

    assert out[0] == [(2, routed(frames[0][1], "02:00:00:00:00:0c", True))]
    assert out[1] == []  # verify_checksum failed: checksum_error = 1, the program drops
    assert out[2] == []  # TTL 1
    assert out[3] == []  # no route: the default action drops
    assert out[4] == []  # not IPv4
    # ihl = 6: neither verify nor update runs (their condition is false), so the TTL changes and the
    # checksum does not (bmv2 computes checksums only where the program says).
    assert out[5] == [(2, routed(frames[5][1], "02:00:00:00:00:0c", False))]
    assert out[6] == [(3, routed(frames[6][1], "02:00:00:00:00:0d", True))]


async def test_header_stack_push_pop_and_indexes(in_process_target: InProcess) -> None:
    device, _ = await programmed(in_process_target, "header_stack")
    out = run(device, "header_stack")
    tail = b"payload!"
    # pop_front(1): the stack shifts up, the freed last element becomes invalid and is not emitted.
    assert out[0] == [(1, eth(0x8847, mpls(7, 1, 20) + info(depth=2, last_ttl=20) + tail))]
    # push_front(1) then setValid: the new element 0 is invalid after the push, so setValid zeroes it
    # (bmv2's add_header resets an invalid header) and tc reads 0.
    assert out[1] == [(1, eth(0x8847, mpls(300, 0, 64) + mpls(200, 1, 5, tc=3) + info(1, 5) + tail))]
    full = mpls(401, 0, 8, tc=5) + mpls(1, 0, 8) + mpls(2, 1, 7)  # tc: label == 401 ? 5 : 1
    assert out[2] == [(1, eth(0x8847, full + info(3, 7) + tail))]
    # A fourth label overflows the stack: StackOutOfBounds; parsing stops before it, so the rest of
    # the frame (the fourth label onwards) is payload; info is not valid.
    rest = mpls(6, 1, 4) + info() + tail
    assert out[3] == [(2, eth(0x8847, mpls(9, 0, 1) + mpls(8, 0, 2) + mpls(7, 0, 3) + rest))]
    # pick: hdr.mpls[meta.idx] with a runtime index (info.picked's low bits: 1), read and written.
    stack = mpls(500, 0, 1) + mpls(600, 0, 2, tc=7) + mpls(700, 1, 3)
    assert out[4] == [(1, eth(0x8847, stack + info(3, 3, picked=600) + tail))]
    assert out[5] == [(1, eth(0x0800, tail))]
    assert out[6] == [(1, eth(0x8847, info(1, 3) + tail))]  # popped to empty
    # push_front on a full stack: everything shifts down one and the last element falls off.
    assert out[7] == [(1, eth(0x8847, mpls(300, 0, 64) + mpls(200, 0, 4) + mpls(1, 0, 5) + info(3, 6) + tail))]


async def test_lookahead_and_value_set(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "lookahead_vset")
    out = run(device, "lookahead_vset")
    frames = CASES["lookahead_vset"].frames

    def res(path: int, peek: int, kind: int) -> bytes:
        return struct.pack("!BHB", path, peek, kind)

    assert out[0] == [(1, eth(0x88B5, res(1, 0x0309, 3) + b"\x03\x09rest"))]  # member: the tag is parsed
    assert out[1] == [(1, frames[1][1][:14] + res(4, 0x4500, 0xFF) + frames[1][1][14:])]
    assert out[2] == [(1, frames[2][1][:14] + res(6, 0x6000, 0xFF) + frames[2][1][14:])]
    assert out[3] == [(1, eth(0x1234, res(0, 0x1234, 0xFF) + b"\x12\x34\x56"))]
    # One byte after ethernet: lookahead<bit<16>> raises PacketTooShort (bmv2 checks the bytes it
    # peeks), the packet goes on with parser_error set and the byte as payload.
    assert out[4] == [(1, eth(0x9999, res(0, 0, 0xFF) + b"\x07"))]
    # The members read back as written; an empty write removes them all.
    [ent] = await c.read(p4r.Entity(value_set_entry=p4r.ValueSetEntry()))
    assert sorted(m.match[0].exact.value for m in ent.value_set_entry.members) == [b"\x88\xb5", b"\x99\x99"]
    sch = schema("lookahead_vset")
    await c.write(vset_update(sch, []))
    assert device.process(0, frames[0][1]) == [(1, eth(0x88B5, res(0, 0x0309, 0xFF) + b"\x03\x09rest"))]
    with pytest.raises(grpc.aio.AioRpcError) as err:  # more members than the value set's size
        await c.write(vset_update(sch, list(range(5))))
    assert detail_codes(err.value) == [grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]]


async def test_hash_algorithms(in_process_target: InProcess) -> None:
    device, _ = await programmed(in_process_target, "hashes")
    out = run(device, "hashes")
    for (_, frame), got in zip(CASES["hashes"].frames, out, strict=True):
        src, a_b, cd = frame[6:12], frame[14:20], frame[20]
        words = [int.from_bytes(a_b[k : k + 2], "big") for k in range(0, 6, 2)]
        s = sum(words)
        while s >> 16:
            s = (s & 0xFFFF) + (s >> 16)
        xor = words[0] ^ words[1] ^ words[2]
        # 12 bits of input ({c, b[7:0]}) are packed and padded with 4 zero bits at the tail.
        odd_input = (((cd >> 4) << 8 | a_b[5]) << 4).to_bytes(2, "big")
        res = struct.pack(
            "!HIHIHHHIQHB",
            crc16_arc(a_b),
            zlib.crc32(a_b),
            crc16_arc(a_b),  # crc16_custom starts with crc16's parameters
            zlib.crc32(a_b),  # crc32_custom likewise
            int.from_bytes(a_b[4:6], "big"),  # identity
            ~s & 0xFFFF,
            xor,
            100 + zlib.crc32(a_b + bytes([cd])) % 1000,
            int.from_bytes(src + a_b[4:6], "big") % (2**64 - 1),  # identity keeps the first 8 of 9 bytes
            crc16_arc(a_b),  # update_checksum with HashAlgorithm.crc16
            crc16_arc(odd_input) % 256,
        )
        assert got == [(1, frame[:21] + res + frame[21:])]


async def test_direct_counter_and_meter(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "direct_res")
    out = run(device, "direct_res")
    big = CASES["direct_res"].frames[0][1]

    def colored(frame: bytes, color: int) -> bytes:
        return frame[:6] + bytes([color]) + frame[7:]

    # cburst 1200, pburst 2500 at 1 byte/s: 1014 bytes green, then yellow (CIR bucket short), then red.
    assert out[0] == [(1, colored(big, 0))]
    assert out[1] == [(1, colored(big, 1))]
    assert out[2] == []  # red: the program drops
    assert out[3] == [(2, colored(CASES["direct_res"].frames[3][1], 0))]  # no meter config: green
    assert out[4] == []  # miss: the default action drops; the meter is not executed, nothing counted
    state = await CASES["direct_res"].state(c, schema("direct_res"))
    assert state == {
        "counter 0x0800": (3, 3 * 1014),  # a hit counts whatever the colour
        "meter 0x0800": (1, 1200, 1, 2500),
        "counter 0x0806": (1, 64),
        "meter 0x0806": (0, 0, 0, 0),
    }
    sch = schema("direct_res")
    te = classify_entry(sch, 0x0806, "I.fwd", port=2).table_entry
    te.ClearField("action")
    dc = p4r.DirectCounterEntry(table_entry=te, data=p4r.CounterData(packet_count=10, byte_count=1000))
    await c.write(update(p4r.Update.MODIFY, p4r.Entity(direct_counter_entry=dc)))
    device.process(0, CASES["direct_res"].frames[3][1])
    state = await CASES["direct_res"].state(c, sch)
    assert state["counter 0x0806"] == (11, 1064)
    read = p4r.TableEntry(table_id=te.table_id)
    read.counter_data.SetInParent()
    entries = await c.read(p4r.Entity(table_entry=read))
    assert sorted(e.table_entry.counter_data.packet_count for e in entries) == [3, 11]


async def test_registers_and_exit_and_egress_drop(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "registers_exit")
    out = run(device, "registers_exit")
    frames = CASES["registers_exit"].frames
    assert out[0] == [(1, eth(0x9000, stat(0, 0x0F) + b"x"))]  # 1|2 in ingress, 4|8 in egress
    # exit in ingress skips the rest of ingress only; egress runs.
    assert out[1] == [(1, eth(0x0001, stat(1, 0x1D) + b"x"))]
    assert out[2] == []  # mark_to_drop in egress: simple_switch drops when egress_spec is 511 after egress
    assert out[3] == [(1, eth(0x0003, stat(19, 0x07) + b"x"))]  # exit in egress skips the last mark
    assert out[4] == [(1, eth(0x9000, stat(0, 0x0F) + b"y"))]
    assert out[5] == [(1, eth(0x9000, stat(0, 0x4F) + b"z"))]
    sch = schema("registers_exit")
    cells = await c.read(register_entity(sch))
    assert [int.from_bytes(e.register_entry.data.bitstring, "big") for e in cells] == [20, 1, 0x41, 0]
    await c.write(update(p4r.Update.MODIFY, register_entity(sch, 2, 77)))
    [cell] = await c.read(register_entity(sch, 2))
    assert cell.register_entry.data.bitstring == bytes([77])
    assert device.process(2, frames[5][1]) == [(1, eth(0x9000, stat(77, 0x4F) + b"z"))]


async def test_multicast_clone_resubmit_recirculate(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "replication")
    out = run(device, "replication")

    def frame(ethertype: int, itype: int, rid: int, port: int, passes: int, dst: bytes = b"\0\0") -> bytes:
        # egress stamps instance_type, egress_rid, egress_port and the preserved passes into srcAddr;
        # ingress writes the (unpreserved) scratch byte and its instance_type into dstAddr's first bytes.
        src = struct.pack("!BHHB", itype, rid, port, passes)
        return dst + bytes.fromhex("0000000b") + src + struct.pack("!H", ethertype) + b"r" * 10

    assert out[0] == [(1, frame(0x0001, 0, 0, 1, 0))]
    # Multicast group 5: one copy per replica, instance_type REPLICATION (5), egress_rid the instance.
    assert sorted(out[1]) == [
        (1, frame(0x0002, 5, 1, 1, 0)),
        (2, frame(0x0002, 5, 1, 2, 0)),
        (3, frame(0x0002, 5, 2, 3, 0)),
    ]
    # I2E clone to session 4: the clone is parsed again from the received frame (so ingress's write to
    # dstAddr is not in it), instance_type INGRESS_CLONE (1), egress_rid the replica's instance.
    assert sorted(out[2]) == [(1, frame(0x0003, 0, 0, 1, 0)), (2, frame(0x0003, 1, 3, 2, 0, dst=b"\x02\0"))]
    # Resubmitted twice with `passes` preserved; the third pass (instance_type RESUBMIT, 6, in ingress)
    # goes to port 3, and leaves ingress unicast, so egress sees instance_type NORMAL (simple_switch).
    assert out[3] == [(3, frame(0x0004, 0, 0, 3, 2, dst=b"\0\x06"))]
    # E2E clone to session 7: a copy of the packet as egress left it, metadata reset but for the field list.
    assert sorted(out[4]) == [(2, frame(0x0E2E, 0, 0, 2, 0)), (3, frame(0x0E2E, 2, 9, 3, 0))]
    # Recirculated with passes = 9: ingress (instance_type RECIRC, 4) sends it to port 3.
    assert out[5] == [(3, frame(0x0ECC, 0, 0, 3, 9, dst=b"\0\x04"))]
    assert out[6] == []
    state = await CASES["replication"].state(c, schema("replication"))
    assert state == {"multicast_group_entry": [(1, 1), (2, 1), (3, 2)], "clone_session_entry": [(2, 3)]}


def union_reference(frame: bytes) -> bytes:
    """What bmv2 sends for one header_union.p4 frame, written out from bmv2's HeaderUnion rules.

    A member made valid (extract, setValid, assign_header from a valid source) invalidates its peer,
    whose fields stay as they were; setValid zeroes a member only if it was invalid; assign_header
    from an invalid source only invalidates the destination; a union is valid when a member is.
    """
    etype = struct.unpack_from("!H", frame, 12)[0]
    op, body = frame[14], frame[20:]
    hdr: dict[str, list[int]] = {m: [0, 0, 0] for m in ("a.s", "a.l", "b.s", "b.l")}  # valid, kind, addr

    def make_valid(m: str) -> None:
        hdr[m][0] = 1
        hdr[("a." if m[0] == "a" else "b.") + ("l" if m[2] == "s" else "s")][0] = 0

    def extract(m: str) -> None:
        nonlocal body
        n = 5 if m[2] == "s" else 17
        hdr[m][1:] = [body[0], int.from_bytes(body[1:n], "big")]
        body = body[n:]
        make_valid(m)

    def set_valid(m: str) -> None:
        if not hdr[m][0]:
            hdr[m][1:] = [0, 0]
            make_valid(m)

    def assign(dst: str, src: str) -> None:
        if not hdr[src][0]:
            hdr[dst][0] = 0
            return
        make_valid(dst)
        hdr[dst][1:] = hdr[src][1:]

    for m in {0x9004: ["a.s"], 0x9006: ["a.l"], 0x9046: ["a.s", "a.l"], 0x9044: ["a.s", "b.s"]}.get(etype, []):
        extract(m)
    if op == 1:
        set_valid("a.l")
        hdr["a.l"][1:] = [(hdr["a.s"][1] + 1) & 0xFF, hdr["a.s"][2]]
    elif op == 2:
        set_valid("a.s")
        hdr["a.s"][2] = hdr["a.l"][2] & 0xFFFFFFFF
    elif op == 3:
        assign("b.s", "a.s")
        assign("b.l", "a.l")
    elif op == 4:
        assign("b.s", "a.s")
    elif op == 5:
        hdr["a.s"][0] = 0
    elif op == 6:
        set_valid("a.s")
        set_valid("b.l")
        hdr["b.l"][1] = 0x77
    v = {m: h[0] for m, h in hdr.items()}
    seen = sum(
        bit
        for bit, on in (
            (1, v["a.s"] or v["a.l"]),
            (2, v["a.s"]),
            (4, v["a.l"]),
            (8, v["b.s"] or v["b.l"]),
            (16, v["b.s"]),
            (32, v["b.l"]),
        )
        if on
    )
    low = hdr["a.s"][2] if v["a.s"] or etype == 0x9046 else 0
    out = frame[:14] + struct.pack("!BBI", op, seen, low)
    for m in ("a.s", "a.l", "b.s", "b.l"):
        if hdr[m][0]:
            out += short(*hdr[m][1:]) if m[2] == "s" else long_(*hdr[m][1:])
    return out + body


async def test_header_unions(in_process_target: InProcess) -> None:
    device, _ = await programmed(in_process_target, "header_union")
    frames = CASES["header_union"].frames
    assert [out for out in run(device, "header_union")] == [[(1, union_reference(f))] for _, f in frames]
    # Spot checks of the reference itself: the parser's second extract displaces a.s but keeps its address.
    displaced = next(f for _, f in frames if f[12:15] == b"\x90\x46\x00")
    assert union_reference(displaced)[15:20] == bytes([1 | 4]) + struct.pack("!I", 0x0A000003)  # a, a.l valid
    widened = next(f for _, f in frames if f[12:15] == b"\x90\x04\x01")
    assert union_reference(widened)[20:] == long_(4, 0x0A000001) + b"union-tail"


async def test_assign_union_is_member_by_member(in_process_target: InProcess) -> None:
    # p4c 1.2.4 writes `hdr.b = hdr.a` as one assign_header per member; bmv2 also takes it as one
    # assign_union primitive, which must do the same.
    doc = _doc("header_union")
    action = next(a for a in doc["actions"] if a["name"] == "I.copy_union")
    action["primitives"] = [
        {
            "op": "assign_union",
            "parameters": [{"type": "header_union", "value": "b"}, {"type": "header_union", "value": "a"}],
        }
    ]
    device, c = await programmed(in_process_target, "header_union")
    cfg = pipeline("header_union")
    cfg.p4_device_config = json.dumps(doc).encode()
    await c.set_pipeline(cfg)
    await CASES["header_union"].setup(c, schema("header_union"))
    frames = [f for _, f in CASES["header_union"].frames if f[14] == 3]  # op 3: copy_union
    assert len(frames) == 5
    assert [device.process(0, f) for f in frames] == [[(1, union_reference(f))] for f in frames]


def union_stack_reference(frame: bytes) -> bytes:
    """What bmv2 sends for one header_union_stack.p4 frame, written out from bmv2's rules.

    Extraction fills the next union's member; a fourth element is StackOutOfBounds, which ends
    parsing there (ingress still runs). push_front and pop_front swap whole unions but leave the
    unions shifted in as they are (bmv2's HeaderUnion::mark_invalid is empty): the stack rotates.
    """
    if frame[12:14] != b"\x91\x00":
        return frame
    op, rest = frame[14], frame[16:]
    us = [{"a": [0, 0, 0], "b": [0, 0, 0]} for _ in range(3)]  # member -> [valid, tag, value]
    nxt = 0
    while rest[:1] in (b"\x01", b"\x02") and nxt < 3:
        member, n = ("a", 2) if rest[0] == 1 else ("b", 3)
        us[nxt][member] = [1, rest[0], int.from_bytes(rest[1:n], "big")]
        us[nxt]["b" if member == "a" else "a"][0] = 0
        rest, nxt = rest[n:], nxt + 1

    def shift(pairs: list[tuple[int, int]]) -> None:
        for i, j in pairs:
            us[i], us[j] = us[j], us[i]

    if op in (1, 2):
        shift([(i, i + op) for i in range(3 - op)])
    elif op == 3:
        shift([(i, i - 1) for i in range(2, 0, -1)])
    elif op == 4:
        if not us[1]["b"][0]:
            us[1]["b"], us[1]["a"][0] = [1, 0, 0], 0
        us[1]["b"][1:] = [2, 0xBEEF]
    seen = sum(1 << i for i in range(3) if us[i]["b"][0])
    seen |= sum(16 << i for i in range(3) if us[i]["a"][0])
    out = frame[:14] + bytes([op, seen])
    for u in us:
        if u["a"][0]:
            out += bytes(u["a"][1:])
        if u["b"][0]:
            out += bytes([u["b"][1]]) + u["b"][2].to_bytes(2, "big")
    return out + rest


async def test_header_union_stacks(in_process_target: InProcess) -> None:
    device, _ = await programmed(in_process_target, "header_union_stack")
    frames = CASES["header_union_stack"].frames
    assert run(device, "header_union_stack") == [[(1, union_stack_reference(f))] for _, f in frames]
    # The rotation itself: pushing onto a full stack brings its last union (valid) to the front.
    full = next(f for _, f in frames if f[14] == 3 and f[16:23] == elem_a(0x11) + elem_b(0x2222) + elem_a(0x33))
    assert (
        union_stack_reference(full)[15:]
        == bytes([4 | 16 | 32]) + elem_a(0x33) + elem_a(0x11) + elem_b(0x2222) + b"\x00stack-tail"
    )


def test_union_stack_field_as_parser_key() -> None:
    # bmv2's union_stack_field key (the last union's member field): p4c 1.2.4 does not emit it (see
    # header_union_stack.p4), so the state that ends the stack on a.x == 0xff is added to the JSON.
    doc = _doc("header_union_stack")
    take_a = next(s for s in doc["parsers"][0]["parse_states"] if s["name"] == "take_a")
    take_a["transition_key"] = [{"type": "union_stack_field", "value": ["us", "a", "x"]}]
    take_a["transitions"] = [
        {"type": "hexstr", "value": "0xff", "mask": None, "next_state": None},
        {"type": "default", "value": None, "mask": None, "next_state": "next"},
    ]
    program = Program(doc)
    for x, seen in ((0xFF, 16), (0xFE, 16 | 32)):  # stopped after one union, or two parsed
        frame = eth(0x9100, bytes([0, 0]) + elem_a(x) + elem_a(1) + b"\x00")
        assert program.process(0, frame) == [(1, frame[:15] + bytes([seen]) + frame[16:])]


async def test_action_profile_and_selectors(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "action_selector")
    out = run(device, "action_selector")
    frames = [f for _, f in CASES["action_selector"].frames]

    def routed(frame: bytes, port: int) -> bytes:
        # set_nhop: destination MAC 02:00:00:00:01:<port>, route()'s source MAC, TTL - 1 (no checksum update).
        head = (0x020000000100 + port).to_bytes(6, "big") + ROUTER_SRC.to_bytes(6, "big") + frame[12:22]
        return head + bytes([frame[22] - 1]) + frame[23:]

    assert out[0] == [(1, frames[0])]  # l2's member 1: to_port(1)
    assert out[1] == []  # member 3: drop
    # l2 misses: p4c gives bmv2 no default action for a table with an action profile, so none runs (the
    # P4 default_action and the P4Info's initial_default_action notwithstanding); egress_spec stays 0.
    assert out[2] == [(0, frames[2])]
    assert out[3] == [(0, frames[3][:6] + ROUTER_SRC.to_bytes(6, "big") + frames[3][12:])]  # route, not IPv4
    # ecmp's group 100 holds members 10, 11 (weight 2) and 12; bmv2 chooses among their copies in handle
    # order: member 12 (made first), 10, 11, then 11's second copy (made by the group MODIFY), so port
    # 3, 1, 2, 2 for crc16(srcAddr, protocol, srcPort, dstPort) % 4.
    group_ports = [3, 1, 2, 2]
    for k in range(12):
        f = frames[4 + k]
        h = crc16_arc(f[26:30] + f[23:24] + f[34:38])
        assert out[4 + k] == [(group_ports[h % 4], routed(f, group_ports[h % 4]))], k
    assert len({p for o in out[4:16] for p, _ in o}) == 3  # the flows spread over all three ports
    tcp = frames[16]  # no UDP header: its fields are left out of the hash input
    port = group_ports[crc16_arc(tcp[26:30] + tcp[23:24]) % 4]
    assert out[16] == [(port, routed(tcp, port))]
    assert out[17] == [(3, routed(frames[17], 3))]  # 10.2/16: member 12 itself
    assert out[18] == [(4, routed(frames[18], 4))]  # 10.3/16: group 101, member 13 alone
    assert out[19] == [(0, frames[19][:6] + ROUTER_SRC.to_bytes(6, "big") + frames[19][12:])]  # lb, ecmp miss
    # lb's one-shot set: set_nhop(5) twice (weight 2), then set_nhop(6), chosen by crc32(srcAddr, dstPort) % 3.
    for k in range(8):
        f = frames[20 + k]
        port = [5, 5, 6][zlib.crc32(f[26:30] + f[36:38]) % 3]
        assert out[20 + k] == [(port, routed(f, port))], k
    state = await CASES["action_selector"].state(c, schema("action_selector"))
    assert [_field(m, "member_id") for m in state["members I.ap"]] == [1, 2, 3]
    # A wildcard read lists every bmv2 member, copies included, in handle order (PI reads them so).
    assert [_field(m, "member_id") for m in state["members I.sel"]] == [12, 10, 11, 13, 11]
    assert [_field(m, "member_id") for m in state["member 11"]] == [11]
    assert [_field(g, "group_id") for g in state["groups I.sel"]] == [100, 101]
    assert "members { member_id: 11 weight: 2 }" in str(state["groups I.sel"][0])
    assert len(state["table I.lb"]) == 1 and "weight: 2" in str(state["table I.lb"][0])
    assert state["members of all profiles"] == "INVALID_ARGUMENT"  # I.sel2 is programmed one-shot


def _field(text: object, name: str) -> int:
    """An integer field of a one-line text-format message (its first occurrence)."""
    return int(str(text).split(f"{name}: ", 1)[1].split()[0])


async def test_indirect_counters_and_meters(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "indirect_res")
    out = run(device, "indirect_res")
    # Cell 0 (nothing refills): 1017 B fits the 1200 B committed bucket once, the 2500 B peak bucket
    # twice; one packet fits the committed bucket, two the peak one: green, yellow, red for both.
    # Cell 1 is loose and cell 2 unconfigured (green, as bmv2 marks an unconfigured meter).
    assert [o[0][1][14:17] for o in out[:6]] == [
        bytes([0, 0, 0]),
        bytes([0, 1, 1]),
        bytes([0, 2, 2]),
        bytes([1, 0, 0]),
        bytes([2, 0, 0]),
        bytes([2, 0, 0]),
    ]
    assert all(len(o) == 1 and o[0][0] == 1 for o in out)
    state = await CASES["indirect_res"].state(c, schema("indirect_res"))
    # Every counter type reads back packets and bytes (PI reads both from bmv2 whatever the type).
    cells = [(0, 3, 3 * 1017), (1, 1, 77), (2, 2, 1017 + 27), (3, 0, 0)]
    assert {k: state[k] for k in ("I.by_packets", "I.by_bytes", "I.by_both")} == dict.fromkeys(
        ("I.by_packets", "I.by_bytes", "I.by_both"), cells
    )
    assert state["I.packet_meter"] == [(0, 0, 2), (1, 1000, 1000), (2, 0, 0), (3, 0, 0)]


async def test_unsupported_construct_is_refused_at_set_pipeline(in_process_target: InProcess) -> None:
    _, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    cfg = pipeline("ipv4_csum")
    doc = _doc("ipv4_csum")
    _with_saturating_field(doc)
    cfg.p4_device_config = json.dumps(doc).encode()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.set_pipeline(cfg)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "saturating field" in (err.value.details() or "")


async def test_digest_program(in_process_target: InProcess) -> None:
    device, c = await programmed(in_process_target, "digest")
    sch = schema("digest")
    frames = [f for _, f in CASES["digest"].frames]
    assert run(device, "digest") == [[(1, f)] if i != 2 else [] for i, f in enumerate(frames)]
    mac, flow = digest_id(sch, "mac_learn_t"), digest_id(sch, "flow_t")
    a, cc = b"\x02\0\0\0\0\x0a", b"\x02\0\0\0\0\x0c"
    # The repeat of the first frame is cached (sent, not acked); the dropped frame is learned; the known
    # source is not; the flow frame's digest is flow_t's alone (the later call), with mark 1: p4c's
    # temporaries hold the values of the call.
    want = [
        ("digest", mac, 1, (struct_data(a, b"\0"),)),
        ("digest", mac, 2, (struct_data(cc, b"\0"),)),
        ("digest", mac, 3, (struct_data(a, b"\x02"),)),
        ("digest", flow, 1, (struct_data(b"\x88\xb6", b"\x01", b"\x0a\xbc"),)),
    ]
    assert stream_view(await stream_messages(c)) == want
    steps = CASES["digest"].steps(sch)
    out = [await embedded_step(step, device, c) for step in steps]
    assert out == [[], [(1, steps[1][1])], [(1, steps[2][1])]]  # type: ignore[index]
    # Acked, the first list's sample goes again; flow_t's sample is still cached, and replaces mac_learn_t's.
    assert stream_view(await stream_messages(c)) == [("digest", mac, 4, (struct_data(a, b"\0"),))]


def test_learn_lists_are_sampled_at_the_end_of_ingress_also_by_the_interpreter() -> None:
    """flow_t's learn list edited to name the metadata fields (as a compiler without temporaries would):
    the sample holds the mark set after digest(), as simple_switch samples at the end of ingress; and
    with a jump in the action, the interpreter's generate_digest is what runs."""
    doc = _doc("digest")
    [flow_list] = [ll for ll in doc["learn_lists"] if ll["name"] == "flow_t"]
    flow_list["elements"] = [
        {"type": "field", "value": ["scalars", f"metadata_t._flow_{name}"]} for name in ("etherType0", "mark1", "vid2")
    ]
    [action] = [a for a in doc["actions"] if any(_learns(p, "0x2") for p in a["primitives"])]
    action["primitives"].insert(0, {"op": "_jump", "parameters": [{"type": "hexstr", "value": 1}]})
    program = Program(doc)
    learned: list[tuple[int, list[int]]] = []
    program.on_learn = lambda lid, values: learned.append((lid, values))
    program.process(1, eth(0x88B6, b"f" * 20, src="02:00:00:00:00:0d"))
    assert learned == [(2, [0x88B6, 2, 0xABC])]


def _learns(prim: dict[str, Any], learn_id: str) -> bool:
    return prim["op"] == "generate_digest" and prim["parameters"][1]["value"] == learn_id


def struct_data(*members: bytes) -> str:
    """A P4Data struct of bitstring members, as stream_view shows it."""
    data = p4d.P4Data()
    for m in members:
        data.struct.members.add().bitstring = m
    return text_format.MessageToString(data, as_one_line=True)


async def test_packet_io_program(in_process_target: InProcess) -> None:
    in_process_target[0].cpu_port = CPU_PORT
    device, c = await programmed(in_process_target, "packet_io")
    sch = schema("packet_io")
    frames = [f for _, f in CASES["packet_io"].frames]
    assert run(device, "packet_io") == [[(1, frames[0])], [], [], []]

    def packet_in(payload: bytes, port: int, reason: int) -> tuple[object, ...]:
        ids = [meta_id(sch, "packet_in", n) for n in ("ingress_port", "reason", "_pad")]
        values = [port.to_bytes(2, "big").lstrip(b"\0") or b"\0", bytes([reason]), b"\0"]
        return ("packet_in", payload.hex(), tuple(sorted((i, v.hex()) for i, v in zip(ids, values, strict=True))))

    # With its packet_in header: ingress port 3, reason 5. Punted bare: PI still takes the first two
    # bytes (02 00: port 4, reason 0) for the header the program did not emit.
    assert stream_view(await stream_messages(c)) == [packet_in(frames[1], 3, 5), packet_in(frames[2][2:], 4, 0)]
    steps = CASES["packet_io"].steps(sch)
    out = [await embedded_step(step, device, c) for step in steps]
    frame = steps[0].payload  # type: ignore[union-attr]
    tagged = frame[:12] + b"\x88\xb5" + frame[14:]
    assert out == [[(2, frame)], [(3, tagged)], [], [(0, frame)], [(1, frame)], [], [], []]
    last = steps[-1][1]  # type: ignore[index]
    assert stream_view(await stream_messages(c)) == [packet_in(frame[2:], 4, 0), packet_in(last, 1, 5)]


def _doc(name: str) -> dict[str, Any]:
    return json.loads((CORPUS / f"{name}.json").read_text())  # type: ignore[no-any-return]


def _with_old_profile(doc: dict[str, Any]) -> None:
    # bmv2's old JSON format: the indirect table names its own profile (act_prof_name).
    table = doc["pipelines"][0]["tables"][0]
    table["type"], table["act_prof_name"] = "indirect", "ap"


def _with_timeout(doc: dict[str, Any]) -> None:
    doc["pipelines"][0]["tables"][0]["support_timeout"] = True


def _with_saturating_field(doc: dict[str, Any]) -> None:
    # P4_14's saturating field attribute (bmv2 clamps what is written to it); p4c never writes it for P4_16.
    fields = doc["header_types"][2]["fields"]
    fields[0] = [*fields[0][:2], False, True]


def _with_random_hash(doc: dict[str, Any]) -> None:
    doc["calculations"][0]["algo"] = "round_robin"


def _with_advance(doc: dict[str, Any]) -> None:
    # An advance without its amount: bmv2 refuses it too (P4Objects::init_parsers).
    doc["parsers"][0]["parse_states"][0]["parser_ops"].append({"op": "advance", "parameters": []})


def _with_runtime_data_index(doc: dict[str, Any]) -> None:
    # What p4c 1.2.4 emits for hdr.mpls[i] with i an action parameter; simple_switch cannot load it.
    pick = next(a for a in doc["actions"] if a["name"] == "I.pick")
    deref = pick["primitives"][1]["parameters"][0]["value"]["value"]["left"]["value"]
    assert deref["op"] == "dereference_header_stack"
    deref["right"] = {"type": "runtime_data", "value": 0}


@pytest.mark.parametrize(
    ("name", "mutate", "construct"),
    [
        ("ipv4_csum", _with_old_profile, "old JSON format"),
        ("ipv4_csum", _with_timeout, "idle timeout"),
        ("ipv4_csum", _with_saturating_field, "saturating field"),
        ("hashes", _with_random_hash, "hash algorithm round_robin"),
        ("ipv4_csum", _with_advance, "advance without one"),
        ("header_stack", _with_runtime_data_index, "runtime_data inside an expression"),
    ],
)
def test_unimplemented_json_constructs_are_named(
    name: str, mutate: Callable[[dict[str, Any]], None], construct: str
) -> None:
    doc = _doc(name)
    mutate(doc)
    with pytest.raises(UnsupportedConstruct, match=construct):
        Program(doc)
