"""What a failover run reports and how it ends, from the lab's own structures, with no namespaces and no database
(replicas_lab.py, runner.py, cli.py): the red team's findings of 2026-12-04 on the lab's side (docs/lab.md).

- an event that found no primary for its pod (end-replica-session) left its record without down_s, and the
  summary failed with a KeyError: no report at all; such skipped events were errors in report.json, yet the run
  exited 0;
- a run whose DPU leases lapsed or fell to their floor said "cap held" and exited 0;
- the API's front joined connections to a paused (SIGSTOP) replica, so a set-cap hung until the pause ended,
  and events due meanwhile ran late, the report giving only when they were due.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from dpu_lab.cli import exit_status
from dpu_lab.config import Scenario, load_scenario
from dpu_lab.evaluate import LabDpu
from dpu_lab.outcome import event_record, finish
from dpu_lab.replicas_lab import ControlDb, Failover, ProxyHost, Replica, Snapshot, markdown
from dpu_lab.report import Report, Result
from dpu_lab.runner import LabRun
from helpers.paths import ROOT
from helpers.processes import free_port, stop, wait_port

FAILOVER = ROOT / "bmv2-lab" / "scenarios" / "failover.yaml"
URL = "postgresql://lab@127.0.0.1:1/none"  # never connected to: nothing here reaches the database


def scenario(tmp_path: Path, events: list[dict[str, object]]) -> Scenario:
    """failover.yaml with only these events."""
    doc = yaml.safe_load(FAILOVER.read_text())
    doc["topology"] = str(FAILOVER.parent / doc["topology"])
    doc["phases"][0]["events"] = events
    path = tmp_path / "failover.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


def failover(tmp_path: Path, sc: Scenario, leases: list[dict[str, float]]) -> Failover:
    """The run's Failover as it stands once the run started (time zero 5 s ago), with no replica answering, and
    the watch's samples: each DPU's lease left in each (0: at its floor)."""
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    f = Failover(sc, URL, None, raw, [], lambda text: None)
    f.db = ControlDb(URL, [], raw / "control-db-ctl.log")
    f.dpus = [
        LabDpu("dpu-a", "pod-uplink", "a", "127.0.0.1:1", 1),
        LabDpu("dpu-b", "pod-uplink", "b", "127.0.0.1:2", 2),
    ]
    f._t_start = time.time() - 5.0
    for i, left in enumerate(leases):
        gens = {d: (0 if v == 0.0 else 7) for d, v in left.items()}
        f.snapshots.append(Snapshot(0.1 * i, {}, dict(left), gens))
    return f


def report_of(results_held: bool) -> Report:
    """A report whose cap held (or not) on pod a's egress."""
    over = 2_000_000 if results_held else 9_000_000
    result = Result.evaluate("a", "egress", 8e6, 2.0, 1_000_000, over, 8e6)
    return Report(scenario="failover", target="embedded", duration_s=62.0, results=[result], flows=[])


def ended(tmp_path: Path, sc: Scenario, f: Failover, report: Report) -> tuple[dict, str]:  # type: ignore[type-arg]
    """The run's end as runner.py does it: the failover figures added (annotate), the report written (finish),
    the failover section added to it; report.json and summary.md as read back."""
    lab = LabRun(sc, tmp_path / "out")
    lab.failover = f
    asyncio.run(lab.annotate(report))
    finish(sc, lab.out_dir, report, {}, report.events, None, {}, lambda text: None)
    assert lab._failover_summary is not None
    lab._write_failover(lab._failover_summary)
    return json.loads((lab.out_dir / "report.json").read_text()), (lab.out_dir / "summary.md").read_text()


def test_an_event_that_finds_no_primary_is_reported_skipped_and_the_run_fails(tmp_path: Path) -> None:
    sc = scenario(tmp_path, [{"at_s": 1, "action": "end-replica-session", "pod": "a", "down_s": 4}])
    f = failover(tmp_path, sc, [{"dpu-a": 20.0, "dpu-b": 20.0}])

    async def due_and_run() -> None:
        f.schedule(0, 0.0)  # due 1 s into the run, which is 5 s in: it runs late
        f.tick(f._now())
        await f.finish_events(grace_s=30)

    asyncio.run(due_and_run())
    report = report_of(results_held=True)
    doc, summary = ended(tmp_path, sc, f, report)
    # The report was written, the event in it as skipped, with when it was due and when it ran.
    [rec] = doc["failover"]["events"]
    assert rec["action"] == "end-replica-session" and rec["pod"] == "a", rec
    assert "no one replica shows pod a's DPUs primary" in rec["error"], rec
    assert rec["scheduled_t_s"] == 1.0 and rec["t_s"] > rec["scheduled_t_s"] + 3, rec
    [top] = [e for e in doc["events"] if e["action"] == "end-replica-session"]
    assert "error" in top and top["scheduled_t_s"] == 1.0, top
    # The scenario did not run as written: the run fails, saying why, though the cap held.
    assert report.cap_held and exit_status(report) == 4
    [why] = doc["failures"]
    assert "not run as written: end-replica-session of pod a (due at 1.0 s) was skipped" in why, why
    assert "The run failed**, though the cap held" in summary and why in summary, summary
    assert "## Failover" in summary and "(due 1.00)" in summary and "error: RuntimeError" in summary, summary


