"""TableEntry: match entries of direct and indirect tables, default actions, and the lookups of one
entry that direct counters and direct meters share.

Indirect tables (with an action profile) are here too: their entries point at a member, a group or
a one-shot action set, with PI's and bmv2's reference counting and its failure modes.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from finsy.proto import p4i, p4r

from ..bytestrings import canonical
from ..errors import P4RuntimeError
from ..externs import Meter, meter_config
from ..profiles import NO_ACTION
from ..switch.pipeline import TableDef
from ..tables import Entry
from .action_profile_group import refuse_watch
from .binding import Binding, TableBinding
from .codec import decode_bytes, invalid
from .meter_entry import configure
from .profile_mgr import ONESHOT
from .program_entries import program_entry


def write(b: Binding, kind: int, te: p4r.TableEntry) -> None:
    """Apply one table entry update."""
    tb = b.binding(te.table_id)
    tdef = tb.tdef
    if te.is_default_action:
        if kind != p4r.Update.MODIFY:
            raise invalid("the default entry can only be modified")
        if tb.profile is not None:  # P4Runtime: tables with an action profile have no default action
            raise invalid(f"Cannot set / reset default action for indirect table {tb.info.preamble.id}")
        if te.match:
            raise invalid("a default entry has no match fields")
        if tdef.default_const:
            raise P4RuntimeError(
                grpc.StatusCode.PERMISSION_DENIED, f"table {tb.info.preamble.name} has a const default action"
            )
        action = _action(b, tb, te, default=True) if te.HasField("action") else None
        if tb.absent:  # bmv2 has no such table to set a default on (INVALID_TABLE_NAME), PI says UNKNOWN
            raise P4RuntimeError(grpc.StatusCode.UNKNOWN, "Error when modifying match entry in target")
        # Without an action: reset to the program's default.
        tdef.default_action_id, tdef.default_action_data = action or _json_default(b, tdef)
        return
    if tdef.const_entries or tb.info.is_const_table:
        raise P4RuntimeError(grpc.StatusCode.PERMISSION_DENIED, f"table {tb.info.preamble.name} is const")
    match, prio = match_key(tb, te)
    if tb.profile is not None:
        _write_indirect(b, kind, tb, te, match, prio)
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
                f"table {tb.info.preamble.name} is full ({tdef.table.size} entries)",
            )
        aid, data = _action(b, tb, te, default=False)
        if tb.absent:  # PI checked the entry; bmv2 refuses it (INVALID_TABLE_NAME)
            raise P4RuntimeError(grpc.StatusCode.UNKNOWN, "Error when adding match entry to target")
        entry = Entry(match, aid, data, prio, meta={"entity": _stored(tb, te)})
        _new_entry_resources(tb, entry, te)
        tdef.table.insert(entry)
    elif kind == p4r.Update.MODIFY:
        if existing is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
        aid, data = _action(b, tb, te, default=False)
        # Swap action in place: one assignment of a tuple keeps the packet path consistent.
        existing.action_id, existing.action_data = aid, data
        _modified_entry_resources(tb, existing, te)
    elif kind == p4r.Update.DELETE:
        if existing is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
        tdef.table.remove(match, prio)
    else:
        raise invalid(f"update type {kind} is not valid")


def read(b: Binding, req: p4r.TableEntry) -> Iterator[p4r.Entity]:
    """The table entries (or default entries) a read request matches."""
    if req.table_id:
        bindings = [b.binding(req.table_id)]
    else:
        bindings = list(b.tables.values())
    want_counters = req.HasField("counter_data")
    for tb in bindings:
        if tb.absent and (req.is_default_action or not req.match):
            # bmv2's PI fails every read of a table bmv2 lacks but one by match key, which finds nothing.
            what = "default entry" if req.is_default_action else "table entries"
            raise P4RuntimeError(grpc.StatusCode.UNKNOWN, f"Error when reading {what} from target")
        if req.is_default_action:
            tdef = tb.tdef
            te = p4r.TableEntry(table_id=tb.info.preamble.id, is_default_action=True)
            info_aid = tb.json_to_info_action.get(tdef.default_action_id)
            # An indirect table reads back no default action (bmv2 has no default member set).
            if info_aid is not None and tb.profile is None:
                te.action.action.CopyFrom(b.p4r_action(info_aid, tdef.default_action_data))
            yield p4r.Entity(table_entry=te)
            continue
        match_filter = None
        if req.match:
            match_filter = match_key(tb, req)
        for entry in list(tb.tdef.table.entries.values()):
            if match_filter is not None and (entry.match, entry.priority) != match_filter:
                continue
            if tb.profile is not None and not tb.profile.mgr.names(entry.member, entry.group):
                raise P4RuntimeError(grpc.StatusCode.INTERNAL, "Invalid indirect handle")
            stored = entry.meta.get("entity")
            te = p4r.TableEntry()
            te.CopyFrom(stored if stored is not None else program_entry(b, tb, entry))
            if want_counters and tb.tdef.with_counters:
                te.counter_data.packet_count = entry.packets
                te.counter_data.byte_count = entry.bytes
            if req.HasField("meter_config") and entry.meter is not None:
                cfg = meter_config(entry.meter)
                if cfg is not None:
                    c = te.meter_config
                    c.cir, c.cburst, c.pir, c.pburst = cfg
            yield p4r.Entity(table_entry=te)


def match_key(tb: TableBinding, te: p4r.TableEntry) -> tuple[tuple[object, ...], int]:
    """An entry's match as the table stores it, and its priority, checked as P4Runtime requires."""
    by_id = {fm.field_id: fm for fm in te.match}
    if len(by_id) != len(te.match):
        raise invalid("duplicate field id in match")
    known = {mf.id for mf in tb.match_fields}
    for fid in by_id:
        if fid not in known:
            raise invalid(f"unknown match field id {fid} for table {tb.info.preamble.name}")
    match: list[object] = []
    for mf in tb.match_fields:
        what = f"match field {mf.name!r}"
        fm = by_id.get(mf.id)
        kind = p4i.MatchField.MatchType.Name(mf.match_type)
        width = mf.bitwidth
        if fm is None:
            if kind == "EXACT":
                raise invalid(f"{what}: exact match field is missing")
            match.append(_wildcard(kind, width))
            continue
        got = fm.WhichOneof("field_match_type")
        if got != kind.lower():
            raise invalid(f"{what}: expected {kind.lower()} match, got {got}")
        if kind == "EXACT":
            match.append(decode_bytes(fm.exact.value, width, what))
        elif kind == "LPM":
            value = decode_bytes(fm.lpm.value, width, what)
            plen = fm.lpm.prefix_len
            if not 0 < plen <= width:
                raise invalid(f"{what}: prefix_len {plen} outside 1..{width} (omit the field for a wildcard)")
            if value & ((1 << (width - plen)) - 1):
                raise invalid(f"{what}: value has bits set beyond prefix_len {plen}")
            match.append((value, plen))
        elif kind == "TERNARY":
            value = decode_bytes(fm.ternary.value, width, what)
            mask = decode_bytes(fm.ternary.mask, width, what)
            if mask == 0:
                raise invalid(f"{what}: all-zero mask (omit the field for a wildcard)")
            if value & ~mask:
                raise invalid(f"{what}: value has bits set outside the mask")
            match.append((value, mask))
        elif kind == "RANGE":
            low = decode_bytes(fm.range.low, width, what)
            high = decode_bytes(fm.range.high, width, what)
            if low > high:
                raise invalid(f"{what}: low > high")
            match.append((low, high))
        elif kind == "OPTIONAL":
            # PI's MatchKey::set_optional: bmv2 has no optional match, so a ternary one, mask all ones.
            match.append((decode_bytes(fm.optional.value, width, what), (1 << width) - 1))
        else:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, f"{what}: match kind {kind}")
    needs_priority = tb.tdef.table.needs_priority
    if needs_priority and te.priority <= 0:
        raise invalid(f"table {tb.info.preamble.name}: priority must be > 0 for this table")
    if not needs_priority and te.priority != 0:
        raise invalid(f"table {tb.info.preamble.name}: priority must be 0 for this table")
    return tuple(match), te.priority


