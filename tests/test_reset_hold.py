"""A DPU that comes back with its state lost (power-cycled: no pipeline, so fresh meters and empty window
slots) gets no lease until what it passed before can no longer share a window with what it passes after.

The attack (docs/limitations.md, found by a red team): spend a window-mode pod's whole budget, power-cycle
its DPU, and spend a second one at once, 2x the cap in one window. Real gRPC on loopback: a control plane and
an embedded target in this process, power-cycled by serving a fresh device on the same port; frames pushed
through the device's packet path and timed as they cross.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import finsy as fy
import grpc
import pytest
from finsy.proto import p4r_grpc

from conftest import register
from dpu_limiter import dataplane as dp
from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Pod, Role
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT, MAX_FRAME_BYTES
from p4rt_helpers import A_HOST, B_HOST, udp
from p4sim.firmware import clone
from p4sim.server import Device, P4RuntimeService

pytestmark = pytest.mark.timeout(180)

OUT = udp(A_HOST, B_HOST)  # pod a to pod b: metered egress, port 0 -> 1
# Longer than finsy takes to connect again after a failed attempt (10 s): a shorter window would have aged
# out before the power-cycled DPU could pass anything, with or without the hold.
WINDOW_S = 12.0
RATE_BPS = 1e6  # 1,500,000 bytes per window


async def serve(port: int = 0) -> tuple[Device, grpc.aio.Server, int]:
    """A fresh embedded target (no pipeline, its clock at zero) on loopback."""
    device = Device(1, cpu_port=CPU_PORT)
    server = grpc.aio.server()
    p4r_grpc.add_P4RuntimeServicer_to_server(P4RuntimeService(device), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return device, server, port


async def spend(device: Device, crossed: list[float], deadline: float, idle_s: float = 0.0) -> None:
    """Push pod a's frames through `device` every 2 ms, noting when each crossed: until `deadline`
    (monotonic), or with `idle_s`, until none has crossed for that long once one has."""
    while (now := time.monotonic()) < deadline and not (idle_s and crossed and now - crossed[-1] > idle_s):
        if device.pipeline is not None and device.process(0, OUT) == [(1, OUT)]:
            crossed.append(time.monotonic())
        await asyncio.sleep(0.002)


@contextlib.asynccontextmanager
async def window_capped(tmp_path: Path, port: int) -> AsyncIterator[LimiterClient]:
    """A control plane with pod a capped in window mode (RATE_BPS x WINDOW_S), its DPU at `port` converged."""
    plane = ControlPlane(tmp_path / "s.db", settings=Settings(lease_s=1.5))
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "dpu-a", f"127.0.0.1:{port}")
            await c.set_pod_cap("a", RATE_BPS, RATE_BPS, WINDOW_S, mode="window")
            assert await c.wait_converged(timeout=30)
            yield c
    finally:
        await plane.stop()


async def offer_for_a_window(device: Device, crossed: list[float], since: int, limit_s: float) -> None:
    """Offer frames through `device` until those after crossed[since] have passed for a window, or for `limit_s`."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and passing_for(crossed[since:]) <= WINDOW_S:
        await spend(device, crossed, min(deadline, time.monotonic() + 1.0))


def passing_for(times: list[float]) -> float:
    """Seconds from the first frame that crossed to the last (0 with none)."""
    return times[-1] - times[0] if times else 0.0


def most_in_a_window(times: list[float], window_s: float) -> int:
    """The most frames that crossed within any `window_s`."""
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window_s:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


