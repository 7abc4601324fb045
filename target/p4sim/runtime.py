"""P4Runtime entities on a compiled program: P4Info-to-JSON binding, writes and reads.

Semantics follow the P4Runtime specification as simple_switch_grpc's server answers it:
canonical or zero-padded byte strings, value-in-range checks, LPM/ternary masks with no
stray bits, priority required exactly for TCAM-like tables, duplicate INSERT -> ALREADY_EXISTS,
MODIFY/DELETE of a missing entry -> NOT_FOUND, const tables and const default actions refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from finsy.proto import p4i, p4r

from .errors import ProgramError
from .externs import CounterArray
from .program import Program, TableDef
from .tables import Entry


class P4RuntimeError(Exception):
    """A P4Runtime request error carrying its gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
class TableBinding:
    """A P4Info table bound to its compiled table."""

    info: p4i.Table
    tdef: TableDef
    action_ids: dict[int, int]  # P4Info action id -> JSON action id
    json_to_info_action: dict[int, int]
    match_fields: list[p4i.MatchField]


class Pipeline:
    """A compiled program plus the P4Info that names its objects for P4Runtime."""

    def __init__(self, program: Program, p4info: p4i.P4Info, cookie: int, device_config: bytes) -> None:
        self.program = program
        self.p4info = p4info
        self.cookie = cookie
        self.device_config = device_config
        self.tables: dict[int, TableBinding] = {}
        self.counters: dict[int, tuple[p4i.Counter, CounterArray]] = {}
        self.meters: dict[int, p4i.Meter] = {}
        self.action_info: dict[int, p4i.Action] = {a.preamble.id: a for a in p4info.actions}
        self._bind()

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
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "action profiles are not supported by this target")
        a = te.action.action
        json_id = b.action_ids.get(a.action_id)
        if json_id is None:
            raise _invalid(f"action id {a.action_id} is not an action of table {b.info.preamble.name}")
        ref = next(r for r in b.info.action_refs if r.id == a.action_id)
        if default and ref.scope == p4i.ActionRef.Scope.TABLE_ONLY:
            raise _invalid(f"action id {a.action_id} may not be a default action")
        if not default and ref.scope == p4i.ActionRef.Scope.DEFAULT_ONLY:
            raise _invalid(f"action id {a.action_id} may only be a default action")
        ainfo = self.action_info[a.action_id]
        given = {p.param_id: p.value for p in a.params}
        if len(given) != len(a.params) or set(given) != {p.id for p in ainfo.params}:
            raise _invalid(f"action {ainfo.preamble.name}: parameters must be exactly {[p.name for p in ainfo.params]}")
        data = [
            decode_bytes(given[p.id], p.bitwidth, f"action {ainfo.preamble.name} param {p.name!r}")
            for p in ainfo.params
        ]
        return json_id, data

    def _write_table(self, kind: int, te: p4r.TableEntry) -> None:
        b = self._binding(te.table_id)
        tdef = b.tdef
        if te.is_default_action:
            if kind != p4r.Update.MODIFY:
                raise _invalid("the default entry can only be modified")
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
            if te.HasField("counter_data"):
                entry.packets, entry.bytes = te.counter_data.packet_count, te.counter_data.byte_count
            tdef.table.insert(entry)
        elif kind == p4r.Update.MODIFY:
            if existing is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
            aid, data = self._action(b, te, default=False)
            # Swap action in place: one assignment of a tuple keeps the packet path consistent.
            existing.action_id, existing.action_data = aid, data
            existing.meta["entity"] = _stored(te)
            if te.HasField("counter_data"):
                existing.packets, existing.bytes = te.counter_data.packet_count, te.counter_data.byte_count
        elif kind == p4r.Update.DELETE:
            if existing is None:
                raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, "cannot find match entry")
            tdef.table.remove(match, prio)
        else:
            raise _invalid(f"update type {kind} is not valid")

    def _json_default(self, tdef: TableDef) -> tuple[int, list[int]]:
        for t in self.program.doc["pipelines"]:
            for jt in t.get("tables", []):
                if jt["name"] == tdef.name:
                    d = jt.get("default_entry") or {}
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
                if info_aid is not None:
                    te.action.action.action_id = info_aid
                    for p, v in zip(self.action_info[info_aid].params, tdef.default_action_data, strict=False):
                        te.action.action.params.add(param_id=p.id, value=encode_bytes(v))
                yield p4r.Entity(table_entry=te)
                continue
            match_filter = None
            if req.match:
                match_filter = self._match(b, req)
            for entry in list(b.tdef.table.entries.values()):
                if match_filter is not None and (entry.match, entry.priority) != match_filter:
                    continue
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


def _wildcard(kind: str, width: int) -> object:
    if kind == "LPM":
        return (0, 0)
    if kind == "TERNARY":
        return (0, 0)
    if kind == "RANGE":
        return (0, (1 << width) - 1)
    return None  # OPTIONAL


def canonical(data: bytes) -> bytes:
    """P4Runtime's canonical byte string: no leading zero bytes (at least one byte)."""
    return data.lstrip(b"\0") or b"\0"


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
    return kept