def _action(b: Binding, tb: TableBinding, te: p4r.TableEntry, default: bool) -> tuple[int, list[int]]:
    if te.action.WhichOneof("type") != "action":
        raise invalid(f"Cannot provide indirect action for direct table {tb.info.preamble.id}")
    a = te.action.action
    json_id = tb.action_ids.get(a.action_id)
    if json_id is None:
        raise invalid(f"action id {a.action_id} is not an action of table {tb.info.preamble.name}")
    ref = next(r for r in tb.info.action_refs if r.id == a.action_id)
    if default and ref.scope == p4i.ActionRef.Scope.TABLE_ONLY:
        raise invalid(f"action id {a.action_id} may not be a default action")
    if not default and ref.scope == p4i.ActionRef.Scope.DEFAULT_ONLY:
        raise invalid(f"action id {a.action_id} may only be a default action")
    return json_id, b.action_data(a)


def _json_default(b: Binding, tdef: TableDef) -> tuple[int, list[int]]:
    for t in b.program.doc["pipelines"]:
        for jt in t.get("tables", []):
            if jt["name"] == tdef.name:
                d = jt.get("default_entry") or {}
                if "action_id" not in d:  # bmv2's default_default_entry: no action
                    return NO_ACTION, []
                return int(d["action_id"]), [int(x, 16) for x in d.get("action_data", [])]
    return tdef.default_action_id, tdef.default_action_data


