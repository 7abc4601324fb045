"""P4Runtime entities on a compiled program: P4Info-to-JSON binding, writes and reads.

Semantics follow the P4Runtime specification as simple_switch_grpc's server answers it:
canonical or zero-padded byte strings, value-in-range checks, LPM/ternary masks with no
stray bits, priority required exactly for TCAM-like tables, duplicate INSERT -> ALREADY_EXISTS,
MODIFY/DELETE of a missing entry -> NOT_FOUND, const tables and const default actions refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from finsy.proto import p4i, p4r

from .bytestrings import canonical
from .digests import DigestEngine, Emit
from .errors import P4RuntimeError, ProgramError
from .externs import CounterArray, Meter, RegisterArray, ValueSet, configure_meter, meter_config
from .packetio import PacketIO
from .profile_mgr import MANUAL, ONESHOT, ProfileManager
from .profiles import NO_ACTION
from .program import Program, TableDef
from .tables import Entry


def _invalid(msg: str) -> P4RuntimeError:
    return P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def decode_bytes(data: bytes, bitwidth: int, what: str) -> int:
    """Decode a P4Runtime byte string, refusing values wider than the field."""
    if not data:
        raise _invalid(f"{what}: empty byte string")
    value = int.from_bytes(data, "big")
    if value >> bitwidth:
        raise P4RuntimeError(
            grpc.StatusCode.OUT_OF_RANGE, f"{what}: value 0x{data.hex()} does not fit in {bitwidth} bits"
        )
    return value


def encode_bytes(value: int) -> bytes:
    """Encode a value as P4Runtime's canonical (shortest) byte string."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


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


