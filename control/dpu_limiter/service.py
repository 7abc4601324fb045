"""The control plane's service layer: validate, store durably, then let the agents reconcile."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import gc
import itertools
import logging
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from . import dataplane as dp
from . import shares
from .models import (
    MAX_POD_NODE_MACS,
    AlreadyExists,
    Cap,
    Change,
    DesiredState,
    Dpu,
    InvalidArgument,
    Kind,
    NotFound,
    Pod,
    Role,
    Router,
    Verb,
)
from .reconciler import ELECTION_ID, Concurrency, DpuAgent, Slots
from .store import Store
from .tls import TlsFiles
from .units import DEFAULT_LEASE_S, PIPELINE_CHECK_S, RESYNC_S

LOG = logging.getLogger(__name__)
T = TypeVar("T")
In = TypeVar("In")
Out = TypeVar("Out")
Obj = TypeVar("Obj", Pod, Dpu, Cap, Router)


@dataclass(frozen=True)
class DirectionUsage:
    """Bytes and packets one pod sent or received across its boundary, by class and colour."""

    pod: str
    direction: str
    exempt_bytes: int
    metered_bytes: int
    green_bytes: int
    yellow_bytes: int
    red_bytes: int
    other_bytes: int
    fragment_bytes: int
    metered_packets: int
    red_packets: int
    window_bytes: int  # dropped over the window budget
    lease_bytes: int  # dropped for want of a valid lease
    spoofed_bytes: int  # dropped: IPv4 from inside the pod with a source outside it
    intra_bytes: int = 0  # of exempt_bytes: IPv4 between nodes of the pod (node DPUs only)
    arp_bytes: int = 0  # of exempt_bytes: well-formed minimum-size ARP that ARP's own meter passed
    arp_dropped_bytes: int = 0  # dropped: ARP over its own allowance
    dpu: str = ""  # empty: the pod's totals; else the one DPU these counters are from
    dpus_unread: int = 0  # a pod's totals: how many of its DPUs' counters could not be read (left out)
    error: str = ""  # a DPU's row: why its counters could not be read (the row is then all zeros)


LEASES_KEPT = 8  # lease generations whose issue time is remembered (renewals every lifetime / 3)
# A large write's follow-up work is done this many objects (agents made or started, pods reshared) at a
# time, yielding to the event loop in between, so that reads and lease renewals are answered meanwhile.
BATCH = 256
RECHECK_S = 1.0  # how often a wait for a silent DPU's old lease to end looks again
START_BATCH = 64  # agents whose connections are opened at once (each costs the loop ~0.15 ms)
# Agents made or started between two freezes of the heap (see _freeze_heap).
FREEZE_EVERY = 1024


class LimiterService:
    """Desired state in the store, one reconciling agent per DPU."""

    def __init__(
        self,
        store: Store,
        program: dp.ProgramFiles | None = None,
        election_id: int = ELECTION_ID,
        p4runtime_tls: TlsFiles | None = None,
        rebalance_interval_s: float = 2.0,
        rebalance_loop: bool = True,
        resync_s: float = RESYNC_S,
        lease_s: float = DEFAULT_LEASE_S,
        lease_loop: bool = True,
        pipeline_check_s: float = PIPELINE_CHECK_S,
        concurrency: Concurrency | None = None,
    ) -> None:
        self.store = store
        self.slots = Slots(concurrency)  # shared by every agent: how many DPUs are worked on at once
        self.resync_s = resync_s
        self.pipeline_check_s = pipeline_check_s
        # Every DPU with a cap holds a lease of `lease_s`, renewed every third of it with a new
        # generation (seeded at random, so a restarted control plane never repeats the last one).
        self.lease_s = lease_s
        self.lease_gen = secrets.randbits(32)
        # When each recent generation was issued: it ends one lifetime later on every DPU, whenever
        # written (agents place that instant on each DPU's clock).
        self._lease_issued: dict[int, float] = {self.lease_gen: time.monotonic()}
        # Worked out once per state: each pod's node MACs (its inventory) and its DPUs' names.
        self._index: tuple[DesiredState | None, dict[str, tuple[str, ...]], dict[str, list[str]]] = (None, {}, {})
        self.lease_loop = lease_loop
        self._leaser: asyncio.Task[None] | None = None
        self.p4runtime_tls = p4runtime_tls
        self.program = program or dp.limiter_program()
        self.election_id = election_id
        self.state: DesiredState = store.load()
        self.agents: dict[str, DpuAgent] = {}
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
        self._unconfirmed: dict[str, int] = {}  # each DPU's latest share grant not yet confirmed (its ticket)
        self._granted_at: dict[str, float] = {}  # when each DPU's share was last granted (monotonic)
        # Window-mode shrinks not yet in effect: the ticket that confirms each, and its window.
        self._aging: dict[str, tuple[int, float]] = {}
        self._grow_after: dict[str, float] = {}  # pods whose shares may not grow before then (monotonic)
        # The same, stored for a control plane started after a crash: one transaction for all the pods
        # whose shares move at once (a fleet's cap change moves thousands).
        self._holds = Batched(store.hold_growth)
        self._saved_grants = Batched(store.save_grants)
        self._releases = Batched(store.release_growth)
        self.rebalance_interval_s = rebalance_interval_s
        self.rebalance_loop = rebalance_loop  # off: the caller drives rebalance_pod (virtual time)
        self._rebalancer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start an agent for every stored DPU (a restart resumes from the store).

        A pod whose shares were moving when an earlier control plane stopped may have a DPU holding an
        old, larger share (cut off, or deleted while cut off) until the hold that plane stored ends: its
        DPUs start at the shares last granted and grow only then.
        """
        # The shares an earlier control plane granted (stored before any DPU was told): resumed as they
        # are, so that the first pass shrinks and grows from what the DPUs may hold, not from nothing.
        granted = await asyncio.to_thread(self.store.load_grants)
        self.shares.update((n, c) for n, c in granted.items() if n in self.state.dpus)
        wall, mono = time.time(), time.monotonic()
        for pod, until in (await asyncio.to_thread(self.store.growth_holds, wall)).items():
            self._hold_growth(pod, mono + (until - wall))
            LOG.warning(
                "pod %s: shares were moving when the last control plane stopped: grows in %.1f s", pod, until - wall
            )
        for k, dpu in enumerate(list(self.state.dpus.values()), 1):
            self._start_agent(dpu)
            if k % BATCH == 0:
                await asyncio.sleep(0)
        self._reshare_soon(list(self.state.pods))
        self._start_agents()
        if self.rebalance_loop:
            self._rebalancer = asyncio.create_task(self._rebalance_loop(self.rebalance_interval_s))
        if self.lease_loop:
            self._leaser = asyncio.create_task(self._lease_loop())

    async def stop(self) -> None:
        """Stop every agent."""
        for task in (self._starter, self._resharer):
            if task is not None:
                task.cancel()
        self._to_start.clear()
        self._reshare_due.clear()
        for task in self._resharing.values():
            task.cancel()
        if self._rebalancer is not None:
            self._rebalancer.cancel()
        if self._leaser is not None:
            self._leaser.cancel()
        await asyncio.gather(*(a.stop() for a in self.agents.values()))
        self.agents.clear()
        if gc.get_freeze_count():
            gc.unfreeze()  # what the agents held may be frozen (_freeze_heap): let the collector have it

    def _start_agent(self, dpu: Dpu) -> None:
        """Make `dpu`'s agent now; its connection is opened soon after, in the background (a few at a time)."""

        def intent() -> tuple[int, dp.Intent]:
            st = self.state
            cap = self.shares.get(dpu.name)
            lease = dp.Lease(self.lease_gen, self._lease_issued[self.lease_gen] + self.lease_s)
            return st.generation, dp.intent_for(dpu, st.pods.get(dpu.pod), cap, lease, self._peers(dpu.pod))

        agent = DpuAgent(
            dpu,
            self.program,
            intent,
            self.election_id,
            self.p4runtime_tls,
            self.resync_s,
            self.pipeline_check_s,
            self.slots,
        )
        agent.on_applied = functools.partial(self._aged, dpu.name)
        self.agents[dpu.name] = agent
        self._to_start.append(agent)

    def _start_agents(self) -> None:
        """Start the agents made since (once the write that made them is done with the loop)."""
        if self._to_start and (self._starter is None or self._starter.done()):
            self._starter = asyncio.create_task(self._starting(), name="start-agents")

    async def _starting(self) -> None:
        """Start queued agents a few at a time: opening a connection takes the loop a while, and a
        fleet's write makes thousands at once.

        While thousands start, the heap is frozen every FREEZE_EVERY of them (_freeze_heap).
        """
        started = 0
        while self._to_start:
            for _ in range(min(START_BATCH, len(self._to_start))):
                agent = self._to_start.popleft()
                if self.agents.get(agent.dpu.name) is agent:  # not gone (deleted, or changed) meanwhile
                    agent.start()
                    started += 1
            await asyncio.sleep(0)
            if started >= FREEZE_EVERY or (started and not self._to_start and len(self.agents) >= FREEZE_EVERY):
                await asyncio.sleep(0)  # the last batch's first steps have made their objects
                _freeze_heap()
                started = 0

    def _indexed(self) -> tuple[dict[str, tuple[str, ...]], dict[str, list[str]]]:
        """Per pod, the node MACs of its node DPUs and the names of all its DPUs (worked out once per state)."""
        st = self.state
        if self._index[0] is not st:
            macs: dict[str, list[str]] = {}
            for d in st.dpus.values():
                if d.role is Role.NODE and d.node_mac:
                    macs.setdefault(d.pod, []).append(d.node_mac)
            self._index = (st, {p: tuple(sorted(m)) for p, m in macs.items()}, _members(st))
        return self._index[1], self._index[2]

    def _peers(self, pod: str) -> tuple[str, ...]:
        """The node MACs of `pod`'s node DPUs: its inventory of who is inside."""
        return self._indexed()[0].get(pod, ())

    # ---------------------------------------------------------------- leases

    def renew_leases(self) -> dict[str, int]:
        """Give every DPU a new lease generation now; returns each agent's ticket to wait on."""
        self.lease_gen = (self.lease_gen + 1) & dp.MAX_LEASE_GEN
        self._lease_issued[self.lease_gen] = time.monotonic()
        while len(self._lease_issued) > LEASES_KEPT:
            del self._lease_issued[next(iter(self._lease_issued))]  # the oldest (dicts keep insertion order)
        return {name: agent.poke() for name, agent in self.agents.items()}

    async def _lease_loop(self) -> None:
        # A third of the lifetime between renewals: one lost renewal does not let a lease lapse.
        while True:
            await asyncio.sleep(self.lease_s / 3)
            self.renew_leases()

    # ---------------------------------------------------------------- shares

    def _reshare(self, pod: str) -> None:
        """Move the pod's DPUs to their shares of its cap, in the background (one pass at a time)."""
        self._reshare_due.pop(pod, None)
        old = self._resharing.get(pod)
        if old is not None and not old.done():
            old.cancel()
        self._resharing[pod] = asyncio.create_task(self._reshare_pass(pod), name=f"reshare-{pod}")

    def _reshare_soon(self, pods: list[str]) -> None:
        """`_reshare` each of `pods`, BATCH of them per turn of the event loop: a pass's first step
        grants and pokes, and a fleet's write reshares thousands of pods."""
        self._reshare_due.update(dict.fromkeys(pods))
        if self._reshare_due and (self._resharer is None or self._resharer.done()):
            self._resharer = asyncio.create_task(self._resharing_due(), name="reshare-due")

    async def _resharing_due(self) -> None:
        while self._reshare_due:
            for pod in list(itertools.islice(self._reshare_due, BATCH)):
                self._reshare(pod)
            await asyncio.sleep(0)

    async def settle(self, pod: str) -> None:
        """Wait until the pod's share change (if any) has been applied."""
        while pod in self._reshare_due:  # not started yet
            await asyncio.sleep(0.01)
        task = self._resharing.get(pod)
        if task is not None:
            await asyncio.shield(task)

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
                # Stored before any DPU is told: a control plane started after a crash waits for it too.
                aging = max(_window_s(old[n]) for n in shrunk)
                (hold,) = await self._holds([(pod, time.time() + self.lease_s + aging)])
            tickets = await self._grant(step)
            # A window budget that shrank still holds what its DPU passed in the last window, which no
            # other DPU's budget sees: nobody grows into it before that has aged out, one window after
            # the shrink took effect (_aged: when its DPU confirms it, or its old lease ends), even if
            # a later pass takes over this one.
            for n in shrunk:
                if (w := _window_s(old[n])) > 0 and n in tickets:
                    self._aging[n] = (tickets[n], max(w, self._aging.get(n, (0, 0.0))[1]))
            # Grants an earlier (cancelled) pass made and nobody has confirmed yet are waited for too.
            tickets = {**{n: self._unconfirmed[n] for n in target if n in self._unconfirmed}, **tickets}
            await self._held_back(pod, tickets, step_timeout)
            # Step 2, grow: after any DPU that left without being floored has lost its lease, and what
            # shrank has aged out of its window.
            wait = self._grow_after.get(pod, 0.0) - time.monotonic()
            if wait > 0:
                LOG.warning("pod %s: growing shares in %.1f s (a lease to end, or a window to age)", pod, wait)
                await asyncio.sleep(wait)
            if hold is not None:  # nothing that shrank can pass its old share any more
                await self._releases([hold])
            if not await self._confirmed(await self._grant(target), step_timeout):
                LOG.warning("pod %s: growing shares is not confirmed by every DPU yet", pod)

    def _aged(self, name: str, ticket: int | None) -> None:
        """`name`'s window-mode shrink took effect now (confirmed by `ticket`, or its old lease ended:
        None): what it passed under its old budget ages out of the window one window from now."""
        pending = self._aging.get(name)
        if pending is None or (ticket is not None and ticket < pending[0]):
            return
        del self._aging[name]
        if (agent := self.agents.get(name)) is not None:
            self._hold_growth(agent.dpu.pod, time.monotonic() + pending[1])

    def _hold_growth(self, pod: str, until: float) -> None:
        """No DPU of `pod` grows before `until` (monotonic)."""
        if until > self._grow_after.get(pod, 0.0):
            self._grow_after[pod] = until

    async def _grant(self, grants: dict[str, Cap | None]) -> dict[str, int]:
        """Grant shares (stored first) and poke their DPUs; returns tickets to wait on (none if nothing
        changes)."""
        changed = [(n, c) for n, c in grants.items() if self.shares.get(n) != c]
        if not changed:
            return {}
        # Stored before any DPU is told: a control plane started after a crash resumes from these.
        await self._saved_grants(changed)
        grants = {n: c for n, c in grants.items() if n in self.agents}  # any deleted meanwhile are gone
        now = time.monotonic()
        self._granted_at.update((n, now) for n, c in grants.items() if self.shares.get(n) != c)
        self.shares.update(grants)
        tickets = {n: self.agents[n].poke() for n in grants if n in self.agents}
        self._unconfirmed.update(tickets)
        return tickets

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
        Intents taken since carry the granted share.
        """
        return self._granted_at.get(name, -math.inf) + self.lease_s

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
                lapse, now = self.lapse_at(name), time.monotonic()
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
                wait = min(step_timeout - waited, RECHECK_S, lapse - now)
                if await agent.wait_applied(ticket, wait):
                    self._confirm(name, ticket)
                    break
                waited += wait

    def _layers(self, pod: str) -> list[list[str]]:
        """The pod's DPUs by role: each list one layer of parallel devices sharing the cap."""
        st = self.state
        return _layers([st.dpus[n] for n in self._indexed()[1].get(pod, ())])

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
            await asyncio.sleep(interval_s)
            for pod, cap in list(self.state.caps.items()):
                if cap.rebalance:
                    try:
                        await self.rebalance_pod(pod, time.monotonic())
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
        async with self._lock:
            changes, st = await asyncio.to_thread(
                _planned_apply, self.state, pods, dpus, caps, routers, create_only, self.rebalance_interval_s
            )
            if not dry_run:
                await self._commit(changes, actor, st)
        return changes

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
        async with self._lock:
            changes, st = await asyncio.to_thread(_planned_delete, self.state, pods, dpus, caps, routers, missing_ok)
            if not dry_run:
                await self._commit(changes, actor, st)
        return changes

    async def _commit(self, changes: list[Change], actor: str, st: DesiredState) -> None:
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
        leaving = [self.agents[c.name] for c in dpus if c.name in self.agents]
        held = {a.dpu.name: self.shares.get(a.dpu.name) for a in leaving}
        # Stored before the change is: a control plane started after a crash waits as long as this one.
        now = time.time()
        await asyncio.gather(
            self._holds(
                [(a.dpu.pod, now + self.lease_s + _window_s(held[a.dpu.name])) for a in leaving if held[a.dpu.name]]
            ),
            self._saved_grants([(c.name, None) for c in dpus]),  # a DPU made again starts from nothing
        )
        # The store holds what `st` holds once the transaction commits: no need to read it all back.
        st.generation = await asyncio.to_thread(self.store.commit, changes, actor)
        self.state = st
        floored = await self._floor(leaving)
        for a, done in zip(leaving, floored, strict=True):
            self._hold_growth(
                a.dpu.pod, time.monotonic() + (0.0 if done else self.lease_s) + _window_s(held[a.dpu.name])
            )
            if not done:
                LOG.warning("%s left without being floored: its pod's DPUs grow after its lease", a.dpu.name)
        await asyncio.gather(*(self.agents.pop(a.dpu.name).stop() for a in leaving))
        if leaving and gc.get_freeze_count():
            gc.unfreeze()  # what the agents held may be frozen (_freeze_heap): let the collector have it
        pods: dict[str, None] = {}  # ordered: pods reshare in the order the write named them
        for k, c in enumerate(dpus, 1):
            self.shares.pop(c.name, None)
            self._samples.pop(c.name, None)
            self._unconfirmed.pop(c.name, None)
            self._granted_at.pop(c.name, None)
            self._aging.pop(c.name, None)
            pods.update((d.pod, None) for d in (c.before, c.after) if isinstance(d, Dpu))
            if isinstance(c.after, Dpu):
                self._start_agent(c.after)
            if k % BATCH == 0:
                await asyncio.sleep(0)
        if len(changes) >= FREEZE_EVERY:
            _freeze_heap()  # the new state and agents, and what a fleet's request left behind
        # New prefixes, or a node joining, leaving or changing its MAC: every DPU of the pod reconciles.
        regroup = {c.name for c in changes if c.kind == "pod" and c.verb != "delete"} | {
            d.pod for c in dpus for d in (c.before, c.after) if isinstance(d, Dpu) and d.role is Role.NODE
        }
        members = self._indexed()[1]
        for pod in regroup:
            for name in members.get(pod, ()):
                if (agent := self.agents.get(name)) is not None:
                    agent.poke()
        for c in changes:
            if c.kind in ("pod", "cap"):
                pods[c.name] = None
            if c.kind == "cap" or (c.kind == "pod" and c.verb == "delete"):
                # Demand-based grants were made under the old cap; a deleted pod leaves nothing behind.
                self._targets.pop(c.name, None)
                self._changes.pop(c.name, None)
        # Once per pod: a cap reaches DPUs only as their shares of it.
        self._reshare_soon([pod for pod in pods if pod in self.state.pods])
        for pod in pods:
            if pod in self.state.pods:
                continue
            self._reshare_due.pop(pod, None)
            if (task := self._resharing.pop(pod, None)) is not None:
                task.cancel()
                self._share_locks.pop(pod, None)
                # _grow_after stays: a pod made again under this name must wait for what the old one did.
        self._start_agents()

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

    def status(self) -> list[DpuState]:
        """Every DPU's state, by name: its agent's last status (a DPU whose pod is mid-reshare is not
        converged yet) and its lease as last confirmed.

        GetStatus asks this of every DPU of the fleet, so it is one pass of plain lookups: which pods
        are mid-reshare is worked out once, and each row is a tuple.
        """
        gen, lease_gen, lifetime = self.state.generation, self.lease_gen, self.lease_s
        busy = set(self._reshare_due) | {p for p, t in self._resharing.items() if not t.done()}
        shares, issued_at = self.shares, self._lease_issued
        now = time.monotonic()
        out = []
        for name, a in sorted(self.agents.items()):
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
                )
            )
        return out

    async def wait_converged(self, timeout: float) -> bool:
        """Wait until every DPU applied the current generation and every pod's shares."""
        gen = self.state.generation
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            pods = dict.fromkeys([*self._reshare_due, *self._resharing])
            await asyncio.wait_for(asyncio.gather(*(self.settle(p) for p in pods)), timeout)
        except TimeoutError:
            return False
        # One DPU at a time: the total wait is the slowest DPU's, without a waiter per DPU.
        for a in list(self.agents.values()):
            left = deadline - asyncio.get_running_loop().time()
            if not a.holds(gen) and not await a.wait_converged(gen, max(left, 0.0)):
                return False
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
            # A DPU that cannot be read is said to be so, not counted as idle.
            pairs = list(zip(agents, reads, strict=True))
            unread = {a.dpu.name: f"{type(r).__name__}: {r}" for a, r in pairs if isinstance(r, BaseException)}
            for dpu_name, why in unread.items():
                LOG.warning("usage read of %s failed: %s", dpu_name, why)
            held = [(a.dpu.name, r) for a, r in pairs if not isinstance(r, BaseException)]
            for direction in dp.CELLS:
                total = _usage(name, "", direction, [r for _, r in held])
                out.append(dataclasses.replace(total, dpus_unread=len(unread)))
            if per_dpu:
                for a, r in pairs:
                    for direction in dp.CELLS:
                        row = _usage(name, a.dpu.name, direction, [] if isinstance(r, BaseException) else [r])
                        out.append(dataclasses.replace(row, error=unread.get(a.dpu.name, "")))
        return out

    def lease(self, name: str) -> LeaseView:
        """A DPU's lease as the control plane last confirmed it.

        A generation ends one lifetime after it was issued, on the DPU's own clock (its deadline):
        "lapsed" here is when the DPU drops metered traffic, within the clock echo's round trip.
        """
        gen, granted = self.agents[name].status.lease_generation, self.shares.get(name) is not None
        return LeaseView(*_lease(granted, gen, self._lease_issued, self.lease_gen, self.lease_s, time.monotonic()))


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
    lease_state: str  # held | renewing | lapsed | none (_lease)
    lease_generation: int
    lease_age_s: float
    lease_lifetime_s: float


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


