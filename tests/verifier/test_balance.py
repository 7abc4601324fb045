"""Conservation as a running balance (issue 16): a DPU whose forged counters hide less per interval than
the per-interval check allows for the router's counter lag is caught once what it hid adds up, and honest
DPUs read against a lagging counter never are.

The router here is read as an SNMP agent answers: each reading gives the count as it stood some time up
to the agent's lag before it was asked (net-snmp refreshes its interface counters every 3 s); the test
picks the worst lags for the check (none at one end, all of it at the other)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from test_probes import FakeView

from dpu_lab.traffic import Timeline
from dpu_verifier.checks import Auditor, CapScope
from dpu_verifier.evidence import load_public_key, verify_bundle
from dpu_verifier.readings import Readings

RATE = 1_000_000  # bytes/s the pod sends (its cap: 8 Mbit/s each way)
CAP = CapScope("a", 8e6, 8e6, 10.0, 0)
KEY = ("a", "egress")
LAG_S = 3.5  # the verifier's counter_lag_s over net-snmp
SAMPLE_S = 0.5


class CountingView(FakeView):
    """A pod's DPUs whose egress counter says `said(t)` at the run's time `t` (honest: what they passed)."""

    def __init__(self, clock: Callable[[], float], said: Callable[[float], int]) -> None:
        self.clock, self.said = clock, said

    async def counters(self) -> dict[str, tuple[str, tuple[int, int] | None]]:
        """One DPU's (passed out, metered in)."""
        return {"dpu-a": ("a", (self.said(self.clock()), 0))}


def run(
    seconds: float, said: Callable[[float], int], seed: int, lag_s: float = LAG_S, evidence: Path | None = None
) -> Auditor:
    """Tick an Auditor set as `dpu-limiter verify` sets it over SNMP every second for `seconds`, the
    router counting RATE leaving the pod and read every SAMPLE_S with a lag of up to `lag_s`; its figures
    signed into a bundle in `evidence` where given."""
    rng = random.Random(seed)
    now = [0.0]
    bins, readings = Timeline(SAMPLE_S), Readings([0.0], [0.0], [0])
    auditor = Auditor(
        [CAP],
        {KEY: bins},
        CountingView(lambda: now[0], said),
        checks=["conservation"],
        readings={KEY: readings},
        count_slack_s=lag_s,
        slack_ratio=0.001,
    )

    def sample(asked: float) -> None:
        # The worst an agent can do: some readings as stale as its lag, some fresh.
        seen = max(0.0, asked - rng.choice((0.0, lag_s, rng.uniform(0, lag_s))))
        total = max(readings.totals[-1], int(RATE * seen))
        bins.add(asked, total - readings.totals[-1])
        readings.read(asked, asked + 0.01, total)

    auditor.resample = lambda: sample(now[0] + 0.02)  # right after the DPUs are read
    if evidence is not None:
        auditor.open_evidence(evidence)
    while now[0] < seconds:
        now[0] = round(now[0] + SAMPLE_S, 6)
        sample(now[0])
        if abs(now[0] - round(now[0])) < 1e-6:
            asyncio.run(auditor.tick(now[0]))
    if evidence is not None:
        auditor.close_evidence()
    return auditor


def test_honest_dpus_against_a_lagging_counter_never_alert() -> None:
    # The DPUs pass every byte the router counts, the moment before it counts them.
    for seed in range(5):
        auditor = run(600, lambda t: int(RATE * t), seed)
        assert auditor.alerts == [], auditor.alerts


@pytest.mark.parametrize(("hidden", "within_s"), [(1.0, LAG_S + 3), (0.1, 10 * LAG_S + 3)], ids=["all", "a-tenth"])
def test_forged_counters_are_caught_by_the_balance_where_no_interval_shows_them(hidden: float, within_s: float) -> None:
    # From 3 s on the DPUs hide `hidden` of what they pass: at most 1 MB/s, against 7 MB of allowance per
    # interval. Once the reference's reading is in, the only slack left is the lag at the balance's other
    # end (a reading as stale as 3.5 s): caught once what was hidden exceeds it, within a tick or two.
    def forged(t: float) -> int:
        return int(RATE * t) if t < 3 else int(RATE * 3 + (1 - hidden) * RATE * (t - 3))

    auditor = run(60, forged, seed=1)
    assert [(a.check, a.where) for a in auditor.alerts] == [("conservation", "a egress")]
    assert "since" in auditor.alerts[0].detail, auditor.alerts[0].detail  # the balance's, not an interval's
    assert auditor.alerts[0].t_s <= 3 + within_s, auditor.alerts[0]


def test_counters_saying_more_than_the_router_counted_bank_no_credit() -> None:
    # A DPU that says 10 % more than it passes (under the per-interval allowance) could later hide that
    # much unseen; the balance bounds the router's count from above too (a reading asked the lag later).
    auditor = run(60, lambda t: int(1.1 * RATE * t), seed=4)
    assert [(a.check, a.where) for a in auditor.alerts] == [("conservation", "a egress")]
    assert "at most" in auditor.alerts[0].detail, auditor.alerts[0].detail
    assert auditor.alerts[0].t_s <= 11 * LAG_S + 3, auditor.alerts[0]


def test_the_balance_is_signed_and_a_shortfall_makes_the_window_violated(tmp_path: Path) -> None:
    # The counters stop at 20 s while the router goes on counting.
    auditor = run(40, lambda t: int(RATE * min(t, 20.0)), seed=2, evidence=tmp_path / "bundle")
    assert [a.check for a in auditor.alerts] == ["conservation"]
    result = verify_bundle(tmp_path / "bundle", load_public_key(tmp_path / "bundle" / "verifier.key.pub"))
    assert result.ok, result.problem
    first = min(t for t, where, verdict in auditor.signed if verdict == "violated" and where == "a egress")
    assert first == auditor.alerts[0].t_s
    assert result.verdicts["violated"] == sum(1 for _, w, v in auditor.signed if v == "violated")
