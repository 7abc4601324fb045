"""What limiter.p4 must hold for a DPU, expressed as P4Runtime entities (finsy), and how to diff it.

This module knows the names inside limiter.p4; nothing above it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import finsy as fy
from finsy.proto import p4r

from .models import Cap, Dpu, Pod
from .units import MeterParams, cap_meter

TABLE_BOUNDARY = "LimiterIngress.boundary"
ACTION_CROSS = "LimiterIngress.cross"
TABLE_SRC_IN_POD = "LimiterIngress.src_in_pod"
TABLE_DST_IN_POD = "LimiterIngress.dst_in_pod"
FIELD_SRC = "hdr.ipv4.srcAddr"
FIELD_DST = "hdr.ipv4.dstAddr"
FIELD_INGRESS_PORT = "standard_metadata.ingress_port"
ACTION_NO_ACTION = "NoAction"
METER = "LimiterIngress.boundary_meter"
CLASS_COUNTER = "LimiterIngress.class_counter"
COLOR_COUNTER = "LimiterIngress.color_counter"

# A DPU limits one subject (its pod, or its node): cell 0 is egress, cell 1 ingress.
CELLS = {"egress": 0, "ingress": 1}
CLASSES = {"intra": 0, "arp": 1, "ipv4": 2, "fragment": 3, "other": 4}
COLORS = {"green": 0, "yellow": 1, "red": 2}

# Unset cap: the meter still runs, at zero: only exempt traffic crosses (fail closed).
FLOOR = MeterParams(cir=0, cburst=0, pir=0, pburst=0)


@dataclass(frozen=True)
class ProgramFiles:
    """The compiled limiter.p4: P4Info (text) and bmv2 JSON."""

    p4info: Path
    bmv2_json: Path


def limiter_program() -> ProgramFiles:
    """The compiled limiter.p4 shipped in the package."""
    base = Path(__file__).resolve().parent / "p4"
    return ProgramFiles(base / "limiter.p4info.txtpb", base / "limiter.json")


@dataclass(frozen=True)
class Intent:
    """What one DPU must hold: meter configs per cell, exemption prefixes and boundary entries."""

    meters: dict[int, MeterParams]
    prefixes: tuple[str, ...]
    boundary: tuple[tuple[int, int, int], ...]  # (ingress_port, egress_port, cell)


def intent_for(dpu: Dpu, pod: Pod | None, cap: Cap | None) -> Intent:
    """Desired data-plane state of `dpu` given its pod and the pod's cap (if any)."""
    if cap is None:
        meters = {CELLS["egress"]: FLOOR, CELLS["ingress"]: FLOOR}
    else:
        meters = {
            CELLS["egress"]: cap_meter(cap.egress_bps, cap.burst_bytes, "cap.egress_bps"),
            CELLS["ingress"]: cap_meter(cap.ingress_bps, cap.burst_bytes, "cap.ingress_bps"),
        }
    boundary = (
        (dpu.host_port, dpu.uplink_port, CELLS["egress"]),
        (dpu.uplink_port, dpu.host_port, CELLS["ingress"]),
    )
    return Intent(meters=meters, prefixes=pod.ipv4_prefixes if pod else (), boundary=boundary)


def meter_reads(intent: Intent) -> list[fy.P4MeterEntry]:
    """Reads of the intent's meter cells."""
    return [fy.P4MeterEntry(METER, index=cell) for cell in sorted(intent.meters)]


def meter_params(entry: fy.P4MeterEntry) -> MeterParams | None:
    """A read-back meter cell's configuration (None when unconfigured)."""
    c = entry.config
    return None if c is None else MeterParams(c.cir, c.cburst, c.pir, c.pburst)


def meter_mismatches(intent: Intent, current: list[fy.P4MeterEntry]) -> list[fy.P4MeterEntry]:
    """Meter configurations to write: only cells that differ.

    Rewriting an unchanged meter is not harmless: bmv2 refills the bucket on every write, so a
    periodic rewrite would hand out an extra burst each time.
    """
    have = {e.index or 0: meter_params(e) for e in current}
    return [
        fy.P4MeterEntry(
            METER, index=cell, config=fy.P4MeterConfig(cir=m.cir, cburst=m.cburst, pir=m.pir, pburst=m.pburst)
        )
        for cell, m in sorted(intent.meters.items())
        if have.get(cell) != m
    ]


def prefix_entities(intent: Intent) -> list[fy.P4TableEntry]:
    """Exemption entries: a packet is intra-pod when both lookups hit."""
    out = []
    for prefix in intent.prefixes:
        out.append(
            fy.P4TableEntry(
                TABLE_SRC_IN_POD, match=fy.P4TableMatch({FIELD_SRC: prefix}), action=fy.P4TableAction(ACTION_NO_ACTION)
            )
        )
        out.append(
            fy.P4TableEntry(
                TABLE_DST_IN_POD, match=fy.P4TableMatch({FIELD_DST: prefix}), action=fy.P4TableAction(ACTION_NO_ACTION)
            )
        )
    return out


