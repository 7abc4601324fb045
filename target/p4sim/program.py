"""Load a bmv2 JSON program (as p4c-bm2-ss emits it for v1model) and compile it into Python.

The JSON is compiled once, at SetForwardingPipelineConfig time: every expression, primitive,
parser state and pipeline node becomes a Python closure over precomputed field offsets, and the
actions, pipelines, parser and deparser are then also written out as Python source over the same
offsets (see "generated source" below), so that the per-packet path does no name lookups, no JSON
walking and few calls. Constructs this target does not implement are rejected here, with the
construct's name, never later at packet time.

Every packet starts with the header fields zeroed. bmv2 only marks its pooled PHV's headers invalid
between packets, so reading a field of a header this packet never made valid gives what an earlier
packet left there (the P4 specification leaves the value unspecified); no test relies on either.
"""

from __future__ import annotations

import functools
import json
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from .errors import ProgramError, UnsupportedConstruct
from .externs import RED, Clock, CounterArray, MeterArray, RegisterArray, ValueSet
from .hashes import HashFn, algorithm
from .profiles import NO_ACTION, ActionProfile
from .tables import Entry, KeyField, Table

DROP_PORT = 511  # simple_switch's default drop port; mark_to_drop sets egress_spec to it.


class Packet:
    """Per-packet state: header fields (flat), header validity, the unparsed payload.

    The payload is `payload[poff:]`: the received bytes and where parsing stopped, not a copy, so
    that a deparser emitting the headers unchanged can hand back the received bytes themselves.
    """

    __slots__ = ("exited", "f", "learn", "length", "payload", "poff", "stk", "v")

    def __init__(self, f: list[int], v: list[bool], length: int, stk: list[int] | None = None) -> None:
        self.f = f
        self.v = v
        self.payload = b""
        self.poff = 0
        self.length = length
        self.exited = False
        self.learn = 0  # simple_switch's learn register: the learn list id of the last digest() call
        # Each header stack's next index (bmv2 tracks it apart from the elements' validity).
        self.stk = _NO_STACKS if stk is None else stk


_NO_STACKS: list[int] = []  # shared by programs without stacks, and the empty action data; never written

# simple_switch's packet instance types (standard_metadata.instance_type).
NORMAL, INGRESS_CLONE, EGRESS_CLONE, RECIRC, REPLICATION, RESUBMIT = 0, 1, 2, 4, 5, 6
MAX_PASSES = 64  # resubmits, recirculations and copies per received packet (bmv2 has no such bound)


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
class StackLayout:
    """A header stack: its position in Packet.stk and its element headers, in index order."""

    name: str
    index: int
    elements: list[HeaderLayout]


@dataclass
class UnionStackLayout:
    """A header union stack: its position in Packet.stk (after the header stacks') and, for each
    element in index order, the union's member headers in the union type's order."""

    name: str
    index: int
    unions: list[list[HeaderLayout]]
    members: list[str]  # the union type's member names


@dataclass
class DirectMeterDef:
    """A direct meter: the table it is bound to, where its colour goes, and its unit."""

    name: str
    table: str
    result: int
    unit: str
    rate_count: int


@dataclass
class LearnListDef:
    """A learn list (v1model digest()): its id, name, and the fields it samples (flat indexes, bit widths)."""

    id: int
    name: str
    fields: list[int]
    widths: list[int]


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
    direct_meter: DirectMeterDef | None = None
    direct_counter: str | None = None
    # Indirect tables: the action profile their entries point into, and whether they may point at
    # groups (bmv2's table type indirect_ws).
    profile: ActionProfile | None = None
    with_selection: bool = False