def _new_entry_resources(tb: TableBinding, entry: Entry, te: p4r.TableEntry) -> None:
    if te.HasField("counter_data"):
        entry.packets, entry.bytes = te.counter_data.packet_count, te.counter_data.byte_count
    if tb.tdef.direct_meter is not None:
        entry.meter = Meter()
        if te.HasField("meter_config"):
            configure(entry.meter, te.meter_config, tb.info.preamble.name)


def _modified_entry_resources(tb: TableBinding, entry: Entry, te: p4r.TableEntry) -> None:
    entry.meta["entity"] = _stored(tb, te)
    if te.HasField("meter_config") and entry.meter is not None:
        configure(entry.meter, te.meter_config, tb.info.preamble.name)
    if te.HasField("counter_data"):
        entry.packets, entry.bytes = te.counter_data.packet_count, te.counter_data.byte_count


# ---------------------------------------------------------------- indirect tables


def _write_indirect(
    b: Binding, kind: int, tb: TableBinding, te: p4r.TableEntry, match: tuple[object, ...], prio: int
) -> None:
    """An entry of a table with an action profile: it points at a member, a group or a one-shot group."""
    assert tb.profile is not None
    table, mgr = tb.tdef.table, tb.profile.mgr
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
        raise invalid(f"update type {kind} is not valid")
    if not te.HasField("action"):
        raise invalid("'action' field must be set")
    member, group, oneshot = _indirect_target(b, tb, te)
    try:
        if kind == p4r.Update.INSERT:
            entry = Entry(match, -1, [], prio, meta={"oneshot": oneshot}, member=member, group=group)
            _insert_indirect(tb, te, existing, entry)
        else:
            _modify_indirect(tb, te, existing, member, group, oneshot)
    except P4RuntimeError:
        if oneshot:
            mgr.oneshot_delete(group)
        raise


def _insert_indirect(tb: TableBinding, te: p4r.TableEntry, existing: Entry | None, entry: Entry) -> None:
    assert tb.profile is not None
    table = tb.tdef.table
    if existing is not None:
        raise P4RuntimeError(
            grpc.StatusCode.ALREADY_EXISTS, "match entry exists, use MODIFY if you wish to change action"
        )
    if len(table) >= table.size:
        raise P4RuntimeError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"table {tb.info.preamble.name} is full ({table.size} entries)"
        )
    _check_indirect(tb, entry.group, "Error when adding match entry to target")
    entry.meta["entity"] = _stored(tb, te)
    _new_entry_resources(tb, entry, te)
    tb.profile.mgr.profile.ref(entry.member, entry.group)
    table.insert(entry)


def _modify_indirect(
    tb: TableBinding, te: p4r.TableEntry, existing: Entry | None, member: int, group: int, oneshot: bool
) -> None:
    assert tb.profile is not None
    if existing is None:
        raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
    # bmv2's modify_entry drops the old reference before it checks the new target and does not
    # restore it when the check fails: the entry then points at a member or group that may be
    # deleted (its packets keep the stale action; PI fails reading the table, INTERNAL).
    tb.profile.mgr.profile.unref(existing.member, existing.group)
    _check_indirect(tb, group, "Error when modifying match entry in target")
    old_oneshot = existing.group if existing.meta.get("oneshot") else -1
    _repoint(tb, existing, member, group)
    existing.meta["oneshot"] = oneshot
    _modified_entry_resources(tb, existing, te)
    if old_oneshot >= 0:
        tb.profile.mgr.oneshot_delete(old_oneshot)


