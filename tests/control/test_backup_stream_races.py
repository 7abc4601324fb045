"""Backup streams in corner cases: a fence or a stop while a takeover bids, a standby whose stream is down, other
controllers' default election ids, a standby the DPU made primary, DPUs moved or deleted, a fence and rejoin.

Real parts, as tests/control/test_backup_streams.py: a throwaway PostgreSQL cluster, replicas serving gRPC on
loopback in this process, embedded targets in this process. Where a race needs a window, the bid's send (the
arbitration update on the stream, the one thing `finsy_adapter.bid` leaves to wait for) is held until released.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from dpu_limiter import finsy_adapter
from dpu_limiter.client import LimiterClient
from dpu_limiter.reconciler import DpuAgent
from dpu_limiter.server import ControlPlane
from dpu_softswitch.server import add_to_server
from helpers.p4rt import connect
from helpers.replica_fleet import (
    Target,
    backed_up,
    holders,
    holding,
    next_in_line,
    settled_fleet,
    targets,
    until,
)

pytestmark = pytest.mark.timeout(240)


class HeldBid:
    """finsy_adapter.bid as it is, its send (the arbitration update on the stream: the one thing of it that
    waits) held until released."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.real = finsy_adapter.bid

    def __call__(self, sw: finsy_adapter.DpuSwitch, election_id: int) -> Callable[[], Awaitable[None]] | None:
        send = self.real(sw, election_id)
        if send is None:
            return None

        async def held() -> None:
            self.entered.set()
            await self.release.wait()
            await send()

        return held


@contextlib.asynccontextmanager
async def two_backed_up(
    pg_url: str,
) -> AsyncIterator[tuple[dict[str, ControlPlane], dict[str, Target], str, str, str]]:
    """r1 and r2, one pod each, backed up; (planes, targets, a DPU r1 holds, its holder, the next in line)."""
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        await until(lambda: backed_up(planes, list(dpus)), 30, "a backup stream to every DPU")
        name = next(n for n in sorted(dpus) if holders(planes)[n] == ["r1"])
        nxt = next_in_line(name, ids)
        assert nxt == "r2"
        yield planes, dpus, name, "r1", nxt


