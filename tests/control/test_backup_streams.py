"""Backup streams: the replica next in line for a pod keeps a stream to each of its DPUs (replicas.py).

It bids below every holder and writes nothing, even when the DPU makes it primary because no holder is
connected; a takeover bids a fresh id on that open stream. Real parts: a throwaway PostgreSQL cluster,
replicas serving gRPC on loopback in this process, embedded targets in this process or simple_switch_grpc
processes (where installed), whose arbitration differs: bmv2 names the highest backup primary with a lower
id once the primary leaves, which finsy would answer by bidding the last primary's id.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from dpu_limiter.client import LimiterClient
from dpu_limiter.units import CPU_PORT
from helpers.bmv2 import bmv2_switch
from helpers.replica_fleet import (
    backed_up,
    fleet,
    holders,
    holding,
    next_in_line,
    pods_for,
    replicas,
    settled_fleet,
    targets,
    until,
)

pytestmark = pytest.mark.timeout(240)


async def test_the_next_in_line_keeps_a_backup_stream_below_the_holder(pg_url: str) -> None:
    ids = ["r1", "r2", "r3"]
    async with settled_fleet(pg_url, ids, 2, "r1") as (planes, dpus, _pods):
        await until(lambda: backed_up(planes, list(dpus)), 30, "a backup stream to every DPU")
        for name, t in dpus.items():
            ((holder,),) = [holders(planes)[name]]
            nxt = next_in_line(name, ids)
            standby = planes[nxt].service.standbys[name]
            held = planes[holder].service.agents[name].switch.election_id
            assert sorted(s.election_id for s in t.service.streams) == [standby.switch.election_id, held]
            assert t.primaries() == [held] and not standby.status.primary
            async with LimiterClient(planes[nxt].address) as c:
                (row,) = [d for d in (await c.status()).dpus if d.name == name]
            assert f"held by replica {holder}" in row.last_error and "a backup stream from here" in row.last_error


@contextlib.asynccontextmanager
async def addresses(kind: str, n: int) -> AsyncIterator[list[object]]:
    """`n` targets of `kind` (embedded, or bmv2: skipped where simple_switch_grpc cannot run)."""
    if kind == "embedded":
        async with targets(n) as ts:
            yield list(ts)
    else:
        with contextlib.ExitStack() as stack:
            yield [stack.enter_context(bmv2_switch([0, 1], cpu_port=CPU_PORT)) for _ in range(n)]


@pytest.mark.parametrize("kind", ["embedded", "bmv2"])
async def test_a_holder_back_after_a_broken_stream_is_primary_again_and_a_standby_takes_over(
    pg_url: str, kind: str
) -> None:
    ids = ["r1", "r2"]
    pods = pods_for(ids, 1)
    async with addresses(kind, len(pods)) as ts, replicas(pg_url, ids) as planes:
        async with LimiterClient(planes["r1"].address) as c:
            dpus = await fleet(c, pods, ts)  # type: ignore[arg-type]
        names = sorted(dpus)

        def held_once() -> bool:
            return all(len(holders(planes).get(n, [])) == 1 for n in names) and all(
                holding(planes[r].service.agents[n]) for n in names for (r,) in [holders(planes)[n]]
            )

        await until(lambda: held_once() and backed_up(planes, names), 60, "held, converged, backed up")
        name = names[0]
        ((holder,),) = [holders(planes)[name]]
        nxt = next_in_line(name, ids)
        agent, standby = planes[holder].service.agents[name], planes[nxt].service.standbys[name]

        # The holder's stream breaks and comes back (its agent connects again, bidding its id): the DPU made
        # the standby primary meanwhile, which must neither write nor keep the DPU from its holder.
        await agent.stop()
        agent.start()
        await until(lambda: holding(agent), 30, "the holder primary again")
        assert standby.standby and planes[nxt].service.standbys.get(name) is standby
        assert name not in planes[nxt].service.agents

        # The holder stops: the standby takes the DPU over on its open stream, bidding a fresh id.
        await planes[holder].stop()
        planes.pop(holder)
        await until(lambda: planes[nxt].service.agents.get(name) is standby and holding(standby), 60, "taken over")
        assert standby.switch.election_id > agent.switch.election_id
