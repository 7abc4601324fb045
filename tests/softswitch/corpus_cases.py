"""The corpus under tests/softswitch/corpus: for each program, how to program it and which frames to send.

Shared by test_corpus.py (the embedded target against hand-written expectations) and
test_corpus_differential.py (the embedded target against simple_switch_grpc). A case's `setup`
uses only what both targets' P4Runtime servers implement; a case's `extra_setup` adds what only
the embedded target serves (simple_switch_grpc answers UNIMPLEMENTED for RegisterEntry and
ValueSetEntry, see PI's DeviceMgr).

Over 600 lines on purpose: it is data, one case per corpus program, and a case reads best whole.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from finsy import P4Schema
from finsy.proto import p4r
from google.protobuf import text_format
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

import corpus_semantics_cases as semantics
import corpus_table_cases as tables
from corpus_table_cases import MAC_A, MAC_B, eth, ins  # shared by the whole corpus
from dpu_softswitch.server import Device
from helpers.p4rt import Client, table_entry, update

CORPUS = Path(__file__).resolve().parent / "corpus"

Setup = Callable[[Client, P4Schema], Awaitable[None]]
State = Callable[[Client, P4Schema], Awaitable[dict[str, object]]]
# After a case's frames: more frames (ingress port, bytes), PacketOuts and DigestListAcks, in order.
Step = tuple[int, bytes] | p4r.PacketOut | p4r.DigestListAck
Steps = Callable[[P4Schema], list[Step]]
Frames = list[tuple[int, bytes]]


def pipeline(name: str, cookie: int = 7) -> p4r.ForwardingPipelineConfig:
    """The corpus program's ForwardingPipelineConfig (its JSON and P4Info)."""
    cfg = p4r.ForwardingPipelineConfig(p4_device_config=semantics.program_json(name))
    text_format.Parse((CORPUS / f"{semantics.committed(name)}.p4info.txtpb").read_text(), cfg.p4info)
    cfg.cookie.cookie = cookie
    return cfg


def schema(name: str) -> P4Schema:
    """finsy's view of the program's P4Info, for encoding entities by name."""
    base = semantics.committed(name)
    return P4Schema(CORPUS / f"{base}.p4info.txtpb", CORPUS / f"{base}.json")


async def _nothing(c: Client, sch: P4Schema) -> None:
    return None


async def _no_state(c: Client, sch: P4Schema) -> dict[str, object]:
    return {}


def _no_steps(sch: P4Schema) -> list[Step]:
    return []


@dataclass
class Case:
    """One corpus program: its entries, frames (ingress port, bytes) and the state worth comparing."""

    name: str
    frames: list[tuple[int, bytes]]
    setup: Setup = _nothing
    extra_setup: Setup = _nothing
    state: State = _no_state
    ports: tuple[int, ...] = (0, 1, 2, 3)
    notes: list[str] = field(default_factory=list)
    steps: Steps = _no_steps
    cpu_port: int | None = None  # the target's --cpu-port
    stream: bool = False  # the PacketIns and DigestLists the primary controller receives are compared too


class Collector:
    """A device listener that keeps the stream messages the device sends (as Device.listeners wants)."""

    def __init__(self) -> None:
        self.messages: list[p4r.StreamMessageResponse] = []

    def stream_message(self, msg: p4r.StreamMessageResponse) -> None:
        """Keep it."""
        self.messages.append(msg)

    def timers_changed(self) -> None:
        """Nothing to wake."""


def stream_request(step: p4r.PacketOut | p4r.DigestListAck) -> p4r.StreamMessageRequest:
    """The stream message that carries a PacketOut or DigestListAck step."""
    req = p4r.StreamMessageRequest()
    if isinstance(step, p4r.PacketOut):
        req.packet.CopyFrom(step)
    else:
        req.digest_ack.CopyFrom(step)
    return req


async def embedded_step(step: Step, device: Device, c: Client) -> Frames:
    """One step on the in-process target (through client `c`): what it sent out of its ports."""
    if isinstance(step, tuple):
        return device.process(*step)
    sent: Frames = []
    device.transmit = lambda port, frame: sent.append((port, frame))
    c.requests.put_nowait(stream_request(step))
    await asyncio.sleep(0.1)  # the server's stream reader takes it
    device.transmit = None
    return sent


async def stream_messages(c: Client, wait: float = 0.3) -> list[p4r.StreamMessageResponse]:
    """Every stream message the client gets within `wait` seconds."""
    out = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while (left := deadline - loop.time()) > 0:
        try:
            out.append(await asyncio.wait_for(c.responses.get(), left))
        except TimeoutError:
            break
    return out


