"""What limiter.p4 must hold for a DPU, expressed as P4Runtime entities (finsy), and how to diff it.

This module knows the names inside limiter.p4; nothing above it does. It is a little over 600 lines on
purpose: the intent, its encoding into entities and the diff against a read-back are one contract with
the program's tables, and split they would each need the others' names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import finsy as fy
from finsy.proto import p4r

from .models import Cap, Dpu, InvalidArgument, Pod, Role
from .units import ARP_BURST_BYTES, ARP_RATE_BPS, MAX_FRAME_BYTES, MAX_PI_BURST, MeterParams, cap_meter

TABLE_BOUNDARY = "LimiterIngress.boundary"
ACTION_CROSS = "LimiterIngress.cross"
TABLE_SRC_IN_POD = "LimiterIngress.src_in_pod"
TABLE_DST_IN_POD = "LimiterIngress.dst_in_pod"
FIELD_SRC = "hdr.ipv4.srcAddr"
FIELD_DST = "hdr.ipv4.dstAddr"
FIELD_INGRESS_PORT = "standard_metadata.ingress_port"
TABLE_PEERS = "LimiterIngress.pod_peers"
FIELD_PEER_MAC = "meta.peer_mac"
TABLE_SEALING = "LimiterIngress.sealing"
ACTION_SEAL_VIA = "LimiterIngress.seal_via"
ACTION_OPENED = "LimiterIngress.opened"
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
ARP_CELLS = 256  # boundary_meter cell ARP_CELLS + c is the ARP meter of cell c (limiter.p4)
METER_CELLS = (*CELLS.values(), *(ARP_CELLS + c for c in CELLS.values()))
CLASSES = {"intra": 0, "arp": 1, "ipv4": 2, "fragment": 3, "other": 4, "spoofed": 5}
# Colour-counter codes, cell * 8 + code; arp_red: ARP over its own allowance.
COLORS = {"green": 0, "yellow": 1, "red": 2, "window": 3, "lease": 4, "arp_red": 5}
TABLE_LEASE = "LimiterIngress.lease_cfg"
ACTION_LEASE = "LimiterIngress.lease"
MAX_LEASE_GEN = (1 << 32) - 1
MAX_DEADLINE_US = (1 << 48) - 1  # lease deadlines are 48-bit microseconds on the DPU's clock
# The clock echo (limiter.p4): a PacketOut with a nonce comes back as a PacketIn with the nonce and
# the DPU's time. The target's CPU port must be units.CPU_PORT; no wire port may be.
ECHO_NONCE = "nonce"
ECHO_NOW = "now"
# The echo also arms the DPU's lease epoch (written only where it found none) and says what it found
# and when, on the DPU's clock, it was armed.
ECHO_ARM = "arm"
ECHO_EPOCH = "epoch"
ECHO_ARMED_AT = "armed_at"

# Unset cap: the meter still runs, at zero: only exempt traffic crosses (fail closed).
FLOOR = MeterParams(cir=0, cburst=0, pir=0, pburst=0)
# Neighbour discovery's own meter: what a DPU passes of well-formed minimum-size ARP. It is carved
# out of the DPU's share (the data meter or budget gets the rest), so that the two together never
# pass more than the share; with no share (the floor) it is at zero too.
ARP_METER = cap_meter(ARP_RATE_BPS, ARP_BURST_BYTES, "arp")
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
class Lease:
    """A lease: its generation, when it ends on the control plane's clock (seconds), and, once an
    agent has read its DPU's clock, that same instant as a deadline on the DPU's clock (us)."""

    gen: int
    expires_at: float
    deadline_us: int | None = None
    # The lease epoch of the DPU's pipeline instance it is granted under (limiter.p4, Epoch): it passes
    # traffic only while the DPU's lease_epoch register holds it, which a restart or reload clears.
    epoch: int = 0


@dataclass(frozen=True)
class Intent:
    """What one DPU must hold: meter configs per cell, exemption prefixes and boundary entries."""

    meters: dict[int, MeterParams]
    windows: dict[int, tuple[int, int]]  # cell -> (budget bytes, slot multiplier), window mode only
    prefixes: tuple[str, ...]
    boundary: tuple[tuple[int, int, int, int], ...]  # (ingress_port, egress_port, cell, inside)
    lease: Lease | None = None  # None: no lease, the floor
    peers: tuple[str, ...] = ()  # MACs of the pod's other nodes (node DPUs only): who is intra-pod
    # A node DPU's crypto engine: (ingress port, seal port, node MAC) on its host port, (seal port, None,
    # node MAC) on the seal port itself; empty without one (nothing is exempt then).
    sealing: tuple[tuple[int, int | None, str], ...] = ()


def arp_allowance(cap: Cap, direction: str) -> tuple[float, int]:
    """(rate bit/s, burst bytes) of the ARP meter under `cap`: ARP's fixed allowance, or all of a
    share too small to hold it (the data meter then gets nothing)."""
    return min(ARP_RATE_BPS, getattr(cap, f"{direction}_bps")), min(ARP_BURST_BYTES, cap.burst_bytes)


def allowances(dpu: Dpu, cap: Cap) -> dict[str, int]:
    """Bytes beyond the rate that `dpu` may pass per direction: its bucket, or in window mode its budget.

    Both are the cap's figure less the DPU's buffer after its meter and less ARP's share of it
    (its burst; in window mode all it may pass in a window), never below 0: fail closed, so that
    what leaves the DPU's queues in any window stays within the cap's allowance.
    """
    out = {}
    for d in CELLS:
        arp_bps, arp_burst = arp_allowance(cap, d)
        if cap.mode == "window":
            figure = window_params(getattr(cap, f"{d}_bps"), cap.window_s)[0] - int(arp_bps / 8 * cap.window_s)
        else:
            figure = cap.burst_bytes
        out[d] = max(0, figure - arp_burst - dpu.buffer_bytes)
    return out


def check_fits(dpu: Dpu, cap: Cap, what: str, dpu_field: str | None = None, cap_field: str = "cap") -> None:
    """Raise InvalidArgument when `dpu`'s buffer leaves less than one frame of `cap` (`what` names it).

    The error names the DPU's buffer (under `dpu_field`) when given (the DPU is what is being
    written), else the cap's burst or window (under `cap_field`).
    """
    smallest = min(allowances(dpu, cap).values())
    if smallest < MAX_FRAME_BYTES:
        value: float
        if dpu_field is not None:
            field, value = f"{dpu_field}.buffer_bytes", dpu.buffer_bytes
        elif cap.mode == "window":
            field, value = f"{cap_field}.window_s", cap.window_s
        else:
            field, value = f"{cap_field}.burst_bytes", cap.burst_bytes
        raise InvalidArgument(
            field,
            value,
            f"{what} on DPU {dpu.name!r}, less its buffer of {dpu.buffer_bytes} bytes after the meter and "
            f"ARP's allowance, leaves {smallest} bytes, less than one {MAX_FRAME_BYTES}-byte frame",
        )


def intent_for(
    dpu: Dpu,
    pod: Pod | None,
    cap: Cap | None,
    lease: Lease | None = None,
    peers: tuple[str, ...] = (),
) -> Intent:
    """Desired data-plane state of `dpu` given its pod, the pod's cap (if any), its lease (if any)
    and the node MACs of its pod (`peers`: taken only by a node DPU, less its own)."""
    windows: dict[int, tuple[int, int]] = {}
    if cap is None:
        meters = {CELLS["egress"]: FLOOR, CELLS["ingress"]: FLOOR}
        arp = {ARP_CELLS + cell: FLOOR for cell in CELLS.values()}
    elif cap.mode == "window":
        meters = {CELLS["egress"]: OPEN_METER, CELLS["ingress"]: OPEN_METER}
        budgets = allowances(dpu, cap)
        windows = {
            cell: (budgets[d], window_params(getattr(cap, f"{d}_bps"), cap.window_s)[1]) for d, cell in CELLS.items()
        }
        arp = {ARP_CELLS + cell: cap_meter(*arp_allowance(cap, d)) for d, cell in CELLS.items()}
    else:
        bursts = allowances(dpu, cap)
        meters, arp = {}, {}
        for d, cell in CELLS.items():
            arp_bps, arp_burst = arp_allowance(cap, d)
            meters[cell] = cap_meter(getattr(cap, f"{d}_bps") - arp_bps, bursts[d], f"cap.{d}_bps")
            arp[ARP_CELLS + cell] = cap_meter(arp_bps, arp_burst)
    # From the host side, IPv4 must carry the pod's own sources (limiter.p4 drops the rest as spoofed).
    boundary: tuple[tuple[int, int, int, int], ...] = (
        (dpu.host_port, dpu.uplink_port, CELLS["egress"], 1),
        (dpu.uplink_port, dpu.host_port, CELLS["ingress"], 0),
    )
    # Only a node DPU knows pod peers: nothing that crosses a pod uplink is intra-pod.
    mates = tuple(sorted(set(peers) - {dpu.node_mac})) if dpu.role is Role.NODE else ()
    sealing: tuple[tuple[int, int | None, str], ...] = ()
    if dpu.seal_port is not None and dpu.role is Role.NODE and dpu.node_mac:
        # What the engine opened enters the node like anything else from outside: the ingress cell.
        boundary += ((dpu.seal_port, dpu.host_port, CELLS["ingress"], 0),)
        sealing = ((dpu.host_port, dpu.seal_port, dpu.node_mac), (dpu.seal_port, None, dpu.node_mac))
    return Intent(
        meters={**meters, **arp},
        windows=windows,
        prefixes=pod.ipv4_prefixes if pod else (),
        boundary=boundary,
        lease=lease if cap is not None else None,
        peers=mates,
        sealing=sealing,
    )


def hold_after_reset_s(intent: Intent) -> float:
    """How long a DPU whose state was just lost (a pipeline loaded: meters full, window slots empty) must
    pass no metered traffic, so that nothing it passed before the loss and nothing after share a window of
    its cap: in window mode the window, else the time its meters' buckets take to fill from empty."""
    hold = 0.0
    for _, mult in intent.windows.values():
        # window_params' multiplier, back to the window (rounded down there, so this is never shorter).
        hold = max(hold, ((1 << 32) * WINDOW_SLOTS / mult - 1) * 1024e-6)
    for m in intent.meters.values():
        for rate, burst in ((m.cir, m.cburst), (m.pir, m.pburst)):
            if rate > 0:
                hold = max(hold, burst / rate)
    return hold


