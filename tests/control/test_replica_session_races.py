"""Races of judging a replica gone by its database session (PgStore._live, replicas.Replicas._new_session).

Each test states a guarantee docs/replicas.md gives ("Who holds which DPU", "Fencing") and drives the database
into a case the session rule must get right: PostgreSQL's crash recovery (every backend ends, the server's start
time stays), a replica taken for gone and a restart before it noticed.

Real parts: a throwaway PostgreSQL cluster, control planes in this process serving gRPC on loopback, embedded
P4Runtime targets in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3

import psycopg
import pytest

from helpers import replica_fleet
from helpers.postgres import Cluster
from helpers.replica_fleet import LapseWatch, holders, resume_poll, settled, settled_fleet, stall_poll, until

pytestmark = pytest.mark.timeout(240)


def _start_time(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch from pg_postmaster_start_time())::double precision").fetchone()
    assert row is not None
    return float(row[0])


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


def _crash_one_backend(url: str) -> None:
    """Kill one server process (SIGKILL): the postmaster ends every other backend and recovers from the WAL
    (restart_after_crash, on by default), without starting again: pg_postmaster_start_time() stays."""
    conn = psycopg.connect(url, autocommit=True)
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    os.kill(int(row[0]), signal.SIGKILL)
    with contextlib.suppress(Exception):
        conn.close()


async def test_crash_recovery_ends_every_session_and_nobody_stops(
    pg_cluster: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's crash recovery (one backend died: the postmaster ends all the others and recovers) ends every
    session as a restart does, but keeps the server's start time. As for a restart, the leases should decide and
    nobody should stop writing while the database is away for less than a lease."""
    monkeypatch.setattr(replica_fleet, "REPLICA_LEASE_S", 60.0)  # CI has seen recovery take 22 s
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        fences = {r: p.service._fences for r, p in planes.items()}
        held = {r: dict(p.service.agents) for r, p in planes.items()}
        started = _start_time(pg_url)
        sessions = {r: p.service.store.session() for r, p in planes.items()}
        with LapseWatch(dpus) as watch:
            await asyncio.to_thread(_crash_one_backend, pg_url)
            await until(lambda: not _answers(pg_url), 10, "the server recovers")  # (it may be quick)
            await until(lambda: _answers(pg_url), 60, "the server takes connections again")
            assert _start_time(pg_url) == started  # crash recovery: the same start time, every session ended
            for p in planes.values():
                with contextlib.suppress(sqlite3.OperationalError):
                    await asyncio.to_thread(p.service.store.log_head)
            await until(lambda: all(not p.service.store.session_broken() for p in planes.values()), 30, "new sessions")
            await asyncio.sleep(4.0)
            await until(lambda: settled(planes, dpus), 30, "settled")
        assert {r: p.service.store.session() for r, p in planes.items()} != sessions
        assert watch.lapsed() == [], watch.least
        # Judged by pg_postmaster_start_time() alone, every replica took every other (and itself) for gone,
        # stopped writing and joined again; the DPUs moved to whichever joined first, then back.
        assert {r: p.service._fences for r, p in planes.items()} == fences
        assert {r: dict(p.service.agents) for r, p in planes.items()} == held


async def test_a_replica_taken_for_gone_before_a_restart_stops_writing_before_it_holds_again(
    pg_cluster: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r2's session ends (its connection dropped, or an operator's pg_terminate_backend) while its poll stalls
    (a busy loop, a slow network), and r1 takes its DPU when r2's grace runs out; the database restarts before r2
    has noticed. On the new server r2's session says nothing (every session of before ended), yet its lease was
    ended with the grace: r2 must stop writing before it holds anything again, else it resumes with the agents
    and the shares it had before r1 held the pod."""
    monkeypatch.setattr(replica_fleet, "REPLICA_LEASE_S", 20.0)  # the restart well inside r2's lease and fence
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        (theirs,) = [n for n, (r,) in holders(planes).items() if r == "r2"]
        r2 = planes["r2"].replicas
        assert r2 is not None
        before = planes["r2"].service.agents[theirs]
        fences = planes["r2"].service._fences
        session = planes["r2"].service.store.session()
        assert session is not None
        poll = await stall_poll(r2)
        pg_cluster.sql(pg_url, f"SELECT pg_terminate_backend({session[0]})")
        await until(lambda: theirs in planes["r1"].service.agents, 10, "r1 takes r2's DPU (r2's grace ran out)")
        await until(lambda: dpus[theirs].primaries() != [before.switch.election_id], 10, "r1 outbids r2")
        await asyncio.to_thread(pg_cluster.crash)
        await asyncio.to_thread(pg_cluster.start)
        await resume_poll(r2, poll)
        with contextlib.suppress(sqlite3.OperationalError):  # a call of r2's service finds its session gone
            await asyncio.to_thread(planes["r2"].service.store.log_head)
        await until(lambda: theirs not in planes["r1"].service.agents, 30, "r1 lets r2's DPU go (r2 live again)")
        await asyncio.sleep(2.0)
        # r2's DPU was held by r1 meanwhile: r2 must have stopped writing, and hold it (if at all) through a new
        # agent that adopted what the store says, not the one it had before r1 took over.
        assert planes["r2"].service._fences > fences, "r2 never stopped writing after its DPU was taken"
        assert planes["r2"].service.agents.get(theirs) is not before
