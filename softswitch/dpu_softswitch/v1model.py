"""simple_switch's packet loop (bmv2's targets/simple_switch) over a compiled program's parts.

`process` is the straight path of a program that never replicates: parse (memoised for a frame
sent again), verify checksums, ingress, the learn engine, egress, update checksums, deparse.
`process_general` is simple_switch's ingress and egress threads with their queues, for programs
that clone, resubmit, recirculate or multicast, and it is what `process` becomes for them.

Every packet starts with the header fields zeroed. bmv2 only marks its pooled PHV's headers invalid
between packets, so reading a field of a header this packet never made valid gives what an earlier
packet left there (the P4 specification leaves the value unspecified); no test relies on either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from .switch.layout import Layout
from .switch.loader import LearnListDef, Objects
from .switch.packet import DROP_PORT, NO_STACKS, Packet, PacketAbort, Stmt
from .trace import Tracer

# simple_switch's packet instance types (standard_metadata.instance_type).
NORMAL, INGRESS_CLONE, EGRESS_CLONE, RECIRC, REPLICATION, RESUBMIT = 0, 1, 2, 4, 5, 6
MAX_PASSES = 64  # resubmits, recirculations and copies per received packet (bmv2 has no such bound)
_MEMO_SIZE = 64  # distinct frames memoised per program; the memo starts over when full


class RPacket(Packet):
    """A packet of a program that clones, resubmits, recirculates or multicasts: with simple_switch's
    per-packet registers for those requests (clone: (session, field list), else field list ids)."""

    __slots__ = ("clone", "recirc", "resubmit")

    def __init__(self, f: list[int], v: list[bool], length: int, stk: list[int] | None = None) -> None:
        super().__init__(f, v, length, stk)
        self.clone: tuple[int, int] | None = None
        self.resubmit = 0
        self.recirc = 0


class Pre:
    """The packet replication engine: multicast groups and clone sessions as (egress port, rid) replicas."""

    def __init__(self) -> None:
        self.groups: dict[int, list[tuple[int, int]]] = {}
        self.clone_sessions: dict[int, list[tuple[int, int]]] = {}


class _Parsed:
    """A memoised parse (SimpleSwitch.process): the bytes; the field list after parsing them (metadata as
    in the template) and the packet headers' part of it; all validity bits after parsing; where parsing
    stopped; and whether deparsing those headers gives the bytes back."""

    __slots__ = ("data", "fields", "off", "same", "start", "valid")

    def __init__(self, data: bytes, start: list[int], lo: int, hi: int, valid: list[bool], off: int) -> None:
        self.data = data
        self.start = start
        self.fields = start[lo:hi]
        self.valid = valid
        self.off = off
        self.same: bool | None = None


def parse_memo(layout: Layout, parser: dict[str, Any]) -> tuple[dict[int, _Parsed] | None, tuple[int, int]]:
    """A memo of parse results for process(), when parsing depends on the packet's bytes alone.

    That holds when the parser only extracts fixed headers and selects on packet header fields or
    lookahead bits (no value sets, which the control plane changes, no metadata, no stacks) and
    the packet headers' fields are one contiguous span of the field list. Returns (memo or None,
    the span).
    """
    packet = [h for h in layout.header_list if not h.metadata]
    lo = min((h.base for h in packet), default=0)
    hi = max((h.base + len(h.widths) for h in packet), default=0)
    if sum(len(h.widths) for h in packet) != hi - lo or layout.stacks or layout.union_stacks:
        return None, (lo, hi)
    for st in parser.get("parse_states", []):
        for op in st.get("parser_ops", []):
            if op.get("op") != "extract" or op.get("parameters", [{}])[0].get("type") != "regular":
                return None, (lo, hi)
        for k in st.get("transition_key", []):
            if k.get("type") == "field" and not layout.headers[k["value"][0]].metadata:
                continue
            if k.get("type") != "lookahead":
                return None, (lo, hi)
        if any(t.get("type", "hexstr") not in ("hexstr", "default") for t in st.get("transitions", [])):
            return None, (lo, hi)
    return {}, (lo, hi)


class SimpleSwitch:
    """simple_switch's processing of one program: its parts, its replication engine, its learn hook."""

    def __init__(
        self,
        objs: Objects,
        parser: Callable[[Packet, bytes], bool],
        deparse: Callable[[Packet], bytes],
        checksums: tuple[Stmt, Stmt],
        ingress: Callable[[Packet], None],
        egress: Callable[[Packet], None],
        egress_empty: bool,
        trace: Tracer | None = None,
    ) -> None:
        layout = objs.layout
        self.clock = objs.clock
        self.pre = Pre()
        self.learn_lists: dict[int, LearnListDef] = objs.learn_lists
        self.field_lists = objs.field_lists
        # Called with (learn list id, field values) for each sample, at the end of ingress as simple_switch's
        # ingress thread calls its learn engine (simple_switch.cpp), not where digest() is called: a field
        # the action changes after the call is sampled with its final value.
        self.on_learn: Callable[[int, list[int]], None] | None = None
        self.parser = parser
        self.deparse = deparse
        self.verify_checksums, self.update_checksums = checksums
        self.ingress = ingress
        self.egress = egress
        self._sm = sm = objs.sm
        self.template_f = [0] * layout.nfields
        self.template_v = [h.metadata for h in layout.header_list]
        self.template_stk = [0] * (len(layout.stacks) + len(layout.union_stacks))
        self._metadata_spans = [(h.base, h.base + len(h.widths)) for h in layout.header_list if h.metadata]
        es_width = layout.field_width[sm["egress_spec"]]
        # simple_switch sets egress_spec to drop_port + 1 before egress; the 9-bit field wraps it to 0.
        self._egress_spec_init = (DROP_PORT + 1) & ((1 << es_width) - 1)
        self._fast_idx = tuple(
            sm[k]
            for k in (
                "ingress_port",
                "packet_length",
                "ingress_global_timestamp",
                "egress_spec",
                "egress_port",
                "egress_global_timestamp",
            )
        )
        self._mask = layout.mask
        # Fields always hold values within their width (generated code relies on it); bmv2 truncates
        # what it writes into them too, such as a port number or a replica's rid.
        self._port_mask = layout.mask(sm["ingress_port"])
        self._has_checksums = bool(objs.section("checksums"))
        self._egress_empty = egress_empty
        self._memo, self._span = parse_memo(layout, objs.section("parsers")[0])
        if objs.replicates:
            self.process = self.process_general  # type: ignore[method-assign]
        # Traced, every packet takes the general path, whose steps report to the tracer. Untraced, the
        # straight path never tests `trace`, and the general path only a few times per step (not per node).
        self.trace = trace
        if trace is not None:
            self.process = self._process_traced  # type: ignore[method-assign]

    def _process_traced(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        out = self.process_general(port, data)
        if self.trace is not None:
            self.trace.outputs(out)
        return out

    def process(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        """Run one packet through parser, ingress, egress and deparser; return (port, bytes) outputs."""
        ip, pl, igt, es, ep, egt = self._fast_idx
        stk = self.template_stk
        n = len(data)
        memo, (lo, hi) = self._memo, self._span
        # The same bytes object again (a simulation resends one frame): its parse is taken from the memo.
        parsed = memo.get(id(data)) if memo is not None else None
        if parsed is not None and parsed.data is data:
            p = Packet(parsed.start.copy(), parsed.valid.copy(), n, stk.copy() if stk else None)
            f = p.f
            p.payload, p.poff = data, parsed.off
        else:
            parsed = None
            p = Packet(self.template_f.copy(), self.template_v.copy(), n, stk.copy() if stk else None)
            f = p.f
        f[ip] = port & self._port_mask
        if pl >= 0:
            f[pl] = n
        if igt >= 0:
            f[igt] = self.clock.now_us()
        try:
            if parsed is None and self.parser(p, data) and memo is not None and data.__class__ is bytes:
                if len(memo) >= _MEMO_SIZE:
                    memo.clear()
                start = self.template_f.copy()
                start[lo:hi] = f[lo:hi]
                memo[id(data)] = _Parsed(data, start, lo, hi, p.v.copy(), p.poff)  # it holds data: the id stays its
            if self._has_checksums:
                self.verify_checksums(p, NO_STACKS)
            self.ingress(p)
            if p.learn:
                self._learned(p)
            egress_spec = f[es]
            if egress_spec == DROP_PORT:
                return []
            p.exited = False
            f[ep] = egress_spec
            f[es] = self._egress_spec_init
            if egt >= 0:
                f[egt] = self.clock.now_us()
            if not self._egress_empty:
                self.egress(p)
            if f[es] == DROP_PORT:
                return []
            if self._has_checksums:
                self.update_checksums(p, NO_STACKS)
            # Headers as parsed from the memo's bytes: the deparser would emit those bytes (checked once).
            if parsed is not None and p.v == parsed.valid and f[lo:hi] == parsed.fields:
                if parsed.same is None:
                    parsed.same = self.deparse(p) == data
                if parsed.same:
                    return [(egress_spec, data)]
            return [(egress_spec, self.deparse(p))]
        except PacketAbort:
            return []

    def _learned(self, p: Packet) -> None:
        """Hand the sample of the packet's learn list to on_learn (at the end of ingress)."""
        if self.on_learn is not None:
            f = p.f
            self.on_learn(p.learn, [f[i] for i in self.learn_lists[p.learn].fields])

    # ---------------------------------------------------------------- replication (simple_switch's threads)

    def process_general(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        """process() for programs that replicate: simple_switch's ingress and egress steps with its queues."""
        out: list[tuple[int, bytes]] = []
        ingress_q: deque[tuple[int, bytes, list[tuple[int, int]] | None, int]] = deque([(port, data, None, NORMAL)])
        egress_q: deque[tuple[int, RPacket]] = deque()
        for _ in range(MAX_PASSES):
            if ingress_q:
                self._ingress_step(*ingress_q.popleft(), ingress_q, egress_q)
            elif egress_q:
                eport, p = egress_q.popleft()
                self._egress_step(eport, p, ingress_q, egress_q, out)
            else:
                break
        return out

    def _new_packet(self, port: int, data: bytes, preserved: list[tuple[int, int]] | None, itype: int) -> RPacket:
        stk = self.template_stk
        p = RPacket(self.template_f.copy(), self.template_v.copy(), len(data), stk.copy() if stk else None)
        f, sm = p.f, self._sm
        if preserved is None:  # received from a port
            f[sm["ingress_port"]] = port & self._port_mask
            if sm["ingress_global_timestamp"] >= 0:
                f[sm["ingress_global_timestamp"]] = self.clock.now_us()
        else:  # resubmitted or recirculated: metadata reset, then the field list copied over
            for i, value in preserved:
                f[i] = value
            if sm["instance_type"] >= 0:
                f[sm["instance_type"]] = itype
        if sm["packet_length"] >= 0:
            f[sm["packet_length"]] = len(data)
        return p

    def _preserved(self, p: Packet, fl: int) -> list[tuple[int, int]]:
        return [(i, p.f[i]) for i in self.field_lists.get(fl, [])]

    def _reset_metadata(self, p: RPacket, preserved: list[tuple[int, int]], itype: int) -> None:
        f = p.f
        for lo, hi in self._metadata_spans:
            f[lo:hi] = self.template_f[lo:hi]
        for i, value in preserved:
            f[i] = value
        if self._sm["instance_type"] >= 0:
            f[self._sm["instance_type"]] = itype

    @staticmethod
    def _copy(p: RPacket) -> RPacket:
        q = RPacket(p.f.copy(), p.v.copy(), p.length, p.stk.copy() if p.stk else None)
        q.payload, q.poff = p.payload, p.poff
        return q

    def _replicate(self, p: RPacket, replicas: list[tuple[int, int]], egress_q: deque[tuple[int, RPacket]]) -> None:
        rid = self._sm.get("egress_rid", -1)
        itype = self._sm["instance_type"]
        for eport, r in replicas:
            q = self._copy(p)
            if self.trace is not None:
                self.trace.instance(q, q.f[itype] if itype >= 0 else REPLICATION, eport)
            if rid >= 0:
                q.f[rid] = r & self._mask(rid)
            egress_q.append((eport, q))

    def _ingress_step(
        self,
        port: int,
        data: bytes,
        preserved: list[tuple[int, int]] | None,
        itype: int,
        ingress_q: deque[tuple[int, bytes, list[tuple[int, int]] | None, int]],
        egress_q: deque[tuple[int, RPacket]],
    ) -> None:
        sm, tr = self._sm, self.trace
        p = self._new_packet(port, data, preserved, itype)
        if tr is not None and preserved is None:
            tr.received(p, port)
        elif tr is not None:
            tr.instance(p, itype)
        try:
            self.parser(p, data)
            self.verify_checksums(p, [])
            self.ingress(p)
        except PacketAbort as exc:
            if tr is not None:
                tr.after_ingress(p, sm, exc)
            return
        if tr is not None:
            tr.after_ingress(p, sm)
        f = p.f
        if p.clone is not None:
            session, fl = p.clone
            replicas = self.pre.clone_sessions.get(session)
            if replicas is not None:
                # The clone is parsed again from the received bytes (with the ingress port set first,
                # as simple_switch does), then its metadata is reset and the field list copied.
                q = self._new_packet(port, data, None, NORMAL)
                if tr is not None:
                    tr.debug(f"Clone session {session}: the received frame parsed again for its copies")
                try:
                    self.parser(q, data)
                except PacketAbort:
                    q = None  # type: ignore[assignment]
                if q is not None:
                    self._reset_metadata(q, self._preserved(p, fl), INGRESS_CLONE)
                    self._replicate(q, replicas, egress_q)
        if p.learn:  # after ingress cloning, before resubmit, as simple_switch's ingress thread
            self._learned(p)
        if p.resubmit:
            ingress_q.append((port, data, self._preserved(p, p.resubmit), RESUBMIT))
            return
        mgid = f[sm["mcast_grp"]] if sm["mcast_grp"] >= 0 else 0
        if mgid:
            if sm["instance_type"] >= 0:
                f[sm["instance_type"]] = REPLICATION
            self._replicate(p, self.pre.groups.get(mgid, []), egress_q)
            return
        egress_spec = f[sm["egress_spec"]]
        if egress_spec == DROP_PORT:
            return
        if sm["instance_type"] >= 0:
            f[sm["instance_type"]] = NORMAL
        egress_q.append((egress_spec, p))

    def _egress_step(
        self,
        eport: int,
        p: RPacket,
        ingress_q: deque[tuple[int, bytes, list[tuple[int, int]] | None, int]],
        egress_q: deque[tuple[int, RPacket]],
        out: list[tuple[int, bytes]],
    ) -> None:
        sm, f, tr = self._sm, p.f, self.trace
        if tr is not None:
            tr.resume(p)
        p.exited, p.clone, p.resubmit, p.recirc = False, None, 0, 0
        f[sm["egress_port"]] = eport
        f[sm["egress_spec"]] = self._egress_spec_init
        if sm["egress_global_timestamp"] >= 0:
            f[sm["egress_global_timestamp"]] = self.clock.now_us()
        try:
            self.egress(p)
        except PacketAbort as exc:
            if tr is not None:
                tr.after_egress(p, sm, exc)
            return
        if tr is not None:
            tr.after_egress(p, sm)
        if p.clone is not None:
            session, fl = p.clone
            replicas = self.pre.clone_sessions.get(session)
            if replicas is not None:  # a copy of the packet as egress left it, metadata reset
                q = self._copy(p)
                self._reset_metadata(q, self._preserved(p, fl), EGRESS_CLONE)
                self._replicate(q, replicas, egress_q)
        if f[sm["egress_spec"]] == DROP_PORT:
            return
        self.update_checksums(p, [])
        data = self.deparse(p)
        if p.recirc:
            ingress_q.append((0, data, self._preserved(p, p.recirc), RECIRC))
            return
        out.append((eport, data))
