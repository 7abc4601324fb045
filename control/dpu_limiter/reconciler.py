"""Level-triggered reconciliation: one agent per DPU keeps it holding the desired state.

Each agent owns a finsy Switch: finsy connects, arbitrates (the control plane bids a high
election id), and installs the pipeline when the DPU's cookie differs (a restarted DPU has none).
Whenever the switch becomes ready, whenever the desired state changes, and periodically, the
agent reads back what the DPU holds and writes the difference in a safe order. Transient
failures are retried with tenacity (jittered exponential backoff); one slow or dead DPU never
delays the others, since every agent is its own task.

How many DPUs are worked on at once is bounded (Slots, shared by all agents): pipeline pushes and
reconcile passes each take a slot. asyncio's semaphores hand slots out in the order they were asked
for, so every DPU gets its turn; every call made under a slot has a deadline (finsy's 10 s), so a
DPU that answers slowly, or not at all, holds one slot at most that long while the others go on.
Retries back off without a slot.

One class a little over 600 lines, on purpose: a DpuAgent's connection, its lease placement on the
DPU's clock and its holds after a lost state are one state machine over the same fields.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import math
import random
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import cast

import finsy as fy
from finsy.grpcutil import GRPCCredentialsTLS, GRPCStatusCode
from finsy.p4client import P4ClientError
from finsy.proto import p4i, p4r
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from . import dataplane as dp
from . import finsy_adapter
from .clock import WALL, Clock
from .finsy_adapter import DpuSwitch
from .models import Dpu
from .pacing import Pacer
from .tls import TlsFiles
from .units import (
    CPU_PORT,
    ECHO_TIMEOUT_S,
    MAX_CLOCK_DRIFT,
    MAX_INSTALLS,
    MAX_RECONCILES,
    PIPELINE_CHECK_S,
    RESYNC_S,
)

LOG = logging.getLogger(__name__)

ELECTION_ID = 1 << 40  # above any default controller's bid (finsy 10, p4runtime-shell 1)
MAX_PASSES = 3  # write-and-read-back rounds in one reconcile before it counts as failed


@dataclass(frozen=True)
class Concurrency:
    """How many DPUs the control plane works on at once."""

    installs: int = MAX_INSTALLS  # pipeline pushes
    reconciles: int = MAX_RECONCILES  # reconcile passes

    def __post_init__(self) -> None:
        for name in ("installs", "reconciles"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"concurrency.{name}: must be a whole number >= 1, got {value!r}")


class Slots:
    """The slots all agents of one control plane share (FIFO-fair semaphores), and the pace at which
    they open connections (pacing.Pacer)."""

    def __init__(self, concurrency: Concurrency | None = None) -> None:
        c = concurrency or Concurrency()
        self.installs = asyncio.Semaphore(c.installs)
        self.reconciles = asyncio.Semaphore(c.reconciles)
        self.connects = Pacer()


@dataclass
class AgentStatus:
    """What an agent last saw of its DPU."""

    connected: bool = False
    primary: bool = False
    converged: bool = False
    last_error: str = ""
    generation_applied: int = 0
    drift_corrections: int = 0  # times the DPU held something else than what was last applied
    last_drift: str = ""
    lease_generation: int | None = None  # the lease generation a read-back last confirmed (None: never)
    pipeline_sha256: str = ""  # the pipeline's hash as the DPU last said (pipeline_digest; "": never read)


class DpuAgent:
    """Keeps one DPU converged to the intent that `intent_fn` returns."""

    def __init__(
        self,
        dpu: Dpu,
        program: dp.ProgramFiles,
        intent_fn: Callable[[], tuple[int, dp.Intent]],
        election_id: int = ELECTION_ID,
        tls: TlsFiles | None = None,
        resync_s: float = RESYNC_S,
        pipeline_check_s: float = PIPELINE_CHECK_S,
        slots: Slots | None = None,
        leased_before: bool = False,
        hold_until: float = -math.inf,
        clock: Clock = WALL,
        standby: bool = False,
    ) -> None:
        self.dpu = dpu
        # A replica's backup stream to a DPU another replica holds: connected, writing nothing, until it
        # takes the DPU over (take_over).
        self.standby = standby
        self.clock = clock  # the policy's time: leases, holds, read-back and pipeline-check periods
        self.slots = slots or Slots()
        self.resync_s = resync_s  # read-back period when nothing changes
        self.pipeline_check_s = pipeline_check_s  # 0: only when reads fail
        self.intent_fn = intent_fn
        self.status = AgentStatus()
        self._changed = asyncio.Event()
        self._converged = asyncio.Event()
        self._poked = 0  # how many times the intent changed
        self.applied = 0  # the poke count the last successful reconcile started from
        self._applied_intent: dp.Intent | None = None
        self._codec: dp.Codec | None = None
        self._held: dp.Held | None = None  # the last read-back that matched the intent applied
        self._restored_at = -math.inf  # when the pipeline was last reinstalled for unreadable state
        self._checked_at = self.clock.monotonic()  # when the pipeline was last hashed (connecting installs it)
        self._program, self._election_id, self._tls = program, election_id, tls
        self._switch: DpuSwitch | None = None  # made when the agent starts (start)
        self._task: asyncio.Task[None] | None = None
        self._bidding: asyncio.Task[None] | None = None  # a standby's bid on its stream, taking the DPU over
        self.created = self.clock.monotonic()
        self.down_since = self.created  # when the agent last had no connection (started, or lost it)
        self._applied_source: dp.Intent | None = None  # the last intent applied, as intent_fn gave it
        self.on_applied: Callable[[int], None] | None = None  # told each ticket a reconcile confirms
        # The lease last placed on the DPU's clock and its deadline there (one clock read per lease);
        # forgotten with the connection, since a restarted DPU's clock starts again.
        self._placed: tuple[dp.Lease, int, int] | None = None  # (lease, deadline, epoch)
        self._last_echo_us = -1  # the DPU's time at its last clock echo on this connection
        # The lease epoch of the DPU's pipeline instance (limiter.p4, Epoch), as the last echo armed or
        # found it; None until an echo on this connection (or after a pipeline load) has read it.
        self._epoch: int | None = None
        # The epoch of the last lease this agent placed, kept across connections: an instance with another
        # began after it, and may not pass metered traffic in the same window as that lease did.
        self._leased_epoch: int | None = None
        self._seen_epoch: int | None = None  # the epoch the last echo found or armed, kept across connections
        # Whether the DPU may have passed metered traffic under a lease (this agent's, or, for a DPU that
        # held a share when the control plane started, a predecessor's), and when a pipeline was last
        # loaded on it: a DPU that comes back with its state lost (power-cycled) gets no lease until what
        # it passed before can no longer share a window with what it passes after (_on_dpu_clock).
        self._leased_before = leased_before
        self._lease_out = leased_before  # whether the DPU should hold a lease now (the last one applied had one)
        self._reset_at = -math.inf
        # Each instance this agent finds, and when its state was lost then (monotonic, or -inf), is stored
        # before any lease under it (on_epoch); one it did not arm is a stranger's unless the store says one of
        # this fleet's agents found it (recorded_epoch: a predecessor holding the DPU) and when its state was
        # lost then, whose hold runs on.
        self.on_epoch: Callable[[int, float], Awaitable[None]] | None = None
        self.recorded_epoch: Callable[[], Awaitable[tuple[int, float] | None]] | None = None
        self._loss_unstored = False  # a loss _record_loss could not store yet
        self._hold_until = hold_until  # no lease before then (monotonic): a window change's hold
        self.on_hold: Callable[[float], None] | None = None  # told when a window change holds it, and until when
        self._window_change_seen: dict[int, tuple[int, int]] | None = None  # the windows last held for
        self._leased_source: dp.Intent | None = None  # the last intent applied with a lease (as intent_fn gave it)

    def _failed(self, exc: Exception) -> None:
        self.status.last_error = f"connection: {exc}"

    def _state_lost(self, at: float | None = None) -> None:
        """The DPU's meters, window slots and lease started afresh at `at` (our monotonic time; now if
        None): a pipeline was loaded, or an echo shows its instance began then. Only a DPU that may have
        passed metered traffic before has anything to wait for."""
        if self._leased_before:
            self._reset_at = max(self._reset_at, self.clock.monotonic() if at is None else at)

    @property
    def codec(self) -> dp.Codec | None:
        """How this agent encodes its DPU's entities (there once it has connected)."""
        return self._codec

    @property
    def switch(self) -> fy.Switch:
        """The DPU's finsy switch (its P4Runtime connection); there once the agent has started."""
        assert self._switch is not None, f"agent {self.dpu.name} has not started"
        return self._switch

    def start(self) -> None:
        """Make the DPU's switch and start the agent's task (a fleet's write makes thousands of agents:
        their switches are made here, a few at a time in the background, not in the write)."""
        tls = self._tls
        opts = fy.SwitchOptions(
            p4info=self._program.p4info,
            p4blob=self._program.bmv2_json,
            device_id=self.dpu.device_id,
            initial_election_id=self._election_id,
            ready_handler=self._ready,
            channel_credentials=None
            if tls is None
            else GRPCCredentialsTLS(cacert=tls.ca, cert=tls.cert, private_key=tls.key),
        )
        self._switch = DpuSwitch(
            self.dpu.name,
            self.dpu.p4runtime_address,
            opts,
            self.slots.installs,
            self._failed,
            self._program,
            self._state_lost,
            self.slots.connects,
        )
        self._switch.standby = self.standby
        self._task = asyncio.create_task(self._run(), name=f"agent-{self.dpu.name}")

    @property
    def ended(self) -> bool:
        """Whether it was started and has stopped (stopped, or failed for good: it connects no more)."""
        return self._switch is not None and (self._task is None or self._task.done())

    @property
    def up(self) -> bool:
        """Whether its P4Runtime stream is open (arbitration done)."""
        return self._switch is not None and self._switch.is_up

    def take_over(self, election_id: int, leased_before: bool, hold_until: float) -> None:
        """A standby's: hold its DPU from now on, bidding `election_id` (on the open stream, in the background:
        the DPU's answer makes it primary, and it reconciles as a new connection would; without an open
        stream, on its next connection). The rest as the constructor's arguments. Nothing here waits: a
        fence or stop right after stops it as it would any holder."""
        self.standby = False
        self._leased_before = self._lease_out = leased_before
        self._hold_until = hold_until
        self._election_id = election_id
        # Its cookie is checked as it becomes primary, as on connecting: the hash is due a period from now,
        # not at once (hundreds taken over together would all fetch and hash their pipelines together).
        self._checked_at = self.clock.monotonic()
        if self._switch is not None and (send := finsy_adapter.bid(self._switch, election_id)) is not None:
            self._bidding = asyncio.create_task(self._bid(send), name=f"bid-{self.dpu.name}")

    async def _bid(self, send: Callable[[], Awaitable[None]]) -> None:
        try:
            await send()
        except Exception as exc:  # the stream broke as we bid: finsy connects again, bidding the new id
            LOG.warning("%s: bidding on the backup stream failed: %s", self.dpu.name, exc)

    async def stop(self) -> None:
        """Cancel the agent and close its connection."""
        if self._bidding is not None:
            self._bidding.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    def poke(self) -> int:
        """The desired state changed: reconcile now. Returns a ticket for `wait_applied`."""
        self._poked += 1
        self._converged.clear()
        self._changed.set()
        return self._poked

    @property
    def busy(self) -> bool:
        """Whether it has a change to apply and a connection to apply it over."""
        return self.status.connected and self.applied < self._poked

    async def wait_applied(self, ticket: int, timeout: float) -> bool:
        """Wait until a reconcile that started after poke `ticket` has succeeded."""
        return await self._wait_for(lambda: self.applied >= ticket, timeout)

    async def wait_converged(self, generation: int, timeout: float) -> bool:
        """Wait until this DPU has applied `generation` (or later)."""
        return await self._wait_for(lambda: self.holds(generation), timeout)

    def holds(self, generation: int) -> bool:
        """Converged on `generation`, or on an intent that the writes since did not change.

        A write to one pod does not make the other pods' DPUs reconcile; they hold the current
        generation all the same.
        """
        st = self.status
        return st.converged and (st.generation_applied >= generation or self._applied_source == self.intent_fn()[1])

    async def _wait_for(self, done: Callable[[], bool], timeout: float) -> bool:
        async def _wait() -> None:
            while not done():
                self._converged.clear()
                await self._converged.wait()

        if done():
            return True
        try:
            async with asyncio.timeout(timeout):  # no task per wait, unlike wait_for: thousands wait at once
                await _wait()
            return True
        except TimeoutError:
            return False

    async def _run(self) -> None:
        try:
            await self.switch.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.status.last_error = f"{type(exc).__name__}: {exc}"
            LOG.error("agent %s stopped: %s", self.dpu.name, exc)

    async def _ready(self, sw: fy.Switch) -> None:
        if self.standby:  # primary or not (the highest id left once the holder is gone), it writes nothing
            return
        self.status.connected = True
        self.status.primary = sw.is_primary
        if not sw.is_primary:
            # A backup: a controller with a higher election id (a replica that took this DPU over) is primary,
            # and the DPU refuses our writes. Nothing is tried; finsy calls this again if we become primary.
            self.status.converged = False
            self.status.last_error = f"backup: the DPU's primary has election id {sw.primary_id}"
            self._applied_intent = None  # the primary writes what it will: nothing it writes is drift
            LOG.warning("%s: %s", self.dpu.name, self.status.last_error)
            return
        self._held = None  # a new connection: the DPU may have restarted, read it afresh
        self.status.lease_generation = None  # and so may have lost its lease: vouch for none until read back
        self._placed, self._last_echo_us = None, -1  # and its clock may have started again
        self._epoch = None  # and its pipeline instance may be another
        resync = False
        try:
            while True:
                self._changed.clear()
                try:
                    await self._reconcile_with_retries(sw, resync)
                except (P4ClientError, ReconcileError) as exc:
                    self.status.converged = False
                    self.status.last_error = str(exc)
                    LOG.warning("reconcile %s failed: %s", self.dpu.name, exc)
                    if isinstance(exc, P4ClientError) and exc.code not in TRANSIENT and await self._restore(exc):
                        continue  # reconcile the fresh pipeline at once
                else:
                    # On the periodic read-back only: a change to apply never waits for a hash.
                    if resync and self._pipeline_check_due() and await self._restore(None):
                        continue
                try:
                    # Jittered, so that DPUs that converged together do not all read back at once.
                    async with self.clock.timeout(self.resync_s * random.uniform(0.8, 1.2)):
                        await self._changed.wait()
                    resync = False
                except TimeoutError:
                    resync = True  # nothing changed for a while: diff from a fresh read-back
        finally:
            self.status.connected = False
            self.status.primary = False
            self.status.converged = False
            self.down_since = self.clock.monotonic()

    def _pipeline_check_due(self) -> bool:
        """Whether the periodic pipeline hash is due (reads can succeed on another program with the
        same tables: only the hash of what the DPU says it runs shows that)."""
        if self.pipeline_check_s <= 0 or self.clock.monotonic() < self._checked_at + self.pipeline_check_s:
            return False
        # Jittered, as the read-back is: DPUs that connected together do not all hash at once.
        self._checked_at = self.clock.monotonic() + self.pipeline_check_s * random.uniform(-0.2, 0.2)
        return True

    async def _restore(self, exc: P4ClientError | None) -> bool:
        """Put our pipeline back on a DPU that runs another one, or whose state its own P4Runtime
        server can no longer read.

        Firmware can change the pipeline behind the controller's back: load another program (the
        cookie the controller saw at connect time is then stale), or, on bmv2, add an entry or swap
        the program through its Thrift port, after which the P4Runtime server fails reads of what it
        thought it held. Only a new pipeline clears either. `exc` is the failed read, or None for the
        periodic check. At most one reload per resync period, so that a DPU that stays broken is
        not reloaded in a loop; an error from our own request (the pipeline is ours, the state
        readable) reloads nothing. Reloading fails closed: until the entries are back, nothing
        crosses the boundary.
        """
        if self.clock.monotonic() - self._restored_at < self.resync_s:
            return False
        try:
            if exc is not None and exc.code in UNREADABLE:
                why = f"state unreadable ({exc.code.name}: {exc.message})"
            elif (found := await self.pipeline_digest()) != self.expected_digest():
                # The hash it ran is in the record: GetStatus's pipeline_sha256 shows ours again once read back.
                why = f"another pipeline loaded (sha256 {found[:16]}...)" + (
                    f" ({exc.code.name}: {exc.message})" if exc else ""
                )
            else:
                return False
            self._restored_at = self.clock.monotonic()
            await self.reinstall_pipeline()
        except P4ClientError as err:
            LOG.warning("%s: pipeline check or reinstall failed: %s", self.dpu.name, err)
            return False
        self.status.drift_corrections += 1
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock.time()))
        self.status.last_drift = f"{when}: {why}, pipeline reinstalled"
        LOG.warning("%s: %s", self.dpu.name, self.status.last_drift)
        return True

    async def _reconcile_with_retries(self, sw: fy.Switch, resync: bool) -> None:
        try:
            # The usual case, without setting up the retry machinery: thousands of agents run this at once.
            async with self.slots.reconciles:
                await self.reconcile(sw, resync)
            return
        except (P4ClientError, ReconcileError) as exc:
            LOG.info("reconcile %s failed, retrying: %s", self.dpu.name, exc)
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type((P4ClientError, ReconcileError)),
            wait=wait_random_exponential(multiplier=0.05, max=2.0),
            stop=stop_after_attempt(3),
            reraise=True,
        ):
            with attempt:
                async with self.slots.reconciles:  # taken per attempt: the backoff waits without one
                    await self.reconcile(sw, resync=True)

    async def reconcile(self, sw: fy.Switch, resync: bool = False) -> None:
        """Write what the DPU's entries and meters lack of the intent, until a read-back shows it holds it.

        The diff starts from the last read-back (unless `resync`, or there is none): a change then
        costs one Write and one Read. Anything the read-back shows changed behind our back is drift,
        corrected in the same pass.

        A lease is placed on the DPU's clock first (one clock echo per new lease). When the clock
        cannot be read, the rest is written all the same, the DPU keeps the lease it holds (which
        ends by itself), and the pass fails.
        """
        ticket = self._poked
        if self._loss_unstored:  # tried at every pass, the hold's included: a successor needs it during the hold
            await self._record_loss()
        generation, source = self.intent_fn()
        self._on_window_change(source)
        intent, unplaced = source, None
        try:
            intent = await self._on_dpu_clock(sw, source)
        except ClockError as exc:
            unplaced = exc
        if self._codec is None or self._codec.schema is not sw.p4info:
            self._codec = dp.Codec(sw.p4info)
        codec = self._codec
        held = None if resync else self._held
        self._held = None  # until this pass confirms it
        if held is None:
            held = await self._read_back(sw, codec)
            confirmed = True
            intent = await self._unless_lost(codec, intent, held)
        else:
            confirmed = False
        # What the DPU should hold as read back: before this pass writes, what the last one confirmed (a lease
        # renewed or a cap changed since is ours to write, not drift); after, what this pass wrote.
        expected = self._applied_intent
        for _ in range(MAX_PASSES):
            p = codec.plan(intent, held)
            if not p.changes and confirmed:
                break
            if p.changes:
                # Drift: as read back, the DPU holds something other than what it should: someone else (or a
                # restart) changed it.
                drift = None if not confirmed or expected is None else codec.plan(expected, held)
                if drift is not None and drift.changes:
                    self.status.drift_corrections += 1
                    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock.time()))
                    self.status.last_drift = f"{when}: {drift.describe()}"
                    LOG.warning("%s: drift corrected: %s", self.dpu.name, drift.describe())
                    # Drift is a loss: since the last read-back the DPU ran on what someone else wrote (a meter
                    # raised, a window budget or a lease rewritten), and may have passed its whole budget and
                    # more. A red team rewriting a meter every 20 ms passed 5,219,378 B in 12 s against 1,517,902
                    # while each correction leased on. Also during a hold: a lease forged then holds it longer.
                    if (lost := await self._as_lost(intent)) is not intent:
                        intent = lost
                        p = codec.plan(intent, held)
                else:
                    LOG.debug("%s: %d updates", self.dpu.name, p.changes)
                # Written and not yet confirmed, the DPU holds no intent we know: a pass that fails from here
                # leaves the next one nothing to take its half-written state for drift against.
                self._applied_intent = None
                for batch in p.batches():
                    await sw.write(batch)
                expected = intent
            held = await self._read_back(sw, codec)
            confirmed = True
            # Every read-back, not only a pass's first: a pass started from the last one (a renewal, a
            # cap change) first sees a reset here, and must not take it for drift and lease on.
            intent = await self._unless_lost(codec, intent, held)
        else:
            raise DriftError(f"{self.dpu.name}: still differs after {MAX_PASSES} passes: {p.describe()}")
        self._held = held
        if unplaced is not None:
            raise unplaced
        self.status.converged = True
        self.status.last_error = ""
        self.status.generation_applied = generation
        self.applied = ticket
        self._applied_intent, self._applied_source = intent, source
        self._lease_out = intent.lease is not None
        if intent.lease is not None:
            self._leased_source = source
            self.status.lease_generation = intent.lease.gen
            self._leased_before = True
        if self.on_applied is not None:
            self.on_applied(ticket)
        self._converged.set()

    async def _unless_lost(self, codec: dp.Codec, intent: dp.Intent, held: dp.Held) -> dp.Intent:
        """`intent`, without its lease while the DPU's state was lost too recently (_holding), if a read-back
        (`held`) shows the lease out there gone or its meters unconfigured: the DPU restarted (its pipeline,
        even a lease entry, may have survived it: its meters and window slots did not), or someone reset it.
        As after a pipeline load."""
        if self._lease_out and intent.lease is not None and (not codec.leased(held) or codec.unmetered(held)):
            return await self._as_lost(intent)
        return intent

    async def _as_lost(self, intent: dp.Intent) -> dp.Intent:
        """`intent`, without its lease while a hold runs: the DPU's state counts as lost now, if it may ever have
        passed metered traffic (stored, so that its next holder holds too)."""
        self._state_lost()
        await self._record_loss()
        if intent.lease is not None and self._holding(intent):
            return dataclasses.replace(intent, lease=None)
        return intent

    def _on_window_change(self, source: dp.Intent) -> None:
        """Start a hold when a cell's window changes length or a cell enters window mode under a lease.

        Its slot counters are tagged by slot numbers that depend on the window (limiter.p4, Window mode),
        so the new window forgets what the old one counted: a red team spent a 20 s window's budget and,
        the window shortened, half of it again at once (14,967,000 B in 20 s against 10,000,000). As after
        a reset, nothing passes until neither window can hold bytes from both sides of the change."""
        # Against the last intent applied with a lease: a floor in between (a cap deleted and set again,
        # or a move between modes, which the service floors first) passes nothing, but forgets nothing
        # either (a red team lengthened a window through the floor: 4,461,844 B in 24 s against 3,000,000).
        before = self._leased_source
        if before is None or source.windows == before.windows:
            return

        def kept(old: dict[int, tuple[int, int]]) -> bool:  # every cell's window as in `old`: only budgets moved
            return all(old.get(cell, (0, 0))[1] == mult for cell, (_, mult) in source.windows.items())

        if kept(before.windows):
            return  # the slots still count
        seen, self._window_change_seen = self._window_change_seen, source.windows
        if seen is not None and kept(seen):
            # Already held for these windows (a retried pass, or a budget moved since): holding again from
            # now kept a pod whose budget an operator tuned during the hold at its floor for as long as they
            # did (a red team moved from rate mode and changed the budget every 2 s).
            return
        LOG.warning("%s: a window changed: no lease until neither window spans the change", self.dpu.name)
        hold = max(dp.hold_after_reset_s(before), dp.hold_after_reset_s(source))
        self._hold_until = max(self._hold_until, self.clock.monotonic() + hold)
        if self.on_hold is not None:
            self.on_hold(self._hold_until)  # stored: a control plane restarted meanwhile keeps holding

    def _holding(self, intent: dp.Intent) -> bool:
        """Whether the DPU's state was lost too recently for a lease: it may have spent its whole budget
        (or bucket) just before, and now holds a fresh one. No lease until that has aged out of every
        window, as if it had spent it at the moment of the loss."""
        wait = max(self._reset_at + dp.hold_after_reset_s(intent), self._hold_until) - self.clock.monotonic()
        if wait > 0:
            LOG.warning("%s: its state was lost; no lease for %.1f s more", self.dpu.name, wait)
            # Reconcile again as the hold ends: the lease comes then, not at the next renewal.
            self.clock.call_later(wait + 0.01, self.poke)
        return wait > 0

    async def _on_dpu_clock(self, sw: fy.Switch, intent: dp.Intent) -> dp.Intent:
        """`intent` with its lease's end placed on the DPU's clock as a deadline.

        A clock echo read at the DPU's time v, sent at t0 and back at t1 on ours, was seen at some
        t in [t0, t1]: the DPU's clock reads at least v + (T - t1) at our time T. So a deadline of
        v + (expires_at - t1) (shortened by MAX_CLOCK_DRIFT, for a DPU clock that runs slow) passes
        no later than expires_at on our clock, idle DPU or not: the bound a pod's other DPUs grow by.
        """
        lease = intent.lease
        if lease is None:
            return intent
        if self._epoch is None:
            # Whether the DPU's pipeline instance is still the one its last lease was granted in: an echo
            # before the hold is judged, so that a loss it shows starts the hold now, not one pass later.
            await self.read_clock(sw)
        if self._holding(intent):
            return dataclasses.replace(intent, lease=None)
        if self._placed is None or self._placed[0] != lease or self._placed[2] != self._epoch:
            now_us, t1 = await self.read_clock(sw)
            if self._holding(intent):  # the echo showed a pipeline instance that started afresh
                return dataclasses.replace(intent, lease=None)
            ahead = max(0.0, lease.expires_at - t1) * (1 - MAX_CLOCK_DRIFT)
            assert self._epoch is not None  # read_clock armed or found it
            self._placed = (lease, now_us + int(ahead * 1e6), self._epoch)
            self._leased_epoch = self._epoch
        placed = dataclasses.replace(lease, deadline_us=self._placed[1], epoch=self._placed[2])
        return dataclasses.replace(intent, lease=placed)

    async def _record_loss(self) -> None:
        """Store when the state of the instance this agent knows was lost (a read-back found it reset), so that
        the DPU's next holder keeps the hold too (the instance itself is the same: no echo stores it again)."""
        if self.on_epoch is None or self._seen_epoch is None or self._reset_at == -math.inf:
            return
        try:
            await self.on_epoch(self._seen_epoch, self._reset_at)
        except Exception as exc:  # the hold here stands; tried again at each pass until stored
            self._loss_unstored = True
            LOG.warning("%s: could not store when its state was lost: %s", self.dpu.name, exc)
        else:
            self._loss_unstored = False

    async def _recorded(self, found: int) -> bool:
        """Whether the store names `found` as the instance this fleet's last holder of the DPU found: then its
        state was lost when that holder said (the hold runs on from there), not when a stranger armed it."""
        if not found or self.recorded_epoch is None:
            return False
        try:
            recorded = await self.recorded_epoch()
        except Exception as exc:
            # Not a stranger's for want of an answer: judged so, its arm time would be stored over a later
            # loss its predecessor recorded, and the hold shortened. No lease until the store answers.
            raise ClockError(f"{self.dpu.name}: could not read its recorded pipeline instance: {exc}") from exc
        if recorded is None or recorded[0] != found:
            return False
        self._reset_at = max(self._reset_at, recorded[1])
        return True

    async def read_clock(self, sw: fy.Switch) -> tuple[int, float]:
        """(the DPU's time in us, our monotonic time after its echo came back), through one clock
        echo (limiter.p4: a PacketOut with a nonce comes back as a PacketIn with the DPU's time).

        The echo also arms the DPU's lease epoch with a fresh random value where it found none, and
        says what it found and when, on the DPU's clock, it was armed: when the pipeline instance began
        (a restart or a reload), whatever entries it came back with. That time, not whether this echo
        armed it, starts the hold: the reply to the arming echo may have been lost, or another control
        plane armed it. A fresh value is always safe to arm: only a lease this agent writes after it can
        carry it."""
        nonce = secrets.randbits(64)
        candidate = secrets.randbits(64) or 1
        packets = cast(AsyncGenerator[fy.P4PacketIn, None], sw.read_packets())  # an async generator: closable
        waiting = asyncio.ensure_future(anext(packets))
        try:
            await asyncio.sleep(0)  # the reader's queue is open before the echo can come back
            await sw.write([fy.P4PacketOut(b"", **{dp.ECHO_NONCE: nonce, dp.ECHO_ARM: candidate})])
            async with asyncio.timeout(ECHO_TIMEOUT_S):
                while (pkt := await waiting)[dp.ECHO_NONCE] != nonce:
                    waiting = asyncio.ensure_future(anext(packets))
        except TimeoutError:
            raise ClockError(
                f"{self.dpu.name}: no clock echo within {ECHO_TIMEOUT_S:g} s (is its target started with "
                f"its CPU port at {CPU_PORT}, e.g. simple_switch_grpc --cpu-port {CPU_PORT}?): "
                "it keeps the lease it holds until that ends"
            ) from None
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await packets.aclose()
        t1 = self.clock.monotonic()
        now_us, found, armed_at = int(pkt[dp.ECHO_NOW]), int(pkt[dp.ECHO_EPOCH]), int(pkt[dp.ECHO_ARMED_AT])
        epoch = found or candidate
        new = found not in (self._leased_epoch, self._seen_epoch)
        recorded = new and await self._recorded(found)
        if new and not recorded:
            # Not the instance this agent last leased (or, new to this DPU, any instance a predecessor may
            # have leased), new to this agent, and not the one this fleet's last holder stored: it began
            # (now_us - armed_at) us ago on the DPU's clock, the one windows run on. Once per instance: later
            # echoes of it leave the hold where it is.
            if found:
                # Armed by an echo this agent did not see answered: another control plane's, which may
                # have leased it whatever this one's state says (a red team: a second control plane with
                # a state file of its own passed a second budget), or this agent's own, reply lost.
                self._leased_before = True
            self._state_lost(t1 - max(0, now_us - armed_at) * 1e-6)
        if epoch != self._seen_epoch and not recorded and self.on_epoch is not None:
            try:
                await self.on_epoch(epoch, self._reset_at)
            except Exception as exc:  # no lease under an instance its successor could not know
                raise ClockError(f"{self.dpu.name}: could not store its pipeline instance: {exc}") from exc
        self._epoch = self._seen_epoch = epoch
        if now_us < self._last_echo_us:
            self._placed = None
            raise ClockError(f"{self.dpu.name}: its clock went back from {self._last_echo_us} to {now_us} us")
        self._last_echo_us = now_us
        return now_us, t1

    async def _read_back(self, sw: fy.Switch, codec: dp.Codec) -> dp.Held:
        # The raw read skips decoding to finsy entities only to encode them again.
        request = p4r.ReadRequest(device_id=sw.device_id, entities=codec.reads)
        return codec.held([e async for e in finsy_adapter.read_raw(sw, request)])

    async def pipeline_digest(self) -> str:
        """SHA-256 of the pipeline the DPU says it runs (P4Info and device config), as read back."""
        config = await finsy_adapter.pipeline_config(self.switch)
        self.status.pipeline_sha256 = digest(config.p4info, config.p4_device_config)
        return self.status.pipeline_sha256

    def expected_digest(self) -> str:
        """SHA-256 of the pipeline this agent installs."""
        return program_digest(self._program)

    async def reinstall_pipeline(self) -> None:
        """Load our pipeline again, whatever cookie the DPU shows, then put everything back."""
        config = self.switch.p4info.get_pipeline_config()
        async with self.slots.installs:
            await finsy_adapter.push_pipeline(self.switch, config)
        self._applied_intent = None  # what we wrote is gone with the old pipeline: not drift, a restore
        self._held = None
        self._placed, self._last_echo_us = None, -1  # firmware that swaps pipelines may restart the clock
        self._epoch = None

    async def read_usage(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Counter cells by direction: {direction: {name: (packets, bytes)}}."""
        sw = self.switch
        cells: dict[tuple[str, int], tuple[int, int]] = {}
        async for c in sw.read(dp.usage_reads()):  # type: ignore[attr-defined]
            name = sw.p4info.counters[c.counter_id].name  # finsy decodes to the alias
            cells[(name, c.index or 0)] = (c.packet_count, c.byte_count)
        out: dict[str, dict[str, tuple[int, int]]] = {}
        for direction, cell in dp.CELLS.items():
            d: dict[str, tuple[int, int]] = {}
            for name, k in dp.CLASSES.items():
                d[name] = cells.get((dp.CLASS_COUNTER, cell * 8 + k), (0, 0))
            for name, k in dp.COLORS.items():
                d[name] = cells.get((dp.COLOR_COUNTER, cell * 8 + k), (0, 0))
            out[direction] = d
        return out


@functools.cache
def program_digest(program: dp.ProgramFiles) -> str:
    """SHA-256 of the pipeline config that agents install for `program` (as `digest` hashes one read back)."""
    config = finsy_adapter.schema(program).get_pipeline_config()
    return digest(config.p4info, config.p4_device_config)


def digest(p4info: p4i.P4Info, device_config: bytes) -> str:
    """SHA-256 over a pipeline's P4Info (deterministic encoding) and its device config."""
    h = hashlib.sha256(p4info.SerializeToString(deterministic=True))
    h.update(device_config)
    return h.hexdigest()


# What a DPU's P4Runtime server answers when its own record of the pipeline's state no longer
# matches the pipeline (PI: "Table state out-of-sync with target"; reads of a swapped pipeline).
UNREADABLE = frozenset({GRPCStatusCode.INTERNAL, GRPCStatusCode.UNKNOWN})
# Failures of the connection, not answers of the DPU: no reason to look at its pipeline.
TRANSIENT = frozenset({GRPCStatusCode.UNAVAILABLE, GRPCStatusCode.DEADLINE_EXCEEDED, GRPCStatusCode.CANCELLED})


class ReconcileError(Exception):
    """A reconcile that could not bring its DPU to the intent (besides P4Runtime errors)."""


class DriftError(ReconcileError):
    """Read-back state differs from what was just written."""


class ClockError(ReconcileError):
    """The DPU's clock could not be read, so no new lease can be placed on it."""