def stream_view(msgs: list[p4r.StreamMessageResponse]) -> list[tuple[object, ...]]:
    """PacketIns and DigestLists as comparable tuples (no timestamps); anything else is left out."""
    out: list[tuple[object, ...]] = []
    for m in msgs:
        if m.HasField("packet"):
            meta = sorted((md.metadata_id, md.value.hex()) for md in m.packet.metadata)
            out.append(("packet_in", m.packet.payload.hex(), tuple(meta)))
        elif m.HasField("digest"):
            d = m.digest
            data = tuple(text_format.MessageToString(x, as_one_line=True) for x in d.data)
            out.append(("digest", d.digest_id, d.list_id, data))
    return out


# ---------------------------------------------------------------- ipv4_csum


async def ipv4_setup(c: Client, sch: P4Schema) -> None:
    await c.write(
        ins(sch, "I.routes", "I.route", {"hdr.ipv4.dstAddr": "10.0.2.0/24"}, port=2, dmac=0x02000000000C),
        ins(sch, "I.routes", "I.route", {"hdr.ipv4.dstAddr": "10.0.0.0/8"}, port=3, dmac=0x02000000000D),
    )


def ipv4(dst: str, **kw: object) -> IP:
    """An IPv4 packet from 10.0.1.1 carrying UDP."""
    return IP(src="10.0.1.1", dst=dst, **kw) / UDP(sport=1, dport=2) / Raw(b"p" * 20)  # type: ignore[arg-type]


def ipv4_frames() -> list[tuple[int, bytes]]:
    """Routed, bad checksum, TTL 1, no route, not IPv4, options (no checksum work), wider prefix."""
    return [
        (0, bytes(Ether(src=MAC_A, dst=MAC_B) / ipv4("10.0.2.5", ttl=64))),
        (0, bytes(Ether(src=MAC_A, dst=MAC_B) / ipv4("10.0.2.5", ttl=64, chksum=0x1234))),
        (0, bytes(Ether(src=MAC_A, dst=MAC_B) / ipv4("10.0.2.5", ttl=1))),
        (0, bytes(Ether(src=MAC_A, dst=MAC_B) / ipv4("11.0.0.1"))),
        (0, bytes(Ether(src=MAC_A, dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="10.0.2.5"))),
        (1, bytes(Ether(src=MAC_A, dst=MAC_B) / ipv4("10.0.2.6", ttl=9, options=[b"\x01\x01\x01\x01"]))),
        (1, bytes(Ether(src=MAC_A, dst=MAC_B) / ipv4("10.9.9.9", ttl=2))),
    ]


# ---------------------------------------------------------------- header_stack


def mpls(label: int, bos: int, ttl: int, tc: int = 0) -> bytes:
    """One MPLS label stack entry."""
    return struct.pack("!I", (label << 12) | (tc << 9) | (bos << 8) | ttl)


def info(depth: int = 0, last_ttl: int = 0, picked: int = 0) -> bytes:
    """header_stack.p4's info header."""
    return struct.pack("!BBI", depth, last_ttl, picked)


async def stack_setup(c: Client, sch: P4Schema) -> None:
    key = "hdr.mpls[0].label"
    await c.write(
        ins(sch, "I.labels", "I.pop", {key: 100}),
        ins(sch, "I.labels", "I.push", {key: 200}, label=300),
        ins(sch, "I.labels", "I.swap", {key: 400}, label=401),
        ins(sch, "I.labels", "I.pick", {key: 500}),
    )


def stack_frames() -> list[tuple[int, bytes]]:
    """pop, push, swap on a full stack, overflow (StackOutOfBounds), runtime index, no MPLS, pop to empty,
    push onto a full stack."""
    tail = b"payload!"
    return [
        (0, eth(0x8847, mpls(100, 0, 10) + mpls(7, 1, 20) + info() + tail)),
        (0, eth(0x8847, mpls(200, 1, 5, tc=3) + info() + tail)),
        (0, eth(0x8847, mpls(400, 0, 9) + mpls(1, 0, 8) + mpls(2, 1, 7) + info() + tail)),
        (0, eth(0x8847, mpls(9, 0, 1) + mpls(8, 0, 2) + mpls(7, 0, 3) + mpls(6, 1, 4) + info() + tail)),
        (0, eth(0x8847, mpls(500, 0, 1) + mpls(600, 0, 2, tc=1) + mpls(700, 1, 3) + info(picked=5) + tail)),  # idx 1
        (0, eth(0x0800, tail)),
        (0, eth(0x8847, mpls(100, 1, 3) + info() + tail)),
        (0, eth(0x8847, mpls(200, 0, 4) + mpls(1, 0, 5) + mpls(2, 1, 6) + info() + tail)),
    ]


# ---------------------------------------------------------------- lookahead_vset


