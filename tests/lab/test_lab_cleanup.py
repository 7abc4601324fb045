"""Ctrl-C in the middle of a lab run removes everything the run created."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.netns import can_netns
from helpers.paths import ROOT

pytestmark = pytest.mark.netns


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.parametrize(
    ("scenario", "options"),
    [
        ("smoke.yaml", []),
        # Node placement: a crypto engine per node DPU as well (netns.py), started and stopped by the run.
        ("two-pods-nodes.yaml", ["--no-calibrate", "--traffic", "builtin"]),
    ],
)
def test_interrupt_removes_namespaces_links_and_processes(tmp_path: Path, scenario: str, options: list[str]) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpu_limiter.cli",
            "lab",
            "run",
            str(ROOT / "bmv2-lab/scenarios" / scenario),
            "--out",
            str(tmp_path / "out"),
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    prefix = None
    lines = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if m := re.search(r"prefix (dl[0-9a-f]{4})", line):
                prefix = m.group(1)
            if "phase" in line or "converged" in line:
                break
        assert prefix, "".join(lines)
        time.sleep(1.0)  # traffic is starting: interrupt in the middle of the run
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, "".join(lines) + out
    assert "interrupted" in out
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix not in namespaces
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert prefix not in links
    assert [p for p in _processes_mentioning(prefix) if p != os.getpid()] == []
    # The engines' command lines name their stats files in the run's folder, not the prefix.
    assert [p for p in _processes_mentioning(str(tmp_path / "out")) if p != os.getpid()] == []
