"""Policy churn under traffic: the cap changes every second while a pod offers four times the lower
cap. Between two writes, what the receivers get never exceeds the cap in force (plus the one bucket
a meter write refills): no interval in which traffic crosses unmetered or over the cap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from dpu_lab.config import load_scenario
from dpu_lab.virtual import VirtualLabRun
from dpu_limiter.units import MAX_FRAME_BYTES
from helpers.paths import ROOT

pytestmark = pytest.mark.timeout(300)

BURST = 100_000
LOW, HIGH = 8e6, 16e6


def test_caps_churning_under_traffic_hold_between_every_two_writes(tmp_path: Path) -> None:
    rates = [HIGH if k % 2 else LOW for k in range(10)]  # 8M, 16M, 8M, ... one per second
    doc = {
        "name": "churn",
        "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"),
        "caps": [
            {"pod": "a", "egress": LOW, "ingress": LOW, "window_s": 2, "burst_bytes": BURST},
            {"pod": "b", "egress": "1G", "ingress": "1G", "window_s": 2, "burst_bytes": 1_000_000},
        ],
        "phases": [
            {
                "name": "churn",
                "duration_s": 10,
                "flows": [{"name": "a-to-b", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "32M"}],
                "events": [
                    {"at_s": k, "action": "set-cap", "pod": "a", "egress": rate, "ingress": rate}
                    for k, rate in enumerate(rates)
                    if k > 0
                ],
            }
        ],
    }
    path = tmp_path / "churn.yaml"
    path.write_text(yaml.safe_dump(doc))
    run = VirtualLabRun(load_scenario(path), tmp_path / "out")
    report = run.run()
    assert [e["egress"] for e in report.events] == rates[1:]
    t, bps = run.series[("a", "egress")]
    step = t[1] - t[0]
    for k, rate in enumerate(rates):
        start = 0.1 + k  # the phase's traffic starts 0.1 s in; a change every second after that
        inside = (t >= start - 1e-6) & (t < start + 1 - 1e-6)
        got = float(np.sum(bps[inside]) * step / 8)
        # The cap in force for this second, and one bucket (each write refills it), within two frames.
        assert got <= rate / 8 + BURST + 2 * MAX_FRAME_BYTES, (k, rate, got)
        assert got >= 0.95 * rate / 8, (k, rate, got)  # and the sender does get the cap
