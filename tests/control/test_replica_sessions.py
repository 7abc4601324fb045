"""A replica whose database session ended keeps a grace of its lease, not the rest of it (PgStore._live).

A killed `serve` process's connection closes as it dies, and PostgreSQL ends its session at once: the others cut
its lease to SESSION_GRACE_S and take its DPUs when that runs out, not a whole lease later. A replica alive whose
session the database ended (an operator's pg_terminate_backend, a dropped connection) renews through a new
session within the grace and holds on; one that does not (a stalled process) finds its lease ended, stops
writing to its DPUs, and joins again. A database that started again ended every session: those rows wait for
their leases, and nobody stops.

Real parts: a throwaway PostgreSQL cluster, control planes in this process serving gRPC on loopback, embedded
P4Runtime targets in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dpu_limiter.store_pg import PgStore, SessionLost
from dpu_limiter.stores import open_store
from dpu_limiter.units import SESSION_GRACE_S
from helpers import replica_fleet
from helpers.postgres import Cluster
from helpers.replica_fleet import (
    LEASE_S,
    REPLICA_LEASE_S,
    LapseWatch,
    lease_left,
    only_held_by,
    resume_poll,
    settled,
    settled_fleet,
    stall_poll,
    until,
)

pytestmark = pytest.mark.timeout(240)


def _live_without(store: PgStore, gone: str, timeout: float = 10.0) -> list[tuple[str, str]]:
    """The live set once `gone` has left it (its session's end takes the server a moment)."""
    deadline = time.monotonic() + timeout
    while (live := store.live_replicas()) and gone in dict(live):
        assert time.monotonic() < deadline, live
        time.sleep(0.02)
    return live


def test_a_replica_whose_session_ended_keeps_a_grace_of_its_lease(pg_cluster: Cluster, pg_url: str) -> None:
    s1, s2 = PgStore(pg_url), PgStore(pg_url)
    try:
        assert s1.schema_version() == 4
        s1.pin_session()
        session = s1.session()
        assert s1.renew_replica("r1", "a:1", 60.0, session) == [("r1", "a:1")]
        assert s2.renew_replica("r2", "a:2", 60.0, s2.session()) == [("r1", "a:1"), ("r2", "a:2")]
        assert s2.renew_replica("r3", "a:3", 60.0) == [("r1", "a:1"), ("r2", "a:2"), ("r3", "a:3")]  # no session
        assert not s2.session_ended("r1")
        ended = time.monotonic()
        pg_cluster.sql(pg_url, f"SELECT pg_terminate_backend({session[0]})")
        # Its lease ran a minute on; its session is over: the grace is what is left, for every replica that asks.
        live = _live_without(s2, "r1")
        assert time.monotonic() - ended >= SESSION_GRACE_S * 0.9
        assert live == [("r2", "a:2"), ("r3", "a:3")] and s2.session_ended("r1")
        # The pinned store is not connected again behind its replica's back: the call that finds the session
        # gone fails, and so does every later one, until its replica asks for another session.
        with pytest.raises(sqlite3.OperationalError):
            s1.live_replicas()
        assert s1.session_broken()
        with pytest.raises(SessionLost):
            s1.live_replicas()
        s1.new_session()
        assert not s1.session_broken() and s1.session() != session
        # Its grace over, a renewal that does not join extends nothing: the replica must stop and join again.
        assert "r1" not in dict(s1.renew_replica("r1", "a:1", 60.0, s1.session(), join=False))
        assert s1.renew_replica("r1", "a:1", 60.0, s1.session()) == [("r1", "a:1"), ("r2", "a:2"), ("r3", "a:3")]
        # Back within its grace, through a new session: it holds on, its whole lease again.
        pg_cluster.sql(pg_url, f"SELECT pg_terminate_backend({s1.session()[0]})")
        until_sync(lambda: s2.session_ended("r1"), "the server ends r1's session")
        assert "r1" in dict(s2.live_replicas()) and lease_left(pg_url, "r1") <= SESSION_GRACE_S
        with pytest.raises(sqlite3.OperationalError):
            s1.live_replicas()
        s1.new_session()
        assert "r1" in dict(s1.renew_replica("r1", "a:1", 60.0, s1.session(), join=False))
        assert lease_left(pg_url, "r1") > 50 and not s2.session_ended("r1")
        # A row written before the server last started: every session of then ended, whatever its number says;
        # the lease decides (the others wait for it rather than cut every replica's).
        pg_cluster.sql(pg_url, "UPDATE replicas SET session_pid = 2147483000, session_epoch = 1.0 WHERE id = 'r2'")
        assert [r for r, _ in s1.live_replicas()] == ["r1", "r2", "r3"] and lease_left(pg_url, "r2") > 50
        pg_cluster.sql(pg_url, "UPDATE replicas SET session_epoch = NULL WHERE id = 'r2'")
        assert [r for r, _ in s1.live_replicas()] == ["r1", "r2", "r3"] and lease_left(pg_url, "r2") > 50
        # Of this start (r1's), and not open: cut to the grace, then gone.
        r1_epoch = "(SELECT session_epoch FROM replicas WHERE id = 'r1')"
        pg_cluster.sql(pg_url, f"UPDATE replicas SET session_epoch = {r1_epoch} WHERE id = 'r2'")
        assert [r for r, _ in s1.live_replicas()] == ["r1", "r2", "r3"] and lease_left(pg_url, "r2") <= SESSION_GRACE_S
        assert [r for r, _ in _live_without(s1, "r2")] == ["r1", "r3"]
    finally:
        s1.close()
        s2.close()


def until_sync(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait (blocking) until `check` holds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.02)


def test_a_state_file_has_the_session_columns_and_judges_by_lease(tmp_path: Path) -> None:
    s = open_store(tmp_path / "state.db")
    try:
        assert s.schema_version() == 4  # one schema on both databases
        assert s.session() is None
        assert s.renew_replica("r1", "a:1", 60.0, s.session()) == [("r1", "a:1")]
    finally:
        s.close()


async def test_a_replica_whose_session_the_database_ended_holds_on_through_a_new_one(
    pg_cluster: Cluster, pg_url: str
) -> None:
    """An operator's pg_terminate_backend, a dropped connection: the replica renews through a new session within
    its grace; it stops nothing, nothing moves, no DPU's lease lapses."""
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        theirs = only_held_by(planes, "r2")
        held = {r: dict(p.service.agents) for r, p in planes.items()}
        session = planes["r2"].service.store.session()
        assert session is not None
        fences = {r: p.service._fences for r, p in planes.items()}
        with LapseWatch(dpus) as watch:
            pg_cluster.sql(pg_url, f"SELECT pg_terminate_backend({session[0]})")
            await until(lambda: planes["r2"].service.store.session() != session, 10, "r2 takes a new session")
            await asyncio.sleep(SESSION_GRACE_S + 2 * REPLICA_LEASE_S)  # past the grace, and renewals on
            assert settled(planes, dpus) and theirs in planes["r2"].service.agents
        assert watch.lapsed() == [], watch.least
        assert {r: p.service._fences for r, p in planes.items()} == fences
        assert {r: dict(p.service.agents) for r, p in planes.items()} == held  # the same agents throughout


async def test_a_replica_that_misses_its_grace_stops_writing_and_joins_again(pg_cluster: Cluster, pg_url: str) -> None:
    """r2's session ends while its polls stall (a busy loop, a slow network): the others take its DPU when the
    grace runs out, before its lease would have; the DPU's growth waits for r2's own leases; r2, its poll back,
    finds its lease ended, stops writing, and joins again. No DPU's lease lapses."""
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        theirs = only_held_by(planes, "r2")
        r2 = planes["r2"].replicas
        assert r2 is not None
        before = planes["r2"].service.agents[theirs]
        session = planes["r2"].service.store.session()
        assert session is not None
        fences = planes["r2"].service._fences
        poll = await stall_poll(r2)
        # As if r2 gave DPUs longer leases than r1 does (replicas need not share settings): its last renewal says.
        r2_lease_s = 3 * LEASE_S
        pg_cluster.sql(pg_url, f"UPDATE replicas SET dpu_lease_s = {r2_lease_s} WHERE id = 'r2'")
        with LapseWatch(dpus) as watch:
            ended = time.monotonic()
            pg_cluster.sql(pg_url, f"SELECT pg_terminate_backend({session[0]})")
            took = await until(lambda: theirs in planes["r1"].service.agents, 3 * REPLICA_LEASE_S, "r1 takes it")
            assert took < REPLICA_LEASE_S, took
            # r2, alive, may renew the DPU's lease at its share until it notices (within its replica lease):
            # until each such lease (r2's length, not r1's) has ended, the DPU not confirming a smaller share from
            # r1 holds growth back.
            r1 = planes["r1"].service
            assert r1.lapse_at(theirs) >= r1.clock.monotonic() + r2_lease_s + REPLICA_LEASE_S - took - 0.5
            await resume_poll(r2, poll)
            await until(lambda: planes["r2"].service._fences > fences, 3 * REPLICA_LEASE_S, "r2 stops writing")
            await until(lambda: settled(planes, dpus), 60, "r2 holds its DPU again")
            print(f"r1 held r2's DPU {took:.2f} s after r2's session ended; r2 back {time.monotonic() - ended:.2f} s")
        assert watch.lapsed() == [], watch.least
        assert planes["r2"].service.agents[theirs] is not before  # a new agent, bidding anew
        assert planes["r2"].service.store.session() != session


async def test_a_database_that_restarts_ends_every_session_and_nobody_stops(
    pg_cluster: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row then names a session of the server's earlier start: the leases decide, and no replica stops
    writing or takes another's DPUs while the database is away for less than a lease."""
    # A replica lease the restart (an immediate stop, then a start) stays well inside on a busy machine (CI
    # has seen 16 s).
    monkeypatch.setattr(replica_fleet, "REPLICA_LEASE_S", 60.0)
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        fences = {r: p.service._fences for r, p in planes.items()}
        held = {r: dict(p.service.agents) for r, p in planes.items()}
        epoch = planes["r1"].service.store.session()
        with LapseWatch(dpus) as watch:
            await asyncio.to_thread(pg_cluster.crash)
            await asyncio.to_thread(pg_cluster.start)
            # Each replica's next call on its old session fails; it takes a new one without stopping.
            for p in planes.values():
                with contextlib.suppress(sqlite3.OperationalError):  # (unless a call of its own found it first)
                    await asyncio.to_thread(p.service.store.log_head)
            await until(lambda: all(not p.service.store.session_broken() for p in planes.values()), 30, "new sessions")
            await asyncio.sleep(SESSION_GRACE_S + 1.0)  # each renewed naming its new session
            assert settled(planes, dpus)
        assert watch.lapsed() == [], watch.least
        assert {r: p.service._fences for r, p in planes.items()} == fences
        assert {r: dict(p.service.agents) for r, p in planes.items()} == held  # the same agents throughout
        assert planes["r1"].service.store.session() != epoch