def boundary_entities(intent: Intent) -> list[fy.P4TableEntry]:
    """Port-to-port crossings, each with its cell."""
    return [
        fy.P4TableEntry(
            TABLE_BOUNDARY,
            match=fy.P4TableMatch({FIELD_INGRESS_PORT: in_port}),
            action=fy.P4TableAction(ACTION_CROSS, port=out_port, cell=cell),
        )
        for in_port, out_port, cell in intent.boundary
    ]


def entry_key(te: p4r.TableEntry) -> bytes:
    """Identity of an encoded table entry: table, match and priority."""
    key = p4r.TableEntry(table_id=te.table_id, priority=te.priority)
    key.match.extend(sorted(te.match, key=lambda m: m.field_id))
    return key.SerializeToString(deterministic=True)


@dataclass
class Plan:
    """Updates that move a DPU from what it holds to the intent, in a safe order."""

    delete_exemptions: list[fy.P4TableEntry]
    meters: list[fy.P4MeterEntry]
    insert_exemptions: list[fy.P4TableEntry]
    insert_boundary: list[fy.P4TableEntry]
    modify_boundary: list[fy.P4TableEntry]
    delete_boundary: list[fy.P4TableEntry]

    def describe(self) -> str:
        """What the plan restores, for drift reports."""
        parts = [
            f"{len(v)} {k}"
            for k, v in (
                ("stale exemptions removed", self.delete_exemptions),
                ("meter cells rewritten", self.meters),
                ("exemptions restored", self.insert_exemptions),
                ("crossings restored", self.insert_boundary),
                ("crossings corrected", self.modify_boundary),
                ("stale crossings removed", self.delete_boundary),
            )
            if v
        ]
        return ", ".join(parts) or "nothing"

    @property
    def changes(self) -> int:
        """How many updates the plan makes."""
        return sum(
            len(x)
            for x in (
                self.delete_exemptions,
                self.meters,
                self.insert_exemptions,
                self.insert_boundary,
                self.modify_boundary,
                self.delete_boundary,
            )
        )


def plan(
    intent: Intent,
    current: list[fy.P4TableEntry],
    meters: list[fy.P4MeterEntry],
    schema: fy.P4Schema,
) -> Plan:
    """Diff the intent against the entries read back from the DPU.

    Order (tighten before loosen): drop stale exemptions, set meters, add exemptions,
    then boundary entries (which let traffic cross), and only then remove stale crossings.
    """
    have = {entry_key(e.encode(schema).table_entry): e for e in current}
    have_action = {
        k: e.encode(schema).table_entry.action.SerializeToString(deterministic=True) for k, e in have.items()
    }
    want_ex = {entry_key(e.encode(schema).table_entry): e for e in prefix_entities(intent)}
    want_bd = {entry_key(e.encode(schema).table_entry): e for e in boundary_entities(intent)}
    boundary_id = schema.tables[TABLE_BOUNDARY].id
    stale = [(k, e) for k, e in have.items() if k not in want_ex and k not in want_bd]
    return Plan(
        delete_exemptions=[e for _, e in stale if e.encode(schema).table_entry.table_id != boundary_id],
        meters=meter_mismatches(intent, meters),
        insert_exemptions=[e for k, e in want_ex.items() if k not in have],
        insert_boundary=[e for k, e in want_bd.items() if k not in have],
        modify_boundary=[
            e
            for k, e in want_bd.items()
            if k in have and have_action[k] != e.encode(schema).table_entry.action.SerializeToString(deterministic=True)
        ],
        delete_boundary=[e for _, e in stale if e.encode(schema).table_entry.table_id == boundary_id],
    )


def managed_tables() -> list[fy.P4TableEntry]:
    """Wildcard reads of every table the control plane manages."""
    return [fy.P4TableEntry(TABLE_BOUNDARY), fy.P4TableEntry(TABLE_SRC_IN_POD), fy.P4TableEntry(TABLE_DST_IN_POD)]


def usage_reads() -> list[fy.P4CounterEntry]:
    """The counter cells that make up a DPU's usage."""
    reads = []
    for cell in CELLS.values():
        reads += [fy.P4CounterEntry(CLASS_COUNTER, index=cell * 8 + c) for c in CLASSES.values()]
        reads += [fy.P4CounterEntry(COLOR_COUNTER, index=cell * 4 + c) for c in COLORS.values()]
    return reads
