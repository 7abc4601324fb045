"""What a compromised DPU does to itself: the scenario event `compromise` (virtual time only).

Compromised firmware needs no P4Runtime arbitration: it changes its own pipeline's state directly.
Each way below defeats limiter.p4 differently:

- ``raise-meter``: both meter cells set far above any link's rate.
- ``delete-meter``: both meter cells reset to unconfigured (bmv2, and so the embedded target, marks
  every packet green on an unconfigured meter) and the window budgets removed.
- ``forward-unclassified``: 0.0.0.0/0 added to the pod's prefixes, so every packet looks intra-pod
  and is exempt.
- ``load-pipeline``: a different program altogether (p4/passthrough.p4: everything forwarded,
  nothing metered or counted).

With ``forge``, the firmware also lies: it forwards with a copy of the pipeline that it tampers
with, while P4Runtime reads and writes keep going to the honest one. Read-back then shows exactly
what the controller wrote, and the counters the controller reads stop at the moment of compromise.
"""

from __future__ import annotations

from pathlib import Path

from finsy.proto import p4r
from google.protobuf import text_format

from dpu_limiter import dataplane as dp
from p4sim.runtime import Pipeline
from p4sim.server import Device

from .config import CompromiseHow

PASSTHROUGH = Path(dp.__file__).resolve().parent / "p4" / "passthrough"

_OPEN = p4r.MeterConfig(
    cir=dp.OPEN_METER.cir, cburst=dp.OPEN_METER.cburst, pir=dp.OPEN_METER.pir, pburst=dp.OPEN_METER.pburst
)


def compromise(device: Device, how: CompromiseHow, forge: bool = False) -> None:
    """Tamper with `device` as compromised firmware would (see the module docstring)."""
    with device.lock:
        honest = device.pipeline
        if honest is None:
            raise ValueError(f"device {device.device_id} has no pipeline to tamper with")
        if how == "load-pipeline":
            other = device.build_pipeline(_passthrough_config())
            if forge:
                device.data_plane = other
            else:
                device.pipeline = other
            return
        target = _clone(device, honest) if forge else honest
        for update in _tampering(target, how):
            target.write(update)
        if forge:
            device.data_plane = target


def _ids(pipeline: Pipeline) -> dict[str, int]:
    info = pipeline.p4info
    return {o.preamble.name: o.preamble.id for o in [*info.tables, *info.meters, *info.registers]}


def _tampering(pipeline: Pipeline, how: CompromiseHow) -> list[p4r.Update]:
    ids = _ids(pipeline)
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
        windows = pipeline.read(p4r.Entity(table_entry=p4r.TableEntry(table_id=ids[dp.TABLE_WINDOW])))
        return [*resets, *(p4r.Update(type=delete, entity=e) for e in windows)]
    out = []
    for table in (dp.TABLE_SRC_IN_POD, dp.TABLE_DST_IN_POD):
        tid = ids[table]
        info = next(t for t in pipeline.p4info.tables if t.preamble.id == tid)
        # No match field: P4Runtime's 0.0.0.0/0, every address.
        entry = p4r.TableEntry(
            table_id=tid, action=p4r.TableAction(action=p4r.Action(action_id=info.action_refs[0].id))
        )
        out.append(p4r.Update(type=insert, entity=p4r.Entity(table_entry=entry)))
    return out


def _passthrough_config() -> p4r.ForwardingPipelineConfig:
    config = p4r.ForwardingPipelineConfig(p4_device_config=PASSTHROUGH.with_suffix(".json").read_bytes())
    text_format.Parse(PASSTHROUGH.with_suffix(".p4info.txtpb").read_text(), config.p4info)
    config.cookie.cookie = 0x5EC0DE
    return config


def _clone(device: Device, honest: Pipeline) -> Pipeline:
    """A second pipeline of the same program holding the same entries, meters and registers."""
    config = p4r.ForwardingPipelineConfig(p4info=honest.p4info, p4_device_config=honest.device_config)
    config.cookie.cookie = honest.cookie
    copy = device.build_pipeline(config)
    for entity in honest.read(p4r.Entity(table_entry=p4r.TableEntry())):
        copy.write(p4r.Update(type=p4r.Update.INSERT, entity=entity))
    for t in honest.p4info.tables:  # default actions (the lease among them): a wildcard read leaves them out
        default = p4r.TableEntry(table_id=t.preamble.id, is_default_action=True)
        for entity in honest.read(p4r.Entity(table_entry=default)):
            if not t.const_default_action_id:
                copy.write(p4r.Update(type=p4r.Update.MODIFY, entity=entity))
    for m in honest.p4info.meters:
        for entity in honest.read(p4r.Entity(meter_entry=p4r.MeterEntry(meter_id=m.preamble.id))):
            if entity.meter_entry.HasField("config"):
                copy.write(p4r.Update(type=p4r.Update.MODIFY, entity=entity))
    for r in honest.p4info.registers:
        for entity in honest.read(p4r.Entity(register_entry=p4r.RegisterEntry(register_id=r.preamble.id))):
            copy.write(p4r.Update(type=p4r.Update.MODIFY, entity=entity))
    return copy
