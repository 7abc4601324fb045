"""Control planes and embedded targets in the test's own process, wired as the tests wire them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Dpu, Role
from dpu_limiter.server import ControlPlane
from dpu_limiter.units import CPU_PORT
from dpu_softswitch.server import Device, add_to_server
from helpers.processes import free_port


async def register(
    client: LimiterClient, name: str, address: str, pod: str = "a", node: bool = False, buffer_bytes: int = 0
) -> None:
    """Register a DPU through the API as the tests wire it: host port 0, uplink port 1."""
    role = Role.NODE if node else Role.POD_UPLINK
    await client.register_dpu(Dpu(name, address, 1, pod, role, host_port=0, uplink_port=1, buffer_bytes=buffer_bytes))


async def node_pod(
    client: LimiterClient, addresses: list[str], name: str, pod: str = "a", prefix: str = "10.0.1.0/24"
) -> None:
    """Pod `pod` (holding `prefix`) with a node DPU at each address, named `name`0, `name`1, ..."""
    await client.apply_pod(pod, [prefix])
    for i, addr in enumerate(addresses):
        await register(client, f"{name}{i}", addr, pod=pod, node=True)


InProcess = tuple[Device, grpc.aio.Channel]


async def serve_in_process(cpu_port: int | None = CPU_PORT) -> tuple[Device, grpc.aio.Server, str]:
    """The embedded target in this process (frames go in through Device.process), served on loopback;
    by default with its CPU port where limiter.p4 reads the clock."""
    device = Device(1, cpu_port=cpu_port)
    server = grpc.aio.server()
    add_to_server(server, device)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return device, server, f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def plane_with_pod(db: Path | str) -> AsyncIterator[tuple[ControlPlane, LimiterClient]]:
    """A control plane on loopback (its state in `db`: a SQLite file or a postgresql:// URL) and a client of it,
    with pod a (10.0.1.0/24)."""
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            yield plane, c
    finally:
        await plane.stop()


@contextlib.asynccontextmanager
async def programmed_target(
    db: Path | str, cap: tuple[float, float, float, int], buffer_bytes: int = 0
) -> AsyncIterator[tuple[Device, ControlPlane, LimiterClient]]:
    """A control plane on loopback (its state in `db`) holding pod a (10.0.1.0/24) with `cap`, converged on an
    in-process embedded target registered as dpu-a."""
    device, server, addr = await serve_in_process()
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "dpu-a", addr, buffer_bytes=buffer_bytes)
            await c.set_pod_cap("a", *cap)
            await c.wait_converged(timeout=30)
            assert device.pipeline is not None
            yield device, plane, c
    finally:
        await plane.stop()
        await server.stop(grace=0)
