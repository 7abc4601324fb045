"""The cyclic collector at fleet size (control/dpu_limiter/heap.py): a fleet's objects are frozen out of its
reach, and given back when agents stop, whichever way they stop.

A stopped agent and its connection refer to each other, so only a collection frees them; frozen, they were
kept for good when a replica let its DPUs go (fenced, or pods moving to a joining replica) or dropped a
backup stream (a review found these paths did not thaw the heap; only deleting a DPU did).

Real parts for the replicas: a throwaway PostgreSQL cluster, control planes in this process serving gRPC on
loopback, embedded P4Runtime targets in this process.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from pathlib import Path

import pytest

from dpu_limiter import heap, service
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from helpers.replica_fleet import fleet, holders, join, settled, settled_fleet, targets, until

pytestmark = pytest.mark.timeout(180)


class Node:
    """An object that can be part of a cycle."""

    other: object


def cycle() -> weakref.ref[Node]:
    """A cycle of two objects, unreachable once made: only the cyclic collector frees it."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_frozen_cycle_is_collected_only_once_thawed() -> None:
    try:
        with heap.paused():  # not collected before the freeze: it stays frozen
            ref = cycle()
            heap.freeze()
        gc.collect()
        assert ref() is not None
        heap.thaw()
        gc.collect()
        assert ref() is None
    finally:
        heap.thaw()


def test_young_garbage_is_collected_before_a_freeze_unless_the_collector_is_paused() -> None:
    try:
        with heap.paused():
            kept = cycle()
            heap.freeze()  # a fleet's write: its objects are not scanned first
        collected = cycle()
        heap.freeze()
        assert kept() is not None and collected() is None
    finally:
        heap.thaw()


async def test_agents_a_replica_lets_go_of_are_collected_though_frozen(pg_url: str) -> None:
    async with settled_fleet(pg_url, ["r1", "r2", "r3"], 2, "r1", started=["r1", "r2"]) as (planes, dpus, _):
        heap.freeze()  # as after a fleet's write: every agent and its connection frozen
        try:
            agents = {
                (r, name): weakref.ref(a)
                for r, p in planes.items()
                for name, a in [*p.service.agents.items(), *p.service.standbys.items()]
            }
            await join(pg_url, planes, "r3")
            await until(lambda: settled(planes, dpus), 60, "r3 holds its pods")
            moved = [n for n, (r,) in holders(planes).items() if r == "r3"]
            assert moved
            # Every agent of r1's and r2's that is still alive is one they still run (a holder, or a backup
            # stream); the ones they stopped (the DPUs r3 took, backup streams no longer kept) are gone once
            # their stops have ended (a replica forgets an agent first, then stops it: settled() may see the
            # first before the second has ended).

            def stray() -> list[tuple[str, str]]:
                gc.collect()
                return sorted(
                    key
                    for key, ref in agents.items()
                    if (a := ref()) is not None
                    and a is not planes[key[0]].service.agents.get(key[1])
                    and a is not planes[key[0]].service.standbys.get(key[1])
                )

            await until(lambda: not stray(), 30, "every agent r1 and r2 stopped collected")
            alive = {key for key, ref in agents.items() if ref() is not None}
            assert any(key not in alive for key in agents if key[1] in moved and key[0] != "r3")
        finally:
            heap.thaw()


async def test_agents_that_connected_together_are_frozen_once_connected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fewer than FREEZE_EVERY (a 1,000-DPU replica) were never frozen: every full collection during a cap change
    # scanned their connections again (50-63 ms, once or twice a change, in bench/replica_scale.py's serve).
    monkeypatch.setattr(service, "FREEZE_MIN", 8)  # 10 DPUs stand for a burst of FREEZE_MIN or more
    monkeypatch.setattr(service, "FREEZE_SETTLE_S", 0.5)
    async with targets(10) as ts:
        plane = ControlPlane(tmp_path / "state.db", "127.0.0.1:0")
        await plane.start()
        try:
            async with LimiterClient(plane.address) as c:
                await fleet(c, [f"pod-{k}" for k in range(10)], ts)  # one write, fewer objects than a bulk one
                await c.wait_converged(timeout=30)
            made = [o for a in plane.service.agents.values() for o in (a, a.switch)]
            assert len(made) == 20

            def reachable() -> int:  # how many of them a collection still scans (frozen: not listed)
                ids = {id(x) for x in gc.get_objects()}
                return sum(id(o) in ids for o in made)

            deadline = time.monotonic() + 15
            while (left := reachable()) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert not left, f"{left} of the agents and their switches are still in the collector's reach"
        finally:
            await plane.stop()
            heap.thaw()
