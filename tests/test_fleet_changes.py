"""Changing and removing DPUs of a running fleet: a DPU changed in place is programmed at its new
address and let go at its old one; a deleted DPU is let go (its lease then lapses on its own)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conftest import register, serve_in_process
from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from p4sim.server import Device, P4RuntimeService

pytestmark = pytest.mark.timeout(120)


def controllers(device: Device) -> int:
    """How many controller streams the target holds open."""
    return sum(len(s.streams) for s in device.listeners if isinstance(s, P4RuntimeService))


async def until(check: object, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_dpu_changed_in_place_then_deleted(tmp_path: Path) -> None:
    (old, old_server, old_addr), (new, new_server, new_addr) = await serve_in_process(), await serve_in_process()
    plane = ControlPlane(tmp_path / "state.db", "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "dpu-a", old_addr)
            await c.set_pod_cap("a", 1e9, 1e9, 60.0)
            await c.wait_converged(timeout=30)
            assert old.pipeline is not None and controllers(old) == 1
            dpu = (await c.stub.ListDpus(pb.ListDpusRequest())).dpus[0]
            dpu.p4runtime_address = new_addr
            written = await c.stub.Apply(pb.ApplyRequest(dpus=[dpu]))
            assert [(ch.verb, ch.kind, ch.name) for ch in written.changes] == [("update", "dpu", "dpu-a")]
            assert old_addr in written.changes[0].before and new_addr in written.changes[0].after
            await c.wait_converged(timeout=30)
            assert new.pipeline is not None and controllers(new) == 1
            await until(lambda: controllers(old) == 0)
            written = await c.stub.Delete(pb.DeleteRequest(dpus=["dpu-a"]))
            assert [(ch.verb, ch.name) for ch in written.changes] == [("delete", "dpu-a")]
            await until(lambda: controllers(new) == 0)
            assert not (await c.status()).dpus and "dpu-a" not in plane.service.agents
            # The pod and its cap stay; a DPU registered again under the old name is programmed afresh.
            await register(c, "dpu-a", old_addr)
            await c.wait_converged(timeout=30)
            assert controllers(old) == 1
    finally:
        await plane.stop()
        await old_server.stop(grace=0)
        await new_server.stop(grace=0)
