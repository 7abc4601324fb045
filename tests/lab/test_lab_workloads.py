"""Workloads in a virtual-time lab run: their streams are sent, capped and reported, and the report
turns the effective inter-pod rate into a training slowdown."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dpu_lab.config import ConfigError, load_scenario
from dpu_lab.runner import LabRun
from dpu_lab.virtual import VirtualLabRun
from helpers.paths import ROOT

pytestmark = pytest.mark.timeout(300)


def scenario(tmp_path: Path, workloads: list[dict[str, object]], duration_s: float = 6) -> Path:
    doc = {
        "name": "workloads",
        "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"),
        "caps": [
            {"pod": p, "egress": "8M", "ingress": "8M", "window_s": 2, "burst_bytes": 100_000} for p in ("a", "b")
        ],
        "phases": [{"name": "p", "duration_s": duration_s, "workloads": workloads}],
    }
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_an_allreduce_ring_is_capped_and_its_slowdown_reported(tmp_path: Path) -> None:
    ring = {"kind": "allreduce-ring", "pods": ["a", "b"], "model_params": 1e7, "step_s": 1, "link_bps": 16e6}
    r = VirtualLabRun(load_scenario(scenario(tmp_path, [ring])), tmp_path / "out").run()
    assert r.cap_held
    assert {f.name for f in r.flows} == {
        "allreduce-ring a1->b1 (saturated: 20 MB per step needs 10 s at 16 Mbit/s > 1 s step)",
        "allreduce-ring b1->a1 (saturated: 20 MB per step needs 10 s at 16 Mbit/s > 1 s step)",
    }
    [w] = r.workloads
    # 2 x (P-1)/P x 10M parameters x 2 bytes = 20 MB per step; through about 8 Mbit/s: 20 s instead of 1 s.
    assert w["volume_per_step_bytes"] == 20e6 and w["step_s"] == 1
    assert 0.9 * 8e6 < w["effective_bps"] < 8e6 + 100_000 * 8 / 6
    assert 19 < w["slowdown"] < 23
    assert "slowdown" in (tmp_path / "out" / "summary.md").read_text()


def test_on_off_and_exfiltration_streams(tmp_path: Path) -> None:
    onoff = {"kind": "on-off", "src": "a1", "dst": "b1", "rate": 4e6, "on_s": 1, "off_s": 1}
    exfil = {"kind": "exfiltration", "src": "b1", "dst": "a1", "total_bytes": 1e6, "rate": 4e6, "start_s": 1}
    r = VirtualLabRun(load_scenario(scenario(tmp_path, [onoff, exfil])), tmp_path / "out").run()
    flows = {f.name.split()[0]: f for f in r.flows}
    # Under the cap nothing is lost: on half the time at 4 Mbit/s; 1 MB in 2 s, over a 6 s phase.
    assert flows["on-off"].loss_ratio == 0 and 1.9e6 < flows["on-off"].delivered_bps < 2.1e6
    assert flows["exfiltration"].loss_ratio == 0
    assert flows["exfiltration"].delivered_bps * 6 / 8 == pytest.approx(1e6, rel=0.01)
    assert [w["kind"] for w in r.workloads] == ["on-off", "exfiltration"]
    assert all("slowdown" not in w for w in r.workloads)


def test_workloads_are_checked_and_virtual_only(tmp_path: Path) -> None:
    bad = {"kind": "constant", "src": "a1", "dst": "zz9", "rate": 1e6}
    with pytest.raises(ConfigError, match=r"phases\[0\]\.workloads\[0\].*zz9"):
        load_scenario(scenario(tmp_path, [bad]))
    with pytest.raises(ConfigError, match="compression"):
        load_scenario(
            scenario(
                tmp_path,
                [{"kind": "allreduce-ring", "pods": ["a", "b"], "model_params": 1, "step_s": 1, "compression": 0.5}],
            )
        )
    ok = {"kind": "constant", "src": "a1", "dst": "b1", "rate": 1e6}
    with pytest.raises(ConfigError, match="workloads"):
        LabRun(load_scenario(scenario(tmp_path, [ok])), tmp_path / "real").run()
