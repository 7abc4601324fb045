"""P4Info bound to a compiled program: every P4Info object matched to its bmv2 JSON counterpart.

The binding is checked once, when the pipeline is set; the entity modules then look objects up by
P4Info id here. It also holds what else P4Info defines over the program: the digest engine (P4Info
digests over the JSON's learn lists) and the packet I/O metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
from finsy.proto import p4i, p4r

from ..errors import P4RuntimeError, ProgramError
from ..externs import CounterArray, RegisterArray, ValueSet
from ..profiles import NO_ACTION
from ..program import Program
from ..switch.pipeline import TableDef
from ..tables import KeyField, Table
from .codec import decode_bytes, encode_bytes, invalid
from .digests import DigestEngine, Emit
from .packetio import PacketIO
from .profile_mgr import ProfileManager


@dataclass
class ProfileBinding:
    """A P4Info action profile bound to its bmv2 profile, with PI's manager for it."""

    info: p4i.ActionProfile
    mgr: ProfileManager
    action_ids: dict[int, int]  # P4Info action id -> JSON action id, over the profile's tables
    json_to_info_action: dict[int, int]


@dataclass
class TableBinding:
    """A P4Info table bound to its compiled table."""

    info: p4i.Table
    tdef: TableDef
    action_ids: dict[int, int]  # P4Info action id -> JSON action id
    json_to_info_action: dict[int, int]
    match_fields: list[p4i.MatchField]
    profile: ProfileBinding | None = None  # an indirect table's action profile
    # A P4Info table the bmv2 JSON lacks (p4c writes P4Info before its mid-end drops dead tables):
    # `tdef` is an empty stand-in that no packet reaches, and bmv2's PI fails what needs the table.
    absent: bool = False


# P4Info match kind -> what p4c writes in the bmv2 JSON: `optional` as ternary (bmv2 has no optional).
_JSON_KIND = {"EXACT": "exact", "LPM": "lpm", "TERNARY": "ternary", "RANGE": "range", "OPTIONAL": "ternary"}


