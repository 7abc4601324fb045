"""The verifier as a site runs it, beside a real-time lab run (site.py): Debian's snmpd in the router's
namespace on a management link, `dpu-limiter verify` as a process reading it over SNMP and the control
plane over its API; its alerts and its evidence bundle, checked offline, in the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpu_lab.config import EventSpec, load_scenario
from dpu_lab.runner import LabRun
from dpu_lab.site import COUNTER_LAG_S, missing
from helpers.netns import can_netns
from helpers.paths import ROOT

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]
SCENARIO = ROOT / "bmv2-lab" / "scenarios" / "site-verifier.yaml"
WINDOW_S = 10.0  # its pod a's cap window


def site_run(tmp_path: Path, event: dict[str, Any] | None, duration_s: float) -> Any:
    """site-verifier.yaml (pod a capped at 8 Mbit/s over 10 s windows, offered three times that, audited
    every second) with `event` in place of its own, for `duration_s`."""
    if reason := can_netns() or missing():
        pytest.skip(reason)
    sc = load_scenario(SCENARIO)
    events = [EventSpec.model_validate(event)] if event else []
    sc = sc.model_copy(
        update={"phases": [sc.phases[0].model_copy(update={"duration_s": duration_s, "events": events})]}
    )
    return LabRun(sc, tmp_path / "out", "embedded", "builtin").run()


def test_the_sites_verifier_raises_no_alert_on_a_clean_run_and_signs_every_window(tmp_path: Path) -> None:
    r = site_run(tmp_path, None, 8.0)
    assert r.cap_held
    v = r.verifier
    assert v is not None and v["alerts"] == [] and v["false_alarms"] == 0
    (bundle,) = v["evidence"]
    assert bundle["verified"], bundle["problem"]
    assert bundle["windows"] >= 4 * 6  # two pods, two directions, every second of the run
    assert set(bundle["verdicts"]) <= {"held", "unverified"}


def test_the_sites_verifier_catches_a_dpu_that_lifts_its_cap_and_forges_its_counters(tmp_path: Path) -> None:
    event = {"at_s": 3, "action": "compromise", "dpu": "dpu-a", "how": "raise-meter", "forge": True}
    r = site_run(tmp_path, event, 20.0)
    assert not r.cap_held  # the wire says so
    v = r.verifier
    assert v is not None and v["detected"] and v["false_alarms"] == 0, v["alerts"]
    # Three times the cap fills a window's allowance and the counters' lag in well under one window.
    assert v["time_to_detection_s"] <= WINDOW_S + COUNTER_LAG_S + 2
    (bundle,) = v["evidence"]
    assert bundle["verified"], bundle["problem"]
    assert bundle["verdicts"].get("violated", 0) >= 1


def test_the_sites_verifier_catches_forged_counters_that_hide_less_than_the_lag_per_interval(tmp_path: Path) -> None:
    # forward-unclassified with forged counters passes only a little over the cap (44 kB over a 10 s window:
    # within the counters' lag) while its DPU's counters stop: the per-interval check, which allows the lag
    # every interval, missed it; the running balance pays for the lag once and catches what adds up.
    event = {"at_s": 3, "action": "compromise", "dpu": "dpu-a", "how": "forward-unclassified", "forge": True}
    r = site_run(tmp_path, event, 25.0)
    v = r.verifier
    assert v is not None and v["detected"] and v["false_alarms"] == 0, v["alerts"]
    assert "conservation" in v["detected_by"], v["alerts"]
    assert v["time_to_detection_s"] <= 20, v["alerts"]
    (bundle,) = v["evidence"]
    assert bundle["verified"], bundle["problem"]
    assert bundle["verdicts"].get("violated", 0) >= 1
