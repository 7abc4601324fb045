"""Replicas: several control planes serving one PostgreSQL database share the fleet (replicas.py).

Real parts throughout: a throwaway PostgreSQL cluster, control planes serving gRPC on loopback (in this
process, and one as a `serve` process that is killed), embedded P4Runtime targets in this process. What is
asserted are the guarantees: each DPU has exactly one primary, the one replica that holds it; a write through
any replica reaches every DPU; when a replica stops (or is killed, or loses the database) its DPUs move
before any DPU's lease lapses, and the DPU refuses the old holder's writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from finsy import P4MeterConfig, P4MeterEntry
from finsy.p4client import P4ClientError

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Pod, Role
from dpu_limiter.replicas import owner
from dpu_limiter.server import ControlPlane
from dpu_limiter.service import ELSEWHERE
from dpu_limiter.settings import Settings
from dpu_limiter.store import Store
from dpu_limiter.stores import read_audit, verify_file
from dpu_limiter.units import CPU_PORT
from dpu_softswitch.server import Device, P4RuntimeService, add_to_server
from helpers import postgres
from helpers.p4rt import lease_entry, schema
from helpers.postgres import Cluster
from helpers.processes import free_port, stop, wait_port

pytestmark = pytest.mark.timeout(240)

LEASE_S = 15.0  # the DPUs' lease: renewed every 5 s, so a takeover must come within 10 s of a holder's end
REPLICA_LEASE_S = 4.0  # a replica's lease in the database
CAP = Cap(8e6, 8e6, 10.0, 100_000)


class Target:
    """An embedded target in this process, served on loopback, with its P4Runtime service (its streams)."""

    def __init__(self, device: Device, server: grpc.aio.Server, service: P4RuntimeService, address: str) -> None:
        self.device, self.server, self.service, self.address = device, server, service, address

    def primaries(self) -> list[int]:
        """The election ids of the streams the target takes as primary (at most one)."""
        streams = self.service.streams
        top = max((s.election_id for s in streams), default=None)
        return [s.election_id for s in streams if s.election_id == top]

    def lease_left_us(self) -> int:
        """How long the lease the target holds runs on (us, on its own clock; <= 0: lapsed or none)."""
        pipeline = self.device.pipeline
        if pipeline is None:
            return 0
        [entity] = pipeline.read(lease_entry(schema(), 0, 0))
        params = {p.param_id: int.from_bytes(p.value, "big") for p in entity.table_entry.action.action.params}
        return params.get(2, 0) - self.device.clock.now_us()


@contextlib.asynccontextmanager
async def targets(n: int) -> AsyncIterator[list[Target]]:
    """`n` embedded targets in this process, each with its CPU port (the clock echo)."""
    out = []
    try:
        for _ in range(n):
            device = Device(1, cpu_port=CPU_PORT)
            server = grpc.aio.server()
            service = add_to_server(server, device)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            out.append(Target(device, server, service, f"127.0.0.1:{port}"))
        yield out
    finally:
        await asyncio.gather(*(t.server.stop(grace=0) for t in out))


def settings(replica_id: str) -> Settings:
    """A replica's settings in these tests."""
    return Settings(lease_s=LEASE_S, replica_id=replica_id, replica_lease_s=REPLICA_LEASE_S)


@contextlib.asynccontextmanager
async def replicas(url: str, ids: list[str]) -> AsyncIterator[dict[str, ControlPlane]]:
    """Control planes on one database, started at once, stopped at the end (those still running)."""
    planes = {r: ControlPlane(url, "127.0.0.1:0", settings=settings(r)) for r in ids}
    try:
        await asyncio.gather(*(p.start() for p in planes.values()))
        yield planes
    finally:
        await asyncio.gather(*(p.stop() for p in planes.values() if p.replicas is not None and p.replicas._tasks))


