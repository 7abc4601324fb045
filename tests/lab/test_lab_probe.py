"""The verifier's active probes (virtual time): a burst above the cap in every audit interval, judged
at its receiver. They find a compromised DPU whose pod's own traffic stays below the cap, with no
counter the operator's devices keep; a clean run raises no alert; a probe too short to tell is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpu_lab.config import ConfigError, load_scenario
from dpu_lab.virtual import VirtualLabRun
from helpers.scenarios import probed_scenario as scenario

pytestmark = pytest.mark.timeout(300)
SEGMENT = 8000
COMPROMISE = {"at_s": 2.5, "action": "compromise", "dpu": "dpu-a", "how": "raise-meter", "forge": True}


def test_a_clean_run_with_probes_raises_no_alert(tmp_path: Path) -> None:
    r = VirtualLabRun(load_scenario(scenario(tmp_path, ["probe"], None)), tmp_path / "out", segment_bytes=SEGMENT).run()
    assert r.cap_held  # the probes' own bytes count against the cap, and the cap holds them
    assert r.audit is not None and r.audit["alerts"] == []


def test_probes_find_a_compromise_the_pods_traffic_does_not_show(tmp_path: Path) -> None:
    # Router counting alone: the pod's 4 Mbit/s never exceeds the cap, so nothing is seen.
    r = VirtualLabRun(
        load_scenario(scenario(tmp_path, ["router-count"], COMPROMISE)), tmp_path / "rc", segment_bytes=SEGMENT
    ).run()
    assert r.audit is not None and not r.audit["detected"]
    # The probe: the next burst after the compromise passes whole, and its receiver says so.
    r = VirtualLabRun(
        load_scenario(scenario(tmp_path, ["probe"], COMPROMISE)), tmp_path / "pr", segment_bytes=SEGMENT
    ).run()
    assert r.audit is not None and r.audit["detected"] and r.audit["false_alarms"] == 0
    assert r.audit["detected_by"] == ["probe"]
    # The first burst after the compromise (at 2.6 s) runs 3.0-3.5 s, judged at the 4.0 s tick.
    assert r.audit["time_to_detection_s"] <= 2.0
    assert r.audit["alerts"][0]["where"] == "a egress"


def test_a_probe_too_short_to_exceed_the_allowance_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"audit.probe_s: 0.05 s at 2x pod a's cap .* needs more than 0.1"):
        load_scenario(scenario(tmp_path, ["probe"], None, probe_s=0.05))
    with pytest.raises(ConfigError, match="probe_s: 1.5 must be shorter than interval_s"):
        load_scenario(scenario(tmp_path, ["probe"], None, probe_s=1.5))
