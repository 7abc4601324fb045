"""PacketReplicationEngineEntry: multicast groups and clone sessions, checked as PI's PreMcMgr and
PreCloneMgr check them."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from finsy.proto import p4r

from ..errors import P4RuntimeError
from .binding import Binding
from .codec import invalid


def write(b: Binding, kind: int, pre: p4r.PacketReplicationEngineEntry) -> None:
    """Insert, modify or delete one multicast group or clone session."""
    which = pre.WhichOneof("type")
    if which == "multicast_group_entry":
        g = pre.multicast_group_entry
        if g.multicast_group_id == 0:
            raise invalid("multicast group id 0 is not valid")
        _write_replicas(kind, b.program.pre.groups, g.multicast_group_id, g.replicas, "Multicast group")
    elif which == "clone_session_entry":
        cs = pre.clone_session_entry
        # PI's PreCloneMgr: session ids 1..32767; class of service unsupported; this target also
        # refuses truncation (packet_length_bytes), which it does not implement.
        if not 1 <= cs.session_id < 32768:
            raise invalid("Clone session id out-of-range")
        if cs.class_of_service:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "COS for clone sessions not supported yet")
        if cs.packet_length_bytes:
            raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "clone truncation is not supported by this target")
        _write_replicas(kind, b.program.pre.clone_sessions, cs.session_id, cs.replicas, "Clone session")
    else:
        raise invalid("packet replication engine entry has no type")


def read(b: Binding, req: p4r.PacketReplicationEngineEntry) -> Iterator[p4r.Entity]:
    """The multicast groups or clone sessions a read request names."""
    pre = b.program.pre
    which = req.WhichOneof("type")
    if which == "multicast_group_entry":
        table, wanted, missing = pre.groups, req.multicast_group_entry.multicast_group_id, "Multicast group"
    elif which == "clone_session_entry":
        table, wanted, missing = pre.clone_sessions, req.clone_session_entry.session_id, "Clone session"
    else:
        raise invalid("packet replication engine read needs a type")
    for key in [wanted] if wanted else sorted(table):
        if key not in table:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"{missing} does not exist")
        entry = p4r.PacketReplicationEngineEntry()
        if which == "multicast_group_entry":
            msg: p4r.MulticastGroupEntry | p4r.CloneSessionEntry = entry.multicast_group_entry
            msg.multicast_group_id = key
        else:
            msg = entry.clone_session_entry
            msg.session_id = key
        for port, rid in table[key]:
            msg.replicas.add(egress_port=port, instance=rid)
        yield p4r.Entity(packet_replication_engine_entry=entry)


def _write_replicas(kind: int, table: dict[int, list[tuple[int, int]]], key: int, replicas: object, what: str) -> None:
    exists = key in table
    if kind == p4r.Update.INSERT and exists:
        raise P4RuntimeError(grpc.StatusCode.ALREADY_EXISTS, f"{what} already exists")
    if kind in (p4r.Update.MODIFY, p4r.Update.DELETE) and not exists:
        raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"{what} does not exist")
    if kind == p4r.Update.DELETE:
        del table[key]
        return
    if kind not in (p4r.Update.INSERT, p4r.Update.MODIFY):
        raise invalid(f"update type {kind} is not valid")
    out: list[tuple[int, int]] = []
    for r in replicas:  # type: ignore[attr-defined]
        which = r.WhichOneof("port_kind")
        if which == "egress_port":
            port = r.egress_port
        elif which == "port":
            port = int.from_bytes(r.port, "big")
        else:
            raise invalid("Missing port in multicast group replica")
        if (port, r.instance) in out:
            raise invalid("Duplicate replica in multicast group")
        out.append((port, r.instance))
    table[key] = out
