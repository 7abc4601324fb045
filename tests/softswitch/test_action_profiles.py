"""Action profiles and selectors on the embedded target: P4Runtime's rules as simple_switch_grpc's PI server
applies them (PI proto/frontend/src/action_prof_mgr.cpp and device_mgr.cpp over bmv2's action_profile.cpp).

The program is the corpus's action_selector.p4: I.l2 over the action profile I.ap, I.ecmp over the
selector I.sel (@max_group_size(4)), I.lb over the selector I.sel2.
"""

from __future__ import annotations

import grpc
import pytest
from finsy import P4Schema
from finsy.proto import p4r

from corpus_cases import (
    CASES,
    MAC_B,
    ROUTER_SRC,
    ap_group,
    ap_member,
    indirect_entry,
    nhop,
    pipeline,
    schema,
)
from dpu_softswitch.server import Device
from helpers.p4rt import Client, connect, detail_codes, update
from helpers.planes import InProcess

INS, MOD, DEL = p4r.Update.INSERT, p4r.Update.MODIFY, p4r.Update.DELETE
DST = "hdr.ipv4.dstAddr"
Code = grpc.StatusCode


async def fresh(target: InProcess) -> tuple[Device, Client, P4Schema]:
    """The in-process target with action_selector.p4 set and nothing written."""
    device, channel = target
    c = await connect(channel, 5)
    await c.responses.get()
    await c.set_pipeline(pipeline("action_selector"))
    return device, c, schema("action_selector")