def vset_update(sch: P4Schema, values: list[int]) -> p4r.Update:
    """A MODIFY of P.tagged_types with exact members `values`."""
    vs = sch.p4info
    vid = next(v.preamble.id for v in vs.value_sets if v.preamble.name == "P.tagged_types")
    entry = p4r.ValueSetEntry(value_set_id=vid)
    for value in values:
        member = entry.members.add()
        fm = member.match.add(field_id=1)
        fm.exact.value = value.to_bytes(2, "big")
    return update(p4r.Update.MODIFY, p4r.Entity(value_set_entry=entry))


async def vset_extra(c: Client, sch: P4Schema) -> None:
    await c.write(vset_update(sch, [0x88B5, 0x9999]))


def lookahead_frames() -> list[tuple[int, bytes]]:
    """A tag EtherType (value set member, or not on bmv2), IPv4, IPv6, other, and a frame too short to peek."""
    return [
        (0, eth(0x88B5, b"\x03\x09rest")),
        (0, bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src="1.1.1.1", dst="2.2.2.2") / UDP())),
        (0, bytes(Ether(src=MAC_A, dst=MAC_B) / IPv6(src="fd00::1", dst="fd00::2") / UDP())),
        (0, eth(0x1234, b"\x12\x34\x56")),
        (0, eth(0x9999, b"\x07")),
    ]


# ---------------------------------------------------------------- hashes


def hashes_frames() -> list[tuple[int, bytes]]:
    """Two inputs: every algorithm's result lands in the output header."""
    return [
        (0, eth(0x1234, bytes.fromhex("01020304050678") + b"tail")),
        (0, eth(0x1234, bytes.fromhex("ffffffffffffff"), src="02:11:22:33:44:55")),
    ]


# ---------------------------------------------------------------- direct_res


def classify_entry(sch: P4Schema, ethertype: int, action: str, **params: int) -> p4r.Entity:
    """I.classify's entry for `ethertype`."""
    return table_entry(sch, "I.classify", action, {"hdr.ethernet.etherType": ethertype}, params)


async def direct_setup(c: Client, sch: P4Schema) -> None:
    metered = classify_entry(sch, 0x0800, "I.fwd", port=1)
    metered.table_entry.meter_config.CopyFrom(p4r.MeterConfig(cir=1, cburst=1200, pir=1, pburst=2500))
    await c.write(
        update(p4r.Update.INSERT, metered),
        update(p4r.Update.INSERT, classify_entry(sch, 0x0806, "I.fwd", port=2)),
    )


def direct_frames() -> list[tuple[int, bytes]]:
    """Three 1014-byte frames through the metered entry (green, yellow, red), an unmetered hit, a miss."""
    big = eth(0x0800, b"m" * 1000)
    return [(0, big), (0, big), (0, big), (0, eth(0x0806, b"a" * 50)), (0, eth(0x1234, b"z" * 50))]


async def direct_state(c: Client, sch: P4Schema) -> dict[str, object]:
    out: dict[str, object] = {}
    for ethertype in (0x0800, 0x0806):
        te = classify_entry(sch, ethertype, "I.fwd", port=1).table_entry
        te.ClearField("action")
        req = p4r.Entity(direct_counter_entry=p4r.DirectCounterEntry(table_entry=te))
        [ent] = await c.read(req)
        data = ent.direct_counter_entry.data
        out[f"counter 0x{ethertype:04x}"] = (data.packet_count, data.byte_count)
        req = p4r.Entity(direct_meter_entry=p4r.DirectMeterEntry(table_entry=te))
        [ent] = await c.read(req)
        cfg = ent.direct_meter_entry.config
        out[f"meter 0x{ethertype:04x}"] = (cfg.cir, cfg.cburst, cfg.pir, cfg.pburst)
    return out


# ---------------------------------------------------------------- registers_exit


def stat(before: int = 0, marks: int = 0) -> bytes:
    """registers_exit.p4's stat header."""
    return struct.pack("!IB", before, marks)


def register_frames() -> list[tuple[int, bytes]]:
    """Plain, exit in ingress, mark_to_drop in egress, exit in egress, another port's register cell."""
    return [
        (0, eth(0x9000, stat() + b"x")),
        (0, eth(0x0001, stat(marks=0x10) + b"x")),
        (0, eth(0x0002, stat() + b"x")),
        (0, eth(0x0003, stat() + b"x")),
        (1, eth(0x9000, stat() + b"y")),
        (2, eth(0x9000, stat(marks=0x40) + b"z")),
    ]


