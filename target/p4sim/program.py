"""Load a bmv2 JSON program (as p4c-bm2-ss emits it for v1model) and compile it into closures.

The JSON is compiled once, at SetForwardingPipelineConfig time: every expression, primitive,
parser state and pipeline node becomes a Python closure over precomputed field offsets, so that
the per-packet path does no name lookups and no JSON walking. Constructs this target does not
implement are rejected here, with the construct's name, never later at packet time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ProgramError, UnsupportedConstruct
from .externs import RED, Clock, CounterArray, MeterArray, RegisterArray
from .tables import Entry, KeyField, Table

DROP_PORT = 511  # simple_switch's default drop port; mark_to_drop sets egress_spec to it.


class Packet:
    """Per-packet state: header fields (flat), header validity, the unparsed payload."""

    __slots__ = ("exited", "f", "length", "payload", "v")

    def __init__(self, f: list[int], v: list[bool], length: int) -> None:
        self.f = f
        self.v = v
        self.payload = b""
        self.length = length
        self.exited = False


Expr = Callable[[Packet, list[int]], int]
Stmt = Callable[[Packet, list[int]], None]


@dataclass
class HeaderLayout:
    """Where one header instance's fields live in the flat field list."""

    name: str
    index: int
    base: int
    widths: list[int]
    names: list[str]
    metadata: bool

    @property
    def nbytes(self) -> int:
        """Header size in bytes (headers are byte-aligned in v1model)."""
        return sum(self.widths) // 8


@dataclass
class ActionDef:
    """A compiled action: its name, parameter widths and body."""

    id: int
    name: str
    param_widths: list[int]
    param_names: list[str]
    body: Stmt


@dataclass
class TableDef:
    """A compiled table and how control flows out of it."""

    name: str
    id: int
    table: Table
    key_fn: Callable[[Packet], tuple[int, ...]]
    action_ids: list[int]
    default_action_id: int
    default_action_data: list[int]
    default_const: bool
    next_by_action: dict[int, str | None]
    next_hit: str | None
    next_miss: str | None
    uses_hit_miss: bool
    with_counters: bool
    const_entries: bool = False
    key_names: list[str] = field(default_factory=list)


