"""The control plane's service layer: validate, store durably, then let the agents reconcile.

It is one class over 600 lines, on purpose: LimiterService holds the control plane's live state (the
agents, the shares granted, the lease generations, what waits for what) and every task that changes
it (writes, share moves, lease renewals, rebalancing); split, those parts would each reach into all of
it. What does not touch that state lives apart: what a write would change and whether it holds
(planning.py), usage rows (usage.py), batched store calls (batched.py), the store itself (store.py).
With replicas (replicas.py: membership, hashing, fencing timers), what stays here is what moves that live
state: taking pods over and letting them go (hold_only, fence) and following other replicas' writes (catch_up).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import dataclasses
import functools
import gc
import itertools
import logging
import math
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from . import dataplane as dp
from . import heap, shares
from .batched import Batched
from .models import (
    Cap,
    Change,
    DesiredState,
    Dpu,
    NotFound,
    Pod,
    Role,
    Router,
)
from .planning import dpu_layers, overlapping, planned_apply, planned_delete, pod_members, state_changes
from .reconciler import DpuAgent, Slots, program_digest
from .settings import Settings
from .store import Grant, GrowthHold, StateStale, Store
from .usage import DirectionUsage, usage_row

T = TypeVar("T")
LOG = logging.getLogger(__name__)


LEASES_KEPT = 8  # lease generations whose issue time is remembered (renewals every lifetime / 3)
# A large write's follow-up work is done this many objects (agents made, ~8 us each) at a time, yielding to
# the event loop in between, so that reads and lease renewals are answered meanwhile. These three batches are
# small because a read waits for several turns of the loop, not one: during a 20,000-DPU Apply, a 1,000-row
# GetStatus page took 0.10-0.22 s (9 runs of 10 over 0.1) with batches of 1,024, 64 and 64; 0.06-0.10 s with
# 256, 16 and 16 (8 of 8 under), the Apply 1.38-1.67 s against 1.30-1.43 (bench/apply_scale.py, side by side).
BATCH = 256
# Share passes started per turn of the loop: each one's first step takes ~0.2 ms (its grants worked out).
RESHARE_BATCH = 16
RECHECK_S = 1.0  # how often a wait for a silent DPU's old lease to end looks again
QUIET_TURNS = 3  # turns of the event loop with nothing to do before the control plane is quiet
# Agents started per turn (their switches made, ~60 us each); their connections open at a pace (pacing.py).
START_BATCH = 16
# Agents made or started between two freezes of the heap (see heap.freeze).
FREEZE_EVERY = 1024
# Fewer agents that opened connections together (a fleet of 1,000, or the last of a larger one's) are frozen
# once they have made their objects: this long after the last of them was let go, if there are this many.
FREEZE_SETTLE_S = 2.0
FREEZE_MIN = 256
STALE_TRIES = 5  # plans of one write against a state another replica changed meanwhile, before giving up
PLAN_LOCK_WAIT_S = 10.0  # how long a write waits for another replica's plan and commit (the planning lock)


def _never(pod: str) -> bool:
    """No pod (a control plane alone keeps no backup stream; a fenced replica holds nothing)."""
    return False


StatusSnapshot = tuple[list[tuple[str, "DpuAgent | None"]], set[str], bool]


@dataclass
class PlanningHold:
    """One write's hold of the database's planning lock, taken and given up in worker threads: under the
    mutex, a give-up happens once, and a take that comes after it takes nothing (PostgreSQL counts a
    session's takes: one never given up would hold every other replica's writes back)."""

    held: bool = False
    given_up: bool = False
    mutex: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class LimiterService:
    """Desired state in the store, one reconciling agent per DPU."""

    def __init__(self, store: Store, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        self.settings = settings
        self.clock = settings.clock  # the policy's time (the wall clock, or a simulation's)
        self.store = store
        self.slots = Slots(settings.concurrency)  # shared by every agent: how many DPUs are worked on at once
        self.slots.connects.on_let_go = self._connecting
        self._connected_since_freeze = 0
        self._settle_freeze: asyncio.TimerHandle | None = None
        self._started_since_freeze = 0  # agents started since a settled burst's freeze (_settle_after_burst)
        self._stopping = False
        self.resync_s = settings.resync_s
        self.pipeline_check_s = settings.pipeline_check_s
        # Every DPU with a cap holds a lease of `lease_s`, renewed every third of it with a new
        # generation (seeded at random, so a restarted control plane never repeats the last one).
        self.lease_s = settings.lease_s
        self.lease_gen = secrets.randbits(32)
        # When each recent generation was issued: it ends one lifetime later on every DPU, whenever
        # written (agents place that instant on each DPU's clock).
        self._lease_issued: dict[int, float] = {self.lease_gen: self.clock.monotonic()}
        # Worked out once per state: each pod's node MACs (its inventory) and its DPUs' names.
        self._index: tuple[DesiredState | None, dict[str, tuple[str, ...]], dict[str, list[str]]] = (None, {}, {})
        self.lease_loop = settings.lease_loop
        self._leaser: asyncio.Task[None] | None = None
        self.p4runtime_tls = settings.p4runtime_tls
        self.program = settings.program or dp.limiter_program()
        self.expected_pipeline_sha256 = program_digest(self.program)  # what every DPU should say it runs
        self.election_id = settings.election_id
        self.state: DesiredState = store.load()
        # The change log's head that `state` was read or written at. The store's own head runs ahead of it
        # while a catch-up is between reading the state and holding it: a read compares this one.
        self.state_head: tuple[int, str] = store.head
        # Replicas (replicas.py) set which pods this control plane holds (alone: every pod), and which replica
        # holds a pod it does not ("" here), for status and usage.
        self.owns: Callable[[str], bool] = lambda pod: True
        self.holder: Callable[[str], str] = lambda pod: ""
        # And to the DPUs of which pods it keeps a backup stream (a standby agent): those it would take over
        # if their holder left. Alone: none.
        self.backs: Callable[[str], bool] = _never
        self.standbys: dict[str, DpuAgent] = {}
        # A takeover's agents converging: no new standby connects meanwhile (hundreds would, at once, as the
        # DPUs the takeover needs answer), then they are synced (at most a third of a lease later).
        self._standbys_after: asyncio.Task[None] | None = None
        self._deferring = False  # (while it runs)
        # How a read learns the change log's head as committed now: replicas read it on a connection of their
        # own, so that a read does not wait for this replica's own long write on the store's (its lock).
        self.read_head: Callable[[], tuple[int, str]] = store.log_head
        # Writes and catch-ups running, which run to their end even if their caller goes away (_write, catch_up).
        self._to_end: set[asyncio.Task[Any]] = set()
        self._fences = 0  # how many times this replica stopped writing for fear of its lease (fence)
        self.agents: dict[str, DpuAgent] = {}
        self._sorted: list[str] | None = None  # their names in order (None: to be sorted again)
        # Set (and replaced) once a new state is held and its follow-up work set going: wait_applied's wake-up;
        # and that state's generation (self.state's is set before its agents and shares are).
        self._state_moved = asyncio.Event()
        self._moved_generation = self.state.generation
        # Agents made but not started yet: their connections are opened a few at a time, in the background.
        self._to_start: collections.deque[DpuAgent] = collections.deque()
        self._starter: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # Each DPU's granted share of its pod's cap (None: nothing granted yet, the floor). A pod's DPUs
        # of one role are one layer of parallel devices (node DPUs; parallel uplinks) that its traffic
        # is spread over, so they split the cap: a layer of one gets all of it.
        self.shares: dict[str, Cap | None] = {}
        self._resharing: dict[str, asyncio.Task[None]] = {}
        # Pods whose pass is due but not started yet: a fleet's write starts them a batch at a time.
        self._reshare_due: dict[str, None] = {}
        self._resharer: asyncio.Task[None] | None = None
        self._share_locks: dict[str, asyncio.Lock] = {}
        # Rebalancing pods: demand-based grants, and each node's last counter sample (time, egress, ingress).
        self._targets: dict[str, dict[str, Cap]] = {}
        self._samples: dict[str, tuple[float, int, int]] = {}
        self._changes: dict[str, list[float]] = {}  # times of each rebalancing pod's recent changes
        # When each pod held at start or taken over was adopted (monotonic): the changes its last holder made in
        # the window before are not known here, so it makes none until a window has passed.
        self._adopted_at: dict[str, float] = {}
        self._unconfirmed: dict[str, int] = {}  # each DPU's latest share grant not yet confirmed (its ticket)
        self._granted_at: dict[str, float] = {}  # when each DPU's share was last granted (monotonic)
        # Until when (monotonic) a DPU taken over from another replica may hold a lease that replica wrote: it may
        # be alive, taken for gone by its database session, and renew its DPUs until it notices (replicas.py).
        self._foreign_until: dict[str, float] = {}
        # Window-mode shrinks not yet in effect: the ticket that confirms each, and its window.
        self._aging: dict[str, tuple[int, float]] = {}
        self._grow_after: dict[str, float] = {}  # pods whose shares may not grow before then (monotonic)
        # Deleted pods' prefixes: a pod made again under another name over the same hosts waits for what
        # the deleted one did (its DPUs may be the same devices).
        self._deleted_prefixes: dict[str, tuple[str, ...]] = {}
        # The same, stored for a control plane started after a crash: one transaction for all the pods
        # whose shares move at once (a fleet's cap change moves thousands).
        self._saved = Batched(store.save_shares)
        self._releases = Batched(store.release_growth)
        # Window changes' lease holds (reconciler._on_window_change), stored as they start and given back
        # to the agents of a control plane started before they end (monotonic, by DPU).
        self._store_lease_holds = Batched(store.hold_leases)
        self._lease_holds: dict[str, float] = {}
        # The pipeline instance each DPU's holder found (reconciler.read_clock), stored before any lease under
        # it, and read by its next holder finding one it did not arm: many at once in one transaction.
        self._store_epochs = Batched(store.record_epochs)
        self._epochs_of = Batched(store.epochs_of)
        self._storing: set[asyncio.Task[list[None]]] = set()
        self.rebalance_interval_s = settings.rebalance_interval_s
        self.rebalance_loop = settings.rebalance_loop  # off: the caller drives rebalance_pod (virtual time)
        self._rebalancer: asyncio.Task[None] | None = None
        self._parked_tasks: set[asyncio.Task[object]] = set()  # loops and passes waiting on DPUs or the clock (quiet)

    async def start(self) -> None:
        """Start an agent for every stored DPU (a restart resumes from the store).

        A pod whose shares were moving when an earlier control plane stopped may have a DPU holding an
        old, larger share (cut off, or deleted while cut off) until the hold that plane stored ends: its
        DPUs start at the shares last granted and grow only then.
        """
        await self._adopt([p for p in self.state.pods if self.owns(p)])
        await self._sync_standbys()
        if self.rebalance_loop:
            self._rebalancer = asyncio.create_task(self._rebalance_loop(self.rebalance_interval_s))
        if self.lease_loop:
            self._leaser = asyncio.create_task(self._lease_loop())

    async def stop(self) -> None:
        """Stop every agent (and writes and catch-ups still running, whose callers went away)."""
        running = list(self._to_end)
        for write in running:
            write.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for task in (self._starter, self._resharer, self._standbys_after):
            if task is not None:
                task.cancel()
        self._to_start.clear()
        self._reshare_due.clear()
        for task in self._resharing.values():
            task.cancel()
        if self._rebalancer is not None:
            self._rebalancer.cancel()
        self._stopping = True  # (agents letting go as they stop set no freeze going)
        if self._settle_freeze is not None:
            self._settle_freeze.cancel()
        if self._leaser is not None:
            self._leaser.cancel()
        await _stop([*self.agents.values(), *self.standbys.values()])
        self.agents.clear()
        self.standbys.clear()
        self._sorted = None

    async def _adopt(self, pods: list[str]) -> None:
        """Start agents for the DPUs of `pods` (at start, or taken over from another replica), resuming what
        the store says of them: the control plane that held them before may have stopped mid-move."""
        names = {n for p in pods for n in self._indexed()[1].get(p, ())}
        self._adopted_at.update(dict.fromkeys(pods, self.clock.monotonic()))
        if self.store.SHARED:
            # The replica that held them may be alive, taken for gone by its session (replicas.py), and renew
            # their leases at its shares until it notices: within its replica lease, each lease then running
            # one more lease (its settings may be longer than ours). Until then, one that does not confirm a
            # smaller share holds its pod's growth back.
            replica_lease_s, dpu_lease_s = await asyncio.to_thread(self.store.longest_leases)
            until = (
                self.clock.monotonic()
                + max(self.settings.replica_lease_s, replica_lease_s)
                + max(self.lease_s, dpu_lease_s)
            )
            self._foreign_until.update(dict.fromkeys(names, until))
        # The shares an earlier control plane granted (stored before any DPU was told): resumed as they
        # are, so that the first pass shrinks and grows from what the DPUs may hold, not from nothing.
        granted = await asyncio.to_thread(self.store.load_grants)
        self.shares.update((n, c) for n, c in granted.items() if n in names)
        wall, mono = self.clock.time(), self.clock.monotonic()
        for pod, until in (await asyncio.to_thread(self.store.growth_holds, wall)).items():
            if pod in pods or pod not in self.state.pods:  # a deleted pod's hold binds pods over its prefixes
                self._hold_growth(pod, mono + (until - wall))
                LOG.warning(
                    "pod %s: shares were moving when its last holder stopped: grows in %.1f s", pod, until - wall
                )
        for name, until in (await asyncio.to_thread(self.store.lease_holds, wall)).items():
            if name in names:
                self._lease_holds[name] = mono + (until - wall)
                LOG.warning("%s: a window change's hold is running: no lease for %.1f s", name, until - wall)
        taken = await self._take_standbys(names)
        for k, name in enumerate(sorted(names - taken), 1):
            if self.owns(self.state.dpus[name].pod):  # not fenced meanwhile (replicas.py)
                self._start_agent(self.state.dpus[name])
            if k % BATCH == 0:
                await asyncio.sleep(0)
        # Not a pod let go meanwhile (fenced): its pass would store grants its new holder works from.
        self._reshare_soon([p for p in pods if self.owns(p)])
        self._start_agents()

    async def hold_only(
        self,
        owns: Callable[[str], bool],
        holder: Callable[[str], str],
        election_id: Callable[[], Awaitable[int]],
        backs: Callable[[str], bool],
    ) -> tuple[int, int]:
        """Hold the pods `owns` says (replicas.py), and keep backup streams to those `backs` says; returns how
        many DPUs were taken over and let go.

        A DPU let go is not floored: the replica that takes it renews its lease. One taken gets an agent
        bidding a fresh `election_id()` (larger than any the database gave before), so that the DPU makes it
        primary over any earlier holder that still writes, and refuses that one's writes: its standby agent,
        bidding on the stream it has open, or a new one.
        """
        fences = self._fences
        async with self._lock:
            if self._fences != fences:  # fenced while waiting for the lock: the lease this was for may end
                return 0, 0
            self.owns, self.holder, self.backs = owns, holder, backs
            self._sorted = None
            gone = [a for a in self.agents.values() if not owns(a.dpu.pod)]
            await self._let_go(gone)
            pods = sorted({d.pod for d in self.state.dpus.values() if owns(d.pod) and d.name not in self.agents})
            if pods:
                self.election_id = await election_id()
                await self._adopt(pods)
                self._sync_standbys_after([n for p in pods for n in self._indexed()[1].get(p, ())])
            await self._sync_standbys()
            return sum(len(self._indexed()[1].get(p, ())) for p in pods), len(gone)

    async def fence(self) -> None:
        """Stop writing to every DPU now (replicas.py: this replica's lease may end). Without the lock: a
        write may hang on the database meanwhile, and DPUs are left alone whatever it does then."""
        self.owns = _never
        self.holder = lambda pod: "unknown: this replica lost the database"
        self.backs = _never
        if self._standbys_after is not None:
            self._standbys_after.cancel()
        self._deferring = False
        self._fences += 1
        await self._let_go(list(self.agents.values()))  # (forgets them at once, before stopping them)
        await self._sync_standbys()

    async def _let_go(self, agents: list[DpuAgent]) -> None:
        """Stop agents without flooring their DPUs, and forget their pods' passes (another replica holds them)."""
        for pod in {a.dpu.pod for a in agents}:
            self._reshare_due.pop(pod, None)
            if (task := self._resharing.pop(pod, None)) is not None:
                task.cancel()
            self._share_locks.pop(pod, None)
            self._targets.pop(pod, None)
            self._changes.pop(pod, None)
            self._adopted_at.pop(pod, None)
        for a in agents:
            name = a.dpu.name
            self.agents.pop(name, None)
            for kept in (
                self.shares,
                self._samples,
                self._unconfirmed,
                self._granted_at,
                self._aging,
                self._foreign_until,
            ):
                kept.pop(name, None)  # type: ignore[attr-defined]
        self._sorted = None
        await _stop(agents)

    async def _sync_standbys(self) -> None:
        """Keep a standby agent (a backup stream) to every DPU of the pods `backs` says that this replica does
        not hold, and none to others (a DPU changed gets a new one)."""
        if self.backs is _never and not self.standbys:
            return
        st, backs = self.state, self.backs
        starts = not self._deferring
        gone = [
            a for n, a in self.standbys.items() if n in self.agents or st.dpus.get(n) != a.dpu or not backs(a.dpu.pod)
        ]
        for a in gone:
            del self.standbys[a.dpu.name]
        for name, dpu in st.dpus.items() if starts else ():
            if name not in self.standbys and name not in self.agents and backs(dpu.pod):
                self.standbys[name] = agent = self._agent(dpu, standby=True)
                self._to_start.append(agent)
        self._start_agents()
        await _stop(gone)

    def _sync_standbys_after(self, names: list[str]) -> None:
        """Start no standby until the agents of `names` (just taken over) have converged, or a third of a lease."""

        async def after() -> None:
            gen = self.state.generation
            await asyncio.gather(*(a.wait_converged(gen, self.lease_s / 3) for n in names if (a := self.agents.get(n))))
            self._deferring = False
            await self._sync_standbys()

        if self._standbys_after is not None:
            self._standbys_after.cancel()
        self._deferring = True
        self._standbys_after = asyncio.create_task(after(), name="standbys-after")

    async def _take_standbys(self, names: set[str]) -> set[str]:
        """Make the standby agents of `names` (DPUs this replica now holds) their holders, bidding this replica's
        election id (on the streams they have open, or on their next); the names taken so (one that has
        ended is not: a new agent is started). All of it before the first wait: a fence or stop meanwhile
        finds them among the holders, and stops them."""
        taken, stale = set(), []
        for name in sorted(names):
            if (a := self.standbys.pop(name, None)) is None:
                continue
            if a.ended or self.state.dpus.get(name) != a.dpu or not self.owns(a.dpu.pod):
                stale.append(a)
                continue
            self._hold(a)  # told of what it applies and holds before it applies anything
            a.take_over(
                self.election_id,
                # A share granted before (stored, or this control plane's) may have come with a lease.
                leased_before=self.shares.get(name) is not None,
                hold_until=self._lease_holds.pop(name, -math.inf),
            )
            taken.add(name)
        await _stop(stale)
        return taken

    def _start_agent(self, dpu: Dpu) -> None:
        """Make `dpu`'s agent now; its connection is opened soon after, in the background (a few at a time)."""
        agent = self._agent(
            dpu,
            # A share granted before (stored, or this control plane's) may have come with a lease.
            leased_before=self.shares.get(dpu.name) is not None,
            hold_until=self._lease_holds.pop(dpu.name, -math.inf),
        )
        self._hold(agent)
        self._to_start.append(agent)

    def _hold(self, agent: DpuAgent) -> None:
        """Make `agent` its DPU's holder here: told of what it applies and holds, renewing its lease."""
        name = agent.dpu.name
        agent.on_applied = functools.partial(self._aged, name)
        agent.on_hold = functools.partial(self._hold_lease, name)
        agent.on_epoch = functools.partial(self._found_epoch, name)
        agent.recorded_epoch = functools.partial(self._recorded_epoch, name)
        self.agents[name] = agent
        self._sorted = None

    def _agent(
        self,
        dpu: Dpu,
        leased_before: bool = False,
        hold_until: float = -math.inf,
        standby: bool = False,
    ) -> DpuAgent:
        """An agent (not started) keeping `dpu` to what the state and its share say."""

        def intent() -> tuple[int, dp.Intent]:
            st = self.state
            cap = self.shares.get(dpu.name)
            lease = dp.Lease(self.lease_gen, self._lease_issued[self.lease_gen] + self.lease_s)
            if (now := st.dpus.get(dpu.name)) is not dpu and now != dpu:
                # Leaving (deleted, or changed: a new agent takes over): floored with no exemption either,
                # so that a node that left its pod does not keep its old pod's prefixes and peers.
                return st.generation, dp.intent_for(dpu, None, None, lease)
            return st.generation, dp.intent_for(dpu, st.pods.get(dpu.pod), cap, lease, self._peers(dpu.pod))

        return DpuAgent(
            dpu,
            self.program,
            intent,
            # A standby bids below every holder (they bid the database's fresh number above the configured
            # id, 2^40; standbys that number above half of it, clear of other controllers' defaults such as
            # p4runtime-shell's 1): the DPU makes it primary only when no holder is connected, and then it
            # writes nothing.
            self.settings.election_id // 2 + self.election_id - self.settings.election_id
            if standby
            else self.election_id,
            self.p4runtime_tls,
            self.resync_s,
            self.pipeline_check_s,
            self.slots,
            leased_before=leased_before,
            hold_until=hold_until,
            clock=self.clock,
            standby=standby,
        )

    async def _found_epoch(self, name: str, epoch: int, lost_at: float) -> None:
        """Store the pipeline instance a DPU's holder found (lost_at: monotonic, or -inf) for its next holder."""
        wall = None if lost_at == -math.inf else self.clock.time() + (lost_at - self.clock.monotonic())
        await self._store_epochs([(name, epoch, wall)])

    async def _recorded_epoch(self, name: str) -> tuple[int, float] | None:
        """The pipeline instance stored for a DPU (_found_epoch), and when its state was lost then (monotonic)."""
        (recorded,) = await self._epochs_of([name])
        if recorded is None:
            return None
        epoch, lost_at = recorded
        return epoch, -math.inf if lost_at is None else self.clock.monotonic() + (lost_at - self.clock.time())

    def _hold_lease(self, name: str, until: float) -> None:
        """Store a DPU's lease hold (until: monotonic) for a control plane started before it ends."""
        self._store_soon(self._store_lease_holds([(name, self.clock.time() + (until - self.clock.monotonic()))]))

    def _store_soon(self, write: Coroutine[Any, Any, list[None]]) -> None:
        """Run a batched store write in the background (an agent's callback cannot wait for it; a pass need
        not wait for a hold's release)."""
        task = asyncio.create_task(write)
        self._storing.add(task)
        task.add_done_callback(self._stored)

    def _stored(self, task: asyncio.Task[list[None]]) -> None:
        self._storing.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # A DPU's next holder does not know of it: it waits as for a stranger's instance, or not for the hold;
            # or a pod's next holder waits out a growth hold that had ended.
            LOG.warning("storing a lease hold, a pipeline instance or a growth hold's end failed: %s", exc)

    def _start_agents(self) -> None:
        """Start the agents made since (once the write that made them is done with the loop)."""
        if self._to_start and (self._starter is None or self._starter.done()):
            self._starter = asyncio.create_task(self._starting(), name="start-agents")

    async def _starting(self) -> None:
        """Start queued agents a few at a time: opening a connection takes the loop a while, and a
        fleet's write makes thousands at once.

        While thousands start, the heap is frozen every FREEZE_EVERY of them (heap.freeze).
        """
        started = 0
        while self._to_start:
            for _ in range(min(START_BATCH, len(self._to_start))):
                agent = self._to_start.popleft()
                name = agent.dpu.name
                if agent in (self.agents.get(name), self.standbys.get(name)):  # not gone (deleted, changed) meanwhile
                    agent.start()
                    started += 1
                    self._started_since_freeze += 1
            await asyncio.sleep(0)
            if started >= FREEZE_EVERY or (started and not self._to_start and len(self.agents) >= FREEZE_EVERY):
                await asyncio.sleep(0)  # the last batch's first steps have made their objects
                heap.freeze()
                started = 0
        self._settle_after_burst()

    def _connecting(self, agents: int) -> None:
        """`agents` more open their connections now (at a pace: pacing.py), each making objects that stay
        while it is connected or trying: frozen every FREEZE_EVERY agents, as while they start, and the rest of a
        burst of at least FREEZE_MIN agents once FREEZE_SETTLE_S has passed since its last (_settle_after_burst)."""
        self._connected_since_freeze += agents
        # Not while the collector waits for a write's objects (heap.paused): that write freezes them all.
        if self._connected_since_freeze >= FREEZE_EVERY and gc.isenabled():
            self._connected_since_freeze = 0
            heap.freeze()
        self._settle_after_burst()

    def _settle_after_burst(self) -> None:
        """If at least FREEZE_MIN agents started since the heap was last frozen here, freeze it FREEZE_SETTLE_S
        after the last of their connections was let go (each let-go puts it off): a 1,000-DPU replica never
        reached FREEZE_EVERY, and every full collection during a cap change scanned its connections again
        (50-63 ms, one or two a change). Connection retries of agents already started never count: frozen
        each time, their garbage would pile up out of the collector's reach."""
        if self._started_since_freeze < FREEZE_MIN or self._stopping:
            return
        if self._settle_freeze is not None:
            self._settle_freeze.cancel()
        self._settle_freeze = asyncio.get_running_loop().call_later(FREEZE_SETTLE_S, self._freeze_connected)

    def _freeze_connected(self) -> None:
        """Freeze what a burst of agents and their connections made, once made (unless a write pauses the
        collector: that write freezes it all)."""
        self._settle_freeze = None
        if self._started_since_freeze >= FREEZE_MIN and gc.isenabled():
            self._started_since_freeze = self._connected_since_freeze = 0
            heap.freeze()

    def _indexed(self) -> tuple[dict[str, tuple[str, ...]], dict[str, list[str]]]:
        """Per pod, the node MACs of its node DPUs and the names of all its DPUs (worked out once per state)."""
        st = self.state
        if self._index[0] is not st:
            macs: dict[str, list[str]] = {}
            for d in st.dpus.values():
                if d.role is Role.NODE and d.node_mac:
                    macs.setdefault(d.pod, []).append(d.node_mac)
            self._index = (st, {p: tuple(sorted(m)) for p, m in macs.items()}, pod_members(st))
        return self._index[1], self._index[2]

    def _peers(self, pod: str) -> tuple[str, ...]:
        """The node MACs of `pod`'s node DPUs: its inventory of who is inside."""
        return self._indexed()[0].get(pod, ())

    # ---------------------------------------------------------------- leases

    def renew_leases(self) -> dict[str, int]:
        """Give every DPU a new lease generation now; returns each agent's ticket to wait on."""
        gen = (self.lease_gen + 1) & dp.MAX_LEASE_GEN
        # Issued before it is current: status() may read both from a worker thread meanwhile.
        self._lease_issued[gen] = self.clock.monotonic()
        self.lease_gen = gen
        while len(self._lease_issued) > LEASES_KEPT:
            del self._lease_issued[next(iter(self._lease_issued))]  # the oldest (dicts keep insertion order)
        return {name: agent.poke() for name, agent in self.agents.items()}

    async def _lease_loop(self) -> None:
        # A third of the lifetime between renewals: one lost renewal does not let a lease lapse. Each is
        # due a third after the last one was due, not after it came: a busy loop's delay and a fleet's
        # renewal (20,000 pokes) do not add up from one renewal to the next.
        period = self.lease_s / 3
        due = self.clock.monotonic() + period
        while True:
            with self._parked():
                await self.clock.sleep(max(0.0, due - self.clock.monotonic()))
            self.renew_leases()
            due = max(due + period, self.clock.monotonic())

    # ---------------------------------------------------------------- shares

    def _reshare(self, pod: str) -> None:
        """Move the pod's DPUs to their shares of its cap, in the background (one pass at a time)."""
        self._reshare_due.pop(pod, None)
        old = self._resharing.get(pod)
        if old is not None and not old.done():
            old.cancel()
        self._resharing[pod] = asyncio.create_task(self._reshare_pass(pod), name=f"reshare-{pod}")

    def _reshare_soon(self, pods: list[str]) -> None:
        """`_reshare` each of `pods`, RESHARE_BATCH of them per turn of the event loop: a pass's first step
        grants and pokes, and a fleet's write reshares thousands of pods."""
        self._reshare_due.update(dict.fromkeys(pods))
        if self._reshare_due and (self._resharer is None or self._resharer.done()):
            self._resharer = asyncio.create_task(self._resharing_due(), name="reshare-due")

    async def _resharing_due(self) -> None:
        while self._reshare_due:
            for pod in list(itertools.islice(self._reshare_due, RESHARE_BATCH)):
                self._reshare(pod)
            await asyncio.sleep(0)

    @contextlib.contextmanager
    def _parked(self) -> Iterator[None]:
        """The current task (a loop or a share pass) waits on DPUs or on the clock from here (quiet)."""
        task = asyncio.current_task()
        assert task is not None
        self._parked_tasks.add(task)
        try:
            yield
        finally:
            self._parked_tasks.discard(task)

    async def quiet(self, timeout: float = 30.0) -> bool:
        """Wait until the control plane has nothing left to do before its clock moves on (at most
        `timeout` s of wall time; whether it got there).

        Nothing left: no agent has a change to apply over a connection, no agent waits to start, and
        every share pass has ended or waits on its DPUs or on the clock. A simulation moves its clock
        only then, so that the control plane acts in no simulated time, as it would act at once.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        calm = 0
        while calm < QUIET_TURNS:
            tasks = [*self._resharing.values(), *self._storing, self._leaser, self._rebalancer]
            running = [t for t in tasks if t is not None and not t.done() and t not in self._parked_tasks]
            starting = self._to_start or (self._starter is not None and not self._starter.done())
            busy = running or starting or self._reshare_due or any(a.busy for a in self.agents.values())
            calm = 0 if busy else calm + 1
            if busy and asyncio.get_running_loop().time() > deadline:
                return False
            # A task woken by a DPU's confirmation resumes on a later turn of the loop: a few calm turns in a row.
            await asyncio.sleep(0 if not busy else 0.001)
        return True

    async def settle(self, pod: str) -> None:
        """Wait until the pod's share change (if any) has been applied: its newest pass has ended (one cancelled
        because a newer one took over, or the pod deleted, is waited past, not raised to the waiter)."""
        while True:
            if pod in self._reshare_due:  # not started yet
                await asyncio.sleep(0.01)
                continue
            task = self._resharing.get(pod)
            if task is None or task.done():
                return
            await asyncio.wait([task])

    def resharing(self, pod: str) -> bool:
        """Whether a share change of `pod` is still being applied (or due to be)."""
        if pod in self._reshare_due:
            return True
        task = self._resharing.get(pod)
        return task is not None and not task.done()

    async def _reshare_pass(self, pod: str, step_timeout: float = 30.0) -> None:
        lock = self._share_locks.setdefault(pod, asyncio.Lock())
        async with lock:
            target: dict[str, Cap | None] = {}
            for layer in self._layers(pod):
                target.update(self._target(pod, layer))
            # Step 1, shrink: everyone to the lesser of old and new; wait until no DPU can pass more.
            # (Nothing to shrink, e.g. a cap that only grows: straight to step 2.)
            old = {n: self.shares.get(n) for n in target}
            step = {n: shares.lesser(old[n], target[n]) for n in target}
            shrunk = [n for n in target if old[n] != step[n]]
            hold = None
            if shrunk:
                # Stored with the grants, before any DPU is told: a control plane started after a crash waits
                # for it too.
                aging = max(_window_s(old[n]) for n in shrunk)
                hold = GrowthHold(pod, self.clock.time() + self.lease_s + aging)
            tickets, hold_id = await self._grant(step, hold)
            # A window budget that shrank still holds what its DPU passed in the last window, which no
            # other DPU's budget sees: nobody grows into it before that has aged out, one window after
            # the shrink took effect (_aged: when its DPU confirms it, or its old lease ends), even if
            # a later pass takes over this one.
            for n in shrunk:
                if (w := _window_s(old[n])) > 0 and n in tickets:
                    self._aging[n] = (tickets[n], max(w, self._aging.get(n, (0, 0.0))[1]))
            # Grants an earlier (cancelled) pass made and nobody has confirmed yet are waited for too.
            tickets = {**{n: self._unconfirmed[n] for n in target if n in self._unconfirmed}, **tickets}
            with self._parked():
                await self._held_back(pod, tickets, step_timeout)
            # Step 2, grow: after any DPU that left without being floored has lost its lease, and what
            # shrank has aged out of its window.
            wait = self._growth_hold(pod) - self.clock.monotonic()
            if wait > 0:
                # (expected after a DPU left unfloored, which is warned of once a write)
                LOG.info("pod %s: growing shares in %.1f s (a lease to end, or a window to age)", pod, wait)
                with self._parked():
                    await self.clock.sleep(wait)
            if hold_id is not None:  # nothing that shrank can pass its old share any more
                # Forgotten in the background: the pass (and the pod's convergence) need not wait for a commit
                # whose only effect, lost to a crash, is a successor waiting out a hold that has ended here.
                self._store_soon(self._releases([hold_id]))
            tickets, _ = await self._grant(target)
            with self._parked():
                confirmed = await self._confirmed(tickets, step_timeout)
            if not confirmed:
                LOG.warning("pod %s: growing shares is not confirmed by every DPU yet", pod)

    def _aged(self, name: str, ticket: int | None) -> None:
        """`name`'s window-mode shrink took effect now (confirmed by `ticket`, or its old lease ended:
        None): what it passed under its old budget ages out of the window one window from now."""
        pending = self._aging.get(name)
        if pending is None or (ticket is not None and ticket < pending[0]):
            return
        del self._aging[name]
        if (agent := self.agents.get(name)) is not None:
            self._hold_growth(agent.dpu.pod, self.clock.monotonic() + pending[1])

    def _growth_hold(self, pod: str) -> float:
        """Until when (monotonic) no DPU of `pod` may grow: its own hold, and that of any deleted pod whose
        prefixes overlap its own."""
        until = self._grow_after.get(pod, 0.0)
        mine = self.state.pods.get(pod)
        now = self.clock.monotonic()
        for gone in [g for g in self._deleted_prefixes if self._grow_after.get(g, 0.0) <= now]:
            del self._deleted_prefixes[gone]  # its wait is over: nothing to inherit
        if mine is not None:
            for gone, prefixes in self._deleted_prefixes.items():
                if self._grow_after.get(gone, 0.0) > until and overlapping(mine.ipv4_prefixes, prefixes):
                    until = self._grow_after[gone]
        return until

    def _hold_growth(self, pod: str, until: float) -> None:
        """No DPU of `pod` grows before `until` (monotonic)."""
        if until > self._grow_after.get(pod, 0.0):
            self._grow_after[pod] = until

    async def _grant(
        self, grants: dict[str, Cap | None], hold: GrowthHold | None = None
    ) -> tuple[dict[str, int], int | None]:
        """Grant shares (stored first, with `hold` if given) and poke their DPUs; returns tickets to wait on
        (none if nothing changes) and the hold's id."""
        changed: list[Grant | GrowthHold] = [Grant(n, c) for n, c in grants.items() if self.shares.get(n) != c]
        if not changed and hold is None:
            return {}, None
        # Stored before any DPU is told: a control plane started after a crash resumes from these.
        stored = await self._saved([*changed, *([hold] if hold else [])])
        hold_id = stored[-1] if hold else None
        grants = {n: c for n, c in grants.items() if n in self.agents}  # any deleted meanwhile are gone
        now = self.clock.monotonic()
        self._granted_at.update((n, now) for n, c in grants.items() if self.shares.get(n) != c)
        self.shares.update(grants)
        tickets = {n: self.agents[n].poke() for n in grants if n in self.agents}
        self._unconfirmed.update(tickets)
        return tickets, hold_id

    def _confirm(self, name: str, ticket: int) -> None:
        if self._unconfirmed.get(name) == ticket:
            del self._unconfirmed[name]

    async def _confirmed(self, tickets: dict[str, int], timeout: float) -> bool:
        """Whether every ticketed DPU (still here) applied its ticket within `timeout`."""
        # One DPU at a time against one deadline: the total wait is the slowest one's, with no task per DPU.
        deadline = time.monotonic() + timeout
        ok = True
        for n, t in tickets.items():
            agent = self.agents.get(n)
            if agent is None:
                continue
            if await agent.wait_applied(t, max(0.0, deadline - time.monotonic())):
                self._confirm(n, t)
            else:
                ok = False
        return ok

    def lapse_at(self, name: str) -> float:
        """When a DPU that has not confirmed its latest grant holds no lease that came with an earlier one.

        An intent taken before the grant carries a lease generation issued before it, and a lease
        ends at its generation's issue plus the lifetime on the DPU's own clock (limiter.p4's
        deadline, placed by the agent), whenever it was written and whether or not a packet used it.
        Intents taken since carry the granted share. A DPU taken over from a replica that may still be
        renewing it (_foreign_until) holds that replica's leases until then.
        """
        return max(self._granted_at.get(name, -math.inf) + self.lease_s, self._foreign_until.get(name, -math.inf))

    async def _held_back(self, pod: str, tickets: dict[str, int], step_timeout: float) -> None:
        """Wait until no ticketed DPU can pass more than it is granted now: each has confirmed (read back)
        its grant, or every lease it held under an earlier one has ended (a dead DPU, or one cut off,
        holds growth back for one lease at most, never less). One DPU at a time: no task per DPU."""
        for name, ticket in tickets.items():
            waited = 0.0
            while (agent := self.agents.get(name)) is not None:
                if agent.applied >= ticket:
                    self._confirm(name, ticket)
                    break
                lapse, now = self.lapse_at(name), self.clock.monotonic()
                if now >= lapse:
                    self._aged(name, None)
                    LOG.warning(
                        "pod %s: %s has not confirmed its share, but its earlier lease has ended: the others may grow",
                        pod,
                        name,
                    )
                    break
                if waited >= step_timeout:
                    LOG.warning("pod %s: %s has not confirmed its smaller share yet; not growing any", pod, name)
                    waited = 0.0
                wait = min(step_timeout - waited, RECHECK_S)
                try:
                    async with self.clock.timeout(lapse - now):  # the lapse on the policy's clock
                        applied = await agent.wait_applied(ticket, wait)
                except TimeoutError:
                    continue  # its lease has ended: the loop says so
                if applied:
                    self._confirm(name, ticket)
                    break
                waited += wait

    def _layers(self, pod: str) -> list[list[str]]:
        """The pod's DPUs by role: each list one layer of parallel devices sharing the cap."""
        st = self.state
        return dpu_layers([st.dpus[n] for n in self._indexed()[1].get(pod, ())])

    def _buffer(self, nodes: list[str]) -> int:
        """The largest buffer after the meter among `nodes`."""
        return max((self.state.dpus[n].buffer_bytes for n in nodes), default=0)

    def _target(self, pod: str, nodes: list[str]) -> dict[str, Cap | None]:
        """What each DPU of one layer of `pod` should be granted: nothing, static equal shares, or by demand."""
        cap = self.state.caps.get(pod)
        if cap is None:
            return dict.fromkeys(nodes)
        demand = self._targets.get(pod, {})
        if cap.rebalance and all(n in demand for n in nodes):
            return {n: demand[n] for n in nodes}
        equal = shares.split(cap, nodes)
        if cap.rebalance and nodes:
            # Small buckets from the start: the refill bound counts the initial grants too.
            burst, _ = shares.node_burst(cap, len(nodes), self.rebalance_interval_s, self._buffer(nodes))
            return {n: dataclasses.replace(c, burst_bytes=burst) for n, c in equal.items()}
        return dict(equal)

    async def _rebalance_loop(self, interval_s: float) -> None:
        while True:
            with self._parked():
                await self.clock.sleep(interval_s)
            for pod, cap in list(self.state.caps.items()):
                if cap.rebalance and self.owns(pod):
                    try:
                        await self.rebalance_pod(pod, self.clock.monotonic())
                    except Exception as exc:  # one pod's trouble must not stop the others
                        LOG.warning("rebalancing pod %s failed: %s", pod, exc)

    async def rebalance_pod(self, pod: str, now_s: float, min_change: float = 0.1) -> bool:
        """Re-grant the pod's shares, layer by layer, from the demand measured since the last sample at `now_s`.

        Demand is what reached each DPU's meter (green + red bytes) per second. Returns whether the
        grants changed (then a shrink-before-grow pass applies them).
        """
        cap = self.state.caps.get(pod)
        if cap is None or not cap.rebalance:
            return False
        layers = self._layers(pod)
        members = [n for layer in layers for n in layer]
        if not all(n in self.agents for n in members):
            return False  # held by another replica (or mid-move): that one rebalances it
        reads = await asyncio.gather(*(_read_usage(self.agents[n]) for n in members))
        demand_e: dict[str, float] = {}
        demand_i: dict[str, float] = {}
        for n, usage in zip(members, reads, strict=True):
            e = usage["egress"]["green"][1] + usage["egress"]["red"][1]
            i = usage["ingress"]["green"][1] + usage["ingress"]["red"][1]
            prev = self._samples.get(n)
            self._samples[n] = (now_s, e, i)
            if prev is None or now_s <= prev[0]:
                continue
            dt = now_s - prev[0]
            demand_e[n], demand_i[n] = (e - prev[1]) * 8 / dt, (i - prev[2]) * 8 / dt
        if not members or sorted(demand_e) != sorted(members):
            return False  # a first sample: nothing to compare with yet
        if cap.mode == "window" and self.resharing(pod):
            return False  # the last move is still waiting for what shrank to age out of the window
        if now_s < self._adopted_at.get(pod, -math.inf) + cap.window_s:
            # Its last holder (another replica, or this control plane before a restart) may have refilled its
            # buckets as often as a window allows just before: another refill now could exceed the allowance.
            return False
        recent = [t for t in self._changes.get(pod, []) if t > now_s - cap.window_s]
        new: dict[str, Cap] = {}
        for layer in layers:
            burst, allowed = shares.node_burst(cap, len(layer), self.rebalance_interval_s, self._buffer(layer))
            if len(recent) >= allowed:
                return False  # another refill now could exceed the window's allowance
            new.update(shares.rebalanced(cap, {n: demand_e[n] for n in layer}, {n: demand_i[n] for n in layer}, burst))
        old = self._targets.get(pod)
        if (
            old is not None
            and sorted(old) == sorted(new)
            and all(
                abs(new[n].egress_bps - old[n].egress_bps) <= min_change * max(old[n].egress_bps, 1)
                and abs(new[n].ingress_bps - old[n].ingress_bps) <= min_change * max(old[n].ingress_bps, 1)
                for n in new
            )
        ):
            return False
        self._targets[pod] = new
        self._changes[pod] = [*recent, now_s]
        self._reshare(pod)
        return True

    # ---------------------------------------------------------------- writes

    async def apply_pod(self, pod: Pod, actor: str = "local") -> Pod:
        """Create or replace a pod (already validated); prefixes may not overlap another pod's."""
        await self.apply(pods=[("pod", pod)], actor=actor)
        return pod

    async def register_dpu(self, dpu: Dpu, actor: str = "local") -> Dpu:
        """Register a DPU (already validated) of a known pod; names and endpoints are unique."""
        await self.apply(dpus=[("dpu", dpu)], actor=actor, create_only=True)
        return dpu

    async def set_cap(self, pod: str, cap: Cap, actor: str = "local") -> Cap:
        """Set a pod's cap (already validated)."""
        await self.apply(caps=[("", pod, cap)], actor=actor)
        return cap

    async def apply(
        self,
        pods: Sequence[tuple[str, Pod]] = (),
        dpus: Sequence[tuple[str, Dpu]] = (),
        caps: Sequence[tuple[str, str, Cap]] = (),
        actor: str = "local",
        dry_run: bool = False,
        routers: Sequence[tuple[str, Router]] = (),
        create_only: bool = False,
    ) -> list[Change]:
        """Create or update pods, DPUs, caps and routers as one write: all or none.

        Each object comes validated, with the request field that named it (for a cap, the prefix
        of its `pod` and `cap` fields: "" or "caps[3]."). They are checked together against the
        state they would make (so a DPU may name a pod of the same write), and stored in one
        transaction. A dry run only checks them and says what would change. The checks (O(n log n)
        in the fleet's size) and the store's transaction run in a worker thread: a fleet's file
        leaves the event loop free to answer reads and renew leases meanwhile.
        """

        def plan() -> tuple[list[Change], DesiredState]:
            return planned_apply(self.state, pods, dpus, caps, routers, create_only, self.rebalance_interval_s)

        return await self._write(plan, actor, dry_run)

    async def delete(
        self,
        pods: Sequence[tuple[str, str]] = (),
        dpus: Sequence[tuple[str, str]] = (),
        caps: Sequence[tuple[str, str]] = (),
        actor: str = "local",
        dry_run: bool = False,
        missing_ok: bool = False,
        routers: Sequence[tuple[str, str]] = (),
    ) -> list[Change]:
        """Delete pods, DPUs, caps and routers (by name, each with the request field that named it) as one write.

        A deleted DPU is no longer programmed: without renewals its lease lapses and it falls to its
        floor. A pod goes with its cap, and only when none of its DPUs stays. Unknown names are an
        error unless `missing_ok` (then they are left out of the changes).
        """

        def plan() -> tuple[list[Change], DesiredState]:
            return planned_delete(self.state, pods, dpus, caps, routers, missing_ok)

        return await self._write(plan, actor, dry_run)

    async def _write(
        self, plan: Callable[[], tuple[list[Change], DesiredState]], actor: str, dry_run: bool
    ) -> list[Change]:
        """Plan a write against the current state (in a worker thread) and commit it. With replicas, the state
        is the latest stored one: read again first if the change log moved, and planned anew if another
        replica wrote between the plan and the commit (StateStale), so every replica checks alike.

        A write whose caller goes away (a cancelled call) before it commits is dropped there, nothing stored
        (run later, it could undo a newer write made meanwhile); one that commits runs to its end however often
        its caller is cancelled: cut short, it would leave this replica's state behind what it stored, or let
        a write of its own be planned beside it (a review: two pods of one prefix stored)."""
        left = asyncio.Event()
        return await self._to_the_end(self._written(plan, actor, dry_run, left), "write", left)

    async def _to_the_end(self, work: Coroutine[Any, Any, T], name: str, left: asyncio.Event | None = None) -> T:
        """`work`'s result, run in a task of its own that goes on to its end if the caller goes away (then
        `left` is set), until stop(); its failure, once nobody waits for it, is logged."""
        left = asyncio.Event() if left is None else left
        task = asyncio.create_task(work, name=name)
        self._to_end.add(task)
        task.add_done_callback(functools.partial(self._ended, left))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            left.set()
            raise

    def _ended(self, left: asyncio.Event, task: asyncio.Task[Any]) -> None:
        self._to_end.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None and left.is_set():
            LOG.warning("a %s whose caller had gone failed: %s: %s", task.get_name(), type(exc).__name__, exc)

    async def _written(
        self, plan: Callable[[], tuple[list[Change], DesiredState]], actor: str, dry_run: bool, left: asyncio.Event
    ) -> list[Change]:
        async with self._lock:
            # Caught up before the planning lock is taken: a catch-up's follow-up work (floors, which wait on
            # DPUs) would hold every other replica's write back. Under it, only a write that came in between.
            await self._caught_up()
            async with self._planning(not dry_run) as hold:
                for attempt in itertools.count(1):
                    await self._caught_up()
                    planned_at = self.state_head
                    changes, st = await asyncio.to_thread(plan)
                    if dry_run:
                        return changes
                    if left.is_set():
                        raise asyncio.CancelledError  # (the planning lock is given up on the way out)
                    try:
                        await self._commit(changes, actor, st, hold, planned_at)
                        return changes
                    except StateStale:  # (the planning lock keeps other replicas' writes out: a safety net)
                        if attempt >= STALE_TRIES:
                            raise
        raise AssertionError("unreachable")

    async def _caught_up(self) -> None:
        """With replicas: take what the others wrote if the change log moved (under self._lock)."""
        if self.store.SHARED and await asyncio.to_thread(self.store.log_head) != self.state_head:
            await self._catch_up()

    @contextlib.asynccontextmanager
    async def _planning(self, commits: bool) -> AsyncIterator[PlanningHold]:
        """For a write that commits: the database's planning lock from its plan to its commit. Without it, a
        replica whose plan another replica's commit made stale plans anew, and against one writing without
        pause lost again and again (measured: 5 plans in a row lost, UNAVAILABLE, for up to 1 write in 20)."""
        hold = PlanningHold()
        try:
            deadline = time.monotonic() + PLAN_LOCK_WAIT_S
            while commits and not await asyncio.to_thread(self._take, hold):
                if time.monotonic() > deadline:
                    raise StateStale(f"another replica has been planning a write for {PLAN_LOCK_WAIT_S:g} s")
                await asyncio.sleep(0.005)
            yield hold
        finally:
            if commits:  # (a write that committed gave it up with its commit; one cancelled while a thread was
                # taking it gives it up once that thread is done: the thread runs on if this wait is cancelled)
                await asyncio.shield(asyncio.to_thread(self._give_up, hold))

    def _take(self, hold: PlanningHold) -> bool:
        """Try for the planning lock (in a worker thread); whether this write holds it now."""
        with hold.mutex:
            if not hold.given_up:  # (a write stopped meanwhile: its give-up may have come first)
                hold.held = self.store.try_planning_lock()
            return hold.held

    def _give_up(self, hold: PlanningHold) -> None:
        """Give the planning lock up if this write still holds it (in a worker thread)."""
        with hold.mutex:
            hold.given_up = True
            if hold.held:
                hold.held = False
                try:
                    self.store.release_planning_lock()
                except Exception as exc:  # the session is gone, and the lock with it: a write done stays done
                    LOG.warning("giving the planning lock up: %s", exc)

    async def refresh(self) -> None:
        """With replicas: take what the others wrote if the change log moved (a read then answers the latest)."""
        if self.store.SHARED and await asyncio.to_thread(self.read_head) != self.state_head:
            await self.catch_up()  # (waits for one under way: the state it holds may be older than its head)

    async def catch_up(self) -> bool:
        """Take what other replicas wrote (replicas.py, when the change log's head moved); whether it had. It
        runs to its end if its caller goes away (a read whose call was cancelled): cut short after it held the
        new state, its follow-up (agents, floors, shares) would never be done."""
        return await self._to_the_end(self._locked_catch_up(), "catch-up")

    async def _locked_catch_up(self) -> bool:
        async with self._lock:
            return await self._catch_up()

    async def _catch_up(self) -> bool:
        """Read the state again and do for the DPUs this replica holds what its writer would have (under
        self._lock): floor those leaving, start new ones, reshare the pods touched."""
        new, head = await asyncio.to_thread(self.store.load_at)
        if head == self.state_head:
            return False
        changes = state_changes(self.state, new)
        leaving, held = self._leaving(changes)
        # The writer stored these holds for the DPUs it held; for ours it could not: stored now.
        await self._saved(self._leaving_holds(leaving, held))
        self.state, self.state_head = new, head
        self._sorted = None
        await self._followed(changes, leaving, held)
        self._moved()
        return True

    def _leaving(self, changes: list[Change]) -> tuple[list[DpuAgent], dict[str, Cap | None]]:
        """The agents of DPUs that the changes delete or change (they get new agents), and their shares."""
        leaving = [self.agents[c.name] for c in changes if c.kind == "dpu" and c.name in self.agents]
        return leaving, {a.dpu.name: self.shares.get(a.dpu.name) for a in leaving}

    def _leaving_holds(self, leaving: list[DpuAgent], held: dict[str, Cap | None]) -> list[Grant | GrowthHold]:
        """Until when (wall clock) each leaving DPU's pod may not grow, if it could not be floored."""
        now = self.clock.time()
        return [
            GrowthHold(a.dpu.pod, now + self.lease_s + _window_s(held[a.dpu.name])) for a in leaving if held[a.dpu.name]
        ]

    async def _commit(
        self, changes: list[Change], actor: str, st: DesiredState, hold: PlanningHold, planned_at: tuple[int, str]
    ) -> None:
        """Store the changes (which make `st` of the current state), then set every agent and share they
        touch moving (under self._lock). A fleet's worth of follow-up work yields to the loop every BATCH
        objects, and agents open their connections in the background."""
        changes = [c for c in changes if c.verb != "unchanged"]
        if not changes:
            return
        dpus = [c for c in changes if c.kind == "dpu"]
        # A DPU that leaves (deleted, or changed: it gets a new agent) is floored first, so that the
        # shares it held are free before anyone grows into them; one that cannot be floored may pass
        # its old share until its lease lapses, so its old pod's DPUs grow only after that. What it
        # passed within its last window stays in the pod's window, unseen by the others.
        leaving, held = self._leaving(changes)
        # Stored before the change is (one transaction): a control plane started after a crash waits as long as
        # this one, and a DPU made again starts from nothing.
        await self._saved([*self._leaving_holds(leaving, held), *(Grant(c.name, None) for c in dpus)])
        # The store holds what `st` holds once the transaction commits: no need to read it all back.
        st.generation, head = await asyncio.to_thread(self._committed, changes, actor, hold, planned_at)
        self.state, self.state_head = st, head
        await self._followed(changes, leaving, held)
        self._moved()

    def _committed(
        self, changes: list[Change], actor: str, hold: PlanningHold, planned_at: tuple[int, str]
    ) -> tuple[int, tuple[int, str]]:
        """Commit the changes and give the planning lock up with the commit (in a worker thread): other
        replicas' writes need not wait for this one's follow-up work. Returns the generation and head."""
        with hold.mutex:
            stored = self.store.commit_planned(changes, actor, planned_at, hold.held)
            hold.held = False
            return stored

    def _moved(self) -> None:
        """Wake those waiting for a new state (set once its shares and agents are moving: before, a wait could
        find every DPU holding the old intent and take it for the new one)."""
        self._moved_generation = self.state.generation
        moved, self._state_moved = self._state_moved, asyncio.Event()
        moved.set()

    async def _followed(self, changes: list[Change], leaving: list[DpuAgent], held: dict[str, Cap | None]) -> None:
        """What a stored write asks of the DPUs this replica holds (the write's own, or another replica's)."""
        dpus = [c for c in changes if c.kind == "dpu"]
        unfloored = []
        for a, done in zip(leaving, await self._floor(leaving), strict=True):
            self._hold_growth(
                a.dpu.pod, self.clock.monotonic() + (0.0 if done else self.lease_s) + _window_s(held[a.dpu.name])
            )
            if not done:
                unfloored.append(a.dpu.name)
        if unfloored:
            # One line a write, not one a DPU (a red team: 148,000 lines in 4 minutes of churn).
            LOG.warning(
                "%d DPU(s) left without being floored (%s): their pods' DPUs grow after their leases",
                len(unfloored),
                _some(unfloored),
            )
        for a in leaving:
            self.agents.pop(a.dpu.name, None)  # (gone already if this replica was fenced meanwhile)
        await _stop(leaving)
        self._sorted = None
        pods: dict[str, None] = {}  # ordered: pods reshare in the order the write named them
        # A fleet's agents are millions of objects: the collector waits until they are all made, then they
        # are frozen (heap.freeze), rather than scanned again and again as the heap grows (0.4 s of 20,000).
        bulk = len(changes) >= FREEZE_EVERY
        with heap.paused() if bulk else contextlib.nullcontext():
            for k, c in enumerate(dpus, 1):
                self.shares.pop(c.name, None)
                self._samples.pop(c.name, None)
                self._unconfirmed.pop(c.name, None)
                self._granted_at.pop(c.name, None)
                self._foreign_until.pop(c.name, None)
                self._aging.pop(c.name, None)
                pods.update((d.pod, None) for d in (c.before, c.after) if isinstance(d, Dpu))
                if isinstance(c.after, Dpu) and self.owns(c.after.pod):
                    self._start_agent(c.after)
                if k % BATCH == 0:
                    await asyncio.sleep(0)
        if bulk:
            heap.freeze()  # the new state and agents, and what a fleet's request left behind
        # New prefixes, or a node joining, leaving or changing its MAC: every DPU of the pod reconciles.
        regroup = {c.name for c in changes if c.kind == "pod" and c.verb != "delete"} | {
            d.pod for c in dpus for d in (c.before, c.after) if isinstance(d, Dpu) and d.role is Role.NODE
        }
        members = self._indexed()[1]
        for k, pod in enumerate(regroup, 1):
            for name in members.get(pod, ()):
                if (agent := self.agents.get(name)) is not None:
                    agent.poke()
            if k % BATCH == 0:
                await asyncio.sleep(0)
        for c in changes:
            if c.kind in ("pod", "cap"):
                pods[c.name] = None
            if c.kind == "pod" and c.verb == "delete" and isinstance(c.before, Pod):
                self._deleted_prefixes[c.name] = c.before.ipv4_prefixes
            if c.kind == "cap" or (c.kind == "pod" and c.verb == "delete"):
                # Demand-based grants were made under the old cap; a deleted pod leaves nothing behind.
                self._targets.pop(c.name, None)
                self._changes.pop(c.name, None)
        # Once per pod: a cap reaches DPUs only as their shares of it.
        self._reshare_soon([pod for pod in pods if pod in self.state.pods and self.owns(pod)])
        for pod in pods:
            if pod in self.state.pods:
                continue
            self._reshare_due.pop(pod, None)
            if (task := self._resharing.pop(pod, None)) is not None:
                task.cancel()
                self._share_locks.pop(pod, None)
                # _grow_after stays: a pod made again under this name, or over its prefixes under another,
                # must wait for what the old one did.
        self._start_agents()
        await self._sync_standbys()

    async def _floor(self, agents: list[DpuAgent], timeout: float = 5.0) -> list[bool]:
        """Grant each agent's DPU nothing (its floor); whether each confirmed it within `timeout`
        (one with no connection cannot: it is not waited for)."""

        async def floor(a: DpuAgent) -> bool:
            self.shares[a.dpu.name] = None
            ticket = a.poke()
            return a.status.connected and await a.wait_applied(ticket, timeout)

        return list(await asyncio.gather(*(floor(a) for a in agents)))

    # ---------------------------------------------------------------- reads

    def get_cap(self, pod: str) -> Cap:
        """A pod's cap."""
        if pod not in self.state.pods:
            raise NotFound("pod", pod, "no such pod")
        cap = self.state.caps.get(pod)
        if cap is None:
            raise NotFound("pod", pod, "the pod has no cap (its DPUs pass only intra-pod traffic between nodes)")
        return cap

    def status_snapshot(self, after: str = "", limit: int = 0, held_here: bool = False) -> StatusSnapshot:
        """The agents (by name: those after `after`, at most `limit` of them if not 0; None for a DPU another
        replica holds, unless `held_here` leaves those out), the pods mid-reshare, and whether agents follow the
        page, as they are now (so that `status` can make their rows a slice at a time, while the loop changes
        the agents in between)."""
        busy = set(self._reshare_due) | {p for p, t in self._resharing.items() if not t.done()}
        names = self._names()
        if held_here:
            names = [n for n in names if n in self.agents]
        start = bisect.bisect_right(names, after) if after else 0
        end = start + limit if limit else len(names)
        return [(n, self.agents.get(n)) for n in names[start:end]], busy, end < len(names)

    def _names(self) -> list[str]:
        """The agents' names and those of DPUs other replicas hold, in order, sorted once per set of agents
        (20,000: ~10 ms of the loop per call)."""
        if self._sorted is None:
            others = [d.name for d in self.state.dpus.values() if d.name not in self.agents and not self.owns(d.pod)]
            self._sorted = sorted([*self.agents, *others])
        return self._sorted

    def status(self, snapshot: StatusSnapshot | None = None) -> list[DpuState]:
        """Every DPU's state, by name: its agent's last status (a DPU whose pod is mid-reshare is not
        converged yet) and its lease as last confirmed.

        GetStatus asks this of every DPU of the fleet, so it is one pass of plain lookups: which pods
        are mid-reshare is worked out once, and each row is a tuple. Given a `status_snapshot` (or a
        slice of its agents), it makes their rows only: GetStatus makes a fleet's a slice per turn of the loop.
        """
        agents, busy, _ = snapshot or self.status_snapshot()
        gen, lease_gen, lifetime = self.state.generation, self.lease_gen, self.lease_s
        shares, issued_at = self.shares, self._lease_issued
        now = self.clock.monotonic()
        out = []
        for name, a in agents:  # in order of name (status_snapshot)
            if a is None:  # another replica holds it: its GetStatus says how it is
                holder = self.holder(d.pod) if (d := self.state.dpus.get(name)) is not None else ""
                standby = self.standbys.get(name)
                note = f"held by replica {holder}" + ("; a backup stream from here" if standby and standby.up else "")
                out.append(DpuState(name, False, False, False, note, 0, 0, "", ELSEWHERE, 0, 0, 0, ""))
                continue
            st = a.status
            error, converged, applied = st.last_error, st.converged, st.generation_applied
            if not st.connected and not error:
                # gRPC retries a refused connection or a failed TLS handshake quietly: say so, at least.
                error = f"no connection to {a.dpu.p4runtime_address} for {now - a.down_since:.0f} s"
            if a.dpu.pod in busy:
                converged = False
            elif applied < gen and a.holds(gen):
                applied = gen
            leased = st.lease_generation
            lease = _lease(shares.get(name) is not None, leased, issued_at, lease_gen, lifetime, now)
            out.append(
                DpuState(
                    name,
                    st.connected,
                    st.primary,
                    converged,
                    error,
                    applied,
                    st.drift_corrections,
                    st.last_drift,
                    *lease,
                    st.pipeline_sha256,
                )
            )
        return out

    async def wait_applied(self, generation: int, timeout: float) -> bool:
        """Wait (at most `timeout` s) until this control plane holds `generation` or a later one (0: the current
        one; with replicas, it comes as this one catches up with the store) and every DPU it holds applied it,
        its pods' shares included."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        generation = generation or self.state.generation
        # Not self.state's generation: a write's follow-up work (agents made, shares due) may still be under way
        # (floors, batches), and the DPUs would hold the old intent as the new one.
        while generation > self._moved_generation:
            moved = self._state_moved
            try:
                async with asyncio.timeout_at(deadline):
                    await moved.wait()
            except TimeoutError:
                return False
        return await self.wait_converged(max(deadline - loop.time(), 0.0), generation)

    async def wait_converged(self, timeout: float, generation: int = 0) -> bool:
        """Wait until every DPU applied `generation` (0: the current one) and every pod's shares."""
        gen = generation or self.state.generation
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                for pod in dict.fromkeys([*self._reshare_due, *self._resharing]):
                    await self.settle(pod)  # (at once for a pod whose pass has ended)
        except TimeoutError:
            return False
        # One DPU at a time: the total wait is the slowest DPU's, without a waiter per DPU. An agent stopped or
        # replaced meanwhile (its DPU deleted, changed, moved to another replica) is waited for no longer.
        for a in list(self.agents.values()):
            while not a.holds(gen) and self.agents.get(a.dpu.name) is a:
                left = deadline - loop.time()
                if left <= 0:
                    return False
                await a.wait_converged(gen, min(left, RECHECK_S))
        return True

    async def usage(self, pod: str = "", per_dpu: bool = False) -> list[DirectionUsage]:
        """Usage per pod and direction, summed over the pod's DPUs' counters; with `per_dpu`, each
        DPU's own rows follow its pod's."""
        if pod and pod not in self.state.pods:
            raise NotFound("pod", pod, "no such pod")
        pods = [pod] if pod else sorted(self.state.pods)
        out: list[DirectionUsage] = []
        for name in pods:
            agents = sorted((a for a in self.agents.values() if a.dpu.pod == name), key=lambda a: a.dpu.name)
            reads = await asyncio.gather(*(_read_usage(a) for a in agents), return_exceptions=True)
            # A DPU that cannot be read is said to be so, not counted as idle; so is one another replica
            # holds (only its primary reads it: ask that replica).
            pairs: list[tuple[DpuAgent | Dpu, object]] = list(zip(agents, reads, strict=True))
            if not self.owns(name):
                elsewhere = ConnectionError(f"held by replica {self.holder(name)}")
                pairs = [(self.state.dpus[n], elsewhere) for n in sorted(self._indexed()[1].get(name, ()))]
            unread = {_dpu(a).name: f"{type(r).__name__}: {r}" for a, r in pairs if isinstance(r, BaseException)}
            for dpu_name, why in unread.items():
                if self.owns(name):
                    LOG.warning("usage read of %s failed: %s", dpu_name, why)
            held = [r for _, r in pairs if isinstance(r, dict)]
            for direction in dp.CELLS:
                total = usage_row(name, "", direction, held)
                out.append(dataclasses.replace(total, dpus_unread=len(unread)))
            if per_dpu:
                for a, r in pairs:
                    for direction in dp.CELLS:
                        row = usage_row(name, _dpu(a).name, direction, [r] if isinstance(r, dict) else [])
                        out.append(dataclasses.replace(row, error=unread.get(_dpu(a).name, "")))
        return out

    def lease(self, name: str) -> LeaseView:
        """A DPU's lease as the control plane last confirmed it.

        A generation ends one lifetime after it was issued, on the DPU's own clock (its deadline):
        "lapsed" here is when the DPU drops metered traffic, within the clock echo's round trip.
        """
        gen, granted = self.agents[name].status.lease_generation, self.shares.get(name) is not None
        return LeaseView(
            *_lease(granted, gen, self._lease_issued, self.lease_gen, self.lease_s, self.clock.monotonic())
        )


