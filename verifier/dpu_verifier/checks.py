"""The verifier's checks, run at every tick of an interval, on what it can see without trusting the DPUs:

- **read-back**: each DPU's pipeline hash and its entries and meters against the desired state (through
  the control plane: its reconciler reads every DPU back; a difference it did not cause is an alert);
- **router-count**: the router counts bytes per pod and direction itself (the DPUs cannot change those
  counters): every frame on the pod's link to it, whatever it holds; the most bytes that left a pod in
  any window of W against its egress allowance;
- **conservation**: bytes the router saw leave a pod against the bytes its DPUs say they passed out of
  it, and bytes the router sent into a pod against the bytes its DPUs say reached their meters on the
  way in (passed or dropped by meter, window budget or lease). A DPU that exempts, hides or forges
  traffic breaks the balance;
- **probe**: a probe agent in each capped pod sends more than the pod's cap for a while in each
  interval; its receiver checks that no more got through than the cap allows in that time. It needs
  no counter the operator's devices keep, and it tests the cap when the pod's own traffic stays below it.
  Where probes are authenticated (probes.py), it also raises `probe-loss` for a burst that got far less
  than the cap left free of the pod's other traffic (the router's count says how much that took), and
  `probe-forged` for datagrams refused on a probe's port (bad tag, another pod's, replayed, truncated).

Each check raises one alert per place, the first time it fails, and every tick's figures can be signed
as evidence (evidence.py), one record per capped pod and direction. The router's counts come as bins of
bytes on a time grid: from SNMP counters polled by the verifier at a site, from the lab's own router
namespace or simulator in a lab run (bmv2-lab/dpu_lab/audit.py, live_audit.py feed these checks). Where
a counter is read in real time, its readings (`Readings`: each with when it was asked for and answered)
judge the router-count check instead of bins: a late reading lumps the bytes of its whole delay into
one bin, so bins alone cannot say how long a stretch of traffic a window of them holds.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

import numpy as np

from dpu_limiter.units import MAX_FRAME_BYTES, allowed_window_bytes

from .balance import RunningBalance
from .evidence import (
    DIRECTIONS,
    Balance,
    CapTerms,
    EvidenceWriter,
    ProbeResult,
    WindowFigures,
    generate_key,
    load_public_key,
    load_signer,
    verify_bundle,
)
from .probes import FORGERY, BurstClose
from .readings import Readings

AuditCheck = Literal["read-back", "router-count", "conservation", "probe"]
# What an alert names: a check, or what the probe check found besides too much (enabled with "probe").
AlertCheck = Literal[AuditCheck, "probe-loss", "probe-forged"]
# Under-delivery: a burst fails when fewer bytes than half what the cap left free arrived, less this much
# (the frames a window's edge can cut off either end).
LOSS_SLACK_BYTES = 4 * MAX_FRAME_BYTES


@dataclass(frozen=True)
class CapScope:
    """A capped pod as the checks judge it: its rates (the largest it takes during a run), window, bucket."""

    pod: str
    egress_bps: float
    ingress_bps: float
    window_s: float
    bucket_bytes: int  # the bucket allowed on top of the rate (0 in window mode)
    mode: str = "rate"

    def directions(self) -> list[tuple[str, float]]:
        """(direction, rate) pairs, egress first."""
        return [("egress", self.egress_bps), ("ingress", self.ingress_bps)]

    def terms(self, rate: float) -> CapTerms:
        """The cap in one direction, as evidence records it."""
        return CapTerms(rate, self.window_s, self.bucket_bytes, self.mode)

    def egress_over(self, seconds: float) -> int:
        """Most bytes the pod may pass out in `seconds` (at most its window): rate x time + bucket + one frame;
        window mode: the window's whole budget."""
        if self.mode == "window":
            return allowed_window_bytes(self.egress_bps, self.window_s, 0)
        return allowed_window_bytes(self.egress_bps, seconds, self.bucket_bytes)


