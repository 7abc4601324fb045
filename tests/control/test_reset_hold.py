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

from dpu_limiter import dataplane as dp
from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Pod, Role
from dpu_limiter.reconciler import ELECTION_ID
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT, MAX_FRAME_BYTES, allowed_window_bytes, default_burst_bytes
from dpu_softswitch.externs import Clock
from dpu_softswitch.firmware import clone
from dpu_softswitch.server import Device, P4RuntimeService
from helpers.p4rt import A_HOST, B_HOST, udp
from helpers.planes import register

pytestmark = pytest.mark.timeout(180)

OUT = udp(A_HOST, B_HOST)  # pod a to pod b: metered egress, port 0 -> 1
# Longer than finsy takes to connect again after a failed attempt (10 s): a shorter window would have aged
# out before the power-cycled DPU could pass anything, with or without the hold.
WINDOW_S = 12.0
RATE_BPS = 1e6  # 1,500,000 bytes per window


async def serve(port: int = 0, running_s: float = 0.0) -> tuple[Device, grpc.aio.Server, int]:
    """A fresh embedded target (no pipeline; its clock at zero, or at `running_s`) on loopback."""
    device = Device(1, clock=Clock(running_s), cpu_port=CPU_PORT)
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
async def window_capped(db: str, port: int, mode: str = "window") -> AsyncIterator[LimiterClient]:
    """A control plane with pod a capped in window mode (RATE_BPS x WINDOW_S; or in `mode`), its DPU at `port`
    converged."""
    plane = ControlPlane(db, settings=Settings(lease_s=1.5))
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "dpu-a", f"127.0.0.1:{port}")
            await c.set_pod_cap("a", RATE_BPS, RATE_BPS, WINDOW_S, mode=mode)
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
    db: str, preloaded: bool | str, moved: bool
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
        async with window_capped(db, port) as c:
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


@pytest.mark.parametrize(
    "how", ["shortened", "lengthened-through-the-floor", "lengthened-through-rate-mode", "from-rate-mode"]
)
async def test_a_changed_window_does_not_forget_what_the_old_one_counted(db: str, how: str) -> None:
    """The slot counters' tags depend on the window's length, so a changed window starts counting afresh
    (a red team: 14,967,000 B in 20 s against 10,000,000). Spend the budget of a 12 s window and shorten it
    to 6 s, or lengthen it to 24 s with the floor or rate mode in between (a fifth red team: 4,461,844 B in
    24 s against 3,000,000), or spend rate mode's and move to a 12 s window (2,588,328 B in 12 s against
    1,500,000): nothing passes until no window of either length holds bytes from both sides. On a target
    whose clock has run for a day: on a young one, slot numbers are small and hid the lengthening."""
    device, server, port = await serve(running_s=86400)
    crossed: list[float] = []
    longest = 2 * WINDOW_S if how.startswith("lengthened") else WINDOW_S
    try:
        async with window_capped(db, port, "rate" if how == "from-rate-mode" else "window") as c:
            if how == "from-rate-mode":
                await spend(device, crossed, time.monotonic() + WINDOW_S)  # its rate for a window
            else:
                await spend(device, crossed, time.monotonic() + 20, idle_s=0.5)
            spent = len(crossed)
            if how == "lengthened-through-the-floor":
                await c.delete(caps=["a"])
            elif how == "lengthened-through-rate-mode":
                await c.set_pod_cap("a", RATE_BPS, RATE_BPS, WINDOW_S)
            window = {"shortened": WINDOW_S / 2, "from-rate-mode": WINDOW_S}.get(how, 2 * WINDOW_S)
            await c.set_pod_cap("a", RATE_BPS, RATE_BPS, window, mode="window")
            await offer_for_a_window(device, crossed, spent, 40 + longest)
    finally:
        await server.stop(grace=0)
    after = crossed[spent:]
    assert after, "the DPU never passed metered traffic under the new window"
    budget_frames = int(RATE_BPS / 8 * WINDOW_S) // len(OUT)
    rate_frames = allowed_window_bytes(RATE_BPS, WINDOW_S, default_burst_bytes(RATE_BPS)) // len(OUT)
    if how.startswith("lengthened"):  # the new window may pass its own budget in 12 s: judged over 24 s
        assert most_in_a_window(crossed, longest) <= 2 * budget_frames + 1
    else:
        assert most_in_a_window(crossed, WINDOW_S) <= max(budget_frames, rate_frames) + 1
    assert most_in_a_window(after, window) <= int(RATE_BPS / 8 * window) // len(OUT) + 1


