"""The verifier as a site runs it, beside a real-time lab run (site.py): Debian's snmpd in the router's
namespace on a management link, `dpu-limiter verify` as a process reading it over SNMP and the control
plane over its API; its alerts and its evidence bundle, checked offline, in the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dpu_lab.config import load_scenario
from dpu_lab.runner import LabRun
from dpu_lab.site import COUNTER_LAG_S, missing
from helpers.netns import can_netns
from helpers.paths import ROOT

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]
CAP_BPS, WINDOW_S = 8e6, 10.0


def site_run(tmp_path: Path, event: dict[str, Any] | None, duration_s: float) -> Any:
    """Pod a capped at 8 Mbit/s over 10 s windows, offered three times that, audited every second."""
    if reason := can_netns() or missing():
        pytest.skip(reason)
    doc = {
        "name": "site",
        "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"),
        "caps": [
            {"pod": "a", "egress": "8M", "ingress": "8M", "window_s": WINDOW_S, "burst_bytes": 100_000},
            {"pod": "b", "egress": "200M", "ingress": "200M", "window_s": WINDOW_S},
        ],
        "audit": {"interval_s": 1.0},
        "phases": [
            {
                "name": "p",
                "duration_s": duration_s,
                "flows": [
                    {"name": "a-to-b", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "24M"},
                    {"name": "b-to-a", "protocol": "udp", "src": "b1", "dst": "a1", "rate": "4M"},
                ],
                "events": [event] if event else [],
            }
        ],
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc))
    return LabRun(load_scenario(path), tmp_path / "out", "embedded", "builtin").run()


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