class Pipeline:
    """A compiled program plus the P4Info that names its objects for P4Runtime."""

    def __init__(
        self,
        program: Program,
        p4info: p4i.P4Info,
        cookie: int,
        device_config: bytes,
        emit: Emit | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        """Bind `program` to `p4info`; digests go to `emit`, and `wake` hears of new digest timeouts."""
        self.program = program
        self.p4info = p4info
        self.cookie = cookie
        self.device_config = device_config
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

    def _bind(self) -> None:
        prog = self.program
        for t in self.p4info.tables:
            name = t.preamble.name
            tdef = prog.tables.get(name)
            if tdef is None:
                raise ProgramError(f"P4Info table {name!r} is not in the bmv2 JSON")
            if len(t.match_fields) != len(tdef.table.key):
                raise ProgramError(f"P4Info table {name!r}: match fields differ from the bmv2 JSON key")
            for mf, kf in zip(t.match_fields, tdef.table.key, strict=True):
                kind = p4i.MatchField.MatchType.Name(mf.match_type).lower()
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
                    None,
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

    # ---------------------------------------------------------------- writes

    def write(self, update: p4r.Update) -> None:
        """Apply one update (raises P4RuntimeError with the P4Runtime error)."""
        kind = update.entity.WhichOneof("entity")
        if kind == "table_entry":
            self._write_table(update.type, update.entity.table_entry)
        elif kind == "meter_entry":
            self._write_meter(update.type, update.entity.meter_entry)
        elif kind == "counter_entry":
            self._write_counter(update.type, update.entity.counter_entry)
        elif kind == "direct_counter_entry":
            self._write_direct_counter(update.type, update.entity.direct_counter_entry)
        elif kind == "direct_meter_entry":
            self._write_direct_meter(update.type, update.entity.direct_meter_entry)
        elif kind == "register_entry":
            self._write_register(update.type, update.entity.register_entry)
        elif kind == "value_set_entry":
            self._write_value_set(update.type, update.entity.value_set_entry)
        elif kind == "packet_replication_engine_entry":
            self._write_pre(update.type, update.entity.packet_replication_engine_entry)
        elif kind == "action_profile_member":
            self._write_member(update.type, update.entity.action_profile_member)
        elif kind == "action_profile_group":
            self._write_group(update.type, update.entity.action_profile_group)
        elif kind == "digest_entry":
            self.digests.write(update.type, update.entity.digest_entry)
        else:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, f"entity {kind} is not supported by this target")

    def _binding(self, table_id: int) -> TableBinding:
        b = self.tables.get(table_id)
        if b is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"table id {table_id} is not in the P4Info")
        return b

    def _match(self, b: TableBinding, te: p4r.TableEntry) -> tuple[tuple[object, ...], int]:
        by_id = {fm.field_id: fm for fm in te.match}
        if len(by_id) != len(te.match):
            raise _invalid("duplicate field id in match")
        known = {mf.id for mf in b.match_fields}
        for fid in by_id:
            if fid not in known:
                raise _invalid(f"unknown match field id {fid} for table {b.info.preamble.name}")
        match: list[object] = []
        for mf in b.match_fields:
            what = f"match field {mf.name!r}"
            fm = by_id.get(mf.id)
            kind = p4i.MatchField.MatchType.Name(mf.match_type)
            width = mf.bitwidth
            if fm is None:
                if kind == "EXACT":
                    raise _invalid(f"{what}: exact match field is missing")
                match.append(_wildcard(kind, width))
                continue
            got = fm.WhichOneof("field_match_type")
            if got != kind.lower():
                raise _invalid(f"{what}: expected {kind.lower()} match, got {got}")
            if kind == "EXACT":
                match.append(decode_bytes(fm.exact.value, width, what))
            elif kind == "LPM":
                value = decode_bytes(fm.lpm.value, width, what)
                plen = fm.lpm.prefix_len
                if not 0 < plen <= width:
                    raise _invalid(f"{what}: prefix_len {plen} outside 1..{width} (omit the field for a wildcard)")
                if value & ((1 << (width - plen)) - 1):
                    raise _invalid(f"{what}: value has bits set beyond prefix_len {plen}")
                match.append((value, plen))
            elif kind == "TERNARY":
                value = decode_bytes(fm.ternary.value, width, what)
                mask = decode_bytes(fm.ternary.mask, width, what)
                if mask == 0:
                    raise _invalid(f"{what}: all-zero mask (omit the field for a wildcard)")
                if value & ~mask:
                    raise _invalid(f"{what}: value has bits set outside the mask")
                match.append((value, mask))
            elif kind == "RANGE":
                low = decode_bytes(fm.range.low, width, what)
                high = decode_bytes(fm.range.high, width, what)
                if low > high:
                    raise _invalid(f"{what}: low > high")
                match.append((low, high))
            elif kind == "OPTIONAL":
                match.append(decode_bytes(fm.optional.value, width, what))
            else:
                raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, f"{what}: match kind {kind}")
        needs_priority = b.tdef.table.needs_priority
        if needs_priority and te.priority <= 0:
            raise _invalid(f"table {b.info.preamble.name}: priority must be > 0 for this table")
        if not needs_priority and te.priority != 0:
            raise _invalid(f"table {b.info.preamble.name}: priority must be 0 for this table")
        return tuple(match), te.priority

    def _action(self, b: TableBinding, te: p4r.TableEntry, default: bool) -> tuple[int, list[int]]:
        if te.action.WhichOneof("type") != "action":
            raise _invalid(f"Cannot provide indirect action for direct table {b.info.preamble.id}")
        a = te.action.action
        json_id = b.action_ids.get(a.action_id)
        if json_id is None:
            raise _invalid(f"action id {a.action_id} is not an action of table {b.info.preamble.name}")
        ref = next(r for r in b.info.action_refs if r.id == a.action_id)
        if default and ref.scope == p4i.ActionRef.Scope.TABLE_ONLY:
            raise _invalid(f"action id {a.action_id} may not be a default action")
        if not default and ref.scope == p4i.ActionRef.Scope.DEFAULT_ONLY:
            raise _invalid(f"action id {a.action_id} may only be a default action")
        return json_id, self._action_data(a)

    def _action_data(self, a: p4r.Action) -> list[int]:
        """An action's parameters as values, in P4Info order (the action id is known to be valid)."""
        ainfo = self.action_info[a.action_id]
        given = {p.param_id: p.value for p in a.params}
        if len(given) != len(a.params) or set(given) != {p.id for p in ainfo.params}:
            raise _invalid(f"action {ainfo.preamble.name}: parameters must be exactly {[p.name for p in ainfo.params]}")
        return [
            decode_bytes(given[p.id], p.bitwidth, f"action {ainfo.preamble.name} param {p.name!r}")
            for p in ainfo.params
        ]

    def _p4r_action(self, info_aid: int, data: list[int]) -> p4r.Action:
        """An action as reads return it: parameters in P4Info order, canonical byte strings."""
        out = p4r.Action(action_id=info_aid)
        for p, v in zip(self.action_info[info_aid].params, data, strict=False):
            out.params.add(param_id=p.id, value=encode_bytes(v))
        return out

    def _write_table(self, kind: int, te: p4r.TableEntry) -> None:
        b = self._binding(te.table_id)
        tdef = b.tdef
        if te.is_default_action:
            if kind != p4r.Update.MODIFY:
                raise _invalid("the default entry can only be modified")
            if b.profile is not None:  # P4Runtime: tables with an action profile have no default action
                raise _invalid(f"Cannot set / reset default action for indirect table {b.info.preamble.id}")
            if te.match:
                raise _invalid("a default entry has no match fields")
            if tdef.default_const:
                raise P4RuntimeError(
                    grpc.StatusCode.PERMISSION_DENIED, f"table {b.info.preamble.name} has a const default action"
                )
            if te.HasField("action"):
                tdef.default_action_id, tdef.default_action_data = self._action(b, te, default=True)
            else:  # reset to the program's default
                default = self._json_default(tdef)
                tdef.default_action_id, tdef.default_action_data = default
            return
        if tdef.const_entries or b.info.is_const_table:
            raise P4RuntimeError(grpc.StatusCode.PERMISSION_DENIED, f"table {b.info.preamble.name} is const")
        match, prio = self._match(b, te)
        if b.profile is not None:
            self._write_indirect(kind, b, te, match, prio)
            return
        ident = tdef.table.identity(match, prio)
        existing = tdef.table.entries.get(ident)
        if kind == p4r.Update.INSERT:
            if existing is not None:
                raise P4RuntimeError(
                    grpc.StatusCode.ALREADY_EXISTS, "match entry exists, use MODIFY if you wish to change action"
                )
            if len(tdef.table) >= tdef.table.size:
                raise P4RuntimeError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"table {b.info.preamble.name} is full ({tdef.table.size} entries)",
                )
            aid, data = self._action(b, te, default=False)
            entry = Entry(match, aid, data, prio, meta={"entity": _stored(te)})
            self._new_entry_resources(b, entry, te)
            tdef.table.insert(entry)
        elif kind == p4r.Update.MODIFY:
            if existing is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
            aid, data = self._action(b, te, default=False)
            # Swap action in place: one assignment of a tuple keeps the packet path consistent.
            existing.action_id, existing.action_data = aid, data
            self._modified_entry_resources(b, existing, te)
        elif kind == p4r.Update.DELETE:
            if existing is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
            tdef.table.remove(match, prio)
        else:
            raise _invalid(f"update type {kind} is not valid")

    def _new_entry_resources(self, b: TableBinding, entry: Entry, te: p4r.TableEntry) -> None:
        if te.HasField("counter_data"):
            entry.packets, entry.bytes = te.counter_data.packet_count, te.counter_data.byte_count
        if b.tdef.direct_meter is not None:
            entry.meter = Meter()
            if te.HasField("meter_config"):
                self._configure(entry.meter, te.meter_config, b.info.preamble.name)

    def _modified_entry_resources(self, b: TableBinding, entry: Entry, te: p4r.TableEntry) -> None:
        entry.meta["entity"] = _stored(te)
        if te.HasField("meter_config") and entry.meter is not None:
            self._configure(entry.meter, te.meter_config, b.info.preamble.name)
        if te.HasField("counter_data"):
            entry.packets, entry.bytes = te.counter_data.packet_count, te.counter_data.byte_count

    # ---------------------------------------------------------------- indirect tables and action profiles

    def _write_indirect(
        self, kind: int, b: TableBinding, te: p4r.TableEntry, match: tuple[object, ...], prio: int
    ) -> None:
        """An entry of a table with an action profile: it points at a member, a group or a one-shot group."""
        assert b.profile is not None
        table, mgr = b.tdef.table, b.profile.mgr
        existing = table.entries.get(table.identity(match, prio))
        if kind == p4r.Update.DELETE:
            if existing is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
            table.remove(match, prio)
            mgr.profile.unref(existing.member, existing.group)
            if existing.meta.get("oneshot"):
                mgr.oneshot_delete(existing.group)
            return
        if kind not in (p4r.Update.INSERT, p4r.Update.MODIFY):
            raise _invalid(f"update type {kind} is not valid")
        if not te.HasField("action"):
            raise _invalid("'action' field must be set")
        member, group, oneshot = self._indirect_target(b, te)
        try:
            if kind == p4r.Update.INSERT:
                entry = Entry(match, -1, [], prio, meta={"oneshot": oneshot}, member=member, group=group)
                self._insert_indirect(b, te, existing, entry)
            else:
                self._modify_indirect(b, te, existing, member, group, oneshot)
        except P4RuntimeError:
            if oneshot:
                mgr.oneshot_delete(group)
            raise

    def _insert_indirect(self, b: TableBinding, te: p4r.TableEntry, existing: Entry | None, entry: Entry) -> None:
        assert b.profile is not None
        table = b.tdef.table
        if existing is not None:
            raise P4RuntimeError(
                grpc.StatusCode.ALREADY_EXISTS, "match entry exists, use MODIFY if you wish to change action"
            )
        if len(table) >= table.size:
            raise P4RuntimeError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"table {b.info.preamble.name} is full ({table.size} entries)"
            )
        self._check_indirect(b, entry.group, "Error when adding match entry to target")
        entry.meta["entity"] = _stored(te)
        self._new_entry_resources(b, entry, te)
        b.profile.mgr.profile.ref(entry.member, entry.group)
        table.insert(entry)

    def _modify_indirect(
        self, b: TableBinding, te: p4r.TableEntry, existing: Entry | None, member: int, group: int, oneshot: bool
    ) -> None:
        assert b.profile is not None
        if existing is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
        # bmv2's modify_entry drops the old reference before it checks the new target and does not
        # restore it when the check fails: the entry then points at a member or group that may be
        # deleted (its packets keep the stale action; PI fails reading the table, INTERNAL).
        b.profile.mgr.profile.unref(existing.member, existing.group)
        self._check_indirect(b, group, "Error when modifying match entry in target")
        old_oneshot = existing.group if existing.meta.get("oneshot") else -1
        self._repoint(b, existing, member, group)
        existing.meta["oneshot"] = oneshot
        self._modified_entry_resources(b, existing, te)
        if old_oneshot >= 0:
            b.profile.mgr.oneshot_delete(old_oneshot)

    def _indirect_target(self, b: TableBinding, te: p4r.TableEntry) -> tuple[int, int, bool]:
        """(member handle, group handle, one-shot) of an indirect entry's action; a one-shot action set
        gets its group made here, as PI makes it before adding the entry."""
        assert b.profile is not None
        mgr, which = b.profile.mgr, te.action.WhichOneof("type")
        if which == "action_profile_member_id":
            return *mgr.handle(te.action.action_profile_member_id, None), False
        if which == "action_profile_group_id":
            return *mgr.handle(None, te.action.action_profile_group_id), False
        if which != "action_profile_action_set":
            raise _invalid(f"Cannot provide direct action for indirect table {b.info.preamble.id}")
        mgr.use(ONESHOT)
        actions = te.action.action_profile_action_set.action_profile_actions
        if not actions:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "No support for empty action profile groups")
        for a in actions:
            _refuse_watch(a, "action_profile_action_set")
        converted = [(*self._profile_action(b.profile, a.action), a.weight) for a in actions]
        return -1, mgr.oneshot_create(converted), True

    @staticmethod
    def _check_indirect(b: TableBinding, group: int, message: str) -> None:
        # bmv2 refuses a group in a table without a selector (WRONG_TABLE_TYPE) and an empty group
        # (EMPTY_GRP); PI reports either as UNKNOWN.
        assert b.profile is not None
        if group >= 0 and (not b.tdef.with_selection or not b.profile.mgr.profile.groups[group]):
            raise P4RuntimeError(grpc.StatusCode.UNKNOWN, message)

    @staticmethod
    def _repoint(b: TableBinding, entry: Entry, member: int, group: int) -> None:
        assert b.profile is not None
        b.profile.mgr.profile.ref(member, group)  # the old reference is already dropped
        # The packet path reads the group first: set a group before clearing the member, and the other
        # way round, so that it never sees neither.
        if group >= 0:
            entry.group, entry.member = group, member
        else:
            entry.member, entry.group = member, group

    def _profile(self, profile_id: int) -> ProfileBinding:
        pb = self.profiles.get(profile_id)
        if pb is None:
            raise _invalid(f"action profile id {profile_id} is not in the P4Info (Invalid P4 id)")
        return pb

    def _profile_action(self, pb: ProfileBinding, a: p4r.Action) -> tuple[int, list[int]]:
        if a.action_id not in self.action_info:
            raise _invalid(f"action id {a.action_id} is not in the P4Info (Invalid P4 id)")
        json_id = pb.action_ids.get(a.action_id)
        if json_id is None:
            raise _invalid(f"Invalid action for action profile: action id {a.action_id}")
        return json_id, self._action_data(a)

    def _write_member(self, kind: int, m: p4r.ActionProfileMember) -> None:
        pb = self._profile(m.action_profile_id)
        mgr = pb.mgr
        mgr.use(MANUAL)
        if kind == p4r.Update.DELETE:
            mgr.member_delete(m.member_id)
        elif kind in (p4r.Update.INSERT, p4r.Update.MODIFY):
            aid, data = self._profile_action(pb, m.action)
            if kind == p4r.Update.INSERT:
                mgr.member_insert(m.member_id, aid, data)
            else:
                mgr.member_modify(m.member_id, aid, data)
        else:
            raise _invalid(f"update type {kind} is not valid")

    def _write_group(self, kind: int, g: p4r.ActionProfileGroup) -> None:
        mgr = self._profile(g.action_profile_id).mgr
        mgr.use(MANUAL)
        for m in g.members:
            _refuse_watch(m, f"group {g.group_id} member {m.member_id}")
        wanted = [(m.member_id, m.weight) for m in g.members]
        if kind == p4r.Update.INSERT:
            mgr.group_insert(g.group_id, g.max_size, wanted)
        elif kind == p4r.Update.MODIFY:
            mgr.group_modify(g.group_id, g.max_size, wanted)
        elif kind == p4r.Update.DELETE:
            mgr.group_delete(g.group_id)
        else:
            raise _invalid(f"update type {kind} is not valid")

    def _read_members(self, req: p4r.ActionProfileMember) -> Iterator[p4r.Entity]:
        for pid in [req.action_profile_id] if req.action_profile_id else list(self.profiles):
            pb = self._profile(pid)
            pb.mgr.use(MANUAL)
            for member_id, aid, data in pb.mgr.read_members(req.member_id):
                out = p4r.ActionProfileMember(action_profile_id=pid, member_id=member_id)
                out.action.CopyFrom(self._p4r_action(pb.json_to_info_action[aid], data))
                yield p4r.Entity(action_profile_member=out)

    def _read_groups(self, req: p4r.ActionProfileGroup) -> Iterator[p4r.Entity]:
        for pid in [req.action_profile_id] if req.action_profile_id else list(self.profiles):
            pb = self._profile(pid)
            pb.mgr.use(MANUAL)
            for group_id, max_size, members in pb.mgr.read_groups(req.group_id):
                out = p4r.ActionProfileGroup(action_profile_id=pid, group_id=group_id, max_size=max_size)
                for member_id, weight in members:
                    out.members.add(member_id=member_id, weight=weight)
                yield p4r.Entity(action_profile_group=out)

    def _json_default(self, tdef: TableDef) -> tuple[int, list[int]]:
        for t in self.program.doc["pipelines"]:
            for jt in t.get("tables", []):
                if jt["name"] == tdef.name:
                    d = jt.get("default_entry") or {}
                    if "action_id" not in d:  # bmv2's default_default_entry: no action
                        return NO_ACTION, []
                    return int(d["action_id"]), [int(x, 16) for x in d.get("action_data", [])]
        return tdef.default_action_id, tdef.default_action_data

    def _write_meter(self, kind: int, me: p4r.MeterEntry) -> None:
        if kind != p4r.Update.MODIFY:
            raise _invalid("meter entries can only be modified")
        info = self.meters.get(me.meter_id)
        if info is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"meter id {me.meter_id} is not in the P4Info")
        arr = self.program.meters[info.preamble.name]
        indexes = [me.index.index] if me.HasField("index") else list(range(arr.size))
        for idx in indexes:
            if not 0 <= idx < arr.size:
                raise P4RuntimeError(
                    grpc.StatusCode.OUT_OF_RANGE, f"meter {info.preamble.name}: index {idx} outside 0..{arr.size - 1}"
                )
        for idx in indexes:
            if me.HasField("config"):
                c = me.config
                if c.cir < 0 or c.pir < 0 or c.cburst < 0 or c.pburst < 0:
                    raise _invalid("meter config values must be >= 0")
                if c.cir > c.pir:
                    raise _invalid(f"meter {info.preamble.name}: cir {c.cir} > pir {c.pir}")
                arr.set_p4runtime_config(idx, c.cir, c.cburst, c.pir, c.pburst)
            else:
                arr.cells[idx].reset()

    def _write_counter(self, kind: int, ce: p4r.CounterEntry) -> None:
        if kind != p4r.Update.MODIFY:
            raise _invalid("counter entries can only be modified")
        found = self.counters.get(ce.counter_id)
        if found is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"counter id {ce.counter_id} is not in the P4Info")
        info, arr = found
        indexes = [ce.index.index] if ce.HasField("index") else list(range(arr.size))
        for idx in indexes:
            if not 0 <= idx < arr.size:
                raise P4RuntimeError(
                    grpc.StatusCode.OUT_OF_RANGE, f"counter {info.preamble.name}: index {idx} out of range"
                )
            arr.packets[idx] = ce.data.packet_count
            arr.bytes[idx] = ce.data.byte_count

    # ---------------------------------------------------------------- reads

    def read(self, entity: p4r.Entity) -> Iterator[p4r.Entity]:
        """Yield the entities matching one read request entity (ids of 0 are wildcards)."""
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            yield from self._read_tables(entity.table_entry)
        elif kind == "meter_entry":
            yield from self._read_meters(entity.meter_entry)
        elif kind == "counter_entry":
            yield from self._read_counters(entity.counter_entry)
        elif kind == "direct_counter_entry":
            yield from self._read_direct_counters(entity.direct_counter_entry)
        elif kind == "direct_meter_entry":
            yield from self._read_direct_meters(entity.direct_meter_entry)
        elif kind == "register_entry":
            yield from self._read_registers(entity.register_entry)
        elif kind == "value_set_entry":
            yield from self._read_value_sets(entity.value_set_entry)
        elif kind == "packet_replication_engine_entry":
            yield from self._read_pre(entity.packet_replication_engine_entry)
        elif kind == "action_profile_member":
            yield from self._read_members(entity.action_profile_member)
        elif kind == "action_profile_group":
            yield from self._read_groups(entity.action_profile_group)
        elif kind == "digest_entry":
            yield p4r.Entity(digest_entry=self.digests.read(entity.digest_entry))
        else:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, f"reading {kind} is not supported by this target")

    def _read_tables(self, req: p4r.TableEntry) -> Iterator[p4r.Entity]:
        if req.table_id:
            bindings = [self._binding(req.table_id)]
        else:
            bindings = list(self.tables.values())
        want_counters = req.HasField("counter_data")
        for b in bindings:
            if req.is_default_action:
                tdef = b.tdef
                te = p4r.TableEntry(table_id=b.info.preamble.id, is_default_action=True)
                info_aid = b.json_to_info_action.get(tdef.default_action_id)
                # An indirect table reads back no default action (bmv2 has no default member set).
                if info_aid is not None and b.profile is None:
                    te.action.action.CopyFrom(self._p4r_action(info_aid, tdef.default_action_data))
                yield p4r.Entity(table_entry=te)
                continue
            match_filter = None
            if req.match:
                match_filter = self._match(b, req)
            for entry in list(b.tdef.table.entries.values()):
                if match_filter is not None and (entry.match, entry.priority) != match_filter:
                    continue
                if b.profile is not None and not b.profile.mgr.names(entry.member, entry.group):
                    raise P4RuntimeError(grpc.StatusCode.INTERNAL, "Invalid indirect handle")
                stored = entry.meta.get("entity")
                te = p4r.TableEntry()
                if stored is not None:
                    te.CopyFrom(stored)
                else:  # a const entry from the program
                    te.table_id = b.info.preamble.id
                    te.priority = entry.priority
                if want_counters and b.tdef.with_counters:
                    te.counter_data.packet_count = entry.packets
                    te.counter_data.byte_count = entry.bytes
                if req.HasField("meter_config") and entry.meter is not None:
                    cfg = meter_config(entry.meter)
                    if cfg is not None:
                        c = te.meter_config
                        c.cir, c.cburst, c.pir, c.pburst = cfg
                yield p4r.Entity(table_entry=te)

    def _read_meters(self, req: p4r.MeterEntry) -> Iterator[p4r.Entity]:
        ids = [req.meter_id] if req.meter_id else list(self.meters)
        for mid in ids:
            info = self.meters.get(mid)
            if info is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"meter id {mid} is not in the P4Info")
            arr = self.program.meters[info.preamble.name]
            indexes = [req.index.index] if req.HasField("index") else range(arr.size)
            for idx in indexes:
                if not 0 <= idx < arr.size:
                    raise P4RuntimeError(
                        grpc.StatusCode.OUT_OF_RANGE, f"meter {info.preamble.name}: index {idx} out of range"
                    )
                out = p4r.MeterEntry(meter_id=mid, index=p4r.Index(index=idx))
                cfg = arr.get_p4runtime_config(idx)
                if cfg is not None:
                    out.config.cir, out.config.cburst, out.config.pir, out.config.pburst = cfg
                yield p4r.Entity(meter_entry=out)

    def _read_counters(self, req: p4r.CounterEntry) -> Iterator[p4r.Entity]:
        ids = [req.counter_id] if req.counter_id else list(self.counters)
        for cid in ids:
            found = self.counters.get(cid)
            if found is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"counter id {cid} is not in the P4Info")
            info, arr = found
            size = arr.size
            indexes = [req.index.index] if req.HasField("index") else range(size)
            for idx in indexes:
                if not 0 <= idx < size:
                    raise P4RuntimeError(
                        grpc.StatusCode.OUT_OF_RANGE, f"counter {info.preamble.name}: index {idx} out of range"
                    )
                out = p4r.CounterEntry(counter_id=cid, index=p4r.Index(index=idx))
                out.data.packet_count = arr.packets[idx]
                out.data.byte_count = arr.bytes[idx]
                yield p4r.Entity(counter_entry=out)

    # ---------------------------------------------------------------- direct resources, registers, value sets

    @staticmethod
    def _configure(cell: Meter, c: p4r.MeterConfig, what: str) -> None:
        if c.cir < 0 or c.pir < 0 or c.cburst < 0 or c.pburst < 0:
            raise _invalid("meter config values must be >= 0")
        if c.cir > c.pir:
            raise _invalid(f"meter {what}: cir {c.cir} > pir {c.pir}")
        configure_meter(cell, c.cir, c.cburst, c.pir, c.pburst)

    def _direct_entry(self, b: TableBinding, te: p4r.TableEntry) -> Entry:
        if te.table_id != b.info.preamble.id:
            raise _invalid(f"table_entry.table_id {te.table_id} is not the direct resource's table")
        match, prio = self._match(b, te)
        entry = b.tdef.table.entries.get(b.tdef.table.identity(match, prio))
        if entry is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
        return entry

    def _direct_binding(self, kinds: dict[int, TableBinding], rid: int, te: p4r.TableEntry) -> list[TableBinding]:
        if rid:
            b = kinds.get(rid)
            if b is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"direct resource id {rid} is not in the P4Info")
            return [b]
        if te.table_id:
            return [b for b in kinds.values() if b.info.preamble.id == te.table_id]
        return list(kinds.values())

    def _direct_targets(
        self, kinds: dict[int, TableBinding], req_te: p4r.TableEntry
    ) -> Iterator[tuple[TableBinding, Entry]]:
        bindings = self._direct_binding(kinds, 0, req_te)
        if req_te.table_id and not bindings:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"table id {req_te.table_id} has no such direct resource")
        for b in bindings:
            if req_te.match:
                yield b, self._direct_entry(b, req_te)
            else:
                for entry in list(b.tdef.table.entries.values()):
                    yield b, entry

    def _write_direct_counter(self, kind: int, dc: p4r.DirectCounterEntry) -> None:
        if kind != p4r.Update.MODIFY:
            raise _invalid("direct counter entries can only be modified")
        b = self._binding(dc.table_entry.table_id)
        if b.tdef.direct_counter is None:
            raise _invalid(f"table {b.info.preamble.name} has no direct counter")
        entry = self._direct_entry(b, dc.table_entry)
        entry.packets, entry.bytes = dc.data.packet_count, dc.data.byte_count

    def _write_direct_meter(self, kind: int, dm: p4r.DirectMeterEntry) -> None:
        if kind != p4r.Update.MODIFY:
            raise _invalid("direct meter entries can only be modified")
        b = self._binding(dm.table_entry.table_id)
        if b.tdef.direct_meter is None:
            raise _invalid(f"table {b.info.preamble.name} has no direct meter")
        entry = self._direct_entry(b, dm.table_entry)
        if entry.meter is None:
            entry.meter = Meter()
        if dm.HasField("config"):
            self._configure(entry.meter, dm.config, b.info.preamble.name)
        else:
            entry.meter.reset()

    def _entry_key(self, b: TableBinding, entry: Entry) -> p4r.TableEntry:
        stored = entry.meta.get("entity")
        te = p4r.TableEntry()
        if stored is not None:
            te.table_id, te.priority = stored.table_id, stored.priority
            te.match.extend(stored.match)
        else:
            te.table_id, te.priority = b.info.preamble.id, entry.priority
        return te

    def _read_direct_counters(self, req: p4r.DirectCounterEntry) -> Iterator[p4r.Entity]:
        for b, entry in self._direct_targets(self.direct_counters, req.table_entry):
            out = p4r.DirectCounterEntry(table_entry=self._entry_key(b, entry))
            out.data.packet_count, out.data.byte_count = entry.packets, entry.bytes
            yield p4r.Entity(direct_counter_entry=out)

    def _read_direct_meters(self, req: p4r.DirectMeterEntry) -> Iterator[p4r.Entity]:
        for b, entry in self._direct_targets(self.direct_meters, req.table_entry):
            out = p4r.DirectMeterEntry(table_entry=self._entry_key(b, entry))
            cfg = meter_config(entry.meter) if entry.meter is not None else None
            if cfg is not None:
                out.config.cir, out.config.cburst, out.config.pir, out.config.pburst = cfg
            yield p4r.Entity(direct_meter_entry=out)

    def _register(self, rid: int) -> tuple[p4i.Register, RegisterArray]:
        found = self.registers.get(rid)
        if found is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"register id {rid} is not in the P4Info")
        return found

    def _register_indexes(self, info: p4i.Register, arr: RegisterArray, re: p4r.RegisterEntry) -> list[int]:
        if not re.HasField("index"):
            return list(range(arr.size))
        idx = re.index.index
        if not 0 <= idx < arr.size:
            raise P4RuntimeError(
                grpc.StatusCode.OUT_OF_RANGE, f"register {info.preamble.name}: index {idx} outside 0..{arr.size - 1}"
            )
        return [idx]

    def _write_register(self, kind: int, re: p4r.RegisterEntry) -> None:
        if kind != p4r.Update.MODIFY:
            raise _invalid("register entries can only be modified")
        info, arr = self._register(re.register_id)
        if re.data.WhichOneof("data") != "bitstring":
            raise _invalid(f"register {info.preamble.name}: data must be a bitstring")
        value = decode_bytes(re.data.bitstring, arr.mask.bit_length(), f"register {info.preamble.name}")
        for idx in self._register_indexes(info, arr, re):
            arr.values[idx] = value

    def _read_registers(self, req: p4r.RegisterEntry) -> Iterator[p4r.Entity]:
        ids = [req.register_id] if req.register_id else list(self.registers)
        for rid in ids:
            info, arr = self._register(rid)
            for idx in self._register_indexes(info, arr, req):
                out = p4r.RegisterEntry(register_id=rid, index=p4r.Index(index=idx))
                out.data.bitstring = encode_bytes(arr.values[idx])
                yield p4r.Entity(register_entry=out)

    def _write_value_set(self, kind: int, ve: p4r.ValueSetEntry) -> None:
        # P4Runtime: a value set is written whole with MODIFY; its members replace the old ones.
        if kind != p4r.Update.MODIFY:
            raise _invalid("value set entries can only be modified")
        found = self.value_sets.get(ve.value_set_id)
        if found is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"value set id {ve.value_set_id} is not in the P4Info")
        info, vset = found
        if len(ve.members) > info.size:
            raise P4RuntimeError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"value set {info.preamble.name} holds at most {info.size} members"
            )
        values = [self._vset_value(info, m) for m in ve.members]
        kept = []
        for m in ve.members:
            c = p4r.ValueSetMember()
            c.CopyFrom(m)
            for fm in c.match:
                fm.exact.value = canonical(fm.exact.value)
            kept.append(c)
        vset.values = frozenset(values)
        self.vset_members[ve.value_set_id] = kept

    @staticmethod
    def _vset_value(info: p4i.ValueSet, member: p4r.ValueSetMember) -> int:
        by_id = {fm.field_id: fm for fm in member.match}
        if set(by_id) != {mf.id for mf in info.match} or len(by_id) != len(member.match):
            raise _invalid(f"value set {info.preamble.name}: a member must match every field exactly once")
        value = 0
        for mf in info.match:
            fm = by_id[mf.id]
            if fm.WhichOneof("field_match_type") != "exact":
                raise P4RuntimeError(
                    grpc.StatusCode.UNIMPLEMENTED, f"value set {info.preamble.name}: only exact members are supported"
                )
            value = (value << mf.bitwidth) | decode_bytes(fm.exact.value, mf.bitwidth, f"value set field {mf.name!r}")
        return value

    def _read_value_sets(self, req: p4r.ValueSetEntry) -> Iterator[p4r.Entity]:
        ids = [req.value_set_id] if req.value_set_id else list(self.value_sets)
        for vid in ids:
            if vid not in self.value_sets:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"value set id {vid} is not in the P4Info")
            yield p4r.Entity(value_set_entry=p4r.ValueSetEntry(value_set_id=vid, members=self.vset_members[vid]))

    # ---------------------------------------------------------------- packet replication engine

    def _write_pre(self, kind: int, pre: p4r.PacketReplicationEngineEntry) -> None:
        which = pre.WhichOneof("type")
        if which == "multicast_group_entry":
            g = pre.multicast_group_entry
            if g.multicast_group_id == 0:
                raise _invalid("multicast group id 0 is not valid")
            self._write_replicas(kind, self.program.pre.groups, g.multicast_group_id, g.replicas, "Multicast group")
        elif which == "clone_session_entry":
            cs = pre.clone_session_entry
            # PI's PreCloneMgr: session ids 1..32767; class of service unsupported; this target also
            # refuses truncation (packet_length_bytes), which it does not implement.
            if not 1 <= cs.session_id < 32768:
                raise _invalid("Clone session id out-of-range")
            if cs.class_of_service:
                raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "COS for clone sessions not supported yet")
            if cs.packet_length_bytes:
                raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "clone truncation is not supported by this target")
            self._write_replicas(kind, self.program.pre.clone_sessions, cs.session_id, cs.replicas, "Clone session")
        else:
            raise _invalid("packet replication engine entry has no type")

    @staticmethod
    def _write_replicas(
        kind: int, table: dict[int, list[tuple[int, int]]], key: int, replicas: object, what: str
    ) -> None:
        exists = key in table
        if kind == p4r.Update.INSERT and exists:
            raise P4RuntimeError(grpc.StatusCode.ALREADY_EXISTS, f"{what} already exists")
        if kind in (p4r.Update.MODIFY, p4r.Update.DELETE) and not exists:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"{what} does not exist")
        if kind == p4r.Update.DELETE:
            del table[key]
            return
        if kind not in (p4r.Update.INSERT, p4r.Update.MODIFY):
            raise _invalid(f"update type {kind} is not valid")
        out: list[tuple[int, int]] = []
        for r in replicas:  # type: ignore[attr-defined]
            which = r.WhichOneof("port_kind")
            if which == "egress_port":
                port = r.egress_port
            elif which == "port":
                port = int.from_bytes(r.port, "big")
            else:
                raise _invalid("Missing port in multicast group replica")
            if (port, r.instance) in out:
                raise _invalid("Duplicate replica in multicast group")
            out.append((port, r.instance))
        table[key] = out

    def _read_pre(self, req: p4r.PacketReplicationEngineEntry) -> Iterator[p4r.Entity]:
        pre = self.program.pre
        which = req.WhichOneof("type")
        if which == "multicast_group_entry":
            table, wanted, missing = pre.groups, req.multicast_group_entry.multicast_group_id, "Multicast group"
        elif which == "clone_session_entry":
            table, wanted, missing = pre.clone_sessions, req.clone_session_entry.session_id, "Clone session"
        else:
            raise _invalid("packet replication engine read needs a type")
        for key in [wanted] if wanted else sorted(table):
            if key not in table:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"{missing} does not exist")
            entry = p4r.PacketReplicationEngineEntry()
            if which == "multicast_group_entry":
                msg: p4r.MulticastGroupEntry | p4r.CloneSessionEntry = entry.multicast_group_entry
                msg.multicast_group_id = key
            else:
                msg = entry.clone_session_entry
                msg.session_id = key
            for port, rid in table[key]:
                msg.replicas.add(egress_port=port, instance=rid)
            yield p4r.Entity(packet_replication_engine_entry=entry)


