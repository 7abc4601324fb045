"""Match-action pipelines: action profiles, tables with their const entries, conditionals, and the
closure interpreter that walks a pipeline's graph node by node.

The generated-source backend (codegen) writes a whole pipeline as one function when its control flow
allows; `interpret` runs the node closures here when it does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProgramError, UnsupportedConstruct
from ..profiles import NO_ACTION, ActionProfile
from ..tables import Entry, KeyField, Table
from .actions import ActionDef, no_action
from .calculations import Calculations, calc_fn
from .expressions import Expressions
from .loader import DirectMeterDef, Objects
from .packet import Packet

Node = Callable[[Packet], "str | None"]


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
    key_src: list[str] = field(default_factory=list)  # the key components as generated source


@dataclass
class PipelineDef:
    """One pipeline (ingress or egress): its graph's nodes as closures, and its tables and conditionals."""

    name: str
    init: str | None
    tables: dict[str, TableDef]
    conds: dict[str, dict[str, Any]]
    nodes: dict[str, Node]


class Pipelines:
    """The pipeline compiler of one program; `tables` and `profiles` gather those of every pipeline."""

    def __init__(self, objs: Objects, exprs: Expressions, calcs: Calculations, actions: dict[int, ActionDef]) -> None:
        self.objs = objs
        self.layout = objs.layout
        self.exprs = exprs
        self.calcs = calcs
        self.actions = actions
        self.tables: dict[str, TableDef] = {}
        self.profiles: dict[str, ActionProfile] = {}

    def load(self, pipe: dict[str, Any]) -> PipelineDef:
        """A pipeline with its action profiles and tables loaded, every node compiled and every edge checked."""
        pname = pipe.get("name", "?")
        if pipe.get("action_calls"):  # bmv2's direct action calls, which p4c has never written
            raise UnsupportedConstruct("action_calls", f"pipeline {pname}")
        self._load_profiles(pipe)
        nodes: dict[str, Node] = {}
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
        return PipelineDef(pname, init, tables, conds, nodes)

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
                selector = calc_fn(self.calcs.items(inputs, where), self.calcs.hash_fn(sel.get("algo"), where))
            self.profiles[name] = ActionProfile(name, selector)

    def _conditional_node(self, c: dict[str, Any], pname: str) -> Node:
        cond = self.exprs.expr(c["expression"], f"conditional {c.get('name')} in {pname}")
        t, f = c.get("true_next"), c.get("false_next")
        return lambda p: t if cond(p, []) else f

    def _load_table(self, t: dict[str, Any], pname: str) -> TableDef:
        where = f"table {t.get('name')}"
        layout = self.layout
        if t.get("support_timeout"):
            raise UnsupportedConstruct("idle timeout (support_timeout)", where)
        profile, with_selection = self._table_profile(t, where)
        dmeter = None
        if t.get("direct_meters"):
            dmeter = self.objs.direct_meters.get(str(t["direct_meters"]))
            if dmeter is None or dmeter.table != t.get("name"):
                raise ProgramError(f"bmv2 JSON: {where} has unknown direct meter {t['direct_meters']!r}")
        key_fields: list[KeyField] = []
        getters: list[Callable[[Packet], int]] = []
        names: list[str] = []
        srcs: list[str] = []
        key_masks: list[int] = []
        for k in t.get("key", []):
            mt = k.get("match_type")
            # bmv2's match kinds (match_name_to_match_type): p4c writes `optional` as ternary, and bmv2
            # refuses a JSON that says "optional".
            if mt not in ("exact", "lpm", "ternary", "range", "valid"):
                raise UnsupportedConstruct(f"match kind {mt}", where)
            target = k.get("target")
            # A key on h.isValid() (p4c: target [h, "$valid$"], a union member's too) reads bmv2's hidden
            # $valid$ field, which mark_valid and mark_invalid keep equal to the header's validity.
            valid_of = target[0] if isinstance(target, list) and target[1:] == ["$valid$"] else None
            if mt == "valid" or valid_of is not None:
                h = layout.header(target if mt == "valid" else valid_of, where)
                key_fields.append(KeyField(mt, 1))
                getters.append(_valid_getter(h.index))
                srcs.append(f"(1 if v[{h.index}] else 0)")
                key_masks.append(1)
            else:
                i = layout.field(target, where)
                width = layout.field_width[i]
                getters.append(_field_getter(i, int(k["mask"], 16) if k.get("mask") else -1))
                srcs.append(f"(f[{i}] & {int(k['mask'], 16)})" if k.get("mask") else f"f[{i}]")
                key_fields.append(KeyField(mt, width))
                key_masks.append(((1 << width) - 1) & (int(k["mask"], 16) if k.get("mask") else -1))
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
            direct_counter=self.objs.direct_counters.get(t["name"]),
            profile=profile,
            with_selection=with_selection,
            key_src=srcs,
        )
        if profile is not None and t.get("entries"):
            raise UnsupportedConstruct("const entries in an indirect table", where)
        for ce in t.get("entries", []) or []:
            entry = _const_entry(ce, key_fields, key_masks, table.needs_priority, where)
            # bmv2 refuses a program whose initializer holds one key twice (P4Objects::init_pipelines),
            # LPM keys compared on their prefix alone.
            if table.identity(entry.match, entry.priority) in table.entries:
                raise ProgramError(f"bmv2 JSON: {where}: duplicate entries in table initializer")
            table.insert(entry)
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

    def _table_node(self, tdef: TableDef) -> Node:
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

    def _keyless_table_node(self, tdef: TableDef, general: Node) -> Node:
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

    def _metered_table_node(self, tdef: TableDef) -> Node:
        # Tables with a direct meter, an action profile or no default entry (no keyless shortcut).
        # bmv2 executes a direct meter only on a hit, before the action, into the meter's result
        # field; an indirect entry's action is its member's, or that of a member of its group.
        dm = tdef.direct_meter
        table, key_fn, now = tdef.table, tdef.key_fn, self.objs.clock.now_us
        bodies = {aid: a.body for aid, a in self.actions.items()}
        bodies[NO_ACTION] = no_action
        out = dm.result if dm is not None else -1  # -1: no direct meter
        omask = self.layout.mask(out) if dm is not None else 0
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


