"""What limiter.p4 must hold for a DPU, expressed as P4Runtime entities (finsy), and how to diff it.

This module knows the names inside limiter.p4; nothing above it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import finsy as fy
from finsy.proto import p4r

from .models import Cap, Dpu, InvalidArgument, Pod
from .units import MAX_FRAME_BYTES, MAX_PI_BURST, MeterParams, cap_meter

TABLE_BOUNDARY = "LimiterIngress.boundary"
ACTION_CROSS = "LimiterIngress.cross"
TABLE_SRC_IN_POD = "LimiterIngress.src_in_pod"
TABLE_DST_IN_POD = "LimiterIngress.dst_in_pod"
FIELD_SRC = "hdr.ipv4.srcAddr"
FIELD_DST = "hdr.ipv4.dstAddr"
FIELD_INGRESS_PORT = "standard_metadata.ingress_port"
ACTION_NO_ACTION = "NoAction"
METER = "LimiterIngress.boundary_meter"
TABLE_WINDOW = "LimiterIngress.window_cfg"
ACTION_WINDOW = "LimiterIngress.window"
FIELD_CELL = "meta.cell"
WINDOW_SLOTS = 15  # the window is covered by the current slot and the 15 before it (limiter.p4)
CLASS_COUNTER = "LimiterIngress.class_counter"
COLOR_COUNTER = "LimiterIngress.color_counter"

# A DPU limits one subject (its pod, or its node): cell 0 is egress, cell 1 ingress.
CELLS = {"egress": 0, "ingress": 1}
CLASSES = {"intra": 0, "arp": 1, "ipv4": 2, "fragment": 3, "other": 4, "spoofed": 5}
COLORS = {"green": 0, "yellow": 1, "red": 2, "window": 3, "lease": 4}  # colour-counter codes, cell * 8 + code
TABLE_LEASE = "LimiterIngress.lease_cfg"
ACTION_LEASE = "LimiterIngress.lease"
MAX_LEASE_GEN = (1 << 32) - 1

# Unset cap: the meter still runs, at zero: only exempt traffic crosses (fail closed).
FLOOR = MeterParams(cir=0, cburst=0, pir=0, pburst=0)
# Window mode: the budget does the limiting; the meter only stops what no link could carry anyway.
OPEN_METER = MeterParams(cir=10**12, cburst=MAX_PI_BURST, pir=10**12, pburst=MAX_PI_BURST)


def window_params(rate_bps: float, window_s: float) -> tuple[int, int]:
    """(budget bytes, slot multiplier) for limiter.p4's window mode.

    The budget is rate x window, whole bytes, rounded down. A slot is (timestamp_us >> 10) * mult >> 32;
    mult is rounded down so that 15 slots always cover the window, even with the 1.024 ms quantum.
    """
    budget = int(rate_bps / 8 * window_s)
    units = window_s * 1e6 / 1024 + 1  # the window in 1.024 ms units, plus one for quantization
    return budget, int((1 << 32) * WINDOW_SLOTS / units)


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
    windows: dict[int, tuple[int, int]]  # cell -> (budget bytes, slot multiplier), window mode only
    prefixes: tuple[str, ...]
    boundary: tuple[tuple[int, int, int, int], ...]  # (ingress_port, egress_port, cell, inside)
    lease: tuple[int, int] | None = None  # (generation, lifetime in microseconds); None: no lease, the floor


def allowances(dpu: Dpu, cap: Cap) -> dict[str, int]:
    """Bytes beyond the rate that `dpu` may pass per direction: its bucket, or in window mode its budget.

    Both are the cap's figure less the DPU's buffer after its meter (never below 0: fail closed), so
    that what leaves the DPU's queues in any window stays within the cap's allowance.
    """
    if cap.mode == "window":
        figures = {d: window_params(getattr(cap, f"{d}_bps"), cap.window_s)[0] for d in CELLS}
    else:
        figures = dict.fromkeys(CELLS, cap.burst_bytes)
    return {d: max(0, b - dpu.buffer_bytes) for d, b in figures.items()}


def check_fits(dpu: Dpu, cap: Cap, what: str, blame_dpu: bool = False) -> None:
    """Raise InvalidArgument when `dpu`'s buffer leaves less than one frame of `cap` (`what` names it).

    The error names the DPU's buffer when `blame_dpu` (the DPU is what is being added), else the cap.
    """
    smallest = min(allowances(dpu, cap).values())
    if smallest < MAX_FRAME_BYTES:
        value: float
        if blame_dpu:
            field, value = "dpu.buffer_bytes", dpu.buffer_bytes
        elif cap.mode == "window":
            field, value = "cap.window_s", cap.window_s
        else:
            field, value = "cap.burst_bytes", cap.burst_bytes
        raise InvalidArgument(
            field,
            value,
            f"{what} on DPU {dpu.name!r}, less its buffer of {dpu.buffer_bytes} bytes after the meter, "
            f"leaves {smallest} bytes, less than one {MAX_FRAME_BYTES}-byte frame",
        )


def intent_for(dpu: Dpu, pod: Pod | None, cap: Cap | None, lease: tuple[int, int] | None = None) -> Intent:
    """Desired data-plane state of `dpu` given its pod, the pod's cap (if any) and its lease (if any)."""
    windows: dict[int, tuple[int, int]] = {}
    if cap is None:
        meters = {CELLS["egress"]: FLOOR, CELLS["ingress"]: FLOOR}
    elif cap.mode == "window":
        meters = {CELLS["egress"]: OPEN_METER, CELLS["ingress"]: OPEN_METER}
        budgets = allowances(dpu, cap)
        windows = {
            cell: (budgets[d], window_params(getattr(cap, f"{d}_bps"), cap.window_s)[1]) for d, cell in CELLS.items()
        }
    else:
        bursts = allowances(dpu, cap)
        meters = {cell: cap_meter(getattr(cap, f"{d}_bps"), bursts[d], f"cap.{d}_bps") for d, cell in CELLS.items()}
    # From the host side, IPv4 must carry the pod's own sources (limiter.p4 drops the rest as spoofed).
    boundary = (
        (dpu.host_port, dpu.uplink_port, CELLS["egress"], 1),
        (dpu.uplink_port, dpu.host_port, CELLS["ingress"], 0),
    )
    return Intent(
        meters=meters,
        windows=windows,
        prefixes=pod.ipv4_prefixes if pod else (),
        boundary=boundary,
        lease=lease if cap is not None else None,
    )


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


