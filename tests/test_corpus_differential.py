"""Every corpus program on the embedded target and on simple_switch_grpc: same entries, same frames, same results.

For each program a fresh simple_switch_grpc runs on veth pairs this test creates (bmv2_harness),
the embedded target runs in process; both are programmed through P4Runtime with the case's
entries (corpus_cases.py), each frame goes into both, and what leaves which port (bytes, drops)
is compared frame by frame, then the state the case reads back (direct counters, meters).

Where simple_switch_grpc's P4Runtime server does not serve an entity, the case does not write it
and the comparison goes through the data plane instead: PI answers UNIMPLEMENTED for RegisterEntry
and ValueSetEntry (the embedded target implements both, as the P4Runtime specification defines
them), so registers_exit.p4 writes each register's old value into the frame, and lookahead_vset.p4
runs with its value set empty on both targets.
"""

from __future__ import annotations

import grpc
import pytest

from bmv2_harness import bmv2_switch
from corpus_cases import CASES, pipeline, schema
from p4rt_helpers import connect
from p4sim.server import Device

pytestmark = [pytest.mark.bmv2, pytest.mark.netns]


@pytest.mark.parametrize("name", sorted(CASES))
async def test_corpus_program_same_on_bmv2(name: str, in_process_target: tuple[Device, grpc.aio.Channel]) -> None:
    case = CASES[name]
    device, emb_channel = in_process_target
    with bmv2_switch(case.ports) as sw:
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
            assert not mismatches, mismatches
            assert await case.state(ce, schema(name)) == await case.state(cb, schema(name))
