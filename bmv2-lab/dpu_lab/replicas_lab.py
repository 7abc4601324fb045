"""The control plane as several replicas on one PostgreSQL database in a real-time run, and failover under
traffic, measured (issue 17, step 3; docs/replicas.md, docs/lab.md).

A scenario with `control_plane: {replicas: N}` (N > 1) runs N `dpu-limiter serve` processes on the database
the run is given (`lab run --control-db URL`), in a schema of the run's own that it drops at the end: a
run reads nothing it did not write and leaves nothing behind. The driver talks to them through a front, a
loopback TCP forwarder that joins each new connection to the first replica that accepts it (every replica
serves the whole API; none killed, none paused), so that a replica killed or paused mid-run does not take the
lab's API with it.

The replicas' events (config.REPLICA_ACTIONS), carried out by the real-time runner at their times:

- kill-replica: kill -9 of the replica primary for a pod's DPUs (whose GetStatus shows them primary);
- restart-db: the database stopped, and started again `down_s` later, by the command the run is given
  (`--control-db-ctl CMD`, run as `CMD stop` and `CMD start`: e.g. `pg_ctlcluster 16 main`);
- cut-replica-db: that replica's connections to the database, which go through a forwarder of the lab's
  in such a run, dropped, and new ones refused, for `down_s`;
- start-replicas-at-once: `count` new replicas started together.

Measured beside the run's verdict on the wire, every 0.1 s: each live replica's GetStatus (who holds each
DPU: connected, primary, converged, its lease confirmed) and each DPU's lease entry, read over P4Runtime (a
read needs no arbitration), whose deadline on the DPU's clock is placed on this host's monotonic clock
through the first leases the control plane confirmed (GetStatus: the lease's age and lifetime; every
replica runs on this host's monotonic clock). So the least lease any DPU had left, and any that lapsed or
fell to its floor (no lease at all); and, from the DPUs' own counters, the bytes dropped for want of a
lease over the run, which is zero unless a lease lapsed while traffic crossed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import grpc
from finsy import P4CounterEntry, P4Schema, P4TableEntry
from finsy.proto import p4r, p4r_grpc

from dpu_limiter import dataplane as dp
from dpu_limiter.client import LimiterClient, as_dict
from dpu_limiter.store import is_url, shown_db

from .config import ConfigError, EventSpec, Scenario
from .evaluate import LabDpu
from .processes import stop_processes
from .targets import free_port

SAMPLE_S = 0.1  # how often the watch asks every replica and every DPU
LATE_S = 1.0  # an event that ran this much after its time is said to have run late (summary.md)
# What a replica logs when it stops writing to every DPU (replicas.py): no renewal in time, or the database says
# its lease ended.
FENCED = ("no lease renewal in time", "the database says our lease ended")
HELD_BY = re.compile(r"held by replica (\S+) at ")


def check(sc: Scenario, url: str | None, ctl: str | None) -> None:
    """Refuse, before anything starts, a run that lacks what its control plane section or events need."""
    if sc.control_plane.replicas == 1:
        if url is not None:
            raise ConfigError(
                "--control-db: this scenario runs one control plane on a file; set control_plane.replicas"
            )
        return
    if url is None:
        raise ConfigError(
            f"control_plane.replicas: {sc.control_plane.replicas} replicas share one PostgreSQL database; give its "
            "URL with --control-db postgresql://USER@HOST:PORT/DB"
        )
    if not is_url(url):
        raise ConfigError(f"--control-db: {shown_db(url)} is not a postgresql:// URL")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise ConfigError(
            "control_plane.replicas: replicas need psycopg 3 (pip install 'dpu-limiter[postgres]')"
        ) from None
    actions = {ev.action for _, ev in sc.replica_events()}
    if "restart-db" in actions and not ctl:
        raise ConfigError(
            "restart-db: the lab stops and starts the database with --control-db-ctl CMD (run as `CMD stop` and "
            "`CMD start`, e.g. 'pg_ctlcluster 16 main'); none was given"
        )
    if "cut-replica-db" in actions and not urlsplit(url).hostname:
        raise ConfigError(
            f"cut-replica-db: cuts a replica's TCP connections to the database; {shown_db(url)} names no TCP host"
        )


# ---------------------------------------------------------------------------------------------- forwarders


class Forwarder:
    """A loopback TCP forwarder: each connection to `port` is joined to the first of `upstreams()` that
    accepts; `cut()` drops every connection and refuses new ones until `restore()`. Runs on a ProxyHost."""

    def __init__(self, upstreams: Callable[[], list[tuple[str, int]]]) -> None:
        self.upstreams = upstreams
        self.port = 0
        self.cut_off = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def serve(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._join, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.transport.abort()
            return
        for host, port in self.upstreams():
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
                break
            except (OSError, TimeoutError):
                continue
        else:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._writers.update(pair)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in pair:
                w.transport.abort()
                self._writers.discard(w)

    async def cut(self) -> None:
        """Drop every connection (both ends see it closed) and refuse new ones."""
        self.cut_off = True
        for w in list(self._writers):
            w.transport.abort()

    async def restore(self) -> None:
        """Accept connections again."""
        self.cut_off = False

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        await self.cut()
        if self._server is not None:
            self._server.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until either end closes; then close the other, so that the reverse direction ends too."""
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        dst.transport.abort()


