"""The lab in virtual time: same scenario files, caps through the same API, embedded targets on one
simulated clock. No root needed: nothing touches the host's network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpu_lab.config import load_scenario
from dpu_lab.virtual import VirtualLabRun
from dpu_limiter.units import MAX_FRAME_BYTES
from helpers.paths import ROOT
from helpers.processes import cli

SCENARIO = """
name: v
topology: {topo}
caps:
  - {{pod: a, egress: 8M, ingress: 8M, window_s: 2, burst_bytes: 100000}}
  - {{pod: b, egress: 8M, ingress: 8M, window_s: 2, burst_bytes: 100000}}
phases:
  - name: over
    duration_s: 6
    flows:
      - {{name: a-to-b, protocol: udp, src: a1, dst: b1, rate: 16M}}
      - {{name: b-to-a, protocol: udp, src: b1, dst: a1, rate: 12M}}
  - name: under
    duration_s: 4
    flows:
      - {{name: a-to-b-under, protocol: udp, src: a1, dst: b1, rate: 4M}}
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    p = tmp_path / "v.yaml"
    p.write_text(SCENARIO.format(topo=ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"))
    return p


def test_virtual_run_holds_the_cap_and_is_deterministic(scenario: Path, tmp_path: Path) -> None:
    runs = [VirtualLabRun(load_scenario(scenario), tmp_path / f"out{i}").run() for i in range(2)]
    r = runs[0]
    assert r.cap_held and r.time == "virtual"
    flows = {f.name: f for f in r.flows}
    assert 0.9 * 8e6 <= flows["a-to-b"].delivered_bps <= 8e6 + 100_000 * 8 / 6 + 1
    assert flows["b-to-a"].delivered_bps >= 0.9 * 8e6
    assert flows["a-to-b-under"].loss_ratio < 0.01
    for res in r.results:
        assert res.max_window_bytes <= res.allowed_window_bytes
        assert res.max_window_bytes > 0.95 * res.allowed_window_bytes  # policed at the cap, not far below
    # Same scenario, same simulated clock: the same bytes in every window.
    assert [x.max_window_bytes for x in runs[1].results] == [x.max_window_bytes for x in r.results]
    assert (tmp_path / "out0" / "throughput.png").is_file()


def test_large_segments_keep_the_cap(scenario: Path, tmp_path: Path) -> None:
    r = VirtualLabRun(load_scenario(scenario), tmp_path / "seg", segment_bytes=16_000).run()
    assert r.cap_held
    # A segment passes or fails whole: the allowance is still met, within one segment of the cap.
    for res in r.results:
        assert res.max_window_bytes > res.allowed_window_bytes - 2 * 16_042


def test_cli_virtual_time(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    res = cli("lab", "run", str(scenario), "--out", str(out), "--time", "virtual", timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "report.json").read_text())["time"] == "virtual"
    res = cli("lab", "run", str(scenario), "--out", str(out), "--time", "virtual", "--target", "bmv2")
    assert res.returncode == 2 and "embedded target only" in res.stderr


def test_nvswitch_bypass_is_measured_as_inter_pod_traffic(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "bmv2-lab" / "scenarios" / "nvswitch-bypass.yaml")
    sc = sc.model_copy(update={"phases": [sc.phases[0].model_copy(update={"duration_s": 4.0})]})
    r = VirtualLabRun(sc, tmp_path).run()
    flows = {f.name: f for f in r.flows}
    assert flows["a1-to-b1-over-nvswitch"].loss_ratio == 0.0  # no limiter on that path
    assert flows["a2-to-b2-capped"].delivered_bps < 20e6 + 2_500_000 * 8 / 4 + 1
    egress = next(x for x in r.results if (x.pod, x.direction) == ("a", "egress"))
    assert not egress.compliant and not r.cap_held
    assert egress.delivered_bps > 100e6  # effective inter-pod bandwidth: five times the cap
    # Counted on the scale-up link itself: every byte of the bypass flow, on the wire.
    assert egress.scaleup_bytes is not None and egress.scaleup_bytes >= 100e6 * 4 / 8 * 0.99
    assert egress.boundary_bytes == egress.receivers_bytes  # nothing here hides from the receivers


def test_window_mode_is_exact_above_4_gib(tmp_path: Path) -> None:
    sc = load_scenario(ROOT / "bmv2-lab" / "scenarios" / "window-5gb.yaml")
    r = VirtualLabRun(sc, tmp_path, segment_bytes=1_000_000).run()
    egress = next(x for x in r.results if (x.pod, x.direction) == ("a", "egress"))
    assert egress.allowed_window_bytes == 5_000_000_000 + MAX_FRAME_BYTES  # rate x window and one frame
    assert egress.compliant and 0.99 * 5_000_000_000 < egress.max_window_bytes <= 5_000_000_000 and 5e9 > 1 << 32
    # Offered twice the cap for 60 s: one full budget at once, then what the sliding window frees.
    assert 1.1e9 < r.flows[0].delivered_bps < 1.4e9


def test_a_dpu_restart_in_virtual_time(tmp_path: Path) -> None:
    """The DPU dies for 2 s and comes back empty: nothing crosses meanwhile, then it is capped again."""
    run = VirtualLabRun(load_scenario(ROOT / "bmv2-lab" / "scenarios" / "dpu-restart.yaml"), tmp_path / "out")
    r = run.run()
    assert r.cap_held
    assert [(e["action"], e["dpu"], e["t_s"]) for e in r.events] == [("restart-dpu", "dpu-a", 5.1)]
    t, bps = run.series[("a", "egress")]
    down = (t > 5.2) & (t < 7.0)
    assert down.any() and (bps[down] == 0).all()  # down: nothing crosses
    assert bps[(t > 8) & (t < 14)].mean() > 0.9 * 8e6  # back, capped at 8 Mbit/s
