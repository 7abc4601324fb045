"""Processes the tests start on loopback (the CLI, the embedded target) and ports for them."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from dpu_limiter.units import CPU_PORT


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


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`dpu-limiter ARGS` as a user types it (this interpreter's copy), output captured."""
    command = [sys.executable, "-m", "dpu_limiter.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def start_embedded(
    port: int, log: Path, options: list[str] | None = None, cpu_port: int | None = CPU_PORT
) -> subprocess.Popen[bytes]:
    """The embedded target as a process with no pipeline, serving P4Runtime on 127.0.0.1:port
    (`options`: more of simple_switch_grpc's options, e.g. `-i PORT@IF` or the TLS ones), with its
    CPU port where limiter.p4 reads the clock."""
    with log.open("ab") as out:  # a file, not a pipe: nobody drains a pipe while a test runs
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dpu_softswitch.main",
                "--device-id",
                "1",
                *(options or []),
                *(["--cpu-port", str(cpu_port)] if cpu_port is not None else []),
                "--no-p4",
                "--",
                "--grpc-server-addr",
                f"127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_port(port, proc)
    except (RuntimeError, TimeoutError) as exc:
        stop(proc)
        raise RuntimeError(f"{exc}\n--- target log\n{log.read_text()}") from None
    return proc


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Terminate a process this test started (by its handle), killing it if it lingers past `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