async def test_budgets_changed_during_a_window_changes_hold_do_not_hold_again(db: str) -> None:
    """A move from rate mode into a window holds the lease for that window; budgets changed during the hold
    (the window kept) change no slot's tag: the hold ends a window after the move, not after the last change
    (a red team changed the budget every 2 s and the pod stayed at its floor)."""
    device, server, port = await serve(running_s=86400)
    crossed: list[float] = []
    try:
        async with window_capped(db, port, "rate") as c:
            moved = time.monotonic()
            await c.set_pod_cap("a", RATE_BPS, RATE_BPS, WINDOW_S, mode="window")
            assert await c.wait_converged(timeout=30)
            for k in (1, 2, 3):  # at 3, 6 and 9 s: each would have held until 12 s after it
                await spend(device, crossed, moved + 3 * k)
                rate = RATE_BPS * (2 if k % 2 else 1)
                await c.set_pod_cap("a", rate, rate, WINDOW_S, mode="window")
            since = len(crossed)
            await spend(device, crossed, moved + 9 + WINDOW_S)
    finally:
        await server.stop(grace=0)
    assert not crossed[:since], "metered traffic passed during the move's hold"
    assert crossed[since:], "still held a window after the last budget change"
    assert moved + WINDOW_S <= crossed[since] < moved + WINDOW_S + 5


async def test_a_control_plane_restarted_during_a_window_changes_hold_keeps_holding(tmp_path: Path, db: str) -> None:
    """A fifth red team: the hold lived in the agent, and a control plane restarted on the same state file
    1 s into it resumed the lease at once (2,229,880 B in 12 s against 1,500,000). It is stored now."""
    device, server, port = await serve(running_s=86400)
    crossed: list[float] = []
    try:
        async with window_capped(db, port) as c:
            await spend(device, crossed, time.monotonic() + 20, idle_s=0.5)
            spent = len(crossed)
            await c.set_pod_cap("a", RATE_BPS, RATE_BPS, WINDOW_S / 2, mode="window")
            await asyncio.sleep(1.0)
        restarted = ControlPlane(db, settings=Settings(lease_s=1.5))  # window_capped's state
        await restarted.start()
        try:
            await offer_for_a_window(device, crossed, spent, 60)
        finally:
            await restarted.stop()
    finally:
        await server.stop(grace=0)
    assert crossed[spent:], "the DPU never passed metered traffic again"
    assert most_in_a_window(crossed, WINDOW_S) <= int(RATE_BPS / 8 * WINDOW_S) // len(OUT) + 1


async def test_a_second_control_plane_with_a_state_of_its_own_holds_too(db: str, other_db: str) -> None:
    """A fifth red team: the power-cycled DPU armed by the first control plane, a second one (a state file of
    its own, so no share it granted before, and a higher election id) takes it over and found an epoch it
    did not arm: it may have been leased, whatever the second one's state says (2,973,868 B in 12 s against
    1,500,000 before)."""
    device, server, port = await serve(running_s=86400)
    crossed: list[float] = []
    try:
        async with window_capped(db, port):
            await spend(device, crossed, time.monotonic() + 20, idle_s=0.5)
            spent, old = len(crossed), device.pipeline
            assert old is not None
            await server.stop(grace=0)
            fresh, server, _ = await serve(port, running_s=86400)
            fresh.pipeline = clone(fresh, old, registers=False)
            epoch = fresh.pipeline.program.registers["LimiterIngress.lease_epoch"]
            async with asyncio.timeout(30):
                while not epoch.read(0):  # the first control plane's agent is back and armed it
                    await asyncio.sleep(0.05)
            second = ControlPlane(other_db, settings=Settings(lease_s=1.5, election_id=ELECTION_ID + 7))
            await second.start()
            try:
                async with LimiterClient(second.address) as c2:
                    await c2.apply_pod("a", ["10.0.1.0/24"])
                    await register(c2, "dpu-a", f"127.0.0.1:{port}")
                    await c2.set_pod_cap("a", RATE_BPS, RATE_BPS, WINDOW_S, mode="window")
                await offer_for_a_window(fresh, crossed, spent, 60)
            finally:
                await second.stop()
    finally:
        await server.stop(grace=0)
    assert crossed[spent:], "the DPU never passed metered traffic again"
    assert most_in_a_window(crossed, WINDOW_S) <= int(RATE_BPS / 8 * WINDOW_S) // len(OUT) + 1


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