def _usage(pod: str, dpu: str, direction: str, reads: list[dict[str, dict[str, tuple[int, int]]]]) -> DirectionUsage:
    """One row of usage: `reads` (DPUs' counter cells) summed for `direction`."""
    tot: dict[str, list[int]] = {}
    for r in reads:
        for k, (npk, nby) in r[direction].items():
            acc = tot.setdefault(k, [0, 0])
            acc[0] += npk
            acc[1] += nby

    def b(k: str) -> int:
        return tot.get(k, [0, 0])[1]

    def pk(k: str) -> int:
        return tot.get(k, [0, 0])[0]

    return DirectionUsage(
        pod=pod,
        direction=direction,
        exempt_bytes=b("intra") + b("arp") - b("arp_red"),
        metered_bytes=b("ipv4") + b("fragment") + b("other"),
        green_bytes=b("green"),
        yellow_bytes=b("yellow"),
        red_bytes=b("red"),
        other_bytes=b("other"),
        fragment_bytes=b("fragment"),
        metered_packets=pk("ipv4") + pk("fragment") + pk("other"),
        red_packets=pk("red"),
        window_bytes=b("window"),
        lease_bytes=b("lease"),
        spoofed_bytes=b("spoofed"),
        intra_bytes=b("intra"),
        arp_bytes=b("arp") - b("arp_red"),  # the class counts ARP before its meter drops any
        arp_dropped_bytes=b("arp_red"),
        dpu=dpu,
    )


