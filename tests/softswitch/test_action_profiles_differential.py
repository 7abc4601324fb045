"""Action profile P4Runtime semantics on the embedded target and on simple_switch_grpc, write by write.

The same batches of member, group and table entry writes (most of them refused, for every rule in
test_action_profiles.py) go to both targets; after each, the per-update status codes and what reads
return (members, groups, entries, the indirect table's default entry, refused reads) must agree.
"""

from __future__ import annotations

import grpc
import pytest
from finsy import P4Schema
from finsy.proto import p4r
from google.protobuf import text_format

from corpus_cases import MAC_B, ap_group, ap_member, indirect_entry, nhop, pipeline, schema
from helpers.bmv2 import bmv2_switch
from helpers.p4rt import Client, connect, detail_codes, update
from helpers.planes import InProcess

pytestmark = [pytest.mark.bmv2, pytest.mark.netns]

INS, MOD, DEL = p4r.Update.INSERT, p4r.Update.MODIFY, p4r.Update.DELETE
DST = "hdr.ipv4.dstAddr"


def batches(sch: P4Schema) -> list[list[p4r.Update]]:
    """Write batches in order; comments name what each probes."""
    direct = indirect_entry(sch, "I.ecmp", {DST: "12.0.0.0/8"})
    direct.table_entry.action.action.CopyFrom(nhop(sch, 1))
    default = indirect_entry(sch, "I.ecmp", {}, member=2)
    default.table_entry.is_default_action = True
    dup = ap_group(sch, "I.sel", 11, {1: 1})
    dup.action_profile_group.members.add(member_id=1, weight=1)
    wrong = ap_member(sch, "I.ap", 5, "I.to_port", port=1)
    wrong.action_profile_member.action_profile_id = 12345
    empty = indirect_entry(sch, "I.lb", {DST: "10.3.0.1"}, action_set=[])
    empty.table_entry.action.action_profile_action_set.SetInParent()
    return [
        [update(INS, ap_member(sch, "I.ap", 1, "I.to_port", port=1))],
        # member ids, actions, profile ids
        [
            update(INS, ap_member(sch, "I.ap", 1, "I.to_port", port=2)),
            update(MOD, ap_member(sch, "I.ap", 2, "I.to_port", port=2)),
            update(DEL, ap_member(sch, "I.ap", 2)),
            update(INS, ap_member(sch, "I.ap", 3, "I.set_nhop", port=1, dmac=1)),
            update(INS, ap_member(sch, "I.ap", 4, "I.to_port")),
            update(INS, wrong),
        ],
        [update(INS, ap_member(sch, "I.sel", m, "I.set_nhop", port=m, dmac=m)) for m in (1, 2, 3)],
        # group sizes and weights; refused groups stay, empty
        [
            update(INS, ap_group(sch, "I.sel", 10, {1: 1}, max_size=8)),
            update(INS, ap_group(sch, "I.sel", 11, {1: 0})),
            update(INS, ap_group(sch, "I.sel", 12, {1: 2, 2: 2, 3: 1})),
            update(INS, ap_group(sch, "I.ap", 13, {2: 1})),
        ],
        [update(INS, ap_group(sch, "I.sel", 11, {1: 1}))],
        [update(MOD, ap_group(sch, "I.sel", 11, {1: 1, 2: 3}))],
        [
            update(MOD, dup),
            update(MOD, ap_group(sch, "I.sel", 11, {1: 1}, max_size=3)),
            update(MOD, ap_group(sch, "I.sel", 99, {1: 1})),
        ],
        [update(INS, ap_group(sch, "I.ap", 5, {1: 1})), update(INS, ap_group(sch, "I.sel", 6, {}))],
        # entries: unknown ids, direct actions, default actions, groups without selector, empty groups
        [update(INS, indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"}, member=1))],
        [update(INS, indirect_entry(sch, "I.ecmp", {DST: "11.0.0.0/8"}, group=11))],
        [
            update(INS, indirect_entry(sch, "I.ecmp", {DST: "13.0.0.0/8"}, member=9)),
            update(INS, direct),
            update(MOD, default),
            update(INS, indirect_entry(sch, "I.l2", {"hdr.ethernet.dstAddr": MAC_B}, group=5)),
            update(INS, indirect_entry(sch, "I.ecmp", {DST: "14.0.0.0/8"}, group=6)),
        ],
        # references block deletes; a MODIFY refused by bmv2 drops the old reference (batch 13 onwards)
        [
            update(DEL, ap_member(sch, "I.sel", 1)),
            update(DEL, ap_member(sch, "I.sel", 2)),
            update(DEL, ap_group(sch, "I.sel", 11, {})),
        ],
        [update(MOD, indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"}, group=6))],
        # one-shot sets, and the mixing rule
        [
            update(
                INS, indirect_entry(sch, "I.lb", {DST: "10.1.0.1"}, action_set=[(1, nhop(sch, 1)), (2, nhop(sch, 2))])
            ),
            update(INS, empty),
            update(INS, ap_member(sch, "I.sel2", 1, "I.set_nhop", port=1, dmac=1)),
        ],
        [update(MOD, indirect_entry(sch, "I.lb", {DST: "10.1.0.1"}, action_set=[(3, nhop(sch, 3))]))],
        [
            update(DEL, indirect_entry(sch, "I.ecmp", {DST: "11.0.0.0/8"})),
            update(DEL, ap_group(sch, "I.sel", 11, {})),
            update(DEL, ap_member(sch, "I.sel", 2)),
        ],
        [update(DEL, ap_member(sch, "I.sel", 1))],
    ]


async def snapshot(c: Client, sch: P4Schema) -> dict[str, object]:
    """What reads return (one-line text per entity, or the error code)."""
    out: dict[str, object] = {}
    for name, ent in [
        ("ap members", ap_member(sch, "I.ap", 0)),
        ("sel members", ap_member(sch, "I.sel", 0)),
        ("sel groups", ap_group(sch, "I.sel", 0, {})),
        ("ap groups", ap_group(sch, "I.ap", 0, {})),
        ("ecmp", indirect_entry(sch, "I.ecmp", {})),
        ("lb", indirect_entry(sch, "I.lb", {})),
        (
            "ecmp default",
            p4r.Entity(table_entry=p4r.TableEntry(table_id=sch.tables["I.ecmp"].id, is_default_action=True)),
        ),
        ("sel2 members", ap_member(sch, "I.sel2", 0)),
        ("member 99", ap_member(sch, "I.sel", 99)),
    ]:
        try:
            out[name] = [text_format.MessageToString(e, as_one_line=True) for e in await c.read(ent)]
        except grpc.aio.AioRpcError as exc:
            out[name] = exc.code().name
    return out


async def test_action_profile_writes_same_on_bmv2(in_process_target: InProcess) -> None:
    _, emb = in_process_target
    sch = schema("action_selector")
    with bmv2_switch(tuple(range(7))) as sw:
        async with grpc.aio.insecure_channel(sw.address) as bch:
            cs = []
            for ch in (bch, emb):
                c = await connect(ch, 5)
                await c.responses.get()
                await c.set_pipeline(pipeline("action_selector"))
                cs.append(c)
            diffs = []
            for i, batch in enumerate(batches(sch)):
                res: list[object] = []
                for c in cs:
                    try:
                        await c.write(*batch)
                        res.append("ok")
                    except grpc.aio.AioRpcError as exc:
                        res.append(detail_codes(exc))
                snaps = [await snapshot(c, sch) for c in cs]
                if res[0] != res[1]:
                    diffs.append((i, "codes", res))
                for k in snaps[0]:
                    if snaps[0][k] != snaps[1][k]:
                        diffs.append((i, k, snaps[0][k], snaps[1][k]))
            assert not diffs, diffs