class Series(Protocol):
    """Bytes the router counted in bins of `bin_s` seconds; t0 is the first bin's start."""

    bin_s: float
    bins: list[int]

    def t0(self, default: float) -> float:
        """The first bin's start (`default` when there is none)."""


def max_window_bytes(bin_s: float, bins: Sequence[int], window_s: float) -> int:
    """The most bytes in any window of `window_s` whose start is on the bin grid: the window covers
    round(window_s / bin_s) bins; a series shorter than that yields its total."""
    if not bin_s > 0:
        raise ValueError(f"bin_s must be > 0, got {bin_s!r}")
    if not window_s >= bin_s:
        raise ValueError(f"window_s must be >= bin_s ({bin_s!r}), got {window_s!r}")
    width = round(window_s / bin_s)
    # int64 sums stay exact far beyond the 7.5 GB of a 1 Gbit/s x 60 s window.
    values = np.asarray(bins, dtype=np.int64)
    if values.size <= width:
        return int(values.sum())
    cumulative = np.concatenate(([0], np.cumsum(values)))
    return int((cumulative[width:] - cumulative[:-width]).max())


CHECKS: tuple[AuditCheck, ...] = get_args(AuditCheck)


@dataclass(frozen=True)
class Alert:
    """Something the audit found: when (simulated seconds), by which check, where, and what."""

    t_s: float
    check: AlertCheck
    where: str
    detail: str


@dataclass
class Probe:
    """One pod's probe: what its receiver counted of each burst so far, and what the cap allows a burst.

    Bytes are counted against the burst they were sent in, whenever they arrive: a straggler of one burst
    (held up in a slow target, or by a loaded machine) counted with the next had made a clean run alarm.
    """

    pod: str
    offered_bytes: int  # per burst
    allowance_bytes: int  # per burst (with slack for the last frame or segment in flight)
    bursts: dict[int, int] = field(default_factory=dict)  # burst number -> bytes counted (fed by who receives)
    judged: dict[int, int] = field(default_factory=dict)  # burst number -> bytes it had when last judged
    # Per burst, where it reached the receiver over longer than it was sent in (a loaded target passes
    # a burst over more time, and the cap allows its rate over all of it): the allowance for that span.
    allowances: dict[int, int] = field(default_factory=dict)
    # Under-delivery (authenticated probes only): the least rate the pod's cap takes (0: not judged), and
    # each burst whose stragglers are all in, with what its agent sent (probes.close_bursts).
    floor_bps: float = 0.0
    closed: dict[int, BurstClose] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)  # datagrams refused on its port, by reason
    loss_judged: set[int] = field(default_factory=set)
    rejected_judged: int = 0  # how many refusals the audit has already reported


@dataclass(frozen=True)
class Facts:
    """What the control plane's API says of the fleet at a tick, for the evidence: the pipeline it
    installs, each pod's DPUs' pipelines as last read back, and its change log's head."""

    expected_pipeline: str
    pipelines: dict[str, dict[str, str]]  # pod -> DPU -> SHA-256 ("" not read yet)
    change_log: tuple[int, str]
    # pod -> its DPUs' buffer_bytes: what they may hold between meter and wire, counted by the DPU and not
    # yet by the router (conservation's allowance for bytes in flight, beside the frames on the link)
    buffers: dict[str, int] = field(default_factory=dict)


class DeviceView(Protocol):
    """How the audit reaches the DPUs: through the control plane's agents, or its API."""

    async def facts(self) -> Facts:
        """The control plane's pipeline, the DPUs' as read back, and its change log's head."""

    async def read_back(self) -> list[tuple[str, str]]:
        """Read every DPU back against desired state; (DPU, what differed) for each new finding, corrected."""

    async def counters(self) -> dict[str, tuple[str, tuple[int, int] | None]]:
        """Per DPU (or per pod, as the API sums them): its pod and (bytes passed out, bytes metered in),
        None where they cannot be read now."""