def register_entity(sch: P4Schema, index: int | None = None, value: int | None = None) -> p4r.Entity:
    """A RegisterEntry of I.seen (all cells without an index)."""
    rid = next(r.preamble.id for r in sch.p4info.registers if r.preamble.name == "I.seen")
    entry = p4r.RegisterEntry(register_id=rid)
    if index is not None:
        entry.index.index = index
    if value is not None:
        entry.data.bitstring = value.to_bytes(4, "big")
    return p4r.Entity(register_entry=entry)


# ---------------------------------------------------------------- replication


def pre_update(kind: int, group: int = 0, session: int = 0, replicas: tuple[tuple[int, int], ...] = ()) -> p4r.Update:
    """A multicast group (group) or clone session (session) with (egress port, instance) replicas."""
    pre = p4r.PacketReplicationEngineEntry()
    entry = pre.multicast_group_entry if group else pre.clone_session_entry
    if group:
        pre.multicast_group_entry.multicast_group_id = group
    else:
        pre.clone_session_entry.session_id = session
    for port, rid in replicas:
        entry.replicas.add(egress_port=port, instance=rid)
    return update(kind, p4r.Entity(packet_replication_engine_entry=pre))


async def replication_setup(c: Client, sch: P4Schema) -> None:
    key = "hdr.ethernet.etherType"
    await c.write(
        ins(sch, "I.fwd", "I.to_port", {key: 0x0001}, port=1),
        ins(sch, "I.fwd", "I.flood", {key: 0x0002}, group=5),
        ins(sch, "I.fwd", "I.mirror", {key: 0x0003}, port=1, session=4),
        ins(sch, "I.fwd", "I.again", {key: 0x0004}, port=1),
        ins(sch, "I.fwd", "I.to_port", {key: 0x0E2E}, port=2),
        ins(sch, "I.fwd", "I.to_port", {key: 0x0ECC}, port=1),
        pre_update(p4r.Update.INSERT, group=5, replicas=((1, 1), (2, 1), (3, 2))),
        pre_update(p4r.Update.INSERT, session=4, replicas=((2, 3),)),
        pre_update(p4r.Update.INSERT, session=7, replicas=((3, 9),)),
    )


def replication_frames() -> list[tuple[int, bytes]]:
    """Unicast, multicast, I2E clone, resubmit twice, E2E clone, recirculate, drop."""
    return [(0, eth(t, b"r" * 10)) for t in (0x0001, 0x0002, 0x0003, 0x0004, 0x0E2E, 0x0ECC, 0x0005)]


async def replication_state(c: Client, sch: P4Schema) -> dict[str, object]:
    out: dict[str, object] = {}
    for req in (pre_update(0, group=5).entity, pre_update(0, session=4).entity):
        [ent] = await c.read(req)
        pre = ent.packet_replication_engine_entry
        entry = pre.multicast_group_entry if pre.HasField("multicast_group_entry") else pre.clone_session_entry
        out[pre.WhichOneof("type")] = sorted(
            (r.egress_port or int.from_bytes(r.port, "big"), r.instance) for r in entry.replicas
        )
    return out


# ---------------------------------------------------------------- header_union

UNION_OPS = ("widen", "narrow", "copy_union", "copy_member", "drop_member", "revalidate")


def short(kind: int, addr: int) -> bytes:
    """header_union.p4's short_t."""
    return struct.pack("!BI", kind, addr)


def long_(kind: int, addr: int) -> bytes:
    """header_union.p4's long_t."""
    return bytes([kind]) + addr.to_bytes(16, "big")


def report(op: int) -> bytes:
    """header_union.p4's report_t as sent (seen and low are written by the pipeline)."""
    return struct.pack("!BBI", op, 0, 0)


async def union_setup(c: Client, sch: P4Schema) -> None:
    await c.write(*(ins(sch, "I.ops", f"I.{a}", {"hdr.report.op": k}) for k, a in enumerate(UNION_OPS, 1)))


def union_frames() -> list[tuple[int, bytes]]:
    """Every op on: a.s, a.l, a.s displaced by a.l in the parser, a.s and b.s, no union; plus no op."""
    tail = b"union-tail"
    parsed = {
        0x9004: short(3, 0x0A000001),
        0x9006: long_(5, (0xFD << 120) | 0x0B000002),
        0x9046: short(3, 0x0A000003) + long_(6, 0x0C000004),
        0x9044: short(4, 0x0A000005) + short(9, 0x0A000006),
        0x1234: b"",
    }
    # widen (1) reads a.s and narrow (2) reads a.l: only with frames that carry that member (see the program)
    reads = {1: (0x9004, 0x9046, 0x9044), 2: (0x9006, 0x9046)}
    return [
        (0, eth(t, report(op) + body + tail))
        for op in range(len(UNION_OPS) + 1)
        for t, body in parsed.items()
        if t in reads.get(op, parsed)
    ]


# ---------------------------------------------------------------- header_union_stack

