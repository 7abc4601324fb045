"""The compromised DPU and the verifier's audit in real time: real processes, namespaces and packets.

The embedded target's firmware socket takes the attack; the router namespace's own counters, the
control plane's read-back and its usage counters feed the audit, and the verifier's probes send over
the cap from inside a pod to the router (live_audit.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import audited_scenario, can_netns, probed_scenario
from dpu_lab.config import load_scenario
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


@pytest.mark.parametrize(
    ("target", "burst_bytes"),
    [("embedded", 100_000), pytest.param("bmv2", 400_000, marks=pytest.mark.bmv2)],  # bmv2 queues 294 kB
)
def test_real_time_probes_raise_no_alert_while_the_cap_holds(tmp_path: Path, target: str, burst_bytes: int) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if target == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    # b's cap 24 Mbit/s: its own probe stays within what this machine carries.
    sc = load_scenario(probed_scenario(tmp_path, ["probe"], None, "24M", burst_bytes))
    r = LabRun(sc, tmp_path / "out", target, "builtin").run()  # type: ignore[arg-type]
    assert r.cap_held
    assert r.audit is not None and r.audit["alerts"] == [] and r.audit["false_alarms"] == 0
    # The probes ran: their bursts reached the router and took their share of pod a's cap.
    egress = next(u for u in r.dpu_counters if (u["pod"], u["direction"]) == ("a", "egress"))
    assert int(egress["red_bytes"]) > 0


def test_a_real_time_probe_finds_a_compromise_the_pods_traffic_does_not_show(tmp_path: Path) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    # Forged: read-back would see nothing, and the pod's own 4 Mbit/s stays under the cap it no longer has.
    event = {"at_s": 2.5, "action": "compromise", "dpu": "dpu-a", "how": "raise-meter", "forge": True}
    sc = load_scenario(probed_scenario(tmp_path, ["probe"], event, "24M"))
    r = LabRun(sc, tmp_path / "out", "embedded", "builtin").run()
    assert r.audit is not None and r.audit["detected"] and r.audit["false_alarms"] == 0
    assert r.audit["detected_by"] == ["probe"] and r.audit["alerts"][0]["where"] == "a egress"
    # The first burst after the compromise is judged at the tick after it: within two intervals.
    assert r.audit["time_to_detection_s"] <= 2.5