def window_entities(intent: Intent) -> list[fy.P4TableEntry]:
    """Window-mode budgets per cell."""
    return [
        fy.P4TableEntry(
            TABLE_WINDOW,
            match=fy.P4TableMatch({FIELD_CELL: cell}),
            action=fy.P4TableAction(ACTION_WINDOW, budget=budget, mult=mult),
        )
        for cell, (budget, mult) in sorted(intent.windows.items())
    ]


def lease_entity(intent: Intent) -> fy.P4TableEntry:
    """lease_cfg's default action: the lease, or NoAction (none: metered traffic is dropped)."""
    if intent.lease is None:
        action = fy.P4TableAction(ACTION_NO_ACTION)
    else:
        gen, lifetime_us = intent.lease
        action = fy.P4TableAction(ACTION_LEASE, gen=gen, lifetime=lifetime_us)
    return fy.P4TableEntry(TABLE_LEASE, action=action, is_default_action=True)


def boundary_entities(intent: Intent) -> list[fy.P4TableEntry]:
    """Port-to-port crossings, each with its cell."""
    return [
        fy.P4TableEntry(
            TABLE_BOUNDARY,
            match=fy.P4TableMatch({FIELD_INGRESS_PORT: in_port}),
            action=fy.P4TableAction(ACTION_CROSS, port=out_port, cell=cell, inside=inside),
        )
        for in_port, out_port, cell, inside in intent.boundary
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
    set_windows: list[fy.P4TableEntry]  # inserts, then modifies (before the meters open up)
    modify_windows: list[fy.P4TableEntry]
    meters: list[fy.P4MeterEntry]
    lease: list[fy.P4TableEntry]  # lease_cfg's default action, when it differs (renewal or revocation)
    insert_exemptions: list[fy.P4TableEntry]
    insert_boundary: list[fy.P4TableEntry]
    modify_boundary: list[fy.P4TableEntry]
    delete_boundary: list[fy.P4TableEntry]
    delete_windows: list[fy.P4TableEntry]  # after the meters have tightened

    def describe(self) -> str:
        """What the plan restores, for drift reports."""
        parts = [
            f"{len(v)} {k}"
            for k, v in (
                ("stale exemptions removed", self.delete_exemptions),
                ("meter cells rewritten", self.meters),
                ("leases written", self.lease),
                ("exemptions restored", self.insert_exemptions),
                ("crossings restored", self.insert_boundary),
                ("crossings corrected", self.modify_boundary),
                ("stale crossings removed", self.delete_boundary),
                ("window budgets set", self.set_windows),
                ("window budgets corrected", self.modify_windows),
                ("window budgets removed", self.delete_windows),
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
                self.lease,
                self.insert_exemptions,
                self.insert_boundary,
                self.modify_boundary,
                self.delete_boundary,
                self.set_windows,
                self.modify_windows,
                self.delete_windows,
            )
        )


def plan(
    intent: Intent,
    current: list[fy.P4TableEntry],
    meters: list[fy.P4MeterEntry],
    schema: fy.P4Schema,
) -> Plan:
    """Diff the intent against the entries read back from the DPU.

    Order (tighten before loosen): drop stale exemptions, set window budgets, set meters, the
    lease, add exemptions, then boundary entries (which let traffic cross), and only then remove
    stale crossings and stale window budgets (the meters have tightened by then).
    """

    def keyed(entries: list[fy.P4TableEntry]) -> dict[bytes, tuple[fy.P4TableEntry, p4r.TableEntry]]:
        out = {}
        for e in entries:
            pb_entry = e.encode(schema).table_entry
            out[entry_key(pb_entry)] = (e, pb_entry)
        return out

    lease = lease_entity(intent)
    # Read back, finsy names tables by alias: compare encoded entries, by table id.
    lease_id = schema.tables[TABLE_LEASE].id
    held_lease = [
        te for te in (e.encode(schema).table_entry for e in current if e.is_default_action) if te.table_id == lease_id
    ]
    lease_ok = bool(held_lease) and held_lease[0].action == lease.encode(schema).table_entry.action
    current = [e for e in current if not e.is_default_action]
    have = keyed(current)
    want = {
        TABLE_SRC_IN_POD: keyed(prefix_entities(intent)),
        TABLE_BOUNDARY: keyed(boundary_entities(intent)),
        TABLE_WINDOW: keyed(window_entities(intent)),
    }
    want[TABLE_DST_IN_POD] = {}  # prefix_entities covers both exemption tables: keyed by table id inside the key
    table_of = {schema.tables[name].id: name for name in want}
    wanted = {k for entries in want.values() for k in entries}

    def inserts(table: str) -> list[fy.P4TableEntry]:
        return [e for k, (e, _) in want[table].items() if k not in have]

    def modifies(table: str) -> list[fy.P4TableEntry]:
        return [e for k, (e, pbe) in want[table].items() if k in have and have[k][1].action != pbe.action]

    def stale(*tables: str) -> list[fy.P4TableEntry]:
        return [e for k, (e, pbe) in have.items() if k not in wanted and table_of.get(pbe.table_id) in tables]

    return Plan(
        delete_exemptions=stale(TABLE_SRC_IN_POD, TABLE_DST_IN_POD),
        set_windows=inserts(TABLE_WINDOW),
        modify_windows=modifies(TABLE_WINDOW),
        meters=meter_mismatches(intent, meters),
        lease=[] if lease_ok else [lease],
        insert_exemptions=inserts(TABLE_SRC_IN_POD),
        insert_boundary=inserts(TABLE_BOUNDARY),
        modify_boundary=modifies(TABLE_BOUNDARY),
        delete_boundary=stale(TABLE_BOUNDARY),
        delete_windows=stale(TABLE_WINDOW),
    )


def managed_tables() -> list[fy.P4TableEntry]:
    """Wildcard reads of every table the control plane manages."""
    return [
        fy.P4TableEntry(TABLE_BOUNDARY),
        fy.P4TableEntry(TABLE_SRC_IN_POD),
        fy.P4TableEntry(TABLE_DST_IN_POD),
        fy.P4TableEntry(TABLE_WINDOW),
        fy.P4TableEntry(TABLE_LEASE, is_default_action=True),
    ]


def usage_reads() -> list[fy.P4CounterEntry]:
    """The counter cells that make up a DPU's usage."""
    reads = []
    for cell in CELLS.values():
        reads += [fy.P4CounterEntry(CLASS_COUNTER, index=cell * 8 + c) for c in CLASSES.values()]
        reads += [fy.P4CounterEntry(COLOR_COUNTER, index=cell * 8 + c) for c in COLORS.values()]
    return reads
