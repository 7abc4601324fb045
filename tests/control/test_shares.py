"""Shares: a pod's cap split over its parallel devices (node DPUs, or parallel uplink DPUs) so that
their sum never exceeds the cap, changed shrink-before-grow, and held end to end in the lab."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from dpu_lab.config import load_scenario
from dpu_lab.virtual import VirtualLabRun
from dpu_limiter.client import LimiterClient
from dpu_limiter.dataplane import ARP_CELLS
from dpu_limiter.models import Cap
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.shares import lesser, split, total
from dpu_limiter.store import Grant, GrowthHold
from dpu_softswitch.server import Device
from helpers.paths import ROOT
from helpers.planes import node_pod, register, serve_in_process

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 18, 72])
def test_split_never_exceeds_the_cap(n: int) -> None:
    cap = Cap(1e9 + 7, 333_333_333.0, 60.0, 12_500_001)
    shares = split(cap, [f"n{i}" for i in range(n)])
    egress, ingress = total(dict(shares))
    assert egress <= cap.egress_bps and ingress <= cap.ingress_bps
    assert egress > cap.egress_bps - 8 * n  # rounded down by less than a byte per second each
    assert sum(s.burst_bytes for s in shares.values()) <= cap.burst_bytes


def test_lesser() -> None:
    a, b = Cap(10, 20, 60, 5), Cap(20, 10, 60, 7)
    assert lesser(a, b) == Cap(10, 10, 60, 5)
    assert lesser(a, None) is None


def _granted(devices: list[Device]) -> float:
    """Sum of the egress meter rates the node DPUs hold right now (data and ARP's), in bit/s."""
    rate = 0.0
    for d in devices:
        if d.pipeline is None:
            continue
        for cell in (0, ARP_CELLS):
            cfg = d.pipeline.program.meters["LimiterIngress.boundary_meter"].get_p4runtime_config(cell)
            rate += 0 if cfg is None else cfg[2] * 8
    return rate


@pytest.mark.parametrize("node", [True, False], ids=["node-dpus", "parallel-uplinks"])
async def test_shrink_before_grow_and_a_dead_node_blocks_growth(db: str, node: bool) -> None:
    served = [await serve_in_process() for _ in range(3)]
    devices = [d for d, _, _ in served]
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    cap = 30e6
    samples: list[float] = []
    stop = asyncio.Event()

    async def watch() -> None:  # the invariant, sampled while shares change
        while not stop.is_set():
            samples.append(_granted(devices))
            await asyncio.sleep(0.001)

    watcher = asyncio.create_task(watch())
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            for i, (_, _, addr) in enumerate(served[:2]):
                await register(c, f"n{i}", addr, node=node)
            await c.set_pod_cap("a", cap, cap, 10.0, 300_000)
            await c.wait_converged(timeout=30)
            assert _granted(devices) == pytest.approx(cap, rel=1e-6)  # two shares of 15 Mbit/s
            # A third node joins: 15 -> 10 Mbit/s for the first two, 0 -> 10 for the new one.
            await register(c, "n2", served[2][2], node=node)
            await c.wait_converged(timeout=30)
            assert _granted(devices) == pytest.approx(cap, rel=1e-6)
            # A fourth node that never answers: the others shrink to 7.5, nobody grows to 7.5.
            await register(c, "n3", "127.0.0.1:1", node=node)
            await asyncio.sleep(3)
            status = {d.name: d for d in (await c.status()).dpus}
            assert not status["n0"].converged  # the share change is still pending
        rates = [
            d.pipeline.program.meters["LimiterIngress.boundary_meter"].get_p4runtime_config(0)
            for d in devices
            if d.pipeline
        ]
        assert all(r is not None and r[2] * 8 <= 7.5e6 + 8 for r in rates)
    finally:
        stop.set()
        await watcher
        await plane.stop()
        for _, server, _ in served:
            await server.stop(grace=0)
    assert samples and max(samples) <= cap + 1e-6


async def test_a_shrinking_pass_stores_its_hold_with_its_grants_before_telling_any_dpu(db: str) -> None:
    # One commit before the DPUs are poked, not two in a row (the hold, then the grants): on PostgreSQL each
    # was a round trip and an fsync that every DPU of a shrinking pod waited for.
    served = [await serve_in_process() for _ in range(2)]
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    events: list[tuple[str, object]] = []
    try:
        async with LimiterClient(plane.address) as c:
            await node_pod(c, [addr for _, _, addr in served], "n")
            await c.set_pod_cap("a", 30e6, 30e6, 10.0, 300_000)
            await c.wait_converged(timeout=30)
            svc = plane.service
            save = svc._saved.fn  # the store's save_shares, called with whatever was asked meanwhile

            def saved(writes: list[Grant | GrowthHold]) -> list[int | None]:
                stored = save(writes)
                events.append(("stored", list(writes)))  # once committed
                return stored

            svc._saved.fn = saved
            for name, agent in svc.agents.items():
                poke = agent.poke
                # Told of its new share: a lease renewal meanwhile pokes too, with the old one.
                agent.poke = lambda name=name, poke=poke: (  # type: ignore[method-assign]
                    events.append(("poked", (name, svc.shares.get(name)))),
                    poke(),
                )[1]
            await c.set_pod_cap("a", 20e6, 20e6, 10.0, 300_000)  # 15 -> 10 Mbit/s each
            await c.wait_converged(timeout=30)
    finally:
        await plane.stop()
        for _, server, _ in served:
            await server.stop(grace=0)
    stores = [w for kind, w in events if kind == "stored"]
    assert stores, events
    first = stores[0]
    assert isinstance(first, list)
    assert {type(w) for w in first} == {Grant, GrowthHold}, first
    assert {w.dpu for w in first if isinstance(w, Grant)} == {"n0", "n1"}
    assert [w.pod for w in first if isinstance(w, GrowthHold)] == ["a"]
    told = [
        i
        for i, (kind, what) in enumerate(events)
        if kind == "poked" and what in {(g.dpu, g.share) for g in first if isinstance(g, Grant)}
    ]
    assert len(told) >= 2 and events.index(("stored", first)) < min(told), events


def test_node_placement_in_virtual_time(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "bmv2-lab" / "scenarios" / "two-pods-nodes.yaml")
    sc = sc.model_copy(update={"phases": [ph.model_copy(update={"duration_s": 4.0}) for ph in sc.phases]})
    r = VirtualLabRun(sc, tmp_path).run()
    assert r.cap_held
    flows = {f.name: f for f in r.flows}
    # Each node gets its half of the 20 Mbit/s pod cap (plus its half of the burst over 4 s).
    for name in ("a1-to-b1", "a2-to-b2"):
        assert 0.9 * 10e6 <= flows[name].delivered_bps <= 10e6 + 1_250_000 * 8 / 4 + 1
    assert flows["a1-to-a2-intra"].loss_ratio == 0.0  # intra-pod: no cap on the path


def test_allocate_is_max_min_fair_and_within_the_cap() -> None:
    from dpu_limiter.shares import allocate

    a = allocate(20e6, {"idle": 0.0, "busy": 25e6})
    assert sum(a.values()) <= 20e6 + 1e-6
    assert a["busy"] > 18e6  # the idle node keeps only its floor
    b = allocate(20e6, {"light": 4e6, "heavy": 25e6})
    assert b["light"] == pytest.approx(4.4e6) and b["heavy"] == pytest.approx(15.6e6)
    c = allocate(20e6, {"x": 1e6, "y": 2e6})  # spare budget is spread, none wasted
    assert sum(c.values()) == pytest.approx(20e6)


def test_rebalancing_moves_unused_share_and_holds_the_cap(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "bmv2-lab" / "scenarios" / "two-pods-nodes-rebalance.yaml")
    sc = sc.model_copy(update={"phases": [ph.model_copy(update={"duration_s": 8.0}) for ph in sc.phases]})
    r = VirtualLabRun(sc, tmp_path).run()
    assert r.cap_held, [(x.pod, x.direction, x.max_window_bytes, x.allowed_window_bytes) for x in r.results]
    flows = {f.name: f for f in r.flows}
    assert flows["a1-to-b1-alone"].delivered_bps > 1.5 * 10e6  # more than its static half of the pod cap
    assert flows["a2-to-b2-light"].loss_ratio < 0.15  # the light node gets what it asks for, after a ramp


async def test_a_rebalancing_cap_must_leave_every_node_a_frame_too(db: str) -> None:
    # A rebalancing pod's nodes get equal shares with small buckets first, then shares by demand, down
    # to a floor: a cap under which any of those leaves a node's buffer less than a frame is refused,
    # with rebalance as without (it used to skip the check).
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            for i in range(2):
                await register(c, f"n{i}", f"127.0.0.1:{i + 1}", node=True, buffer_bytes=100_000)
            for rebalance in (False, True):  # 800 kbit/s x 1 s: each half of 100,000 bytes, less than the buffer
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.set_pod_cap("a", 800e3, 800e3, 1.0, mode="window", rebalance=rebalance)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (err.value.details() or "").startswith("cap.window_s:"), err.value.details()
            # The equal halves of 20 Mbit/s x 1 s fit; the floor a node with no demand gets (5 % of the
            # cap shared by the nodes: 62,500 bytes a window) does not, under a buffer of 100,000 bytes.
            await c.set_pod_cap("a", 20e6, 20e6, 1.0, mode="window")
            gen = (await c.status()).generation
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.set_pod_cap("a", 20e6, 20e6, 1.0, mode="window", rebalance=True)
            assert "least share rebalancing grants" in (err.value.details() or ""), err.value.details()
            assert (await c.status()).generation == gen  # nothing stored
            await c.set_pod_cap("a", 80e6, 80e6, 1.0, mode="window", rebalance=True)  # a floor of 250 kB fits
            # Rate mode: rebalancing's buckets always leave a node its buffer and a frame.
            await c.set_pod_cap("a", 8e6, 8e6, 10.0, 300_000, rebalance=True)
    finally:
        await plane.stop()


async def test_a_rebalancing_pod_a_control_plane_resumes_makes_no_change_for_a_window(db: str) -> None:
    """A red team's gap: the refills a pod's buckets may take in a window (shares.node_burst) were counted in
    the memory of the control plane that made them, so one restarted (or a replica taking the pod over) could
    refill again at once, past the window's allowance. It now makes no change until a window has passed."""
    window_s = 10.0
    served = [await serve_in_process() for _ in range(2)]
    settings = Settings(rebalance_loop=False)
    try:
        plane = ControlPlane(db, "127.0.0.1:0", settings=settings)
        await plane.start()
        try:
            async with LimiterClient(plane.address) as c:
                await node_pod(c, [address for _, _, address in served], "n")
                await c.set_pod_cap("a", 8e6, 8e6, window_s, 300_000, rebalance=True)
                assert await c.wait_converged(timeout=30)
            now = plane.service.clock.monotonic()
            assert not await plane.service.rebalance_pod("a", now)  # a first sample
            assert await plane.service.rebalance_pod("a", now + 1.0)  # the pod made here: its changes known
        finally:
            await plane.stop()
        resumed = ControlPlane(db, "127.0.0.1:0", settings=settings)
        await resumed.start()
        try:
            async with LimiterClient(resumed.address) as c:
                assert await c.wait_converged(timeout=30)
            now = resumed.service.clock.monotonic()
            assert not await resumed.service.rebalance_pod("a", now)
            assert not await resumed.service.rebalance_pod("a", now + 1.0)  # the last holder's window not over
            assert await resumed.service.rebalance_pod("a", now + window_s + 1.0)
        finally:
            await resumed.stop()
    finally:
        for _, server, _ in served:
            await server.stop(grace=0)