def _indirect_target(b: Binding, tb: TableBinding, te: p4r.TableEntry) -> tuple[int, int, bool]:
    """(member handle, group handle, one-shot) of an indirect entry's action; a one-shot action set
    gets its group made here, as PI makes it before adding the entry."""
    assert tb.profile is not None
    mgr, which = tb.profile.mgr, te.action.WhichOneof("type")
    if which == "action_profile_member_id":
        return *mgr.handle(te.action.action_profile_member_id, None), False
    if which == "action_profile_group_id":
        return *mgr.handle(None, te.action.action_profile_group_id), False
    if which != "action_profile_action_set":
        raise invalid(f"Cannot provide direct action for indirect table {tb.info.preamble.id}")
    mgr.use(ONESHOT)
    actions = te.action.action_profile_action_set.action_profile_actions
    if not actions:
        raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "No support for empty action profile groups")
    for a in actions:
        refuse_watch(a, "action_profile_action_set")
    converted = [(*b.profile_action(tb.profile, a.action), a.weight) for a in actions]
    return -1, mgr.oneshot_create(converted), True


def _check_indirect(tb: TableBinding, group: int, message: str) -> None:
    # bmv2 refuses a group in a table without a selector (WRONG_TABLE_TYPE) and an empty group
    # (EMPTY_GRP); PI reports either as UNKNOWN.
    assert tb.profile is not None
    if group >= 0 and (not tb.tdef.with_selection or not tb.profile.mgr.profile.groups[group]):
        raise P4RuntimeError(grpc.StatusCode.UNKNOWN, message)


def _repoint(tb: TableBinding, entry: Entry, member: int, group: int) -> None:
    assert tb.profile is not None
    tb.profile.mgr.profile.ref(member, group)  # the old reference is already dropped
    # The packet path reads the group first: set a group before clearing the member, and the other
    # way round, so that it never sees neither.
    if group >= 0:
        entry.group, entry.member = group, member
    else:
        entry.member, entry.group = member, group


# ---------------------------------------------------------------- one entry, for direct resources


def direct_entry(tb: TableBinding, te: p4r.TableEntry) -> Entry:
    """The entry a direct resource's table_entry names (NOT_FOUND if there is none)."""
    if te.table_id != tb.info.preamble.id:
        raise invalid(f"table_entry.table_id {te.table_id} is not the direct resource's table")
    match, prio = match_key(tb, te)
    entry = tb.tdef.table.entries.get(tb.tdef.table.identity(match, prio))
    if entry is None:
        raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
    return entry


def direct_targets(kinds: dict[int, TableBinding], req_te: p4r.TableEntry) -> Iterator[tuple[TableBinding, Entry]]:
    """The (table, entry) pairs a direct resource read names: one entry, a table's, or every table's."""
    if req_te.table_id:
        bindings = [tb for tb in kinds.values() if tb.info.preamble.id == req_te.table_id]
    else:
        bindings = list(kinds.values())
    if req_te.table_id and not bindings:
        raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"table id {req_te.table_id} has no such direct resource")
    for tb in bindings:
        if req_te.match:
            yield tb, direct_entry(tb, req_te)
        else:
            for entry in list(tb.tdef.table.entries.values()):
                yield tb, entry


def entry_key(tb: TableBinding, entry: Entry) -> p4r.TableEntry:
    """The table_entry that names `entry` in a direct resource read."""
    stored = entry.meta.get("entity")
    te = p4r.TableEntry()
    if stored is not None:
        te.table_id, te.priority = stored.table_id, stored.priority
        te.match.extend(stored.match)
    else:
        te.table_id, te.priority = tb.info.preamble.id, entry.priority
    return te


def _wildcard(kind: str, width: int) -> object:
    if kind == "RANGE":
        return (0, (1 << width) - 1)
    return (0, 0)  # LPM: prefix 0; TERNARY and OPTIONAL (a ternary match to bmv2): mask 0


def _stored(tb: TableBinding, te: p4r.TableEntry) -> p4r.TableEntry:
    # What a read returns: the entry as written, in canonical byte strings (as simple_switch_grpc
    # answers whether the client padded them or not), without the write-only resource fields, its
    # match fields in P4Info order (PI's parse_match_key writes them so, whatever order they came in).
    kept = p4r.TableEntry()
    kept.CopyFrom(te)
    kept.ClearField("counter_data")
    kept.ClearField("meter_config")
    kept.ClearField("meter_counter_data")
    order = {mf.id: i for i, mf in enumerate(tb.match_fields)}
    fields = sorted(te.match, key=lambda fm: order[fm.field_id])
    del kept.match[:]
    kept.match.extend(fields)  # copies te's fields
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