def _some(names: list[str], most: int = 5) -> str:
    """The first `most` names, and how many more (a log line stays one line however many there are)."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


async def _stop(agents: list[DpuAgent]) -> None:
    """Stop `agents`, and give what they held to the collector: it may be frozen (heap.freeze), and an agent
    and its connection refer to each other, so only a collection frees them."""
    await asyncio.gather(*(a.stop() for a in agents))
    if agents:
        heap.thaw()


def _lease(
    granted: bool, gen: int | None, issued_at: dict[int, float], current: int, lifetime: float, now: float
) -> tuple[str, int, float, float]:
    """A DPU's lease (state, generation, age, lifetime) given whether it holds a share (the agent's
    intent carries a lease only with one: dataplane.intent_for) and the generation it last confirmed."""
    if not granted:
        return "none", 0, 0.0, 0.0
    issued = issued_at.get(gen) if gen is not None else None
    if gen is None or issued is None:  # never confirmed, or long ago
        return "lapsed", gen or 0, 0.0, lifetime
    age = now - issued
    return ("lapsed" if age >= lifetime else "held" if gen == current else "renewing"), gen, age, lifetime


ELSEWHERE = "elsewhere"  # the lease state GetStatus shows for a DPU that another replica holds


class DpuState(NamedTuple):
    """A DPU as GetStatus shows it (LimiterService.status)."""

    name: str
    connected: bool
    primary: bool
    converged: bool
    last_error: str
    generation_applied: int
    drift_corrections: int
    last_drift: str
    lease_state: str  # held | renewing | lapsed | none (_lease) | elsewhere (another replica holds it)
    lease_generation: int
    lease_age_s: float
    lease_lifetime_s: float
    pipeline_sha256: str  # as last read back ("" never)


@dataclass(frozen=True)
class LeaseView:
    """A DPU's lease as last confirmed (GetStatus)."""

    state: str  # held | renewing | lapsed | none
    generation: int
    age_s: float
    lifetime_s: float


async def _read_usage(agent: DpuAgent) -> dict[str, dict[str, tuple[int, int]]]:
    """A DPU's counters; at once an error for one not connected (a read would wait for it)."""
    if not agent.status.connected:
        raise ConnectionError(f"no connection to {agent.dpu.p4runtime_address}")
    return await agent.read_usage()


def _dpu(a: DpuAgent | Dpu) -> Dpu:
    """The DPU of an agent, or the DPU itself (one another replica holds)."""
    return a if isinstance(a, Dpu) else a.dpu


def _window_s(share: Cap | None) -> float:
    """How long bytes passed under `share` count against its pod: its window in window mode, else 0."""
    return share.window_s if share is not None and share.mode == "window" else 0.0