def _change(kind: Kind, name: str, before: Obj | None, after: Obj) -> Change:
    verb: Verb = "create" if before is None else "unchanged" if before == after else "update"
    return Change(verb, kind, name, before, after)


def _freeze_heap() -> None:
    """Collect the young generations' garbage, then move everything alive out of the cyclic
    collector's reach (gc.freeze).

    A fleet's state and agents are millions of long-lived objects (an agent and its connection some
    150). Growing the heap that much triggers full collections over all of it, each stalling the
    event loop longer (up to a second at 20,000 DPUs); frozen, they are never scanned again, and a
    collection only looks at what was made since. Only the young generations are collected first
    (milliseconds): a cycle that became garbage in the old one since its last collection stays
    frozen. Agents that go (deleted, or changed) unfreeze the heap (_commit, stop), so that their
    cycles are collected.
    """
    gc.collect(1)
    gc.freeze()


def _planned_apply(
    base: DesiredState,
    pods: Sequence[tuple[str, Pod]],
    dpus: Sequence[tuple[str, Dpu]],
    caps: Sequence[tuple[str, str, Cap]],
    routers: Sequence[tuple[str, Router]],
    create_only: bool,
    rebalance_interval_s: float,
) -> tuple[list[Change], DesiredState]:
    """What a write of these objects would change in `base`, and the state it would make; raises
    InvalidArgument (NotFound, AlreadyExists) naming the first field at fault.

    Pure (runs in a worker thread, `base` is only read) and O(n log n) in the fleet's size: each check
    indexes the state once (by pod, endpoint, MAC, prefix) instead of comparing every pair.
    """
    st = base.copy()
    for where, dpu in dpus:
        if create_only and dpu.name in st.dpus:
            raise AlreadyExists(f"{where}.name", dpu.name, "a DPU with this name is already registered")
    changes = [_change("pod", pod.name, st.pods.get(pod.name), pod) for _, pod in pods]
    st.pods.update((pod.name, pod) for _, pod in pods)
    changes += [_change("dpu", dpu.name, st.dpus.get(dpu.name), dpu) for _, dpu in dpus]
    st.dpus.update((dpu.name, dpu) for _, dpu in dpus)
    changes += [_change("cap", pod, st.caps.get(pod), cap) for _, pod, cap in caps]
    st.caps.update((pod, cap) for _, pod, cap in caps)
    changes += [_change("router", r.name, st.routers.get(r.name), r) for _, r in routers]
    st.routers.update((r.name, r) for _, r in routers)
    # What the write leaves as it was is consistent with the rest of the state already (it passed these
    # checks when it was written), and every check is of a written object against all others: a
    # re-applied fleet's file checks only what changed.
    same = {(c.kind, c.name) for c in changes if c.verb == "unchanged"}
    pods = [(w, p) for w, p in pods if ("pod", p.name) not in same]
    dpus = [(w, d) for w, d in dpus if ("dpu", d.name) not in same]
    caps = [(w, pod, cap) for w, pod, cap in caps if ("cap", pod) not in same]
    routers = [(w, r) for w, r in routers if ("router", r.name) not in same]
    _check_routers(st, routers)
    _check_prefixes(st, pods)
    _check_dpus(st, dpus)
    for where, pod, _ in caps:
        if pod not in st.pods:
            raise NotFound(f"{where}pod", pod, "no such pod")
    # Every pod whose cap or DPUs change must leave each of its DPUs room for a frame.
    # The error names the cap when the write sets it, else a DPU the write adds to the pod.
    cap_fields = {pod: f"{where}cap" for where, pod, _ in caps}
    written: dict[str, dict[str, str]] = {}  # pod -> {DPU written to it: its field}
    for where, dpu in dpus:
        written.setdefault(dpu.pod, {})[dpu.name] = where
    members = _members(st)
    for pod in dict.fromkeys([pod for _, pod, _ in caps] + [dpu.pod for _, dpu in dpus]):
        ours = [st.dpus[n] for n in members.get(pod, ())]
        mine = written.get(pod, {})
        first = next(iter(mine.values()), "dpu")
        blamed = {} if pod in cap_fields else {d.name: mine.get(d.name, first) for d in ours}
        _check_fits(st.caps.get(pod), ours, cap_fields.get(pod, "cap"), blamed, rebalance_interval_s)
    return changes, st