class Binding:
    """A compiled program plus the P4Info that names its objects for P4Runtime."""

    def __init__(
        self,
        program: Program,
        p4info: p4i.P4Info,
        emit: Emit | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        """Bind `program` to `p4info`; digests go to `emit`, and `wake` hears of new digest timeouts."""
        self.program = program
        self.p4info = p4info
        self.tables: dict[int, TableBinding] = {}
        self.counters: dict[int, tuple[p4i.Counter, CounterArray]] = {}
        self.meters: dict[int, p4i.Meter] = {}
        self.registers: dict[int, tuple[p4i.Register, RegisterArray]] = {}
        self.value_sets: dict[int, tuple[p4i.ValueSet, ValueSet]] = {}
        self.vset_members: dict[int, list[p4r.ValueSetMember]] = {}
        self.direct_counters: dict[int, TableBinding] = {}  # direct counter id -> its table
        self.direct_meters: dict[int, TableBinding] = {}
        self.profiles: dict[int, ProfileBinding] = {}
        self.action_info: dict[int, p4i.Action] = {a.preamble.id: a for a in p4info.actions}
        self._bind()
        self.packet_io = PacketIO(p4info)
        self.digests = DigestEngine(
            program.learn_lists, p4info, program.clock, emit or (lambda msg: None), wake or (lambda: None)
        )
        program.on_learn = self.digests.learn

    # ---------------------------------------------------------------- lookups the entity kinds share

    def binding(self, table_id: int) -> TableBinding:
        """A table by P4Info id (NOT_FOUND if there is none)."""
        b = self.tables.get(table_id)
        if b is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"table id {table_id} is not in the P4Info")
        return b

    def action_data(self, a: p4r.Action) -> list[int]:
        """An action's parameters as values, in P4Info order (the action id is known to be valid)."""
        ainfo = self.action_info[a.action_id]
        given = {p.param_id: p.value for p in a.params}
        if len(given) != len(a.params) or set(given) != {p.id for p in ainfo.params}:
            raise invalid(f"action {ainfo.preamble.name}: parameters must be exactly {[p.name for p in ainfo.params]}")
        return [
            decode_bytes(given[p.id], p.bitwidth, f"action {ainfo.preamble.name} param {p.name!r}")
            for p in ainfo.params
        ]

    def p4r_action(self, info_aid: int, data: list[int]) -> p4r.Action:
        """An action as reads return it: parameters in P4Info order, canonical byte strings."""
        out = p4r.Action(action_id=info_aid)
        for p, v in zip(self.action_info[info_aid].params, data, strict=False):
            out.params.add(param_id=p.id, value=encode_bytes(v))
        return out

    def profile(self, profile_id: int) -> ProfileBinding:
        """An action profile by P4Info id."""
        pb = self.profiles.get(profile_id)
        if pb is None:
            raise invalid(f"action profile id {profile_id} is not in the P4Info (Invalid P4 id)")
        return pb

    def profile_action(self, pb: ProfileBinding, a: p4r.Action) -> tuple[int, list[int]]:
        """A member's action as (JSON action id, data), checked against the profile's tables."""
        if a.action_id not in self.action_info:
            raise invalid(f"action id {a.action_id} is not in the P4Info (Invalid P4 id)")
        json_id = pb.action_ids.get(a.action_id)
        if json_id is None:
            raise invalid(f"Invalid action for action profile: action id {a.action_id}")
        return json_id, self.action_data(a)

    # ---------------------------------------------------------------- binding

    def _bind(self) -> None:
        prog = self.program
        for t in self.p4info.tables:
            name = t.preamble.name
            tdef = prog.tables.get(name)
            absent = tdef is None
            if tdef is None:
                tdef = _stand_in(t)
            if len(t.match_fields) != len(tdef.table.key):
                raise ProgramError(f"P4Info table {name!r}: match fields differ from the bmv2 JSON key")
            for mf, kf in zip(t.match_fields, tdef.table.key, strict=True):
                kind = _JSON_KIND.get(p4i.MatchField.MatchType.Name(mf.match_type), "?")
                if kind != kf.match_type and not (kf.match_type == "valid" and kind == "exact"):
                    raise ProgramError(
                        f"P4Info table {name!r}: field {mf.name!r} is {kind}, bmv2 JSON says {kf.match_type}"
                    )
            ids: dict[int, int] = {}
            for ref in t.action_refs:
                ainfo = self.action_info.get(ref.id)
                if ainfo is None:
                    raise ProgramError(f"P4Info table {name!r} refers to unknown action id {ref.id}")
                json_id = next(
                    (aid for aid in tdef.action_ids if prog.actions[aid].name == ainfo.preamble.name),
                    NO_ACTION if absent else None,  # an absent table's actions may be gone from the JSON too
                )
                if json_id is None:
                    raise ProgramError(
                        f"P4Info action {ainfo.preamble.name!r} is not an action of table {name!r} in the bmv2 JSON"
                    )
                ids[ref.id] = json_id
            self.tables[t.preamble.id] = TableBinding(
                info=t,
                tdef=tdef,
                action_ids=ids,
                json_to_info_action={v: k for k, v in ids.items()},
                match_fields=list(t.match_fields),
                absent=absent,
            )
        for c in self.p4info.counters:
            arr = prog.counters.get(c.preamble.name)
            if arr is None:
                raise ProgramError(f"P4Info counter {c.preamble.name!r} is not in the bmv2 JSON")
            self.counters[c.preamble.id] = (c, arr)
        for m in self.p4info.meters:
            if m.preamble.name not in prog.meters:
                raise ProgramError(f"P4Info meter {m.preamble.name!r} is not in the bmv2 JSON")
            self.meters[m.preamble.id] = m
        self._bind_direct_and_stateful()
        self._bind_profiles()

    def _bind_profiles(self) -> None:
        for ap in self.p4info.action_profiles:
            name = ap.preamble.name
            profile = self.program.profiles.get(name)
            if profile is None:
                raise ProgramError(f"P4Info action profile {name!r} is not in the bmv2 JSON")
            if ap.with_selector != (profile.selector is not None):
                raise ProgramError(f"P4Info action profile {name!r}: with_selector differs from the bmv2 JSON")
            users = [b for b in self.tables.values() if b.info.implementation_id == ap.preamble.id]
            ids = {info: json for b in users for info, json in b.action_ids.items()}
            pb = ProfileBinding(ap, ProfileManager(profile, ap.max_group_size), ids, {v: k for k, v in ids.items()})
            self.profiles[ap.preamble.id] = pb
            for b in users:
                if b.tdef.profile is not profile:
                    raise ProgramError(
                        f"P4Info table {b.info.preamble.name!r}: action profile differs from the bmv2 JSON"
                    )
                b.profile = pb
        for b in self.tables.values():
            if b.tdef.profile is not None and b.profile is None:
                raise ProgramError(f"P4Info table {b.info.preamble.name!r} has no action profile, the bmv2 JSON one")

    def _bind_direct_and_stateful(self) -> None:
        prog = self.program
        for r in self.p4info.registers:
            arr = prog.registers.get(r.preamble.name)
            if arr is None:
                raise ProgramError(f"P4Info register {r.preamble.name!r} is not in the bmv2 JSON")
            self.registers[r.preamble.id] = (r, arr)
        for v in self.p4info.value_sets:
            vset = prog.vsets.get(v.preamble.name)
            if vset is None:
                raise ProgramError(f"P4Info value set {v.preamble.name!r} is not in the bmv2 JSON")
            self.value_sets[v.preamble.id] = (v, vset)
            self.vset_members[v.preamble.id] = []
        for dc in self.p4info.direct_counters:
            b = self.tables.get(dc.direct_table_id)
            if b is None or not b.tdef.with_counters:
                raise ProgramError(f"P4Info direct counter {dc.preamble.name!r} has no table with counters")
            self.direct_counters[dc.preamble.id] = b
        for dm in self.p4info.direct_meters:
            b = self.tables.get(dm.direct_table_id)
            if b is None or b.tdef.direct_meter is None:
                raise ProgramError(f"P4Info direct meter {dm.preamble.name!r} has no table with a direct meter")
            self.direct_meters[dm.preamble.id] = b


def _stand_in(t: p4i.Table) -> TableDef:
    """An empty table in the place of one the bmv2 JSON lacks, keyed as its P4Info says."""
    kinds = [_JSON_KIND.get(p4i.MatchField.MatchType.Name(mf.match_type), "?") for mf in t.match_fields]
    key = [KeyField(kind, mf.bitwidth) for kind, mf in zip(kinds, t.match_fields, strict=True)]
    return TableDef(
        name=t.preamble.name,
        id=0,
        table=Table(t.preamble.name, key, int(t.size) or 1024),
        key_fn=lambda p: (),
        action_ids=[],
        default_action_id=NO_ACTION,
        default_action_data=[],
        default_const=t.const_default_action_id != 0,
        next_by_action={},
        next_hit=None,
        next_miss=None,
        uses_hit_miss=False,
        with_counters=False,
        key_names=[mf.name for mf in t.match_fields],
    )
