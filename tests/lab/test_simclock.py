"""The control plane on the simulation's clock (dpu_lab.simclock): its timers fire only when the simulation moves
time past them, and its own loops (lease renewals) run on it, with `quiet` saying when it has done what they
started."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from dpu_lab.simclock import SimClock
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT
from dpu_softswitch.clock import VirtualClock
from dpu_softswitch.server import Device, add_to_server
from helpers.planes import register

pytestmark = pytest.mark.timeout(120)


async def test_timers_fire_only_when_the_simulation_moves_past_them() -> None:
    clock = SimClock(epoch=1000.0)
    woke: list[float] = []

    async def sleeper(s: float) -> None:
        await clock.sleep(s)
        woke.append(clock.monotonic())

    tasks = [asyncio.create_task(sleeper(s)) for s in (2.0, 0.5, 1.0)]
    cancelled = clock.call_later(0.7, lambda: woke.append(-1.0))
    cancelled.cancel()
    await asyncio.sleep(0.05)  # wall time passes: nothing is due on the simulation's clock
    assert woke == [] and clock.next_due() == 0.5 and clock.time() == 1000.0
    assert clock.advance(1.0) == 2  # the sleeps of 0.5 and 1.0, in time order; not the cancelled callback
    await asyncio.sleep(0)
    assert woke == [1.0, 1.0] and clock.next_due() == 2.0
    clock.advance(0.5)  # never back
    assert clock.monotonic() == 1.0
    clock.advance(2.0)
    await asyncio.gather(*tasks)
    assert woke == [1.0, 1.0, 2.0] and clock.time() == 1002.0 and clock.next_due() is None


async def test_a_timeout_on_the_simulations_clock() -> None:
    clock = SimClock()
    never = asyncio.Event()

    async def waits() -> str:
        try:
            async with clock.timeout(3.0):
                await never.wait()
        except TimeoutError:
            return f"timed out at {clock.monotonic():g}"
        return "woken"

    task = asyncio.create_task(waits())
    await asyncio.sleep(0.05)
    clock.advance(2.9)
    await asyncio.sleep(0.05)
    assert not task.done()
    clock.advance(3.0)
    assert await task == "timed out at 3"
    assert clock.next_due() is None

    task = asyncio.create_task(waits())  # a block that ends first leaves no timer behind
    await asyncio.sleep(0)
    never.set()
    assert await task == "woken" and clock.next_due() is None


@contextlib.asynccontextmanager
async def dpu_on(clock: VirtualClock) -> AsyncIterator[str]:
    device = Device(1, clock, cpu_port=CPU_PORT)
    server = grpc.aio.server()
    add_to_server(server, device)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=0)


async def test_the_control_plane_renews_leases_on_the_clock_it_is_given(tmp_path: Path) -> None:
    """Lease renewals every third of a lease of simulated time, whatever the wall clock does; `quiet` returns
    once the renewal is on the DPU."""
    clock = SimClock()
    lease_s = 30.0
    async with dpu_on(VirtualClock()) as address:
        plane = ControlPlane(tmp_path / "s.db", "127.0.0.1:0", Settings(lease_s=lease_s, clock=clock))
        await plane.start()
        try:
            async with LimiterClient(plane.address) as c:
                await c.apply_pod("a", ["10.0.1.0/24"])
                await register(c, "dpu-a", address)
                await c.set_pod_cap("a", 8e6, 8e6, 2.0, 100_000)
                await c.wait_converged(timeout=30)
                assert await plane.quiet()
                first = (await c.status()).dpus[0]
                assert first.lease_state == "held"
                await asyncio.sleep(0.5)  # wall time: no renewal
                assert (await c.status()).dpus[0].lease_generation == first.lease_generation
                assert 0 < (clock.next_due() or 0) <= lease_s / 3  # the lease loop, and the others
                for k in (1, 2, 3):
                    clock.advance(k * lease_s / 3)
                    assert await plane.quiet()
                    now = (await c.status()).dpus[0]
                    assert now.lease_state == "held" and now.lease_generation == first.lease_generation + k
                    assert now.lease_age_s == 0.0  # issued at this simulated instant, and none has passed
        finally:
            await plane.stop()