async def bidding(
    planes: dict[str, ControlPlane], name: str, holder: str, nxt: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[DpuAgent, HeldBid]:
    """The holder stops and `nxt` takes `name` over on its standby, whose bid's send is held: the standby."""
    bid = HeldBid()
    monkeypatch.setattr(finsy_adapter, "bid", bid)
    standby = planes[nxt].service.standbys[name]
    await planes[holder].stop()
    planes.pop(holder)
    await asyncio.wait_for(bid.entered.wait(), 30)
    return standby, bid


async def test_a_fence_while_a_takeover_bids_leaves_no_writer(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """fence() runs without the service's lock (the watchdog task) while a takeover's bid is on its way: the
    standby is a holder by then, so the fence stops it, and it writes nothing once the DPU answers."""
    async with two_backed_up(pg_url) as (planes, dpus, name, holder, nxt):
        standby, bid = await bidding(planes, name, holder, nxt, monkeypatch)
        service = planes[nxt].service
        await service.fence()  # the watchdog: this replica's lease may end; stop writing to every DPU now
        bid.release.set()
        await asyncio.sleep(3)  # the takeover finishes; the DPU answers the bid
        pod = standby.dpu.pod
        assert not service.owns(pod)
        leaked = service.agents.get(name)
        primary = dpus[name].primaries() == [standby.switch.election_id]
        assert leaked is None and not primary, (
            f"fenced, yet {name}'s agent is a holder here ({leaked is standby}), the DPU's primary ({primary}), "
            f"converged with a lease ({holding(standby)})"
        )


async def test_a_replica_stopped_while_a_takeover_bids_leaks_no_agent(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas.stop cancels the follower mid-takeover: the standby taken over is a holder by then, and stops
    with the others."""
    async with two_backed_up(pg_url) as (planes, _dpus, name, holder, nxt):
        standby, _bid = await bidding(planes, name, holder, nxt, monkeypatch)
        await planes[nxt].stop()
        service = planes[nxt].service
        running = standby._task is not None and not standby._task.done()
        try:
            await asyncio.sleep(3)  # no other stream to the DPU is left: what does the leaked one do?
            assert not running, (
                f"after stop, {name}'s standby still runs (stream up: {standby.up}; in agents: "
                f"{name in service.agents}, in standbys: {name in service.standbys}; standby flag now "
                f"{standby.standby}, next connection bids {standby.switch._arbitrator.initial_election_id:#x}; "
                f"3 s later it bids {standby.switch.election_id:#x}, DPU primaries "
                f"{[hex(e) for e in _dpus[name].primaries()]}, primary+converged+leased: {holding(standby)})"
            )
        finally:
            await standby.stop()


async def test_a_takeover_on_a_down_backup_stream_keeps_the_dpus_lease_hold(pg_url: str) -> None:
    """A standby whose agent has ended (its stream down for good) is replaced at the takeover by a new agent,
    which keeps the DPU's lease hold (a window change's: no lease before it ends)."""
    async with two_backed_up(pg_url) as (planes, _dpus, name, holder, nxt):
        service = planes[nxt].service
        standby = service.standbys[name]
        await standby.stop()  # its stream is down (the DPU unreachable from here for a moment)
        assert not standby.up and service.standbys.get(name) is standby
        until_wall = time.time() + 120
        await asyncio.to_thread(service.store.hold_leases, [(name, until_wall)])
        await planes[holder].stop()
        planes.pop(holder)
        await until(lambda: (a := service.agents.get(name)) is not None and a is not standby, 30, "a new agent")
        agent = service.agents[name]
        left = agent._hold_until - service.clock.monotonic()
        assert left > 60, f"the new holder's lease hold is gone ({left:.1f} s left; the store says ~120 s)"


@pytest.mark.parametrize("eid", [1, 10])
async def test_an_operator_controller_with_a_default_election_id_is_not_refused(pg_url: str, eid: int) -> None:
    """Standbys bid in a band of their own (2^39 + the database's number), clear of other controllers'
    defaults (p4runtime-shell's 1, finsy's 10) and below every holder (2^40 + the number): on a fresh
    database the number alone would be 1 and 2."""
    async with two_backed_up(pg_url) as (planes, dpus, _name, _holder, _nxt):
        ids = {n: a.switch.election_id for p in planes.values() for n, a in p.service.standbys.items()}
        held = {n: a.switch.election_id for p in planes.values() for n, a in p.service.agents.items()}
        assert all(1 << 39 < ids[n] < held[n] for n in ids), (ids, held)
        name = min(ids)
        async with grpc.aio.insecure_channel(dpus[name].address) as ch:
            shell = await connect(ch, eid)  # an operator's p4runtime-shell, --election-id 0,<eid> (default 0,1)
            try:
                msg = await asyncio.wait_for(shell.responses.get(), 5)
                answer = f"arbitration: {msg.arbitration.status.message}"
            except Exception:  # the stream aborted
                call = shell.call
                answer = f"refused: {await call.code()} {await call.details()}"  # type: ignore[attr-defined]
            finally:
                shell.requests.put_nowait(None)
            assert answer.startswith("arbitration"), f"a backup controller at id {eid} on {name}: {answer}"


async def test_a_standby_made_primary_writes_nothing(pg_url: str) -> None:
    """The holder's agent stops: the DPU makes the standby primary under its low id; for several seconds
    nothing is written (no pipeline load, no lease moved), then the holder is back."""
    async with two_backed_up(pg_url) as (planes, dpus, name, holder, nxt):
        t, standby = dpus[name], planes[nxt].service.standbys[name]
        agent = planes[holder].service.agents[name]
        pipeline, deadline = t.device.pipeline, t.lease_deadline_us()
        await agent.stop()
        await until(lambda: t.primaries() == [standby.switch.election_id], 10, "the standby the DPU's primary")
        await asyncio.sleep(6)  # more than a lease renewal period (LEASE_S / 3)
        assert t.device.pipeline is pipeline and t.lease_deadline_us() == deadline
        assert standby.standby and not standby.status.connected and name not in planes[nxt].service.agents
        agent.start()
        await until(lambda: holding(agent), 30, "the holder primary again")
        assert t.primaries() == [agent.switch.election_id]


async def test_an_agent_leaked_by_a_stop_mid_takeover_does_not_write_once_its_stream_breaks(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent of a replica stopped mid-takeover (the test above) bids the takeover's fresh holder id on any
    new connection: once the DPU's gRPC server restarts (the stream breaks) nothing of the stopped replica
    connects again and writes."""
    async with two_backed_up(pg_url) as (planes, dpus, name, holder, nxt):
        standby, _bid = await bidding(planes, name, holder, nxt, monkeypatch)
        await planes[nxt].stop()
        t = dpus[name]
        port = int(t.address.rsplit(":", 1)[1])
        await t.server.stop(grace=0)
        server = grpc.aio.server()
        t.service = add_to_server(server, t.device)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        t.server = server
        try:
            with contextlib.suppress(AssertionError):
                await until(lambda: holding(standby), 40, "the leaked agent writing")
            assert not holding(standby), (
                f"a stopped replica's leaked agent is {name}'s primary at {standby.switch.election_id:#x}, "
                f"converged with a lease (DPU primaries {[hex(e) for e in t.primaries()]})"
            )
        finally:
            await standby.stop()


async def test_a_dpu_moved_or_deleted_keeps_no_stale_backup_stream(pg_url: str) -> None:
    """A DPU moved to another address, written through the replica that does not back it up: the next in line
    (catching up) replaces its standby with one to the new address; deleted: it stops it."""
    async with two_backed_up(pg_url) as (planes, dpus, name, holder, nxt), targets(1) as (spare,):
        service = planes[nxt].service
        old = service.standbys[name]
        async with LimiterClient(planes[holder].address) as c:
            moved = dataclasses.replace(planes[holder].service.state.dpus[name], p4runtime_address=spare.address)
            await c.apply(dpus=[moved])
            await until(
                lambda: (s := service.standbys.get(name)) is not None and s is not old and s.up,
                30,
                "a new backup stream to the new address",
            )
            assert old._task is None and [s.election_id for s in dpus[name].service.streams] == []
            new = service.standbys[name]
            assert sorted(s.election_id for s in spare.service.streams) == sorted(
                [new.switch.election_id, planes[holder].service.agents[name].switch.election_id]
            )
            await c.delete(dpus=[name])
            await until(lambda: name not in service.standbys and not spare.service.streams, 30, "no stream left")
            assert new._task is None


async def test_a_fenced_replica_rejoins_with_its_backup_streams(pg_url: str) -> None:
    """The next in line fences (its watchdog) and rejoins: its standbys stop, then come back; the
    holder stays the DPU's only primary throughout."""
    async with two_backed_up(pg_url) as (planes, dpus, name, holder, nxt):
        replicas = planes[nxt].replicas
        assert replicas is not None
        agent = planes[holder].service.agents[name]
        await replicas._fence()
        assert not planes[nxt].service.standbys and not planes[nxt].service.agents
        await until(lambda: backed_up(planes, list(dpus)), 30, "backed up again after the rejoin")
        assert dpus[name].primaries() == [agent.switch.election_id] and holding(agent)
