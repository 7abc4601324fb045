"""Replicas: any number of `serve` processes on one PostgreSQL database share the fleet (docs/replicas.md).

Each replica holds a lease in the database's `replicas` table, on the database's own clock, and renews it
every sixth of its length. The live replicas are the rows whose lease runs; every replica reads them and
works out, by rendezvous (highest-random-weight) hashing, which replica holds each pod: all of a pod's DPUs
go to one replica, so that a pod's share moves (shrink some DPUs before growing others) stay in one process.
When the live set changes, a replica lets go of the pods it no longer holds (without flooring them: the
next holder renews their leases) and takes the ones it now holds, with agents that bid a fresh election id
from the database's sequence: higher than any earlier holder's, so the DPU makes the newcomer primary and
refuses a stale holder's writes (fencing). The replica that would take a pod over if its holder left (the next
in the pod's rendezvous order; `backups` of them) keeps a backup stream to each of its DPUs, bidding below
every holder and writing nothing: a takeover bids on the stream already open instead of connecting.

A replica that cannot renew its lease stops writing to every DPU before its lease could have ended by the
database's clock: measured from the local monotonic time at which its last successful renewal was sent,
less a margin. So the replica that takes over never races it, even before fencing would refuse it.

Every replica serves the API. Writers serialise on the database's write lock; a replica plans each write
against the latest stored state (the service reads it again when the change log's head moved, and plans
anew when another replica wrote in between). Replicas learn the others' writes as the database tells of each
commit (Store.watch_log), and by polling the change log's head every `poll_s` should a notification be lost, and
reconcile the DPUs they hold (LimiterService.catch_up).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Sequence

from .service import LimiterService
from .store import Session, Store
from .units import BACKUP_STREAMS, POLL_S, REPLICA_LEASE_S

LOG = logging.getLogger(__name__)

MAX_CLOCK_DRIFT = 1e-3  # how much faster our monotonic clock may run than the database's
FENCE_MARGIN_S = 1.0  # time left, before the lease could end, to stop every agent


def ranking(key: str, replicas: Sequence[str]) -> list[str]:
    """The replicas in `key`'s (a pod's name) order: by the hash of (replica, key), highest first. The first
    holds the key; when it leaves, the next does.

    Rendezvous hashing: when a replica joins or leaves, only the keys it gains or held move."""
    return sorted(
        replicas, key=lambda r: (hashlib.blake2b(f"{r}\0{key}".encode(), digest_size=8).digest(), r), reverse=True
    )


def owner(key: str, replicas: Sequence[str]) -> str:
    """The replica that holds `key` (the first in its ranking)."""
    return ranking(key, replicas)[0]


def default_id() -> str:
    """A replica id unique to this control plane: host, process id, and a random part (two in one process)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class Replicas:
    """This control plane as one replica of many: its lease, the live set, who holds which pod, fencing."""

    def __init__(
        self,
        service: LimiterService,
        registry: Callable[[], Store],
        replica_id: str,
        address: str,
        lease_s: float = REPLICA_LEASE_S,
        poll_s: float = POLL_S,
        backups: int = BACKUP_STREAMS,
    ) -> None:
        if not lease_s > 3 * FENCE_MARGIN_S:
            raise ValueError(f"replica lease: must be more than {3 * FENCE_MARGIN_S:g} s, got {lease_s!r}")
        if backups < 0:
            raise ValueError(f"backup streams: must be 0 or more, got {backups!r}")
        if lease_s >= service.lease_s / 3:
            # Allowed (a long one rides out database restarts), but a replica that stalls with its session
            # open keeps its DPUs until its lease ends, and theirs may lapse before another may take them.
            LOG.warning(
                "replica lease %g s is not below a third of the DPUs' lease (%g s): a replica that stalls "
                "(its session still open) keeps its DPUs that long, and their leases may lapse meanwhile",
                lease_s,
                service.lease_s,
            )
        self.backups = backups  # how many replicas after each pod's holder keep backup streams to its DPUs
        self.service = service
        # A connection of its own (made by `registry`): a fleet's long write on the service's must not hold
        # a renewal back.
        self._open_registry = registry
        self._registry: Store | None = None
        self.id, self.address = replica_id, address
        self.lease_s, self.poll_s = lease_s, poll_s
        self.live: dict[str, str] = {}  # id -> API address, as last read
        self.fenced = True  # holding no DPU: not yet started, or the lease could have ended
        self._fence_at = 0.0  # loop time by which every agent must have stopped, unless renewed
        self._renew_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()  # the poll read the live set and the head: the follower acts on them
        self._head: tuple[int, str] = (0, "")  # the change log's head as the poll last read it
        self._rejoin = False  # renewed after a fence: take pods again
        self._moved = asyncio.Event()  # the database told of a commit to the change log (watch_log)
        self._listening = threading.Event()  # set: the listener thread stops
        self._listener: threading.Thread | None = None
        self.takeovers = 0  # DPUs taken over since start (for tests and logs)
        # The database session the service writes through, as renewals name it: when the database shows it
        # ended, the others cut this replica's lease to a grace (killed: its DPUs move then, not a lease later).
        self._session: Session | None = None

    def _store(self) -> Store:
        if self._registry is None:
            self._registry = self._open_registry()
        return self._registry

    def _drop_registry(self) -> None:
        """Forget a connection that failed: the next call opens another."""
        if self._registry is not None:
            with contextlib.suppress(Exception):
                self._registry.close()
            self._registry = None

    async def start(self) -> None:
        """Join (the first renewal must succeed), decide what this replica holds, and start the service on it."""
        self.service.store.pin_session()
        self._session = await asyncio.to_thread(self.service.store.session)
        await self._renew()
        self.service.owns, self.service.holder, self.service.backs = self._placement()
        self.service.read_head = lambda: self._store().log_head()
        self.service.election_id = await self._election_id()
        self.fenced = False
        await self.service.start()
        self.takeovers += len(self.service.agents)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._poll(), name="replica-poll"),
            loop.create_task(self._watch(), name="replica-fence"),
            loop.create_task(self._follow(), name="replica-follow"),
            loop.create_task(self._heard(), name="replica-heard"),
        ]
        # Others' commits as the database tells of them (store.LOG_MOVED), in a thread of its own: the follower
        # takes them at once rather than at the next poll.
        self._listening.clear()
        moved = functools.partial(loop.call_soon_threadsafe, self._moved.set)
        self._listener = threading.Thread(
            target=self.service.store.watch_log, args=(moved, self._listening), name=f"listen-{self.id}", daemon=True
        )
        self._listener.start()
        LOG.info(
            "replica %s at %s: %d live, holding %d DPUs",
            self.id,
            self.address,
            len(self.live),
            len(self.service.agents),
        )

    async def stop(self) -> None:
        """Stop writing to every DPU, then give the lease up so that the others take them at once."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._listening.set()
        if self._listener is not None:
            await asyncio.to_thread(self._listener.join, 2.0)  # a daemon: one stuck connecting is left behind
            self._listener = None
        await self.service.fence()
        self.fenced = True
        try:
            await asyncio.to_thread(self._store().leave_replica, self.id)
        except Exception as exc:  # the others take over when the lease ends instead
            LOG.warning("replica %s: could not leave: %s", self.id, exc)
        self._drop_registry()

    async def _renew(self) -> None:
        """Renew the lease and read the live set; push the fence deadline on."""
        loop = asyncio.get_running_loop()
        sent = loop.time()  # the database sets the lease after this: it ends no earlier than sent + lease
        try:
            # Fenced (or joining), a lease that ended starts again; holding DPUs, it must not: the others may
            # have taken them (the lease ran out, or another replica ended it, our session being over).
            live = await asyncio.to_thread(
                self._store().renew_replica,
                self.id,
                self.address,
                self.lease_s,
                self._session,
                self.fenced,
                self.service.lease_s,
            )
        except Exception:
            self._drop_registry()
            raise
        self._fence_at = sent + self.lease_s * (1 - MAX_CLOCK_DRIFT) - FENCE_MARGIN_S
        self._renew_at = sent + self.lease_s / 6
        self.live = dict(live)

    async def _new_session(self) -> None:
        """Write through another database session (the service's broke, or the database shows it ended), and
        renew at once naming it. A lease still running (the others take a replica whose session ended for gone
        only once its grace ran out: PgStore._live) is extended and nothing moved: the replica holds on. One
        that ended is not (renew_replica's join): the replica finds itself not live, stops, and joins again."""
        store = self.service.store
        await asyncio.to_thread(store.new_session)
        self._session = await asyncio.to_thread(store.session)
        await self._renew()

    async def _election_id(self) -> int:
        return await asyncio.to_thread(self._store().next_election_id) + self.service.settings.election_id

    def _placement(self) -> tuple[Callable[[str], bool], Callable[[str], str], Callable[[str], bool]]:
        """From the live set: whether this replica holds a pod, which replica (at which address) does, and
        whether this one keeps backup streams to its DPUs (it is among the `backups` next in line)."""
        ids, live = sorted(self.live), dict(self.live)

        @functools.cache  # asked per DPU at every write and read; the answer changes only with the live set
        def rank(pod: str) -> int:
            order = ranking(pod, ids)
            return order.index(self.id) if self.id in order else len(order)

        def holder(pod: str) -> str:
            return f"{(r := owner(pod, ids))} at {live.get(r, '?')}" if ids else "none"

        return (lambda pod: rank(pod) == 0), holder, (lambda pod: 0 < rank(pod) <= self.backups)

    async def _poll(self) -> None:
        """Every poll_s: renew when due (else read the live set) and read the change log's head; the follower
        acts on them. Nothing here waits for the service: a long write must not hold a renewal back."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                if self.service.store.session_broken() or await asyncio.to_thread(self._store().session_ended, self.id):
                    await self._new_session()
                elif loop.time() >= self._renew_at or self.fenced:
                    await self._renew()
                else:
                    self.live = dict(await asyncio.to_thread(self._store().live_replicas))
                if self.id not in self.live:
                    # By the database's clock our lease ended (or its grace did, our session having ended): the
                    # others take our DPUs now. Stop; the next poll joins again.
                    if not self.fenced:
                        LOG.warning("replica %s: the database says our lease ended", self.id)
                        await self._fence()
                    continue
                self._rejoin = self._rejoin or self.fenced
                self._head = await asyncio.to_thread(self._store().log_head)
                self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is away: the watchdog fences in time; keep trying
                LOG.warning("replica %s: %s: %s", self.id, type(exc).__name__, exc)

    async def _heard(self) -> None:
        """On each commit the database tells of, read the change log's head and wake the follower (the poll
        does too, every poll_s, should a notification be lost)."""
        while True:
            await self._moved.wait()
            self._moved.clear()
            if self.fenced:
                continue  # holding nothing: the poll says when to join again
            try:
                self._head = await asyncio.to_thread(self._store().log_head)
                self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is away: the poll keeps trying
                LOG.debug("replica %s: %s: %s", self.id, type(exc).__name__, exc)

    async def _follow(self) -> None:
        """Take other replicas' writes when the change log moved, and move pods when the live set changed
        (or this replica joins again after a fence)."""
        held: list[str] = []  # the live set the service last held its pods for
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                if self._head != self.service.state_head:
                    await self.service.catch_up()
                if self._rejoin or sorted(self.live) != held:
                    if self.fenced and not self._rejoin:
                        continue  # not renewed since: the poll says when
                    self._rejoin, self.fenced = False, False
                    live = sorted(self.live)
                    owns, holder, backs = self._placement()
                    taken, let_go = await self.service.hold_only(owns, holder, self._election_id, backs)
                    held = live if not self.fenced else []
                    self.takeovers += taken
                    if taken or let_go:
                        LOG.info("replica %s: %d live; took %d DPUs, let go of %d", self.id, len(live), taken, let_go)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is away, or the state fails its check: try again next poll
                LOG.warning("replica %s: %s: %s", self.id, type(exc).__name__, exc)
                held = []  # whatever we hold, decide again once the database answers

    async def _watch(self) -> None:
        """Stop every agent once the lease could be about to end (no renewal came in time)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.01, self._fence_at - loop.time()))
            if loop.time() >= self._fence_at and not self.fenced:
                LOG.warning("replica %s: no lease renewal in time: stopping every DPU's agent", self.id)
                await self._fence()

    async def _fence(self) -> None:
        self.fenced = True
        await self.service.fence()