def pods_for(ids: list[str], per_replica: int) -> list[str]:
    """Pod names that rendezvous hashing spreads over `ids`, `per_replica` each (so that every replica holds
    some; which one holds which is still the replicas' own work)."""
    picked: dict[str, list[str]] = {r: [] for r in ids}
    k = 0
    while any(len(v) < per_replica for v in picked.values()):
        name = f"pod-{k}"
        if len(picked[who := owner(name, sorted(ids))]) < per_replica:
            picked[who].append(name)
        k += 1
    return sorted(p for v in picked.values() for p in v)


async def fleet(c: LimiterClient, pods: list[str], ts: list[Target]) -> dict[str, Target]:
    """One write: each pod with a capped uplink DPU on its own target; returns the targets by DPU name."""
    dpus = {f"dpu-{p}": t for p, t in zip(pods, ts, strict=True)}
    await c.apply(
        pods=[Pod(p, (f"10.{i}.0.0/24",)) for i, p in enumerate(pods)],
        dpus=[Dpu(f"dpu-{p}", t.address, 1, p, Role.POD_UPLINK, 0, 1) for p, t in zip(pods, ts, strict=True)],
        caps=dict.fromkeys(pods, CAP),
    )
    return dpus


@contextlib.asynccontextmanager
async def settled_fleet(
    url: str, ids: list[str], per_replica: int, through: str
) -> AsyncIterator[tuple[dict[str, ControlPlane], dict[str, Target], list[str]]]:
    """Replicas `ids` on one database and a fleet of `per_replica` pods each written through replica `through`,
    once every DPU is held once, primary and converged: (the replicas, the targets by DPU, the pods)."""
    pods = pods_for(ids, per_replica)
    async with targets(len(pods)) as ts, replicas(url, ids) as planes:
        async with LimiterClient(planes[through].address) as c:
            dpus = await fleet(c, pods, ts)
        await until(lambda: settled(planes, dpus), 60, "every DPU held once, primary and converged")
        yield planes, dpus, pods


def holders(planes: dict[str, ControlPlane]) -> dict[str, list[str]]:
    """Which replicas have an agent for each DPU."""
    out: dict[str, list[str]] = {}
    for r, p in planes.items():
        for name in p.service.agents:
            out.setdefault(name, []).append(r)
    return out


def settled(planes: dict[str, ControlPlane], dpus: dict[str, Target]) -> bool:
    """Every DPU held by exactly one replica, the one rendezvous hashing over `planes` gives its pod, whose agent
    is the DPU's only primary and has converged with a lease."""
    held, ids = holders(planes), sorted(planes)
    for name, t in dpus.items():
        if held.get(name, []) != [owner(name.removeprefix("dpu-"), ids)]:
            return False
        agent = planes[held[name][0]].service.agents[name]
        if not (agent.status.primary and agent.status.converged and agent.status.lease_generation is not None):
            return False
        if t.primaries() != [agent.switch.election_id]:
            return False
    return True


async def until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Wait until `check()` holds (polling); the seconds it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


class LapseWatch:
    """Samples every target's lease while it runs: the least lease left ever seen (us)."""

    def __init__(self, dpus: dict[str, Target]) -> None:
        self.dpus = dpus
        self.least: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            for name, t in self.dpus.items():
                left = t.lease_left_us()
                self.least[name] = min(self.least.get(name, left), left)
            await asyncio.sleep(0.05)

    def __enter__(self) -> LapseWatch:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def lapsed(self) -> list[str]:
        """The DPUs whose lease ran out at some sample."""
        return sorted(n for n, left in self.least.items() if left <= 0)