async def refused(c: Client, *updates: p4r.Update) -> list[Code]:
    """Write updates that must fail; their status codes in order (OK for those that passed)."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.write(*updates)
    by_value = {code.value[0]: code for code in Code}
    return [by_value[v] for v in detail_codes(err.value)]


async def test_member_ids_and_actions(in_process_target: InProcess) -> None:
    _, c, sch = await fresh(in_process_target)
    await c.write(update(INS, ap_member(sch, "I.ap", 1, "I.to_port", port=1)))
    assert await refused(
        c,
        update(INS, ap_member(sch, "I.ap", 1, "I.to_port", port=2)),  # the id exists
        update(MOD, ap_member(sch, "I.ap", 2, "I.to_port", port=2)),  # no such member
        update(DEL, ap_member(sch, "I.ap", 2)),
        update(INS, ap_member(sch, "I.ap", 3, "I.set_nhop", port=1, dmac=1)),  # not an action of I.ap's tables
        update(INS, ap_member(sch, "I.ap", 4, "I.to_port")),  # its parameter is missing
    ) == [Code.ALREADY_EXISTS, Code.NOT_FOUND, Code.NOT_FOUND, Code.INVALID_ARGUMENT, Code.INVALID_ARGUMENT]
    wrong = ap_member(sch, "I.ap", 5, "I.to_port", port=1)
    wrong.action_profile_member.action_profile_id = 12345
    assert await refused(c, update(INS, wrong)) == [Code.INVALID_ARGUMENT]
    await c.write(update(MOD, ap_member(sch, "I.ap", 1, "I.to_port", port=7)))
    [read] = await c.read(ap_member(sch, "I.ap", 1))
    assert read.action_profile_member.action.params[0].value == b"\x07"  # canonical, as PI reads it back
    assert await c.read(ap_member(sch, "I.ap", 99)) == []  # an unknown id reads as nothing (PI logs a warning)


async def test_references_block_deletes(in_process_target: InProcess) -> None:
    device, c, sch = await fresh(in_process_target)
    await c.write(
        update(INS, ap_member(sch, "I.sel", 1, "I.set_nhop", port=1, dmac=1)),
        update(INS, ap_member(sch, "I.sel", 2, "I.set_nhop", port=2, dmac=2)),
        update(INS, ap_group(sch, "I.sel", 10, {1: 1})),
        update(INS, indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"}, group=10)),
        update(INS, indirect_entry(sch, "I.ecmp", {DST: "11.0.0.0/8"}, member=2)),
    )
    # bmv2 refuses (MBR_STILL_USED, GRP_STILL_USED) and PI reports it as UNKNOWN.
    assert (
        await refused(
            c,
            update(DEL, ap_member(sch, "I.sel", 1)),  # in group 10
            update(DEL, ap_member(sch, "I.sel", 2)),  # named by an entry
            update(DEL, ap_group(sch, "I.sel", 10, {})),  # named by an entry
        )
        == [Code.UNKNOWN] * 3
    )
    await c.write(
        update(DEL, indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"})),
        update(DEL, ap_group(sch, "I.sel", 10, {})),  # a group with members may go: they are released
        update(DEL, ap_member(sch, "I.sel", 1)),
        update(DEL, indirect_entry(sch, "I.ecmp", {DST: "11.0.0.0/8"})),
        update(DEL, ap_member(sch, "I.sel", 2)),
    )
    assert device.pipeline is not None
    profile = device.pipeline.program.profiles["I.sel"]
    assert profile.member_handles() == [] and profile.group_handles() == []


async def test_group_rules(in_process_target: InProcess) -> None:
    _, c, sch = await fresh(in_process_target)
    await c.write(
        update(INS, ap_member(sch, "I.ap", 1, "I.route")),
        *(update(INS, ap_member(sch, "I.sel", m, "I.set_nhop", port=m, dmac=m)) for m in (1, 2, 3)),
    )
    assert await refused(
        c,
        update(INS, ap_group(sch, "I.sel", 10, {1: 1}, max_size=8)),  # above the P4Info's max_group_size 4
        update(INS, ap_group(sch, "I.sel", 11, {1: 0})),  # weights are positive
        update(INS, ap_group(sch, "I.sel", 12, {1: 2, 2: 2, 3: 1})),  # weights add up to 5 > 4
        update(INS, ap_group(sch, "I.ap", 13, {2: 1})),  # member 2 is I.sel's, not I.ap's
    ) == [Code.INVALID_ARGUMENT, Code.INVALID_ARGUMENT, Code.RESOURCE_EXHAUSTED, Code.NOT_FOUND]
    # PI creates a group before it checks its members: the refused ones stay, empty.
    groups = await c.read(ap_group(sch, "I.sel", 0, {}))
    assert [(g.action_profile_group.group_id, len(g.action_profile_group.members)) for g in groups] == [
        (11, 0),
        (12, 0),
    ]
    assert await refused(c, update(INS, ap_group(sch, "I.sel", 11, {1: 1}))) == [Code.ALREADY_EXISTS]
    dup = ap_group(sch, "I.sel", 11, {1: 1})
    dup.action_profile_group.members.add(member_id=1, weight=1)
    watched = ap_group(sch, "I.sel", 11, {1: 1})
    watched.action_profile_group.members[0].watch_port = b"\x01"
    await c.write(update(MOD, ap_group(sch, "I.sel", 11, {1: 1, 2: 3})))
    assert await refused(
        c,
        update(MOD, dup),  # one member twice: use weights
        update(MOD, ap_group(sch, "I.sel", 11, {1: 1}, max_size=3)),  # max_size is fixed at creation
        update(MOD, ap_group(sch, "I.sel", 99, {1: 1})),
        update(MOD, watched),  # liveness watching is not modelled
    ) == [Code.INVALID_ARGUMENT, Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.UNIMPLEMENTED]
    [g] = await c.read(ap_group(sch, "I.sel", 11, {}))
    assert g.action_profile_group.max_size == 0  # as created
    assert [(m.member_id, m.weight) for m in g.action_profile_group.members] == [(1, 1), (2, 3)]


async def test_table_entry_actions(in_process_target: InProcess) -> None:
    _, c, sch = await fresh(in_process_target)
    await c.write(
        update(INS, ap_member(sch, "I.ap", 1, "I.route")),
        update(INS, ap_group(sch, "I.ap", 5, {1: 1})),  # PI and bmv2 allow groups in any profile
        update(INS, ap_member(sch, "I.sel", 2, "I.set_nhop", port=2, dmac=2)),
        update(INS, ap_group(sch, "I.sel", 6, {})),
    )
    direct = indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"})
    direct.table_entry.action.action.CopyFrom(nhop(sch, 1))
    default = indirect_entry(sch, "I.ecmp", {}, member=2)
    default.table_entry.is_default_action = True
    assert await refused(
        c,
        update(INS, indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"}, member=1)),  # I.ap's member
        update(INS, direct),  # a table with an action profile takes no direct action
        update(MOD, default),  # nor a default action
        update(INS, indirect_entry(sch, "I.l2", {"hdr.ethernet.dstAddr": MAC_B}, group=5)),  # no selector
        update(INS, indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"}, group=6)),  # empty group
    ) == [Code.INVALID_ARGUMENT, Code.INVALID_ARGUMENT, Code.INVALID_ARGUMENT, Code.UNKNOWN, Code.UNKNOWN]
    [read] = await c.read(default)
    assert read.table_entry.is_default_action and not read.table_entry.HasField("action")
    await c.write(update(INS, indirect_entry(sch, "I.l2", {"hdr.ethernet.dstAddr": MAC_B}, member=1)))
    entries = await c.read(indirect_entry(sch, "I.l2", {}))
    assert [e.table_entry.action.action_profile_member_id for e in entries] == [1]


async def test_lookup_of_an_emptied_group(in_process_target: InProcess) -> None:
    # A group emptied after an entry points at it: bmv2 runs no action for a packet that hits it but
    # leaves its next node undefined, and simple_switch_grpc 1.15.2 dies; this target goes on after the table.
    device, c, sch = await fresh(in_process_target)
    await c.write(
        update(INS, ap_member(sch, "I.ap", 1, "I.route")),
        update(INS, indirect_entry(sch, "I.l2", {"hdr.ethernet.dstAddr": MAC_B}, member=1)),
        update(INS, ap_member(sch, "I.sel", 2, "I.set_nhop", port=2, dmac=2)),
        update(INS, ap_group(sch, "I.sel", 6, {2: 1})),
        update(INS, indirect_entry(sch, "I.ecmp", {DST: "10.1.0.0/16"}, group=6)),
    )
    _, frame = CASES["action_selector"].frames[4]
    assert [p for p, _ in device.process(0, frame)] == [2]
    await c.write(update(MOD, ap_group(sch, "I.sel", 6, {})))
    routed_only = frame[:6] + ROUTER_SRC.to_bytes(6, "big") + frame[12:]
    assert device.process(0, frame) == [(0, routed_only)]


async def test_one_shot_action_sets(in_process_target: InProcess) -> None:
    device, c, sch = await fresh(in_process_target)
    entry = indirect_entry(sch, "I.ecmp", {DST: "10.1.0.0/16"}, action_set=[(1, nhop(sch, 1)), (2, nhop(sch, 2))])
    too_big = indirect_entry(sch, "I.ecmp", {DST: "10.2.0.0/16"}, action_set=[(4, nhop(sch, 1)), (1, nhop(sch, 2))])
    empty = indirect_entry(sch, "I.ecmp", {DST: "10.3.0.0/16"}, action_set=[])
    empty.table_entry.action.action_profile_action_set.SetInParent()
    assert await refused(c, update(INS, entry), update(INS, too_big), update(INS, empty)) == [
        Code.OK,
        Code.RESOURCE_EXHAUSTED,  # weights add up to more than max_group_size
        Code.UNIMPLEMENTED,  # PI: no support for empty action profile groups
    ]
    assert device.pipeline is not None
    profile = device.pipeline.program.profiles["I.sel"]
    assert profile.groups == {0: [0, 1, 2]}  # one bmv2 member per unit of weight
    [read] = await c.read(indirect_entry(sch, "I.ecmp", {}))
    got = read.table_entry.action.action_profile_action_set.action_profile_actions
    # Read back as written, but for parameters in canonical byte strings.
    assert [(a.weight, [p.value for p in a.action.params]) for a in got] == [
        (1, [b"\x01", bytes.fromhex("020000000101")]),
        (2, [b"\x02", bytes.fromhex("020000000102")]),
    ]
    # The profile is now programmed one-shot: members and groups of its own are refused, reads too.
    assert await refused(c, update(INS, ap_member(sch, "I.sel", 1, "I.set_nhop", port=1, dmac=1))) == [
        Code.INVALID_ARGUMENT
    ]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.read(ap_group(sch, "I.sel", 0, {}))
    assert err.value.code() == Code.INVALID_ARGUMENT
    changed = indirect_entry(sch, "I.ecmp", {DST: "10.1.0.0/16"}, action_set=[(1, nhop(sch, 3))])
    await c.write(update(MOD, changed))  # a new group; the old one and its members go
    assert profile.groups == {1: [3]} and profile.member_handles() == [3]
    await c.write(update(DEL, changed))
    assert profile.groups == {} and profile.member_handles() == []
    await c.write(update(INS, ap_member(sch, "I.sel", 1, "I.set_nhop", port=1, dmac=1)))  # empty: manual again


async def test_firmware_copy_keeps_members_groups_and_selection(in_process_target: InProcess) -> None:
    from dpu_softswitch.firmware import clone

    device, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    await c.set_pipeline(pipeline("action_selector"))
    await CASES["action_selector"].setup(c, schema("action_selector"))
    assert device.pipeline is not None
    copy = clone(device, device.pipeline)
    for port, frame in CASES["action_selector"].frames:
        assert copy.program.process(port, frame) == device.process(port, frame)
    for kind in ("action_profile_member", "action_profile_group"):
        entity = p4r.Entity(**{kind: {"action_profile_id": schema("action_selector").action_profiles["I.sel"].id}})
        assert list(copy.read(entity)) == list(device.pipeline.read(entity))


async def test_weights_are_member_copies(in_process_target: InProcess) -> None:
    # bmv2 has no weights: PI gives a member as many bmv2 copies as its heaviest use needs, each with
    # the lowest free handle, and deletes them when no group needs them.
    device, c, sch = await fresh(in_process_target)
    assert device.pipeline is not None
    profile = device.pipeline.program.profiles["I.sel"]
    await c.write(
        *(update(INS, ap_member(sch, "I.sel", m, "I.set_nhop", port=m, dmac=m)) for m in (1, 2)),
        update(INS, ap_group(sch, "I.sel", 10, {1: 3})),
    )
    assert profile.groups == {0: [0, 2, 3]}  # member 1 is handle 0, its copies 2 and 3
    await c.write(update(MOD, ap_group(sch, "I.sel", 10, {1: 1, 2: 1})))
    assert profile.groups == {0: [0, 1]} and profile.member_handles() == [0, 1]
    await c.write(update(INS, ap_group(sch, "I.sel", 20, {2: 2})))
    assert profile.groups == {0: [0, 1], 1: [1, 2]}
    members = await c.read(ap_member(sch, "I.sel", 0))
    assert [m.action_profile_member.member_id for m in members] == [1, 2, 2]  # a copy reads as its member
    [g] = await c.read(ap_group(sch, "I.sel", 20, {}))
    assert [(m.member_id, m.weight) for m in g.action_profile_group.members] == [(2, 2)]
    await c.write(update(MOD, ap_member(sch, "I.sel", 2, "I.set_nhop", port=7, dmac=7)))
    assert profile.actions[1] == profile.actions[2] == (profile.actions[1][0], [7, 7])  # copies follow


async def test_failed_modify_drops_the_old_reference(in_process_target: InProcess) -> None:
    # bmv2's modify_entry drops the entry's reference to its member before it refuses the empty group,
    # and does not restore it: the member can then be deleted under the entry, and PI fails reading it.
    _, c, sch = await fresh(in_process_target)
    await c.write(
        update(INS, ap_member(sch, "I.sel", 1, "I.set_nhop", port=1, dmac=1)),
        update(INS, ap_group(sch, "I.sel", 6, {})),
        update(INS, indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"}, member=1)),
    )
    assert await refused(c, update(MOD, indirect_entry(sch, "I.ecmp", {DST: "10.0.0.0/8"}, group=6))) == [Code.UNKNOWN]
    await c.write(update(DEL, ap_member(sch, "I.sel", 1)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.read(indirect_entry(sch, "I.ecmp", {}))
    assert err.value.code() == Code.INTERNAL
