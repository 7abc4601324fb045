"""ActionProfileGroup: the groups of action selectors programmed group by group (PI's MANUAL mode)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from finsy.proto import p4r

from ..errors import P4RuntimeError
from .binding import Binding
from .codec import invalid
from .profile_mgr import MANUAL


def write(b: Binding, kind: int, g: p4r.ActionProfileGroup) -> None:
    """Insert, modify or delete one group."""
    mgr = b.profile(g.action_profile_id).mgr
    mgr.use(MANUAL)
    for m in g.members:
        refuse_watch(m, f"group {g.group_id} member {m.member_id}")
    wanted = [(m.member_id, m.weight) for m in g.members]
    if kind == p4r.Update.INSERT:
        mgr.group_insert(g.group_id, g.max_size, wanted)
    elif kind == p4r.Update.MODIFY:
        mgr.group_modify(g.group_id, g.max_size, wanted)
    elif kind == p4r.Update.DELETE:
        mgr.group_delete(g.group_id)
    else:
        raise invalid(f"update type {kind} is not valid")


def read(b: Binding, req: p4r.ActionProfileGroup) -> Iterator[p4r.Entity]:
    """The groups a read request names."""
    for pid in [req.action_profile_id] if req.action_profile_id else list(b.profiles):
        pb = b.profile(pid)
        pb.mgr.use(MANUAL)
        for group_id, max_size, members in pb.mgr.read_groups(req.group_id):
            out = p4r.ActionProfileGroup(action_profile_id=pid, group_id=group_id, max_size=max_size)
            for member_id, weight in members:
                out.members.add(member_id=member_id, weight=weight)
            yield p4r.Entity(action_profile_group=out)


def refuse_watch(member: p4r.ActionProfileGroup.Member | p4r.ActionProfileAction, where: str) -> None:
    """Refuse a member with a watched port (of a group, or of a one-shot action set)."""
    # PI deactivates members whose watched port is down; this target has no port status to watch.
    which = member.WhichOneof("watch_kind")
    if which:
        raise P4RuntimeError(
            grpc.StatusCode.UNIMPLEMENTED, f"{where}: {which} (member liveness) is not supported by this target"
        )