async def test_replicas_spread_the_dpus_and_each_has_one_primary(pg_url: str) -> None:
    ids = ["r1", "r2", "r3"]
    async with settled_fleet(pg_url, ids, 2, "r1") as (planes, dpus, pods):
        held = holders(planes)
        assert {r for (r,) in held.values()} == set(ids)  # each replica holds some
        for name, (r,) in held.items():
            assert r == owner(name.removeprefix("dpu-"), ids)
        # Every replica answers status for the whole fleet: its own DPUs, and who holds the others.
        for r, plane in planes.items():
            async with LimiterClient(plane.address) as c:
                rows = {d.name: d for d in (await c.status()).dpus}
            assert sorted(rows) == sorted(dpus)
            for name, row in rows.items():
                if held[name] == [r]:
                    assert row.converged and row.primary and row.lease_state == "held", row
                else:
                    holder = held[name][0]
                    assert row.lease_state == ELSEWHERE and not row.primary, row
                    assert f"{holder} at {planes[holder].address}" in row.last_error, row
            # Usage of a pod held elsewhere names the holder rather than reading as idle.
            async with LimiterClient(plane.address) as c:
                elsewhere = next(p for p in pods if held[f"dpu-{p}"] != [r])
                usage = (await c.usage(elsewhere)).usage
            assert all(u.dpus_unread == 1 for u in usage), usage


async def test_a_write_through_one_replica_reaches_dpus_another_holds(pg_url: str) -> None:
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, pods):
        (theirs,) = [p for p in pods if owner(p, ids) == "r2"]
        target = dpus[f"dpu-{theirs}"]
        async with LimiterClient(planes["r1"].address) as c:
            await c.set_pod_cap(theirs, 4e6, 2e6, 10.0, 50_000)  # through r1; r2 holds the pod

        def programmed() -> bool:
            assert target.device.pipeline is not None
            cfg = target.device.pipeline.program.meters["LimiterIngress.boundary_meter"].get_p4runtime_config(0)
            return cfg is not None and cfg[0] == 499_000  # 4 Mbit/s egress in bytes/s (cir), less ARP's 1000

        took = await until(programmed, 30, "r2 applies r1's write on its DPU")
        assert holders(planes)[f"dpu-{theirs}"] == ["r2"]
        assert planes["r2"].service.state.caps[theirs].egress_bps == 4e6
        print(f"a write through r1 reached r2's DPU in {took:.2f} s")


async def test_a_stopped_replica_s_dpus_move_before_any_lease_lapses(pg_url: str) -> None:
    ids = ["r1", "r2", "r3"]
    async with settled_fleet(pg_url, ids, 2, "r2") as (planes, dpus, _pods):
        theirs = [n for n, (r,) in holders(planes).items() if r == "r3"]
        with LapseWatch(dpus) as watch:
            await asyncio.sleep(1.0)
            await planes["r3"].stop()
            gone = planes.pop("r3")
            took = await until(lambda: settled(planes, dpus), 3 * LEASE_S, "r3's DPUs held elsewhere")
            await asyncio.sleep(1.0)
        assert not gone.service.agents
        assert watch.lapsed() == [], watch.least
        assert {r for (r,) in holders(planes).values()} == {"r1", "r2"}
        print(f"{len(theirs)} DPUs of a stopped replica primary elsewhere and converged in {took:.2f} s")


async def test_a_killed_serve_process_s_dpus_move_before_any_lease_lapses(pg_url: str, tmp_path: Path) -> None:
    ids = ["r1", "r2"]
    pods = pods_for(ids, 2)
    port = free_port()
    command = serve_command(pg_url, port, "r2")
    log = tmp_path / "r2.log"
    async with targets(len(pods)) as ts, replicas(pg_url, ["r1"]) as planes:
        with log.open("ab") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            await asyncio.to_thread(wait_port, port, proc, 60)
            async with LimiterClient(f"127.0.0.1:{port}") as c:
                dpus = await fleet(c, pods, ts)  # through the process

                def theirs_held() -> list[str]:
                    return [n for n, t in dpus.items() if t.primaries() and n not in planes["r1"].service.agents]

                await until(lambda: len(theirs_held()) == 2, 60, "r2 (the process) holds its DPUs")
                await until(lambda: all(t.lease_left_us() > 0 for t in dpus.values()), 60, "every DPU leased")
            with LapseWatch(dpus) as watch:
                await asyncio.sleep(1.0)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                took = await until(lambda: settled(planes, dpus), 3 * LEASE_S, "r1 holds every DPU")
                await asyncio.sleep(1.0)
            assert watch.lapsed() == [], watch.least
            print(f"2 DPUs of a killed serve process primary on r1 and converged in {took:.2f} s")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


