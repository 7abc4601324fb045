"""The packet trace of `--log-console` (bmv2's console log of the packet path), built only when asked for.

A traced program is compiled apart from an untraced one: its parser and pipelines run on the closure
interpreters of dpu_softswitch.switch wrapped here, and its actions primitive by primitive, so the generated
code of an untraced program holds no tracing and its packet path tests nothing. The messages follow
bmv2's (`[packet id.copy id] Parser 'parser' entering state 'start'`, `Table 'I.t': hit`, ...), each
with bmv2's level letter: D (debug) for what a packet does, T (trace) for detail within it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from .profiles import NO_ACTION
from .switch.actions import ActionDef, Primitives
from .switch.calculations import Calculations
from .switch.expressions import Expressions
from .switch.layout import Layout
from .switch.loader import Objects
from .switch.packet import DROP_PORT, Packet, PacketAbort, ParserError, Stmt
from .switch.parsing import ParseFn, ParserDef
from .switch.pipeline import PipelineDef, TableDef

COLOURS = ("GREEN", "YELLOW", "RED")
_INSTANCE = {1: "ingress clone", 2: "egress clone", 4: "recirculated", 5: "replica", 6: "resubmitted"}


class Tracer:
    """Writes one target's packet trace: bmv2's console format, `detail` adding its trace-level lines."""

    def __init__(self, out: TextIO | None = None, detail: bool = True, cpu_port: int | None = None) -> None:
        self.out = out or sys.stdout
        self.detail = detail
        self.cpu_port = cpu_port
        self.packets = -1  # the last packet id given (bmv2 numbers received packets from 0)
        self.tag = "[-]"
        self._copies = 0
        self._ids: dict[int, str] = {}  # id(packet) -> its tag, while the received packet is in the switch
        self._second, self._hms = -1, ""

    def debug(self, msg: str) -> None:
        """A debug-level line about the current packet."""
        self._write("D", msg)

    def info(self, msg: str) -> None:
        """An info-level line (log_msg's messages)."""
        self._write("I", msg)

    def trace(self, msg: str) -> None:
        """A trace-level line (written at --log-level trace only)."""
        if self.detail:
            self._write("T", msg)

    def _write(self, level: str, msg: str) -> None:
        now = time.time()
        second = int(now)
        if second != self._second:  # strftime once a second: it is most of a line's cost
            self._second, self._hms = second, time.strftime("%H:%M:%S", time.localtime(second))
        self.out.write(f"[{self._hms}.{int(now * 1000) % 1000:03d}] [softswitch] [{level}] {self.tag} [cxt 0] {msg}\n")

    # ---------------------------------------------------------------- packet instances

    def received(self, p: Packet, port: int) -> None:
        """A packet from a port: a new packet id."""
        self.packets += 1
        self._copies = 0
        self._ids = {}
        self._enter(p, 0)
        cpu = " (the CPU port: a PacketOut)" if port == self.cpu_port else ""
        self.debug(f"Processing packet received on port {port}{cpu}")

    def instance(self, p: Packet, itype: int, port: int = -1) -> None:
        """A copy, resubmission or recirculation of the packet being processed: a new copy id."""
        self._copies += 1
        self._enter(p, self._copies)
        self.debug(f"Processing {_INSTANCE.get(itype, 'copy of')} packet" + (f" for port {port}" if port >= 0 else ""))

    def resume(self, p: Packet) -> None:
        """The packet (or copy) `p` goes on: its tag on the lines that follow."""
        self.tag = self._ids.get(id(p), self.tag)

    def _enter(self, p: Packet, copy: int) -> None:
        self.tag = f"[{self.packets}.{copy}]"
        self._ids[id(p)] = self.tag

    def outputs(self, out: list[tuple[int, bytes]]) -> None:
        """The frames the received packet left as, or that it left as none."""
        self.tag = f"[{self.packets}.*]"
        for port, frame in out:
            cpu = " (CPU port: a PacketIn)" if port == self.cpu_port else ""
            self.debug(f"Transmitting packet of size {len(frame)} out of port {port}{cpu}")
        if not out:
            self.debug("No packet out: dropped")
        self.out.flush()  # once a packet, not once a line

    # ---------------------------------------------------------------- traced parts

    def parser(self, pd: ParserDef, layout: Layout, errors: dict[str, int]) -> ParseFn:
        """The parser's state machine (parsing.interpret) with the states it enters and what they extract."""
        init, states, perr = pd.init, pd.states, pd.perr
        names = {code: name for name, code in errors.items()}
        headers = layout.header_list

        def parse(p: Packet, data: bytes) -> bool:
            self.debug("Parser 'parser': start")
            state: str | None = init
            off = 0
            try:
                while state is not None:
                    self.debug(f"Parser 'parser' entering state '{state}'")
                    before = p.v.copy()
                    nxt, off = states[state](p, data, off)
                    for k, (was, now) in enumerate(zip(before, p.v, strict=True)):
                        if now and not was:
                            self.debug(f"Extracting header '{headers[k].name}'")
                    self.trace(f"Bytes parsed: {off}")
                    self.trace(f"Parser state '{state}': next state {repr(nxt) if nxt else 'accept'}")
                    state = nxt
            except ParserError as err:
                self.debug(f"Parser 'parser': error {names.get(err.code, err.code)} at byte {err.offset}")
                if perr >= 0:
                    p.f[perr] = err.code
                p.payload, p.poff = data, err.offset
                return False
            p.payload, p.poff = data, off
            self.debug("Parser 'parser': end")
            return True

        return parse

    def pipeline(self, pd: PipelineDef, exprs: Expressions) -> Callable[[Packet], None]:
        """The pipeline interpreter (pipeline.interpret) with conditions and table applications."""
        init, nodes, name = pd.init, pd.nodes, pd.name
        conds: dict[str, tuple[Callable[[Packet, list[int]], int], str | None, str | None, str]] = {}
        for cname, c in pd.conds.items():
            fn = exprs.expr(c["expression"], f"conditional {cname} in {name}")
            conds[cname] = (fn, c.get("true_next"), c.get("false_next"), _source(c, "Condition", f" ({cname})"))

        def run(p: Packet) -> None:
            self.debug(f"Pipeline '{name}': start")
            node = init
            while node is not None and not p.exited:
                cond = conds.get(node)
                if cond is not None:
                    fn, t, f, text = cond
                    value = bool(fn(p, []))
                    self.trace(f"{text} is {'true' if value else 'false'}")
                    node = t if value else f
                else:
                    node = self._table(pd.tables[node], nodes[node], p)
            if p.exited:
                self.debug(f"Pipeline '{name}': exit")
            self.debug(f"Pipeline '{name}': end")

        return run

    def _table(self, tdef: TableDef, apply: Callable[[Packet], str | None], p: Packet) -> str | None:
        self.trace(f"Applying table '{tdef.name}'")
        key = tdef.key_fn(p)
        lines = "".join(f"\n* {n:<20}: {v:x}" for n, v in zip(tdef.key_names, key, strict=False))
        self.debug(f"Looking up key:{lines}")
        entry = tdef.table.lookup(key)  # lookups have no side effects: the node looks up again
        if entry is None:
            self.debug(f"Table '{tdef.name}': miss")
            if tdef.default_action_id == NO_ACTION:
                self.debug(f"Table '{tdef.name}' has no default action: none runs")
        else:
            prio = f", priority {entry.priority}" if tdef.table.needs_priority else ""
            kinds = [k.match_type for k in tdef.table.key]
            shown = entry.meta.get("program", entry.match)  # a const entry as the program wrote it
            self.debug(f"Table '{tdef.name}': hit, entry {_match(shown, kinds)}{prio}")
        nxt = apply(p)
        dm = tdef.direct_meter
        if entry is not None and dm is not None:
            colour = p.f[dm.result]
            self.debug(
                f"Direct meter of '{tdef.name}' (run before the action): {COLOURS[colour] if colour < 3 else colour}"
            )
        if entry is not None and tdef.with_counters:
            self.trace(f"Direct counter of '{tdef.name}': {entry.packets} packets, {entry.bytes} bytes")
        self.trace(f"Table '{tdef.name}': next node {nxt!r}" if nxt else f"Table '{tdef.name}': end of pipeline")
        return nxt

    def action(self, adef: ActionDef, body: Stmt) -> Stmt:
        """An action body that says which action runs with which parameters."""
        name, pnames = adef.name, adef.param_names

        def traced_action(p: Packet, ad: list[int]) -> None:
            params = ", ".join(f"{n}={v:#x}" for n, v in zip(pnames, ad, strict=False))
            self.debug(f"Action entry is {name}({params})")
            body(p, ad)

        return traced_action

    def deparser(
        self, order: list[str], layout: Layout, deparse: Callable[[Packet], bytes]
    ) -> Callable[[Packet], bytes]:
        """The deparser, naming the headers it emits."""
        headers = [(name, layout.headers[name].index) for name in order if name in layout.headers]

        def traced_deparse(p: Packet) -> bytes:
            self.debug("Deparser 'deparser': start")
            for name, k in headers:
                if p.v[k]:
                    self.debug(f"Deparsing header '{name}'")
            data = deparse(p)
            self.debug("Deparser 'deparser': end")
            return data

        return traced_deparse

    # ---------------------------------------------------------------- decisions (v1model)

    def after_ingress(self, p: Any, sm: dict[str, int], exc: PacketAbort | None = None) -> None:
        """What ingress decided for the packet: clone, resubmit, multicast, drop or an egress port."""
        if exc is not None:
            self.debug(f"{exc}: packet dropped")
            return
        f = p.f
        if getattr(p, "clone", None) is not None:
            self.debug(f"Cloning packet at ingress to session {p.clone[0]}")
        if p.learn:
            self.debug(f"Digest generated (learn list {p.learn})")
        if getattr(p, "resubmit", 0):
            self.debug("Resubmitting packet")
            return
        mgid = f[sm["mcast_grp"]] if sm.get("mcast_grp", -1) >= 0 else 0
        if mgid:
            self.debug(f"Multicast requested for packet, group {mgid}")
            return
        spec = f[sm["egress_spec"]]
        if spec == DROP_PORT:
            self.debug("Dropping packet at the end of ingress")
        else:
            self.debug(f"Egress port is {spec}" + (" (the CPU port)" if spec == self.cpu_port else ""))

    def after_egress(self, p: Any, sm: dict[str, int], exc: PacketAbort | None = None) -> None:
        """What egress decided: clone, drop, recirculate or transmit."""
        if exc is not None:
            self.debug(f"{exc}: packet dropped")
            return
        if getattr(p, "clone", None) is not None:
            self.debug(f"Cloning packet at egress to session {p.clone[0]}")
        if p.f[sm["egress_spec"]] == DROP_PORT:
            self.debug("Dropping packet at the end of egress")
        elif getattr(p, "recirc", 0):
            self.debug("Recirculating packet")


class TracedPrimitives(Primitives):
    """Primitives that say what they do: their source, egress_spec changes, meter colours, counter and
    register cells."""

    def __init__(self, objs: Objects, exprs: Expressions, calcs: Calculations, tracer: Tracer) -> None:
        super().__init__(objs, exprs, calcs)
        self.tracer = tracer

    def primitive(self, prim: dict[str, Any], where: str) -> Stmt:
        """The primitive's closure, wrapped to trace it."""
        stmt = super().primitive(prim, where)
        op, params = prim.get("op"), prim.get("parameters", [])
        tr, es = self.tracer, self.sm["egress_spec"]
        text = _source(prim, "Primitive", f" {op}")
        # An extern call: its name, index, the field it writes (meter colour, register value; -1: none)
        # and the value it writes into a register cell.
        name, idx, out, value = "", None, -1, None
        if op in ("execute_meter", "count", "register_write"):
            name, idx = str(params[0].get("value")), self.exprs.expr(params[1], where)
            out = self.layout.field(params[2].get("value"), where) if op == "execute_meter" else -1
            value = self.exprs.expr(params[2], where) if op == "register_write" else None
        elif op == "register_read":
            name, idx = str(params[1].get("value")), self.exprs.expr(params[2], where)
            out = self.layout.field(params[0].get("value"), where)

        if op == "log_msg":  # untraced it is a no-op; traced it prints its message, as bmv2 does
            return self._log_msg(params, text, where)

        def traced(p: Packet, ad: list[int]) -> None:
            tr.trace(text)
            spec = p.f[es]
            # The index and a written value are read before the primitive runs, which may change them.
            i = idx(p, ad) if idx is not None else 0
            written = value(p, ad) if value is not None else 0
            stmt(p, ad)
            if op == "execute_meter":
                colour = p.f[out]
                tr.debug(f"Meter '{name}'[{i}]: {COLOURS[colour] if colour < len(COLOURS) else colour}")
            elif op == "count":
                tr.debug(f"Counter '{name}'[{i}] counted")
            elif op == "register_read":
                tr.debug(f"Register '{name}'[{i}] read: {p.f[out]:#x}")
            elif op == "register_write":
                tr.debug(f"Register '{name}'[{i}] written: {written:#x}")
            if p.f[es] != spec:
                drop = " (mark_to_drop: dropped)" if p.f[es] == DROP_PORT else ""
                tr.debug(f"standard_metadata.egress_spec: {spec} -> {p.f[es]}{drop}")

        return traced

    def _log_msg(self, params: list[Any], text: str, where: str) -> Stmt:
        """log_msg(format, {values}): the format's `{}`s filled with the values, in decimal."""
        fmt = str(params[0].get("value", "")) if params else ""
        vector = params[1].get("value") if len(params) > 1 else None
        args = [self.exprs.expr(a, where) for a in vector] if isinstance(vector, list) else []
        tr = self.tracer

        def log_msg(p: Packet, ad: list[int]) -> None:
            tr.trace(text)
            values = iter(str(a(p, ad)) for a in args)
            tr.info("".join(part + next(values, "") for part in fmt.split("{}")[:-1]) + fmt.split("{}")[-1])

        return log_msg


def _source(doc: dict[str, Any], what: str, fallback: str) -> str:
    """`what` with the P4 source position and fragment p4c recorded, as bmv2 prints them (`fallback`
    names the construct when p4c recorded none)."""
    si = doc.get("source_info") or {}
    if not si:
        return what + fallback
    where = f"{str(si.get('filename', '')).rsplit('/', 1)[-1]}({si.get('line', '?')})"
    fragment = si.get("source_fragment", "")
    if what == "Condition":  # bmv2: Condition "hdr.h.isValid()" (node_2) is true
        return f'{where} Condition "{fragment}"{fallback}'
    return f"{where} {what} {fragment}"


# How bmv2 dumps a match field of each kind: value/prefix, value &&& mask, low -> high, else the value.
_SHOW_MATCH: dict[str, Callable[[Any], str]] = {
    "lpm": lambda m: f"{m[0]:x}/{m[1]}",
    "ternary": lambda m: f"{m[0]:x} &&& {m[1]:x}",
    "range": lambda m: f"{m[0]:x} -> {m[1]:x}",
}


def _match(match: tuple[Any, ...], kinds: list[str]) -> str:
    """An entry's match, field by field as bmv2 dumps them."""
    return "[" + ", ".join(_SHOW_MATCH.get(k, lambda m: f"{m:x}")(m) for k, m in zip(kinds, match, strict=False)) + "]"