def _planned_delete(
    base: DesiredState,
    pods: Sequence[tuple[str, str]],
    dpus: Sequence[tuple[str, str]],
    caps: Sequence[tuple[str, str]],
    routers: Sequence[tuple[str, str]],
    missing_ok: bool,
) -> tuple[list[Change], DesiredState]:
    """What deleting these (by name, with the field that named each) would change in `base`, and the
    state it would make; pure and O(n log n), like _planned_apply."""
    st = base.copy()
    changes: list[Change] = []

    def known(table: dict[str, T], where: str, name: str, what: str) -> T | None:
        if name not in table and not missing_ok:
            raise NotFound(where, name, f"no such {what}")
        return table.get(name)

    for where, name in routers:
        if (router := known(st.routers, where, name, "router")) is not None:
            changes.append(Change("delete", "router", name, before=router))
            del st.routers[name]
    for where, name in caps:
        if (cap := known(st.caps, where, name, "cap (of pod)")) is not None:
            changes.append(Change("delete", "cap", name, before=cap))
            del st.caps[name]
    for where, name in dpus:
        if (dpu := known(st.dpus, where, name, "DPU")) is not None:
            changes.append(Change("delete", "dpu", name, before=dpu))
            del st.dpus[name]
    members = _members(st) if pods else {}
    behind_of: dict[str, list[str]] = {}
    for r in st.routers.values() if pods else ():
        for p in r.pods:
            behind_of.setdefault(p, []).append(r.name)
    for where, name in pods:
        if (pod := known(st.pods, where, name, "pod")) is None:
            continue
        left = sorted(members.get(name, ()))
        if left:
            raise InvalidArgument(where, name, f"pod still has DPUs {left}; delete them first (or with it)")
        behind = sorted(behind_of.get(name, ()))
        if behind:
            raise InvalidArgument(where, name, f"pod is behind routers {behind}; change or delete them first")
        if name in st.caps:
            changes.append(Change("delete", "cap", name, before=st.caps.pop(name)))
        changes.append(Change("delete", "pod", name, before=pod))
        del st.pods[name]
    # Routers and caps first, pods last: the store's references hold at every step.
    changes.sort(key=lambda c: ("router", "cap", "dpu", "pod").index(c.kind))
    return changes, st