def exemption_entities(intent: Intent) -> list[fy.P4TableEntry]:
    """Exemption entries: a packet is intra-pod when both prefix lookups and the peer lookup hit."""
    out = [
        fy.P4TableEntry(
            TABLE_PEERS, match=fy.P4TableMatch({FIELD_PEER_MAC: mac}), action=fy.P4TableAction(ACTION_NO_ACTION)
        )
        for mac in intent.peers
    ]
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


def lease_entity(lease: Lease | None) -> fy.P4TableEntry:
    """lease_cfg's default action: the lease until its deadline on the DPU's clock, or NoAction
    (none: metered traffic is dropped)."""
    if lease is None:
        action = fy.P4TableAction(ACTION_NO_ACTION)
    else:
        if lease.deadline_us is None:
            raise ValueError(f"lease {lease.gen} has no deadline on the DPU's clock yet")
        deadline = min(max(lease.deadline_us, 0), MAX_DEADLINE_US)
        action = fy.P4TableAction(ACTION_LEASE, gen=lease.gen, deadline=deadline, epoch=lease.epoch)
    return fy.P4TableEntry(TABLE_LEASE, action=action, is_default_action=True)


def sealing_entities(intent: Intent) -> list[fy.P4TableEntry]:
    """The crypto engine's ports: intra-pod frames from the host leave sealed, and only what arrives opened
    is intra-pod."""
    return [
        fy.P4TableEntry(
            TABLE_SEALING,
            match=fy.P4TableMatch({FIELD_INGRESS_PORT: in_port}),
            action=fy.P4TableAction(ACTION_OPENED, node_mac=mac)
            if seal_port is None
            else fy.P4TableAction(ACTION_SEAL_VIA, port=seal_port, node_mac=mac),
        )
        for in_port, seal_port, mac in intent.sealing
    ]


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


