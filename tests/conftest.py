"""Shared fixtures: real processes and servers on loopback, real namespaces where marked."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
P4INFO = ROOT / "p4" / "limiter.p4info.txtpb"
BMV2_JSON = ROOT / "p4" / "limiter.json"


def free_port() -> int:
    """A loopback TCP port that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Wait until `port` accepts connections (or the process died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port} after {timeout} s")


def can_netns() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs the 'ip' command (iproute2)"
    return None


@pytest.fixture
def embedded_target() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """An embedded target process with no pipeline and no ports, serving P4Runtime on loopback."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "p4sim.main",
            "--device-id",
            "1",
            "--no-p4",
            "--",
            "--grpc-server-addr",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_port(port, proc)
        yield f"127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)
