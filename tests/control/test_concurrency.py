"""How many DPUs the control plane works on at once: bounded, in turn, and never held up by a slow DPU.

Real gRPC on loopback to embedded targets in this process, whose P4Runtime service counts the
calls it is serving at once and can be made to answer late (a slow DPU)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from finsy.proto import p4r, p4r_grpc

from dpu_limiter.client import LimiterClient
from dpu_limiter.reconciler import Concurrency
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT
from dpu_softswitch.server import Device, P4RuntimeService
from helpers.planes import node_pod, register
from helpers.processes import free_port

pytestmark = pytest.mark.timeout(120)


class Counted(P4RuntimeService):
    """The embedded target's P4Runtime, counting concurrent Writes and pipeline pushes across devices."""

    def __init__(self, device: Device, tally: dict[str, int], delay_s: float, install_s: float) -> None:
        super().__init__(device)
        self.tally = tally
        self.delay_s = delay_s  # before answering each Write
        self.install_s = install_s  # before answering each pipeline push

    async def _counted(self, kind: str, call: Callable[[], Awaitable[Any]]) -> Any:
        self.tally[kind] = self.tally.get(kind, 0) + 1
        self.tally[f"max {kind}"] = max(self.tally.get(f"max {kind}", 0), self.tally[kind])
        try:
            await asyncio.sleep(self.delay_s if kind == "write" else self.install_s)
            return await call()
        finally:
            self.tally[kind] -= 1

    async def Write(self, request: p4r.WriteRequest, context: Any) -> p4r.WriteResponse:  # noqa: N802
        """Counted, after `delay_s`."""
        return await self._counted("write", lambda: super(Counted, self).Write(request, context))

    async def SetForwardingPipelineConfig(  # noqa: N802
        self, request: p4r.SetForwardingPipelineConfigRequest, context: Any
    ) -> p4r.SetForwardingPipelineConfigResponse:
        """Counted."""
        return await self._counted(
            "install", lambda: super(Counted, self).SetForwardingPipelineConfig(request, context)
        )


async def serve(
    tally: dict[str, int], delay_s: float = 0.05, install_s: float = 0.05
) -> tuple[Device, grpc.aio.Server, str]:
    """An embedded target on loopback whose service is Counted."""
    device = Device(1, cpu_port=CPU_PORT)
    server = grpc.aio.server()
    p4r_grpc.add_P4RuntimeServicer_to_server(Counted(device, tally, delay_s, install_s), server)  # type: ignore[no-untyped-call]
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return device, server, f"127.0.0.1:{port}"


@pytest.fixture
async def servers() -> AsyncIterator[list[grpc.aio.Server]]:
    """The servers a test starts, all stopped afterwards."""
    started: list[grpc.aio.Server] = []
    yield started
    for server in started:
        await server.stop(grace=0)


async def test_at_most_the_set_number_of_dpus_are_worked_on_at_once(db: str, servers: list[grpc.aio.Server]) -> None:
    tally: dict[str, int] = {}
    # Pushes take a second, so that every DPU has connected while the first ones are under way.
    served = [await serve(tally, install_s=1.0) for _ in range(6)]
    servers += [s for _, s, _ in served]
    plane = ControlPlane(db, settings=Settings(concurrency=Concurrency(installs=2, reconciles=3)))
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await node_pod(c, [addr for _, _, addr in served], "dpu-")
            await c.set_pod_cap("a", 60e6, 60e6, 1.0, 600_000)
            assert await c.wait_converged(timeout=60)
            await c.set_pod_cap("a", 30e6, 30e6, 1.0, 600_000)  # every DPU writes again
            assert await c.wait_converged(timeout=60)
    finally:
        await plane.stop()
    assert all(d.pipeline is not None for d, _, _ in served)
    assert tally["max install"] == 2 and 2 <= tally["max write"] <= 3, tally


async def test_a_slow_dpu_does_not_delay_the_others(db: str, servers: list[grpc.aio.Server]) -> None:
    tally: dict[str, int] = {}
    # dpu-slow answers every Write after 30 s: past finsy's 10 s deadline, so each of its tries holds a
    # slot for 10 s. With two slots, the others take turns in the second.
    slow = await serve(tally, delay_s=30.0)
    fast = [await serve(tally) for _ in range(4)]
    servers += [s for _, s, _ in [slow, *fast]]
    plane = ControlPlane(db, settings=Settings(concurrency=Concurrency(installs=2, reconciles=2)))
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("slow", ["10.0.9.0/24"])
            await register(c, "dpu-slow", slow[2], pod="slow")
            await c.set_pod_cap("slow", 10e6, 10e6, 1.0, 100_000)
            await asyncio.sleep(1.0)  # dpu-slow is connected and holds its slot, waiting for its Write
            assert tally.get("write") == 1
            await node_pod(c, [addr for _, _, addr in fast], "dpu-b", pod="b", prefix="10.0.2.0/24")
            t0 = asyncio.get_running_loop().time()
            await c.set_pod_cap("b", 40e6, 40e6, 1.0, 400_000)
            service = plane.service
            # b's shares granted and confirmed by each of its DPUs (the whole fleet's wait would wait for dpu-slow).
            await asyncio.wait_for(service.settle("b"), 8.0)
            took = asyncio.get_running_loop().time() - t0
            assert all(service.agents[f"dpu-b{i}"].status.converged for i in range(len(fast)))
            assert not service.agents["dpu-slow"].status.converged
    finally:
        await plane.stop()
    assert took < 8.0  # well inside dpu-slow's 10 s deadline: nobody waited for it
    for d, _, _ in fast:
        assert d.pipeline is not None
        cfg = d.pipeline.program.meters["LimiterIngress.boundary_meter"].get_p4runtime_config(0)
        assert cfg is not None and cfg[0] > 0  # holds its share of b's cap