class Program:
    """A bmv2 JSON program compiled for execution."""

    def __init__(self, doc: dict[str, Any], clock: Clock | None = None) -> None:
        if not isinstance(doc, dict):
            raise ProgramError("bmv2 JSON: top level must be an object")
        self.doc = doc
        self.clock = clock or Clock()
        self.headers: dict[str, HeaderLayout] = {}
        self.header_list: list[HeaderLayout] = []
        self.field_index: dict[tuple[str, str], int] = {}
        self.nfields = 0
        self.errors: dict[str, int] = {}
        self.counters: dict[str, CounterArray] = {}
        self.meters: dict[str, MeterArray] = {}
        self.registers: dict[str, RegisterArray] = {}
        self.actions: dict[int, ActionDef] = {}
        self.tables: dict[str, TableDef] = {}
        self._load_layout()
        self._load_errors()
        self._sm = {
            name: self.field_index.get(("standard_metadata", name), -1)
            for name in (
                "ingress_port",
                "egress_spec",
                "egress_port",
                "packet_length",
                "mcast_grp",
                "instance_type",
                "ingress_global_timestamp",
                "egress_global_timestamp",
                "parser_error",
                "checksum_error",
            )
        }
        for need in ("ingress_port", "egress_spec", "egress_port"):
            if self._sm[need] < 0:
                raise ProgramError(f"bmv2 JSON: standard_metadata.{need} is missing (not a v1model program?)")
        self._load_externs()
        self._check_unsupported_sections()
        self._load_actions()
        self.parser = self._load_parser()
        self.deparse = self._load_deparser()
        self.verify_checksums, self.update_checksums = self._load_checksums()
        pipelines = {p.get("name"): p for p in self._list("pipelines")}
        for name in ("ingress", "egress"):
            if name not in pipelines:
                raise ProgramError(f"bmv2 JSON: pipeline {name!r} is missing")
        self.ingress = self._load_pipeline(pipelines["ingress"])
        self.egress = self._load_pipeline(pipelines["egress"])
        self.template_f = [0] * self.nfields
        self.template_v = [h.metadata for h in self.header_list]

    @classmethod
    def from_bytes(cls, data: bytes, clock: Clock | None = None) -> Program:
        """Parse and compile bmv2 JSON bytes."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProgramError(f"bmv2 JSON: not valid JSON: {exc}") from exc
        return cls(doc, clock)

    # ---------------------------------------------------------------- loading helpers

    def _list(self, key: str) -> list[Any]:
        value = self.doc.get(key, [])
        if not isinstance(value, list):
            raise ProgramError(f"bmv2 JSON: {key!r} must be a list")
        return value

    def _load_layout(self) -> None:
        types: dict[str, list[tuple[str, int]]] = {}
        for ht in self._list("header_types"):
            fields = []
            for fdef in ht.get("fields", []):
                name, width = fdef[0], fdef[1]
                if width == "*" or (len(fdef) > 2 and fdef[2] not in (False, None)):
                    raise UnsupportedConstruct("variable-length or signed field", f"header type {ht['name']}")
                fields.append((name, int(width)))
            types[ht["name"]] = fields
        base = 0
        for i, h in enumerate(self._list("headers")):
            ftypes = types.get(h.get("header_type", ""))
            if ftypes is None:
                raise ProgramError(f"bmv2 JSON: header {h.get('name')!r} has unknown type {h.get('header_type')!r}")
            layout = HeaderLayout(
                name=h["name"],
                index=i,
                base=base,
                widths=[w for _, w in ftypes],
                names=[n for n, _ in ftypes],
                metadata=bool(h.get("metadata")),
            )
            if not layout.metadata and sum(layout.widths) % 8:
                raise ProgramError(f"bmv2 JSON: header {layout.name!r} is not a whole number of bytes")
            for j, (fname, _) in enumerate(ftypes):
                self.field_index[(layout.name, fname)] = base + j
            base += len(ftypes)
            self.headers[layout.name] = layout
            self.header_list.append(layout)
        self.nfields = base
        self.field_width = [0] * base
        for layout in self.header_list:
            for j, w in enumerate(layout.widths):
                self.field_width[layout.base + j] = w
        for key in ("header_stacks", "header_union_types", "header_unions", "header_union_stacks"):
            if self._list(key):
                raise UnsupportedConstruct(key, "program")

    def _load_errors(self) -> None:
        for name, value in self.doc.get("errors", []):
            self.errors[name] = int(value)

    def _load_externs(self) -> None:
        for c in self._list("counter_arrays"):
            if c.get("is_direct"):
                continue  # direct counters live on table entries
            self.counters[c["name"]] = CounterArray(c["name"], int(c["size"]))
        for m in self._list("meter_arrays"):
            if m.get("is_direct"):
                raise UnsupportedConstruct("direct meter", m["name"])
            unit = m.get("type", "bytes")
            if unit not in ("bytes", "packets"):
                raise ProgramError(f"bmv2 JSON: meter {m['name']!r} has unknown type {unit!r}")
            self.meters[m["name"]] = MeterArray(m["name"], int(m["size"]), int(m.get("rate_count", 2)), unit)
        for r in self._list("register_arrays"):
            self.registers[r["name"]] = RegisterArray(r["name"], int(r["size"]), int(r["bitwidth"]))

    def _check_unsupported_sections(self) -> None:
        for key in ("parse_vsets", "learn_lists", "extern_instances"):
            if self._list(key):
                raise UnsupportedConstruct(key, "program")
        for pipe in self._list("pipelines"):
            if pipe.get("action_profiles"):
                raise UnsupportedConstruct("action_profiles", f"pipeline {pipe.get('name')}")

    # ---------------------------------------------------------------- expressions

    def _field(self, ref: Any, where: str) -> int:
        try:
            hdr, fname = ref
            return self.field_index[(hdr, fname)]
        except (KeyError, TypeError, ValueError):
            raise ProgramError(f"bmv2 JSON: unknown field {ref!r} in {where}") from None

    def _header(self, name: Any, where: str) -> HeaderLayout:
        layout = self.headers.get(name) if isinstance(name, str) else None
        if layout is None:
            raise ProgramError(f"bmv2 JSON: unknown header {name!r} in {where}")
        return layout

    def expr(self, node: Any, where: str) -> Expr:
        """Compile an expression node into a closure returning an int (booleans as 0/1)."""
        if not isinstance(node, dict) or "type" not in node:
            raise ProgramError(f"bmv2 JSON: malformed expression {node!r} in {where}")
        kind: str = node["type"]
        value: Any = node.get("value")
        if kind == "field":
            if isinstance(value, list) and len(value) == 2 and value[1] == "$valid$":
                h = self._header(value[0], where).index
                return lambda p, ad: 1 if p.v[h] else 0
            i = self._field(value, where)
            return lambda p, ad: p.f[i]
        if kind == "hexstr":
            c = int(value, 16)
            return lambda p, ad: c
        if kind == "bool":
            b = 1 if value else 0
            return lambda p, ad: b
        if kind == "runtime_data":
            k = int(value)
            return lambda p, ad: ad[k]
        if kind == "header":
            h = self._header(value, where).index
            return lambda p, ad: 1 if p.v[h] else 0
        if kind == "expression":
            # p4c sometimes wraps an expression node in another one.
            if isinstance(value, dict) and "op" not in value:
                return self.expr(value, where)
            return self._op(value, where)
        raise UnsupportedConstruct(f"expression type {kind}", where)

    def _op(self, node: dict[str, Any], where: str) -> Expr:
        op = node.get("op")
        left_node, right_node = node.get("left"), node.get("right")
        if op == "?:":
            c = self.expr(node["cond"], where)
            a = self.expr(left_node, where)
            b = self.expr(right_node, where)
            return lambda p, ad: a(p, ad) if c(p, ad) else b(p, ad)
        if op == "valid":
            return self.expr(right_node, where)
        if op in ("d2b", "b2d"):
            r = self.expr(right_node, where)
            return lambda p, ad: 1 if r(p, ad) else 0
        if op == "not":
            r = self.expr(right_node, where)
            return lambda p, ad: 0 if r(p, ad) else 1
        if op == "~" and left_node is None:
            r = self.expr(right_node, where)
            return lambda p, ad: ~r(p, ad)
        if op == "-" and left_node is None:
            r = self.expr(right_node, where)
            return lambda p, ad: -r(p, ad)
        if op == "two_comp_mod":
            a = self.expr(left_node, where)
            width = int(self.expr(right_node, where)(None, []))  # type: ignore[arg-type]
            mask, sign = (1 << width) - 1, 1 << (width - 1)
            return lambda p, ad: ((a(p, ad) & mask) ^ sign) - sign
        binary = _BINARY.get(op or "")
        if binary is None:
            raise UnsupportedConstruct(f"operator {op}", where)
        a = self.expr(left_node, where)
        b = self.expr(right_node, where)
        return binary(a, b)

    # ---------------------------------------------------------------- primitives and actions

    def _primitive(self, prim: dict[str, Any], where: str) -> Stmt:
        op = prim.get("op")
        params = prim.get("parameters", [])
        where = f"{where}: primitive {op}"
        if op in ("assign", "modify_field"):
            dst, src = params
            if dst.get("type") == "header":
                return self._assign_header(dst["value"], src, where)
            i = self._field(dst.get("value"), where)
            mask = (1 << self.field_width[i]) - 1
            s = self.expr(src, where)

            def assign(p: Packet, ad: list[int]) -> None:
                p.f[i] = s(p, ad) & mask

            return assign
        if op == "mark_to_drop" or op == "drop":
            es, mg = self._sm_field("egress_spec"), self._sm.get("mcast_grp", -1)

            def mark_to_drop(p: Packet, ad: list[int]) -> None:
                p.f[es] = DROP_PORT
                if mg >= 0:
                    p.f[mg] = 0

            return mark_to_drop
        if op == "count":
            arr = self._extern(self.counters, params[0], where)
            idx = self.expr(params[1], where)
            return lambda p, ad: arr.count(idx(p, ad), p.length)
        if op == "execute_meter":
            marr = self._extern(self.meters, params[0], where)
            idx = self.expr(params[1], where)
            out = self._field(params[2].get("value"), where)
            omask = (1 << self.field_width[out]) - 1
            now = self.clock.now_us

            def execute_meter(p: Packet, ad: list[int]) -> None:
                p.f[out] = marr.execute(idx(p, ad), p.length, now()) & omask

            return execute_meter
        if op == "register_read":
            out = self._field(params[0].get("value"), where)
            omask = (1 << self.field_width[out]) - 1
            rarr = self._extern(self.registers, params[1], where)
            idx = self.expr(params[2], where)

            def register_read(p: Packet, ad: list[int]) -> None:
                p.f[out] = rarr.read(idx(p, ad)) & omask

            return register_read
        if op == "register_write":
            rarr = self._extern(self.registers, params[0], where)
            idx = self.expr(params[1], where)
            val = self.expr(params[2], where)
            return lambda p, ad: rarr.write(idx(p, ad), val(p, ad))
        if op in ("add_header", "setValid"):
            h = self._header(params[0].get("value"), where)
            lo, hi = h.base, h.base + len(h.widths)

            def add_header(p: Packet, ad: list[int]) -> None:
                if not p.v[h.index]:
                    p.f[lo:hi] = [0] * (hi - lo)
                    p.v[h.index] = True

            return add_header
        if op in ("remove_header", "setInvalid"):
            hi_ = self._header(params[0].get("value"), where).index

            def remove_header(p: Packet, ad: list[int]) -> None:
                p.v[hi_] = False

            return remove_header
        if op == "exit":

            def exit_(p: Packet, ad: list[int]) -> None:
                p.exited = True

            return exit_
        if op in ("no_op", "log_msg"):
            return lambda p, ad: None
        if op in ("assert", "assume"):
            cond = self.expr(params[0], where)

            def check(p: Packet, ad: list[int]) -> None:
                if not cond(p, ad):
                    raise PacketAbort(f"{op} failed")

            return check
        raise UnsupportedConstruct(f"primitive {op}", where)

    def _assign_header(self, dst_name: str, src: dict[str, Any], where: str) -> Stmt:
        dst = self._header(dst_name, where)
        s = self._header(src.get("value"), where)
        if dst.widths != s.widths:
            raise ProgramError(f"bmv2 JSON: header assignment between different types in {where}")
        dlo, slo, n = dst.base, s.base, len(dst.widths)

        def assign_header(p: Packet, ad: list[int]) -> None:
            p.f[dlo : dlo + n] = p.f[slo : slo + n]
            p.v[dst.index] = p.v[s.index]

        return assign_header

    def _extern(self, table: dict[str, Any], ref: dict[str, Any], where: str) -> Any:
        obj = table.get(str(ref.get("value")))
        if obj is None:
            raise ProgramError(f"bmv2 JSON: unknown extern {ref.get('value')!r} in {where}")
        return obj

    def _sm_field(self, name: str) -> int:
        return self._sm[name]

    def _body(self, prims: list[dict[str, Any]], where: str) -> Stmt:
        ops = [(p.get("op"), p) for p in prims]
        if any(op in ("_jump", "_jump_if_zero") for op, _ in ops):
            return self._body_with_jumps(prims, where)
        stmts = [self._primitive(p, where) for p in prims]

        def body(p: Packet, ad: list[int]) -> None:
            for s in stmts:
                s(p, ad)
                if p.exited:
                    return

        return body

    def _body_with_jumps(self, prims: list[dict[str, Any]], where: str) -> Stmt:
        # p4c lowers if-statements inside actions to _jump/_jump_if_zero with absolute offsets.
        program: list[tuple[int, Any, Any]] = []
        for prim in prims:
            op = prim.get("op")
            params = prim.get("parameters", [])
            if op == "_jump":
                program.append((1, int(params[0]["value"]), None))
            elif op == "_jump_if_zero":
                program.append((2, int(params[1]["value"]), self.expr(params[0], where)))
            else:
                program.append((0, self._primitive(prim, where), None))

        def body(p: Packet, ad: list[int]) -> None:
            pc = 0
            while pc < len(program):
                kind, a, cond = program[pc]
                if kind == 0:
                    a(p, ad)
                    if p.exited:
                        return
                    pc += 1
                elif kind == 1 or not cond(p, ad):
                    pc = a
                else:
                    pc += 1

        return body

    def _load_actions(self) -> None:
        for a in self._list("actions"):
            where = f"action {a.get('name')}"
            self.actions[int(a["id"])] = ActionDef(
                id=int(a["id"]),
                name=a["name"],
                param_widths=[int(r["bitwidth"]) for r in a.get("runtime_data", [])],
                param_names=[r["name"] for r in a.get("runtime_data", [])],
                body=self._body(a.get("primitives", []), where),
            )

    # ---------------------------------------------------------------- parser and deparser

    def _load_parser(self) -> Callable[[Packet, bytes], None]:
        parsers = self._list("parsers")
        if len(parsers) != 1:
            raise ProgramError(f"bmv2 JSON: expected one parser, found {len(parsers)}")
        pdef = parsers[0]
        too_short = self.errors.get("PacketTooShort", 1)
        perr = self._sm.get("parser_error", -1)
        states: dict[str, Callable[[Packet, bytes, int], tuple[str | None, int]]] = {}
        for st in pdef.get("parse_states", []):
            states[st["name"]] = self._parse_state(st, too_short, perr)
        init = pdef.get("init_state")
        if init not in states:
            raise ProgramError(f"bmv2 JSON: parser init_state {init!r} is not a state")

        def parse(p: Packet, data: bytes) -> None:
            state: str | None = init
            off = 0
            try:
                while state is not None:
                    state, off = states[state](p, data, off)
            except ParserError as err:
                if perr >= 0:
                    p.f[perr] = err.code
                off = err.offset
            p.payload = data[off:]

        return parse

    def _parse_state(
        self, st: dict[str, Any], too_short: int, perr: int
    ) -> Callable[[Packet, bytes, int], tuple[str | None, int]]:
        where = f"parser state {st.get('name')}"
        ops: list[Callable[[Packet, bytes, int], int]] = []
        for op in st.get("parser_ops", []):
            ops.append(self._parser_op(op, where, too_short))
        key_fns: list[tuple[Expr, int]] = []
        for k in st.get("transition_key", []):
            if k.get("type") != "field":
                raise UnsupportedConstruct(f"transition key type {k.get('type')}", where)
            i = self._field(k["value"], where)
            key_fns.append((_field_expr(i), self.field_width[i]))
        transitions: list[tuple[int | None, int, str | None]] = []
        for t in st.get("transitions", []):
            ttype = t.get("type")
            nxt = t.get("next_state")
            if ttype == "default":
                transitions.append((None, 0, nxt))
            elif ttype == "hexstr":
                value = int(t["value"], 16)
                mask = int(t["mask"], 16) if t.get("mask") else -1
                transitions.append((value & mask, mask, nxt))
            else:
                raise UnsupportedConstruct(f"transition type {ttype}", where)

        def state(p: Packet, data: bytes, off: int) -> tuple[str | None, int]:
            for op in ops:
                off = op(p, data, off)
            if not transitions:
                return None, off
            key = 0
            for fn, width in key_fns:
                key = (key << width) | fn(p, [])
            for value, mask, nxt in transitions:
                if value is None or key & mask == value:
                    return nxt, off
            return None, off  # no match: bmv2 accepts

        return state

    def _parser_op(self, op: dict[str, Any], where: str, too_short: int) -> Callable[[Packet, bytes, int], int]:
        kind = op.get("op")
        params = op.get("parameters", [])
        if kind == "extract":
            if params[0].get("type") != "regular":
                raise UnsupportedConstruct(f"extract of {params[0].get('type')}", where)
            h = self._header(params[0]["value"], where)
            nbytes, base, hidx = h.nbytes, h.base, h.index
            shifts = []
            pos = sum(h.widths)
            for w in h.widths:
                pos -= w
                shifts.append((pos, (1 << w) - 1))

            def extract(p: Packet, data: bytes, off: int) -> int:
                end = off + nbytes
                if end > len(data):
                    raise ParserError(too_short, off)
                value = int.from_bytes(data[off:end], "big")
                f = p.f
                for j, (sh, m) in enumerate(shifts):
                    f[base + j] = (value >> sh) & m
                p.v[hidx] = True
                return end

            return extract
        if kind == "set":
            stmt = self._primitive({"op": "assign", "parameters": params}, where)

            def set_(p: Packet, data: bytes, off: int) -> int:
                stmt(p, [])
                return off

            return set_
        if kind == "verify":
            cond = self.expr(params[0], where)
            code = self.expr(params[1], where)

            def verify(p: Packet, data: bytes, off: int) -> int:
                if not cond(p, []):
                    raise ParserError(code(p, []), off)
                return off

            return verify
        if kind == "primitive":
            stmt = self._primitive(params[0], where)

            def primitive(p: Packet, data: bytes, off: int) -> int:
                stmt(p, [])
                return off

            return primitive
        raise UnsupportedConstruct(f"parser op {kind}", where)

    def _load_deparser(self) -> Callable[[Packet], bytes]:
        deparsers = self._list("deparsers")
        if len(deparsers) != 1:
            raise ProgramError(f"bmv2 JSON: expected one deparser, found {len(deparsers)}")
        emitters = []
        for name in deparsers[0].get("order", []):
            h = self._header(name, "deparser")
            emitters.append((h.index, h.base, len(h.widths), list(h.widths), h.nbytes))

        def deparse(p: Packet) -> bytes:
            out = []
            f, v = p.f, p.v
            for hidx, base, n, widths, nbytes in emitters:
                if v[hidx]:
                    value = 0
                    for j in range(n):
                        value = (value << widths[j]) | f[base + j]
                    out.append(value.to_bytes(nbytes, "big"))
            out.append(p.payload)
            return b"".join(out)

        return deparse

    def _load_checksums(self) -> tuple[Stmt, Stmt]:
        calcs = {c["name"]: c for c in self._list("calculations")}
        verifies: list[Stmt] = []
        updates: list[Stmt] = []
        cerr = self._sm.get("checksum_error", -1)
        for ck in self._list("checksums"):
            where = f"checksum {ck.get('name')}"
            calc = calcs.get(ck.get("calculation"))
            if calc is None:
                raise ProgramError(f"bmv2 JSON: unknown calculation in {where}")
            if calc.get("algo") != "csum16":
                raise UnsupportedConstruct(f"checksum algorithm {calc.get('algo')}", where)
            inputs = []
            for item in calc.get("input", []):
                if item.get("type") != "field":
                    raise UnsupportedConstruct(f"checksum input {item.get('type')}", where)
                i = self._field(item["value"], where)
                inputs.append((i, self.field_width[i]))
            total = sum(w for _, w in inputs)
            if total % 8:
                raise ProgramError(f"bmv2 JSON: checksum input is not whole bytes in {where}")
            target = self._field(ck["target"], where)
            cond = self.expr(ck["if_cond"], where) if ck.get("if_cond") else None
            compute = _csum16_fn(inputs, total // 8)
            if ck.get("verify", True):
                verifies.append(_verify_stmt(compute, target, cond, cerr))
            if ck.get("update", True):
                updates.append(_update_stmt(compute, target, cond))

        def run_all(stmts: list[Stmt]) -> Stmt:
            def run(p: Packet, ad: list[int]) -> None:
                for s in stmts:
                    s(p, ad)

            return run

        return run_all(verifies), run_all(updates)

    # ---------------------------------------------------------------- pipelines

    def _load_pipeline(self, pipe: dict[str, Any]) -> Callable[[Packet], None]:
        pname = pipe.get("name", "?")
        nodes: dict[str, Callable[[Packet], str | None]] = {}
        for t in pipe.get("tables", []):
            tdef = self._load_table(t, pname)
            self.tables[tdef.name] = tdef
            nodes[tdef.name] = self._table_node(tdef)
        for c in pipe.get("conditionals", []):
            nodes[c["name"]] = self._conditional_node(c, pname)
        init = pipe.get("init_table")
        if init is not None and init not in nodes:
            raise ProgramError(f"bmv2 JSON: pipeline {pname} starts at unknown node {init!r}")
        for t in pipe.get("tables", []):
            for nxt in list(t.get("next_tables", {}).values()) + [t.get("base_default_next")]:
                if nxt is not None and nxt not in nodes:
                    raise ProgramError(f"bmv2 JSON: table {t['name']} continues to unknown node {nxt!r}")

        def run(p: Packet) -> None:
            node = init
            while node is not None and not p.exited:
                node = nodes[node](p)

        return run

    def _conditional_node(self, c: dict[str, Any], pname: str) -> Callable[[Packet], str | None]:
        cond = self.expr(c["expression"], f"conditional {c.get('name')} in {pname}")
        t, f = c.get("true_next"), c.get("false_next")
        return lambda p: t if cond(p, []) else f

    def _load_table(self, t: dict[str, Any], pname: str) -> TableDef:
        where = f"table {t.get('name')}"
        if t.get("type", "simple") != "simple":
            raise UnsupportedConstruct(f"table type {t.get('type')}", where)
        if t.get("direct_meters"):
            raise UnsupportedConstruct("direct meter", where)
        key_fields: list[KeyField] = []
        getters: list[Callable[[Packet], int]] = []
        names: list[str] = []
        for k in t.get("key", []):
            mt = k.get("match_type")
            if mt not in ("exact", "lpm", "ternary", "range", "optional", "valid"):
                raise UnsupportedConstruct(f"match kind {mt}", where)
            target = k.get("target")
            if mt == "valid":
                h = self._header(target, where)
                key_fields.append(KeyField(mt, 1))
                getters.append(_valid_getter(h.index))
            else:
                i = self._field(target, where)
                width = self.field_width[i]
                getters.append(_field_getter(i, int(k["mask"], 16) if k.get("mask") else -1))
                key_fields.append(KeyField(mt, width))
            names.append(k.get("name", ""))
        key_fn = _key_fn(getters)
        table = Table(t["name"], key_fields, int(t.get("max_size", 1024)))
        action_ids = [int(a) for a in t.get("action_ids", [])]
        for aid in action_ids:
            if aid not in self.actions:
                raise ProgramError(f"bmv2 JSON: {where} refers to unknown action id {aid}")
        action_names = t.get("actions", [])
        next_tables = t.get("next_tables", {})
        uses_hit_miss = "__HIT__" in next_tables or "__MISS__" in next_tables
        base_next = t.get("base_default_next")
        next_by_action: dict[int, str | None] = {}
        for aid, aname in zip(action_ids, action_names, strict=False):
            next_by_action[aid] = next_tables.get(aname, base_next)
        default = t.get("default_entry") or {}
        default_id = int(default.get("action_id", action_ids[0] if action_ids else -1))
        if default_id not in self.actions:
            raise ProgramError(f"bmv2 JSON: {where} has no valid default action")
        tdef = TableDef(
            name=t["name"],
            id=int(t.get("id", 0)),
            table=table,
            key_fn=key_fn,
            action_ids=action_ids,
            default_action_id=default_id,
            default_action_data=[int(x, 16) for x in default.get("action_data", [])],
            default_const=bool(default.get("action_const", False)),
            next_by_action=next_by_action,
            next_hit=next_tables.get("__HIT__", base_next),
            next_miss=next_tables.get("__MISS__", base_next),
            uses_hit_miss=uses_hit_miss,
            with_counters=bool(t.get("with_counters")),
            key_names=names,
        )
        for ce in t.get("entries", []) or []:
            tdef.table.insert(self._const_entry(ce, key_fields, where))
            tdef.const_entries = True
        return tdef

    def _const_entry(self, ce: dict[str, Any], key: list[KeyField], where: str) -> Entry:
        match: list[Any] = []
        for _kf, mk in zip(key, ce.get("match_key", []), strict=True):
            mt = mk.get("match_type")
            if mt in ("exact", "valid"):
                match.append(int(mk["key"], 16))
            elif mt == "lpm":
                match.append((int(mk["key"], 16), int(mk["prefix_length"])))
            elif mt == "ternary":
                mask = int(mk["mask"], 16)
                match.append((int(mk["key"], 16) & mask, mask))
            elif mt == "range":
                match.append((int(mk["start"], 16), int(mk["end"], 16)))
            else:
                raise UnsupportedConstruct(f"const entry match kind {mt}", where)
        ae = ce.get("action_entry", {})
        # bmv2 const entry priorities: smaller is more important; store as P4Runtime-like (larger wins).
        prio = ce.get("priority", 0)
        return Entry(
            match=tuple(match),
            action_id=int(ae["action_id"]),
            action_data=[int(x, 16) for x in ae.get("action_data", [])],
            priority=(1 << 24) - int(prio) if prio else 0,
        )

    def _table_node(self, tdef: TableDef) -> Callable[[Packet], str | None]:
        table = tdef.table
        key_fn = tdef.key_fn
        actions = self.actions
        with_counters = tdef.with_counters

        def apply(p: Packet) -> str | None:
            entry = table.lookup(key_fn(p))
            if entry is not None:
                aid, data = entry.action_id, entry.action_data
                if with_counters:
                    entry.packets += 1
                    entry.bytes += p.length
            else:
                aid, data = tdef.default_action_id, tdef.default_action_data
            actions[aid].body(p, data)
            if tdef.uses_hit_miss:
                return tdef.next_hit if entry is not None else tdef.next_miss
            return tdef.next_by_action.get(aid)

        return apply

    # ---------------------------------------------------------------- packet processing

    def process(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        """Run one packet through parser, ingress, egress and deparser; return (port, bytes) outputs."""
        sm = self._sm
        p = Packet(self.template_f.copy(), self.template_v.copy(), len(data))
        f = p.f
        f[sm["ingress_port"]] = port
        if sm["packet_length"] >= 0:
            f[sm["packet_length"]] = len(data)
        if sm["ingress_global_timestamp"] >= 0:
            f[sm["ingress_global_timestamp"]] = self.clock.now_us()
        try:
            self.parser(p, data)
            self.verify_checksums(p, [])
            self.ingress(p)
            egress_spec = f[sm["egress_spec"]]
            if egress_spec == DROP_PORT:
                return []
            p.exited = False
            f[sm["egress_port"]] = egress_spec
            if sm["egress_global_timestamp"] >= 0:
                f[sm["egress_global_timestamp"]] = self.clock.now_us()
            self.egress(p)
            if f[sm["egress_spec"]] == DROP_PORT:
                return []
            self.update_checksums(p, [])
            return [(egress_spec, self.deparse(p))]
        except PacketAbort:
            return []


class ParserError(Exception):
    """A parser error with its error code and the offset where parsing stopped."""

    def __init__(self, code: int, offset: int) -> None:
        super().__init__(code)
        self.code = code
        self.offset = offset


class PacketAbort(Exception):
    """An assert/assume failed: bmv2 stops processing the packet."""


def _field_expr(i: int) -> Expr:
    return lambda p, ad: p.f[i]


def _valid_getter(h: int) -> Callable[[Packet], int]:
    return lambda p: 1 if p.v[h] else 0


def _field_getter(i: int, mask: int) -> Callable[[Packet], int]:
    if mask == -1:
        return lambda p: p.f[i]
    return lambda p: p.f[i] & mask


def _key_fn(getters: list[Callable[[Packet], int]]) -> Callable[[Packet], tuple[int, ...]]:
    if not getters:
        return lambda p: ()
    if len(getters) == 1:
        g0 = getters[0]
        return lambda p: (g0(p),)
    return lambda p: tuple(g(p) for g in getters)


def _csum16_fn(inputs: list[tuple[int, int]], nbytes: int) -> Callable[[Packet], int]:
    def compute(p: Packet) -> int:
        value = 0
        for i, w in inputs:
            value = (value << w) | p.f[i]
        data = value.to_bytes(nbytes, "big")
        if len(data) % 2:
            data += b"\0"
        s = sum(int.from_bytes(data[k : k + 2], "big") for k in range(0, len(data), 2))
        while s >> 16:
            s = (s & 0xFFFF) + (s >> 16)
        return ~s & 0xFFFF

    return compute


def _verify_stmt(compute: Callable[[Packet], int], target: int, cond: Expr | None, cerr: int) -> Stmt:
    def verify(p: Packet, ad: list[int]) -> None:
        if (cond is None or cond(p, ad)) and compute(p) != p.f[target] and cerr >= 0:
            p.f[cerr] = 1

    return verify


def _update_stmt(compute: Callable[[Packet], int], target: int, cond: Expr | None) -> Stmt:
    def update(p: Packet, ad: list[int]) -> None:
        if cond is None or cond(p, ad):
            p.f[target] = compute(p)

    return update


def _bin(fn: Callable[[int, int], int]) -> Callable[[Expr, Expr], Expr]:
    def make(a: Expr, b: Expr) -> Expr:
        return lambda p, ad: fn(a(p, ad), b(p, ad))

    return make


_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "+": _bin(lambda x, y: x + y),
    "-": _bin(lambda x, y: x - y),
    "*": _bin(lambda x, y: x * y),
    "/": _bin(lambda x, y: x // y if y else 0),
    "%": _bin(lambda x, y: x % y if y else 0),
    "<<": _bin(lambda x, y: x << y),
    ">>": _bin(lambda x, y: x >> y),
    "&": _bin(lambda x, y: x & y),
    "|": _bin(lambda x, y: x | y),
    "^": _bin(lambda x, y: x ^ y),
    "==": _bin(lambda x, y: int(x == y)),
    "!=": _bin(lambda x, y: int(x != y)),
    ">": _bin(lambda x, y: int(x > y)),
    ">=": _bin(lambda x, y: int(x >= y)),
    "<": _bin(lambda x, y: int(x < y)),
    "<=": _bin(lambda x, y: int(x <= y)),
    "and": _bin(lambda x, y: int(bool(x) and bool(y))),
    "or": _bin(lambda x, y: int(bool(x) or bool(y))),
}

__all__ = ["DROP_PORT", "RED", "ActionDef", "Packet", "Program", "TableDef"]
