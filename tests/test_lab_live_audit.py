"""The compromised DPU and the verifier's audit in real time: real processes, namespaces and packets.

The embedded target's firmware socket takes the attack; the router namespace's own counters, the
control plane's read-back and its usage counters feed the audit (live_audit.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import audited_scenario, can_netns
from dpu_lab.config import ConfigError, load_scenario
from dpu_lab.runner import LabRun

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]


def run(tmp_path: Path, event: dict[str, Any] | None) -> Any:
    """Run in real time on the embedded target (the lab needs root)."""
    if reason := can_netns():
        pytest.skip(reason)
    return LabRun(load_scenario(audited_scenario(tmp_path, event, 1.0)), tmp_path / "out", "embedded", "builtin").run()


def test_a_clean_real_time_run_raises_no_alert(tmp_path: Path) -> None:
    r = run(tmp_path, None)
    assert r.cap_held
    assert r.audit is not None and r.audit["alerts"] == [] and r.audit["false_alarms"] == 0


@pytest.mark.parametrize(("forge", "seen_by"), [(False, "read-back"), (True, "conservation")])
def test_a_compromised_dpu_is_caught_in_real_time(tmp_path: Path, forge: bool, seen_by: str) -> None:
    event = {"at_s": 3, "action": "compromise", "dpu": "dpu-a", "how": "raise-meter", "forge": forge}
    r = run(tmp_path, event)
    assert [e["action"] for e in r.events] == ["compromise"]
    assert r.audit is not None and r.audit["detected"] and r.audit["false_alarms"] == 0
    assert seen_by in r.audit["detected_by"]
    # The audit checks every second, the control plane reads back every second: within two.
    assert r.audit["time_to_detection_s"] <= 2.5
    if forge:
        assert not r.cap_held  # read-back sees nothing wrong, the cap is gone


def test_forging_on_bmv2_is_refused_before_anything_starts(tmp_path: Path) -> None:
    event = {"at_s": 3, "action": "compromise", "dpu": "dpu-a", "how": "raise-meter", "forge": True}
    scenario = load_scenario(audited_scenario(tmp_path, event, 1.0))
    refused = r"phases\[0\]\.events\[0\] \(compromise of dpu-a, raise-meter\): forge: not on bmv2: .* cannot show"
    with pytest.raises(ConfigError, match=refused):
        LabRun(scenario, tmp_path / "out", "bmv2", "builtin").run()
    assert not (tmp_path / "out").exists()  # refused before the network, the targets or the calibration