def _members(st: DesiredState) -> dict[str, list[str]]:
    """Each pod's DPUs' names, in the state's order."""
    out: dict[str, list[str]] = {}
    for d in st.dpus.values():
        out.setdefault(d.pod, []).append(d.name)
    return out


def _span(prefix: str) -> tuple[int, int]:
    """The first and last address of a normalised IPv4 prefix ("10.0.1.0/24"), as integers."""
    addr, _, length = prefix.partition("/")
    a, b, c, d = addr.split(".")
    first = int(a) << 24 | int(b) << 16 | int(c) << 8 | int(d)
    return first, first | ((1 << (32 - int(length))) - 1)


def _check_prefixes(st: DesiredState, pods: Sequence[tuple[str, Pod]]) -> None:
    """No prefix of a written pod may overlap another pod's.

    Two prefixes overlap only when one holds the other, so one sweep over every pod's prefixes in
    address order (each prefix before those it holds) finds them all: the prefixes holding the
    current one are the stack of those still open, and the nearest of another pod is a clash of
    both pods. Every pod with a clash gets one (if P's x holds Q's y, the first prefix of another
    pod than P's below x on the stack met one of P's), so O(n log n) in prefixes, whatever nests.
    """
    if not pods:
        return
    spans = sorted(
        (first, -last, pod.name, p) for pod in st.pods.values() for p in pod.ipv4_prefixes for first, last in [_span(p)]
    )
    clash: dict[str, tuple[str, str, str]] = {}  # pod -> (its prefix, the other pod's, the other pod)
    stack: list[tuple[int, str, str]] = []  # (last address, pod, prefix) of the prefixes holding this one
    for first, neg_last, name, p in spans:
        while stack and stack[-1][0] < first:
            stack.pop()
        for _, other, q in reversed(stack):  # at most 33 of one pod's own prefixes before another pod's
            if other != name:
                clash.setdefault(name, (p, q, other))
                clash.setdefault(other, (q, p, name))
                break
        stack.append((-neg_last, name, p))
    for where, pod in pods:
        if pod.name in clash:
            # Named by value, not index: the pod's prefixes are kept sorted, not in the request's order.
            p, q, other = clash[pod.name]
            raise InvalidArgument(f"{where}.ipv4_prefixes", p, f"overlaps {q} of pod {other!r}")