@pytest.mark.parametrize(
    ("preloaded", "moved"),
    [(False, False), (True, False), ("restored", False), ("restored-armed", False), (False, True)],
    ids=["empty", "program-kept", "tables-restored", "tables-restored-armed-by-another", "moved-to-a-new-pod"],
)
async def test_a_power_cycled_window_mode_dpu_cannot_spend_a_second_budget_in_one_window(
    tmp_path: Path, preloaded: bool | str, moved: bool
) -> None:
    """Power-cycled, the DPU comes back empty (the agent loads the pipeline), or with its program kept
    (as firmware that loads it from flash would: same cookie, nothing to load, its tables and registers
    empty all the same), or with its program and every table entry and meter restored, the lease among
    them (a third red team: valid on the restarted clock, it passed traffic until the agent reconnected;
    only the registers, the window slots and the lease epoch, start afresh); or so restored, its lease epoch
    armed by a clock echo before the agent's (a fourth red team: another control plane's, or the agent's own
    whose reply was lost: the agent found it armed and took it for the instance it had leased); or, while
    it is down, it is deleted with its pod and registered again under a new name in a new pod over the same
    hosts (a second red team's way around the first fix)."""
    device, server, port = await serve()
    try:
        async with window_capped(tmp_path, port) as c:
            crossed: list[float] = []
            # Spend the whole budget (the frames stop crossing), then power-cycle the DPU at once.
            await spend(device, crossed, time.monotonic() + 20, idle_s=0.5)
            spent = len(crossed)
            assert spent * len(OUT) > 0.9 * RATE_BPS / 8 * WINDOW_S - MAX_FRAME_BYTES
            old = device.pipeline
            await server.stop(grace=0)
            if moved:
                await c.delete(dpus=["dpu-a"], pods=["a"])
                await c.apply_pod("a2", ["10.0.1.0/24"])
                await register(c, "dpu-b", f"127.0.0.1:{port}", pod="a2")
                await c.set_pod_cap("a2", RATE_BPS, RATE_BPS, WINDOW_S, mode="window")
            fresh, server, _ = await serve(port)
            if preloaded in ("restored", "restored-armed"):
                assert old is not None
                fresh.pipeline = clone(fresh, old, registers=False)  # on the fresh device's clock
                if preloaded == "restored-armed":
                    # limiter.p4's clock echo as a PacketOut enters: its header (nonce, arm) on the CPU port.
                    echo = (1).to_bytes(8, "big") + (0x5EED).to_bytes(8, "big")
                    assert fresh.process(CPU_PORT, echo) == []  # back to the CPU port, as a PacketIn nobody reads
            elif preloaded:
                program = dp.limiter_program()
                config = fy.P4Schema(program.p4info, program.bmv2_json.read_bytes()).get_pipeline_config()
                fresh.pipeline = fresh.build_pipeline(config)
            await offer_for_a_window(fresh, crossed, spent, 60)
    finally:
        await server.stop(grace=0)
    after = crossed[spent:]
    assert after, "the power-cycled DPU never passed metered traffic again"
    # Never more than one budget (and one frame) in any window, across the power cycle.
    budget_frames = int(RATE_BPS / 8 * WINDOW_S) // len(OUT)
    assert most_in_a_window(crossed, WINDOW_S) <= budget_frames + 1
    assert after[0] - crossed[spent - 1] >= WINDOW_S


async def test_shortening_a_window_does_not_forget_what_the_longer_one_counted(tmp_path: Path) -> None:
    """The slot counters' tags depend on the window's length, so a changed window starts counting afresh
    (a red team: 14,967,000 B in 20 s against 10,000,000). Spend the budget of a 12 s window, shorten it to
    6 s at the same rate: nothing passes until no 12 s window holds bytes from both sides of the change."""
    device, server, port = await serve()
    crossed: list[float] = []
    try:
        async with window_capped(tmp_path, port) as c:
            await spend(device, crossed, time.monotonic() + 20, idle_s=0.5)
            spent = len(crossed)
            await c.set_pod_cap("a", RATE_BPS, RATE_BPS, WINDOW_S / 2, mode="window")
            await offer_for_a_window(device, crossed, spent, 40)
    finally:
        await server.stop(grace=0)
    after = crossed[spent:]
    assert after, "the DPU never passed metered traffic under the shorter window"
    budget_frames = int(RATE_BPS / 8 * WINDOW_S) // len(OUT)
    assert most_in_a_window(crossed, WINDOW_S) <= budget_frames + 1
    assert most_in_a_window(after, WINDOW_S / 2) <= budget_frames // 2 + 1


def test_the_hold_after_a_reset_is_the_window_or_the_time_a_bucket_takes_to_fill() -> None:
    dpu = Dpu("d", "127.0.0.1:1", 1, "a", Role.POD_UPLINK, 0, 1)
    pod = Pod("a", ("10.0.1.0/24",))
    window = dp.intent_for(dpu, pod, Cap(RATE_BPS, RATE_BPS, 60.0, mode="window"))
    assert 60.0 <= dp.hold_after_reset_s(window) < 60.1
    rate = dp.intent_for(dpu, pod, Cap(8e6, 8e6, 1.0, 400_000))
    # The data meter's bucket (400,000 bytes less ARP's 600) at 1,000,000 B/s less ARP's 1,000: ~0.4 s;
    # ARP's own 600 bytes at 1,000 B/s: 0.6 s.
    assert dp.hold_after_reset_s(rate) == pytest.approx(0.6, abs=0.01)
    assert dp.hold_after_reset_s(dp.intent_for(dpu, pod, None)) == 0.0  # the floor passes nothing
