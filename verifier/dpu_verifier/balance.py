"""Conservation as a running balance: every byte the router counted leaving a pod since a reference tick
against what the pod's DPUs say they passed out of it since then.

Conservation drawn per interval allows, each interval, for what the router's counters may not show yet
(an SNMP agent refreshes its counters every few seconds): a DPU whose forged counters hide less than that
allowance per interval is never caught, however long it goes on (issue 16: a forged forward-unclassified
hid about 1 MB/s under 3.5 MB of allowance per interval). Running since a reference, the balance pays
for that uncertainty once, at its two ends, so what a DPU hides adds up until it shows.

Egress only, and only one way: bytes the router counted leaving a pod that no DPU said it passed. Nothing
honest makes those (a frame leaves a pod through its DPUs, which count it before it is on the wire),
while a DPU's bytes the router never counted are legitimate (a frame lost on the link, one still in a
queue). Into a pod, bytes the router sent that no DPU metered may be honestly lost before the DPU's meter
(a software target drops what it cannot take in), so ingress is left to the per-interval check.

The router's total at the reference is taken from a reading asked for at least the counters' lag after
the DPUs were read there (`lag_s`; at once where the router's count has no lag): the most it can have
been then, so the balance's router figure is the least the router can have counted since.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from dpu_limiter.units import MAX_FRAME_BYTES

from .evidence import Balance
from .readings import Readings


@dataclass
class RunningBalance:
    """One pod's egress running balance: since when, the DPUs' total then, and the router's then (at most
    and at least); ticks whose router total is not bounded from above yet, and the latest that is."""

    # The router's counter as read in real time, where it is: an upper bound then waits for the counter's lag.
    readings: Readings | None = None
    lag_s: float = 0.0  # how long after a moment the router's counter may first show it
    # Frames the router may count while the DPUs are read (the router's totals bracket the rest).
    slack_bytes: int = 4 * MAX_FRAME_BYTES
    since: float | None = None  # None: no reference (not drawn yet, or dropped)
    restart_slack: int = 0  # what DPUs that restarted since may have passed and never said (added to the slack)
    said: int = 0
    low: int = 0  # the router's total at the reference, at least
    high: int | None = None  # and at most (None: waiting for a reading asked `lag_s` after the reference)
    # Ticks since, as (time, when the reading right after the DPUs' was asked, what they said then), until
    # a reading asked the lag later bounds the router's total then from above.
    pending: list[tuple[float, float, int]] = field(default_factory=list)
    upto: tuple[float, int, int] | None = None  # the latest such tick: (time, router at most, DPUs) since
    # What the DPUs may say beyond the router's most, besides what they hold queued: this share of it (a
    # frame lost on the link now and then). It bounds the credit a DPU could bank by saying too much.
    over_ratio: float = 0.001

    def drop(self) -> None:
        """A DPU joined or left the pod: the balance starts again at its next reading."""
        self.since, self.pending, self.upto, self.restart_slack = None, [], None, 0

    def draw(
        self, t_s: float, said: int, before: int, after: int, n_before: int = 0, over_slack: int = 0
    ) -> Balance | None:
        """Draw the balance at tick `t_s`: the DPUs said `said` (their total) while the router's total went
        from `before` to `after`; where readings are, those are their own: the last of the first `n_before`
        (taken before the DPUs were read) and the last (right after them, if there is a new one). None until
        the balance spans an interval with the router's total at its reference known. `over_slack`: what
        the DPUs may say they passed beyond what the router can have counted (bytes still queued)."""
        r = self.readings
        fresh = True
        if r is not None:
            fresh = 0 < n_before < len(r.totals)
            if not fresh:
                if self.since is None:
                    return None  # no reading after the DPUs': nothing bounds the router's total at them
                n_before = len(r.totals)
            before, after = r.totals[n_before - 1], r.totals[-1]
        lagging = r is not None and self.lag_s > 0
        if fresh:
            self.pending.append((t_s, r.asked[-1] if r is not None else t_s, said))
        if self.since is None:
            self.since, self.said, self.low = t_s, said, before
            self.high = None if lagging else after
            return None
        # Ticks whose router total is now bounded from above: where readings lag, by one asked the lag later.
        while self.pending:
            t, asked, then = self.pending[0]
            if lagging:
                assert r is not None
                i = bisect.bisect_left(r.asked, asked + self.lag_s)
                if i == len(r.totals):
                    break
                most = r.totals[i]
            elif t == t_s:
                most = after
            else:
                self.pending.pop(0)  # a tick with no fresh reading after it: bounded by the next
                continue
            self.pending.pop(0)
            if t == self.since:
                self.high = most
            else:
                self.upto = (t, most - self.low, then - self.said)
        if self.high is None:
            return None
        upto = self.upto
        return Balance(
            self.since,
            max(0, before - self.high),
            said - self.said,
            self.slack_bytes + self.restart_slack,
            upto=None if upto is None else upto[0],
            router_most_bytes=None if upto is None else upto[1],
            dpu_upto_bytes=None if upto is None else upto[2],
            over_slack_bytes=None if upto is None else over_slack + int(upto[1] * self.over_ratio),
        )
