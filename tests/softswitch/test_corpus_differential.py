"""Every corpus program on the embedded target and on simple_switch_grpc: same entries, same frames, same results.

For each program a fresh simple_switch_grpc runs on veth pairs this test creates (tests/helpers/bmv2.py),
the embedded target runs in process; both are programmed through P4Runtime with the case's
entries (corpus_cases.py), each frame goes into both, and what leaves which port (bytes, drops)
is compared frame by frame, then the state the case reads back (direct counters, meters).

Where simple_switch_grpc's P4Runtime server does not serve an entity, the case does not write it
and the comparison goes through the data plane instead: PI answers UNIMPLEMENTED for RegisterEntry
and ValueSetEntry (the embedded target implements both, as the P4Runtime specification defines
them), so registers_exit.p4 writes each register's old value into the frame, and lookahead_vset.p4
runs with its value set empty on both targets.

Programs with packet I/O or digests (case.stream) run with the case's CPU port on both targets; their
steps (PacketOuts, DigestListAcks, more frames) go through both, PacketOut frames are compared like
any other output, and so are the PacketIns and DigestLists (data and list ids, not timestamps) each
target sends its primary controller, digest by digest in order (simple_switch_grpc sends each learn
list from a thread of its own, so only the order within one digest is defined).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from finsy.proto import p4r

from corpus_cases import (
    CASES,
    Frames,
    Step,
    embedded_step,
    pipeline,
    schema,
    stream_messages,
    stream_request,
    stream_view,
)
from dpu_softswitch.server import Device
from helpers.bmv2 import Bmv2, bmv2_switch
from helpers.p4rt import Client, connect

pytestmark = [pytest.mark.bmv2, pytest.mark.netns]


@pytest.mark.parametrize("name", sorted(CASES))
async def test_corpus_program_same_on_bmv2(name: str, in_process_target: tuple[Device, grpc.aio.Channel]) -> None:
    case = CASES[name]
    device, emb_channel = in_process_target
    device.cpu_port = case.cpu_port
    with bmv2_switch(case.ports, case.cpu_port) as sw:
        async with grpc.aio.insecure_channel(sw.address) as bmv2_channel:
            clients = []
            for channel in (bmv2_channel, emb_channel):
                c = await connect(channel, 5)
                await c.responses.get()
                await c.set_pipeline(pipeline(name))
                await case.setup(c, schema(name))
                clients.append(c)
            cb, ce = clients
            mismatches = []
            for port, frame in case.frames:
                want = sw.send(port, frame)
                got = device.process(port, frame)
                if sorted(got) != sorted(want):
                    mismatches.append({"port": port, "frame": frame.hex(), "bmv2": want, "embedded": got})
            for step in case.steps(schema(name)):
                want, got = await _both(step, sw, cb, device, ce)
                if sorted(got) != sorted(want):
                    mismatches.append({"step": str(step), "bmv2": want, "embedded": got})
            assert not mismatches, mismatches
            assert await case.state(ce, schema(name)) == await case.state(cb, schema(name))
            if case.stream:
                # bmv2's learn threads and PI's task queue hand digests on a little later.
                got, want = await asyncio.gather(stream_messages(ce, 1.0), stream_messages(cb, 1.0))
                assert _by_kind(got) == _by_kind(want)


async def _both(step: Step, sw: Bmv2, cb: Client, device: Device, ce: Client) -> tuple[Frames, Frames]:
    """One step on bmv2 and on the embedded target: what each sent out of its ports."""
    if not isinstance(step, tuple):
        cb.requests.put_nowait(stream_request(step))
    got = await embedded_step(step, device, ce)
    if isinstance(step, tuple):
        return await asyncio.to_thread(sw.send, *step), got
    return await asyncio.to_thread(sw.collect, 0.3), got  # bmv2's frames waited in the sockets meanwhile


def _by_kind(msgs: list[p4r.StreamMessageResponse]) -> dict[object, list[tuple[object, ...]]]:
    """PacketIns in order, and each digest's lists in order."""
    out: dict[object, list[tuple[object, ...]]] = {}
    for view in stream_view(msgs):
        key = view[0] if view[0] == "packet_in" else view[1]
        out.setdefault(key, []).append(view)
    return out
