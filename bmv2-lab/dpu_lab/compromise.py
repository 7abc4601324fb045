"""What a compromised DPU does to itself: the scenario event `compromise`.

Compromised firmware needs no P4Runtime arbitration: it changes its own pipeline's state directly
(dpu_softswitch.firmware: in process in virtual time, through the target's firmware socket in real time; on
bmv2, through its Thrift runtime API: bmv2_firmware.py, which cannot forge).
Each way below defeats limiter.p4 differently:

- ``raise-meter``: both meter cells set far above any link's rate.
- ``delete-meter``: both meter cells reset to unconfigured (bmv2, and so the embedded target, marks
  every packet green on an unconfigured meter) and the window budgets removed.
- ``forward-unclassified``: 0.0.0.0/0 added to the pod's prefixes and the hosts' MACs it has seen
  (`macs`) to its pod peers, so every packet to or from those hosts looks intra-pod and is exempt;
  and its crypto engine bypassed: what it exempts leaves by its uplink port in the clear, and what
  arrives there counts as opened. limiter.p4 exempts only frames from (and opened frames to) the one
  node MAC of each sealing entry, which tables cannot widen: a node DPU keeps its own, any other DPU
  takes the first of `macs` (in the lab, its pod's first host: the scenarios' sender).
- ``load-pipeline``: a different program altogether (p4/passthrough.p4: everything forwarded,
  nothing metered or counted).

With ``forge``, the firmware also lies: it forwards with a copy of the pipeline that it tampers
with, while P4Runtime reads and writes keep going to the honest one. Read-back then shows exactly
what the controller wrote, and the counters the controller reads stop at the moment of compromise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from finsy.proto import p4i, p4r
from google.protobuf import text_format

from dpu_limiter import dataplane as dp
from dpu_softswitch.firmware import Firmware

from .config import CompromiseHow

PASSTHROUGH = Path(dp.__file__).resolve().parent / "p4" / "passthrough"

_OPEN = p4r.MeterConfig(
    cir=dp.OPEN_METER.cir, cburst=dp.OPEN_METER.cburst, pir=dp.OPEN_METER.pir, pburst=dp.OPEN_METER.pburst
)


def compromise(fw: Firmware, how: CompromiseHow, forge: bool = False, macs: Sequence[str] = ()) -> None:
    """Tamper with a device through its firmware (in process, a dpu_softswitch's socket, bmv2's Thrift) as `how` says
    (`macs`: the hosts' MACs a forward-unclassified DPU makes its pod peers)."""
    if how == "load-pipeline":
        fw.load(_passthrough_config(), forge)
    else:
        fw.write(_tampering(fw, how, macs), forge)


def _tampering(fw: Firmware, how: CompromiseHow, macs: Sequence[str]) -> list[p4r.Update]:
    info = fw.p4info()
    ids = {o.preamble.name: o.preamble.id for o in [*info.tables, *info.meters, *info.registers]}
    modify, insert, delete = p4r.Update.MODIFY, p4r.Update.INSERT, p4r.Update.DELETE
    meter = ids[dp.METER]
    cells = sorted(dp.CELLS.values())
    if how == "raise-meter":
        return [
            p4r.Update(
                type=modify,
                entity=p4r.Entity(meter_entry=p4r.MeterEntry(meter_id=meter, index=p4r.Index(index=c), config=_OPEN)),
            )
            for c in cells
        ]
    if how == "delete-meter":
        resets = [
            p4r.Update(
                type=modify, entity=p4r.Entity(meter_entry=p4r.MeterEntry(meter_id=meter, index=p4r.Index(index=c)))
            )
            for c in cells
        ]
        windows = fw.read(p4r.Entity(table_entry=p4r.TableEntry(table_id=ids[dp.TABLE_WINDOW])))
        return [*resets, *(p4r.Update(type=delete, entity=e) for e in windows)]
    out = []
    for table in (dp.TABLE_SRC_IN_POD, dp.TABLE_DST_IN_POD):
        tid = ids[table]
        t = next(t for t in info.tables if t.preamble.id == tid)
        # No match field: P4Runtime's 0.0.0.0/0, every address.
        entry = p4r.TableEntry(table_id=tid, action=p4r.TableAction(action=p4r.Action(action_id=t.action_refs[0].id)))
        out.append(p4r.Update(type=insert, entity=p4r.Entity(table_entry=entry)))
    # Exemption also needs a pod peer's MAC (an exact match: no wildcard), so it names every host it saw.
    tid = ids[dp.TABLE_PEERS]
    t = next(t for t in info.tables if t.preamble.id == tid)
    held = {
        bytes(e.table_entry.match[0].exact.value) for e in fw.read(p4r.Entity(table_entry=p4r.TableEntry(table_id=tid)))
    }
    for mac in macs:
        value = bytes.fromhex(mac.replace(":", "")).lstrip(b"\0") or b"\0"
        if value in held:
            continue
        match = p4r.FieldMatch(field_id=t.match_fields[0].id, exact=p4r.FieldMatch.Exact(value=value))
        entry = p4r.TableEntry(
            table_id=tid, match=[match], action=p4r.TableAction(action=p4r.Action(action_id=t.action_refs[0].id))
        )
        out.append(p4r.Update(type=insert, entity=p4r.Entity(table_entry=entry)))
    return out + _unsealed(fw, info, ids, macs[0] if macs else "00:00:00:00:00:00")


def _unsealed(fw: Firmware, info: p4i.P4Info, ids: dict[str, int], mac: str) -> list[p4r.Update]:
    """Sealing entries that skip the crypto engine: each crossing from the host side `seal_via` its own way
    out (the uplink, in the clear), each from outside `opened`, as if it had authenticated; for the node MAC
    an entry already names, else `mac`."""
    seal_tid, cross = ids[dp.TABLE_SEALING], _action_id(info, dp.ACTION_CROSS)
    seal_via, opened = _action_id(info, dp.ACTION_SEAL_VIA), _action_id(info, dp.ACTION_OPENED)
    # The node MAC each held entry names, by its ingress port (the action's last parameter).
    held = {
        bytes(e.table_entry.match[0].exact.value): max(
            e.table_entry.action.action.params, key=lambda p: p.param_id
        ).value
        for e in fw.read(p4r.Entity(table_entry=p4r.TableEntry(table_id=seal_tid)))
    }
    # A node DPU's own MAC for its other ports too (its sealing entries all name it).
    default_mac = next(iter(held.values()), None) or bytes.fromhex(mac.replace(":", "")).lstrip(b"\0") or b"\0"
    out = []
    for e in fw.read(p4r.Entity(table_entry=p4r.TableEntry(table_id=ids[dp.TABLE_BOUNDARY]))):
        te = e.table_entry
        if te.action.action.action_id != cross:
            continue
        port, _cell, inside = (p.value for p in sorted(te.action.action.params, key=lambda p: p.param_id))
        ingress = bytes(te.match[0].exact.value)
        node_mac = held.get(ingress, default_mac)
        if int.from_bytes(inside, "big"):
            params = [p4r.Action.Param(param_id=1, value=port), p4r.Action.Param(param_id=2, value=node_mac)]
            action = p4r.Action(action_id=seal_via, params=params)
        else:
            action = p4r.Action(action_id=opened, params=[p4r.Action.Param(param_id=1, value=node_mac)])
        entry = p4r.TableEntry(
            table_id=seal_tid,
            match=[p4r.FieldMatch(field_id=1, exact=p4r.FieldMatch.Exact(value=ingress))],
            action=p4r.TableAction(action=action),
        )
        kind = p4r.Update.MODIFY if ingress in held else p4r.Update.INSERT
        out.append(p4r.Update(type=kind, entity=p4r.Entity(table_entry=entry)))
    return out


def _action_id(info: p4i.P4Info, name: str) -> int:
    """An action's id in the P4Info."""
    return next(a.preamble.id for a in info.actions if a.preamble.name == name)


def _passthrough_config() -> p4r.ForwardingPipelineConfig:
    config = p4r.ForwardingPipelineConfig(p4_device_config=PASSTHROUGH.with_suffix(".json").read_bytes())
    text_format.Parse(PASSTHROUGH.with_suffix(".p4info.txtpb").read_text(), config.p4info)
    config.cookie.cookie = 0x5EC0DE
    return config
