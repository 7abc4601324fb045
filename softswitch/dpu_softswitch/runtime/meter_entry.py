"""MeterEntry: the cells of indirect meter arrays (MODIFY only), and the meter configuration check
that direct meters and table entries' meter_config share."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from finsy.proto import p4r

from ..errors import P4RuntimeError
from ..externs import Meter, configure_meter
from .binding import Binding
from .codec import invalid


def write(b: Binding, kind: int, me: p4r.MeterEntry) -> None:
    """Configure (or, without a config, reset) one cell or every cell of a meter array."""
    if kind != p4r.Update.MODIFY:
        raise invalid("meter entries can only be modified")
    info = b.meters.get(me.meter_id)
    if info is None:
        raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"meter id {me.meter_id} is not in the P4Info")
    arr = b.program.meters[info.preamble.name]
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
                raise invalid("meter config values must be >= 0")
            if c.cir > c.pir:
                raise invalid(f"meter {info.preamble.name}: cir {c.cir} > pir {c.pir}")
            arr.set_p4runtime_config(idx, c.cir, c.cburst, c.pir, c.pburst)
        else:
            arr.cells[idx].reset()


def read(b: Binding, req: p4r.MeterEntry) -> Iterator[p4r.Entity]:
    """The meter cells a read request names, with their configurations."""
    ids = [req.meter_id] if req.meter_id else list(b.meters)
    for mid in ids:
        info = b.meters.get(mid)
        if info is None:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"meter id {mid} is not in the P4Info")
        arr = b.program.meters[info.preamble.name]
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


def configure(cell: Meter, c: p4r.MeterConfig, what: str) -> None:
    """Configure one meter from a P4Runtime MeterConfig, checked."""
    if c.cir < 0 or c.pir < 0 or c.cburst < 0 or c.pburst < 0:
        raise invalid("meter config values must be >= 0")
    if c.cir > c.pir:
        raise invalid(f"meter {what}: cir {c.cir} > pir {c.pir}")
    configure_meter(cell, c.cir, c.cburst, c.pir, c.pburst)
