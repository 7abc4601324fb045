"""ActionProfileMember: the members of action profiles programmed member by member (PI's MANUAL mode)."""

from __future__ import annotations

from collections.abc import Iterator

from finsy.proto import p4r

from .binding import Binding
from .codec import invalid
from .profile_mgr import MANUAL


def write(b: Binding, kind: int, m: p4r.ActionProfileMember) -> None:
    """Insert, modify or delete one member."""
    pb = b.profile(m.action_profile_id)
    mgr = pb.mgr
    mgr.use(MANUAL)
    if kind == p4r.Update.DELETE:
        mgr.member_delete(m.member_id)
    elif kind in (p4r.Update.INSERT, p4r.Update.MODIFY):
        aid, data = b.profile_action(pb, m.action)
        if kind == p4r.Update.INSERT:
            mgr.member_insert(m.member_id, aid, data)
        else:
            mgr.member_modify(m.member_id, aid, data)
    else:
        raise invalid(f"update type {kind} is not valid")


def read(b: Binding, req: p4r.ActionProfileMember) -> Iterator[p4r.Entity]:
    """The members a read request names."""
    for pid in [req.action_profile_id] if req.action_profile_id else list(b.profiles):
        pb = b.profile(pid)
        pb.mgr.use(MANUAL)
        for member_id, aid, data in pb.mgr.read_members(req.member_id):
            out = p4r.ActionProfileMember(action_profile_id=pid, member_id=member_id)
            out.action.CopyFrom(b.p4r_action(pb.json_to_info_action[aid], data))
            yield p4r.Entity(action_profile_member=out)