def _check_routers(st: DesiredState, routers: Sequence[tuple[str, Router]]) -> None:
    """Every written router lists known pods, none of which is behind another router."""
    if not routers:
        return
    order = {r.name: k for k, (_, r) in enumerate(routers)}
    owners: dict[str, list[str]] = {}  # pod -> the routers listing it, in the state's order
    for r in st.routers.values():
        for pod in r.pods:
            owners.setdefault(pod, []).append(r.name)
    for k, (where, r) in enumerate(routers):
        for pod in r.pods:  # named by value: a router's pods are kept sorted
            if pod not in st.pods:
                raise NotFound(f"{where}.pods", pod, "no such pod")
            for other in owners.get(pod, ()):
                # Two of this write listing one pod: the later one is at fault.
                if other != r.name and order.get(other, -1) < k:
                    raise InvalidArgument(f"{where}.pods", pod, f"already behind router {other!r}")


def _check_dpus(st: DesiredState, dpus: Sequence[tuple[str, Dpu]]) -> None:
    """Every written DPU names a pod and has an endpoint (address and device id) of its own."""
    if not dpus:
        return
    endpoints: dict[tuple[str, int], list[str]] = {}
    macs: dict[str, list[str]] = {}
    peers: dict[str, int] = {}  # node MACs per pod
    for d in st.dpus.values():
        endpoints.setdefault((d.p4runtime_address, d.device_id), []).append(d.name)
        if d.node_mac:
            macs.setdefault(d.node_mac, []).append(d.name)
            peers[d.pod] = peers.get(d.pod, 0) + 1
    for where, dpu in dpus:
        if dpu.pod not in st.pods:
            raise NotFound(f"{where}.pod", dpu.pod, "no such pod; apply the pod first")
        if dpu.node_mac and peers[dpu.pod] > MAX_POD_NODE_MACS:
            # Each node DPU holds its pod's other nodes in limiter.p4's pod_peers table.
            raise InvalidArgument(
                f"{where}.node_mac", dpu.node_mac, f"pod {dpu.pod!r} would have more than {MAX_POD_NODE_MACS} node MACs"
            )
        for other in endpoints[(dpu.p4runtime_address, dpu.device_id)]:
            if other != dpu.name:
                raise AlreadyExists(
                    f"{where}.p4runtime_address",
                    dpu.p4runtime_address,
                    f"already registered as DPU {other!r} with device id {dpu.device_id}",
                )
        # One node, one MAC: a MAC named twice would make one pod's exemption reach another's node.
        for other in macs.get(dpu.node_mac, ()) if dpu.node_mac else ():
            if other != dpu.name:
                raise AlreadyExists(f"{where}.node_mac", dpu.node_mac, f"already the node MAC of DPU {other!r}")


