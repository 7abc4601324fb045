"""One of N parallel devices: a pod leaving through parallel uplinks (ECMP), each limiter enforcing an
equal share of the cap. Honest, they hold the cap together whatever the flows' spread; one
compromised device lets through whatever an attacker steers onto it, and the audit sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dpu_lab.config import ConfigError, load_scenario
from dpu_lab.runner import LabRun
from dpu_lab.virtual import VirtualLabRun
from helpers.scenarios import attacked_pod_caps

pytestmark = pytest.mark.timeout(300)

UPLINKS = 3
CAP = 12e6


def scenario(tmp_path: Path, compromise: bool, **pod_a: Any) -> Path:
    """Pod a behind 3 parallel uplinks, capped at 12 Mbit/s; a flow steered onto uplink 2."""
    doc = {
        "name": "parallel",
        "topology": {
            "name": "parallel",
            "pods": [
                {"name": "a", "subnet": "10.0.1.0/24", "hosts": ["a1", "a2"], "uplinks": UPLINKS, **pod_a},
                {"name": "b", "subnet": "10.0.2.0/24", "hosts": ["b1", "b2"]},
            ],
        },
        "caps": attacked_pod_caps(CAP, 150_000),
        "audit": {"interval_s": 0.5},
        "phases": [
            {
                "name": "p",
                "duration_s": 6,
                "flows": [
                    {"name": "a1-b1", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "12M"},
                    {"name": "a2-b2", "protocol": "udp", "src": "a2", "dst": "b2", "rate": "12M"},
                    {"name": "steered", "protocol": "udp", "src": "a1", "dst": "b2", "rate": "30M", "uplink": 2},
                ],
                "events": (
                    [{"at_s": 2, "action": "compromise", "dpu": "dpu-a-2", "how": "raise-meter", "forge": True}]
                    if compromise
                    else []
                ),
            }
        ],
    }
    path = tmp_path / "parallel.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_honest_parallel_uplinks_hold_the_cap_together(tmp_path: Path) -> None:
    r = VirtualLabRun(load_scenario(scenario(tmp_path, False)), tmp_path / "out", segment_bytes=4000).run()
    assert r.cap_held
    assert r.audit is not None and r.audit["alerts"] == []
    egress = next(x for x in r.results if x.pod == "a" and x.direction == "egress")
    # Each device passes at most its third: the steered flow gets one third of the cap, not 30 Mbit/s.
    steered = next(f for f in r.flows if f.name == "steered")
    assert steered.delivered_bps <= CAP / UPLINKS + 150_000 * 8 / 6 + 1
    assert egress.delivered_bps <= CAP + 150_000 * 8 / 6 + 1


def test_one_compromised_device_of_three_is_bypassed_and_detected(tmp_path: Path) -> None:
    r = VirtualLabRun(load_scenario(scenario(tmp_path, True)), tmp_path / "out", segment_bytes=4000).run()
    assert not r.cap_held
    steered = next(f for f in r.flows if f.name == "steered")
    # After the compromise (4 of 6 s) the steered flow passes whole: the bad device has no cap.
    assert steered.delivered_bps >= 0.6 * 30e6
    assert r.audit is not None and r.audit["detected"] and r.audit["false_alarms"] == 0
    assert r.audit["time_to_detection_s"] <= 0.5 + 1e-6
    assert {a["where"] for a in r.audit["alerts"]} <= {"a egress"}


def test_parallel_uplinks_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="uplinks: 3 parallel uplinks need placement pod-uplink"):
        load_scenario(scenario(tmp_path, False, placement="node"))
    path = scenario(tmp_path, False)
    doc = yaml.safe_load(path.read_text())
    doc["phases"][0]["flows"][2]["uplink"] = 4
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"flows\[2\]\.uplink: 4, but pod 'a' has 3 uplink"):
        load_scenario(path)
    with pytest.raises(ConfigError, match="parallel uplinks: modelled in virtual time only"):
        LabRun(load_scenario(scenario(tmp_path, False)), tmp_path / "rt").run()
