"""DirectMeterEntry: the meters on the entries of tables with direct meters."""

from __future__ import annotations

from collections.abc import Iterator

from finsy.proto import p4r

from ..externs import Meter, meter_config
from .binding import Binding
from .codec import invalid
from .meter_entry import configure
from .table_entry import direct_entry, direct_targets, entry_key


def write(b: Binding, kind: int, dm: p4r.DirectMeterEntry) -> None:
    """Configure (or, without a config, reset) one entry's meter (MODIFY only)."""
    if kind != p4r.Update.MODIFY:
        raise invalid("direct meter entries can only be modified")
    tb = b.binding(dm.table_entry.table_id)
    if tb.tdef.direct_meter is None:
        raise invalid(f"table {tb.info.preamble.name} has no direct meter")
    entry = direct_entry(tb, dm.table_entry)
    if entry.meter is None:
        entry.meter = Meter()
    if dm.HasField("config"):
        configure(entry.meter, dm.config, tb.info.preamble.name)
    else:
        entry.meter.reset()


def read(b: Binding, req: p4r.DirectMeterEntry) -> Iterator[p4r.Entity]:
    """The meter configurations of the entries a read request names."""
    for tb, entry in direct_targets(b.direct_meters, req.table_entry):
        out = p4r.DirectMeterEntry(table_entry=entry_key(tb, entry))
        cfg = meter_config(entry.meter) if entry.meter is not None else None
        if cfg is not None:
            out.config.cir, out.config.cburst, out.config.pir, out.config.pburst = cfg
        yield p4r.Entity(direct_meter_entry=out)
