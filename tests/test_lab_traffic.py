"""Tests for dpu_lab.traffic and dpu_lab.capture: real packets between two network namespaces."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dpu_lab
from dpu_lab.capture import frame_wire_bytes, load_capture, source_key
from dpu_lab.traffic import wire_bytes_udp

LAB_PATH = str(Path(dpu_lab.__file__).resolve().parent.parent)
# Python start-up in a namespace takes a few hundred ms on a busy 2-core machine.
START_DELAY_S = 1.0


def _netns_unavailable() -> str | None:
    """Return why namespace tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 'ip' not found"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "'ip netns' is not available"
    return None


_WHY_NO_NETNS = _netns_unavailable()
needs_netns = pytest.mark.skipif(_WHY_NO_NETNS is not None, reason=str(_WHY_NO_NETNS))


@dataclass
class NsPair:
    """Two namespaces joined by a veth pair: A (sender side) and B (receiver side)."""

    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    ip_a: str
    ip_b: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def ns_pair() -> Iterator[NsPair]:
    """Create two namespaces with a veth pair and IPv6 off; always delete them afterwards."""
    tag = "dlt" + secrets.token_hex(3)
    subnet = secrets.randbelow(256)
    pair = NsPair(f"{tag}-a", f"{tag}-b", f"{tag}a", f"{tag}b", f"10.199.{subnet}.1", f"10.199.{subnet}.2")
    created: list[str] = []
    try:
        for ns in (pair.ns_a, pair.ns_b):
            _ip("netns", "add", ns)
            created.append(ns)
            _ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            _ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        _ip("link", "add", pair.if_a, "netns", pair.ns_a, "type", "veth", "peer", "name", pair.if_b, "netns", pair.ns_b)
        for ns, iface, addr in ((pair.ns_a, pair.if_a, pair.ip_a), (pair.ns_b, pair.if_b, pair.ip_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", iface)
            _ip("-n", ns, "link", "set", iface, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _start(ns: str, module: str, args: Sequence[str], out: Path) -> subprocess.Popen[bytes]:
    """Start ``python -m module args --out out`` inside namespace ``ns``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [LAB_PATH, os.environ.get("PYTHONPATH")])))
    command = ["ip", "netns", "exec", ns, sys.executable, "-m", module, *args, "--out", str(out)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
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


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.mark.netns
@needs_netns
def test_udp_paced_send_matches_receiver_and_capture(ns_pair: NsPair, tmp_path: Path) -> None:
    rate, duration = 8e6, 2.0
    start_at = str(time.time() + START_DELAY_S)
    timing = ["--duration", str(duration), "--start-at", start_at, "--linger", "0.7"]
    procs = [
        _start(ns_pair.ns_b, "dpu_lab.traffic", ["udp-recv", "--port", "5201", *timing], tmp_path / "recv.json"),
        _start(ns_pair.ns_b, "dpu_lab.capture", ["--iface", ns_pair.if_b, *timing], tmp_path / "cap.json"),
    ]
    send_args = ["udp-send", "--dst", ns_pair.ip_b, "--port", "5201", "--rate-bps", str(rate)]
    send_args += ["--duration", str(duration), "--start-at", start_at]
    procs.append(_start(ns_pair.ns_a, "dpu_lab.traffic", send_args, tmp_path / "send.json"))
    _finish(procs, timeout_s=8.0)

    sent, recv = _load(tmp_path / "send.json"), _load(tmp_path / "recv.json")
    cap = load_capture(tmp_path / "cap.json")
    assert sent["offered_bps"] == pytest.approx(rate, rel=0.05)
    assert sent["sent_wire_bytes"] == sent["sent_packets"] * wire_bytes_udp(1400)
    assert recv["distinct_seqs"] > 0.95 * sent["sent_packets"]
    assert recv["received_wire_bytes"] == recv["received_packets"] * wire_bytes_udp(1400)
    assert sum(recv["timeline"]["bins"]) == recv["received_wire_bytes"]
    assert cap.total_bytes(ns_pair.ip_a) == pytest.approx(recv["received_wire_bytes"], rel=0.02)
    assert cap.kernel_drops == 0


@pytest.mark.netns
@needs_netns
def test_tcp_bulk_transfer_is_fully_received(ns_pair: NsPair, tmp_path: Path) -> None:
    start_at = str(time.time() + START_DELAY_S)
    timing = ["--duration", "1", "--start-at", start_at]
    procs = [
        _start(
            ns_pair.ns_b,
            "dpu_lab.traffic",
            ["tcp-recv", "--port", "5202", *timing, "--linger", "1"],
            tmp_path / "r.json",
        ),
        _start(
            ns_pair.ns_a,
            "dpu_lab.traffic",
            ["tcp-send", "--dst", ns_pair.ip_b, "--port", "5202", *timing],
            tmp_path / "s.json",
        ),
    ]
    _finish(procs, timeout_s=8.0)

    sent, recv = _load(tmp_path / "s.json"), _load(tmp_path / "r.json")
    assert sent["error"] is None
    assert sent["sent_bytes"] > 0
    assert recv["received_bytes"] == sent["sent_bytes"]
    assert sum(recv["timeline"]["bins"]) == recv["received_bytes"]
    assert recv["first_arrival"] >= sent["start"] - 0.01


def test_bad_arguments_exit_2_with_message(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "dpu_lab.traffic", "udp-send", "--dst", "10.0.0.1", "--port", "99999"]
    proc = subprocess.run(
        [*command, "--rate-bps", "1e6", "--duration", "1", "--out", str(tmp_path / "x.json")],
        env=dict(os.environ, PYTHONPATH=LAB_PATH),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "port" in proc.stderr


def _frame(src: str, payload: int, proto: int = 6) -> bytes:
    """Return an Ethernet/IPv4 frame with a 32-byte TCP header (or 8-byte UDP) and payload."""
    l4 = bytes([0] * 12 + [8 << 4] + [0] * 19) if proto == 6 else bytes(8)
    ip = bytes([0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0]) + bytes(map(int, src.split("."))) + bytes(4)
    return bytes(12) + b"\x08\x00" + ip + l4 + bytes(payload)


def test_capture_counts_gso_super_packet_as_its_segments() -> None:
    frame = _frame("10.1.2.3", 3 * 1448 + 100)  # headers: 14 + 20 + 32 = 66 bytes
    vnet = struct.pack("=BBHHHH", 1, 1, 66, 1448, 34, 16)
    assert frame_wire_bytes(vnet, frame) == 3 * (66 + 1448) + (66 + 100)
    assert frame_wire_bytes(vnet, frame[:100], len(frame)) == 3 * (66 + 1448) + (66 + 100)
    assert frame_wire_bytes(bytes(10), frame) == len(frame)
    assert source_key(frame) == "10.1.2.3"
    assert source_key(bytes(12) + b"\x86\xdd" + bytes(60)) == "non-ipv4"