async def test_a_stale_primary_is_fenced(pg_url: str) -> None:
    """r2 loses the database (its renewals fail) and, here, is kept from fencing itself (its watchdog is
    stopped): r1 takes its DPU with a higher election id, r2's agent is told it is a backup, and the DPU refuses
    r2's writes. (With its watchdog, r2 stops writing before that: the next test.)"""
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        (theirs,) = [n for n, (r,) in holders(planes).items() if r == "r2"]
        stale = planes["r2"]
        assert stale.replicas is not None
        agent = stale.service.agents[theirs]
        old_id = agent.switch.election_id

        def cut() -> Store:
            raise sqlite3.OperationalError("connection to the database lost")

        stale.replicas._tasks[1].cancel()  # its watchdog: without it, it would stop writing itself
        stale.replicas._open_registry = cut
        stale.replicas._drop_registry()
        with LapseWatch(dpus) as watch:
            await until(lambda: settled({"r1": planes["r1"]}, dpus), 3 * LEASE_S, "r1 takes r2's DPU")
        assert watch.lapsed() == [], watch.least
        new_id = planes["r1"].service.agents[theirs].switch.election_id
        assert new_id > old_id and dpus[theirs].primaries() == [new_id]
        # r2's agent still runs, as a backup, and the DPU refuses its writes.
        await until(lambda: not agent.status.primary, 10, "r2's agent told it is a backup")
        raised = P4MeterConfig(cir=10**9, cburst=10**6, pir=10**9, pburst=10**6)  # a cap far above the pod's
        update = P4MeterEntry("LimiterIngress.boundary_meter", index=0, config=raised)
        with pytest.raises(P4ClientError) as refused:
            await agent.switch.write([~update])
        assert refused.value.code.name == "PERMISSION_DENIED", refused.value
        ts = list(dpus.values())
        assert ts[0].device.pipeline is not None and all(
            t.device.pipeline.program.meters["LimiterIngress.boundary_meter"].get_p4runtime_config(0)[0] != 10**9
            for t in ts
            if t.device.pipeline is not None
        )


async def test_a_replica_cut_off_from_the_database_stops_writing_before_its_lease_ends(
    pg_cluster: Cluster, pg_url: str
) -> None:
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        (theirs,) = [n for n, (r,) in holders(planes).items() if r == "r2"]
        cut_off = planes["r2"].replicas
        assert cut_off is not None

        def cut() -> Store:
            raise sqlite3.OperationalError("connection to the database lost")

        cut_off._open_registry = cut
        cut_off._drop_registry()
        with LapseWatch(dpus) as watch:
            await until(lambda: cut_off.fenced, 2 * REPLICA_LEASE_S, "r2 fences itself")
            # Stopped writing, while the database still counts it live: nobody has taken over yet.
            assert not planes["r2"].service.agents
            left = lease_left(pg_cluster, pg_url, "r2")
            assert left > 0, left
            assert theirs not in planes["r1"].service.agents
            await until(lambda: settled({"r1": planes["r1"]}, dpus), 3 * LEASE_S, "r1 takes r2's DPU")
        assert watch.lapsed() == [], watch.least
        print(f"r2 stopped writing {left:.2f} s before its lease ended by the database's clock")


