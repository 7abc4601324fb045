"""DirectCounterEntry: the packet and byte counts on the entries of tables with direct counters."""

from __future__ import annotations

from collections.abc import Iterator

from finsy.proto import p4r

from .binding import Binding
from .codec import invalid
from .table_entry import direct_entry, direct_targets, entry_key


def write(b: Binding, kind: int, dc: p4r.DirectCounterEntry) -> None:
    """Set one entry's counts (MODIFY only)."""
    if kind != p4r.Update.MODIFY:
        raise invalid("direct counter entries can only be modified")
    tb = b.binding(dc.table_entry.table_id)
    if tb.tdef.direct_counter is None:
        raise invalid(f"table {tb.info.preamble.name} has no direct counter")
    entry = direct_entry(tb, dc.table_entry)
    entry.packets, entry.bytes = dc.data.packet_count, dc.data.byte_count


def read(b: Binding, req: p4r.DirectCounterEntry) -> Iterator[p4r.Entity]:
    """The counts of the entries a read request names."""
    for tb, entry in direct_targets(b.direct_counters, req.table_entry):
        out = p4r.DirectCounterEntry(table_entry=entry_key(tb, entry))
        out.data.packet_count, out.data.byte_count = entry.packets, entry.bytes
        yield p4r.Entity(direct_counter_entry=out)
