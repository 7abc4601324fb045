"""Two network namespaces joined by a veth pair, and lab endpoints run inside them (shared by the
traffic-generator tests)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dpu_lab

LAB_PATH = str(Path(dpu_lab.__file__).resolve().parent.parent)


@dataclass
class NsPair:
    """Two namespaces joined by a veth pair: A (sender side) and B (receiver side)."""

    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    ip_a: str
    ip_b: str


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def start(ns: str, module: str, args: Sequence[str], out: Path) -> subprocess.Popen[bytes]:
    """Start ``python -m module args --out out`` inside namespace ``ns``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [LAB_PATH, os.environ.get("PYTHONPATH")])))
    command = ["ip", "netns", "exec", ns, sys.executable, "-m", module, *args, "--out", str(out)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Wait for the processes; kill those still running at the timeout; require exit 0."""
    deadline = time.monotonic() + timeout_s
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            assert proc.returncode == 0, f"{proc.args!r} failed: {err.decode()}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def load(path: Path) -> Any:
    return json.loads(path.read_text())


PACKET_OUTGOING = 4  # a packet socket's own sends, as recvfrom's address names them


def received(s: socket.socket, keep: Callable[[bytes], bool]) -> list[bytes]:
    """The frames `s` has received so far (not its own sends) that `keep` takes, without waiting; closes `s`."""
    s.setblocking(False)
    out = []
    while True:
        try:
            data, addr = s.recvfrom(65535)
        except BlockingIOError:
            break
        if addr[2] != PACKET_OUTGOING and keep(data):
            out.append(data)
    s.close()
    return out


def can_netns() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs the 'ip' command (iproute2)"
    return None