def canonical(te: p4r.TableEntry) -> p4r.TableEntry:
    """`te` with its match values and action parameters in canonical byte strings (in place).

    finsy encodes canonically; a target may answer reads with zero-padded values (older bmv2).
    """
    for fm in te.match:
        kind = fm.WhichOneof("field_match_type")
        if kind == "exact":
            fm.exact.value = fm.exact.value.lstrip(b"\0") or b"\0"
        elif kind == "lpm":
            fm.lpm.value = fm.lpm.value.lstrip(b"\0") or b"\0"
    for param in te.action.action.params:
        param.value = param.value.lstrip(b"\0") or b"\0"
    return te


@dataclass
class Held:
    """What a DPU was read back to hold, encoded: managed entries by identity, the lease, meter cells."""

    entries: dict[bytes, p4r.TableEntry]
    lease: p4r.TableAction | None  # lease_cfg's default action
    meters: dict[int, MeterParams | None]  # None: unconfigured


NOTHING = Held({}, None, {})
SEEN_MAX = 1024  # read-back entries a Codec remembers the identity of (a DPU holds a handful)


@dataclass
class Plan:
    """Updates that move a DPU from what it holds to the intent, in a safe order."""

    delete_exemptions: list[p4r.TableEntry]
    set_windows: list[p4r.TableEntry]  # inserts (before the meters open up)
    modify_windows: list[p4r.TableEntry]
    meters: list[p4r.MeterEntry]
    lease: list[p4r.TableEntry]  # lease_cfg's default action, when it differs (renewal or revocation)
    insert_exemptions: list[p4r.TableEntry]
    insert_boundary: list[p4r.TableEntry]
    modify_boundary: list[p4r.TableEntry]
    delete_boundary: list[p4r.TableEntry]
    delete_windows: list[p4r.TableEntry]  # after the meters have tightened
    # Every window budget set and meter rewritten moves the same way (all tighten or all loosen):
    # then they can share the meters' batch, since any part of it applied lies between before and after.
    windows_with_meters: bool = False
    revokes_lease: bool = False  # the lease update takes the lease away (NoAction): it goes first

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
        return sum(len(v) for v in vars(self).values() if isinstance(v, list))

    def batches(self) -> list[list[p4r.Update]]:
        """The plan as Write requests' updates, one batch per step, empty steps left out.

        A target may apply a batch's updates in any order, so only updates whose order does not
        matter share one: stale exemptions go first (tighten), window budgets are set before the
        meters open up, then the meters, then what lets traffic cross (exemptions and crossings;
        either order only ever meters more), and stale crossings and budgets go last, once the
        meters have tightened. The lease goes alone, after all of them: a DPU takes a new lease
        only once it holds the rest of the intent that came with it, so a DPU that cannot apply a
        smaller share keeps no lease granted after it, and falls to its floor when the deadline of
        the last one granted before passes (the control plane lets a pod's other DPUs grow then).
        A lease taken away goes first instead, alone, before anything else moves: a window written
        before it (its slot counters start afresh) would pass a fresh budget under the old lease for
        a round trip, or a whole lease if the revoking write then failed (a red team: 13 frames in
        1.5 ms on the embedded target).
        """
        ins, mod, dele = p4r.Update.INSERT, p4r.Update.MODIFY, p4r.Update.DELETE

        def tables(*parts: tuple[p4r.Update.Type.ValueType, list[p4r.TableEntry]]) -> list[p4r.Update]:
            return [p4r.Update(type=t, entity=p4r.Entity(table_entry=e)) for t, es in parts for e in es]

        windows = tables((ins, self.set_windows), (mod, self.modify_windows))
        meters = [p4r.Update(type=mod, entity=p4r.Entity(meter_entry=m)) for m in self.meters]
        if self.windows_with_meters:
            windows, meters = [], windows + meters
        steps = [
            tables((dele, self.delete_exemptions)),
            windows,
            meters,
            tables((ins, self.insert_exemptions), (ins, self.insert_boundary), (mod, self.modify_boundary)),
            tables((dele, self.delete_boundary), (dele, self.delete_windows)),
            tables((mod, self.lease)),
        ]
        if self.revokes_lease:
            steps.insert(0, steps.pop())
        return [step for step in steps if step]