UNION_STACK_OPS = ("pop1", "pop2", "push1", "to_b")


def elem_a(x: int) -> bytes:
    """header_union_stack.p4's a_t (tag 1)."""
    return bytes([1, x])


def elem_b(y: int) -> bytes:
    """header_union_stack.p4's b_t (tag 2)."""
    return bytes([2]) + y.to_bytes(2, "big")


async def union_stack_setup(c: Client, sch: P4Schema) -> None:
    await c.write(*(ins(sch, "I.ops", f"I.{a}", {"hdr.op.op": k}) for k, a in enumerate(UNION_STACK_OPS, 1)))


def union_stack_frames() -> list[tuple[int, bytes]]:
    """Each op on stacks of none to three elements, an overflowing fourth element, and no op header."""
    stacks = [
        b"",
        elem_a(0x11),
        elem_a(0x11) + elem_b(0x2222),
        elem_a(0x11) + elem_b(0x2222) + elem_a(0x33),
        elem_b(0x4444) + elem_a(0x55) + elem_b(0x6666),
    ]
    tail = b"\x00stack-tail"
    frames = [(0, eth(0x9100, bytes([op, 0]) + st + tail)) for op in range(len(UNION_STACK_OPS) + 1) for st in stacks]
    overflow = elem_a(1) + elem_a(2) + elem_b(3) + elem_a(4)
    return [*frames, (0, eth(0x9100, bytes([1, 0]) + overflow + tail)), (0, eth(0x0800, elem_a(9) + tail))]


# ---------------------------------------------------------------- action_selector

ROUTER_SRC = 0x02000000FFFF  # action_selector.p4's route() writes it into srcAddr
LB_DST = "10.9.0.1"