def lease_left(cluster: Cluster, url: str, replica: str) -> float:
    """How long `replica`'s lease runs on, by the database's clock (s)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_until - extract(epoch from clock_timestamp())::double precision FROM replicas WHERE id = %s",
            (replica,),
        ).fetchone()
    assert row is not None
    return float(row[0])


async def test_two_replicas_started_at_once_on_a_fresh_database_both_serve(pg_url: str, tmp_path: Path) -> None:
    """Two `serve` processes started together on a database nobody has migrated: both come up (the schema is
    migrated once, under the write lock), both answer, and each sees what was written through the other."""
    ports = [free_port(), free_port()]
    procs = []
    try:
        for r, port in zip(("r1", "r2"), ports, strict=True):
            with (tmp_path / f"{r}.log").open("ab") as out:
                procs.append(subprocess.Popen(serve_command(pg_url, port, r), stdout=out, stderr=subprocess.STDOUT))
        for port, proc in zip(ports, procs, strict=True):
            await asyncio.to_thread(wait_port, port, proc, 60)
        async with LimiterClient(f"127.0.0.1:{ports[0]}") as a, LimiterClient(f"127.0.0.1:{ports[1]}") as b:
            await a.apply_pod("x", ["10.9.0.0/24"])
            await b.apply_pod("y", ["10.9.1.0/24"])
            for c in (a, b):
                assert sorted(p.name for p in await c.list_pods()) == ["x", "y"]
        assert [proc.poll() for proc in procs] == [None, None]
    finally:
        for proc in procs:
            stop(proc, timeout=15)
    for r in ("r1", "r2"):
        log = (tmp_path / f"{r}.log").read_text()
        assert "Traceback" not in log, log


def serve_command(url: str, port: int, replica: str) -> list[str]:
    """`dpu-limiter serve` as replica `replica` on `url`, listening on loopback `port`."""
    return [
        *(sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", url, "--listen", f"127.0.0.1:{port}"),
        *("--replica-id", replica, "--replica-lease-s", str(REPLICA_LEASE_S), "--lease-s", str(LEASE_S)),
    ]


async def _refusal(c: LimiterClient, write: Callable[[LimiterClient], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await write(c)  # type: ignore[misc]
    return err.value.code(), err.value.details() or ""


async def test_bad_input_is_refused_the_same_on_every_replica(pg_url: str) -> None:
    async with replicas(pg_url, ["r1", "r2", "r3"]) as planes:
        clients = [LimiterClient(p.address) for p in planes.values()]
        async with contextlib.AsyncExitStack() as stack:
            for c in clients:
                await stack.enter_async_context(c)
            await clients[0].apply(
                pods=[Pod("a", ("10.0.1.0/24",))],
                dpus=[Dpu("dpu-a", "127.0.0.1:1", 1, "a")],
                caps={"a": CAP},
            )
            bad: list[Callable[[LimiterClient], object]] = [
                lambda c: c.apply_pod("b", ["10.0.1.128/25"]),  # overlaps pod a, written through another replica
                lambda c: c.register_dpu(Dpu("dpu-a", "127.0.0.1:2", 1, "a")),  # a name taken
                lambda c: c.register_dpu(Dpu("dpu-b", "127.0.0.1:1", 1, "a")),  # an endpoint taken
                lambda c: c.set_pod_cap("nosuch", 1e6, 1e6, 1.0, 10_000),
                lambda c: c.set_pod_cap("a", -1.0, 1e6, 1.0, 10_000),
            ]
            for write in bad:
                answers = {await _refusal(c, write) for c in clients}
                assert len(answers) == 1, answers  # the same code and text from every replica
            # Two replicas writing conflicting pods at once: exactly one is taken, the other refused as overlapping.
            results = await asyncio.gather(
                clients[1].apply_pod("x", ["10.7.0.0/24"]),
                clients[2].apply_pod("y", ["10.7.0.0/25"]),
                return_exceptions=True,
            )
            refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
            assert len(refused) == 1 and refused[0].code() == grpc.StatusCode.INVALID_ARGUMENT, results
            for c in clients:
                names = sorted(p.name for p in await c.list_pods())
                assert names in (["a", "x"], ["a", "y"]), names


async def test_replicas_connect_again_when_the_database_drops_their_sessions(pg_cluster: Cluster, pg_url: str) -> None:
    """Every session of the control planes is ended by the database (as when it restarts): they connect again,
    keep holding their DPUs with no lease lapsing, and take writes again."""
    ids = ["r1", "r2"]
    pods = pods_for(ids, 1)
    async with targets(len(pods) + 1) as ts, replicas(pg_url, ids) as planes:
        async with LimiterClient(planes["r1"].address) as c:
            dpus = await fleet(c, pods, ts[: len(pods)])
        await until(lambda: settled(planes, dpus), 60, "every DPU held once")
        with LapseWatch(dpus) as watch:
            pg_cluster.sql(
                pg_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            async with LimiterClient(planes["r2"].address) as c:
                for _ in range(20):  # the first call on a dropped session fails (UNAVAILABLE); the next connects
                    try:
                        await c.apply(pods=[Pod("late", ("10.99.0.0/24",))])
                        break
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                        await asyncio.sleep(0.2)
            await until(lambda: all("late" in p.service.state.pods for p in planes.values()), 10, "both see it")
            await asyncio.sleep(2 * REPLICA_LEASE_S)  # longer than a replica's lease: renewals went on
            assert settled(planes, dpus)
        assert watch.lapsed() == [], watch.least
        assert all(p.replicas is not None and not p.replicas.fenced for p in planes.values())


async def test_a_joining_replica_takes_its_pods_without_any_lease_lapsing(pg_url: str) -> None:
    ids = ["r1", "r2", "r3"]
    pods = pods_for(ids, 2)
    async with targets(len(pods)) as ts, replicas(pg_url, ids[:2]) as planes:
        async with LimiterClient(planes["r1"].address) as c:
            dpus = await fleet(c, pods, ts)
        await until(lambda: settled(planes, dpus), 60, "every DPU held once by r1 and r2")
        before = {name: t.primaries() for name, t in dpus.items()}
        with LapseWatch(dpus) as watch:
            late = ControlPlane(pg_url, "127.0.0.1:0", settings=settings("r3"))
            await late.start()
            planes["r3"] = late
            took = await until(lambda: settled(planes, dpus), 60, "r3 holds its pods")
            await asyncio.sleep(1.0)
        assert watch.lapsed() == [], watch.least
        moved = [n for n, (r,) in holders(planes).items() if r == "r3"]
        assert moved and all(dpus[n].primaries()[0] > before[n][0] for n in moved)  # outbid the old holder
        print(f"{len(moved)} DPUs moved to a joining replica in {took:.2f} s")


async def test_a_verifier_given_every_replica_reads_every_dpu(pg_url: str) -> None:
    # `dpu-limiter verify` against replicas: one replica reads back and counts only the DPUs it holds, so a
    # verifier given one alone finds the others unread (every window of theirs unverified); given them all
    # (`replicas:` in its config), it takes each DPU's figures from its holder.
    from dpu_verifier.api_view import ApiView

    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, _pods):
        held = {name: r for name, (r,) in holders(planes).items()}
        alone = await ApiView(planes["r1"].address).counters()
        assert {n for n, (_, read) in alone.items() if read is None} == {n for n, r in held.items() if r == "r2"}
        both = ApiView(planes["r1"].address, (planes["r2"].address,))
        counters = await both.counters()
        assert sorted(counters) == sorted(dpus) and all(read is not None for _, read in counters.values())
        facts = await both.facts()
        assert sorted(n for pod in facts.pipelines.values() for n in pod) == sorted(dpus), facts
        assert await both.read_back() == []


async def test_no_acknowledged_write_is_lost_when_a_replica_or_the_database_is_killed(tmp_path: Path) -> None:
    """Two writers, each through a replica of its own (through the other once its own is gone), set pod caps whose
    rates only rise; one replica is killed with kill -9, then the database crashes (no checkpoint) and starts
    again. Every acknowledged write is in the change log, in order; nothing is there that was not sent; the
    stored cap is the log's last; the log verifies. (A cluster of the test's own: it is crashed.)"""
    with postgres.cluster() as cluster:
        url = cluster.database()
        ports = {"r1": free_port(), "r2": free_port()}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        acked: dict[str, list[int]] = {"a": [], "b": []}
        sent: dict[str, list[int]] = {"a": [], "b": []}  # acknowledged, or failed (it may or may not be stored)
        done = asyncio.Event()

        async def writer(pod: str, order: list[str], clients: dict[str, LimiterClient]) -> None:
            rate = 0
            while not done.is_set():
                rate += 1  # a new value every time: a write that failed may have been stored, so none is sent twice
                live = [r for r in order if procs[r].poll() is None]
                sent[pod].append(rate)
                try:
                    await clients[live[0]].set_pod_cap(pod, 1e6 + rate, 1e6 + rate, 1.0)
                    acked[pod].append(rate)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    await asyncio.sleep(0.05)

        tasks: list[asyncio.Task[None]] = []

        async def more(n: int, timeout: float, what: str) -> None:
            goal = {p: len(v) + n for p, v in acked.items()}
            try:
                await until(
                    lambda: all(len(acked[p]) >= goal[p] or t.done() for p, t in zip(acked, tasks, strict=True)),
                    timeout,
                    what,
                )
            finally:
                for t in tasks:
                    if t.done():
                        t.result()  # a writer that met anything but UNAVAILABLE: its error

        try:
            for r, port in ports.items():
                with (tmp_path / f"{r}.log").open("ab") as out:
                    procs[r] = subprocess.Popen(serve_command(url, port, r), stdout=out, stderr=subprocess.STDOUT)
            for r, port in ports.items():
                await asyncio.to_thread(wait_port, port, procs[r], 60)
            async with LimiterClient(f"127.0.0.1:{ports['r1']}") as c1, LimiterClient(f"127.0.0.1:{ports['r2']}") as c2:
                clients = {"r1": c1, "r2": c2}
                await c1.apply_pod("a", ["10.0.1.0/24"])
                await c1.apply_pod("b", ["10.0.2.0/24"])
                tasks += [
                    asyncio.create_task(writer("a", ["r1", "r2"], clients)),
                    asyncio.create_task(writer("b", ["r2", "r1"], clients)),
                ]
                try:
                    await more(30, 60, "both writers under way")
                    os.kill(procs["r1"].pid, signal.SIGKILL)  # the process this test started, by its PID
                    procs["r1"].wait(timeout=10)
                    await more(30, 60, "both writers on through r2")
                    cluster.crash()
                    await asyncio.sleep(1.0)
                    cluster.start()
                    await more(30, 60, "both writers on after the database came back")
                finally:
                    done.set()
                    await asyncio.gather(*tasks)
                stored = {p: (await c2.get_pod_cap(p)).cap.egress_bps for p in acked}
        finally:
            for proc in procs.values():
                stop(proc, timeout=15)
        records = read_audit(url)
        for pod in acked:
            logged = [round(r.payload["egress_bps"] - 1e6) for r in records if r.object == f"pod/{pod}/cap"]
            assert logged == sorted(set(logged)), logged  # in order, each once
            assert set(acked[pod]) <= set(logged) <= set(sent[pod])
            assert stored[pod] == 1e6 + logged[-1]
        assert len(sent["a"]) > len(acked["a"]), "the kills cut no write short: nothing was tested in flight"
        verdict = verify_file(url)
        assert verdict.ok, verdict.problem
        print(
            f"acknowledged {len(acked['a'])} + {len(acked['b'])} writes, {len(sent['a']) - len(acked['a'])} + "
            f"{len(sent['b']) - len(acked['b'])} failed; every acknowledged one stored"
        )