class Codec:
    """limiter.p4's entities encoded for one P4Info; what repeats from one reconcile to the next is cached.

    Thousands of DPUs reconcile at once after a cap change: building and comparing protobufs
    directly (not finsy entities) and encoding the table entries only when the pod changes keeps
    the per-DPU cost of a change to a few small messages.
    """

    def __init__(self, schema: fy.P4Schema) -> None:
        self.schema = schema
        self.meter_id = schema.meters[METER].id
        self.lease_table = schema.tables[TABLE_LEASE].id
        self.lease_action = schema.actions[ACTION_LEASE].id
        window_action = schema.actions[ACTION_WINDOW]
        self.window_params = (window_action.params["budget"].id, window_action.params["mult"].id)
        self.table_names = {
            schema.tables[n].id: n
            for n in (TABLE_SRC_IN_POD, TABLE_DST_IN_POD, TABLE_PEERS, TABLE_SEALING, TABLE_BOUNDARY, TABLE_WINDOW)
        }
        reads: list[fy.P4TableEntry | fy.P4MeterEntry] = [
            *(fy.P4TableEntry(name) for name in self.table_names.values()),
            fy.P4TableEntry(TABLE_LEASE, is_default_action=True),
            *(fy.P4MeterEntry(METER, index=cell) for cell in METER_CELLS),
        ]
        # One Read for the managed tables and the meter cells: what a reconcile diffs and confirms.
        self.reads = [e.encode(schema) for e in reads]
        self._tables_of: tuple[object, dict[str, dict[bytes, p4r.TableEntry]]] | None = None
        self._lease_of: tuple[Lease | None, p4r.TableEntry] | None = None
        self._seen: dict[bytes, tuple[bytes, p4r.TableEntry]] = {}  # read-back entry as sent -> _identified

    def tables(self, intent: Intent) -> dict[str, dict[bytes, p4r.TableEntry]]:
        """The intent's entries of each managed table, by identity (encoded once per pod layout)."""
        key = (intent.prefixes, intent.peers, intent.sealing, intent.boundary, tuple(sorted(intent.windows.items())))
        if self._tables_of is None or self._tables_of[0] != key:

            def keyed(entries: list[fy.P4TableEntry]) -> dict[bytes, p4r.TableEntry]:
                encoded = (e.encode(self.schema).table_entry for e in entries)
                return {entry_key(te): te for te in encoded}

            prefixes = exemption_entities(intent)
            self._tables_of = (
                key,
                {
                    TABLE_SRC_IN_POD: keyed([e for e in prefixes if e.table_id == TABLE_SRC_IN_POD]),
                    TABLE_DST_IN_POD: keyed([e for e in prefixes if e.table_id == TABLE_DST_IN_POD]),
                    TABLE_PEERS: keyed([e for e in prefixes if e.table_id == TABLE_PEERS]),
                    TABLE_SEALING: keyed(sealing_entities(intent)),
                    TABLE_BOUNDARY: keyed(boundary_entities(intent)),
                    TABLE_WINDOW: keyed(window_entities(intent)),
                },
            )
        return self._tables_of[1]

    def leased(self, held: Held) -> bool:
        """Whether the DPU was read back to hold a lease at all (not NoAction, nor nothing)."""
        return held.lease is not None and held.lease.action.action_id == self.lease_action

    def unmetered(self, held: Held) -> bool:
        """Whether any meter cell was read back unconfigured (as a DPU's are after it starts)."""
        return any(m is None for m in held.meters.values())

    def lease(self, intent: Intent) -> p4r.TableEntry | None:
        """lease_cfg's default action for the intent's lease (encoded once per lease); None for a
        lease not yet placed on the DPU's clock (what the DPU holds is then left as it is)."""
        lease = intent.lease
        if lease is not None and lease.deadline_us is None:
            return None
        if self._lease_of is None or self._lease_of[0] != lease:
            self._lease_of = (lease, lease_entity(lease).encode(self.schema).table_entry)
        return self._lease_of[1]

    def meter(self, cell: int, m: MeterParams) -> p4r.MeterEntry:
        """A meter cell's configuration."""
        config = p4r.MeterConfig(cir=m.cir, cburst=m.cburst, pir=m.pir, pburst=m.pburst)
        return p4r.MeterEntry(meter_id=self.meter_id, index=p4r.Index(index=cell), config=config)

    def held(self, entities: list[p4r.Entity]) -> Held:
        """Decode the answer to `reads`."""
        out = Held({}, None, {})
        for ent in entities:
            if ent.HasField("meter_entry"):
                me = ent.meter_entry
                c = me.config
                out.meters[me.index.index] = (
                    MeterParams(c.cir, c.cburst, c.pir, c.pburst) if me.HasField("config") else None
                )
                continue
            te = ent.table_entry
            if te.is_default_action:
                if te.table_id == self.lease_table:
                    out.lease = self._identified(te)[1].action
            elif te.table_id in self.table_names:
                key, canon = self._identified(te)
                out.entries[key] = canon
        return out

    def _identified(self, te: p4r.TableEntry) -> tuple[bytes, p4r.TableEntry]:
        """(identity, canonical form) of a read-back entry; a DPU answers with the same entries read after read."""
        raw = te.SerializeToString()
        hit = self._seen.get(raw)
        if hit is None:
            if len(self._seen) >= SEEN_MAX:
                self._seen.clear()
            canon = canonical(te)
            hit = self._seen[raw] = (entry_key(canon), canon)
        return hit

    def plan(self, intent: Intent, held: Held) -> Plan:
        """Diff the intent against what the DPU holds.

        Meter cells are written only where they differ: rewriting an unchanged meter is not
        harmless, since bmv2 refills the bucket on every write (a periodic rewrite would hand out
        an extra burst each time).
        """
        want = self.tables(intent)
        lease = self.lease(intent)
        wanted = {k for entries in want.values() for k in entries}

        def inserts(table: str) -> list[p4r.TableEntry]:
            return [te for k, te in want[table].items() if k not in held.entries]

        def modifies(table: str) -> list[p4r.TableEntry]:
            return [te for k, te in want[table].items() if k in held.entries and held.entries[k].action != te.action]

        def stale(*tables: str) -> list[p4r.TableEntry]:
            return [te for k, te in held.entries.items() if k not in wanted and self.table_names[te.table_id] in tables]

        set_windows, modify_windows = inserts(TABLE_WINDOW), modifies(TABLE_WINDOW)
        cells = [cell for cell in sorted(intent.meters) if held.meters.get(cell) != intent.meters[cell]]
        ways = {-1 for _ in set_windows}  # a new budget only adds a limit
        ways |= {self._window_way(held.entries[entry_key(te)], te) for te in modify_windows}
        ways |= {_meter_way(held.meters.get(cell), intent.meters[cell]) for cell in cells}
        return Plan(
            delete_exemptions=stale(TABLE_SRC_IN_POD, TABLE_DST_IN_POD, TABLE_PEERS, TABLE_SEALING),
            set_windows=set_windows,
            modify_windows=modify_windows,
            meters=[self.meter(cell, intent.meters[cell]) for cell in cells],
            lease=[] if lease is None or held.lease == lease.action else [lease],
            revokes_lease=intent.lease is None and self.leased(held),
            insert_exemptions=inserts(TABLE_SRC_IN_POD)
            + inserts(TABLE_DST_IN_POD)
            + inserts(TABLE_PEERS)
            + inserts(TABLE_SEALING),
            insert_boundary=inserts(TABLE_BOUNDARY),
            # A changed seal port is a crossing that leaves by another port.
            modify_boundary=modifies(TABLE_BOUNDARY) + modifies(TABLE_SEALING),
            delete_boundary=stale(TABLE_BOUNDARY),
            delete_windows=stale(TABLE_WINDOW),
            windows_with_meters=ways in ({-1}, {1}),
        )

    def _window_way(self, old: p4r.TableEntry, new: p4r.TableEntry) -> int:
        """-1 if a window budget tightens, 1 if it loosens, 0 if neither (its window changes)."""

        def params(te: p4r.TableEntry) -> tuple[int, int]:
            values = {p.param_id: int.from_bytes(p.value, "big") for p in te.action.action.params}
            budget, mult = self.window_params
            return values.get(budget, 0), values.get(mult, 0)

        (old_budget, old_mult), (new_budget, new_mult) = params(old), params(new)
        if old_mult != new_mult or old.action.action.action_id != new.action.action.action_id:
            return 0
        return -1 if new_budget <= old_budget else 1


def _meter_way(old: MeterParams | None, new: MeterParams) -> int:
    """-1 if a meter cell tightens, 1 if it loosens, 0 if neither (some rates or bursts rise, others fall)."""
    if old is None:  # an unconfigured meter lets everything through
        return -1
    # Field by field (not dataclasses.astuple, which deep-copies: thousands of DPUs plan at once).
    pairs = ((old.cir, new.cir), (old.cburst, new.cburst), (old.pir, new.pir), (old.pburst, new.pburst))
    if all(n <= o for o, n in pairs):
        return -1
    return 1 if all(n >= o for o, n in pairs) else 0


def usage_reads() -> list[fy.P4CounterEntry]:
    """The counter cells that make up a DPU's usage."""
    reads = []
    for cell in CELLS.values():
        reads += [fy.P4CounterEntry(CLASS_COUNTER, index=cell * 8 + c) for c in CLASSES.values()]
        reads += [fy.P4CounterEntry(COLOR_COUNTER, index=cell * 8 + c) for c in COLORS.values()]
    return reads
