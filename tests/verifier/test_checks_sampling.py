"""The router-count check on a counter sampled in real time (issue 16 item 5: no false alarms).

A clean 5-minute lab run alerted on pod b's egress, "7821408 bytes in 2 s, allowed 7601518", while the
boundary capture's most in any real 2 s was 6601476: the sampler had run late, the bytes of its whole
delay had gone into one 0.1 s bin, and 20 bins held over 2.4 s of traffic. Readings that keep when each
was asked for and answered (checks.Readings) know the span between them; these tests feed the Auditor a
series with such a stall, at the cap and over it."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_probes import FakeView  # DPUs that find nothing: only the router's count is under test

from dpu_lab.traffic import Timeline
from dpu_verifier.checks import Auditor, CapScope
from dpu_verifier.evidence import BUNDLE_FILE, load_public_key, verify_bundle
from dpu_verifier.readings import Readings

RATE_BPS = 8e6  # 1 MB/s
WINDOW_S = 2.0
SAMPLE_S = 0.1
ANSWER_S = 0.01  # how long each reading takes to answer
CAP = CapScope("b", RATE_BPS, RATE_BPS, WINDOW_S, 0)
KEY = ("b", "egress")


def sample_times(seconds: float, stall: tuple[float, float] | None) -> list[float]:
    """When the sampler asks: every SAMPLE_S (mid-bin, so no time falls on a bin's edge), none in `stall`."""
    times = [round((k + 0.5) * SAMPLE_S, 6) for k in range(round(seconds / SAMPLE_S))]
    return [t for t in times if stall is None or not stall[0] < t < stall[1]]


def audit(
    seconds: float, bytes_by: Callable[[float], int], stall: tuple[float, float] | None, sampled: bool, **kw: object
) -> Auditor:
    """An Auditor fed the router's count of `bytes_by(t)` (bytes so far at t) sampled as the live audit
    samples it, ticked every second: with its readings (`sampled`), or only in bins as before the fix
    (count_slack_s=2 x SAMPLE_S, the slack it had). Each reading counts up to its answer: the most it can."""
    bins, readings = Timeline(SAMPLE_S), Readings([0.0], [0.0], [0])
    auditor = Auditor(
        [CAP],
        {KEY: bins},
        FakeView(),
        checks=["router-count"],
        readings={KEY: readings} if sampled else {},
        count_slack_s=0.0 if sampled else 2 * SAMPLE_S,
        **kw,  # type: ignore[arg-type]
    )
    next_tick = 1.0
    for asked in sample_times(seconds, stall):
        answered = asked + ANSWER_S
        total = bytes_by(answered)
        bins.add(asked, total - readings.totals[-1])
        readings.read(asked, answered, total)
        if asked >= next_tick:
            asyncio.run(auditor.tick(asked))
            next_tick += 1.0
    return auditor


def at(rate_bps: float) -> Callable[[float], int]:
    """Bytes so far of a steady `rate_bps` from time 0."""
    return lambda t: int(rate_bps / 8 * t)


# A stall of 0.8 s (from 4.95 to 5.75), as a loaded 2-core machine gives the sampler's thread.
STALL = (5.0, 5.7)


def test_a_stalled_sampler_at_the_cap_alerted_from_bins_and_does_not_from_readings() -> None:
    # Before: the 0.8 s of the stall in one bin, and 20 bins from it on held 2.7 s of traffic at the cap.
    binned = audit(12, at(RATE_BPS), STALL, sampled=False)
    assert [(a.check, a.where) for a in binned.alerts] == [("router-count", "b egress")]
    counted = int(binned.alerts[0].detail.split()[3])
    assert 2_690_000 < counted <= 2_700_000 and "in 2 s, allowed 2201518" in binned.alerts[0].detail
    # After: no two readings at most 2 s apart differ by more than 2 s at the cap allows.
    assert audit(12, at(RATE_BPS), STALL, sampled=True).alerts == []


def test_excess_is_still_caught_with_no_slack_where_bins_had_hidden_it() -> None:
    # 10% over the cap, sampled on time: 20 bins held 2.2 MB, under the bins' 2.0015 MB + 0.2 s of slack;
    # readings 1.91 s apart (the most that fit in 2 s) differ by 2.1 MB, over the cap's 2.0015 MB.
    over = at(1.1 * RATE_BPS)
    assert audit(12, over, None, sampled=False).alerts == []
    alerts = audit(12, over, None, sampled=True).alerts
    assert [(a.check, a.where) for a in alerts] == [("router-count", "b egress")]
    assert "allowed 2001518" in alerts[0].detail and "at most 2 s between its readings" in alerts[0].detail


def test_excess_during_a_stall_is_caught() -> None:
    # 3x the cap for the 0.8 s the sampler stalled (on time otherwise): the readings either side of it
    # (0.81 s apart) hold 2.43 MB, caught by the tick that came with the first reading after it.
    def burst(t: float) -> int:
        extra = min(max(t - STALL[0], 0.0), STALL[1] - STALL[0])
        return int(RATE_BPS / 8 * (t + 2 * extra))

    alerts = audit(12, burst, STALL, sampled=True).alerts
    assert [(a.check, a.where) for a in alerts] == [("router-count", "b egress")]
    assert alerts[0].t_s == pytest.approx(5.75)


def test_the_window_of_an_alert_is_signed_violated_and_a_clean_one_held(tmp_path: Path) -> None:
    for name, series in (("clean", at(RATE_BPS)), ("over", at(1.1 * RATE_BPS))):
        bins, readings = Timeline(SAMPLE_S), Readings([0.0], [0.0], [0])
        auditor = Auditor([CAP], {KEY: bins}, FakeView(), checks=["router-count"], readings={KEY: readings})
        auditor.open_evidence(tmp_path / name)
        next_tick = 1.0
        for asked in sample_times(8, STALL):
            total = series(asked + ANSWER_S)
            bins.add(asked, total - readings.totals[-1])
            readings.read(asked, asked + ANSWER_S, total)
            if asked >= next_tick:
                asyncio.run(auditor.tick(asked))
                next_tick += 1.0
        result = auditor.close_evidence()
        # Verified as a third party would, re-deriving each window's cap check from its figures (no slack).
        assert result["verified"], result["problem"]
        assert verify_bundle(tmp_path / name, load_public_key(tmp_path / name / "verifier.key.pub")).ok
        lines = (tmp_path / name / BUNDLE_FILE).read_text().splitlines()
        predicates = [json.loads(base64.b64decode(json.loads(line)["payload"]))["predicate"] for line in lines]
        caps = [
            (p["figures"]["end"], p["checks"]["cap"], p["figures"]["router_slack_bytes"])
            for p in predicates
            if "cap" in p.get("checks", {})
        ]
        assert len(caps) >= 7 and {slack for _, _, slack in caps} == {0}
        if name == "clean":
            assert auditor.alerts == [] and {c for _, c, _ in caps} == {"pass"}
        else:
            # The first window that fails ends at the tick that alerted.
            assert next(t for t, c, _ in caps if c == "fail") == auditor.alerts[0].t_s
            assert result["first_violated_s"] == {"b egress": auditor.alerts[0].t_s}


def test_readings_span_and_cover() -> None:
    r = Readings()
    for asked, answered, total in [(0.0, 0.1, 0), (1.0, 1.5, 100), (2.0, 2.1, 250), (2.2, 2.3, 300)]:
        r.read(asked, answered, total)
    # (1.0, 2.3]: 200 bytes in 1.3 s; (0.0, 2.1] is too long for 2 s.
    assert r.most_within(2.0) == (200, pytest.approx(1.3))
    assert r.most_within(2.1) == (250, pytest.approx(2.1))
    assert r.most_within(2.0, first=3) == (200, pytest.approx(1.3))
    assert r.most_within(0.2) == (0, 0.0)
    # Everything that crossed in [1.6, 2.0]: from the reading answered by 1.6 to the first asked from 2.0 on.
    assert r.covering(1.6, 2.0) == 150
    assert r.covering(0.05, 9.0) == 300
    with pytest.raises(ValueError, match="out of order"):
        r.read(2.25, 2.4, 310)  # asked before the last reading was answered
    with pytest.raises(ValueError, match="out of order"):
        r.read(3.0, 3.1, 299)  # a running total that went back