def _check_fits(
    cap: Cap | None, dpus: list[Dpu], cap_field: str, dpu_fields: dict[str, str], rebalance_interval_s: float
) -> None:
    """Refuse a cap (or DPU set) under which some DPU's buffer would leave it less than one frame.

    Each layer is checked under the grants its DPUs can get: equal shares, and with `rebalance` both
    the first grants (equal shares with rebalancing's smaller buckets, shares.node_burst) and the
    least a node can be granted by demand (its floor, when the others take the rest). The error
    names the DPU's buffer when that DPU is being written (in `dpu_fields`), else the cap.
    """
    if cap is None:
        return
    if not dpus:  # a cap no DPU could hold is refused before any DPU joins (and then blames the DPU)
        dpus = [Dpu("without-a-buffer", "", 0, "")]
    by_name = {d.name: d for d in dpus}
    for layer in _layers(dpus):
        # The DPU with the largest buffer has the least left: when it fits, so do the others.
        buffer_bytes = max(by_name[n].buffer_bytes for n in layer)
        if _layer_fits(cap, len(layer), buffer_bytes, rebalance_interval_s):
            continue
        for grant, what in _grants(cap, len(layer), buffer_bytes, rebalance_interval_s):
            for n in layer:  # the first at fault in name order, as the error names it
                dp.check_fits(by_name[n], grant, what, dpu_fields.get(n), cap_field)


