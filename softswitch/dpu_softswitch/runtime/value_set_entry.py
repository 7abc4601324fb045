"""ValueSetEntry: the members of parser value sets, written whole."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from finsy.proto import p4i, p4r

from ..bytestrings import canonical
from ..errors import P4RuntimeError
from .binding import Binding
from .codec import decode_bytes, invalid


def write(b: Binding, kind: int, ve: p4r.ValueSetEntry) -> None:
    """Replace a value set's members."""
    # P4Runtime: a value set is written whole with MODIFY; its members replace the old ones.
    if kind != p4r.Update.MODIFY:
        raise invalid("value set entries can only be modified")
    found = b.value_sets.get(ve.value_set_id)
    if found is None:
        raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"value set id {ve.value_set_id} is not in the P4Info")
    info, vset = found
    if len(ve.members) > info.size:
        raise P4RuntimeError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"value set {info.preamble.name} holds at most {info.size} members"
        )
    values = [_value(info, m) for m in ve.members]
    kept = []
    for m in ve.members:
        c = p4r.ValueSetMember()
        c.CopyFrom(m)
        for fm in c.match:
            fm.exact.value = canonical(fm.exact.value)
        kept.append(c)
    vset.values = frozenset(values)
    b.vset_members[ve.value_set_id] = kept


def read(b: Binding, req: p4r.ValueSetEntry) -> Iterator[p4r.Entity]:
    """The members of the value sets a read request names, as written."""
    ids = [req.value_set_id] if req.value_set_id else list(b.value_sets)
    for vid in ids:
        if vid not in b.value_sets:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"value set id {vid} is not in the P4Info")
        yield p4r.Entity(value_set_entry=p4r.ValueSetEntry(value_set_id=vid, members=b.vset_members[vid]))


def _value(info: p4i.ValueSet, member: p4r.ValueSetMember) -> int:
    by_id = {fm.field_id: fm for fm in member.match}
    if set(by_id) != {mf.id for mf in info.match} or len(by_id) != len(member.match):
        raise invalid(f"value set {info.preamble.name}: a member must match every field exactly once")
    value = 0
    for mf in info.match:
        fm = by_id[mf.id]
        if fm.WhichOneof("field_match_type") != "exact":
            raise P4RuntimeError(
                grpc.StatusCode.UNIMPLEMENTED, f"value set {info.preamble.name}: only exact members are supported"
            )
        value = (value << mf.bitwidth) | decode_bytes(fm.exact.value, mf.bitwidth, f"value set field {mf.name!r}")
    return value
