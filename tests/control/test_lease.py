"""Leases: metered traffic crosses only while the DPU holds a lease the control plane keeps renewing.
A lease ends at a deadline on the DPU's own clock, which the control plane reads through a clock
echo (limiter.p4): when the control plane is gone for longer than the lease, the DPU falls to its
floor by itself, idle or not, and comes back when a control plane renews it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from finsy.proto import p4r

from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT
from dpu_softswitch.clock import VirtualClock
from dpu_softswitch.externs import Clock
from dpu_softswitch.server import Device, add_to_server
from helpers.p4rt import A_HOST, B_HOST, lease_entry, schema, udp
from helpers.planes import register

pytestmark = pytest.mark.timeout(120)

OUT = udp(A_HOST, B_HOST)  # pod a to pod b: metered egress, port 0 -> 1


@contextlib.asynccontextmanager
async def dpu(clock: Clock) -> AsyncIterator[tuple[Device, str]]:
    """An in-process embedded target on `clock`, served on loopback."""
    device = Device(1, clock, cpu_port=CPU_PORT)
    server = grpc.aio.server()
    add_to_server(server, device)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield device, f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=0)


@contextlib.asynccontextmanager
async def plane_for(
    db: Path, addr: str, lease_s: float, loop: bool
) -> AsyncIterator[tuple[ControlPlane, LimiterClient]]:
    """A control plane (state in `db`) holding pod a capped, converged on the DPU at `addr`."""
    plane = ControlPlane(db, "127.0.0.1:0", settings=Settings(lease_s=lease_s, lease_loop=loop))
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            if not (await c.status()).dpus:
                await c.apply_pod("a", ["10.0.1.0/24"])
                await register(c, "dpu-a", addr)
                await c.set_pod_cap("a", 8e9, 8e9, 1.0, 10_000_000)  # far above what the test sends
            await c.wait_converged(timeout=30)
            yield plane, c
    finally:
        await plane.stop()


def passes(device: Device) -> bool:
    return device.process(0, OUT) == [(1, OUT)]


async def lease_bytes(c: LimiterClient) -> int:
    usage = {u.direction: u for u in (await c.usage("a")).usage}
    return usage["egress"].lease_bytes


def deadline(device: Device) -> int:
    """The deadline of the lease the DPU holds, on its own clock (us)."""
    assert device.pipeline is not None
    read = lease_entry(schema(), 0, 0)
    [entity] = device.pipeline.read(read)
    [param] = [p for p in entity.table_entry.action.action.params if p.param_id == 2]  # lease(gen, deadline)
    return int.from_bytes(param.value, "big")


async def test_a_lease_ends_at_its_deadline_on_the_dpus_clock_and_renewal_moves_it(db: str) -> None:
    # The DPU's clock is virtual: it stands still while the control plane reads it and writes the lease.
    clock = VirtualClock()
    clock.us = 7_000_000
    async with dpu(clock) as (device, addr), plane_for(db, addr, 2.0, False) as (plane, c):
        # Issued when the control plane started and placed on the DPU's clock when it connected: the
        # deadline is the issue plus 2 s, less however long connecting took, and never later.
        end = deadline(device)
        assert 7_000_000 < end <= 9_000_000
        clock.us = end - 1
        assert passes(device)
        # Nobody renewed it (as if the control plane were gone): the pipeline drops and counts.
        clock.us = end
        assert not passes(device)
        assert await lease_bytes(c) == len(OUT)
        # A renewal: a new generation, issued now, ending 2 s from now on the DPU's clock.
        service = plane.service
        tickets = service.renew_leases()
        assert await service.agents["dpu-a"].wait_applied(tickets["dpu-a"], 30)
        renewed = deadline(device)
        assert end < renewed <= end + 2_000_000
        clock.us = renewed - 1
        assert passes(device)
        clock.us = renewed
        assert not passes(device)


async def test_an_idle_dpus_lease_ends_at_its_deadline_however_late_its_first_packet(db: str) -> None:
    # No packet crosses until long after the lease was written: the lease does not start with the
    # first packet (an idle DPU cut off from the control plane would keep its old share forever).
    clock = VirtualClock()
    async with dpu(clock) as (device, addr), plane_for(db, addr, 2.0, False) as (_, c):
        clock.us = deadline(device)
        assert not passes(device)
        clock.us += 60_000_000
        assert not passes(device)
        assert await lease_bytes(c) == 2 * len(OUT)


async def test_the_control_plane_gone_past_its_lease_leaves_the_floor(db: str) -> None:
    async with dpu(Clock()) as (device, addr):
        # Real time, the renewal loop on: traffic crosses for as long as the control plane runs.
        async with plane_for(db, addr, lease_s=1.5, loop=True) as (_, _c):
            for _ in range(6):
                assert passes(device)
                await asyncio.sleep(0.5)
        # The control plane is gone (killed, or cut off): its last lease was issued before it went,
        # and ends 1.5 s after that on the DPU's clock, whether or not a packet used it.
        await asyncio.sleep(1.6)
        assert not passes(device)
        assert not passes(device)
        # A control plane comes back with the same state: a new lease, traffic again.
        async with plane_for(db, addr, lease_s=1.5, loop=True) as (_, c):
            assert passes(device)
            assert await lease_bytes(c) >= 2 * len(OUT)


async def test_a_held_lease_is_not_rewritten_and_a_changed_one_is_drift(db: str) -> None:
    async with dpu(VirtualClock()) as (device, addr), plane_for(db, addr, 2.0, False) as (plane, _):
        agent = plane.service.agents["dpu-a"]
        assert await agent.wait_applied(agent.poke(), 30)
        assert agent.status.drift_corrections == 0  # read back as written: nothing to correct
        # Someone shortens the lease behind the control plane's back: read-back restores it.
        assert device.pipeline is not None
        short = lease_entry(schema(), plane.service.lease_gen, 1)
        device.pipeline.write(p4r.Update(type=p4r.Update.MODIFY, entity=short))
        assert await agent.wait_applied(agent.poke(), 30)
        assert agent.status.drift_corrections == 1 and "1 leases written" in agent.status.last_drift


async def test_status_shows_each_dpus_lease_and_when_it_lapses(db: str) -> None:
    from helpers.processes import cli

    device = Device(1, cpu_port=CPU_PORT)
    server = grpc.aio.server()
    add_to_server(server, device)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with plane_for(db, f"127.0.0.1:{port}", 1.5, True) as (plane, c):
            # Renewals come every half second, each with a clock echo and a write: on a busy machine a
            # status may fall between a renewal and its read-back ("renewing"), so look a few times.
            for _ in range(100):
                st = (await c.status()).dpus[0]
                if st.lease_state == "held":
                    break
                await asyncio.sleep(0.05)
            assert st.lease_state == "held" and 0 <= plane.service.lease_gen - st.lease_generation <= 1
            assert 0 <= st.lease_age_s < st.lease_lifetime_s == 1.5
            # A later renewal: the DPU confirms the new generation, and holds it.
            renewed = plane.service.lease_gen + 1
            for _ in range(100):
                st = (await c.status()).dpus[0]
                if st.lease_generation >= renewed and st.lease_state == "held":
                    break
                await asyncio.sleep(0.05)
            assert st.lease_state == "held" and st.lease_generation >= renewed
            table = await asyncio.to_thread(cli, "status", "--server", plane.address)
            assert "held (" in table.stdout, table.stdout
            # The DPU goes away: no renewal is confirmed any more, and one lifetime after the last
            # confirmed one was issued, its lease reads lapsed.
            await server.stop(grace=0)
            seen = []
            for _ in range(60):
                seen.append((await c.status()).dpus[0].lease_state)
                if seen[-1] == "lapsed":
                    break
                await asyncio.sleep(0.05)
            assert seen[-1] == "lapsed" and set(seen) <= {"held", "renewing", "lapsed"}, seen
    finally:
        await server.stop(grace=0)
