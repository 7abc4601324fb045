"""kill -9 of the control plane in the middle of a stream of writes loses no acknowledged write."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.stores import read_audit, verify_file
from helpers.processes import free_port, stop, wait_port

pytestmark = pytest.mark.timeout(180)


def _serve(db: str, port: int, logs: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", db, "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=(logs / "serve.log").open("ab"),
    )
    wait_port(port, proc)
    return proc


async def test_kill_9_loses_no_acknowledged_write(tmp_path: Path, db: str) -> None:
    port = free_port()
    proc = _serve(db, port, tmp_path)
    acked: list[int] = []
    try:
        async with LimiterClient(f"127.0.0.1:{port}") as c:
            await c.apply_pod("a", ["10.0.1.0/24"])

            async def writer() -> None:
                for i in range(1, 1001):
                    await c.set_pod_cap("a", 1e6 + i, 1e6 + i, 1.0)  # each write a distinct rate
                    acked.append(i)

            task = asyncio.create_task(writer())
            while len(acked) < 400:
                await asyncio.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)  # the process we started, by its PID
            with pytest.raises(grpc.aio.AioRpcError):
                await task
    finally:
        stop(proc)
    last = acked[-1]
    proc = _serve(db, port, tmp_path)
    try:
        async with LimiterClient(f"127.0.0.1:{port}") as c:
            # gRPC shares subchannels across a process's channels: the one that saw the old server die
            # may report "connection refused" until its reconnect backoff ends.
            rate = (
                await c.stub.GetPodCap(pb.GetPodCapRequest(pod="a"), wait_for_ready=True, timeout=30)
            ).cap.egress_bps
        # The last acknowledged write is there; at most the one in flight when the process died went further.
        assert rate in (1e6 + last, 1e6 + last + 1)
        caps = [r for r in read_audit(db) if r.action == "set-cap"]
        assert len(caps) in (last, last + 1)
        assert [r.payload["egress_bps"] for r in caps[:last]] == [1e6 + i for i in range(1, last + 1)]
        # The write cut short by the kill left the tables and the log together (one transaction):
        # the restarted control plane started on them, and they still verify.
        verdict = verify_file(db)
        assert verdict.ok, verdict.problem
    finally:
        stop(proc)