def _wildcard(kind: str, width: int) -> object:
    if kind == "LPM":
        return (0, 0)
    if kind == "TERNARY":
        return (0, 0)
    if kind == "RANGE":
        return (0, (1 << width) - 1)
    return None  # OPTIONAL


def _stored(te: p4r.TableEntry) -> p4r.TableEntry:
    # What a read returns: the entry as written, in canonical byte strings (as simple_switch_grpc
    # answers whether the client padded them or not), without the write-only resource fields.
    kept = p4r.TableEntry()
    kept.CopyFrom(te)
    kept.ClearField("counter_data")
    kept.ClearField("meter_config")
    kept.ClearField("meter_counter_data")
    for fm in kept.match:
        kind = fm.WhichOneof("field_match_type")
        if kind == "exact":
            fm.exact.value = canonical(fm.exact.value)
        elif kind == "lpm":
            fm.lpm.value = canonical(fm.lpm.value)
        elif kind == "ternary":
            fm.ternary.value, fm.ternary.mask = canonical(fm.ternary.value), canonical(fm.ternary.mask)
        elif kind == "range":
            fm.range.low, fm.range.high = canonical(fm.range.low), canonical(fm.range.high)
        elif kind == "optional":
            fm.optional.value = canonical(fm.optional.value)
    for param in kept.action.action.params:
        param.value = canonical(param.value)
    for a in kept.action.action_profile_action_set.action_profile_actions:
        for param in a.action.params:
            param.value = canonical(param.value)
    return kept


def _refuse_watch(member: p4r.ActionProfileGroup.Member | p4r.ActionProfileAction, where: str) -> None:
    # PI deactivates members whose watched port is down; this target has no port status to watch.
    which = member.WhichOneof("watch_kind")
    if which:
        raise P4RuntimeError(
            grpc.StatusCode.UNIMPLEMENTED, f"{where}: {which} (member liveness) is not supported by this target"
        )
