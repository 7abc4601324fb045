"""A fleet of embedded targets held by replicas in this process, for the replica tests (tests/control).

Real parts: embedded P4Runtime targets served on loopback, control planes on one PostgreSQL database
(the caller's throwaway cluster), all in the test's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import grpc

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Pod, Role
from dpu_limiter.reconciler import DpuAgent
from dpu_limiter.replicas import Replicas, owner, ranking
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT, POLL_S
from dpu_softswitch.server import Device, P4RuntimeService, add_to_server
from helpers.p4rt import lease_deadline_us, lease_left_us

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

    def lease_deadline_us(self) -> int:
        """The deadline of the lease the target holds (us, on its own clock; 0: none)."""
        return lease_deadline_us(self.device)

    def lease_left_us(self) -> int:
        """How long the lease the target holds runs on (us, on its own clock; <= 0: lapsed or none)."""
        return lease_left_us(self.device)


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
    """Control planes on one database, started at once, stopped at the end (those still running); yielded once
    each sees them all live, so that a fleet written then is placed once (not on the first replica up, and moved
    as the others join: a DPU moved before its holder stored its pipeline instance is held without a lease for a
    window, docs/leases.md)."""
    planes = {r: ControlPlane(url, "127.0.0.1:0", settings=settings(r)) for r in ids}
    try:
        await asyncio.gather(*(p.start() for p in planes.values()))
        await until(
            lambda: all(p.replicas is not None and sorted(p.replicas.live) == sorted(ids) for p in planes.values()),
            30,
            "every replica sees the others live",
        )
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


async def fleet(c: LimiterClient, pods: list[str], ts: list[Target], cap: Cap = CAP) -> dict[str, Target]:
    """One write: each pod with a capped (`cap`) uplink DPU on its own target; returns the targets by DPU name."""
    dpus = {f"dpu-{p}": t for p, t in zip(pods, ts, strict=True)}
    await c.apply(
        pods=[Pod(p, (f"10.{i}.0.0/24",)) for i, p in enumerate(pods)],
        dpus=[Dpu(f"dpu-{p}", t.address, 1, p, Role.POD_UPLINK, 0, 1) for p, t in zip(pods, ts, strict=True)],
        caps=dict.fromkeys(pods, cap),
    )
    return dpus


@contextlib.asynccontextmanager
async def settled_fleet(
    url: str, ids: list[str], per_replica: int, through: str, started: list[str] | None = None
) -> AsyncIterator[tuple[dict[str, ControlPlane], dict[str, Target], list[str]]]:
    """Replicas `ids` (those `started` only, if given: the others `join` later) on one database and a fleet of
    `per_replica` pods each of `ids` written through replica `through`, once every DPU is held once, primary and
    converged: (the replicas, the targets by DPU, the pods)."""
    pods = pods_for(ids, per_replica)
    async with targets(len(pods)) as ts, replicas(url, ids if started is None else started) as planes:
        async with LimiterClient(planes[through].address) as c:
            dpus = await fleet(c, pods, ts)
        await until(lambda: settled(planes, dpus), 60, "every DPU held once, primary and converged")
        yield planes, dpus, pods


async def join(url: str, planes: dict[str, ControlPlane], replica_id: str) -> ControlPlane:
    """Start replica `replica_id` on the database, among `planes` (stopped with them)."""
    late = ControlPlane(url, "127.0.0.1:0", settings=settings(replica_id))
    await late.start()
    planes[replica_id] = late
    return late


def holders(planes: dict[str, ControlPlane]) -> dict[str, list[str]]:
    """Which replicas have an agent for each DPU."""
    out: dict[str, list[str]] = {}
    for r, p in planes.items():
        for name in p.service.agents:
            out.setdefault(name, []).append(r)
    return out


def only_held_by(planes: dict[str, ControlPlane], replica: str) -> str:
    """The one DPU `replica` holds."""
    (name,) = [n for n, (r,) in holders(planes).items() if r == replica]
    return name


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


def next_in_line(name: str, ids: list[str]) -> str:
    """The replica that takes DPU `name`'s pod over if its holder leaves (it keeps the backup stream)."""
    return ranking(name.removeprefix("dpu-"), sorted(ids))[1]


def backed_up(planes: dict[str, ControlPlane], names: list[str]) -> bool:
    """Each DPU has one backup stream, open, from the replica next in line, and none from any other."""
    for name in names:
        nxt = next_in_line(name, list(planes))
        for r, plane in planes.items():
            standby = plane.service.standbys.get(name)
            if (standby is not None) != (r == nxt) or (standby is not None and not standby.up):
                return False
    return True


async def stall_poll(r: Replicas) -> asyncio.Task[None]:
    """Hold `r`'s poll back (its task runs, just late): it neither renews nor notices anything."""
    r.poll_s = 1000.0
    await asyncio.sleep(3 * POLL_S)  # the poll under way comes round once more, then waits
    (poll,) = [t for t in r._tasks if t.get_name() == "replica-poll"]
    return poll


async def resume_poll(r: Replicas, poll: asyncio.Task[None]) -> None:
    """Let `r`'s poll come round again."""
    poll.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await poll
    r.poll_s = POLL_S
    r._tasks = [t for t in r._tasks if t is not poll] + [
        asyncio.get_running_loop().create_task(r._poll(), name="replica-poll")
    ]


def lease_left(url: str, replica: str) -> float:
    """How long `replica`'s lease runs on, by the database's clock (s)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_until - extract(epoch from clock_timestamp())::double precision FROM replicas WHERE id = %s",
            (replica,),
        ).fetchone()
    assert row is not None
    return float(row[0])


def holding(agent: DpuAgent) -> bool:
    """The agent is its DPU's primary, converged, its lease read back."""
    st = agent.status
    return not agent.standby and st.primary and st.converged and st.lease_generation is not None
