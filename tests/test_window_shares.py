"""Window mode: a share that moves between a pod's DPUs moves only once what its old holder passed has
aged out of the window.

Each DPU's window budget counts only its own bytes (limiter.p4's slot counters). When a node leaves the
pod, or its budget shrinks, the bytes it passed in the last window still count against the pod's, yet no
other DPU's counters hold them: a DPU that grew at once could spend the whole budget again within the
same window (a red team passed 7,477,500 B in a 10 s window against 5,000,000, deleting a node that had
spent its half). So the others grow one window after the shrink took effect: after the holder confirmed
it (or was floored), or, cut off, after its lease ended.

Real gRPC on loopback: a control plane and embedded targets in this process.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import finsy as fy
import pytest

from conftest import register, serve_in_process
from dpu_limiter import dataplane as dp
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane

pytestmark = pytest.mark.timeout(120)

SCHEMA = fy.P4Schema(dp.limiter_program().p4info, dp.limiter_program().bmv2_json.read_bytes())
W = 3.0  # the cap's window
MARGIN_S = 3.0  # a reconcile's Write and read-back, and the test's sampling, on a loaded machine


def budget(device: object) -> int:
    """The egress window budget a DPU holds now (0: none)."""
    pipeline = getattr(device, "pipeline", None)
    if pipeline is None:
        return 0
    read = fy.P4TableEntry(dp.TABLE_WINDOW).encode(SCHEMA)
    for entity in pipeline.read(read):
        te = entity.table_entry
        if int.from_bytes(te.match[0].exact.value, "big") == dp.CELLS["egress"]:
            return int.from_bytes(te.action.action.params[0].value, "big")
    return 0


async def until_grown(device: object, above: int, timeout: float) -> float:
    """When `device`'s budget first exceeded `above` (waiting up to `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if budget(device) > above:
            return time.monotonic()
        await asyncio.sleep(0.01)
    raise AssertionError(f"budget never grew past {above}: {budget(device)}")


@pytest.mark.parametrize("cut_off", [False, True], ids=["floored", "cut-off"])
async def test_a_node_that_leaves_frees_its_budget_one_window_later(tmp_path: Path, cut_off: bool) -> None:
    lease_s = 2.0
    (stay, stay_server, stay_addr), (leave, leave_server, leave_addr) = (
        await serve_in_process(),
        await serve_in_process(),
    )
    plane = ControlPlane(tmp_path / "s.db", "127.0.0.1:0", lease_s=lease_s)
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "stay", stay_addr, node=True)
            await register(c, "leave", leave_addr, node=True)
            await c.set_pod_cap("a", 8e6, 8e6, W, mode="window")
            await c.wait_converged(timeout=30)
            half = budget(stay)
            assert half > 0 and budget(leave) == half
            if cut_off:
                await leave_server.stop(grace=0)
            left = time.monotonic()
            await c.delete(dpus=["leave"])
            grown = await until_grown(stay, half, timeout=lease_s + W + 10)
    finally:
        await plane.stop()
        for server in (stay_server, leave_server):
            await server.stop(grace=0)
    # Never before the leaver's bytes have aged out of the window (its lease ended first, if cut off)...
    earliest = left + W + (lease_s if cut_off else 0.0)
    assert grown >= earliest
    # ...and not much later.
    assert grown <= earliest + MARGIN_S