def interpret(pd: PipelineDef) -> Callable[[Packet], None]:
    """The pipeline as a walk over its node closures."""
    init, nodes = pd.init, pd.nodes

    # The interpreter, for control flow too tangled to write out (see codegen's pipeline).
    def run(p: Packet) -> None:
        node = init
        while node is not None and not p.exited:
            node = nodes[node](p)

    return run


# bmv2's priority pivot for PI (BM_MAX_PRIORITY in bmv2's PI/src/pi_tables_imp.cpp, INT_MAX): PI reads
# a bmv2 priority p back as INT_MAX - p, larger winning as in P4Runtime.
BM_MAX_PRIORITY = (1 << 31) - 1


def _const_entry(ce: dict[str, Any], key: list[KeyField], masks: list[int], prioritised: bool, where: str) -> Entry:
    """A JSON initializer entry as bmv2 matches it: values cut to the key's width and field mask, LPM values
    to their prefix. meta["program"] keeps the values as bmv2 reads them back: in an LPM table, bits past
    the prefix included."""
    match: list[Any] = []
    shown: list[Any] = []
    if len(ce.get("match_key", [])) != len(key):
        raise ProgramError(f"bmv2 JSON: {where}: a const entry's match key has {len(ce.get('match_key', []))} fields")
    for kf, kmask, mk in zip(key, masks, ce.get("match_key", []), strict=True):
        mt = mk.get("match_type")
        if mt != kf.match_type:  # bmv2's parse_match_key refuses the program too
            raise ProgramError(f"bmv2 JSON: {where}: const entry match kind {mt}, the key says {kf.match_type}")
        if mt == "exact":
            value = int(mk["key"], 16) & kmask
            match.append(value)
            shown.append(value)
        elif mt == "valid":  # bmv2's convert_valid_key: a JSON boolean
            match.append(1 if mk["key"] is True else 0)
            shown.append(match[-1])
        elif mt == "lpm":
            # bmv2 stores the value whole but its LPM trie walks only the first prefix_length bits
            # (lookup_structures.cpp), so the bits past the prefix never count: 0x11/4 matches 0x1X.
            value, plen = int(mk["key"], 16) & kmask, int(mk["prefix_length"])
            if not 0 <= plen <= kf.bitwidth:
                raise ProgramError(f"bmv2 JSON: {where}: const entry prefix length {plen} (key is {kf.bitwidth} bits)")
            match.append((value & ~((1 << (kf.bitwidth - plen)) - 1), plen))
            # In a ternary or range table bmv2 turns the prefix into a mask and masks the value with it.
            shown.append(match[-1] if prioritised else (value, plen))
        elif mt == "ternary":
            mask = int(mk["mask"], 16) & ((1 << kf.bitwidth) - 1)
            match.append((int(mk["key"], 16) & mask & kmask, mask))
            shown.append(match[-1])
        elif mt == "range":
            match.append((int(mk["start"], 16) & kmask, int(mk["end"], 16)))
            shown.append(match[-1])
        else:
            raise UnsupportedConstruct(f"const entry match kind {mt}", where)
    ae = ce.get("action_entry", {})
    # bmv2 ignores the priority of exact and LPM entries (PI reads them back with none).
    prio = BM_MAX_PRIORITY - int(ce.get("priority", 0)) if prioritised else 0
    return Entry(
        match=tuple(match),
        action_id=int(ae["action_id"]),
        action_data=[int(x, 16) for x in ae.get("action_data", [])],
        priority=prio,
        meta={"program": tuple(shown)},
    )


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
