"""Shared fixtures: real processes and servers on loopback, real namespaces where marked."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from netns_pair import NsPair, ip

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Dpu, Role
from dpu_limiter.server import ControlPlane
from dpu_limiter.units import CPU_PORT
from p4sim.server import Device, add_to_server

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


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`dpu-limiter ARGS` as a user types it (this interpreter's copy), output captured."""
    command = [sys.executable, "-m", "dpu_limiter.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def attacked_pod_caps(rate: float | str, burst_bytes: int, b_rate: str = "1G") -> list[dict[str, object]]:
    """Scenario caps for pod a (`rate`, 2 s window) and b far above it (`b_rate`), so a's DPUs alone hold
    a's traffic."""
    return [
        {"pod": "a", "egress": rate, "ingress": rate, "window_s": 2, "burst_bytes": burst_bytes},
        {"pod": "b", "egress": b_rate, "ingress": b_rate, "window_s": 2, "burst_bytes": 1_000_000},
    ]


def probed_scenario(
    tmp_path: Path,
    checks: list[str],
    event: dict[str, object] | None,
    b_rate: str = "1G",
    burst_bytes: int = 100_000,
    **audit: object,
) -> Path:
    """Pod a capped at 8 Mbit/s (bucket `burst_bytes`) and sending only 4 for 6 s, b's cap far above
    (`b_rate`), audited by `checks` every second, with `event` (a compromise, say) if given."""
    doc = {
        "name": "probe",
        "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"),
        "caps": attacked_pod_caps("8M", burst_bytes, b_rate),
        "audit": {"interval_s": 1, "checks": checks, **audit},
        "phases": [
            {
                "name": "p",
                "duration_s": 6,
                "flows": [{"name": "a-to-b", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "4M"}],
                "events": [event] if event else [],
            }
        ],
    }
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def audited_scenario(
    tmp_path: Path, event: dict[str, object] | None, interval_s: float, burst_bytes: int = 100_000
) -> Path:
    """Pod a capped at 8 Mbit/s with `burst_bytes` and offered twice that for 8 s (b's cap far above, so a's
    DPU alone holds a's), audited every `interval_s`, with `event` (a compromise, say) if given."""
    doc = {
        "name": "audit",
        "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"),
        "caps": attacked_pod_caps("8M", burst_bytes),
        "audit": {"interval_s": interval_s},
        "phases": [
            {
                "name": "p",
                "duration_s": 8,
                "flows": [
                    {"name": "a-to-b", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "16M"},
                    {"name": "b-to-a", "protocol": "udp", "src": "b1", "dst": "a1", "rate": "4M"},
                ],
                "events": [event] if event else [],
            }
        ],
    }
    path = tmp_path / "audit.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def can_netns() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs the 'ip' command (iproute2)"
    return None


async def register(
    client: LimiterClient, name: str, address: str, pod: str = "a", node: bool = False, buffer_bytes: int = 0
) -> None:
    """Register a DPU through the API as the tests wire it: host port 0, uplink port 1."""
    role = Role.NODE if node else Role.POD_UPLINK
    await client.register_dpu(Dpu(name, address, 1, pod, role, host_port=0, uplink_port=1, buffer_bytes=buffer_bytes))


async def node_pod(
    client: LimiterClient, addresses: list[str], name: str, pod: str = "a", prefix: str = "10.0.1.0/24"
) -> None:
    """Pod `pod` (holding `prefix`) with a node DPU at each address, named `name`0, `name`1, ..."""
    await client.apply_pod(pod, [prefix])
    for i, addr in enumerate(addresses):
        await register(client, f"{name}{i}", addr, pod=pod, node=True)


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
                "p4sim.main",
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


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a process this test started (by its handle), killing it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def embedded_target(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An embedded target process on a free loopback port: (address, its log file)."""
    port = free_port()
    log = tmp_path / "target.log"
    proc = start_embedded(port, log)
    try:
        yield f"127.0.0.1:{port}", log
    finally:
        stop(proc)


InProcess = tuple[Device, grpc.aio.Channel]


async def serve_in_process(cpu_port: int | None = CPU_PORT) -> tuple[Device, grpc.aio.Server, str]:
    """The embedded target in this process (frames go in through Device.process), served on loopback;
    by default with its CPU port where limiter.p4 reads the clock."""
    device = Device(1, cpu_port=cpu_port)
    server = grpc.aio.server()
    add_to_server(server, device)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return device, server, f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def plane_with_pod(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, LimiterClient]]:
    """A control plane on loopback (state in `tmp_path`) and a client of it, with pod a (10.0.1.0/24)."""
    plane = ControlPlane(tmp_path / "state.db", "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            yield plane, c
    finally:
        await plane.stop()


@contextlib.asynccontextmanager
async def programmed_target(
    tmp_path: Path, cap: tuple[float, float, float, int], buffer_bytes: int = 0
) -> AsyncIterator[tuple[Device, ControlPlane, LimiterClient]]:
    """A control plane on loopback holding pod a (10.0.1.0/24) with `cap`, converged on an in-process
    embedded target registered as dpu-a."""
    device, server, addr = await serve_in_process()
    plane = ControlPlane(tmp_path / "state.db", "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "dpu-a", addr, buffer_bytes=buffer_bytes)
            await c.set_pod_cap("a", *cap)
            await c.wait_converged(timeout=30)
            assert device.pipeline is not None
            yield device, plane, c
    finally:
        await plane.stop()
        await server.stop(grace=0)


@pytest.fixture
async def in_process_target() -> AsyncIterator[InProcess]:
    """An in-process embedded target (no CPU port: set device.cpu_port for packet I/O) and a channel to it."""
    device, server, address = await serve_in_process(cpu_port=None)
    channel = grpc.aio.insecure_channel(address)
    try:
        yield device, channel
    finally:
        await channel.close()
        await server.stop(grace=0)


@pytest.fixture
def ns_pair() -> Iterator[NsPair]:
    """Create two namespaces with a veth pair and IPv6 off; always delete them afterwards."""
    tag = "dlt" + secrets.token_hex(3)
    subnet = secrets.randbelow(256)
    pair = NsPair(f"{tag}-a", f"{tag}-b", f"{tag}a", f"{tag}b", f"10.199.{subnet}.1", f"10.199.{subnet}.2")
    created: list[str] = []
    try:
        for ns in (pair.ns_a, pair.ns_b):
            ip("netns", "add", ns)
            created.append(ns)
            ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        ip("link", "add", pair.if_a, "netns", pair.ns_a, "type", "veth", "peer", "name", pair.if_b, "netns", pair.ns_b)
        for ns, iface, addr in ((pair.ns_a, pair.if_a, pair.ip_a), (pair.ns_b, pair.if_b, pair.ip_b)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", iface)
            ip("-n", ns, "link", "set", iface, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