class ProxyHost:
    """The lab's forwarders, on an event loop in a thread of their own: the runner's loop blocks at times
    (waiting on captures), and a replica's database traffic must not wait for it, or it would fence itself."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.forwarders: list[Forwarder] = []
        self._thread = threading.Thread(target=self.loop.run_forever, name="lab-forwarders", daemon=True)
        self._thread.start()

    def _call(self, coro: Awaitable[None], timeout: float = 10.0) -> None:
        async def run() -> None:
            await coro

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def forwarder(self, upstreams: Callable[[], list[tuple[str, int]]]) -> Forwarder:
        """A new forwarder, listening."""
        f = Forwarder(upstreams)
        self._call(f.serve())
        self.forwarders.append(f)
        return f

    def cut(self, f: Forwarder) -> None:
        """Cut `f` (drop and refuse its connections)."""
        self._call(f.cut())

    def restore(self, f: Forwarder) -> None:
        """Let `f` accept connections again."""
        self._call(f.restore())

    def close(self) -> None:
        """Close every forwarder and stop the thread."""
        if not self._thread.is_alive():
            return
        for f in self.forwarders:
            with contextlib.suppress(Exception):
                self._call(f.close(), timeout=5)

        async def settle() -> None:  # the connections' copy tasks end once their sockets are aborted
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._call(settle(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


# ---------------------------------------------------------------------------------------------- the database


@dataclass
class ControlDb:
    """The database the run is given: a schema of the run's own in it, and its stop/start command."""

    url: str
    ctl: list[str]
    log: Path
    schema: str = field(default_factory=lambda: f"dpu_lab_{secrets.token_hex(4)}")
    stopped: bool = False  # stopped by a restart-db event and not started again yet
    created: bool = False

    def create(self) -> None:
        """Make the run's schema."""
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                conn.execute(f"CREATE SCHEMA {self.schema}")  # a name of ours
        except psycopg.Error as exc:  # said as the CLI says a failed run's cause, on one line
            raise RuntimeError(f"--control-db {shown_db(self.url)}: {' '.join(str(exc).split())}") from None
        self.created = True

    def drop(self) -> None:
        """Remove the run's schema and everything the replicas wrote in it."""
        if not self.created:
            return
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        self.created = False

    def address(self) -> tuple[str, int]:
        """The database server's TCP host and port, as the URL names them."""
        parts = urlsplit(self.url)
        return parts.hostname or "localhost", parts.port or 5432

    def url_for(self, via: int | None = None) -> str:
        """The URL a replica gets: the run's schema first on its search path (every statement of the store
        names its tables unqualified), through loopback port `via` if given."""
        parts = urlsplit(self.url)
        query = dict(parse_qsl(parts.query))
        query["options"] = f"{query.get('options', '')} -c search_path={self.schema}".strip()
        netloc = parts.netloc
        if via is not None:
            userinfo = parts.netloc.rpartition("@")[0]
            netloc = f"{userinfo}@127.0.0.1:{via}" if userinfo else f"127.0.0.1:{via}"
        return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, quote_via=quote), parts.fragment))

    async def control(self, what: str) -> None:
        """Run `CMD stop` or `CMD start`; raise, with its output's end, if it fails."""
        with self.log.open("ab") as out:
            out.write(f"--- {' '.join(self.ctl)} {what}\n".encode())
            out.flush()
            proc = await asyncio.create_subprocess_exec(
                *self.ctl, what, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
            code = await asyncio.wait_for(proc.wait(), 90)
        if what == "stop":
            self.stopped = True
        if code != 0:
            raise RuntimeError(f"`{shlex.join([*self.ctl, what])}` failed (exit {code}); see {self.log}")
        if what == "start":
            self.stopped = False

    def replica_session(self, replica: str) -> int | None:
        """The server process of the session `replica`'s last renewal named (None: none, or no row)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            sql = f"SELECT session_pid FROM {self.schema}.replicas WHERE id = %s"  # a name of ours
            row = conn.execute(sql.encode(), (replica,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def end_session(self, pid: int) -> None:
        """End a session as an operator would (pg_terminate_backend)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def start_blocking(self) -> None:
        """`CMD start`, waiting for it (cleanup, outside any event loop's time)."""
        with self.log.open("ab") as out:
            done = subprocess.run([*self.ctl, "start"], stdout=out, stderr=subprocess.STDOUT, timeout=90, check=False)
        self.stopped = done.returncode != 0


# ---------------------------------------------------------------------------------------------- replicas


@dataclass
class Replica:
    """One `serve` process of the run."""

    id: str
    port: int
    popen: subprocess.Popen[bytes]
    log: Path
    db_forwarder: Forwarder | None  # its way to the database, when the run cuts a replica off
    killed: bool = False
    cut: bool = False
    paused: bool = False  # stopped (SIGSTOP) by a pause-replica event: it answers nothing

    @property
    def address(self) -> str:
        """Its API address."""
        return f"127.0.0.1:{self.port}"

    def fenced_count(self) -> int:
        """How often it has stopped writing for want of a renewal (its log's lines)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return sum(text.count(line) for line in FENCED)


@dataclass
class Row:
    """A DPU as one replica's GetStatus showed it."""

    good: bool  # connected, primary, converged, its lease confirmed and running
    holder: str  # the replica named as its holder ("" when this replica holds it, or none is named)
    gen: int
    issued_mono: float  # when the lease it last confirmed was issued (host monotonic s)
    lifetime_s: float


@dataclass
class Snapshot:
    """One sample: each answering replica's view of each DPU, and each DPU's lease left (s)."""

    t: float  # run time (s)
    views: dict[str, dict[str, Row]]  # replica -> DPU -> row
    lease_left: dict[str, float]  # DPU -> seconds its lease runs on (0: lapsed, or no lease at all)
    lease_gen: dict[str, int]  # DPU -> the generation of the lease it holds, as read from it (0: none)

    def holders(self, dpu: str) -> list[str]:
        """The replicas showing `dpu` held: primary, converged, leased."""
        return [r for r, rows in self.views.items() if (row := rows.get(dpu)) is not None and row.good]

    def writing(self, dpu: str, replicas: set[str]) -> str | None:
        """The replica of `replicas` that shows `dpu` held (primary, converged, its lease confirmed) and whose
        lease the DPU holds (the generation read from the DPU is the one it confirmed: replicas number their
        leases from random starts): it is primary and writing."""
        for r in self.holders(dpu):
            if r in replicas and self.views[r][dpu].gen == self.lease_gen.get(dpu):
                return r
        return None

    def settled(self, dpus: list[str], deciders: set[str]) -> bool:
        """Every DPU held by exactly one replica, and every other of `deciders` names that one its holder."""
        for d in dpus:
            held = self.holders(d)
            if len(held) != 1:
                return False
            for r in deciders - set(held):
                row = self.views.get(r, {}).get(d)
                if row is None or row.holder != held[0]:
                    return False
        return True


class LeaseReader:
    """Reads a DPU's lease entry over P4Runtime (no arbitration) and places its deadline on this host's
    monotonic clock, once the control plane confirmed a lease whose deadline it can compare."""

    def __init__(self, dpu: LabDpu, schema: P4Schema) -> None:
        self.dpu = dpu
        self.channel = grpc.aio.insecure_channel(dpu.address)
        self.p4runtime = p4r_grpc.P4RuntimeStub(self.channel)  # type: ignore[no-untyped-call]
        entity = P4TableEntry(dp.TABLE_LEASE, is_default_action=True).encode(schema)
        self.request = p4r.ReadRequest(device_id=dpu.device_id, entities=[entity])
        self.lease_action = schema.actions[dp.ACTION_LEASE].id
        # The colour counter's cells of frames dropped for want of a lease, one per direction (limiter.p4).
        self.drop_cells = {(c << 3) | dp.COLORS["lease"]: d for d, c in dp.CELLS.items()}
        counters = [P4CounterEntry(dp.COLOR_COUNTER, index=i).encode(schema) for i in self.drop_cells]
        self.drops_request = p4r.ReadRequest(device_id=dpu.device_id, entities=counters)
        # The DPU's clock minus this host's monotonic clock (us): the largest estimate yet. Every estimate
        # errs low (the deadline is placed early by the clock echo's round trip, and GetStatus's answer is
        # taken at its arrival), so the largest is the closest and lease left is read high by at most that.
        self.offset_us: int | None = None

    async def read(self) -> tuple[int, int] | None:
        """(generation, deadline on the DPU's clock, us) of its lease; (0, 0) for no lease (the floor);
        None when it could not be read."""
        try:
            entities = [e async for reply in self.p4runtime.Read(self.request, timeout=1.0) for e in reply.entities]
        except (grpc.aio.AioRpcError, TimeoutError):
            return None
        if not entities:
            return None
        action = entities[0].table_entry.action.action
        if action.action_id != self.lease_action:
            return 0, 0
        params = {q.param_id: int.from_bytes(q.value, "big") for q in action.params}
        return params.get(1, 0), params.get(2, 0)

    async def lease_drops(self) -> dict[str, int] | None:
        """Bytes the DPU dropped for want of a lease, per direction, from its own counters (None: unread)."""
        try:
            replies = self.p4runtime.Read(self.drops_request, timeout=5.0)
            entities = [e async for reply in replies for e in reply.entities]
        except (grpc.aio.AioRpcError, TimeoutError):
            return None
        out = {self.drop_cells[e.counter_entry.index.index]: e.counter_entry.data.byte_count for e in entities}
        return out if len(out) == len(self.drop_cells) else None

    def calibrate(self, gen: int, deadline_us: int, row: Row) -> None:
        """One more estimate of the offset, from a lease the control plane confirmed (`row`) that the DPU
        holds (`gen`, `deadline_us`): the deadline is the instant the lease ends on the controller's clock."""
        if row.gen != gen or gen == 0:
            return
        ends_us = int((row.issued_mono + row.lifetime_s) * 1e6)
        estimate = deadline_us - ends_us
        self.offset_us = estimate if self.offset_us is None else max(self.offset_us, estimate)

    def left_s(self, deadline_us: int, mono: float) -> float | None:
        """How long a lease of `deadline_us` runs on at host monotonic time `mono` (None: not calibrated)."""
        if self.offset_us is None:
            return None
        return (deadline_us - self.offset_us) / 1e6 - mono

    async def close(self) -> None:
        """Close its channel."""
        await self.channel.close()


@dataclass
class Failover:
    """The replicas of one run, the events on them, and what the watch measured."""

    sc: Scenario
    url: str
    ctl: str | None
    raw: Path  # the run's raw/ folder: each replica's log
    serve_args: list[str]  # more of serve's options (read-back periods)
    say: Callable[[str], None]
    replicas: list[Replica] = field(default_factory=list)
    db: ControlDb | None = None
    host: ProxyHost | None = None
    front: Forwarder | None = None
    snapshots: list[Snapshot] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    dpus: list[LabDpu] = field(default_factory=list)
    baseline: dict[str, dict[str, int] | None] = field(default_factory=dict)  # lease drops per DPU at time zero
    _clients: dict[str, LimiterClient] = field(default_factory=dict)
    _readers: list[LeaseReader] = field(default_factory=list)
    _t_start: float = 0.0
    _pending: list[tuple[float, EventSpec]] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _watch: asyncio.Task[None] | None = None
    _next_id: int = 1

    @property
    def lease_s(self) -> float:
        """The DPUs' lease."""
        return self.sc.control_plane.dpu_lease()

    @property
    def replica_lease_s(self) -> float:
        """Each replica's lease in the database."""
        return self.sc.control_plane.replica_lease()

    def _now(self) -> float:
        return time.time() - self._t_start

    # ------------------------------------------------------------------ start and stop

    async def start(self) -> str:
        """The run's schema, the forwarders, the replicas started together; the front's address once every
        replica answers."""
        self.db = ControlDb(self.url, shlex.split(self.ctl or ""), self.raw / "control-db-ctl.log")
        await asyncio.to_thread(self.db.create)
        self.host = ProxyHost()
        self.front = self.host.forwarder(self.api_upstreams)
        started = self._start_replicas(self.sc.control_plane.replicas)
        await self._answering(started)
        self.say(
            f"{len(started)} control plane replicas on {shown_db(self.url)} (schema {self.db.schema}), "
            f"DPU lease {self.lease_s:g} s, replica lease {self.replica_lease_s:g} s; API through 127.0.0.1:"
            f"{self.front.port}"
        )
        return f"127.0.0.1:{self.front.port}"

    def _start_replicas(self, n: int) -> list[Replica]:
        """`n` serve processes started one right after the other (at once, as far as the database can tell)."""
        assert self.db is not None and self.host is not None
        cuts = any(ev.action == "cut-replica-db" for _, ev in self.sc.replica_events())
        out = []
        for _ in range(n):
            rid, port = f"r{self._next_id}", free_port()
            self._next_id += 1
            forwarder = self.host.forwarder(lambda: [self.db.address()] if self.db else []) if cuts else None
            url = self.db.url_for(forwarder.port if forwarder else None)
            command = [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", url, "--listen", f"127.0.0.1:{port}"]
            command += ["--replica-id", rid, "--replica-lease-s", f"{self.replica_lease_s:g}"]
            command += self.serve_args  # the scenario's DPU lease among them, when it sets one
            log = self.raw / f"replica-{rid}.log"
            with log.open("wb") as out_file:
                popen = subprocess.Popen(command, stdout=out_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            out.append(Replica(rid, port, popen, log, forwarder))
        self.replicas.extend(out)
        return out

    async def _answering(self, replicas: list[Replica], timeout_s: float = 30.0) -> None:
        """Wait until each replica answers on its API; keep a client to each."""
        deadline = time.monotonic() + timeout_s
        for r in replicas:
            client = LimiterClient(r.address)
            await client.__aenter__()
            self._clients[r.id] = client
            while True:
                try:
                    await asyncio.wait_for(client.status(), 2.0)
                    break
                except Exception:
                    if r.popen.poll() is not None:
                        raise RuntimeError(f"replica {r.id} exited; see {r.log}") from None
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)

    async def started(self, dpus: list[LabDpu], t_start: float) -> None:
        """The caps are in place: wait until every DPU is held once, converged and leased, and every replica
        agrees who holds it; start the watch; read the lease-drop counters as the run's zero."""
        self.dpus, self._t_start = dpus, t_start
        schema = P4Schema(dp.limiter_program().p4info, dp.limiter_program().bmv2_json)
        self._readers = [LeaseReader(d, schema) for d in dpus]
        names = [d.name for d in dpus]
        deadline = time.monotonic() + 60
        while not (snap := await self._sample()).settled(names, self._deciders()) or any(
            r.offset_us is None for r in self._readers
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas did not settle who holds each DPU in 60 s: {self._describe(snap)}")
            await asyncio.sleep(SAMPLE_S)
        self.baseline = await self._lease_drops()
        self.say(f"every DPU held once and leased: {self._describe(snap)}")
        self._watch = asyncio.create_task(self._run_watch(), name="failover-watch")

    def _describe(self, snap: Snapshot) -> str:
        return ", ".join(f"{d.name} on {'/'.join(snap.holders(d.name)) or 'none'}" for d in self.dpus)

    def _live(self) -> list[Replica]:
        return [r for r in self.replicas if not r.killed]

    def api_upstreams(self) -> list[tuple[str, int]]:
        """Where the front joins a new connection: the replicas running and not paused. A paused replica's
        kernel still completes the connection (its socket listens), but nothing answers until it continues."""
        return [("127.0.0.1", r.port) for r in self._live() if not r.paused and r.popen.poll() is None]

    def _deciders(self) -> set[str]:
        """The replicas whose view of who holds what counts: alive and not cut off from the database."""
        return {r.id for r in self._live() if not r.cut and not r.paused}

    async def close(self) -> None:
        """Stop the watch, the event tasks and the clients (the runner's loop is ending)."""
        for t in [*self._tasks, *([self._watch] if self._watch else [])]:
            t.cancel()
        await asyncio.gather(*self._tasks, *([self._watch] if self._watch else []), return_exceptions=True)
        self._tasks, self._watch = [], None
        for c in self._clients.values():
            with contextlib.suppress(Exception):
                await c.__aexit__(None, None, None)
        self._clients.clear()
        for reader in self._readers:
            with contextlib.suppress(Exception):
                await reader.close()
        self._readers = []

    def cleanup(self) -> None:
        """Stop every replica the run started (by its handle), the forwarders; start the database again if an
        event left it stopped; drop the run's schema."""
        stop_processes(*(r.popen for r in self.replicas), timeout=10, kill_timeout=10)
        if self.host is not None:
            self.host.close()
            self.host = None
        if self.db is not None:
            if self.db.stopped:  # a run interrupted mid restart-db: the database is started again, as it was
                self.db.start_blocking()
            try:
                self.db.drop()
            except Exception as exc:
                self.say(f"[yellow]could not drop schema {self.db.schema}: {exc}[/]")
            self.db = None

    # ------------------------------------------------------------------ the watch

    async def _status(self, r: Replica) -> tuple[str, dict[str, Row]] | None:
        client = self._clients.get(r.id)
        if client is None:
            return None
        try:
            st = await asyncio.wait_for(client.status(), 1.0)
        except Exception:
            return None
        mono = time.monotonic()  # at its arrival: a lease's issue time computed from it errs late, never early
        rows = {}
        for d in st.dpus:
            good = d.connected and d.primary and d.converged and d.lease_state in ("held", "renewing")
            named = HELD_BY.match(d.last_error) if d.lease_state == "elsewhere" else None
            rows[d.name] = Row(
                good, named[1] if named else "", int(d.lease_generation), mono - d.lease_age_s, d.lease_lifetime_s
            )
        return r.id, rows

    async def _sample(self) -> Snapshot:
        """Ask every live replica and read every DPU's lease, at once."""
        statuses = asyncio.gather(*(self._status(r) for r in self._live() if not r.paused))
        leases = asyncio.gather(*(rd.read() for rd in self._readers))
        answers, read = await asyncio.gather(statuses, leases)
        views = dict(a for a in answers if a is not None)
        mono = time.monotonic()
        left: dict[str, float] = {}
        gens: dict[str, int] = {}
        for reader, lease in zip(self._readers, read, strict=True):
            if lease is None:
                continue
            gen, deadline = lease
            name = reader.dpu.name
            gens[name] = gen
            for rows in views.values():
                if (row := rows.get(name)) is not None and row.good:
                    reader.calibrate(gen, deadline, row)
            if gen == 0:
                left[name] = 0.0  # no lease: the floor
            elif (s := reader.left_s(deadline, mono)) is not None:
                left[name] = s
        snap = Snapshot(self._now(), views, left, gens)
        return snap

    async def _run_watch(self) -> None:
        while True:
            self.snapshots.append(await self._sample())
            await asyncio.sleep(SAMPLE_S)

    async def _until(self, ok: Callable[[Snapshot], bool], timeout_s: float) -> float | None:
        """Wait until a new sample satisfies `ok`; the run time of that sample (None: not within timeout)."""
        seen = len(self.snapshots)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            while seen < len(self.snapshots):
                snap = self.snapshots[seen]
                seen += 1
                if ok(snap):
                    return snap.t
            await asyncio.sleep(SAMPLE_S / 2)
        return None

    # ------------------------------------------------------------------ events

    def schedule(self, phase_index: int, phase_start: float) -> None:
        """The replica events of the phase starting at `phase_start` (run time), due at their times."""
        for pi, ev in self.sc.replica_events():
            if pi == phase_index:
                self._pending.append((phase_start + ev.at_s, ev))
        self._pending.sort(key=lambda p: p[0])

    def tick(self, now: float) -> None:
        """Start every event due by `now` (each runs as a task of its own: the traffic does not wait)."""
        while self._pending and self._pending[0][0] <= now:
            due, ev = self._pending.pop(0)
            self._tasks.append(asyncio.create_task(self._carry_out(ev, due), name=f"event-{ev.action}"))

    async def finish_events(self, grace_s: float = 3.0) -> None:
        """Give events still measuring `grace_s` more, then stop them (what they found is kept)."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=grace_s)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None

    async def _carry_out(self, ev: EventSpec, due: float) -> None:
        # t_s: when it ran (each event sets it to the moment it acted); scheduled_t_s: when the scenario asked.
        record: dict[str, Any] = {"t_s": round(self._now(), 3), "scheduled_t_s": round(due, 3), "action": ev.action}
        if ev.pod is not None:
            record["pod"] = ev.pod
        self.records.append(record)  # filled in as the event goes on: a run that ends first keeps what it has
        try:
            if ev.action == "kill-replica":
                await self._kill(ev, record)
            elif ev.action == "cut-replica-db":
                await self._cut(ev, record)
            elif ev.action == "restart-db":
                await self._restart_db(ev, record)
            elif ev.action == "end-replica-session":
                await self._end_session(ev, record)
            elif ev.action == "pause-replica":
                await self._pause(ev, record)
            else:
                await self._start_at_once(ev, record)
        except asyncio.CancelledError:
            record.setdefault("note", "the run ended before the event was over")
            raise
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            self.say(f"[red]{ev.action} failed: {exc}[/]")

    async def _primary_of(self, pod: str) -> tuple[Replica, list[str]]:
        """The replica whose GetStatus shows `pod`'s DPUs primary, and every DPU it holds."""
        pod_dpus = [d.name for d in self.dpus if d.pod == pod]
        deadline = time.monotonic() + 5.0  # a pod mid-move has no primary for a moment
        while True:
            snap = await self._sample()
            for r in self._live():
                if pod_dpus and all(snap.holders(d) == [r.id] for d in pod_dpus):
                    return r, [d.name for d in self.dpus if snap.holders(d.name) == [r.id]]
            if time.monotonic() > deadline:
                raise RuntimeError(f"no one replica shows pod {pod}'s DPUs primary: {self._describe(snap)}")
            await asyncio.sleep(SAMPLE_S)

    async def _kill(self, ev: EventSpec, record: dict[str, Any]) -> None:
        assert ev.pod is not None
        running = [r.id for r in self._live() if r.popen.poll() is None]
        if len(running) < 2:  # the scenario's counts are checked at load; a replica may have exited on its own
            left = f"only {running[0]}, which would leave none to serve the API" if running else "none"
            raise RuntimeError(f"no live replica left to kill ({left})")
        victim, theirs = await self._primary_of(ev.pod)
        t0 = self._now()
        victim.popen.kill()  # kill -9, by its handle
        victim.killed = True
        await asyncio.to_thread(victim.popen.wait, 10)
        record.update(t_s=round(t0, 3), pod=ev.pod, replica=victim.id, pid=victim.popen.pid, dpus=theirs)
        self.say(f"{t0:.1f} s: replica {victim.id} (pid {victim.popen.pid}) killed, primary for {', '.join(theirs)}")
        others = {r.id for r in self._live()}
        t1 = await self._until(lambda s: all(s.writing(d, others) for d in theirs), 3 * self.lease_s)
        self._moved(record, t0, t1, theirs, others)

    def _moved(self, record: dict[str, Any], t0: float, t1: float | None, dpus: list[str], to: set[str]) -> None:
        """Record when `dpus` were primary and writing on one of `to`, replicas that did not hold them (and which)."""
        record["takeover_s"] = None if t1 is None else round(t1 - t0, 3)
        if t1 is not None:
            snap = next(s for s in self.snapshots if s.t == t1)
            record["new_holders"] = {d: snap.writing(d, to) for d in dpus}
            self.say(
                f"{t1:.1f} s: {', '.join(dpus)} primary, converged and leased on "
                f"{', '.join(sorted(set(record['new_holders'].values())))} {t1 - t0:.2f} s after {record['action']}"
            )

    async def _cut(self, ev: EventSpec, record: dict[str, Any]) -> None:
        assert ev.pod is not None and self.host is not None
        victim, theirs = await self._primary_of(ev.pod)
        assert victim.db_forwarder is not None
        fenced_before = victim.fenced_count()
        t0 = self._now()
        victim.cut = True
        self.host.cut(victim.db_forwarder)
        record.update(t_s=round(t0, 3), pod=ev.pod, replica=victim.id, dpus=theirs, down_s=ev.down_for_s)
        self.say(f"{t0:.1f} s: replica {victim.id} cut off from the database for {ev.down_for_s:g} s")
        others = {r.id for r in self._live() if r is not victim}

        def stopped(s: Snapshot) -> bool:
            # Its own GetStatus (it still serves the API) no longer shows them held: it stopped writing.
            return victim.id in s.views and all(victim.id not in s.holders(d) for d in theirs)

        async def takeover() -> None:
            t1 = await self._until(lambda s: all(s.writing(d, others) for d in theirs), ev.down_for_s)
            self._moved(record, t0, t1, theirs, others)

        async def stop() -> None:
            t1 = await self._until(stopped, ev.down_for_s)
            record["stopped_writing_s"] = None if t1 is None else round(t1 - t0, 3)

        await asyncio.gather(takeover(), stop(), asyncio.sleep(ev.down_for_s))
        record["fenced"] = victim.fenced_count() > fenced_before
        self.host.restore(victim.db_forwarder)
        victim.cut = False
        await self._settled_again(record, f"replica {victim.id} reaches the database again", theirs)

    async def _settled_again(self, record: dict[str, Any], back: str, theirs: list[str]) -> None:
        """Once a replica is back (now, said as `back`), in the live set it holds again what rendezvous hashing
        gives it (its DPUs, unless a replica that joined meanwhile outranks it), with agents started since: when
        the fleet settled, every replica agreeing (back_s), and who then held `theirs`."""
        t2 = self._now()
        record["restored_at_s"] = round(t2, 3)
        self.say(f"{t2:.1f} s: {back}")
        names = [d.name for d in self.dpus]
        t3 = await self._until(lambda s: s.settled(names, self._deciders()), 3 * self.lease_s)
        record["back_s"] = None if t3 is None else round(t3 - t2, 3)
        if t3 is not None:
            after = next(s for s in self.snapshots if s.t == t3)
            record["holders_after"] = {d: after.holders(d)[0] for d in theirs}
            self.say(f"{t3:.1f} s: settled again {t3 - t2:.2f} s after; {record['holders_after']}")

    async def _end_session(self, ev: EventSpec, record: dict[str, Any]) -> None:
        assert ev.pod is not None and self.db is not None
        victim, theirs = await self._primary_of(ev.pod)
        fenced_before = victim.fenced_count()
        session = await asyncio.to_thread(self.db.replica_session, victim.id)
        if session is None:
            raise RuntimeError(f"replica {victim.id}'s row names no database session")
        t0 = self._now()
        await asyncio.to_thread(self.db.end_session, session)
        record.update(t_s=round(t0, 3), pod=ev.pod, replica=victim.id, dpus=theirs, down_s=ev.down_for_s)
        self.say(f"{t0:.1f} s: the database ended replica {victim.id}'s session (process {session})")
        others = {r.id for r in self._live() if r is not victim}

        async def renewed() -> None:
            deadline = time.monotonic() + ev.down_for_s
            while time.monotonic() < deadline:
                if await asyncio.to_thread(self.db.replica_session, victim.id) not in (session, None):  # type: ignore[union-attr]
                    record["new_session_s"] = round(self._now() - t0, 3)
                    return
                await asyncio.sleep(SAMPLE_S)
            record["new_session_s"] = None

        async def taken() -> None:
            t1 = await self._until(lambda s: any(s.writing(d, others) for d in theirs), ev.down_for_s)
            record["taken_by_others_s"] = None if t1 is None else round(t1 - t0, 3)

        await asyncio.gather(renewed(), taken())
        record["fenced"] = victim.fenced_count() > fenced_before
        self.say(
            f"{self._now():.1f} s: replica {victim.id} "
            + ("held on" if record["taken_by_others_s"] is None and not record["fenced"] else "did not hold on")
            + f" (a new session after {record['new_session_s']} s)"
        )

    async def _pause(self, ev: EventSpec, record: dict[str, Any]) -> None:
        assert ev.pod is not None
        victim, theirs = await self._primary_of(ev.pod)
        fenced_before = victim.fenced_count()
        others = {r.id for r in self._live() if r is not victim}
        t0 = self._now()
        victim.paused = True  # first: the API's front joins no new connection to it from now on
        victim.popen.send_signal(signal.SIGSTOP)  # by its handle
        try:
            record.update(t_s=round(t0, 3), pod=ev.pod, replica=victim.id, dpus=theirs, down_s=ev.down_for_s)
            self.say(f"{t0:.1f} s: replica {victim.id} stopped (SIGSTOP) for {ev.down_for_s:g} s")
            t1 = await self._until(lambda s: all(s.writing(d, others) for d in theirs), ev.down_for_s)
            self._moved(record, t0, t1, theirs, others)
            await asyncio.sleep(max(0.0, t0 + ev.down_for_s - self._now()))
        finally:
            victim.popen.send_signal(signal.SIGCONT)
            victim.paused = False
        # It finds its lease ended and stops writing (the DPUs refuse it anyway: their holder bid higher), then
        # joins again.
        await self._settled_again(record, f"replica {victim.id} continued", theirs)
        record["fenced"] = victim.fenced_count() > fenced_before

    async def _restart_db(self, ev: EventSpec, record: dict[str, Any]) -> None:
        assert self.db is not None
        fenced_before = {r.id: r.fenced_count() for r in self._live()}
        t0 = self._now()
        self.say(f"{t0:.1f} s: stopping the database")
        await self.db.control("stop")
        record["stopped_s"] = round(self._now() - t0, 3)
        await asyncio.sleep(ev.down_for_s)
        await self.db.control("start")
        t1 = self._now()
        record["down_s"] = round(t1 - t0, 3)
        self.say(f"{t1:.1f} s: the database is back ({t1 - t0:.2f} s after it was told to stop)")
        names = [d.name for d in self.dpus]
        t2 = await self._until(lambda s: s.settled(names, self._deciders()), 3 * self.lease_s)
        record["settled_after_s"] = None if t2 is None else round(t2 - t1, 3)
        record["fenced"] = sorted(r.id for r in self._live() if r.fenced_count() > fenced_before.get(r.id, 0))
        if t2 is not None:
            self.say(f"{t2:.1f} s: every DPU held once and leased again; replicas that fenced: {record['fenced']}")

    async def _start_at_once(self, ev: EventSpec, record: dict[str, Any]) -> None:
        before = self.snapshots[-1] if self.snapshots else await self._sample()
        t0 = self._now()
        new = self._start_replicas(ev.start_count)
        record.update(replicas=[r.id for r in new], pids=[r.popen.pid for r in new])
        self.say(f"{t0:.1f} s: replicas {', '.join(r.id for r in new)} started together")
        await self._answering(new)
        names = [d.name for d in self.dpus]
        ids = {r.id for r in new}
        t1 = await self._until(lambda s: ids <= set(s.views) and s.settled(names, self._deciders()), 3 * self.lease_s)
        record["settled_s"] = None if t1 is None else round(t1 - t0, 3)
        if t1 is not None:
            after = next(s for s in self.snapshots if s.t == t1)
            record["moved"] = {
                d: f"{'/'.join(before.holders(d)) or 'none'} -> {after.holders(d)[0]}"
                for d in names
                if before.holders(d) != after.holders(d)
            }
            self.say(f"{t1:.1f} s: settled {t1 - t0:.2f} s after; moved {record['moved']}")

    # ------------------------------------------------------------------ figures

    async def _lease_drops(self) -> dict[str, dict[str, int] | None]:
        """Bytes each DPU dropped for want of a lease, per direction, read from the DPU itself (whoever holds it)."""
        reads = await asyncio.gather(*(r.lease_drops() for r in self._readers))
        return {r.dpu.name: read for r, read in zip(self._readers, reads, strict=True)}

    async def counters(self, wait_s: float = 5.0) -> list[dict[str, Any]]:
        """The DPUs' usage counters per pod and direction, each row from a replica that read all its DPUs
        (a replica counts only the DPUs it holds); a pod moving between replicas is read once it has moved
        (within `wait_s`)."""
        deadline = time.monotonic() + wait_s
        while True:
            rows = await self._counters_once()
            if all(int(u["dpus_unread"]) == 0 for u in rows) or time.monotonic() > deadline:
                return rows
            await asyncio.sleep(0.2)

    async def _counters_once(self) -> list[dict[str, Any]]:
        best: dict[tuple[str, str], dict[str, Any]] = {}
        for r in self._live():
            client = self._clients.get(r.id)
            if client is None:
                continue
            try:
                rows = (await asyncio.wait_for(client.usage(), 5.0)).usage
            except Exception:
                continue
            for u in rows:
                key = (u.pod, u.direction)
                if key not in best or u.dpus_unread < int(best[key]["dpus_unread"]):
                    best[key] = as_dict(u)
        return [best[k] for k in sorted(best)]

    def _window(self, t0: float, t1: float) -> dict[str, Any]:
        """Over run times [t0, t1]: the least lease left on any DPU and the longest a DPU had no replica
        holding it (primary, converged, leased)."""
        snaps = [s for s in self.snapshots if t0 <= s.t <= t1]
        lefts = [v for s in snaps for v in s.lease_left.values()]
        longest = 0.0
        for d in self.dpus:
            since = None
            for s in snaps:
                if not s.holders(d.name):
                    since = s.t if since is None else since
                elif since is not None:
                    longest, since = max(longest, s.t - since), None
            if since is not None and snaps:
                longest = max(longest, snaps[-1].t - since)
        return {
            "least_lease_left_s": round(min(lefts), 3) if lefts else None,
            "longest_without_primary_s": round(longest, 3),
        }

    async def summary(self) -> dict[str, Any]:
        """report.json's `failover`: the setup, each event's figures, and the leases over the run."""
        drops_now = await self._lease_drops()
        dropped: dict[str, int | None] = {}
        for dpu, now in drops_now.items():
            before = self.baseline.get(dpu)
            for direction in dp.CELLS:
                key = f"{dpu} {direction}"
                dropped[key] = now[direction] - before[direction] if now is not None and before is not None else None
        for rec in self.records:
            rec.update(self._window(float(rec["t_s"]), event_end(rec) + 1.0))
        least: dict[str, float] = {}
        for s in self.snapshots:
            for d, v in s.lease_left.items():
                least[d] = min(least.get(d, v), v)
        floored = sorted({d for s in self.snapshots for d, v in s.lease_left.items() if v == 0.0})
        assert self.db is not None
        return {
            "replicas": self.sc.control_plane.replicas,
            "database": f"{shown_db(self.url)} (schema {self.db.schema}, dropped at the end)",
            "lease_s": self.lease_s,
            "third_of_lease_s": round(self.lease_s / 3, 3),
            "replica_lease_s": self.replica_lease_s,
            "time_zero_unix": round(self._t_start, 3),  # the run's time zero, to read the replicas' logs by
            "sample_s": SAMPLE_S,
            "samples": len(self.snapshots),
            "events": self.records,
            "least_lease_left_s": {d: round(v, 3) for d, v in sorted(least.items())},
            "lapsed_dpus": sorted(d for d, v in least.items() if v <= 0),
            "floored_dpus": floored,
            "lease_dropped_bytes": dropped,
        }


def event_end(rec: dict[str, Any]) -> float:
    """The run time an event's record says it was over by (its figures that were measured; an event that failed
    before it acted has only its time)."""
    t0 = float(rec["t_s"])
    ends = [t0]
    for key, base in (("takeover_s", "t_s"), ("back_s", "restored_at_s"), ("settled_s", "t_s")):
        if rec.get(key) is not None and rec.get(base) is not None:
            ends.append(float(rec[base]) + float(rec[key]))
    down = rec.get("down_s")
    if rec["action"] == "end-replica-session" and down is not None:
        ends.append(t0 + float(down))
    if rec.get("settled_after_s") is not None and down is not None:
        ends.append(t0 + float(down) + float(rec["settled_after_s"]))
    return max(ends)


def problems(failover: dict[str, Any]) -> list[str]:
    """Why a run with replicas failed though its cap may have held: an outage (a DPU's lease lapsed or fell to
    its floor, or a DPU dropped traffic for want of a lease), or an event that did not run as the scenario wrote
    it. Empty: none."""
    out = []
    if failover["lapsed_dpus"]:
        out.append(f"outage: the lease of {', '.join(failover['lapsed_dpus'])} lapsed")
    if failover["floored_dpus"]:
        out.append(f"outage: {', '.join(failover['floored_dpus'])} fell to the floor (no lease at all)")
    dropped = {k: v for k, v in failover["lease_dropped_bytes"].items() if v}
    if dropped:
        out.append(
            "outage: dropped for want of a lease: " + ", ".join(f"{k} {v} bytes" for k, v in sorted(dropped.items()))
        )
    for e in failover["events"]:
        if "error" in e:
            what = f"{e['action']}{' of pod ' + e['pod'] if e.get('pod') else ''}"
            out.append(
                f"not run as written: {what} (due at {e.get('scheduled_t_s', e['t_s'])} s) was skipped: {e['error']}"
            )
    return out


def event_records(failover: dict[str, Any]) -> list[dict[str, object]]:
    """The report's `events` entries for the replicas' events (when each ran and was due, its action, what it
    acted on, and why it was skipped if it was)."""
    keep = ("t_s", "scheduled_t_s", "action", "pod", "replica", "replicas", "down_s", "error")
    return [{k: rec[k] for k in keep if k in rec} for rec in failover["events"]]


def markdown(f: dict[str, Any]) -> str:
    """summary.md's section on the replicas and their failovers."""

    def s(v: object) -> str:
        return "not within the run" if v is None else f"{float(v):.2f} s"  # type: ignore[arg-type]

    lines = [
        "## Failover (control plane replicas on PostgreSQL)",
        "",
        f"{f['replicas']} replicas on {f['database']}; DPU lease {f['lease_s']:g} s (a third: "
        f"{f['third_of_lease_s']:g} s), replica lease {f['replica_lease_s']:g} s; every replica and DPU sampled "
        f"every {f['sample_s']:g} s ({f['samples']} samples).",
        "",
        "| at (s) | event | replica | DPUs | primary elsewhere, converged, leased after | other figures "
        "| longest without a primary | least lease left |",
        "|---:|---|---|---|---:|---|---:|---:|",
    ]
    for e in f["events"]:
        other = []
        if e["action"] == "cut-replica-db":
            other = [
                f"stopped writing after {s(e.get('stopped_writing_s'))}",
                f"settled {s(e.get('back_s'))} after the database returned, on "
                + ", ".join(f"{k} {v}" for k, v in e.get("holders_after", {}).items()),
            ]
        elif e["action"] == "restart-db":
            other = [
                f"down {s(e.get('down_s'))}",
                f"settled {s(e.get('settled_after_s'))} after it was back",
                f"fenced: {', '.join(e.get('fenced', [])) or 'none'}",
            ]
        elif e["action"] == "end-replica-session":
            other = [
                f"a new session after {s(e.get('new_session_s'))}",
                "taken by another replica after " + s(e["taken_by_others_s"])
                if e.get("taken_by_others_s") is not None
                else "held on",
                f"stopped writing: {'yes' if e.get('fenced') else 'no'}",
            ]
        elif e["action"] == "pause-replica":
            other = [
                f"stopped writing: {'yes' if e.get('fenced') else 'no'}",
                f"settled {s(e.get('back_s'))} after it continued",
            ]
        elif e["action"] == "start-replicas-at-once":
            moved = e.get("moved", {})
            other = [
                f"settled after {s(e.get('settled_s'))}",
                "moved: " + (", ".join(f"{k} {v}" for k, v in moved.items()) or "none"),
            ]
        if "error" in e:
            other.append(f"error: {e['error']}")
        who = e.get("replica") or ", ".join(e.get("replicas", []))
        took = s(e["takeover_s"]) if "takeover_s" in e else "-"
        least = e.get("least_lease_left_s")
        due = e.get("scheduled_t_s")
        late = f" (due {due:.2f})" if due is not None and float(e["t_s"]) - float(due) > LATE_S else ""
        lines.append(
            f"| {e['t_s']:.2f}{late} | {e['action']} {e.get('pod', '')} | {who} | {', '.join(e.get('dpus', []))} "
            f"| {took} "
            f"| {'; '.join(other)} | {e.get('longest_without_primary_s', 0):.2f} s "
            f"| {'-' if least is None else f'{least:.2f} s'} |"
        )
    least = ", ".join(f"{d} {v:.2f} s" for d, v in f["least_lease_left_s"].items())
    drops = list(f["lease_dropped_bytes"].values())
    dropped = "unread" if None in drops else str(sum(drops))
    lines += [
        "",
        f"Least lease left over the run: {least or 'not measured'}. DPUs whose lease lapsed: "
        f"{', '.join(f['lapsed_dpus']) or 'none'}; fell to their floor: {', '.join(f['floored_dpus']) or 'none'}; "
        f"bytes the DPUs dropped for want of a lease: {dropped}.",
        "",
    ]
    return "\n".join(lines)
