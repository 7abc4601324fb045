"""A replica is gone when the database shows its session ended, not only when its lease does (store.SESSION_OPEN).

A killed `serve` process's connection closes as it dies, and PostgreSQL ends its session at once: the others take
its DPUs without waiting for its lease (seconds). A replica alive whose session the database ended (an operator's
pg_terminate_backend, a dropped connection) may have been taken for gone the same way, so it stops writing to its
DPUs before it writes anything through another session, then joins again. A database that started again ended
every session: those rows wait for their leases, and nobody stops.

Real parts: a throwaway PostgreSQL cluster, control planes in this process serving gRPC on loopback, embedded
P4Runtime targets in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

import pytest

from dpu_limiter.store_pg import PgStore, SessionLost
from dpu_limiter.stores import open_store
from helpers import replica_fleet
from helpers.postgres import Cluster
from helpers.replica_fleet import LEASE_S, REPLICA_LEASE_S, LapseWatch, only_held_by, settled, settled_fleet, until

pytestmark = pytest.mark.timeout(240)


def _live_without(store: PgStore, gone: str, timeout: float = 10.0) -> list[tuple[str, str]]:
    """The live set once `gone` has left it (its session's end takes the server a moment)."""
    deadline = time.monotonic() + timeout
    while (live := store.live_replicas()) and gone in dict(live):
        assert time.monotonic() < deadline, live
        time.sleep(0.02)
    return live


def test_a_replica_whose_session_ended_is_not_live_though_its_lease_runs(pg_cluster: Cluster, pg_url: str) -> None:
    s1, s2 = PgStore(pg_url), PgStore(pg_url)
    try:
        assert s1.schema_version() == 3
        s1.pin_session()
        session = s1.session()
        assert s1.renew_replica("r1", "a:1", 60.0, session) == [("r1", "a:1")]
        assert s2.renew_replica("r2", "a:2", 60.0, s2.session()) == [("r1", "a:1"), ("r2", "a:2")]
        assert s2.renew_replica("r3", "a:3", 60.0) == [("r1", "a:1"), ("r2", "a:2"), ("r3", "a:3")]  # no session
        pg_cluster.sql(pg_url, f"SELECT pg_terminate_backend({session[0]})")
        # Its lease runs a minute on; its session is over: gone, for every replica that asks.
        assert _live_without(s2, "r1") == [("r2", "a:2"), ("r3", "a:3")]
        # The pinned store is not connected again behind its replica's back: the call that finds the session
        # gone fails, and so does every later one, until its replica asks for another session.
        with pytest.raises(sqlite3.OperationalError):
            s1.live_replicas()
        assert s1.session_broken()
        with pytest.raises(SessionLost):
            s1.live_replicas()
        s1.new_session()
        assert not s1.session_broken() and s1.session() != session
        assert s1.renew_replica("r1", "a:1", 60.0, s1.session()) == [("r1", "a:1"), ("r2", "a:2"), ("r3", "a:3")]
        # A row written before the server last started: every session of then ended, whatever its number says;
        # the lease decides (the others wait for it rather than take every replica for gone).
        pg_cluster.sql(pg_url, "UPDATE replicas SET session_pid = 2147483000, session_epoch = 1.0 WHERE id = 'r2'")
        assert [r for r, _ in s1.live_replicas()] == ["r1", "r2", "r3"]
        pg_cluster.sql(pg_url, "UPDATE replicas SET session_epoch = NULL WHERE id = 'r2'")
        assert [r for r, _ in s1.live_replicas()] == ["r1", "r2", "r3"]
        # Of this start, and not open: gone.
        # (The server's epoch as the store works it out: a crash recovery earlier in the session moved it.)
        pg_cluster.sql(pg_url, f"UPDATE replicas SET session_epoch = {s1.server_epoch()!r} WHERE id = 'r2'")
        assert [r for r, _ in s1.live_replicas()] == ["r1", "r3"]
    finally:
        s1.close()
        s2.close()


def test_a_state_file_has_the_session_columns_and_judges_by_lease(tmp_path: Path) -> None:
    s = open_store(tmp_path / "state.db")
    try:
        assert s.schema_version() == 3  # one schema on both databases
        assert s.session() is None
        assert s.renew_replica("r1", "a:1", 60.0, s.session()) == [("r1", "a:1")]
    finally:
        s.close()


async def test_a_replica_whose_session_the_database_ended_stops_writing_and_joins_again(
    pg_cluster: Cluster, pg_url: str
) -> None:
    """Its DPUs move to another replica before its lease ends; it stops writing (the DPUs refuse it anyway, the
    others having bid higher) and joins again through a new session; no DPU's lease lapses."""
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        theirs = only_held_by(planes, "r2")
        before = planes["r2"].service.agents[theirs]
        session = planes["r2"].service.store.session()
        assert session is not None
        fences = planes["r2"].service._fences
        with LapseWatch(dpus) as watch:
            ended = time.monotonic()
            pg_cluster.sql(pg_url, f"SELECT pg_terminate_backend({session[0]})")
            # The others take r2 for gone at once: r1 holds its DPU well before r2's lease (4 s) could end.
            took = await until(lambda: theirs in planes["r1"].service.agents, 3 * REPLICA_LEASE_S, "r1 takes it")
            assert took < REPLICA_LEASE_S, took
            # r2, alive, may renew the DPU's lease at its share until it notices (within its replica lease):
            # until each such lease has ended, the DPU not confirming a smaller share from r1 holds growth back.
            r1 = planes["r1"].service
            assert r1.lapse_at(theirs) >= r1.clock.monotonic() + LEASE_S + REPLICA_LEASE_S - took - 0.5
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
    # A replica lease the restart (an immediate stop, then a start) stays well inside on a busy machine.
    monkeypatch.setattr(replica_fleet, "REPLICA_LEASE_S", 12.0)
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
            await asyncio.sleep(4.0)  # renewals on the new sessions
            assert settled(planes, dpus)
        assert watch.lapsed() == [], watch.least
        assert {r: p.service._fences for r, p in planes.items()} == fences
        assert {r: dict(p.service.agents) for r, p in planes.items()} == held  # the same agents throughout
        assert planes["r1"].service.store.session() != epoch
