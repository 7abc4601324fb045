"""`dpu-limiter lab sweep`: a grid of virtual-time runs in parallel, one CSV row and one bar per point."""

from __future__ import annotations

import contextlib
import csv
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dpu_lab.config import ConfigError
from dpu_lab.sweep import load_sweep
from helpers.paths import ROOT
from helpers.processes import cli, stop

pytestmark = pytest.mark.timeout(600)


def test_a_small_sweep_runs_every_point(tmp_path: Path) -> None:
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "small",
                "scenario": str(ROOT / "bmv2-lab" / "scenarios" / "compromised-dpu.yaml"),
                "axes": {"cap": ["10M"], "placement": ["pod-uplink"], "attack": ["none", "raise-meter+forge"]},
                "attack_at_s": 5,
            }
        )
    )
    _, base = load_sweep(sweep)
    assert [c.pod for c in base.caps] == ["a", "b"]
    out = tmp_path / "out"
    res = cli("lab", "sweep", str(sweep), "--out", str(out), "--jobs", "2", timeout=500)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert [r["attack"] for r in rows] == ["none", "raise-meter+forge"]
    clean, attacked = rows
    assert clean["compliant"] == "True" and clean["detected"] == "False" and clean["false_alarms"] == "0"
    # The cap axis caps every pod: b's honest DPU still holds a's traffic to b's 10 Mbit/s ingress cap,
    # but more than a's cap left pod a over its router link (counted there, whatever it held), so a's
    # egress did not hold, while the audit catches a's lying DPU.
    assert attacked["compliant"] == "False" and attacked["detected"] == "True"
    held = {
        (r["pod"], r["direction"]): r["compliant"]
        for r in json.loads((out / "cap-10M_pod-uplink_raise-meter-forge" / "report.json").read_text())["results"]
    }
    assert held == {("a", "egress"): False, ("a", "ingress"): True, ("b", "egress"): True, ("b", "ingress"): True}
    assert "conservation" in attacked["detected_by"] and attacked["false_alarms"] == "0"
    assert 0 < float(attacked["time_to_detection_s"]) <= 1.0
    assert (out / "sweep.png").is_file() and (out / "cap-10M_pod-uplink_none" / "report.json").is_file()


def test_bad_sweep_files_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "scenario": "nope.yaml", "axes": {"attack": ["melt"]}}))
    with pytest.raises(ConfigError, match="attack"):
        load_sweep(bad)
    bad.write_text(yaml.safe_dump({"name": "x", "scenario": "nope.yaml", "axes": {"cap": ["fast"]}}))
    with pytest.raises(ConfigError, match="cap"):
        load_sweep(bad)
    scenario = str(ROOT / "bmv2-lab" / "scenarios" / "compromised-dpu.yaml")
    bad.write_text(yaml.safe_dump({"name": "x", "scenario": scenario, "cap_pods": ["zz"]}))
    with pytest.raises(ConfigError, match=r"cap_pods.*zz"):
        load_sweep(bad)


def test_routing_and_router_placement_axes_make_valid_points(tmp_path: Path) -> None:
    from dpu_lab.sweep import grid, scenario_at

    sweep = tmp_path / "r.yaml"
    doc = {
        "name": "r",
        "scenario": str(ROOT / "bmv2-lab" / "scenarios" / "routing.yaml"),
        "axes": {"placement": ["pod-uplink", "router"], "routing": ["operator", "randomised"], "attack": ["none"]},
        "routing_period_s": 5,
    }
    sweep.write_text(yaml.safe_dump(doc))
    spec, base = load_sweep(sweep)
    points = {(p.placement, p.routing): scenario_at(base, spec, p) for p in grid(spec)}
    assert len(points) == 4
    rand = points[("router", "randomised")].topology
    assert rand.routing.assign == "randomised" and rand.routing.period_s == 5
    assert {p.placement for p in rand.pods} == {"router"}
    op = points[("pod-uplink", "operator")].topology
    assert op.routing == base.topology.routing  # the topology's own (operator) assignment
    # An attack on router placement audits without conservation (router placement has no pod DPUs).
    doc["axes"] = {"placement": ["router"], "attack": ["raise-meter"]}
    sweep.write_text(yaml.safe_dump(doc))
    spec, base = load_sweep(sweep)
    sc = scenario_at(base, spec, grid(spec)[0])
    assert sc.audit is not None and "conservation" not in sc.audit.checks
    assert sc.phases[0].events[0].dpu == "dpu-r1"


@contextlib.contextmanager
def dask_cluster(tmp_path: Path, workers: int = 2) -> Iterator[str]:
    """A Dask scheduler and `workers` single-threaded workers on loopback, as processes of their own (started
    here, stopped by their PIDs); yields the scheduler's address."""
    dask = shutil.which("dask", path=str(Path(sys.executable).parent))
    if dask is None:
        pytest.skip("needs the dask command (the cluster extra)")
    info = tmp_path / "scheduler.json"
    log = (tmp_path / "dask.log").open("wb")
    procs = [
        subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--scheduler-file", str(info), "--no-dashboard"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert info.exists(), (tmp_path / "dask.log").read_text()[-2000:]
        cmd = [dask, "worker", "--scheduler-file", str(info), "--nworkers", str(workers), "--nthreads", "1"]
        procs.append(subprocess.Popen([*cmd, "--no-dashboard"], stdout=log, stderr=subprocess.STDOUT))
        yield str(json.loads(info.read_text())["address"])
    finally:
        for p in reversed(procs):
            stop(p)
        log.close()


def test_a_sweep_on_a_dask_cluster_writes_the_same_csv_as_a_local_one(tmp_path: Path) -> None:
    """`lab sweep --scheduler` hands the points to a Dask cluster (here a scheduler and two worker processes
    on loopback, started by the test and stopped with it); virtual time makes every point's figures the
    same wherever it ran."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "cluster",
                "scenario": str(ROOT / "bmv2-lab" / "scenarios" / "compromised-dpu.yaml"),
                "axes": {"cap": ["10M", "20M"], "attack": ["none"]},
            }
        )
    )
    local = tmp_path / "local"
    res = cli("lab", "sweep", str(sweep), "--out", str(local), "--jobs", "2", timeout=500)
    assert res.returncode == 0, res.stderr[-2000:]
    with dask_cluster(tmp_path) as address:
        on_cluster = tmp_path / "cluster"
        res = cli("lab", "sweep", str(sweep), "--out", str(on_cluster), "--scheduler", address, timeout=500)
        assert res.returncode == 0, res.stderr[-2000:]
    assert (on_cluster / "sweep.csv").read_text() == (local / "sweep.csv").read_text()
    assert len((local / "sweep.csv").read_text().splitlines()) == 3  # a header and a row per point
    assert (on_cluster / "cap-20M_base_none" / "report.json").is_file()


def test_a_scheduler_that_does_not_answer_is_named(tmp_path: Path) -> None:
    pytest.importorskip("distributed", reason="needs Dask's distributed (the cluster extra)")
    sweep = tmp_path / "s.yaml"
    scenario = str(ROOT / "bmv2-lab" / "scenarios" / "compromised-dpu.yaml")
    sweep.write_text(yaml.safe_dump({"name": "x", "scenario": scenario, "axes": {"cap": ["10M"]}}))
    res = cli("lab", "sweep", str(sweep), "--out", str(tmp_path / "o"), "--scheduler", "tcp://127.0.0.1:9", timeout=120)
    assert res.returncode == 2 and "--scheduler tcp://127.0.0.1:9" in res.stderr, res.stderr[-2000:]