def ap_action(sch: P4Schema, name: str, **params: int) -> p4r.Action:
    """An action by name with its parameters, each padded to its width."""
    info = sch.actions[name]
    out = p4r.Action(action_id=info.id)
    for pname, value in params.items():
        param = info.params[pname]
        out.params.add(param_id=param.id, value=value.to_bytes((param.bitwidth + 7) // 8, "big"))
    return out


def ap_member(sch: P4Schema, profile: str, member_id: int, action: str = "", **params: int) -> p4r.Entity:
    """An ActionProfileMember of `profile` (without an action: a key for reads and deletes)."""
    m = p4r.ActionProfileMember(action_profile_id=sch.action_profiles[profile].id, member_id=member_id)
    if action:
        m.action.CopyFrom(ap_action(sch, action, **params))
    return p4r.Entity(action_profile_member=m)


def ap_group(sch: P4Schema, profile: str, group_id: int, weights: dict[int, int], max_size: int = 0) -> p4r.Entity:
    """An ActionProfileGroup of `profile` holding member id -> weight."""
    g = p4r.ActionProfileGroup(action_profile_id=sch.action_profiles[profile].id, group_id=group_id, max_size=max_size)
    for member_id, weight in weights.items():
        g.members.add(member_id=member_id, weight=weight)
    return p4r.Entity(action_profile_group=g)


def indirect_entry(
    sch: P4Schema,
    table: str,
    match: dict[str, object],
    member: int = 0,
    group: int = 0,
    action_set: list[tuple[int, p4r.Action]] | None = None,
) -> p4r.Entity:
    """A table entry pointing at a member, a group or a one-shot set of (weight, action)."""
    from finsy import P4TableEntry, P4TableMatch

    entity = P4TableEntry(table, match=P4TableMatch(match)).encode(sch)
    action = entity.table_entry.action
    if member:
        action.action_profile_member_id = member
    elif group:
        action.action_profile_group_id = group
    elif action_set is not None:
        for weight, a in action_set:
            action.action_profile_action_set.action_profile_actions.add(action=a, weight=weight)
    return entity


def nhop(sch: P4Schema, port: int) -> p4r.Action:
    """set_nhop to `port`, with destination MAC 02:00:00:00:01:<port>."""
    return ap_action(sch, "I.set_nhop", port=port, dmac=0x020000000100 + port)


async def selector_setup(c: Client, sch: P4Schema) -> None:
    ins_ = p4r.Update.INSERT
    dmac = "hdr.ethernet.dstAddr"
    dst = "hdr.ipv4.dstAddr"
    await c.write(
        update(ins_, ap_member(sch, "I.ap", 1, "I.to_port", port=1)),
        update(ins_, ap_member(sch, "I.ap", 2, "I.route")),
        update(ins_, ap_member(sch, "I.ap", 3, "I.drop")),
        update(ins_, indirect_entry(sch, "I.l2", {dmac: "02:00:00:00:00:01"}, member=1)),
        update(ins_, indirect_entry(sch, "I.l2", {dmac: MAC_B}, member=2)),
        update(ins_, indirect_entry(sch, "I.l2", {dmac: "02:00:00:00:00:02"}, member=3)),
        # Members made out of id order: bmv2 hands out handles in creation order, and a group is
        # chosen from in handle order; member 11's second copy (weight 2) is made last.
        *(
            update(ins_, ap_member(sch, "I.sel", mid, "I.set_nhop", port=port, dmac=0x020000000100 + port))
            for mid, port in ((12, 3), (10, 1), (11, 2), (13, 4))
        ),
        update(ins_, ap_group(sch, "I.sel", 100, {10: 1, 11: 1})),
        update(ins_, ap_group(sch, "I.sel", 101, {13: 1})),
        update(ins_, indirect_entry(sch, "I.ecmp", {dst: "10.1.0.0/16"}, group=100)),
        update(ins_, indirect_entry(sch, "I.ecmp", {dst: "10.2.0.0/16"}, member=12)),
        update(ins_, indirect_entry(sch, "I.ecmp", {dst: "10.3.0.0/16"}, group=101)),
        update(ins_, indirect_entry(sch, "I.lb", {dst: LB_DST}, action_set=[(2, nhop(sch, 5)), (1, nhop(sch, 6))])),
    )
    await c.write(update(p4r.Update.MODIFY, ap_group(sch, "I.sel", 100, {10: 1, 11: 2, 12: 1})))


def selector_frames() -> list[tuple[int, bytes]]:
    """l2 to a port, dropped, missed (no action), non-IPv4 routed; UDP flows over ecmp's group (weighted), a TCP
    packet (no ports hashed), a route to a member, to a one-member group, no route; flows over lb's
    one-shot group."""

    def udp(dst: str, src: str, sport: int, dport: int = 4791) -> bytes:
        return bytes(
            Ether(src=MAC_A, dst=MAC_B) / IP(src=src, dst=dst, ttl=9) / UDP(sport=sport, dport=dport) / Raw(b"s" * 8)
        )

    frames = [
        (0, eth(0x0800, b"to port 1", dst="02:00:00:00:00:01")),
        (0, eth(0x0800, b"dropped", dst="02:00:00:00:00:02")),
        (0, eth(0x0800, b"missed", dst="02:00:00:00:00:09")),
        (0, eth(0x1234, b"routed, not IPv4")),
    ]
    frames += [(0, udp("10.1.2.3", f"10.0.{k}.1", 1000 + 7 * k)) for k in range(12)]
    tcp = Ether(src=MAC_A, dst=MAC_B) / IP(src="10.0.0.9", dst="10.1.0.7", proto=6, ttl=9) / Raw(b"t" * 20)
    frames += [(1, bytes(tcp)), (1, udp("10.2.0.1", "10.0.0.1", 5)), (1, udp("10.3.0.1", "10.0.0.1", 6))]
    frames += [(1, udp("10.4.0.1", "10.0.0.1", 7))]
    frames += [(2, udp(LB_DST, f"10.0.{k}.2", 2000, 3000 + k)) for k in range(8)]
    return frames


async def selector_state(c: Client, sch: P4Schema) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, entity in (
        ("members I.ap", ap_member(sch, "I.ap", 0)),
        ("members I.sel", ap_member(sch, "I.sel", 0)),
        ("member 11", ap_member(sch, "I.sel", 11)),
        ("groups I.sel", ap_group(sch, "I.sel", 0, {})),
        ("table I.ecmp", indirect_entry(sch, "I.ecmp", {})),
        ("table I.lb", indirect_entry(sch, "I.lb", {})),
    ):
        out[name] = [text_format.MessageToString(e, as_one_line=True) for e in await c.read(entity)]
    # I.sel2 holds one-shot groups: a read of every profile's members meets PI's mixing rule.
    try:
        out["members of all profiles"] = len(await c.read(p4r.Entity(action_profile_member=p4r.ActionProfileMember())))
    except grpc.aio.AioRpcError as exc:
        out["members of all profiles"] = exc.code().name
    return out


# ---------------------------------------------------------------- digest


def digest_id(sch: P4Schema, name: str) -> int:
    """The P4Info id of digest `name`."""
    return next(d.preamble.id for d in sch.p4info.digests if d.preamble.name == name)


def digest_update(sch: P4Schema, kind: int, name: str, **config: int) -> p4r.Update:
    """A DigestEntry update of digest `name` with `config` (max_timeout_ns, max_list_size, ack_timeout_ns)."""
    entry = p4r.DigestEntry(digest_id=digest_id(sch, name), config=p4r.DigestEntry.Config(**config))
    return update(kind, p4r.Entity(digest_entry=entry))


MAC_C, MAC_D, MAC_K = "02:00:00:00:00:0c", "02:00:00:00:00:0d", "02:00:00:00:00:4b"


async def digest_setup(c: Client, sch: P4Schema) -> None:
    # One sample a list, sent at once; samples sent and not acked are not sent again for 10 s.
    once = {"max_timeout_ns": 0, "max_list_size": 1, "ack_timeout_ns": 10**10}
    await c.write(
        ins(sch, "I.smac", "NoAction", {"hdr.ethernet.srcAddr": MAC_K}),
        ins(sch, "I.dmac", "I.fwd", {"hdr.ethernet.dstAddr": MAC_B}, port=1),
        digest_update(sch, p4r.Update.INSERT, "mac_learn_t", **once),
        digest_update(sch, p4r.Update.INSERT, "flow_t", **once),
    )


def digest_frames() -> list[tuple[int, bytes]]:
    """New source (forwarded), the same again (cached), new source dropped by dmac, a known source on
    another port, a known source, a flow frame from a new source (flow_t replaces mac_learn_t)."""
    return [
        (0, eth(0x0800, b"d" * 20)),
        (0, eth(0x0800, b"d" * 20)),
        (0, eth(0x0800, b"d" * 20, src=MAC_C, dst="02:00:00:00:00:99")),
        (2, eth(0x0800, b"d" * 20)),
        (0, eth(0x0800, b"d" * 20, src=MAC_K)),
        (1, eth(0x88B6, b"f" * 20, src=MAC_D)),
    ]


def digest_steps(sch: P4Schema) -> list[Step]:
    """Ack mac_learn_t's first list: its sample is sent again; flow_t's is not acked, so stays cached."""
    return [
        p4r.DigestListAck(digest_id=digest_id(sch, "mac_learn_t"), list_id=1),
        (0, eth(0x0800, b"e" * 20)),
        (3, eth(0x88B6, b"g" * 20, src=MAC_D)),
    ]


# ---------------------------------------------------------------- packet_io

CPU_PORT = 64


def meta_id(sch: P4Schema, header: str, name: str) -> int:
    """The id of metadata field `name` of controller header `header` (packet_in, packet_out)."""
    cpm = next(m for m in sch.p4info.controller_packet_metadata if m.preamble.name == header)
    return next(m.id for m in cpm.metadata if m.name == name)


def packet_out(sch: P4Schema, payload: bytes, **metadata: bytes) -> p4r.PacketOut:
    """A PacketOut with packet_out metadata given by field name."""
    msg = p4r.PacketOut(payload=payload)
    for name, value in metadata.items():
        msg.metadata.add(metadata_id=meta_id(sch, "packet_out", name), value=value)
    return msg


async def packet_io_setup(c: Client, sch: P4Schema) -> None:
    key = "hdr.ethernet.etherType"
    await c.write(
        ins(sch, "I.punt", "I.fwd", {key: 0x0800}, port=1),
        ins(sch, "I.punt", "I.to_cpu", {key: 0x88CC}, reason=5),
        ins(sch, "I.punt", "I.to_cpu_bare", {key: 0x0806}),
    )


def packet_io_frames() -> list[tuple[int, bytes]]:
    """Forwarded, punted with a packet_in header, punted bare, dropped."""
    return [
        (0, eth(0x0800, b"i" * 20)),
        (3, eth(0x88CC, b"l" * 20)),
        (2, eth(0x0806, b"a" * 28)),
        (0, eth(0x1234, b"z" * 20)),
    ]


def packet_io_steps(sch: P4Schema) -> list[Step]:
    """PacketOuts: to port 2, to port 3 tagged, to the CPU port (back as a bare packet-in), with no
    metadata (port 0), padded and canonical values, an unknown metadata id and a value wider than
    its field (both dropped)."""
    frame = eth(0x0800, b"o" * 20)
    unknown = packet_out(sch, frame, egress_port=b"\x01")
    unknown.metadata.add(metadata_id=99, value=b"\x01")
    return [
        packet_out(sch, frame, egress_port=b"\x02"),
        packet_out(sch, frame, egress_port=b"\x03", tag=b"\x01"),
        packet_out(sch, frame, egress_port=CPU_PORT.to_bytes(2, "big")),
        p4r.PacketOut(payload=frame),
        packet_out(sch, frame, egress_port=b"\x00\x00\x01", tag=b""),
        unknown,
        packet_out(sch, frame, egress_port=b"\x02\x00"),
        (1, eth(0x88CC, b"m" * 20)),
    ]


# ---------------------------------------------------------------- indirect_res

INDIRECT_COUNTERS = ("I.by_packets", "I.by_bytes", "I.by_both")


def _ids(sch: P4Schema, kind: str) -> dict[str, int]:
    return {o.preamble.name: o.preamble.id for o in getattr(sch.p4info, kind)}


async def indirect_setup(c: Client, sch: P4Schema) -> None:
    """Meter cell 0 of both meters tight (three frames go green, yellow, red); cell 1 loose; 2 unset."""
    meters = _ids(sch, "meters")
    configs = {
        # Rate 0: nothing refills. bmv2 refills whole units counted from its own start, so any rate at
        # all could add a packet between frames sent 0.3 s apart, at a moment no test can pin down.
        ("I.byte_meter", 0): p4r.MeterConfig(cir=0, cburst=1200, pir=0, pburst=2500),
        ("I.packet_meter", 0): p4r.MeterConfig(cir=0, cburst=1, pir=0, pburst=2),
        ("I.byte_meter", 1): p4r.MeterConfig(cir=10**6, cburst=10**6, pir=10**6, pburst=10**6),
        ("I.packet_meter", 1): p4r.MeterConfig(cir=1000, cburst=1000, pir=1000, pburst=1000),
    }
    await c.write(
        *(
            update(
                p4r.Update.MODIFY,
                p4r.Entity(meter_entry=p4r.MeterEntry(meter_id=meters[m], index=p4r.Index(index=i), config=cfg)),
            )
            for (m, i), cfg in configs.items()
        )
    )


def indirect_frames() -> list[tuple[int, bytes]]:
    """Three 1017-byte frames on cell 0, one on cell 1, two on unconfigured cell 2, one not counted."""

    def res(idx: int, size: int = 1000) -> bytes:
        return eth(0x9200, bytes([idx, 0, 0]) + b"r" * size)

    return [
        (0, res(0)),
        (0, res(0)),
        (0, res(0)),
        (0, res(1, 60)),
        (1, res(2)),
        (1, res(2, 10)),
        (0, eth(0x0800, b"x")),
    ]


async def indirect_state(c: Client, sch: P4Schema) -> dict[str, object]:
    counters, meters = _ids(sch, "counters"), _ids(sch, "meters")
    out: dict[str, object] = {}
    for name in INDIRECT_COUNTERS:
        cells = await c.read(p4r.Entity(counter_entry=p4r.CounterEntry(counter_id=counters[name])))
        out[name] = sorted(
            (e.counter_entry.index.index, e.counter_entry.data.packet_count, e.counter_entry.data.byte_count)
            for e in cells
        )
    for name in ("I.byte_meter", "I.packet_meter"):
        cells = await c.read(p4r.Entity(meter_entry=p4r.MeterEntry(meter_id=meters[name])))
        out[name] = sorted(
            (e.meter_entry.index.index, e.meter_entry.config.cir, e.meter_entry.config.pburst) for e in cells
        )
    return out


CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case("ipv4_csum", ipv4_frames(), setup=ipv4_setup),
        Case("header_stack", stack_frames(), setup=stack_setup),
        Case("lookahead_vset", lookahead_frames(), extra_setup=vset_extra),
        Case("hashes", hashes_frames()),
        Case("direct_res", direct_frames(), setup=direct_setup, state=direct_state),
        Case("registers_exit", register_frames()),
        Case("replication", replication_frames(), setup=replication_setup, state=replication_state),
        Case("header_union", union_frames(), setup=union_setup),
        Case("indirect_res", indirect_frames(), setup=indirect_setup, state=indirect_state),
        Case("header_union_stack", union_stack_frames(), setup=union_stack_setup),
        Case("action_selector", selector_frames(), setup=selector_setup, state=selector_state, ports=tuple(range(7))),
        Case("digest", digest_frames(), setup=digest_setup, steps=digest_steps, stream=True),
        Case(
            "packet_io",
            packet_io_frames(),
            setup=packet_io_setup,
            steps=packet_io_steps,
            cpu_port=CPU_PORT,
            stream=True,
        ),
        Case("lpm_const", tables.lpm_frames(), setup=tables.lpm_setup, state=tables.lpm_state),
        Case("union_valid_key", tables.union_key_frames(), setup=tables.union_key_setup, state=tables.union_key_state),
        Case("header_mux", tables.mux_frames(), setup=tables.mux_setup),
        Case("optional_match", tables.optional_frames(), setup=tables.optional_setup, state=tables.optional_state),
        Case("dead_table", tables.dead_frames(), setup=tables.dead_setup, state=tables.dead_state),
        Case("varbit", semantics.varbit_frames()),
        Case("signed", semantics.signed_frames(), setup=semantics.signed_setup),
        Case("saturating", semantics.saturating_frames(), setup=semantics.saturating_setup),
        Case("advance", semantics.advance_frames()),
        Case("stack_copy", semantics.stack_copy_frames()),
        Case("stack_copy_whole", semantics.stack_copy_frames()),
    )
}
