"""Leases: metered traffic crosses only while the DPU holds a lease the control plane keeps renewing.
When the control plane is gone for longer than the lease, the DPU falls to its floor by itself (its
pipeline checks the time), and comes back when a control plane renews it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from finsy.proto import p4r

from conftest import register
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from p4rt_helpers import A_HOST, B_HOST, lease_entry, schema, udp
from p4sim.clock import VirtualClock
from p4sim.externs import Clock
from p4sim.server import Device, add_to_server

pytestmark = pytest.mark.timeout(120)

OUT = udp(A_HOST, B_HOST)  # pod a to pod b: metered egress, port 0 -> 1


@contextlib.asynccontextmanager
async def dpu(clock: Clock) -> AsyncIterator[tuple[Device, str]]:
    """An in-process embedded target on `clock`, served on loopback."""
    device = Device(1, clock)
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
    plane = ControlPlane(db, "127.0.0.1:0", lease_s=lease_s, lease_loop=loop)
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


async def test_a_lease_lapses_in_the_data_plane_and_renewal_brings_it_back(tmp_path: Path) -> None:
    clock = VirtualClock()
    async with dpu(clock) as (device, addr), plane_for(tmp_path / "state.db", addr, 2.0, False) as (plane, c):
        clock.us = 500_000
        assert passes(device)  # the first packet latches the lease: valid until 2.5 s
        clock.us = 2_499_000
        assert passes(device)
        # Nobody renewed it (as if the control plane were gone): the pipeline drops and counts.
        clock.us = 2_500_000
        assert not passes(device)
        assert await lease_bytes(c) == len(OUT)
        # A renewal: a new generation, latched by the next packet.
        service = plane.service
        tickets = service.renew_leases()
        assert await service.agents["dpu-a"].wait_applied(tickets["dpu-a"], 30)
        clock.us = 2_600_000
        assert passes(device)
        clock.us = 4_599_000
        assert passes(device)
        clock.us = 4_600_000
        assert not passes(device)


async def test_the_control_plane_gone_past_its_lease_leaves_the_floor(tmp_path: Path) -> None:
    async with dpu(Clock()) as (device, addr):
        # Real time, the renewal loop on: traffic crosses for as long as the control plane runs.
        async with plane_for(tmp_path / "state.db", addr, lease_s=1.5, loop=True) as (_, _c):
            for _ in range(6):
                assert passes(device)
                await asyncio.sleep(0.5)
        # The control plane is gone (killed, or cut off). Its last renewal may not have been seen by a
        # packet yet: the next packet latches it, and one lease later the DPU lets nothing out.
        passes(device)
        await asyncio.sleep(1.6)
        assert not passes(device)
        assert not passes(device)
        # A control plane comes back with the same state: a new lease, traffic again.
        async with plane_for(tmp_path / "state.db", addr, lease_s=1.5, loop=True) as (_, c):
            assert passes(device)
            assert await lease_bytes(c) >= 2 * len(OUT)


async def test_a_held_lease_is_not_rewritten_and_a_changed_one_is_drift(tmp_path: Path) -> None:
    async with dpu(VirtualClock()) as (device, addr), plane_for(tmp_path / "state.db", addr, 2.0, False) as (plane, _):
        agent = plane.service.agents["dpu-a"]
        assert await agent.wait_applied(agent.poke(), 30)
        assert agent.status.drift_corrections == 0  # read back as written: nothing to correct
        # Someone shortens the lease behind the control plane's back: read-back restores it.
        assert device.pipeline is not None
        short = lease_entry(schema(), plane.service.lease_gen, 1)
        device.pipeline.write(p4r.Update(type=p4r.Update.MODIFY, entity=short))
        assert await agent.wait_applied(agent.poke(), 30)
        assert agent.status.drift_corrections == 1 and "1 leases written" in agent.status.last_drift


async def test_status_shows_each_dpus_lease_and_when_it_lapses(tmp_path: Path) -> None:
    from conftest import cli

    device = Device(1)
    server = grpc.aio.server()
    add_to_server(server, device)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with plane_for(tmp_path / "s.db", f"127.0.0.1:{port}", 1.5, True) as (plane, c):
            st = (await c.status()).dpus[0]
            assert st.lease_state == "held" and st.lease_generation == plane.service.lease_gen
            assert 0 <= st.lease_age_s < st.lease_lifetime_s == 1.5
            # The next renewal (every half second): the DPU confirms the new generation, and holds it.
            renewed = plane.service.lease_gen + 1
            for _ in range(40):
                st = (await c.status()).dpus[0]
                if st.lease_generation == renewed:
                    break
                await asyncio.sleep(0.05)
            assert st.lease_state == "held" and st.lease_generation == renewed
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
