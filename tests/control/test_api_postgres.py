"""A served control plane on PostgreSQL (`serve --db postgresql://...`): Apply and Delete through the API,
a restart on the same database with the state intact, and the integrity refusal when a row is edited
behind the change log, at start and while serving."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Pod, Router
from dpu_limiter.server import ControlPlane
from dpu_limiter.store import StateMismatch
from dpu_limiter.stores import verify_file
from helpers.postgres import Cluster
from helpers.processes import cli, free_port

pytestmark = pytest.mark.timeout(120)

CAP_A = Cap(8e6, 8e6, 10.0, 100_000)


async def _written(url: str) -> None:
    """Apply a fleet, change it and delete part of it through a control plane on `url`, then stop it."""
    plane = ControlPlane(url, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply(
                pods=[Pod("a", ("10.0.1.0/24",)), Pod("b", ("10.0.2.0/24",))],
                dpus=[Dpu("dpu-a", "127.0.0.1:1", 1, "a"), Dpu("dpu-b", "127.0.0.1:2", 1, "b")],
                caps={"a": Cap(4e6, 4e6, 10.0, 100_000), "b": Cap(2e6, 2e6, 10.0, 100_000)},
                routers=[Router("r1", ("a", "b"))],
            )
            await c.apply(caps={"a": CAP_A})  # an update in place
            await c.delete(pods=["b"], dpus=["dpu-b"], caps=["b"], routers=["r1"])
    finally:
        await plane.stop()


async def test_apply_delete_restart_on_postgres(pg_url: str) -> None:
    await _written(pg_url)
    plane = ControlPlane(pg_url, "127.0.0.1:0")  # a restart: verified against the log, then served
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            assert [p.name for p in await c.list_pods()] == ["a"]
            assert [d.name for d in await c.list_dpus()] == ["dpu-a"]
            assert (await c.get_pod_cap("a")).cap == CAP_A
            assert await c.list_routers() == []
        assert plane.service.state.generation == 3
    finally:
        await plane.stop()
    verdict = verify_file(pg_url)
    assert verdict.ok and verdict.records == 12, verdict  # 7 objects; 1 cap changed; 4 deleted
    res = cli("audit", "verify", "--db", pg_url)
    assert res.returncode == 0 and "stored state matches it" in res.stdout, res


async def test_a_row_edited_behind_the_log_is_refused_on_postgres(pg_cluster: Cluster, pg_url: str) -> None:
    await _written(pg_url)
    pg_cluster.sql(pg_url, "UPDATE caps SET egress_bps = 1e12 WHERE pod = 'a'")
    where = "caps/a.egress_bps: stored 1e+12, the log says 8e+06"
    with pytest.raises(StateMismatch) as exc:
        ControlPlane(pg_url, "127.0.0.1:0")
    assert where in str(exc.value) and pg_url in str(exc.value)
    command = [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", pg_url, "--listen", f"127.0.0.1:{free_port()}"]
    res = subprocess.run(command, capture_output=True, text=True, timeout=60)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and where in lines[0], res.stderr
    res = cli("audit", "verify", "--db", pg_url)
    assert res.returncode == 1 and "TAMPERED" in res.stderr and where in res.stderr, res


async def test_an_edit_while_serving_is_not_taken_on_postgres(pg_cluster: Cluster, pg_url: str) -> None:
    await _written(pg_url)
    plane = ControlPlane(pg_url, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            pg_cluster.sql(pg_url, "UPDATE caps SET egress_bps = 1e12 WHERE pod = 'a'")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.apply(pods=[Pod("c", ("10.0.3.0/24",))])
            assert err.value.code() == grpc.StatusCode.DATA_LOSS
            assert "caps/a.egress_bps" in (err.value.details() or "")
    finally:
        await plane.stop()


async def test_a_second_control_plane_on_one_database_is_a_replica(pg_url: str) -> None:
    """Any number of control planes serve one PostgreSQL database (replicas.py; tests/control/test_replicas.py)."""
    planes = [ControlPlane(pg_url, "127.0.0.1:0"), ControlPlane(pg_url, "127.0.0.1:0")]
    try:
        for p in planes:
            await p.start()
        async with LimiterClient(planes[0].address) as a, LimiterClient(planes[1].address) as b:
            await a.apply_pod("a", ["10.0.1.0/24"])
            assert [p.name for p in await b.list_pods()] == ["a"]
    finally:
        for p in planes:
            await p.stop()


def test_an_unreachable_database_is_one_line(pg_cluster: Cluster) -> None:
    url = f"postgresql://dpu:secret@127.0.0.1:{free_port()}/nosuch"
    res = cli("serve", "--db", url, "--listen", f"127.0.0.1:{free_port()}")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "secret" not in res.stderr and "dpu:***@" in lines[0], res.stderr