@dataclass
class Auditor:
    """Runs the checks at each tick; keeps the alerts."""

    caps: Sequence[CapScope]  # the capped pods and the caps they are judged against
    router: Mapping[tuple[str, str], Series]  # (pod, direction) -> bytes the router counted
    view: DeviceView
    slack_bytes: int = 4 * MAX_FRAME_BYTES  # frames that may be between a DPU and the router at a tick
    slack_ratio: float = 0.001  # and this share of what the router counted (counters read apart in time)
    count_slack_s: float = 0.0  # how much longer a window of the router's own bins may be (sampled bins)
    # (pod, direction) -> the router's counter as read in real time, where it is: these judge the router's
    # count (router-count, its evidence, the loss check's other traffic) in place of its bins.
    readings: Mapping[tuple[str, str], Readings] = field(default_factory=dict)
    _judged: dict[tuple[str, str], int] = field(default_factory=dict)  # readings router-count has judged
    _signed: dict[tuple[str, str], int] = field(default_factory=dict)  # readings evidence has judged
    checks: Sequence[AuditCheck] = CHECKS
    probes: list[Probe] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    _flagged: set[tuple[AlertCheck, str]] = field(default_factory=set)
    _last: dict[str, tuple[int, int]] = field(default_factory=dict)  # each DPU's (or pod's) last (out, in) bytes
    # The last tick's router totals before and after reading the DPUs, and what the DPUs said.
    _balance: dict[tuple[str, str], tuple[int, int, int] | None] = field(default_factory=dict)  # None: no base
    # Reads the router's counters again now (real time; a coroutine function where that is I/O).
    resample: Callable[[], Awaitable[None] | None] | None = None
    # Conservation alerts after this many intervals in a row out of balance the same way: in real time
    # a software DPU's queues can hold what the router already sent (or its meter passed) for a moment,
    # a shortfall in one interval that comes back as an excess in the next; a lie errs one way throughout.
    persist: int = 1
    _streak: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (which way off, intervals)
    # Where each tick's figures are signed, one record per capped pod and direction (dpu_verifier.evidence).
    evidence: EvidenceWriter | None = None
    _since: float = 0.0  # the last tick's time: where the next records' windows start
    # This tick's balance per (pod, direction): the router's count (most), its spread (most - least),
    # what the DPUs said (None: unread), and the slack conservation allows.
    _drawn: dict[tuple[str, str], tuple[int, int, int | None, int]] = field(default_factory=dict)
    _probed: dict[str, list[ProbeResult]] = field(default_factory=dict)  # pod -> this tick's probe bursts
    # pod -> its egress running balance (balance.py), what this tick drew of it, its DPUs at the last tick
    balances: dict[str, RunningBalance] = field(default_factory=dict)
    _balances_drawn: dict[str, Balance] = field(default_factory=dict)
    _members: dict[str, set[str]] = field(default_factory=dict)
    _offset: dict[str, int] = field(default_factory=dict)  # DPU -> its counts before restarts, less its first
    _tick_facts: Facts | None = None
    _rate_since: dict[str, tuple[CapTerms | None, int]] = field(default_factory=dict)  # pod -> cap, first reading
    signed: list[tuple[float, str, str]] = field(default_factory=list)  # (window's end, "POD DIRECTION", verdict)
    _public_key: Path | None = None  # the evidence's verification key

    def _alert(self, t_s: float, check: AlertCheck, where: str, detail: str) -> None:
        if (check, where) not in self._flagged:
            self._flagged.add((check, where))
            self.alerts.append(Alert(round(t_s, 6), check, where, detail))

    async def _facts(self) -> Facts:
        """The control plane's facts, read once per tick."""
        if self._tick_facts is None:
            self._tick_facts = await self.view.facts()
        return self._tick_facts

    async def tick(self, t_s: float) -> None:
        """Run every enabled check at simulated time `t_s`."""
        self._tick_facts = None
        if "read-back" in self.checks:
            await self._read_back(t_s)
        if "router-count" in self.checks:
            self._router_count(t_s)
        if "conservation" in self.checks:
            await self._conservation(t_s)
        if "probe" in self.checks:
            self._probe(t_s)
        if self.evidence is not None:
            await self._sign(t_s)
        self._since = t_s

    def _probe(self, t_s: float) -> None:
        # Every burst with bytes counted since it was last judged is judged again, whole; the window's
        # figure is a burst over its allowance if any, else the latest. Then each burst newly closed is
        # judged for loss, and refusals on the probe's port are reported.
        self._probed = {}
        for p in self.probes:
            where, results = f"{p.pod} egress", self._probed.setdefault(p.pod, [])
            changed = sorted(k for k, n in p.bursts.items() if p.judged.get(k) != n)
            if changed:
                p.judged.update((k, p.bursts[k]) for k in changed)
                over = [k for k in changed if p.bursts[k] > p.allowances.get(k, p.allowance_bytes)]
                shown = over[-1] if over else changed[-1]
                got, allowed = p.bursts[shown], p.allowances.get(shown, p.allowance_bytes)
                results.append(ProbeResult(p.offered_bytes, got, allowed, burst=shown))
                if over:
                    detail = f"a probe offered {p.offered_bytes} bytes, {got} got through, the cap allows {allowed}"
                    self._alert(t_s, "probe", where, detail)
            for k in sorted(set(p.closed) - p.loss_judged):
                p.loss_judged.add(k)
                if (judged := self._loss(p, k)) is not None:
                    results.append(judged[0])
                    if judged[1]:
                        self._alert(t_s, "probe-loss", where, judged[1])
            refused = sum(n for why, n in p.rejected.items() if why in FORGERY) - p.rejected_judged
            if refused or p.floor_bps > 0:  # authenticated probes say how many were refused, 0 included
                p.rejected_judged += refused
                if not results and refused:
                    k = max(p.judged, default=0)
                    results.append(ProbeResult(p.offered_bytes, p.bursts.get(k, 0), p.allowance_bytes, burst=k))
                if results:
                    results[0] = dataclasses.replace(results[0], rejected=refused)
            if refused:
                reasons = ", ".join(f"{n} {why}" for why, n in sorted(p.rejected.items()) if why in FORGERY)
                detail = f"{refused} datagrams refused on its probe's port (so far: {reasons})"
                self._alert(t_s, "probe-forged", where, detail)

    def _loss(self, p: Probe, k: int) -> tuple[ProbeResult, str] | None:
        """Burst `k` judged for loss: its figures, and what went wrong ("" if nothing); None if not judged
        (no floor, no router count, or a cap left too little free to tell)."""
        tl = self.router.get((p.pod, "egress"))
        c = p.closed[k]
        if not p.floor_bps > 0 or tl is None:
            return None
        got = p.bursts.get(k, 0)
        # What else left the pod while the burst crossed: the router's count over its span, less the probe's.
        # The span reaches as far past the burst as the router's counts may lag (count_slack_s: an SNMP agent
        # refreshes its counters every few seconds); a wider span only overstates it, so only excuses more.
        if (readings := self.readings.get((p.pod, "egress"))) is not None:
            counted = readings.covering(c.span[0], c.span[1] + self.count_slack_s)
        else:
            first = tl.t0(c.span[0])
            lo = max(0, math.floor((c.span[0] - first) / tl.bin_s))
            hi = max(0, math.floor((c.span[1] + self.count_slack_s - first) / tl.bin_s) + 1)
            counted = sum(tl.bins[lo:hi])
        other = max(0, counted - got)
        # The cap passes at least its rate over the time the burst was sent in (its bucket may be empty).
        free = int(p.floor_bps * c.send_s / 8) - other
        least = min(c.sent_bytes, free) // 2 - LOSS_SLACK_BYTES
        if least <= 0:
            return None
        allowed = p.allowances.get(k, p.allowance_bytes)
        result = ProbeResult(c.sent_bytes, got, allowed, least_bytes=least, burst=k)
        if got >= least:
            return result, ""
        return result, (
            f"probe burst {k}: {got} authenticated bytes arrived of {c.sent_bytes} sent in {c.send_s:.3f} s; "
            f"the router counted {counted} bytes meanwhile ({other} other traffic), so the cap left {free} "
            f"free: at least {least} should have arrived"
        )

    async def _read_back(self, t_s: float) -> None:
        for name, detail in await self.view.read_back():
            self._alert(t_s, "read-back", name, detail)

    def _router_count(self, t_s: float) -> None:
        # Egress only: what the router sees heading into a pod has not crossed that pod's DPU yet, and
        # honest senders in several pods may together offer it more than its ingress cap.
        for cap in self.caps:
            for direction, rate in cap.directions()[:1]:
                key = (cap.pod, direction)
                tl, readings = self.router.get(key), self.readings.get(key)
                allowed = cap.terms(rate).allowance_bytes() + int(rate * self.count_slack_s / 8)
                if readings is not None:
                    # Only pairs ending in a reading taken since the last tick: the earlier ones were judged then.
                    first, upto = self._judged.get(key, 0), len(readings.totals)
                    most, span = readings.most_within(cap.window_s, first, upto)
                    self._judged[key] = upto
                    within = f"{span:.3f} s (at most {cap.window_s:g} s between its readings)"
                elif tl is not None and tl.bins:
                    most, within = max_window_bytes(tl.bin_s, tl.bins, cap.window_s), f"{cap.window_s:g} s"
                else:
                    continue
                if most > allowed:
                    detail = f"the router counted {most} bytes in {within}, allowed {allowed}"
                    self._alert(t_s, "router-count", f"{cap.pod} {direction}", detail)
                elif readings is not None and (over := self._over_rate(cap, first, upto)) is not None:
                    excess, span = over
                    if excess > cap.bucket_bytes + MAX_FRAME_BYTES:
                        detail = (
                            f"the router counted {excess} bytes more in {span:.3f} s than the cap's rate allows "
                            f"over that and the counters' lag, allowed {cap.bucket_bytes + MAX_FRAME_BYTES}"
                        )
                        self._alert(t_s, "router-count", f"{cap.pod} {direction}", detail)

    def _over_rate(self, cap: CapScope, first: int, upto: int) -> tuple[int, float] | None:
        """The most the router counted leaving `cap`'s pod beyond its egress rate over any span of readings
        (Readings.most_over), for pairs ending in [first, upto); None where not judged (window mode: its
        budgets are per window of the DPU's clock; no readings). Spans start after the cap last changed."""
        readings = self.readings.get((cap.pod, "egress"))
        if cap.mode != "rate" or readings is None or not readings.totals:
            return None
        terms = cap.terms(cap.egress_bps)
        held, since = self._rate_since.get(cap.pod, (None, 0))
        if held != terms:
            self._rate_since[cap.pod] = (terms, len(readings.totals) - 1)
            since = len(readings.totals) - 1
        return readings.most_over(cap.egress_bps / 8, self.count_slack_s, since, first, upto)

    def _lag_slack(self, cap: CapScope, t_s: float) -> int:
        """What the router's counters' lag (count_slack_s) may keep out of, or add to, one interval's count
        of a pod (both directions, either end): its rates over the lag, each its cap's or what the router
        counted over the last interval and lag where more (what heads into a pod is whatever its senders
        offer, its DPUs drop the excess: a red team's 10x the cap alarmed when this was the caps' alone)."""
        if not self.count_slack_s > 0:
            return 0
        span = max(t_s - self._since, 0.0) + self.count_slack_s
        rates = 0.0
        for direction, capped in cap.directions():
            seen, r = 0.0, self.readings.get((cap.pod, direction))
            if r is not None and r.totals:
                i = min(bisect.bisect_left(r.answered, t_s - span), len(r.totals) - 1)
                seen = (r.totals[-1] - r.totals[i]) * 8 / span
            rates += max(capped, seen)
        return int(rates * self.count_slack_s / 8)

    def _router_totals(self) -> dict[tuple[str, str], int]:
        return {key: sum(tl.bins) for key, tl in self.router.items()}

    async def _conservation(self, t_s: float) -> None:
        # Balances are drawn over each interval (since the last tick), so a DPU that restarts and
        # starts counting from zero again only costs that pod one interval's check. The DPUs' counters
        # are read at some moment between two readings of the router's (`resample`, in real time), so
        # what they say must lie between what the router counted over the shortest and the longest
        # interval those allow. Egress also runs a balance since a reference (_draw_balances).
        before = self._router_totals()
        read_before = {key: len(r.totals) for key, r in self.readings.items()}
        reported: dict[tuple[str, str], int] = {}
        unsure: set[str] = set()
        unread: set[str] = set()
        restarts: dict[str, int] = {}
        passed: dict[str, int] = {}  # pod -> what its DPUs passed out since each was first read (restarts added up)
        members: dict[str, set[str]] = {}
        for name, (pod, read) in (await self.view.counters()).items():
            members.setdefault(pod, set()).add(name)
            if read is None:
                unread.add(pod)
                continue
            out, into = read
            first = name not in self._last
            last_out, last_in = self._last.get(name, (0, 0))
            if out < last_out or into < last_in:
                unsure.add(pod)  # its counters went back: it restarted
            self._last[name] = (out, into)
            reported[(pod, "egress")] = reported.get((pod, "egress"), 0) + out
            reported[(pod, "ingress")] = reported.get((pod, "ingress"), 0) + into
            offset = -out if first else self._offset[name]  # what it passed counted from when it was first read
            if out < last_out:
                offset, restarts[pod] = offset + last_out, restarts.get(pod, 0) + 1
            self._offset[name] = offset
            passed[pod] = passed.get(pod, 0) + offset + out
        # A DPU that joined or left its pod adds or takes its whole count at once: no balance across that.
        moved = {pod for pod, names in members.items() if self._members.get(pod, names) != names}
        moved |= set(self._members) - set(members)
        self._members = members
        unsure |= moved | unread
        if self.resample is not None:
            again = self.resample()
            if again is not None:
                await again
        after = self._router_totals()
        for pod in moved:
            if pod in self.balances:
                self.balances[pod].drop()
        ready = {c.pod for c in self.caps} - moved - unread  # an unread DPU: its balance waits for its next read
        await self._draw_balances(t_s, ready, passed, restarts, before, after, read_before)
        for cap in self.caps:
            for direction, _ in cap.directions():
                key = (cap.pod, direction)
                now = (before.get(key, 0), after.get(key, 0), reported.get(key, 0))
                based, last = key in self._balance, self._balance.get(key)
                # An unread DPU's count is missing from its pod's sum: that sum is no base for the next interval.
                self._balance[key] = None if cap.pod in unread else now
                if based and last is None:
                    unsure.add(cap.pod)
                last = last or (0, 0, 0)
                least, most, said = now[0] - last[1], now[1] - last[0], now[2] - last[2]
                slack = self.slack_bytes + int(most * self.slack_ratio) + self._lag_slack(cap, t_s)
                self._drawn[key] = (most, most - least, None if cap.pod in unsure else said, slack)
                if cap.pod in unsure:
                    continue
                off = -1 if said < least - slack else 1 if said > most + slack else 0
                way, n = self._streak.get(key, (0, 0))
                self._streak[key] = (off, n + 1 if off == way else 1) if off else (0, 0)
                if self._streak[key][1] >= self.persist:
                    counted = f"{least}" if least == most else f"between {least} and {most}"
                    verb = "passed out of" if direction == "egress" else "metered into"
                    self._alert(
                        t_s,
                        "conservation",
                        f"{cap.pod} {direction}",
                        f"since the last check the router counted {counted} bytes, the pod's DPUs say they "
                        f"{verb} it {said}",
                    )

    async def _draw_balances(
        self,
        t_s: float,
        ready: set[str],
        passed: dict[str, int],
        restarts: dict[str, int],
        before: dict[tuple[str, str], int],
        after: dict[tuple[str, str], int],
        read_before: dict[tuple[str, str], int],
    ) -> None:
        """Draw every capped pod's egress running balance whose DPUs were all read (balance.py); alert where
        one is out. A DPU that restarted carries on from what it had said, with what it may have passed
        unsaid before it went down allowed once: at most the pod's cap over the interval."""
        self._balances_drawn = {}
        for cap in self.caps:
            key = (cap.pod, "egress")
            if cap.pod not in ready:
                continue
            bal = self.balances.setdefault(cap.pod, RunningBalance())
            if bal.since is None:  # how the router is read, as of the reference
                bal.readings, bal.lag_s = self.readings.get(key), self.count_slack_s
            elif restarts.get(cap.pod):
                bal.restart_slack += restarts[cap.pod] * cap.egress_over(max(0.0, t_s - self._since))
            queued = 4 * MAX_FRAME_BYTES + (await self._facts()).buffers.get(cap.pod, 0)  # counted, not sent yet
            said = passed.get(cap.pod, 0)
            drawn = bal.draw(t_s, said, before.get(key, 0), after.get(key, 0), read_before.get(key, 0), queued)
            if drawn is None:
                continue
            self._balances_drawn[cap.pod] = drawn
            if drawn.short():
                self._alert(
                    t_s,
                    "conservation",
                    f"{cap.pod} egress",
                    f"since {drawn.since:.1f} s the router counted at least {drawn.router_bytes} bytes leaving "
                    f"the pod, its DPUs say they passed {drawn.dpu_bytes} (+{drawn.slack_bytes})",
                )
            elif drawn.over() and drawn.upto is not None:
                self._alert(
                    t_s,
                    "conservation",
                    f"{cap.pod} egress",
                    f"from {drawn.since:.1f} s to {drawn.upto:.1f} s the router counted at most "
                    f"{drawn.router_most_bytes} bytes leaving the pod, its DPUs say they passed "
                    f"{drawn.dpu_upto_bytes} (-{drawn.over_slack_bytes})",
                )

    async def _sign(self, t_s: float) -> None:
        """Sign this tick's figures: one record per capped pod and direction, for (last tick, t_s]."""
        assert self.evidence is not None
        facts = await self._facts()
        for cap in self.caps:
            for direction, rate in cap.directions():
                key = (cap.pod, direction)
                tl = self.router.get(key)
                counted, worst = 0, 0
                if tl is not None and tl.bins:
                    first = tl.t0(0.0)
                    lo = max(0, math.floor((self._since - cap.window_s - first) / tl.bin_s + 1e-9))
                    mid = max(0, math.floor((self._since - first) / tl.bin_s + 1e-9))
                    hi = max(0, math.floor((t_s - first) / tl.bin_s + 1e-9))
                    counted = sum(tl.bins[mid:hi])
                    # The bin under way counts in the worst window too: the router-count check has seen it
                    # (a real-time sample lands in the bin of its own time), and a run may end before the
                    # next window would sign it (CI: an alert on 20 MB with no window signed violated).
                    if direction == "egress" and hi + 1 > lo:
                        worst = max_window_bytes(tl.bin_s, tl.bins[lo : hi + 1], cap.window_s)
                if direction == "egress" and (readings := self.readings.get(key)) is not None:
                    # The pairs router-count judged since the last window (the readings a tick takes after
                    # that check, for conservation, are its next window's): an alert's window says violated.
                    upto = self._judged.get(key, len(readings.totals))
                    worst = readings.most_within(cap.window_s, self._signed.get(key, 0), upto)[0]
                    over = self._over_rate(cap, self._signed.get(key, 0), upto)
                    excess = None if over is None else over[0]
                    self._signed[key] = upto
                else:
                    excess = None
                router, spread, said, slack = self._drawn.pop(key, (counted, 0, None, 0))
                probed = self._probed.pop(cap.pod, []) if direction == "egress" else []
                drawn = self._balances_drawn.pop(cap.pod, None) if direction == "egress" else None
                verdict = self.evidence.window(
                    WindowFigures(
                        pod=cap.pod,
                        direction=direction,
                        start=self._since,
                        end=t_s,
                        cap=cap.terms(rate),
                        change_log_seq=facts.change_log[0],
                        change_log_hash=facts.change_log[1],
                        router_bytes=router,
                        # What the router sees heading into a pod has not crossed its DPUs yet (_router_count).
                        router_worst_bytes=worst if direction == "egress" else None,
                        router_slack_bytes=int(rate * self.count_slack_s / 8),
                        router_excess_bytes=excess,
                        dpu_bytes=said,
                        conservation_slack_bytes=slack + spread + facts.buffers.get(cap.pod, 0),
                        pipeline_expected=facts.expected_pipeline,
                        pipelines=facts.pipelines.get(cap.pod, {}),
                        probes=tuple(probed),
                        balance=drawn,
                    )
                )
                self.signed.append((t_s, f"{cap.pod} {direction}", verdict))

    def open_evidence(self, directory: Path, key: Path | None = None, interval_s: float | None = None) -> None:
        """Sign every tick's figures into a new bundle in `directory` with `key` (its public half beside it,
        as KEY.pub), or with a key made for the run (a lab run's: `verifier.key` in the bundle). With the
        ticks' `interval_s`, the bundle declares within how many windows each egress balance is drawn once
        the DPUs are read (its reference, then a reading the counters' lag later), and is held to it."""
        directory.mkdir(parents=True, exist_ok=True)
        if key is None:
            key = directory / "verifier.key"
            generate_key(key)
        self._public_key = key.with_name(key.name + ".pub")
        scope = [(c.pod, d) for c in self.caps for d in DIRECTIONS]
        within = None
        if interval_s and "conservation" in self.checks:
            within = math.ceil(self.count_slack_s / interval_s) + 3
        self.evidence = EvidenceWriter(directory, load_signer(key), scope, self._since, within)

    def close_evidence(self) -> dict[str, Any]:
        """Close the bundle and check it as a third party would (report.json's `audit.evidence`): whether it
        verifies, its windows by verdict, and when each place's first violated window ended."""
        assert self.evidence is not None
        self.evidence.close(self._since)
        directory = self.evidence.path.parent
        pub = self._public_key
        assert pub is not None
        result = verify_bundle(directory, load_public_key(pub))
        self.evidence = None
        first: dict[str, float] = {}
        for t, where, verdict in self.signed:
            if verdict == "violated":
                first.setdefault(where, t)
        return {
            "bundle": str(directory),
            "public_key": str(pub),
            "verified": result.ok,
            "problem": result.problem,
            "windows": result.windows,
            "verdicts": result.verdicts,
            "first_violated_s": first,
        }

    def summary(
        self, interval_s: float, compromises: list[dict[str, Any]], violations: Collection[str] = ()
    ) -> dict[str, Any]:
        """The report's `audit` section: alerts, and whether and how fast each compromise was caught.

        An alert is a detection when it follows a compromise, or when it is about a pod and direction
        whose cap the receivers saw broken (`violations`, "POD DIRECTION": e.g. a bypass or an
        operator's routing, with no compromise at all); any other alert is a false alarm.
        """
        first = min((c["t_s"] for c in compromises), default=None)
        true = [a for a in self.alerts if (first is not None and a.t_s >= first) or a.where in violations]
        false = [a for a in self.alerts if a not in true]
        after = [a for a in true if first is not None and a.t_s >= first]
        return {
            "interval_s": interval_s,
            "checks": list(self.checks),
            "alerts": [a.__dict__ for a in self.alerts],
            "compromises": compromises,
            "false_alarms": len(false),
            "detected": bool(true),
            "time_to_detection_s": round(after[0].t_s - first, 6) if after and first is not None else None,
            "detected_by": sorted({a.check for a in true}),
        }
