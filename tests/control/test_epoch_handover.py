"""A DPU's next holder resumes from the pipeline instance its last holder found (store.dpu_epochs).

A holder that finds an instance it did not arm takes it for a stranger's: another control plane may have leased
it, so no lease until that instance's start has aged out of every window (a red team's second budget,
tests/control/test_reset_hold.py). A replica taking a DPU over used to judge its predecessor so: a DPU loaded
less than a window before a takeover lost its lease for the rest of that window (a window-mode cap: up to a
minute at its floor; the joining-replica test lapsed a DPU about 1 time in 5). Now the holder stores the
instance it found, and when the DPU's state was lost then; its successor knows it. One the store does not name
is still a stranger's.

Real parts: a throwaway PostgreSQL cluster, control planes in this process serving gRPC on loopback, embedded
P4Runtime targets in this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from finsy.proto import p4r

from dpu_limiter.client import LimiterClient
from helpers.postgres import Cluster
from helpers.replica_fleet import (
    CAP,
    LapseWatch,
    fleet,
    only_held_by,
    pods_for,
    replicas,
    settled,
    targets,
    until,
)

pytestmark = pytest.mark.timeout(180)

WINDOW_S = 60.0  # a takeover lands well inside the window that began as the DPUs' pipelines were loaded


@pytest.mark.parametrize("known", [True, False], ids=["recorded", "not-recorded"])
async def test_a_takeover_inside_a_fresh_instance_s_window_keeps_the_lease_its_holder_recorded(
    pg_cluster: Cluster, pg_url: str, known: bool
) -> None:
    ids = ["r1", "r2"]
    pods = pods_for(ids, 1)
    async with targets(len(pods)) as ts, replicas(pg_url, ids) as planes:
        async with LimiterClient(planes["r1"].address) as c:
            dpus = await fleet(c, pods, ts, dataclasses.replace(CAP, mode="window", window_s=WINDOW_S))
        await until(lambda: settled(planes, dpus), 60, "every DPU held once, leased")
        theirs = only_held_by(planes, "r2")
        if not known:  # as if its holder had died before storing it, or a stranger had armed it
            await until(lambda: _recorded(pg_url, theirs), 10, "r2 records its DPU's instance")
            pg_cluster.sql(pg_url, f"DELETE FROM dpu_epochs WHERE dpu = '{theirs}'")
        with LapseWatch(dpus) as watch:
            await planes["r2"].stop()
            del planes["r2"]
            r1 = planes["r1"].service
            await until(lambda: theirs in r1.agents and r1.agents[theirs].status.primary, 30, "r1 holds r2's DPU")
            if known:
                await until(lambda: settled(planes, dpus), 30, "r1's agent converged, with a lease")
            await asyncio.sleep(2.0)
        agent = planes["r1"].service.agents[theirs]
        if known:
            assert watch.lapsed() == [], watch.least
            assert agent.status.lease_generation is not None
        else:
            # A stranger's instance: no lease for the rest of its first window (the DPU at its floor).
            assert watch.lapsed() == [theirs], watch.least
            assert dpus[theirs].lease_left_us() <= 0


async def test_a_loss_found_while_the_store_is_away_is_stored_within_its_hold(
    pg_cluster: Cluster, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-back finds the DPU's meters reset (its instance the same) while the store cannot be written: the
    agent holds its lease back all the same, and stores when the state was lost as soon as the store is back,
    during the hold (its successor needs it then), not at the next clock echo after it."""
    ids = ["r1"]
    pods = pods_for(ids, 1)
    async with targets(len(pods)) as ts, replicas(pg_url, ids) as planes:
        async with LimiterClient(planes["r1"].address) as c:
            dpus = await fleet(c, pods, ts, dataclasses.replace(CAP, mode="window", window_s=WINDOW_S))
        await until(lambda: settled(planes, dpus), 60, "the DPU held, leased")
        (name,) = dpus
        await until(lambda: _recorded(pg_url, name), 10, "its instance recorded")
        pg_cluster.sql(pg_url, "ALTER TABLE dpu_epochs RENAME TO dpu_epochs_away")
        try:
            pipeline = ts[0].device.pipeline
            assert pipeline is not None
            lost = time.time()
            for m in pipeline.p4info.meters:  # every cell unconfigured, as after a reset; registers kept
                reset = p4r.MeterEntry(meter_id=m.preamble.id)
                pipeline.write(p4r.Update(type=p4r.Update.MODIFY, entity=p4r.Entity(meter_entry=reset)))
            # Found by a pass a poke starts (as a renewal's), which diffs from its last read-back: it used to take
            # the reset for drift, rewrite the meters and lease on; only a periodic full read-back found a loss.
            planes["r1"].service.agents[name].poke()
            await until(lambda: "could not store when its state was lost" in caplog.text, 30, "the loss found")
        finally:
            pg_cluster.sql(pg_url, "ALTER TABLE dpu_epochs_away RENAME TO dpu_epochs")
        back = time.monotonic()
        await until(lambda: (_lost_at(pg_url, name) or 0.0) >= lost, 20, "the loss stored")
        assert time.monotonic() - back < WINDOW_S / 2  # well inside the hold
        assert planes["r1"].service.agents[name].status.lease_generation is None or dpus[name].lease_left_us() <= 0


def _lost_at(url: str, dpu: str) -> float | None:
    """When the store says `dpu`'s state was last lost (seconds since the epoch), or None."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT lost_at FROM dpu_epochs WHERE dpu = %s", (dpu,)).fetchone()
        return None if row is None else row[0]


def _recorded(url: str, dpu: str) -> bool:
    """Whether the store names a pipeline instance for `dpu`."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM dpu_epochs WHERE dpu = %s", (dpu,)).fetchone() is not None
