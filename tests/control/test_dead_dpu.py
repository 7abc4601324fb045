"""A pod's DPU that cannot confirm a smaller share holds the others' growth back for one lease at most,
and never for less.

Shares change shrink before grow. A DPU that never confirms its shrink (dead, cut off, or answering
too late) cannot pass more than its old share for longer than the lease it held under it: the
control plane writes a lease only after the rest of an intent (dataplane.Plan.batches), and the
data plane drops metered traffic once the lease's deadline on its own clock has passed, whether or
not a packet used the lease. Every lease that came with the old share was issued before the shrink
was granted, so the pod's other DPUs grow one lifetime after the grant. A slow DPU that does
confirm is waited for.

Real gRPC on loopback: a control plane and embedded targets in this process (their meters read
straight from the devices), and DPUs at closed ports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import finsy as fy
import grpc
import pytest
from finsy.proto import p4r, p4r_grpc

from dpu_limiter import dataplane as dp
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT
from dpu_softswitch.server import Device, P4RuntimeService
from helpers.p4rt import A_HOST, B_HOST, udp
from helpers.planes import register
from helpers.processes import free_port

pytestmark = pytest.mark.timeout(120)

LEASE_TABLE = fy.P4Schema(dp.limiter_program().p4info).tables[dp.TABLE_LEASE].id
MARGIN_S = 3.0  # a reconcile's Write and read-back, and the test's sampling, on a loaded machine
OUT = udp(A_HOST, B_HOST)  # pod a to pod b: metered egress, port 0 -> 1


class Recorded(P4RuntimeService):
    """The embedded target's P4Runtime, answering each Write after `delay_s` and noting when one that
    renews the lease was applied."""

    def __init__(self, device: Device, delay_s: float = 0.0) -> None:
        super().__init__(device)
        self.delay_s = delay_s
        self.lease_written: list[float] = []

    async def Write(self, request: p4r.WriteRequest, context: Any) -> p4r.WriteResponse:  # noqa: N802
        """Late by `delay_s`; lease writes timed."""
        await asyncio.sleep(self.delay_s)
        reply = await super().Write(request, context)
        if any(u.entity.table_entry.table_id == LEASE_TABLE for u in request.updates):
            self.lease_written.append(time.monotonic())
        return reply


async def serve(delay_s: float = 0.0) -> tuple[Device, grpc.aio.Server, Recorded, str]:
    """An embedded target on loopback whose service is Recorded."""
    device = Device(1, cpu_port=CPU_PORT)
    server = grpc.aio.server()
    service = Recorded(device, delay_s)
    p4r_grpc.add_P4RuntimeServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return device, server, service, f"127.0.0.1:{port}"


def held(device: Device) -> float:
    """The egress share a DPU holds now (its data and ARP meters' peak rates, bit/s; 0: none)."""
    if device.pipeline is None:
        return 0.0
    meter = device.pipeline.program.meters[dp.METER]
    cfgs = [meter.get_p4runtime_config(cell) for cell in (dp.CELLS["egress"], dp.ARP_CELLS + dp.CELLS["egress"])]
    return sum(cfg[2] * 8 for cfg in cfgs if cfg is not None)


class Watch:
    """Every few milliseconds, what each device holds: [(time, [share per device])]; with `traffic`,
    a frame of pod a's through that device too (it latches each new lease as a DPU in use does),
    and when one last crossed."""

    def __init__(self, devices: list[Device], traffic: Device | None = None) -> None:
        self.devices = devices
        self.traffic = traffic
        self.crossed = -1.0  # when a frame last crossed `traffic`
        self.samples: list[tuple[float, list[float]]] = []
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            self.samples.append((now, [held(d) for d in self.devices]))
            if self.traffic is not None and self.traffic.process(0, OUT) == [(1, OUT)]:
                self.crossed = now
            await asyncio.sleep(0.005)

    async def until(self, k: int, share: float, timeout: float) -> float:
        """When device `k` first held `share` (waiting up to `timeout` for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, shares in self.samples:
                if shares[k] == pytest.approx(share, abs=8):
                    return t
            await asyncio.sleep(0.01)
        raise AssertionError(f"device {k} never held {share / 1e6} Mbit/s; last: {self.samples[-1]}")

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


async def two_nodes(db: Path, lease_s: float, nodes: dict[str, str]) -> ControlPlane:
    """A started control plane (state in `db`) holding pod a with a node DPU per name and address,
    capped at 240 Mbit/s (120 each), converged."""
    plane = ControlPlane(db, "127.0.0.1:0", settings=Settings(lease_s=lease_s))
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            for name, address in nodes.items():
                await register(c, name, address, node=True)
            await c.set_pod_cap("a", 240e6, 240e6, 1.0, 3_000_000)
            await c.wait_converged(timeout=30)
    except BaseException:
        await plane.stop()
        raise
    return plane


@pytest.fixture
async def servers() -> AsyncIterator[list[grpc.aio.Server]]:
    """The servers a test starts, all stopped afterwards."""
    started: list[grpc.aio.Server] = []
    yield started
    for server in started:
        await server.stop(grace=0)


async def test_a_dead_dpu_holds_growth_back_one_lease_at_most(db: str, servers: list[grpc.aio.Server]) -> None:
    lease_s = 4.0
    live, server, _, addr = await serve()
    servers.append(server)
    plane = ControlPlane(db, "127.0.0.1:0", settings=Settings(lease_s=lease_s))
    await plane.start()
    watch = Watch([live])
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "live", addr, node=True)
            await c.set_pod_cap("a", 80e6, 80e6, 1.0, 1_000_000)
            await c.wait_converged(timeout=30)
            # A node DPU at a closed port joins: the live one shrinks to its half at once; the dead
            # one is granted the other half and never confirms it.
            registering = time.monotonic()  # no lease of ours can have reached it before
            await register(c, "dead", f"127.0.0.1:{free_port()}", node=True)
            registered = time.monotonic()
            await watch.until(0, 40e6, timeout=10)
            # ... and its other half granted to the dead one (on a loaded machine the raise below could
            # otherwise come first: a DPU never granted anything holds no lease, and nothing back).
            while plane.service.shares.get("dead") is None:
                await asyncio.sleep(0.01)
            raised = time.monotonic()
            await c.set_pod_cap("a", 240e6, 240e6, 1.0, 3_000_000)
            grown = await watch.until(0, 120e6, timeout=lease_s + 10)
    finally:
        await watch.stop()
        await plane.stop()
    assert raised < registering + lease_s  # the raise came while the dead DPU's lease could still run
    # Safety: the live DPU grows into the dead one's share only once any lease it held has lapsed...
    assert grown >= registering + lease_s
    # ...and liveness: not much later (it used to wait until the dead DPU was deleted).
    assert grown <= registered + lease_s + MARGIN_S


@pytest.mark.parametrize("idle", [False, True], ids=["in-use", "idle"])
async def test_a_dpu_cut_off_owing_a_shrink_holds_growth_back_until_its_lease_ends(
    db: str, servers: list[grpc.aio.Server], idle: bool
) -> None:
    # Cut off from the control plane (its gRPC server stopped), its data plane running on. In use,
    # frames cross it every few milliseconds. Idle (the red team's attack), none does until the others
    # have grown; then it sends at its old share. A lease that started at its first packet let it (25 %
    # over the cap); one that ends at a deadline on its clock does not.
    lease_s = 4.0
    live, live_server, _, live_addr = await serve()
    dying_device, dying_server, dying, dying_addr = await serve()
    servers += [live_server, dying_server]
    plane = await two_nodes(db, lease_s, {"live": live_addr, "dying": dying_addr})
    watch = Watch([live], traffic=None if idle else dying_device)
    try:
        async with LimiterClient(plane.address) as c:
            await asyncio.sleep(lease_s / 2)  # a renewal or so
            await dying_server.stop(grace=0)
            died = time.monotonic()
            # Lowered: both must shrink to 40; the dead one cannot confirm, and may pass its 120 while
            # its lease runs. Raised again to 160: the live one may grow to 80 only once that has lapsed.
            await c.set_pod_cap("a", 80e6, 80e6, 1.0, 1_000_000)
            await watch.until(0, 40e6, timeout=10)
            await c.set_pod_cap("a", 160e6, 160e6, 1.0, 2_000_000)
            grown = await watch.until(0, 80e6, timeout=lease_s + 10)
            late = dying_device.process(0, OUT)
    finally:
        await watch.stop()
        await plane.stop()
    assert held(dying_device) == 120e6 and late == []  # its old meters, but no lease to use them with
    assert dying.lease_written
    assert grown >= dying.lease_written[-1] + lease_s  # never before its last lease can have lapsed
    assert grown <= died + lease_s + MARGIN_S
    if not idle:  # in the data plane: it passed pod a's frames until its lease lapsed, and none since
        assert died < watch.crossed < grown


async def test_a_live_dpu_that_never_confirms_is_not_renewed_past_its_shrink(
    db: str, servers: list[grpc.aio.Server]
) -> None:
    # Alive and connected, but every Write hangs past finsy's 10 s deadline: it never takes its smaller
    # share, and never the lease renewals written after it. The live DPU grows once the lease from
    # before has lapsed (one lifetime after the shrink was granted: every lease it could hold was issued before).
    lease_s = 4.0
    live, live_server, _, live_addr = await serve()
    stuck_device, stuck_server, stuck, stuck_addr = await serve()
    servers += [live_server, stuck_server]
    plane = await two_nodes(db, lease_s, {"live": live_addr, "stuck": stuck_addr})
    watch = Watch([live], traffic=stuck_device)
    try:
        async with LimiterClient(plane.address) as c:
            stuck.delay_s = 60.0
            lowered = time.monotonic()
            await c.set_pod_cap("a", 80e6, 80e6, 1.0, 1_000_000)
            await watch.until(0, 40e6, timeout=10)
            await c.set_pod_cap("a", 160e6, 160e6, 1.0, 2_000_000)
            grown = await watch.until(0, 80e6, timeout=10 + lease_s + 15)
            status = {d.name: d for d in (await c.status()).dpus}
    finally:
        await watch.stop()
        await plane.stop()
    assert held(stuck_device) == 120e6  # it never took its smaller share...
    assert status["stuck"].connected and not status["stuck"].converged
    assert grown >= stuck.lease_written[-1] + lease_s  # ...nor a lease since: the old one lapsed first
    assert grown <= lowered + 10 + lease_s + MARGIN_S  # the pass under way ends by its deadline
    assert lowered < watch.crossed < grown  # it passed frames under its old lease, and none once others grew


async def test_a_slow_dpu_that_confirms_is_waited_for(db: str, servers: list[grpc.aio.Server]) -> None:
    # Lease far longer than the test: growth must come from the slow DPU's confirmation, not a lapse.
    served = [await serve(), await serve(delay_s=1.5), await serve()]
    servers += [s for _, s, _, _ in served]
    devices = [d for d, _, _, _ in served]
    plane = ControlPlane(db, "127.0.0.1:0", settings=Settings(lease_s=60.0))
    await plane.start()
    watch = Watch(devices)
    cap = 80e6
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "fast", served[0][3], node=True)
            await register(c, "slow", served[1][3], node=True)
            await c.set_pod_cap("a", cap, cap, 1.0, 900_000)
            await c.wait_converged(timeout=30)
            # A third node joins: fast and slow shrink from 40 to 26.67 Mbit/s, and the new one may
            # have its 26.67 only once both hold their smaller shares (slow's Writes take 1.5 s).
            joined = time.monotonic()
            await register(c, "new", served[2][3], node=True)
            share = (int(cap / 8) // 3) * 8.0
            grown = await watch.until(2, share, timeout=20)
            shrunk = await watch.until(1, share, timeout=1)
    finally:
        await watch.stop()
        await plane.stop()
    assert shrunk <= grown  # the new node grew after the slow one shrank...
    assert grown - joined < 20  # ...as soon as it did, not a lease later
    worst = max(sum(shares) for _, shares in watch.samples)
    assert worst <= cap + 1e-6, f"the pod's DPUs held {worst / 1e6} Mbit/s together, over its {cap / 1e6}"


@pytest.mark.parametrize("how", ["lowered", "deleted"])
async def test_a_restarted_control_plane_waits_for_what_its_predecessor_waited_for(
    db: str, servers: list[grpc.aio.Server], how: str
) -> None:
    # The control plane stops while a cut-off DPU may still pass its old share (after a lower cap that
    # it never confirmed, or after being deleted): the next one, on the same state file, must not let
    # the others grow before that share's lease has ended (grants live in memory; the hold is stored).
    lease_s = 4.0
    live, live_server, _, live_addr = await serve()
    _, idle_server, _, idle_addr = await serve()
    servers += [live_server, idle_server]
    plane = await two_nodes(db, lease_s, {"live": live_addr, "idle": idle_addr})
    watch = Watch([live])
    try:
        async with LimiterClient(plane.address) as c:
            await idle_server.stop(grace=0)
            changed = time.monotonic()
            if how == "lowered":
                await c.set_pod_cap("a", 80e6, 80e6, 1.0, 1_000_000)  # 40 each; idle never confirms
                await watch.until(0, 40e6, timeout=10)
            else:
                await c.delete(dpus=["idle"])  # live's share may grow to all 240 once idle's lease ends
        await plane.stop()
        restarted = time.monotonic()
        plane = ControlPlane(db, "127.0.0.1:0", settings=Settings(lease_s=lease_s))
        await plane.start()
        share = 240e6
        if how == "lowered":  # raised again: live's share may grow to 80 once idle's lease ends
            async with LimiterClient(plane.address) as c:
                await c.set_pod_cap("a", 160e6, 160e6, 1.0, 2_000_000)
            share = 80e6
        deadline = time.monotonic() + lease_s + 10
        while not any(t > restarted and shares[0] == pytest.approx(share, abs=8) for t, shares in watch.samples):
            assert time.monotonic() < deadline, watch.samples[-1]
            await asyncio.sleep(0.01)
    finally:
        await watch.stop()
        await plane.stop()
    after = [(t, shares[0]) for t, shares in watch.samples if t > restarted]
    grown = next(t for t, s in after if s == pytest.approx(share, abs=8))
    assert restarted < changed + lease_s  # the restart came while the old share could still pass
    assert grown >= changed + lease_s  # ...and nobody grew before it had ended
    assert grown <= changed + lease_s + MARGIN_S
    # Meanwhile live kept the share it was last granted (stored, and resumed): no more, and not its floor.
    before = 40e6 if how == "lowered" else 120e6
    waiting = [s for t, s in after if t < grown - 0.1]
    assert waiting and all(s == pytest.approx(before, abs=8) for s in waiting), sorted(set(waiting))
