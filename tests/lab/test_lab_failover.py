"""Failover under traffic (issue 17, step 3): `dpu-limiter lab run bmv2-lab/scenarios/failover.yaml` with the
control plane as three replicas on a throwaway PostgreSQL cluster (helpers/postgres.py), as a user runs it.

Mid-flow the replica primary for pod a's DPUs is killed (kill -9), the database is stopped and started again,
two replicas start at once, and the replica primary for pod b's DPU is cut off from the database (on bmv2, the
kill alone, to keep the module's runtime modest). Asserted
are the guarantees, not timings: every cap held on the wire, no DPU's lease lapsed or fell to its floor (read
over P4Runtime every 0.1 s, and the DPUs' own lease-drop counters at 0), and after the kill a backup was
primary and writing within a third of the DPUs' lease the scenario sets.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dpu_lab.config import ConfigError, Scenario, load_scenario
from helpers import postgres
from helpers.netns import can_netns
from helpers.paths import ROOT
from helpers.processes import cli

FAILOVER = ROOT / "bmv2-lab" / "scenarios" / "failover.yaml"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[postgres.Cluster, Path]]:
    """A throwaway cluster for the module, and a command that stops and starts it (`CMD stop`, `CMD start`)."""
    if why := postgres.unavailable():
        pytest.skip(f"replicas on PostgreSQL: {why}")
    with postgres.cluster() as c:
        ctl = c.ctl_script(c.root / "pgctl.sh")
        yield c, ctl


def kill_only(tmp_path: Path) -> Path:
    """failover.yaml with its kill alone, in 16 s of traffic."""
    doc = yaml.safe_load(FAILOVER.read_text())
    doc["topology"] = str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml")
    phase = doc["phases"][0]
    phase["duration_s"] = 16
    phase["events"] = [e for e in phase["events"] if e["action"] == "kill-replica"]
    path = tmp_path / "failover-kill.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_failover(tmp_path: Path, target: str, scenario: Path, url: str, ctl: Path) -> dict:  # type: ignore[type-arg]
    """The scenario as a user runs it; checks it left nothing behind (network, processes, the run's schema)."""
    out = tmp_path / target
    res = cli(
        *("lab", "run", str(scenario), "--out", str(out), "--target", target, "--traffic", "builtin"),
        *("--no-calibrate", "--control-db", url, "--control-db-ctl", str(ctl)),
        timeout=400,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    prefix = re.search(r"prefix (dl[0-9a-f]{4})", res.stderr)
    assert prefix, res.stderr[-2000:]
    for what in (["ip", "netns", "list"], ["ip", "-br", "link"]):
        assert prefix.group(1) not in subprocess.run(what, capture_output=True, text=True).stdout
    report = json.loads((out / "report.json").read_text())
    assert "## Failover" in (out / "summary.md").read_text()
    import psycopg

    with psycopg.connect(url) as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'dpu_lab_%'").fetchall()
    assert left == [], left
    pids = [e["pid"] for e in report["failover"]["events"] if "pid" in e]
    pids += [p for e in report["failover"]["events"] for p in e.get("pids", [])]
    for pid in pids:  # the replicas it killed and started: none still running
        assert not Path(f"/proc/{pid}").exists() or "serve" not in Path(f"/proc/{pid}/cmdline").read_text()
    return report  # type: ignore[no-any-return]


def check_failover(report: dict, actions: list[str]) -> None:  # type: ignore[type-arg]
    # The cap held on the wire, every pod and direction, through every event.
    assert len(report["results"]) == 4
    for r in report["results"]:
        assert r["compliant"] and r["max_window_bytes"] <= r["allowed_window_bytes"], r
    f = report["failover"]
    assert f["replicas"] == 3 and f["lease_s"] == 24
    events = {e["action"]: e for e in f["events"]}
    assert list(events) == actions
    assert all("error" not in e for e in f["events"]), f["events"]
    # No DPU's lease lapsed or fell to its floor: sampled on the DPUs, and their own lease-drop counters.
    assert sorted(f["least_lease_left_s"]) == ["dpu-a", "dpu-b"]
    assert all(v > 0 for v in f["least_lease_left_s"].values()), f["least_lease_left_s"]
    assert f["lapsed_dpus"] == [] and f["floored_dpus"] == []
    drops = f["lease_dropped_bytes"]  # read from each DPU itself, whichever replica holds it
    assert len(drops) == 4 and set(drops.values()) == {0}, drops
    # Killed: a backup is primary and writing (the DPUs hold its lease) within a third of a lease.
    kill = events["kill-replica"]
    assert kill.get("takeover_s") is not None and kill["takeover_s"] < f["lease_s"] / 3, kill
    assert kill["replica"] not in kill["new_holders"].values() and set(kill["new_holders"]) == set(kill["dpus"])
    if len(actions) == 1:
        return
    # The database restarted: every DPU held once and leased again.
    assert events["restart-db"].get("settled_after_s") is not None, events["restart-db"]
    # Cut off: it stopped writing before its lease in the database could end, and the fleet settled once it was
    # back. (The cut drops its connections, so the database ends its session and the others may take its DPU
    # first: each DPU then refuses its writes, the others having bid higher; the caps and leases above held.)
    cut = events["cut-replica-db"]
    assert cut.get("stopped_writing_s") is not None and cut["stopped_writing_s"] < f["replica_lease_s"], cut
    assert cut.get("back_s") is not None, cut
    # Two started at once: both joined, and the DPUs settled on one holder each that every replica names.
    joined = events["start-replicas-at-once"]
    assert joined["replicas"] == ["r4", "r5"] and joined.get("settled_s") is not None, joined
    # Its session ended by the database: a new one within its grace, and it held on (nobody took its DPUs, it
    # stopped nothing).
    ended = events["end-replica-session"]
    assert ended.get("new_session_s") is not None and ended["taken_by_others_s"] is None, ended
    assert not ended["fenced"], ended
    # Stopped (SIGSTOP) past its lease: another took its DPU meanwhile; continued, it stopped writing, and the
    # fleet settled again.
    paused = events["pause-replica"]
    assert paused.get("takeover_s") is not None and paused.get("back_s") is not None, paused
    assert paused["fenced"], paused


@pytest.mark.netns
@pytest.mark.timeout(600)
@pytest.mark.parametrize("target", ["embedded", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def test_failover_under_traffic_keeps_every_lease_and_the_cap(
    cluster: tuple[postgres.Cluster, Path], tmp_path: Path, target: str
) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if target == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    c, ctl = cluster
    every = [
        "kill-replica",
        "restart-db",
        "start-replicas-at-once",
        "cut-replica-db",
        "end-replica-session",
        "pause-replica",
    ]
    scenario, actions = (FAILOVER, every) if target == "embedded" else (kill_only(tmp_path), every[:1])
    report = run_failover(tmp_path, target, scenario, c.database(), ctl)
    check_failover(report, actions)
    f = report["failover"]
    print(
        f"{target}: "
        + "; ".join(
            f"{e['action']} " + ", ".join(f"{k} {e[k]}" for k in e if k.endswith("_s") and k != "t_s")
            for e in f["events"]
        )
        + f"; least lease left {f['least_lease_left_s']}"
    )


def test_replicas_without_a_database_are_refused_naming_the_field(tmp_path: Path) -> None:
    res = cli("lab", "run", str(FAILOVER), "--out", str(tmp_path / "o"), "--no-calibrate", timeout=60)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "control_plane.replicas" in res.stderr and "--control-db" in res.stderr
    assert not (tmp_path / "o" / "report.json").exists()
    res = cli("lab", "run", str(FAILOVER), "--out", str(tmp_path / "v"), "--time", "virtual", timeout=60)
    assert res.returncode == 2 and "real time only" in res.stderr, res.stderr[-2000:]


def scenario_with(**changes: object) -> dict:  # type: ignore[type-arg]
    """failover.yaml as a document, with top-level changes."""
    sc = load_scenario(FAILOVER)
    return {**sc.model_dump(), **changes}


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"control_plane": {"replicas": 1}}, "needs control_plane.replicas of 2 or more"),
        ({"control_plane": {"replicas": 3, "replica_lease_s": 3}}, "control_plane.replica_lease_s"),
        ({"audit": {"interval_s": 1.0}}, "audit: not yet with control_plane.replicas > 1"),
    ],
)
def test_scenario_refusals_name_the_field(changes: dict, named: str) -> None:  # type: ignore[type-arg]
    from pydantic import ValidationError

    with pytest.raises((ValidationError, ConfigError)) as err:
        Scenario.model_validate(scenario_with(**changes))
    text = str(err.value).replace("\n", " ")
    assert all(part in text for part in named.split(".")), text


def test_replica_events_take_a_pod_only_where_they_act_on_one() -> None:
    from pydantic import ValidationError

    doc = scenario_with()
    for event, why in (
        ({"at_s": 1, "action": "kill-replica"}, "kill-replica needs the pod"),
        ({"at_s": 1, "action": "restart-db", "pod": "a"}, "acts on no pod"),
        ({"at_s": 1, "action": "kill-replica", "pod": "a", "count": 2}, "count: only start-replicas-at-once"),
        ({"at_s": 1, "action": "cut-replica-db", "pod": "nosuch"}, "'nosuch' is not a pod with DPUs"),
    ):
        doc["phases"][0]["events"] = [event]
        with pytest.raises(ValidationError) as err:
            Scenario.model_validate(doc)
        assert why in str(err.value), err.value
    # The driver never sees them: the real-time runner carries them out.
    stripped = load_scenario(FAILOVER).without_replica_events()
    assert [e for ph in stripped.phases for e in ph.events] == []
