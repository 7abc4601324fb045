"""Tests for dpu_lab.traffic and dpu_lab.capture: real packets between two network namespaces."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpu_lab.capture import frame_wire_bytes, load_capture, source_key
from dpu_lab.traffic import wire_bytes_udp
from helpers.netns import LAB_PATH, NsPair, finish, load, start

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


@pytest.mark.netns
@needs_netns
def test_udp_paced_send_matches_receiver_and_capture(ns_pair: NsPair, tmp_path: Path) -> None:
    rate, duration = 8e6, 2.0
    start_at = str(time.time() + START_DELAY_S)
    timing = ["--duration", str(duration), "--start-at", start_at, "--linger", "0.7"]
    procs = [
        start(ns_pair.ns_b, "dpu_lab.traffic", ["udp-recv", "--port", "5201", *timing], tmp_path / "recv.json"),
        start(ns_pair.ns_b, "dpu_lab.capture", ["--iface", ns_pair.if_b, *timing], tmp_path / "cap.json"),
    ]
    send_args = ["udp-send", "--dst", ns_pair.ip_b, "--port", "5201", "--rate-bps", str(rate)]
    send_args += ["--duration", str(duration), "--start-at", start_at]
    procs.append(start(ns_pair.ns_a, "dpu_lab.traffic", send_args, tmp_path / "send.json"))
    finish(procs, timeout_s=8.0)

    sent, recv = load(tmp_path / "send.json"), load(tmp_path / "recv.json")
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
        start(
            ns_pair.ns_b,
            "dpu_lab.traffic",
            ["tcp-recv", "--port", "5202", *timing, "--linger", "1"],
            tmp_path / "r.json",
        ),
        start(
            ns_pair.ns_a,
            "dpu_lab.traffic",
            ["tcp-send", "--dst", ns_pair.ip_b, "--port", "5202", *timing],
            tmp_path / "s.json",
        ),
    ]
    finish(procs, timeout_s=8.0)

    sent, recv = load(tmp_path / "s.json"), load(tmp_path / "r.json")
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