@pytest.mark.parametrize("held", [True, False])
def test_a_lease_that_lapsed_fails_the_run_though_the_cap_held(tmp_path: Path, held: bool) -> None:
    sc = scenario(tmp_path, [])
    f = failover(tmp_path, sc, [{"dpu-a": 3.0, "dpu-b": 20.0}, {"dpu-a": 0.0, "dpu-b": 19.9}])
    report = report_of(held)
    doc, summary = ended(tmp_path, sc, f, report)
    assert doc["failover"]["lapsed_dpus"] == ["dpu-a"] and doc["failover"]["floored_dpus"] == ["dpu-a"]
    assert any(w.startswith("outage: the lease of dpu-a lapsed") for w in doc["failures"]), doc["failures"]
    assert any("dpu-a fell to the floor" in w for w in doc["failures"]), doc["failures"]
    # An outage fails the run (4); a cap broken says so first (3).
    assert exit_status(report) == (4 if held else 3)
    assert "**The run failed**" in summary and "outage: the lease of dpu-a lapsed" in summary, summary
    assert ("though the cap held" in summary) == held


def test_a_clean_failover_summary_exits_0(tmp_path: Path) -> None:
    sc = scenario(tmp_path, [])
    f = failover(tmp_path, sc, [{"dpu-a": 20.0, "dpu-b": 20.0}])
    report = report_of(results_held=True)
    doc, summary = ended(tmp_path, sc, f, report)
    assert doc["failures"] == [] and exit_status(report) == 0 and "The run failed" not in summary
    assert "Least lease left over the run: dpu-a 20.00 s" in markdown(doc["failover"])


def test_a_kill_with_no_replica_to_spare_is_skipped_saying_so(tmp_path: Path) -> None:
    sc = scenario(tmp_path, [{"at_s": 1, "action": "kill-replica", "pod": "a"}])
    f = failover(tmp_path, sc, [{"dpu-a": 20.0, "dpu-b": 20.0}])
    # The scenario's counts hold at load, but a replica may exit on its own: here only one is left.
    with replica_process("r1") as (port, popen):
        f.replicas = [Replica("r1", port, popen, tmp_path / "r1.log", None)]

        async def due_and_run() -> None:
            f.schedule(0, 0.0)
            f.tick(f._now())
            await f.finish_events(grace_s=10)

        asyncio.run(due_and_run())
        assert popen.poll() is None  # not killed
    [rec] = f.records
    assert "no live replica left to kill (only r1, which would leave none to serve the API)" in rec["error"], rec


def test_driver_events_record_when_they_were_due_and_when_they_ran() -> None:
    ev = load_scenario(ROOT / "bmv2-lab" / "scenarios" / "dpu-restart.yaml").phases[0].events[0]
    rec = event_record(ev, 9.5, 5.0)
    assert rec["t_s"] == 9.5 and rec["scheduled_t_s"] == 5.0 and rec["down_s"] == ev.down_s


# ---------------------------------------------------------------------------------------------- the API's front

SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[2].encode())
    c.close()
"""


@contextmanager
def replica_process(name: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A stand-in for a replica's API: a process listening on a loopback port that answers each connection with
    its name (its port and handle); stopped by its handle."""
    port = free_port()
    popen = subprocess.Popen([sys.executable, "-c", SERVER, str(port), name])
    try:
        wait_port(port, popen)
        yield port, popen
    finally:
        if popen.poll() is None:
            popen.send_signal(signal.SIGCONT)  # a stopped process would not act on SIGTERM
        stop(popen)


def through(port: int, timeout_s: float = 3.0) -> bytes:
    """What a new connection to `port` is answered with (b"" if nothing within `timeout_s`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        data = b""
        try:
            while chunk := s.recv(64):
                data += chunk
        except TimeoutError:
            pass
        return data


@pytest.fixture
def host() -> Iterator[ProxyHost]:
    h = ProxyHost()
    try:
        yield h
    finally:
        h.close()


def test_the_api_front_skips_a_paused_replica_while_it_is_paused(tmp_path: Path, host: ProxyHost) -> None:
    f = Failover(load_scenario(FAILOVER), URL, None, tmp_path, [], lambda text: None)
    with replica_process("r1") as (p1, r1), replica_process("r2") as (p2, r2):
        f.replicas = [
            Replica("r1", p1, r1, tmp_path / "r1.log", None),
            Replica("r2", p2, r2, tmp_path / "r2.log", None),
        ]
        front = host.forwarder(f.api_upstreams)
        assert through(front.port) == b"r1"  # the first that accepts
        # Paused as pause-replica does it: its kernel still completes connections, but nothing answers.
        f.replicas[0].paused = True
        r1.send_signal(signal.SIGSTOP)
        assert through(front.port) == b"r2"
        r1.send_signal(signal.SIGCONT)
        f.replicas[0].paused = False
        assert through(front.port) == b"r1"
        f.replicas[0].killed = True  # killed ones were skipped already
        assert through(front.port) == b"r2"
