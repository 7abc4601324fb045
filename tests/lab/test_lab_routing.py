"""Routing (virtual time): pods on several routers joined by a spine, assigned by the operator or dealt
at random by the verifier and redrawn every period; with router placement (cell shapers where each
router meets the spine) the operator's grouping lifts the cap for a job, with per-pod limiters it
changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dpu_lab.config import ConfigError, load_scenario
from dpu_lab.report import Report
from dpu_lab.routing import cell_name, control_pods
from dpu_lab.runner import LabRun
from dpu_lab.virtual import VirtualLabRun

pytestmark = pytest.mark.timeout(300)

PODS = ["a", "b", "c", "d"]


def scenario(tmp_path: Path, placement: str, routing: dict[str, Any], **extra: Any) -> Path:
    """Four single-host pods on two routers, each capped at 5 Mbit/s; a and b train with a ring."""
    doc = {
        "name": "routing",
        "topology": {
            "name": "routing",
            "routers": ["r1", "r2"],
            "routing": routing,
            "pods": [
                {"name": p, "subnet": f"10.0.{i}.0/24", "hosts": [f"{p}1"], "placement": placement}
                for i, p in enumerate(PODS, 1)
            ],
        },
        "caps": [{"pod": p, "egress": "5M", "ingress": "5M", "window_s": 1, "burst_bytes": 50_000} for p in PODS],
        "phases": [
            {
                "name": "train",
                "duration_s": 6,
                "workloads": [
                    {"kind": "allreduce-ring", "pods": ["a", "b"], "model_params": 1e8, "step_s": 1, "link_bps": 4e7}
                ],
            }
        ],
        **extra,
    }
    path = tmp_path / f"routing-{placement}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


GROUPED = {"assign": "operator", "pods": {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}}


def run(tmp_path: Path, placement: str, routing: dict[str, Any]) -> Report:
    """Run the scenario in virtual time."""
    sc = load_scenario(scenario(tmp_path, placement, routing))
    return VirtualLabRun(sc, tmp_path / f"out-{placement}-{routing['assign']}", segment_bytes=8000).run()


def test_operator_grouping_lifts_a_cell_shaper_but_not_per_pod_limiters(tmp_path: Path) -> None:
    per_pod = run(tmp_path, "pod-uplink", GROUPED)
    assert per_pod.cap_held
    assert per_pod.workloads[0]["effective_bps"] <= 5e6 + 50_000 * 8 / 6 + 1
    cells = run(tmp_path, "router", GROUPED)
    # a and b share r1's cell: the ring never reaches a limiter and runs at the link's 40 Mbit/s.
    assert not cells.cap_held
    assert cells.workloads[0]["effective_bps"] >= 0.95 * 4e7
    assert cells.routing is not None and cells.routing["assignments"][0]["routers"] == GROUPED["pods"]


def test_randomised_routing_is_redrawn_and_cells_follow(tmp_path: Path) -> None:
    routing = {"assign": "randomised", "period_s": 2, "seed": 3}
    sc = load_scenario(scenario(tmp_path, "router", routing))
    draws = [sc.topology.assignment(k) for k in range(4)]
    for d in draws:  # dealt evenly over the routers
        assert sorted(d.values()) == ["r1", "r1", "r2", "r2"]
    assert len({tuple(sorted(d.items())) for d in draws}) > 1
    assert draws == [sc.topology.assignment(k) for k in range(4)]  # the same seed, the same draws
    r = VirtualLabRun(sc, tmp_path / "out", segment_bytes=8000).run()
    assert r.routing is not None
    assert [a["t_s"] for a in r.routing["assignments"]] == [0.0, 2.0, 4.0, 6.0]
    assert [a["routers"] for a in r.routing["assignments"]] == draws
    # Each cell holds its pods' prefixes and the sum of their caps.
    cells = {c.name: c for c in control_pods(sc, draws[-1])}
    for router in ("r1", "r2"):
        cell = cells[cell_name(router)]
        assert len(cell.prefixes) == 2 and cell.cap is not None and cell.cap.egress == 10e6


def test_routing_errors_name_the_field(tmp_path: Path) -> None:
    cases = [
        ({"assign": "operator", "pods": {"zz": "r1"}}, "pod-uplink", r"routing.pods: unknown pod 'zz'"),
        ({"assign": "operator", "pods": {"a": "r9"}}, "pod-uplink", r"routing.pods.a: unknown router 'r9'"),
        ({"assign": "operator", "period_s": 5}, "pod-uplink", "period_s: only a randomised assignment is redrawn"),
        ({"assign": "randomised", "pods": {"a": "r1"}}, "pod-uplink", "pods: a randomised assignment"),
        ({"assign": "operator"}, "router", r"routing.pods: routers \['r2'\] get no pod"),
    ]
    for routing, placement, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_scenario(scenario(tmp_path, placement, routing))
    with pytest.raises(ConfigError, match="audit.checks: conservation"):
        load_scenario(scenario(tmp_path, "router", GROUPED, audit={"interval_s": 1}))
    with pytest.raises(ConfigError, match="more than one router, router placement: modelled in virtual time only"):
        LabRun(load_scenario(scenario(tmp_path, "router", GROUPED)), tmp_path / "rt").run()