class Program:
    """A bmv2 JSON program compiled for execution."""

    def __init__(self, doc: dict[str, Any], clock: Clock | None = None) -> None:
        if not isinstance(doc, dict):
            raise ProgramError("bmv2 JSON: top level must be an object")
        self.doc = doc
        self.clock = clock or Clock()
        self.headers: dict[str, HeaderLayout] = {}
        self.stacks: dict[str, StackLayout] = {}
        self.union_stacks: dict[str, UnionStackLayout] = {}
        self.unions: dict[str, list[HeaderLayout]] = {}
        self.union_peers: dict[int, tuple[int, ...]] = {}  # a union member's header index -> its peers'
        self.vsets: dict[str, ValueSet] = {}
        self.direct_meters: dict[str, DirectMeterDef] = {}
        self.pre = Pre()
        # Set while compiling when the program clones, resubmits, recirculates or writes mcast_grp:
        # its packets then take the general path (process_general), others the straight one.
        self.replicates = False
        self.header_list: list[HeaderLayout] = []
        self.field_index: dict[tuple[str, str], int] = {}
        self.nfields = 0
        self.errors: dict[str, int] = {}
        self.counters: dict[str, CounterArray] = {}
        self.meters: dict[str, MeterArray] = {}
        self.registers: dict[str, RegisterArray] = {}
        self.actions: dict[int, ActionDef] = {}
        self.tables: dict[str, TableDef] = {}
        self.profiles: dict[str, ActionProfile] = {}
        self._action_docs: dict[int, dict[str, Any]] = {}
        self._table_keys: dict[str, list[str]] = {}  # a table's key components as generated source
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
                "egress_rid",
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
        self.learn_lists = self._load_learn_lists()
        # Called with (learn list id, field values) for each sample, at the end of ingress as simple_switch's
        # ingress thread calls its learn engine (simple_switch.cpp), not where digest() is called: a field
        # the action changes after the call is sampled with its final value.
        self.on_learn: Callable[[int, list[int]], None] | None = None
        self._calcs = {c.get("name"): c for c in self._list("calculations")}
        self.field_lists = self._load_field_lists()
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
        self.template_stk = [0] * (len(self.stacks) + len(self.union_stacks))
        self._metadata_spans = [(h.base, h.base + len(h.widths)) for h in self.header_list if h.metadata]
        es_width = self.field_width[self._sm["egress_spec"]]
        # simple_switch sets egress_spec to drop_port + 1 before egress; the 9-bit field wraps it to 0.
        self._egress_spec_init = (DROP_PORT + 1) & ((1 << es_width) - 1)
        sm = self._sm
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
        # Fields always hold values within their width (generated code relies on it, see _srcb); bmv2
        # truncates what it writes into them too, such as a port number or a replica's rid.
        self._port_mask = self._mask(self._sm["ingress_port"])
        self._has_checksums = bool(self._list("checksums"))
        self._egress_empty = pipelines["egress"].get("init_table") is None
        self._memo, self._span = self._parse_memo()
        if self.replicates:
            self.process = self.process_general  # type: ignore[method-assign]

    def _parse_memo(self) -> tuple[dict[int, _Parsed] | None, tuple[int, int]]:
        """A memo of parse results for process(), when parsing depends on the packet's bytes alone.

        That holds when the parser only extracts fixed headers and selects on packet header fields or
        lookahead bits (no value sets, which the control plane changes, no metadata, no stacks) and
        the packet headers' fields are one contiguous span of the field list. Returns (memo or None,
        the span).
        """
        packet = [h for h in self.header_list if not h.metadata]
        lo = min((h.base for h in packet), default=0)
        hi = max((h.base + len(h.widths) for h in packet), default=0)
        if sum(len(h.widths) for h in packet) != hi - lo or self.stacks or self.union_stacks:
            return None, (lo, hi)
        for st in self._list("parsers")[0].get("parse_states", []):
            for op in st.get("parser_ops", []):
                if op.get("op") != "extract" or op.get("parameters", [{}])[0].get("type") != "regular":
                    return None, (lo, hi)
            for k in st.get("transition_key", []):
                if k.get("type") == "field" and not self.headers[k["value"][0]].metadata:
                    continue
                if k.get("type") != "lookahead":
                    return None, (lo, hi)
            if any(t.get("type", "hexstr") not in ("hexstr", "default") for t in st.get("transitions", [])):
                return None, (lo, hi)
        return {}, (lo, hi)

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
        self.field_header = [0] * base
        for layout in self.header_list:
            for j, w in enumerate(layout.widths):
                self.field_width[layout.base + j] = w
                self.field_header[layout.base + j] = layout.index
        by_id = {int(h.get("id", i)): self.header_list[i] for i, h in enumerate(self._list("headers"))}
        self._load_unions(by_id)
        for k, st in enumerate(self._list("header_stacks")):
            try:
                elements = [by_id[int(i)] for i in st["header_ids"]]
            except (KeyError, TypeError, ValueError):
                raise ProgramError(f"bmv2 JSON: header stack {st.get('name')!r} has unknown header ids") from None
            if not elements or any(e.metadata for e in elements):
                raise ProgramError(f"bmv2 JSON: header stack {st.get('name')!r} must hold packet headers")
            self.stacks[st["name"]] = StackLayout(st["name"], k, elements)
        self._load_union_stacks()

    def _load_union_stacks(self) -> None:
        unions_by_id = {int(u.get("id", i)): u["name"] for i, u in enumerate(self._list("header_unions"))}
        types = {t.get("name"): [m[0] for m in t.get("headers", [])] for t in self._list("header_union_types")}
        for k, st in enumerate(self._list("header_union_stacks"), start=len(self.stacks)):
            try:
                unions = [self.unions[unions_by_id[int(i)]] for i in st["header_union_ids"]]
                members = types[st["union_type"]]
            except (KeyError, TypeError, ValueError):
                raise ProgramError(f"bmv2 JSON: header union stack {st.get('name')!r} has unknown unions") from None
            if not unions or any(len(u) != len(members) for u in unions):
                raise ProgramError(f"bmv2 JSON: header union stack {st.get('name')!r} must hold unions of its type")
            self.union_stacks[st["name"]] = UnionStackLayout(st["name"], k, unions, members)

    def _load_unions(self, by_id: dict[int, HeaderLayout]) -> None:
        """Header unions: each member's peers, which bmv2 marks invalid when that member becomes valid."""
        for u in self._list("header_unions"):
            try:
                members = [by_id[int(i)] for i in u["header_ids"]]
            except (KeyError, TypeError, ValueError):
                raise ProgramError(f"bmv2 JSON: header union {u.get('name')!r} has unknown header ids") from None
            if not members or any(m.metadata or m.index in self.union_peers for m in members):
                raise ProgramError(
                    f"bmv2 JSON: header union {u.get('name')!r} must hold packet headers of no other union"
                )
            self.unions[u["name"]] = members
            for m in members:
                self.union_peers[m.index] = tuple(o.index for o in members if o is not m)

    def _peers_src(self, h: HeaderLayout) -> list[str]:
        """Source lines that mark h's union peers invalid, as bmv2's HeaderUnion::make_header_valid does."""
        return [f"v[{k}] = False" for k in self.union_peers.get(h.index, ())]

    def _load_errors(self) -> None:
        for name, value in self.doc.get("errors", []):
            self.errors[name] = int(value)

    def _load_externs(self) -> None:
        self.direct_counters: dict[str, str] = {}  # table name -> direct counter name
        for c in self._list("counter_arrays"):
            if c.get("is_direct"):
                self.direct_counters[str(c.get("binding"))] = c["name"]
                continue  # direct counters live on table entries
            self.counters[c["name"]] = CounterArray(c["name"], int(c["size"]))
        for m in self._list("meter_arrays"):
            unit = m.get("type", "bytes")
            if unit not in ("bytes", "packets"):
                raise ProgramError(f"bmv2 JSON: meter {m['name']!r} has unknown type {unit!r}")
            if m.get("is_direct"):
                target = self._field(m.get("result_target"), f"direct meter {m['name']}")
                self.direct_meters[m["name"]] = DirectMeterDef(
                    m["name"], str(m.get("binding")), target, unit, int(m.get("rate_count", 2))
                )
                continue
            self.meters[m["name"]] = MeterArray(m["name"], int(m["size"]), int(m.get("rate_count", 2)), unit)
        for r in self._list("register_arrays"):
            self.registers[r["name"]] = RegisterArray(r["name"], int(r["size"]), int(r["bitwidth"]))

    def _check_unsupported_sections(self) -> None:
        for vs in self._list("parse_vsets"):
            self.vsets[vs["name"]] = ValueSet(vs["name"], int(vs["compressed_bitwidth"]), int(vs.get("max_size", 0)))
        if self._list("extern_instances"):
            raise UnsupportedConstruct("extern_instances", "program")

    def _load_profiles(self, pipe: dict[str, Any]) -> None:
        for ap in pipe.get("action_profiles", []) or []:
            name = ap.get("name")
            where = f"action profile {name}"
            if not isinstance(name, str) or name in self.profiles:
                raise ProgramError(f"bmv2 JSON: {where}: missing or duplicate name")
            selector = None
            if "selector" in ap:
                sel = ap["selector"]
                inputs = sel.get("input", [])
                if any(i.get("type") != "field" for i in inputs):
                    raise ProgramError(f"bmv2 JSON: {where}: selector inputs must be fields")
                selector = _calc_fn(self._calc_items(inputs, where), self._hash_fn(sel.get("algo"), where))
            self.profiles[name] = ActionProfile(name, selector)

    def _load_learn_lists(self) -> dict[int, LearnListDef]:
        lists: dict[int, LearnListDef] = {}
        for ll in self._list("learn_lists"):
            where = f"learn list {ll.get('name')}"
            fields = []
            for el in ll.get("elements", []):
                if el.get("type") != "field":  # bmv2 asserts the same (P4Objects::init_learn_lists)
                    raise UnsupportedConstruct(f"learn list element {el.get('type')}", where)
                fields.append(self._field(el.get("value"), where))
            lid = int(ll["id"])
            if lid <= 0 or lid in lists:
                raise ProgramError(f"bmv2 JSON: {where} has id {lid!r}, not a unique id above 0")
            lists[lid] = LearnListDef(lid, str(ll["name"]), fields, [self.field_width[i] for i in fields])
        return lists

    def _learn_id(self, params: list[Any], where: str) -> int:
        """generate_digest's learn list id (its first parameter, the receiver, bmv2 ignores)."""
        lid = self._const(params[1], where) if len(params) == 2 else -1
        if lid not in self.learn_lists:
            raise ProgramError(f"bmv2 JSON: {where} names learn list {lid}, which is not in learn_lists")
        return lid

    def _learned(self, p: Packet) -> None:
        """Hand the sample of the packet's learn list to on_learn (at the end of ingress)."""
        if self.on_learn is not None:
            f = p.f
            self.on_learn(p.learn, [f[i] for i in self.learn_lists[p.learn].fields])

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
        """Compile an expression node into one Python function returning an int (booleans as 0/1).

        The whole expression tree becomes the source of a single function, so evaluating it costs one
        call rather than one closure call per node; what cannot be written inline (stack lookups)
        is a closure the source calls by name.
        """
        env = self._env()
        code = self._src(node, where, env)
        return _compile_fn("expr", "p, ad", ["f = p.f", "v = p.v", f"return {code}"], env)  # type: ignore[no-any-return]

    def _const(self, node: Any, where: str) -> int:
        """The value of an expression that must be a compile-time constant (a count, a field list id)."""
        env = self._env()
        try:
            return int(eval(self._src(node, where, env), env))  # our own source
        except NameError:
            raise ProgramError(f"bmv2 JSON: expected a constant in {where}") from None

    def _env(self) -> dict[str, Any]:
        """A fresh namespace for generated source, holding the helpers it may call."""
        return {
            "_div": _div,
            "_mod": _mod,
            "_PA": PacketAbort,
            "_PE": ParserError,
            "_now": self.clock.now_us,
            "_NOAD": _NO_STACKS,
        }

    def _src(self, node: Any, where: str, env: dict[str, Any]) -> str:
        return self._srcb(node, where, env)[0]

    def _srcb(self, node: Any, where: str, env: dict[str, Any]) -> tuple[str, int | None]:
        """An expression's source and a bound on its value's bit length (None: unknown, maybe negative).

        The bound lets generated code leave out masks that cannot change the value (p4c's casts).
        """
        if not isinstance(node, dict) or "type" not in node:
            raise ProgramError(f"bmv2 JSON: malformed expression {node!r} in {where}")
        kind: str = node["type"]
        value: Any = node.get("value")
        if kind == "field":
            if isinstance(value, list) and len(value) == 2 and value[1] == "$valid$":
                return f"(1 if v[{self._header(value[0], where).index}] else 0)", 1
            i = self._field(value, where)
            return f"f[{i}]", self.field_width[i]
        if kind == "hexstr":
            n = int(value, 16)
            return repr(n), (n.bit_length() if n >= 0 else None)
        if kind == "bool":
            return ("1" if value else "0"), 1
        if kind in ("runtime_data", "local"):  # "local": an action parameter inside an expression
            return f"ad[{int(value)}]", None
        if kind == "header":
            return f"(1 if v[{self._header(value, where).index}] else 0)", 1
        if kind == "stack_field":
            loc, width = self._stack_field_loc(value, where)
            return f"f[{_bind(env, loc)}(p, ad)]", width
        if kind == "expression":
            # p4c sometimes wraps an expression node in another one.
            if isinstance(value, dict) and "op" not in value:
                return self._srcb(value, where, env)
            return self._op_srcb(value, where, env)
        raise UnsupportedConstruct(f"expression type {kind}", where)

    def _op_srcb(self, node: dict[str, Any], where: str, env: dict[str, Any]) -> tuple[str, int | None]:
        op = node.get("op")
        left_node, right_node = node.get("left"), node.get("right")
        _no_nested_runtime_data((left_node, right_node, node.get("cond")), where)

        def sub(n: Any) -> tuple[str, int | None]:
            return self._srcb(n, where, env)

        if op in ("?", "?:"):  # bmv2 JSON's conditional operator is "?"
            (a, ab), (b, bb) = sub(left_node), sub(right_node)
            return f"({a} if {sub(node['cond'])[0]} else {b})", _both(max, ab, bb)
        if op == "valid":
            return sub(right_node)
        if op == "valid_union":
            valid = " or ".join(f"v[{h.index}]" for h in self._union(right_node, where))
            return f"(1 if {valid} else 0)", 1
        if op == "access_field":
            const, dyn, width = self.lvalue({"type": "expression", "value": node}, where)
            return (f"f[{const}]" if dyn is None else f"f[{_bind(env, dyn)}(p, ad)]"), width
        if op in ("last_stack_index", "size"):
            k = self._stack(right_node.get("value") if isinstance(right_node, dict) else None, where).index
            # bmv2's SIZE_STACK is the stack's count (its next index), not its depth
            return (f"p.stk[{k}]" if op == "size" else f"(p.stk[{k}] - 1)"), None
        if op in ("d2b", "b2d"):
            a, ab = sub(right_node)
            return (a, 1) if ab is not None and ab <= 1 else (f"(1 if {a} else 0)", 1)  # 0 or 1 already
        if op == "not":
            return f"(0 if {sub(right_node)[0]} else 1)", 1
        if op == "~" and left_node is None:
            return f"(~{sub(right_node)[0]})", None
        if op == "-" and left_node is None:
            return f"(-{sub(right_node)[0]})", None
        if op == "two_comp_mod":
            width = int(eval(sub(right_node)[0], {}))  # a constant in our own source
            mask, sign = (1 << width) - 1, 1 << (width - 1)
            return f"((({sub(left_node)[0]} & {mask}) ^ {sign}) - {sign})", None
        template = _BINARY.get(op or "")
        if template is None:
            raise UnsupportedConstruct(f"operator {op}", where)
        (a, ab), (b, bb) = sub(left_node), sub(right_node)
        if op == "&":  # a mask wider than the other operand's value changes nothing
            if _is_mask(b) and ab is not None and ab <= int(b).bit_length():
                return a, ab
            if _is_mask(a) and bb is not None and bb <= int(a).bit_length():
                return b, bb
        return template.format(a=a, b=b), _bits(op or "", ab, bb, b)

    # ---------------------------------------------------------------- header stacks

    def _stack(self, name: Any, where: str) -> StackLayout:
        st = self.stacks.get(name) if isinstance(name, str) else None
        if st is None:
            raise ProgramError(f"bmv2 JSON: unknown header stack {name!r} in {where}")
        return st

    @staticmethod
    def _field_offset(layout: HeaderLayout, fname: Any, where: str) -> int:
        try:
            return layout.names.index(fname)
        except ValueError:
            raise ProgramError(f"bmv2 JSON: header {layout.name!r} has no field {fname!r} in {where}") from None

    def _stack_field_loc(self, value: Any, where: str) -> tuple[Callable[[Packet, list[int]], int], int]:
        """Where `stack.last.field` lives for a packet, and its width."""
        st = self._stack(value[0], where)
        j = self._field_offset(st.elements[0], value[1], where)
        bases = [e.base + j for e in st.elements]
        k = st.index

        def loc(p: Packet, ad: list[int]) -> int:
            n = p.stk[k]
            if n == 0:  # bmv2 asserts "stack empty"; this target drops the packet instead
                raise PacketAbort(f"{st.name}.last of an empty stack")
            return bases[n - 1]

        return loc, st.elements[0].widths[j]

    def _union_stack_field(self, value: Any, where: str) -> tuple[Callable[[Packet, bytes, int], int], int]:
        """A field of a member of a union stack's last extracted union, as a parser's transition key."""
        ust = self._union_stack(value[0], where)
        m = self._union_member(ust, value[1], where)
        j = self._field_offset(ust.unions[0][m], value[2], where)
        fields = [u[m].base + j for u in ust.unions]
        k = ust.index

        def key(p: Packet, data: bytes, off: int) -> int:
            n = p.stk[k]
            if n == 0:  # bmv2 asserts on an empty stack's last element; this target drops the packet
                raise PacketAbort(f"{ust.name}.last of an empty union stack")
            return p.f[fields[n - 1]]

        return key, ust.unions[0][m].widths[j]

    def header_ref(self, node: Any, where: str) -> tuple[HeaderLayout, Callable[[Packet, list[int]], int] | None]:
        """A header operand: (its layout, None) when fixed; for stack[i], (an element, closure giving the index)."""
        if isinstance(node, dict) and node.get("type") == "header":
            return self._header(node.get("value"), where), None
        value = node.get("value") if isinstance(node, dict) and node.get("type") == "expression" else None
        if isinstance(value, dict) and value.get("type") == "expression":
            value = value.get("value")
        if not isinstance(value, dict) or value.get("op") != "dereference_header_stack":
            raise UnsupportedConstruct(f"header operand {node!r}", where)
        st = self._stack(value["left"].get("value"), where)
        _no_nested_runtime_data((value["right"],), where)
        idx = self.expr(value["right"], where)
        indexes = [e.index for e in st.elements]
        n = len(indexes)

        def deref(p: Packet, ad: list[int]) -> int:
            i = idx(p, ad)
            if i >= n:  # bmv2's elements.at() throws (and simple_switch stops); this target drops the packet
                raise PacketAbort(f"index {i} out of bounds of {st.name}")
            return indexes[i]

        return st.elements[0], deref

    def lvalue(self, node: Any, where: str) -> tuple[int, Callable[[Packet, list[int]], int] | None, int]:
        """A field operand: (flat index, None, width) when fixed, else (-1, closure giving the index, width)."""
        if isinstance(node, dict) and node.get("type") == "field":
            i = self._field(node.get("value"), where)
            return i, None, self.field_width[i]
        if isinstance(node, dict) and node.get("type") == "stack_field":
            loc, width = self._stack_field_loc(node.get("value"), where)
            return -1, loc, width
        value = node.get("value") if isinstance(node, dict) and node.get("type") == "expression" else None
        if isinstance(value, dict) and value.get("type") == "expression":
            value = value.get("value")
        if not isinstance(value, dict) or value.get("op") != "access_field":
            raise UnsupportedConstruct(f"field operand {node!r}", where)
        layout, deref = self.header_ref(value["left"], where)
        j = int(value["right"])
        if not 0 <= j < len(layout.widths):
            raise ProgramError(f"bmv2 JSON: field offset {j} outside header {layout.name!r} in {where}")
        if deref is None:
            return layout.base + j, None, layout.widths[j]
        # Every element of a stack has the same type, so field j is at base_of_element + j.
        base_of = {h.index: h.base + j for h in self.header_list}
        return -1, lambda p, ad: base_of[deref(p, ad)], layout.widths[j]

    def _stack_shift(self, stack: Any, count: Any, push: bool, where: str) -> Stmt:
        name = stack.get("value") if isinstance(stack, dict) else None
        if isinstance(stack, dict) and stack.get("type") == "header_union_stack":
            ust = self._union_stack(name, where)
            k, elements = ust.index, ust.unions
            # bmv2 "invalidates" the unions shifted in with HeaderUnion::mark_invalid, which does
            # nothing: they keep what the shift swapped into them, so a union stack rotates.
            invalidate = False
        else:
            st = self._stack(name, where)
            k, elements, invalidate = st.index, [[e] for e in st.elements], True
        num = self._const(count, where)
        size = len(elements)
        spans = [[(h.index, h.base, h.base + len(h.widths)) for h in e] for e in elements]

        def swap(p: Packet, a: int, b: int) -> None:
            f, v = p.f, p.v
            for (ha, la, ua), (hb, lb, ub) in zip(spans[a], spans[b], strict=True):
                f[la:ua], f[lb:ub] = f[lb:ub], f[la:ua]
                v[ha], v[hb] = v[hb], v[ha]

        def invalid(p: Packet, i: int) -> None:
            if invalidate:
                for h, _, _ in spans[i]:
                    p.v[h] = False

        # bmv2's StackP4_16 (the default, --enable-WP4-16-stacks): the whole stack shifts, the
        # elements shifted in are invalid, and the next index moves by `num` within 0..size.
        def push_front(p: Packet, ad: list[int]) -> None:
            p.stk[k] = min(size, p.stk[k] + num)
            for i in range(size - 1, num - 1, -1):
                swap(p, i, i - num)
            for i in range(min(size, num)):
                invalid(p, i)

        def pop_front(p: Packet, ad: list[int]) -> None:
            p.stk[k] -= min(p.stk[k], num)
            i = 0
            if num < size:
                for i in range(size - num):
                    swap(p, i, i + num)
                i = size - num
            for j in range(i, size):
                invalid(p, j)

        return push_front if push else pop_front

    def _union_stack(self, name: Any, where: str) -> UnionStackLayout:
        ust = self.union_stacks.get(name) if isinstance(name, str) else None
        if ust is None:
            raise ProgramError(f"bmv2 JSON: unknown header union stack {name!r} in {where}")
        return ust

    def _union_member(self, ust: UnionStackLayout, member: Any, where: str) -> int:
        try:
            return ust.members.index(member)
        except ValueError:
            raise ProgramError(f"bmv2 JSON: union stack {ust.name!r} has no member {member!r} in {where}") from None

    # ---------------------------------------------------------------- primitives and actions

    def _primitive(self, prim: dict[str, Any], where: str) -> Stmt:
        op = prim.get("op")
        params = prim.get("parameters", [])
        where = f"{where}: primitive {op}"
        if op == "assign_header" or (op in ("assign", "modify_field") and params[0].get("type") == "header"):
            return self._assign_header(params[0].get("value"), params[1], where)
        if op == "assign_union":
            return self._assign_union(params[0], params[1], where)
        if op in ("assign", "modify_field"):
            dst, src = params
            i, loc, width = self.lvalue(dst, where)
            if i == self._sm.get("mcast_grp", -1) >= 0:
                self.replicates = True
            mask = (1 << width) - 1
            s = self.expr(src, where)
            if loc is not None:
                return _assign_at(loc, s, mask)

            def assign(p: Packet, ad: list[int]) -> None:
                p.f[i] = s(p, ad) & mask

            return assign
        if op in ("clone_ingress_pkt_to_egress", "clone_egress_pkt_to_egress", "resubmit", "recirculate"):
            return self._replication_primitive(op, params, where)
        if op == "modify_field_with_hash_based_offset":
            return self._hash_primitive(params, where)
        if op in ("push", "pop"):
            return self._stack_shift(params[0], params[1], op == "push", where)
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
        if op in ("add_header", "setValid", "remove_header", "setInvalid") and params[0].get("type") != "header":
            return self._dyn_validity(params[0], op in ("add_header", "setValid"), where)
        if op in ("add_header", "setValid"):
            h = self._header(params[0].get("value"), where)
            lo, hi = h.base, h.base + len(h.widths)
            peers = self.union_peers.get(h.index, ())

            def add_header(p: Packet, ad: list[int]) -> None:
                if not p.v[h.index]:
                    p.f[lo:hi] = [0] * (hi - lo)
                    p.v[h.index] = True
                    for k in peers:
                        p.v[k] = False

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
        if op == "generate_digest":
            lid = self._learn_id(params, where)

            def generate_digest(p: Packet, ad: list[int]) -> None:
                p.learn = lid  # the last call wins, as simple_switch keeps one learn register

            return generate_digest
        if op in ("assert", "assume"):
            cond = self.expr(params[0], where)

            def check(p: Packet, ad: list[int]) -> None:
                if not cond(p, ad):
                    raise PacketAbort(f"{op} failed")

            return check
        raise UnsupportedConstruct(f"primitive {op}", where)

    def _load_field_lists(self) -> dict[int, list[int]]:
        lists: dict[int, list[int]] = {}
        for fl in self._list("field_lists"):
            where = f"field list {fl.get('name')}"
            fields = []
            for el in fl.get("elements", []):
                if el.get("type") != "field":
                    raise UnsupportedConstruct(f"field list element {el.get('type')}", where)
                fields.append(self._field(el["value"], where))
            lists[int(fl["id"])] = fields
        return lists

    def _replication_primitive(self, op: str, params: list[Any], where: str) -> Stmt:
        self.replicates = True
        if op in ("resubmit", "recirculate"):
            fl = self._const(params[0], where) if params else 0
            if fl and fl not in self.field_lists:
                raise ProgramError(f"bmv2 JSON: unknown field list {fl} in {where}")

            def resubmit(p: Packet, ad: list[int]) -> None:
                p.resubmit = fl  # type: ignore[attr-defined]

            def recirculate(p: Packet, ad: list[int]) -> None:
                p.recirc = fl  # type: ignore[attr-defined]

            return resubmit if op == "resubmit" else recirculate
        session = self.expr(params[0], where)
        fl = self._const(params[1], where) if len(params) > 1 else 0
        if fl and fl not in self.field_lists:
            raise ProgramError(f"bmv2 JSON: unknown field list {fl} in {where}")

        def clone(p: Packet, ad: list[int]) -> None:
            p.clone = (session(p, ad), fl)  # type: ignore[attr-defined]  # the last call wins, as in bmv2

        return clone

    def _hash_primitive(self, params: list[Any], where: str) -> Stmt:
        i, loc, width = self.lvalue(params[0], where)
        mask = (1 << width) - 1
        base = self.expr(params[1], where)
        compute = self.calculation(params[2].get("value"), where)
        size = self.expr(params[3], where)

        # simple_switch: dst = (H(data) % max + base) in uint64 arithmetic, a max of 0 taken as 1.
        def hash_(p: Packet, ad: list[int]) -> None:
            sz = size(p, ad) & U64 or 1
            value = ((compute(p) % sz) + (base(p, ad) & U64)) & U64 & mask
            p.f[loc(p, ad) if loc is not None else i] = value

        return hash_

    def _dyn_validity(self, node: Any, valid: bool, where: str) -> Stmt:
        _, deref = self.header_ref(node, where)
        assert deref is not None
        spans = {h.index: (h.base, h.base + len(h.widths)) for h in self.header_list}

        def set_validity(p: Packet, ad: list[int]) -> None:
            h = deref(p, ad)
            if valid and not p.v[h]:
                lo, hi = spans[h]
                p.f[lo:hi] = [0] * (hi - lo)  # add_header zeroes an invalid header's fields, as bmv2
            p.v[h] = valid

        return set_validity

    def _assign_header(self, dst_name: str, src: dict[str, Any], where: str) -> Stmt:
        dst = self._header(dst_name, where)
        s = self._header(src.get("value"), where)
        if dst.widths != s.widths:
            raise ProgramError(f"bmv2 JSON: header assignment between different types in {where}")
        dlo, slo, n, di = dst.base, s.base, len(dst.widths), dst.index
        peers = self.union_peers.get(di, ())

        # bmv2's assign_header: an invalid source only invalidates the destination (its fields stay);
        # a valid one makes it valid (invalidating its union peers) and copies every field.
        def assign_header(p: Packet, ad: list[int]) -> None:
            if not p.v[s.index]:
                p.v[di] = False
                return
            p.v[di] = True
            for k in peers:
                p.v[k] = False
            p.f[dlo : dlo + n] = p.f[slo : slo + n]

        return assign_header

    def _assign_union(self, dst: Any, src: Any, where: str) -> Stmt:
        """bmv2's assign_union: assign_header member by member, in declaration order."""
        pairs = zip(self._union(dst, where), self._union(src, where), strict=True)
        steps = [self._assign_header(d.name, {"type": "header", "value": s.name}, where) for d, s in pairs]

        def assign_union(p: Packet, ad: list[int]) -> None:
            for step in steps:
                step(p, ad)

        return assign_union

    def _union(self, node: Any, where: str) -> list[HeaderLayout]:
        # p4c 1.2.4 types a union stack's element "header" in valid_union; bmv2 refuses that JSON too.
        name = node.get("value") if isinstance(node, dict) and node.get("type") == "header_union" else None
        members = self.unions.get(name) if isinstance(name, str) else None
        if members is None:
            raise ProgramError(f"bmv2 JSON: unknown header union {node!r} in {where}")
        return members

    def _extern(self, table: dict[str, Any], ref: dict[str, Any], where: str) -> Any:
        obj = table.get(str(ref.get("value")))
        if obj is None:
            raise ProgramError(f"bmv2 JSON: unknown extern {ref.get('value')!r} in {where}")
        return obj

    def _sm_field(self, name: str) -> int:
        return self._sm[name]

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
            self._action_docs[int(a["id"])] = a
            self.actions[int(a["id"])] = ActionDef(
                id=int(a["id"]),
                name=a["name"],
                param_widths=[int(r["bitwidth"]) for r in a.get("runtime_data", [])],
                param_names=[r["name"] for r in a.get("runtime_data", [])],
                body=self._action_fn(a.get("primitives", []), where),
            )

    # ---------------------------------------------------------------- parser and deparser

    def _load_parser(self) -> Callable[[Packet, bytes], bool]:
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
        for st in pdef.get("parse_states", []):
            for t in st.get("transitions", []):
                if t.get("next_state") is not None and t["next_state"] not in states:
                    raise ProgramError(f"bmv2 JSON: parser state {st['name']} goes to unknown {t['next_state']!r}")
        generated = self._generate_parser(pdef, too_short, perr)
        if generated is not None:
            return generated

        def parse(p: Packet, data: bytes) -> bool:
            state: str | None = init
            off = 0
            try:
                while state is not None:
                    state, off = states[state](p, data, off)
            except ParserError as err:
                if perr >= 0:
                    p.f[perr] = err.code
                p.payload, p.poff = data, err.offset
                return False
            p.payload, p.poff = data, off
            return True

        return parse

    def _parse_state(
        self, st: dict[str, Any], too_short: int, perr: int
    ) -> Callable[[Packet, bytes, int], tuple[str | None, int]]:
        where = f"parser state {st.get('name')}"
        ops = [self._parser_op(op, where, too_short) for op in st.get("parser_ops", [])]
        keys = [self._transition_key(k, where) for k in st.get("transition_key", [])]
        transitions = [self._transition(t, where) for t in st.get("transitions", [])]
        # bmv2 builds the select key byte-wise: each component padded to whole bytes, concatenated;
        # a value set is matched on the components concatenated bit by bit ("compressed").
        padded = [(fn, (w + 7) // 8 * 8) for fn, w in keys]
        compressed = [(fn, w) for fn, w in keys]
        need_compressed = any(t[0] == 1 for t in transitions)

        if not transitions:

            def state_no_select(p: Packet, data: bytes, off: int) -> tuple[str | None, int]:
                for op in ops:
                    off = op(p, data, off)
                return None, off

            return state_no_select

        if not need_compressed:
            cases = [(value, mask, nxt) for _, value, mask, nxt, _ in transitions]

            def state_select(p: Packet, data: bytes, off: int) -> tuple[str | None, int]:
                for op in ops:
                    off = op(p, data, off)
                key = 0
                for fn, width in padded:
                    key = (key << width) | fn(p, data, off)
                for value, mask, nxt in cases:
                    if value is None or key & mask == value:
                        return nxt, off
                return None, off  # no match: bmv2 accepts

            return state_select

        def state(p: Packet, data: bytes, off: int) -> tuple[str | None, int]:
            for op in ops:
                off = op(p, data, off)
            key = ckey = 0
            for fn, width in padded:
                key = (key << width) | fn(p, data, off)
            for fn, width in compressed:
                ckey = (ckey << width) | fn(p, data, off)
            for kind, value, mask, nxt, vset in transitions:
                if kind == 0:
                    if value is None or key & mask == value:
                        return nxt, off
                elif vset is not None and vset.matches(ckey, mask):
                    return nxt, off
            return None, off  # no match: bmv2 accepts

        return state

    def _transition_key(self, k: dict[str, Any], where: str) -> tuple[Callable[[Packet, bytes, int], int], int]:
        kind = k.get("type")
        if kind == "field":
            i = self._field(k["value"], where)
            return (lambda p, data, off: p.f[i]), self.field_width[i]
        if kind == "stack_field":
            loc, width = self._stack_field_loc(k["value"], where)
            return (lambda p, data, off: p.f[loc(p, [])]), width
        if kind == "union_stack_field":
            return self._union_stack_field(k["value"], where)
        if kind == "lookahead":
            bit_off, width = int(k["value"][0]), int(k["value"][1])
            # bmv2 peeks without a length check; bytes past the end read as zero here.
            return _peek(bit_off, width, check=None), width
        raise UnsupportedConstruct(f"transition key type {kind}", where)

    def _transition(self, t: dict[str, Any], where: str) -> tuple[int, int | None, int, str | None, ValueSet | None]:
        """(0, value, mask, next, None) for a constant case, (1, None, mask, next, set) for a value set."""
        ttype, nxt = t.get("type", "hexstr"), t.get("next_state")
        mask = int(t["mask"], 16) if t.get("mask") else -1
        if ttype == "default" or (ttype == "hexstr" and t.get("value") == "default"):
            return 0, None, 0, nxt, None
        if ttype == "hexstr":
            value = int(t["value"], 16)
            return 0, value & mask, mask, nxt, None
        if ttype == "parse_vset":
            vset = self.vsets.get(str(t.get("value")))
            if vset is None:
                raise ProgramError(f"bmv2 JSON: unknown value set {t.get('value')!r} in {where}")
            return 1, None, mask, nxt, vset
        raise UnsupportedConstruct(f"transition type {ttype}", where)

    def _parser_op(self, op: dict[str, Any], where: str, too_short: int) -> Callable[[Packet, bytes, int], int]:
        kind = op.get("op")
        params = op.get("parameters", [])
        if kind == "extract":
            ptype = params[0].get("type")
            if ptype == "regular":
                return self._extract(self._header(params[0]["value"], where), too_short)
            if ptype == "stack":
                st = self._stack(params[0]["value"], where)
                return self._extract_next(st.elements, st.index, too_short)
            if ptype == "union_stack":
                name, member = params[0]["value"]
                ust = self._union_stack(name, where)
                headers = [u[self._union_member(ust, member, where)] for u in ust.unions]
                return self._extract_next(headers, ust.index, too_short)
            raise UnsupportedConstruct(f"extract of {ptype}", where)
        if kind == "set":
            if params[1].get("type") == "lookahead":
                i = self._field(params[0].get("value"), where)
                bit_off, width = int(params[1]["value"][0]), int(params[1]["value"][1])
                peek = _peek(bit_off, width, check=too_short)
                fmask = (1 << self.field_width[i]) - 1

                def set_lookahead(p: Packet, data: bytes, off: int) -> int:
                    p.f[i] = peek(p, data, off) & fmask
                    return off

                return set_lookahead
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

    @staticmethod
    def _unpacker(h: HeaderLayout) -> Callable[[Packet, bytes, int], None]:
        """Write header h's fields from data[off:off + nbytes] (the caller checked the length)."""
        nbytes, base = h.nbytes, h.base
        shifts = []
        pos = sum(h.widths)
        for w in h.widths:
            pos -= w
            shifts.append((pos, (1 << w) - 1))

        def unpack(p: Packet, data: bytes, off: int) -> None:
            value = int.from_bytes(data[off : off + nbytes], "big")
            f = p.f
            for j, (sh, m) in enumerate(shifts):
                f[base + j] = (value >> sh) & m

        return unpack

    def _extract(self, h: HeaderLayout, too_short: int) -> Callable[[Packet, bytes, int], int]:
        nbytes, base, hidx = h.nbytes, h.base, h.index
        peers = self.union_peers.get(hidx, ())
        shifts = []
        pos = sum(h.widths)
        for w in h.widths:
            pos -= w
            shifts.append((pos, (1 << w) - 1))

        # The unpacking is inlined (not _unpacker's closure): this is the hottest parser path.
        def extract(p: Packet, data: bytes, off: int) -> int:
            end = off + nbytes
            if end > len(data):
                raise ParserError(too_short, off)
            value = int.from_bytes(data[off:end], "big")
            f = p.f
            for j, (sh, m) in enumerate(shifts):
                f[base + j] = (value >> sh) & m
            p.v[hidx] = True
            for k in peers:
                p.v[k] = False
            return end

        return extract

    def _extract_next(self, headers: list[HeaderLayout], k: int, too_short: int) -> Callable[[Packet, bytes, int], int]:
        """Extract into the next element of a stack (`headers`: that element's header, by index)."""
        out_of_bounds = self.errors.get("StackOutOfBounds", 3)
        elems = [(e.index, e.nbytes, self._unpacker(e), self.union_peers.get(e.index, ())) for e in headers]
        size = len(elems)

        def extract_next(p: Packet, data: bytes, off: int) -> int:
            n = p.stk[k]
            if n >= size:
                raise ParserError(out_of_bounds, off)
            hidx, nbytes, unpack, peers = elems[n]
            end = off + nbytes
            if end > len(data):
                raise ParserError(too_short, off)
            unpack(p, data, off)
            p.v[hidx] = True
            for j in peers:
                p.v[j] = False
            p.stk[k] = n + 1
            return end

        return extract_next

    def _load_deparser(self) -> Callable[[Packet], bytes]:
        deparsers = self._list("deparsers")
        if len(deparsers) != 1:
            raise ProgramError(f"bmv2 JSON: expected one deparser, found {len(deparsers)}")
        if deparsers[0].get("primitives"):
            raise UnsupportedConstruct("deparser primitives", "deparser")
        return self._generate_deparser([self._header(name, "deparser") for name in deparsers[0].get("order", [])])

    def calculation(self, name: Any, where: str) -> Callable[[Packet], int]:
        """Compile a named calculation: its input as bmv2's BufBuilder lays it out, then its algorithm."""
        calc = self._calcs.get(name) if isinstance(name, str) else None
        if calc is None:
            raise ProgramError(f"bmv2 JSON: unknown calculation {name!r} in {where}")
        here = f"calculation {name} in {where}"
        return _calc_fn(self._calc_items(calc.get("input", []), here), self._hash_fn(calc.get("algo"), here))

    @staticmethod
    def _hash_fn(algo: Any, where: str) -> HashFn:
        fn = algorithm(algo) if isinstance(algo, str) else None
        if fn is None:
            raise UnsupportedConstruct(f"hash algorithm {algo}", where)
        return fn

    def _calc_items(self, inputs: list[dict[str, Any]], where: str) -> list[tuple[int, int, int, int]]:
        """A calculation's input as (field index or -1, width, header index or -1, constant) items."""
        items: list[tuple[int, int, int, int]] = []
        for item in inputs:
            kind = item.get("type")
            if kind == "field":
                i = self._field(item["value"], where)
                items.append((i, self.field_width[i], self.field_header[i], 0))
            elif kind == "header":
                h = self._header(item["value"], where)
                items += [(h.base + j, w, h.index, 0) for j, w in enumerate(h.widths)]
            elif kind == "hexstr":
                items.append((-1, int(item["bitwidth"]), -1, int(item["value"], 16)))
            else:
                raise UnsupportedConstruct(f"calculation input {kind}", where)
        return items

    def _load_checksums(self) -> tuple[Stmt, Stmt]:
        verifies: list[Stmt] = []
        updates: list[Stmt] = []
        cerr = self._sm.get("checksum_error", -1)
        for ck in self._list("checksums"):
            where = f"checksum {ck.get('name')}"
            if ck.get("type", "generic") != "generic":
                raise UnsupportedConstruct(f"checksum type {ck.get('type')}", where)
            compute = self.calculation(ck.get("calculation"), where)
            target = self._field(ck["target"], where)
            target_header = self.field_header[target]
            cond = self.expr(ck["if_cond"], where) if ck.get("if_cond") else None
            if ck.get("verify", True):
                verifies.append(_verify_stmt(compute, target, target_header, cond, cerr))
            if ck.get("update", True):
                updates.append(_update_stmt(compute, target, (1 << self.field_width[target]) - 1, cond))

        def run_all(stmts: list[Stmt]) -> Stmt:
            def run(p: Packet, ad: list[int]) -> None:
                for s in stmts:
                    s(p, ad)

            return run

        return run_all(verifies), run_all(updates)

    # ---------------------------------------------------------------- pipelines

    def _load_pipeline(self, pipe: dict[str, Any]) -> Callable[[Packet], None]:
        pname = pipe.get("name", "?")
        self._load_profiles(pipe)
        nodes: dict[str, Callable[[Packet], str | None]] = {}
        tables: dict[str, TableDef] = {}
        for t in pipe.get("tables", []):
            tdef = self._load_table(t, pname)
            self.tables[tdef.name] = tables[tdef.name] = tdef
            nodes[tdef.name] = self._table_node(tdef)
        conds = {c["name"]: c for c in pipe.get("conditionals", [])}
        for c in conds.values():
            nodes[c["name"]] = self._conditional_node(c, pname)
        init = pipe.get("init_table")
        if init is not None and init not in nodes:
            raise ProgramError(f"bmv2 JSON: pipeline {pname} starts at unknown node {init!r}")
        for t in pipe.get("tables", []):
            for nxt in list(t.get("next_tables", {}).values()) + [t.get("base_default_next")]:
                if nxt is not None and nxt not in nodes:
                    raise ProgramError(f"bmv2 JSON: table {t['name']} continues to unknown node {nxt!r}")
        for c in conds.values():
            for nxt in (c.get("true_next"), c.get("false_next")):
                if nxt is not None and nxt not in nodes:
                    raise ProgramError(f"bmv2 JSON: conditional {c['name']} continues to unknown node {nxt!r}")
        generated = self._generate_pipeline(pname, init, tables, conds)
        if generated is not None:
            return generated

        # The interpreter, for control flow too tangled to write out (see _generate_pipeline).
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
        if t.get("support_timeout"):
            raise UnsupportedConstruct("idle timeout (support_timeout)", where)
        profile, with_selection = self._table_profile(t, where)
        dmeter = None
        if t.get("direct_meters"):
            dmeter = self.direct_meters.get(str(t["direct_meters"]))
            if dmeter is None or dmeter.table != t.get("name"):
                raise ProgramError(f"bmv2 JSON: {where} has unknown direct meter {t['direct_meters']!r}")
        key_fields: list[KeyField] = []
        getters: list[Callable[[Packet], int]] = []
        names: list[str] = []
        srcs: list[str] = []
        for k in t.get("key", []):
            mt = k.get("match_type")
            if mt not in ("exact", "lpm", "ternary", "range", "optional", "valid"):
                raise UnsupportedConstruct(f"match kind {mt}", where)
            target = k.get("target")
            if mt == "valid":
                h = self._header(target, where)
                key_fields.append(KeyField(mt, 1))
                getters.append(_valid_getter(h.index))
                srcs.append(f"(1 if v[{h.index}] else 0)")
            else:
                i = self._field(target, where)
                width = self.field_width[i]
                getters.append(_field_getter(i, int(k["mask"], 16) if k.get("mask") else -1))
                srcs.append(f"(f[{i}] & {int(k['mask'], 16)})" if k.get("mask") else f"f[{i}]")
                key_fields.append(KeyField(mt, width))
            names.append(k.get("name", ""))
        key_fn = _key_fn(getters)
        self._table_keys[t["name"]] = srcs
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
        # Without a default_entry a miss runs no action and goes on at base_default_next (bmv2's
        # default_default_entry). After a lookup that yields an empty group bmv2 leaves the next node
        # undefined (MatchTableIndirect::lookup returns before setting it) and simple_switch_grpc
        # 1.15.2 dies on that packet; this target runs no action and goes there too.
        default_id = int(default["action_id"]) if "action_id" in default else NO_ACTION
        if default_id == NO_ACTION or with_selection:
            next_by_action[NO_ACTION] = base_next
        elif default_id not in self.actions:
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
            direct_meter=dmeter,
            direct_counter=self.direct_counters.get(t["name"]),
            profile=profile,
            with_selection=with_selection,
        )
        if profile is not None and t.get("entries"):
            raise UnsupportedConstruct("const entries in an indirect table", where)
        for ce in t.get("entries", []) or []:
            tdef.table.insert(self._const_entry(ce, key_fields, where))
            tdef.const_entries = True
        return tdef

    def _table_profile(self, t: dict[str, Any], where: str) -> tuple[ActionProfile | None, bool]:
        """The action profile of an indirect table (none for a simple one), and whether it selects."""
        kind = t.get("type", "simple")
        if kind == "simple":
            return None, False
        if kind not in ("indirect", "indirect_ws"):
            raise UnsupportedConstruct(f"table type {kind}", where)
        name = t.get("action_profile")
        if name is None:
            raise UnsupportedConstruct("indirect table without action_profile (old JSON format)", where)
        profile = self.profiles.get(name) if isinstance(name, str) else None
        if profile is None:
            raise ProgramError(f"bmv2 JSON: {where} refers to unknown action profile {name!r}")
        return profile, kind == "indirect_ws"

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

        if tdef.direct_meter is not None or tdef.profile is not None or tdef.default_action_id == NO_ACTION:
            return self._metered_table_node(tdef)

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

        if not tdef.key_names and not tdef.const_entries:
            return self._keyless_table_node(tdef, apply)
        return apply

    def _keyless_table_node(
        self, tdef: TableDef, general: Callable[[Packet], str | None]
    ) -> Callable[[Packet], str | None]:
        # No key: while the table holds no entry, every packet misses and runs the default action as
        # P4Runtime last set it, with no lookup. p4c emits many such tables for statements outside actions.
        actions, entries = self.actions, tdef.table.entries

        def apply_keyless(p: Packet) -> str | None:
            if entries:
                return general(p)
            aid = tdef.default_action_id
            actions[aid].body(p, tdef.default_action_data)
            if tdef.uses_hit_miss:
                return tdef.next_miss
            return tdef.next_by_action.get(aid)

        return apply_keyless

    def _metered_table_node(self, tdef: TableDef) -> Callable[[Packet], str | None]:
        # Tables with a direct meter, an action profile or no default entry (no keyless shortcut).
        # bmv2 executes a direct meter only on a hit, before the action, into the meter's result
        # field; an indirect entry's action is its member's, or that of a member of its group.
        dm = tdef.direct_meter
        table, key_fn, now = tdef.table, tdef.key_fn, self.clock.now_us
        bodies = {aid: a.body for aid, a in self.actions.items()}
        bodies[NO_ACTION] = _no_action
        out = dm.result if dm is not None else -1  # -1: no direct meter
        omask = self._mask(out) if dm is not None else 0
        by_bytes = dm is not None and dm.unit == "bytes"
        with_counters = tdef.with_counters
        pick = tdef.profile.picker() if tdef.profile is not None else None

        def apply_metered(p: Packet) -> str | None:
            entry = table.lookup(key_fn(p))
            if entry is not None:
                if pick is None:
                    aid, data = entry.action_id, entry.action_data
                else:
                    aid, data = pick(p, entry.member, entry.group)
                if with_counters:
                    entry.packets += 1
                    entry.bytes += p.length
                if out >= 0:
                    meter = entry.meter
                    color = meter.execute(p.length if by_bytes else 1, now()) if meter is not None else 0
                    p.f[out] = color & omask
            else:
                aid, data = tdef.default_action_id, tdef.default_action_data
            bodies[aid](p, data)
            if tdef.uses_hit_miss:
                return tdef.next_hit if entry is not None else tdef.next_miss
            return tdef.next_by_action.get(aid)

        return apply_metered

    # ---------------------------------------------------------------- generated source
    #
    # Actions, pipelines, the parser and the deparser are also written out as Python source and
    # exec'd once here, so that a packet runs a few flat functions: expressions inline, conditionals
    # as `if`, keyless tables as their default action's statements, header fields unpacked in place.
    # The closures above remain the reference building blocks: generated code calls them for what it
    # does not write inline (stacks, hashes, clones, value sets).

    def _primitive_src(self, prim: dict[str, Any], where: str, env: dict[str, Any]) -> list[str]:
        """Source lines for one primitive; `f`, `v`, `p` and `ad` are in scope, `return` means exit."""
        op = prim.get("op")
        params = prim.get("parameters", [])
        here = f"{where}: primitive {op}"
        if op in ("assign", "modify_field") and params[0].get("type") != "header":
            i, loc, width = self.lvalue(params[0], here)
            if loc is not None:
                return [f"{_bind(env, self._primitive(prim, where))}(p, ad)"]
            if i == self._sm.get("mcast_grp", -1) >= 0:
                self.replicates = True
            code, bits = self._srcb(params[1], here, env)
            if bits is not None and bits <= width:
                return [f"f[{i}] = {code}"]  # a value no wider than the destination needs no mask
            return [f"f[{i}] = {_masked(code, (1 << width) - 1)}"]
        if op in ("mark_to_drop", "drop"):
            mg = self._sm.get("mcast_grp", -1)
            return [f"f[{self._sm['egress_spec']}] = {DROP_PORT}"] + ([f"f[{mg}] = 0"] if mg >= 0 else [])
        if op in ("add_header", "setValid") and params[0].get("type") == "header":
            h = self._header(params[0].get("value"), here)
            n = len(h.widths)
            env[f"_Z{n}"] = (0,) * n
            made_valid = [f"v[{h.index}] = True", *self._peers_src(h)]
            return [f"if not v[{h.index}]:", f"    f[{h.base}:{h.base + n}] = _Z{n}", *("    " + x for x in made_valid)]
        if op in ("remove_header", "setInvalid") and params[0].get("type") == "header":
            return [f"v[{self._header(params[0].get('value'), here).index}] = False"]
        if op == "exit":
            return ["p.exited = True", "return"]
        if op in ("no_op", "log_msg"):
            return []
        if op == "generate_digest":
            return [f"p.learn = {self._learn_id(params, here)}"]
        # Indexed externs inline their arrays' own bounds rules (see externs.py): out of range, a meter
        # gives green, a counter and a register write do nothing, a register read gives 0. A constant
        # index (a single cell, as most of limiter.p4's registers) is checked here instead.
        if op == "execute_meter":
            marr = self._extern(self.meters, params[0], here)
            m, out = _bind(env, marr), self._field(params[2].get("value"), here)
            units = "p.length" if marr.unit == "bytes" else "1"
            lines, cell, ok = _index(self._src(params[1], here, env), marr.size)
            color = _or_zero(ok, f"{m}.cells[{cell}].execute({units}, _now())")
            return [*lines, f"f[{out}] = {_masked(color, self._mask(out))}"]
        if op == "count":
            carr = self._extern(self.counters, params[0], here)
            c = _bind(env, carr)
            lines, cell, ok = _index(self._src(params[1], here, env), carr.size)
            return [*lines, *_guarded(ok, f"{c}.packets[{cell}] += 1; {c}.bytes[{cell}] += p.length")]
        if op == "register_read":
            out = self._field(params[0].get("value"), here)
            rarr = self._extern(self.registers, params[1], here)
            lines, cell, ok = _index(self._src(params[2], here, env), rarr.size)
            value = _or_zero(ok, f"{_bind(env, rarr)}.values[{cell}]")
            return [*lines, f"f[{out}] = {_masked(value, self._mask(out))}"]
        if op == "register_write":
            rarr = self._extern(self.registers, params[0], here)
            lines, cell, ok = _index(self._src(params[1], here, env), rarr.size)
            value, bits = self._srcb(params[2], here, env)
            fits = bits is not None and bits <= rarr.mask.bit_length()
            store = f"{_bind(env, rarr)}.values[{cell}] = {'_w' if fits else f'_w & {rarr.mask}'}"
            return [*lines, f"_w = {value}", *_guarded(ok, store)]
        if op in ("assert", "assume"):
            return [f"if not {self._cond_src(params[0], here, env)}:", f"    raise _PA({op + ' failed'!r})"]
        return [f"{_bind(env, self._primitive(prim, where))}(p, ad)"]

    def _mask(self, i: int) -> int:
        return (1 << self.field_width[i]) - 1

    def _cond_src(self, node: Any, where: str, env: dict[str, Any]) -> str:
        """Source whose truth is a boolean expression's (no 0/1 conversion where a bool will do)."""
        if isinstance(node, dict) and node.get("type") == "expression":
            value = node.get("value") if isinstance(node.get("value"), dict) else {}
            assert isinstance(value, dict)
            if value and "op" not in value:
                return self._cond_src(value, where, env)
            op = value.get("op")
            if op in _COMPARE:
                _no_nested_runtime_data((value["left"], value["right"]), where)
                a, b = self._src(value["left"], where, env), self._src(value["right"], where, env)
                return f"({a} {op} {b})"
            if op in ("and", "or"):
                a, b = self._cond_src(value["left"], where, env), self._cond_src(value["right"], where, env)
                return f"({a} {op} {b})"
            if op == "not":
                return f"(not {self._cond_src(value['right'], where, env)})"
            if op in ("d2b", "valid"):
                return self._cond_src(value["right"], where, env)
        if isinstance(node, dict) and node.get("type") in ("field", "header"):
            ref = node.get("value")
            if node["type"] == "header":
                return f"v[{self._header(ref, where).index}]"
            if isinstance(ref, list) and len(ref) == 2 and ref[1] == "$valid$":
                return f"v[{self._header(ref[0], where).index}]"
        return self._src(node, where, env)

    def _action_fn(self, prims: list[dict[str, Any]], where: str) -> Stmt:
        """An action body as one generated function (bodies with jumps keep the interpreter loop)."""
        if any(p.get("op") in ("_jump", "_jump_if_zero") for p in prims):
            return self._body_with_jumps(prims, where)
        env = self._env()
        lines = [line for prim in prims for line in self._primitive_src(prim, where, env)]
        return _compile_fn("action", "p, ad", ["f = p.f", "v = p.v", *lines], env)  # type: ignore[no-any-return]

    def _action_lines(self, aid: int, env: dict[str, Any]) -> list[str]:
        """An action's statements for inlining where `ad` holds its data."""
        a = self._action_docs[aid]
        where = f"action {a.get('name')}"
        prims = a.get("primitives", [])
        if any(p.get("op") in ("_jump", "_jump_if_zero") for p in prims):
            lines = [f"{_bind(env, self.actions[aid].body)}(p, ad)"]
            return lines + (["if p.exited:", "    return"] if self._exits(aid) else [])
        return [line for prim in prims for line in self._primitive_src(prim, where, env)]

    def _exits(self, aid: int) -> bool:
        return any(p.get("op") == "exit" for p in self._action_docs[aid].get("primitives", []))

    def _generate_pipeline(
        self, pname: str, init: str | None, tables: dict[str, TableDef], conds: dict[str, dict[str, Any]]
    ) -> Callable[[Packet], None] | None:
        """The pipeline as one generated function, or None if its control flow would not fit.

        The graph of tables and conditionals is a DAG; each branching node's branches are written
        inside an `if` up to the node's immediate post-dominator, where they join again, so each
        node is written once for structured control flow (p4c's output) and duplicated otherwise.
        """
        succ: dict[str, list[str | None]] = {}
        for name, c in conds.items():
            succ[name] = [c.get("true_next"), c.get("false_next")]
        for name, tdef in tables.items():
            if tdef.uses_hit_miss:
                succ[name] = [tdef.next_hit, tdef.next_miss]
            else:
                succ[name] = list(dict.fromkeys(tdef.next_by_action.values())) or [None]
        order = _postorder(init, succ)
        if order is None:
            return None
        ipdom: dict[str | None, str | None] = {}

        def chain(n: str | None) -> list[str | None]:
            out = [n]
            while n is not None:
                n = ipdom[n]
                out.append(n)
            return out

        for n in order:
            distinct = list(dict.fromkeys(succ[n]))
            if len(distinct) == 1:
                ipdom[n] = distinct[0]
            else:
                others = [set(chain(s)) for s in distinct[1:]]
                ipdom[n] = next(x for x in chain(distinct[0]) if all(x in o for o in others))
        env = self._env()
        env["_A"] = {aid: a.body for aid, a in self.actions.items()}
        env["_A"][NO_ACTION] = _no_action
        lines: list[str] = []

        def emit(text: str, ind: int) -> None:
            if len(lines) > _MAX_LINES:
                raise _TooBig
            lines.append("    " * ind + text)

        def region(n: str | None, stop: str | None, ind: int) -> None:
            start = len(lines)
            while n is not None and n != stop:
                join = ipdom[n]
                if n in conds:
                    where = f"conditional {n} in {pname}"
                    emit(f"if {self._cond_src(conds[n]['expression'], where, env)}:", ind)
                    region(succ[n][0], join, ind + 1)
                    emit("else:", ind)
                    region(succ[n][1], join, ind + 1)
                else:
                    self._table_src(tables[n], env, emit, ind)
                    branches = list(dict.fromkeys(succ[n]))
                    if len(branches) > 1:
                        self._table_branches(tables[n], succ[n], join, ind, emit, region)
                n = join
            if len(lines) == start:
                emit("pass", ind)

        try:
            region(init, None, 0)
        except _TooBig:
            return None
        # `ad` starts empty for inlined actions without parameters whose helpers take it all the same.
        return _compile_fn(f"pipeline_{pname}", "p", ["f = p.f", "v = p.v", "ad = _NOAD", *lines], env)  # type: ignore[no-any-return]

    def _table_branches(
        self,
        tdef: TableDef,
        nexts: list[str | None],
        join: str | None,
        ind: int,
        emit: Callable[[str, int], None],
        region: Callable[[str | None, str | None, int], None],
    ) -> None:
        """The `if` over a table's hit/miss or the action it ran, each branch up to `join`."""
        if tdef.uses_hit_miss:
            emit("if e is not None:", ind)
            region(nexts[0], join, ind + 1)
            emit("else:", ind)
            region(nexts[1], join, ind + 1)
            return
        groups: dict[str | None, list[int]] = {}
        for aid, nxt in tdef.next_by_action.items():
            groups.setdefault(nxt, []).append(aid)
        items = list(groups.items())
        for k, (nxt, aids) in enumerate(items):
            if k == len(items) - 1:
                emit("else:", ind)
            else:
                emit(f"{'if' if k == 0 else 'elif'} aid in {tuple(aids)!r}:", ind)
            region(nxt, join, ind + 1)

    def _table_src(self, tdef: TableDef, env: dict[str, Any], emit: Callable[[str, int], None], ind: int) -> None:
        """A table's application: lookup, direct counter and meter, then its action, inline.

        Afterwards `e` is the entry hit (None on a miss) and `aid` the action run. A keyless table
        with a const default action (p4c's tbl_* for statements outside actions) runs that action's
        statements directly while it holds no entry.
        """
        fast = not tdef.key_names and not tdef.const_entries and tdef.default_const
        fast = fast and tdef.direct_meter is None and tdef.profile is None
        if fast:
            emit(f"if {_bind(env, tdef.table.entries)}:", ind)
            self._table_general(tdef, env, emit, ind + 1)
            emit("else:", ind)
            aid = tdef.default_action_id
            emit(f"e = None; aid = {aid}", ind + 1)
            if tdef.default_action_data or self.actions[aid].param_widths:
                emit(f"ad = {_bind(env, tdef.default_action_data)}", ind + 1)
            for line in self._action_lines(aid, env):
                emit(line, ind + 1)
        else:
            self._table_general(tdef, env, emit, ind)

    def _table_general(self, tdef: TableDef, env: dict[str, Any], emit: Callable[[str, int], None], ind: int) -> None:
        t, d = _bind(env, tdef.table), _bind(env, tdef)
        emit(f"e = {t}.lookup({_key_src(self._table_keys[tdef.name])})", ind)
        emit("if e is None:", ind)
        emit(f"aid = {d}.default_action_id; ad = {d}.default_action_data", ind + 1)
        emit("else:", ind)
        if tdef.profile is not None:
            emit(f"aid, ad = {_bind(env, tdef.profile.picker())}(p, e.member, e.group)", ind + 1)
        else:
            emit("aid = e.action_id; ad = e.action_data", ind + 1)
        if tdef.with_counters:
            emit("e.packets += 1; e.bytes += p.length", ind + 1)
        dm = tdef.direct_meter
        if dm is not None:
            # bmv2 executes a direct meter only on a hit, before the action, into the meter's result field.
            units = "p.length" if dm.unit == "bytes" else "1"
            omask = (1 << self.field_width[dm.result]) - 1
            emit("m = e.meter", ind + 1)
            emit(f"f[{dm.result}] = (m.execute({units}, _now()) if m is not None else 0) & {omask}", ind + 1)
        aids = list(dict.fromkeys(tdef.action_ids))
        if len(aids) > _MAX_INLINE_ACTIONS:
            emit("_A[aid](p, ad)", ind)
            if any(self._exits(a) for a in {*aids, tdef.default_action_id}):
                emit("if p.exited:", ind)
                emit("return", ind + 1)
            return
        for k, aid in enumerate(aids):
            emit(f"{'if' if k == 0 else 'elif'} aid == {aid}:", ind)
            for line in self._action_lines(aid, env) or ["pass"]:
                emit(line, ind + 1)
        # Any other action id (a default no entry names): called, as the interpreter would.
        other = ind + 1 if aids else ind
        if aids:
            emit("else:", ind)
        emit("_A[aid](p, ad)", other)
        emit("if p.exited:", other)
        emit("return", other + 1)

    def _generate_parser(
        self, pdef: dict[str, Any], too_short: int, perr: int
    ) -> Callable[[Packet, bytes], bool] | None:
        """The parser as one generated function with its states inline, or None for loops (stacks).

        Like the interpreter's, it returns whether parsing ended without a parser error.
        """
        states = {st["name"]: st for st in pdef.get("parse_states", [])}
        env = self._env()
        lines: list[str] = []

        def emit(text: str, ind: int) -> None:
            if len(lines) > _MAX_LINES:
                raise _TooBig
            lines.append("    " * ind + text)

        def state(name: str | None, ind: int, path: tuple[str, ...]) -> None:
            if name is None:
                emit("pass", ind)  # accept
                return
            if name in path:
                raise _TooBig  # a loop: the interpreter's state machine runs it
            st = states[name]
            where = f"parser state {name}"
            for op in st.get("parser_ops", []):
                for line in self._parser_op_src(op, where, too_short, env):
                    emit(line, ind)
            transitions = [self._transition(t, where) for t in st.get("transitions", [])]
            keys = [self._transition_key(k, where) for k in st.get("transition_key", [])]
            if keys and transitions:
                key = ckey = ""
                for (fn, width), kdoc in zip(keys, st.get("transition_key", []), strict=True):
                    field = kdoc.get("type") == "field"
                    call = f"f[{self._field(kdoc['value'], where)}]" if field else f"{_bind(env, fn)}(p, data, off)"
                    key = call if not key else f"(({key}) << {(width + 7) // 8 * 8}) | {call}"
                    ckey = call if not ckey else f"(({ckey}) << {width}) | {call}"
                emit(f"k = {key}", ind)
                if any(t[0] == 1 for t in transitions):
                    emit(f"ck = {ckey}", ind)
            for k, (kind, value, mask, nxt, vset) in enumerate(transitions):
                word = "if" if k == 0 else "elif"
                if kind == 0 and value is None:
                    if k == 0:
                        state(nxt, ind, path + (name,))
                    else:
                        emit("else:", ind)
                        state(nxt, ind + 1, path + (name,))
                    return
                if kind == 0:
                    test = f"k == {value}" if mask == -1 else f"k & {mask} == {value}"
                else:
                    test = f"{_bind(env, vset)}.matches(ck, {mask})"
                emit(f"{word} {test}:", ind)
                state(nxt, ind + 1, path + (name,))
            if not transitions:
                emit("pass", ind)

        try:
            state(pdef.get("init_state"), 1, ())
        except _TooBig:
            return None
        body = ["f = p.f", "v = p.v", "ad = _NOAD", "n = len(data)", "off = 0", "try:", *lines, "except _PE as err:"]
        if perr >= 0:
            body.append(f"    f[{perr}] = err.code")
        body += [
            "    p.payload, p.poff = data, err.offset",
            "    return False",
            "p.payload, p.poff = data, off",
            "return True",
        ]
        return _compile_fn("parse", "p, data", body, env)  # type: ignore[no-any-return]

    def _parser_op_src(self, op: dict[str, Any], where: str, too_short: int, env: dict[str, Any]) -> list[str]:
        """Source lines for one parser op; `off` is the parser's offset into `data` (`n` bytes)."""
        kind = op.get("op")
        params = op.get("parameters", [])
        if kind == "extract" and params[0].get("type") == "regular":
            h = self._header(params[0]["value"], where)
            lines = [f"end = off + {h.nbytes}", "if end > n:", f"    raise _PE({too_short}, off)"]
            fmt, units = _struct_layout(h.widths)
            names = [f"u{k}" for k in range(len(fmt) - 1)]
            if names:
                lines.append(f"{', '.join(names)}, = {_bind(env, struct.Struct(fmt).unpack_from)}(data, off)")
            for sizes, fields in units:
                unit, names = _joined(names[: len(sizes)], sizes), names[len(sizes) :]
                if len(fields) > 1 and len(sizes) > 1:
                    lines.append(f"x = {unit}")
                    unit = "x"
                for j, pos, w in fields:
                    first = pos + w == sum(sizes) * 8  # the unit's top bits need no mask
                    value = f"({unit} >> {pos})" if pos else unit
                    lines.append(f"f[{h.base + j}] = {value if first else f'{value} & {(1 << w) - 1}'}")
            return [*lines, f"v[{h.index}] = True", *self._peers_src(h), "off = end"]
        if kind == "set" and params[1].get("type") != "lookahead":
            return self._primitive_src({"op": "assign", "parameters": params}, where, env)
        if kind == "verify":
            cond, code = self._cond_src(params[0], where, env), self._src(params[1], where, env)
            return [f"if not {cond}:", f"    raise _PE({code}, off)"]
        return [f"off = {_bind(env, self._parser_op(op, where, too_short))}(p, data, off)"]

    def _generate_deparser(self, order: list[HeaderLayout]) -> Callable[[Packet], bytes]:
        """The deparser as one generated function: each valid header packed from its fields."""
        env = self._env()
        env["_deparsed"] = _deparsed
        lines = ["f = p.f", "v = p.v", "parts = []"]
        for h in order:
            fmt, units = _struct_layout(h.widths)
            args = []
            for sizes, fields in units:
                terms = [f"(f[{h.base + j}] << {pos})" if pos else f"f[{h.base + j}]" for j, pos, _ in fields]
                value = terms[0] if len(terms) == 1 else f"({' | '.join(terms)})"
                shift = sum(sizes) * 8
                for k, size in enumerate(sizes):  # a unit wider than one struct code is split over several
                    shift -= size * 8
                    part = f"({value} >> {shift})" if shift else value
                    args.append(part if k == 0 else f"{part} & {(1 << size * 8) - 1}")  # the top part needs no mask
            lines += [
                f"if v[{h.index}]:",
                f"    parts.append({_bind(env, struct.Struct(fmt).pack)}({', '.join(args)}))",
            ]
        lines.append("return _deparsed(parts, p.payload, p.poff)")
        return _compile_fn("deparse", "p", lines, env)  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- packet processing

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
                self.verify_checksums(p, _NO_STACKS)
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
                self.update_checksums(p, _NO_STACKS)
            # Headers as parsed from the memo's bytes: the deparser would emit those bytes (checked once).
            if parsed is not None and p.v == parsed.valid and f[lo:hi] == parsed.fields:
                if parsed.same is None:
                    parsed.same = self.deparse(p) == data
                if parsed.same:
                    return [(egress_spec, data)]
            return [(egress_spec, self.deparse(p))]
        except PacketAbort:
            return []

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
        for eport, r in replicas:
            q = self._copy(p)
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
        sm = self._sm
        p = self._new_packet(port, data, preserved, itype)
        try:
            self.parser(p, data)
            self.verify_checksums(p, [])
            self.ingress(p)
        except PacketAbort:
            return
        f = p.f
        if p.clone is not None:
            session, fl = p.clone
            replicas = self.pre.clone_sessions.get(session)
            if replicas is not None:
                # The clone is parsed again from the received bytes (with the ingress port set first,
                # as simple_switch does), then its metadata is reset and the field list copied.
                q = self._new_packet(port, data, None, NORMAL)
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
        sm, f = self._sm, p.f
        p.exited, p.clone, p.resubmit, p.recirc = False, None, 0, 0
        f[sm["egress_port"]] = eport
        f[sm["egress_spec"]] = self._egress_spec_init
        if sm["egress_global_timestamp"] >= 0:
            f[sm["egress_global_timestamp"]] = self.clock.now_us()
        try:
            self.egress(p)
        except PacketAbort:
            return
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


class ParserError(Exception):
    """A parser error with its error code and the offset where parsing stopped."""

    def __init__(self, code: int, offset: int) -> None:
        super().__init__(code)
        self.code = code
        self.offset = offset


class PacketAbort(Exception):
    """An assert/assume failed: bmv2 stops processing the packet."""


def _no_nested_runtime_data(operands: tuple[Any, ...], where: str) -> None:
    # bmv2's build_expression knows "local" only: p4c 1.2.4 emits "runtime_data" inside an expression
    # for a stack index taken straight from an action parameter, and simple_switch fails to load it.
    for operand in operands:
        if isinstance(operand, dict) and operand.get("type") == "runtime_data":
            raise UnsupportedConstruct("runtime_data inside an expression (bmv2 refuses it too)", where)


def _peek(bit_off: int, width: int, check: int | None) -> Callable[[Packet, bytes, int], int]:
    """The `width` bits at `bit_off` bits past the parser's offset; with `check`, PacketTooShort as bmv2's
    ParserOpSet<ParserLookAhead> (which counts only the looked-at bytes, not the offset)."""
    first, skip = bit_off // 8, bit_off % 8
    span = (skip + width + 7) // 8
    nbytes = (width + 7) // 8
    drop = span * 8 - skip - width
    mask = (1 << width) - 1

    def peek(p: Packet, data: bytes, off: int) -> int:
        if check is not None and len(data) - off < nbytes:
            raise ParserError(check, off)
        chunk = data[off + first : off + first + span]
        return (int.from_bytes(chunk.ljust(span, b"\0"), "big") >> drop) & mask

    return peek


def _assign_at(loc: Callable[[Packet, list[int]], int], s: Expr, mask: int) -> Stmt:
    def assign_at(p: Packet, ad: list[int]) -> None:
        p.f[loc(p, ad)] = s(p, ad) & mask

    return assign_at


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


U64 = (1 << 64) - 1


def _calc_fn(items: list[tuple[int, int, int, int]], fn: Callable[[bytes], int]) -> Callable[[Packet], int]:
    # bmv2 packs the inputs bit by bit, skips fields of invalid headers, and pads the last byte
    # with zeros at its tail.
    def compute(p: Packet) -> int:
        f, v = p.f, p.v
        value = nbits = 0
        for i, w, h, c in items:
            if i < 0:
                value = (value << w) | c
            elif v[h]:
                value = (value << w) | f[i]
            else:
                continue
            nbits += w
        pad = -nbits % 8
        return fn((value << pad).to_bytes((nbits + pad) // 8, "big"))

    return compute


def _no_action(p: Packet, ad: list[int]) -> None:
    """What a miss without a default entry, or a lookup yielding an empty group, runs: nothing."""


def _verify_stmt(compute: Callable[[Packet], int], target: int, th: int, cond: Expr | None, cerr: int) -> Stmt:
    # bmv2 skips the verification when the target field's header is invalid or the condition is false.
    def verify(p: Packet, ad: list[int]) -> None:
        if p.v[th] and (cond is None or cond(p, ad)) and compute(p) != p.f[target] and cerr >= 0:
            p.f[cerr] = 1

    return verify


def _update_stmt(compute: Callable[[Packet], int], target: int, mask: int, cond: Expr | None) -> Stmt:
    def update(p: Packet, ad: list[int]) -> None:
        if cond is None or cond(p, ad):
            p.f[target] = compute(p) & mask

    return update


class _Parsed:
    """A memoised parse (Program.process): the bytes; the field list after parsing them (metadata as in
    the template) and the packet headers' part of it; all validity bits after parsing; where parsing
    stopped; and whether deparsing those headers gives the bytes back."""

    __slots__ = ("data", "fields", "off", "same", "start", "valid")

    def __init__(self, data: bytes, start: list[int], lo: int, hi: int, valid: list[bool], off: int) -> None:
        self.data = data
        self.start = start
        self.fields = start[lo:hi]
        self.valid = valid
        self.off = off
        self.same: bool | None = None


_MEMO_SIZE = 64  # distinct frames memoised per program; the memo starts over when full


class _TooBig(Exception):
    """Generated source would grow past _MAX_LINES (or loop): the interpreter runs that part."""


_MAX_LINES = 20_000
_MAX_INLINE_ACTIONS = 4  # tables with more actions call the action's function instead of inlining all
_COMPARE = {"==", "!=", ">", ">=", "<", "<="}


@functools.lru_cache(maxsize=8192)
def _code(src: str, filename: str, mode: str) -> CodeType:
    """compile(), once per distinct source: the devices of one process that load the same program
    (a lab's or a benchmark's many DPUs) share its code objects and bind them each to their own state."""
    return compile(src, filename, mode)


def _compile_fn(name: str, args: str, lines: list[str], env: dict[str, Any]) -> Any:
    """exec one generated function (our own source) in `env` and return it."""
    src = f"def {name}({args}):\n" + "".join(f"    {line}\n" for line in lines)
    exec(_code(src, f"<p4sim {name}>", "exec"), env)
    return env[name]


def _masked(code: str, mask: int) -> str:
    """`code & mask`, computed now when `code` names nothing (a constant), else written out."""
    if not _code(code, "<p4sim expression>", "eval").co_names:
        return str(eval(code, {}) & mask)  # our own source, a constant
    return f"{code} & {mask}"


def _index(code: str, size: int) -> tuple[list[str], str, str]:
    """(lines computing an extern index, the index, the in-range test), constants checked now."""
    if not _code(code, "<p4sim expression>", "eval").co_names:
        i = eval(code, {})  # our own source, a constant
        return [], str(i), str(0 <= i < size)
    return [f"_i = {code}"], "_i", f"0 <= _i < {size}"


def _guarded(ok: str, stmt: str) -> list[str]:
    """`stmt` under the test `ok` (left out when `ok` is known)."""
    if ok == "True":
        return [stmt]
    if ok == "False":
        return []
    return [f"if {ok}:", f"    {stmt}"]


def _or_zero(ok: str, code: str) -> str:
    """`code` where the test `ok` holds, else 0 (green, for a meter); decided now when `ok` is known."""
    if ok == "True":
        return code
    if ok == "False":
        return "0"
    return f"({code} if {ok} else 0)"


_STRUCT_CODES = {8: "Q", 4: "I", 2: "H", 1: "B"}


def _struct_layout(widths: list[int]) -> tuple[str, list[tuple[list[int], list[tuple[int, int, int]]]]]:
    """A byte-aligned header as a struct format: the fields cut into byte-aligned units, each unit read as
    one or more big-endian integers. Returns the format and, per unit, its integers' sizes in bytes and
    its fields as (field offset, bit position in the unit, width)."""
    units: list[tuple[list[int], list[tuple[int, int, int]]]] = []
    fields: list[tuple[int, int]] = []
    bits = 0
    for j, w in enumerate(widths):
        fields.append((j, w))
        bits += w
        if bits % 8 == 0:
            sizes, rest = [], bits // 8
            for size in (8, 4, 2, 1):
                while rest >= size:
                    sizes.append(size)
                    rest -= size
            placed, pos = [], bits
            for k, width in fields:
                pos -= width
                placed.append((k, pos, width))
            units.append((sizes, placed))
            fields, bits = [], 0
    return "!" + "".join(_STRUCT_CODES[size] for sizes, _ in units for size in sizes), units


def _joined(names: list[str], sizes: list[int]) -> str:
    """The integer that struct values `names` (of `sizes` bytes, most significant first) make together."""
    shift = sum(sizes) * 8
    terms = []
    for name, size in zip(names, sizes, strict=True):
        shift -= size * 8
        terms.append(f"({name} << {shift})" if shift else name)
    return terms[0] if len(terms) == 1 else f"({' | '.join(terms)})"


def _both(fn: Callable[[int, int], int], a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else fn(a, b)


def _is_mask(code: str) -> bool:
    """Whether source `code` is a literal 2**k - 1 (k >= 1)."""
    return code.isdigit() and int(code) > 0 and int(code) & (int(code) + 1) == 0


def _bits(op: str, a: int | None, b: int | None, b_code: str) -> int | None:
    """A bound on the bit length of `a op b` from its operands' bounds (None: unknown or maybe negative)."""
    if op in _COMPARE or op in ("and", "or"):
        return 1
    if op == "&":
        return _both(min, a, b) if a is not None and b is not None else a if a is not None else b
    if op in ("|", "^"):
        return _both(max, a, b)
    if op == "+":
        return _both(lambda x, y: max(x, y) + 1, a, b)
    if op == "*":
        return _both(lambda x, y: x + y, a, b)
    if op == "<<":
        return a + int(b_code) if a is not None and b is not None and b_code.isdigit() else None
    if op in (">>", "/"):
        return a if b is not None else None
    if op == "%":
        return b if a is not None else None
    return None  # "-": maybe negative


def _key_src(parts: list[str]) -> str:
    return f"({', '.join(parts)},)" if parts else "()"


def _postorder(init: str | None, succ: dict[str, list[str | None]]) -> list[str] | None:
    """Nodes reachable from `init`, each after all its successors; None if the graph has a cycle."""
    if init is None:
        return []
    order: list[str] = []
    state = {init: 1}  # 1: on the current path, 2: done
    stack = [(init, iter(succ[init]))]
    while stack:
        node, it = stack[-1]
        for s in it:
            if s is None:
                continue
            seen = state.get(s)
            if seen == 1:
                return None
            if seen is None:
                state[s] = 1
                stack.append((s, iter(succ[s])))
                break
        else:
            stack.pop()
            state[node] = 2
            order.append(node)
    return order


def _deparsed(parts: list[bytes], data: bytes, off: int) -> bytes:
    """Emitted headers then the payload data[off:]; the received bytes themselves when the headers come
    out as they went in, which saves copying large segments twice per pass."""
    head = b"".join(parts)
    if len(head) == off and data.__class__ is bytes and data.startswith(head):
        return data
    return b"".join((head, memoryview(data)[off:])) if off else head + data


def _div(x: int, y: int) -> int:
    return x // y if y else 0


def _mod(x: int, y: int) -> int:
    return x % y if y else 0


def _bind(env: dict[str, Any], value: Any) -> str:
    """Put a closure into generated code's namespace under a fresh name."""
    name = f"_c{len(env)}"
    env[name] = value
    return name


# Source templates of bmv2's binary operators (results are Python ints; comparisons give 0/1).
_BINARY: dict[str, str] = {
    "+": "({a} + {b})",
    "-": "({a} - {b})",
    "*": "({a} * {b})",
    "/": "_div({a}, {b})",
    "%": "_mod({a}, {b})",
    "<<": "({a} << {b})",
    ">>": "({a} >> {b})",
    "&": "({a} & {b})",
    "|": "({a} | {b})",
    "^": "({a} ^ {b})",
    "==": "(1 if {a} == {b} else 0)",
    "!=": "(1 if {a} != {b} else 0)",
    ">": "(1 if {a} > {b} else 0)",
    ">=": "(1 if {a} >= {b} else 0)",
    "<": "(1 if {a} < {b} else 0)",
    "<=": "(1 if {a} <= {b} else 0)",
    "and": "(1 if ({a}) and ({b}) else 0)",
    "or": "(1 if ({a}) or ({b}) else 0)",
}

__all__ = ["DROP_PORT", "RED", "ActionDef", "Packet", "Program", "TableDef"]
