"""The compromised DPU and the verifier's audit in real time: real processes, namespaces and packets.

The embedded target's firmware socket, or bmv2's Thrift API, takes the attack; the router namespace's
own counters, the control plane's read-back and its usage counters feed the audit, and the verifier's
probes send over the cap from inside a pod to the router (live_audit.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from dpu_lab.config import ConfigError, load_scenario
from dpu_lab.runner import LabRun
from dpu_lab.targets import BUFFER_BYTES, TargetKind
from helpers.bmv2 import thrift_firmware_missing
from helpers.netns import can_netns
from helpers.scenarios import audited_scenario, probed_scenario

pytestmark = [pytest.mark.netns, pytest.mark.timeout(300)]
# The same 100 kB bucket at the meter on both targets: the control plane takes what each queues after it.
BURST = {"embedded": 100_000, "bmv2": 100_000 + BUFFER_BYTES["bmv2"] - BUFFER_BYTES["embedded"]}


def run(tmp_path: Path, event: dict[str, Any] | None, target: TargetKind = "embedded") -> Any:
    """Run in real time on `target` (the lab needs root)."""
    if reason := can_netns():
        pytest.skip(reason)
    if target == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    scenario = load_scenario(audited_scenario(tmp_path, event, 1.0, BURST[target]))
    return LabRun(scenario, tmp_path / "out", target, "builtin").run()


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


def test_another_pipeline_loaded_is_read_back_and_replaced_in_real_time(tmp_path: Path) -> None:
    # The reads of the limiter's tables fail on the other program; the control plane finds a pipeline
    # that is not its own and loads its own again (reconciler.py), which the audit sees as read-back.
    r = run(tmp_path, {"at_s": 3, "action": "compromise", "dpu": "dpu-a", "how": "load-pipeline"})
    assert r.audit is not None and r.audit["detected"] and r.audit["false_alarms"] == 0
    details = [a["detail"] for a in r.audit["alerts"] if a["check"] == "read-back"]
    assert any("another pipeline loaded" in d and "pipeline reinstalled" in d for d in details), details
    assert r.audit["time_to_detection_s"] <= 2.5


def test_forging_on_bmv2_is_refused_before_anything_starts(tmp_path: Path) -> None:
    event = {"at_s": 3, "action": "compromise", "dpu": "dpu-a", "how": "raise-meter", "forge": True}
    scenario = load_scenario(audited_scenario(tmp_path, event, 1.0))
    refused = r"phases\[0\]\.events\[0\] \(compromise of dpu-a, raise-meter\): forge: not on bmv2: .* cannot show"
    with pytest.raises(ConfigError, match=refused):
        LabRun(scenario, tmp_path / "out", "bmv2", "builtin").run()
    assert not (tmp_path / "out").exists()  # refused before the network, the targets or the calibration


def caught_on_bmv2(tmp_path: Path, how: str, seen_by: str) -> Any:
    """Run with pod a's bmv2 compromised `how` 3 s in; the audit must catch it (by `seen_by`) within 2.5 s."""
    if reason := thrift_firmware_missing():
        pytest.skip(reason)
    r = run(tmp_path, {"at_s": 3, "action": "compromise", "dpu": "dpu-a", "how": how}, "bmv2")
    assert [e["how"] for e in r.events] == [how]
    assert r.audit is not None and r.audit["detected"] and r.audit["false_alarms"] == 0
    assert seen_by in r.audit["detected_by"]
    assert r.audit["time_to_detection_s"] <= 2.5
    return r


@pytest.mark.bmv2
@pytest.mark.parametrize("how", ["raise-meter", "delete-meter"])
def test_bmv2_meters_changed_through_thrift_are_read_back_and_undone(tmp_path: Path, how: str) -> None:
    # How much got through first depends on when the control plane's next read-back comes, which may be
    # at once; test_bmv2_firmware shows the tampered meters pass packets over the cap.
    caught_on_bmv2(tmp_path, how, "read-back")


@pytest.mark.bmv2
@pytest.mark.parametrize("how", ["forward-unclassified", "load-pipeline"])
def test_bmv2_entries_or_a_program_put_in_beside_p4runtime_are_undone_by_a_new_pipeline(
    tmp_path: Path, how: str
) -> None:
    # bmv2's P4Runtime server can then no longer read the limiter's tables (bmv2_firmware.py); the
    # control plane takes that as unreadable state and loads its pipeline again (reconciler.py).
    r = caught_on_bmv2(tmp_path, how, "read-back")
    alerts = [a for a in r.audit["alerts"] if a["check"] == "read-back"]
    assert any("pipeline reinstalled" in a["detail"] for a in alerts), alerts


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
