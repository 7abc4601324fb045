"""The pipeline SetForwardingPipelineConfig installs, and the dispatch of P4Runtime entities by kind."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from finsy.proto import p4i, p4r

from ..errors import P4RuntimeError
from ..program import Program
from . import (
    action_profile_group,
    action_profile_member,
    counter_entry,
    digest_entry,
    direct_counter_entry,
    direct_meter_entry,
    meter_entry,
    packet_replication_engine_entry,
    register_entry,
    table_entry,
    value_set_entry,
)
from .binding import Binding
from .digests import Emit

Writer = Callable[[Binding, int, Any], None]
Reader = Callable[[Binding, Any], Iterator[p4r.Entity]]

# Entity kind (the p4.v1.Entity oneof field) -> its module's write and read.
_KINDS: dict[str, tuple[Writer, Reader]] = {
    "table_entry": (table_entry.write, table_entry.read),
    "meter_entry": (meter_entry.write, meter_entry.read),
    "counter_entry": (counter_entry.write, counter_entry.read),
    "direct_counter_entry": (direct_counter_entry.write, direct_counter_entry.read),
    "direct_meter_entry": (direct_meter_entry.write, direct_meter_entry.read),
    "register_entry": (register_entry.write, register_entry.read),
    "value_set_entry": (value_set_entry.write, value_set_entry.read),
    "packet_replication_engine_entry": (packet_replication_engine_entry.write, packet_replication_engine_entry.read),
    "action_profile_member": (action_profile_member.write, action_profile_member.read),
    "action_profile_group": (action_profile_group.write, action_profile_group.read),
    "digest_entry": (digest_entry.write, digest_entry.read),
}


class Pipeline(Binding):
    """A compiled program plus the P4Info that names its objects for P4Runtime."""

    def __init__(
        self,
        program: Program,
        p4info: p4i.P4Info,
        cookie: int,
        device_config: bytes,
        emit: Emit | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        """Bind `program` to `p4info`; digests go to `emit`, and `wake` hears of new digest timeouts."""
        self.cookie = cookie
        self.device_config = device_config
        super().__init__(program, p4info, emit, wake)

    def write(self, update: p4r.Update) -> None:
        """Apply one update (raises P4RuntimeError with the P4Runtime error)."""
        kind = update.entity.WhichOneof("entity")
        if kind is None or kind not in _KINDS:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, f"entity {kind} is not supported by this target")
        _KINDS[kind][0](self, update.type, getattr(update.entity, kind))

    def read(self, entity: p4r.Entity) -> Iterator[p4r.Entity]:
        """Yield the entities matching one read request entity (ids of 0 are wildcards)."""
        kind = entity.WhichOneof("entity")
        if kind is None or kind not in _KINDS:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, f"reading {kind} is not supported by this target")
        yield from _KINDS[kind][1](self, getattr(entity, kind))