@functools.lru_cache(maxsize=1024)
def _layer_fits(cap: Cap, n: int, buffer_bytes: int, rebalance_interval_s: float) -> bool:
    """Whether a DPU with `buffer_bytes` in a layer of `n` has a frame left under every grant `cap` can
    give it (a fleet's pods mostly share a few caps and layer sizes: each is worked out once)."""
    probe = Dpu("probe", "", 0, "", buffer_bytes=buffer_bytes)
    try:
        for grant, what in _grants(cap, n, buffer_bytes, rebalance_interval_s):
            dp.check_fits(probe, grant, what)
    except InvalidArgument:
        return False
    return True


def _grants(cap: Cap, n: int, buffer_bytes: int, rebalance_interval_s: float) -> list[tuple[Cap, str]]:
    """The grants a DPU of a layer of `n` can hold under `cap` (each with how an error names it)."""
    equal = next(iter(shares.split(cap, [f"n{i}" for i in range(n)]).values()))
    what = "the pod's cap" if n == 1 else f"an equal share of the pod's cap ({n} DPUs)"
    if not cap.rebalance:
        return [(equal, what)]
    burst, _ = shares.node_burst(cap, n, rebalance_interval_s, buffer_bytes)
    least = shares.least_share(cap, n, burst)
    return [
        (dataclasses.replace(equal, burst_bytes=burst), f"{what} with rebalancing's bucket of {burst} bytes"),
        (least, f"the least share rebalancing grants a node ({n} DPUs)"),
    ]


def _layers(dpus: list[Dpu]) -> list[list[str]]:
    """DPU names grouped by role (each group sorted): the layers of parallel devices of one pod."""
    by_role: dict[Role, list[str]] = {}
    for d in dpus:
        by_role.setdefault(d.role, []).append(d.name)
    return [sorted(names) for _, names in sorted(by_role.items())]


def _window_s(share: Cap | None) -> float:
    """How long bytes passed under `share` count against its pod: its window in window mode, else 0."""
    return share.window_s if share is not None and share.mode == "window" else 0.0


class Batched(Generic[In, Out]):
    """Calls of `fn(list of items) -> list of results` made together: whoever asks while a call runs
    waits for the next one, which takes everything asked meanwhile (one store transaction, not one each)."""

    def __init__(self, fn: Callable[[list[In]], list[Out]]) -> None:
        self.fn = fn
        self._pending: list[tuple[list[In], asyncio.Future[list[Out]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, items: list[In]) -> list[Out]:
        """`fn`'s results for `items`, from a call in a thread shared with the others asked for meanwhile
        (a fleet's write asks for thousands at once: one future for them all, not one each)."""
        if not items:
            return []
        future: asyncio.Future[list[Out]] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return await asyncio.shield(future)  # a cancelled caller leaves the batch to the others

    async def _run(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                results = await asyncio.to_thread(self.fn, [item for items, _ in batch for item in items])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            else:
                at = 0
                for items, future in batch:
                    if not future.done():
                        future.set_result(results[at : at + len(items)])
                    at += len(items)
