"""CounterEntry: the cells of indirect counter arrays (MODIFY only)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from finsy.proto import p4r

from ..errors import P4RuntimeError
from .binding import Binding
from .codec import invalid


def write(b: Binding, kind: int, ce: p4r.CounterEntry) -> None:
    """Set one cell or every cell of a counter array."""
    if kind != p4r.Update.MODIFY:
        raise invalid("counter entries can only be modified")
    found = b.counters.get(ce.counter_id)
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


def read(b: Binding, req: p4r.CounterEntry) -> Iterator[p4r.Entity]:
    """The counter cells a read request names."""
    ids = [req.counter_id] if req.counter_id else list(b.counters)
    for cid in ids:
        found = b.counters.get(cid)
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
