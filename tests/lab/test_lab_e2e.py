"""The lab end to end, as a user runs it: `dpu-limiter lab run SCENARIO --out DIR`, on real namespaces."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dpu_lab.targets import BUFFER_BYTES
from dpu_limiter.units import MAX_FRAME_BYTES
from helpers.netns import can_netns
from helpers.paths import ROOT
from helpers.processes import cli

pytestmark = pytest.mark.netns
SMOKE = ROOT / "bmv2-lab" / "scenarios" / "smoke.yaml"


def run_lab(tmp_path: Path, target: str, scenario: Path = SMOKE, *options: str) -> dict:  # type: ignore[type-arg]
    """`dpu-limiter lab run` as a user types it; checks its outputs and that it left nothing behind."""
    out = tmp_path / target
    res = cli("lab", "run", str(scenario), "--out", str(out), "--target", target, *options, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("report.json", "throughput.png", "summary.md"):
        assert (out / name).is_file(), name
    # Everything this run made is gone (other runs may be going on at the same time: look at ours only).
    prefix = re.search(r"prefix (dl[0-9a-f]{4})", res.stderr)
    assert prefix, res.stderr[-2000:]
    for what in (["ip", "netns", "list"], ["ip", "-br", "link"]):
        assert prefix.group(1) not in subprocess.run(what, capture_output=True, text=True).stdout
    return json.loads((out / "report.json").read_text())


def check_report(report: dict, target: str) -> None:  # type: ignore[type-arg]
    assert report["scenario"] == "smoke" and report["target"] == target
    assert {(r["pod"], r["direction"]) for r in report["results"]} == {
        ("a", "egress"),
        ("a", "ingress"),
        ("b", "egress"),
        ("b", "ingress"),
    }
    for r in report["results"]:
        assert r["compliant"], r
        assert r["max_window_bytes"] <= r["allowed_window_bytes"]
    flows = {f["name"]: f for f in report["flows"]}
    cap = 8e6
    assert flows["udp-a-to-b"]["delivered_bps"] >= 0.9 * cap
    assert flows["udp-a-to-b"]["delivered_bps"] <= 1.1 * cap + 8 * 1e6 / 8  # cap plus at most the burst
    assert flows["tcp-b-to-a"]["delivered_bps"] >= 0.6 * cap
    assert flows["udp-a-to-b-below-cap"]["loss_ratio"] < 0.01
    # The DPUs' own counters agree that pod a's egress was policed (red) and b's ingress was not.
    counters = {(u["pod"], u["direction"]): u for u in report["dpu_counters"]}
    assert int(counters[("a", "egress")]["red_bytes"]) > 0
    assert int(counters[("a", "egress")]["metered_bytes"]) > int(counters[("b", "ingress")]["metered_bytes"]) > 0
    # Calibrated first: the target carried at least what the scenario needs (8M caps, 16M offered).
    cal = report["calibration"]
    assert cal["target"] == target and cal["verdict"] == "ok" and cal["capacity_bps"] >= 16e6 * 0.95


def test_a_scenario_the_target_cannot_carry_is_refused(tmp_path: Path) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    too_fast = tmp_path / "too-fast.yaml"
    too_fast.write_text(
        (ROOT / "bmv2-lab/scenarios/smoke.yaml")
        .read_text()
        .replace("egress: 8M, ingress: 8M", "egress: 20G, ingress: 20G")
        .replace("../topologies/", str(ROOT / "bmv2-lab/topologies") + "/")
    )
    res = cli("lab", "run", str(too_fast), "--out", str(tmp_path / "o"), timeout=240)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "calibration" in res.stderr and "20000.0 Mbit/s" in res.stderr and "--time virtual" in res.stderr
    assert not (tmp_path / "o" / "report.json").exists()
    # --rescale: the same scenario, every rate and burst scaled down to what the target carries.
    report = run_lab(tmp_path, "embedded", too_fast, "--rescale")
    cal = report["calibration"]
    assert cal["verdict"] == "rescaled" and 0 < cal["scale"] < 1 and "scaled by" in cal["note"]
    assert cal["capacity_bps"] >= 1.25 * 20e9 * cal["scale"]
    assert {r["cap_bps"] for r in report["results"]} == {20e9 * cal["scale"]}


def test_lab_smoke_embedded(tmp_path: Path) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    check_report(run_lab(tmp_path, "embedded"), "embedded")


@pytest.mark.bmv2
def test_lab_smoke_bmv2(tmp_path: Path) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    check_report(run_lab(tmp_path, "bmv2"), "bmv2")


def test_dpu_restart_mid_traffic_never_passes_unmetered(tmp_path: Path) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    report = run_lab(tmp_path, "embedded", ROOT / "bmv2-lab/scenarios/dpu-restart.yaml", "--traffic", "builtin")
    assert [e["dpu"] for e in report["events"]] == ["dpu-a"]
    # Receiver-side: in no 2 s window did more than cap x window + burst cross, restart included.
    assert all(r["compliant"] for r in report["results"]), report["results"]
    flow = report["flows"][0]
    assert 0.6 * 8e6 < flow["delivered_bps"] < 8e6 + 2 * 1_000_000 * 8 / 14  # the outage, at most a fresh burst


@pytest.mark.parametrize("target", ["embedded", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def test_window_mode_holds_exactly(tmp_path: Path, target: str) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if target == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    report = run_lab(tmp_path, target, ROOT / "bmv2-lab/scenarios/window-smoke.yaml", "--traffic", "builtin")
    egress = next(r for r in report["results"] if (r["pod"], r["direction"]) == ("a", "egress"))
    assert egress["allowed_window_bytes"] == 4_000_000 + MAX_FRAME_BYTES  # 8 Mbit/s x 4 s and one frame
    # The budget is exact at the DPU: a receiver sees at most it, plus what the DPU's queues held.
    programmed = 4_000_000 - BUFFER_BYTES[target]  # type: ignore[index]
    assert 0.95 * programmed < egress["max_window_bytes"] <= 4_000_000
    assert report["flows"][0]["delivered_bps"] > 0.9 * 8e6
