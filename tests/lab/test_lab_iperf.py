"""Tests for dpu_lab.iperf: iperf3 between two network namespaces, same results as dpu_lab.traffic."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dpu_lab.iperf import udp_client_args, udp_payload_rate
from dpu_lab.traffic import wire_bytes_udp
from helpers.netns import LAB_PATH, NsPair, finish, load, start

# Python start-up in a namespace takes a few hundred ms on a busy 2-core machine; iperf3's
# server must be listening before its client starts.
START_DELAY_S = 1.5


def _unavailable() -> str | None:
    """Return why the iperf3 namespace tests cannot run here, or None."""
    if shutil.which("iperf3") is None:
        return "iperf3 not found on PATH"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 'ip' not found"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "'ip netns' is not available"
    return None


_WHY_NOT = _unavailable()
needs_iperf3_netns = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))


def _flow(
    pair: NsPair, module: str, protocol: str, port: int, duration: float, out: Path, extra: Sequence[str] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one receiver/sender pair of ``module``; return (sender, receiver) results."""
    start_at = str(time.time() + START_DELAY_S)
    timing = ["--port", str(port), "--duration", str(duration), "--start-at", start_at]
    recv = start(pair.ns_b, module, [f"{protocol}-recv", *timing, "--linger", "1"], out / "recv.json")
    send = start(pair.ns_a, module, [f"{protocol}-send", "--dst", pair.ip_b, *timing, *extra], out / "send.json")
    finish([send, recv], timeout_s=START_DELAY_S + duration + 10)
    return load(out / "send.json"), load(out / "recv.json")


@pytest.mark.netns
@needs_iperf3_netns
def test_udp_at_wire_rate_is_delivered(ns_pair: NsPair, tmp_path: Path) -> None:
    rate = 8e6
    sent, recv = _flow(ns_pair, "dpu_lab.iperf", "udp", 5201, 2.0, tmp_path, ["--rate-bps", str(rate)])

    assert sent["offered_bps"] == pytest.approx(rate, rel=0.05)
    assert sent["sent_wire_bytes"] == sent["sent_packets"] * wire_bytes_udp(1400)
    assert sent["sent_payload_bytes"] == sent["sent_packets"] * 1400
    assert recv["received_packets"] > 0.95 * sent["sent_packets"]
    assert recv["received_wire_bytes"] == recv["received_packets"] * wire_bytes_udp(1400)
    assert recv["timeline"]["bin_s"] == 0.1
    assert sum(recv["timeline"]["bins"]) == recv["received_wire_bytes"]
    assert recv["first_arrival"] >= sent["start"] - 0.05
    assert recv["last_arrival"] <= sent["end"] + 0.2


@pytest.mark.netns
@needs_iperf3_netns
def test_tcp_one_second_moves_over_a_megabyte(ns_pair: NsPair, tmp_path: Path) -> None:
    sent, recv = _flow(ns_pair, "dpu_lab.iperf", "tcp", 5202, 1.0, tmp_path)

    assert sent["error"] is None
    assert sent["end"] - sent["start"] == pytest.approx(1.0, abs=0.05)
    assert recv["received_bytes"] > 1_000_000
    # iperf3's server stops counting when the client says the test is over: data still in
    # flight then is sent but not received.
    assert recv["received_bytes"] <= sent["sent_bytes"]
    assert sum(recv["timeline"]["bins"]) == recv["received_bytes"]


@pytest.mark.netns
@needs_iperf3_netns
@pytest.mark.parametrize("protocol", ["udp", "tcp"])
def test_result_keys_match_builtin_generator(ns_pair: NsPair, tmp_path: Path, protocol: str) -> None:
    extra = ["--rate-bps", "2e6", "--size", "1000"] if protocol == "udp" else []
    results = {}
    for module, port in (("dpu_lab.traffic", 5203), ("dpu_lab.iperf", 5204)):
        out = tmp_path / module
        out.mkdir()
        results[module] = _flow(ns_pair, module, protocol, port, 1.0, out, extra)

    for builtin, iperf in zip(results["dpu_lab.traffic"], results["dpu_lab.iperf"], strict=True):
        assert list(iperf) == list(builtin)
        assert iperf["protocol"] == builtin["protocol"] == protocol
        if "timeline" in builtin:
            assert list(iperf["timeline"]) == list(builtin["timeline"])


@pytest.mark.netns
@needs_iperf3_netns
def test_receiver_without_client_stops_at_deadline(ns_pair: NsPair, tmp_path: Path) -> None:
    began = time.monotonic()
    proc = start(
        ns_pair.ns_b,
        "dpu_lab.iperf",
        ["tcp-recv", "--port", "5205", "--duration", "0.5", "--linger", "0.2"],
        tmp_path / "r.json",
    )
    finish([proc], timeout_s=10)

    assert time.monotonic() - began < 5
    recv = load(tmp_path / "r.json")
    assert recv["received_bytes"] == 0
    assert recv["first_arrival"] is None and recv["last_arrival"] is None
    assert recv["timeline"]["bins"] == []


def test_missing_iperf3_exits_2_with_message(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpu_lab.iperf",
            "udp-recv",
            "--port",
            "5201",
            "--duration",
            "1",
            "--out",
            str(tmp_path / "x"),
        ],
        env=dict(os.environ, PYTHONPATH=LAB_PATH, PATH=str(empty)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "iperf3 not found" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_bad_arguments_exit_2_with_message(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "dpu_lab.iperf", "udp-send", "--dst", "10.0.0.1", "--port", "99999"]
    proc = subprocess.run(
        [*command, "--rate-bps", "1e6", "--duration", "1", "--out", str(tmp_path / "x.json")],
        env=dict(os.environ, PYTHONPATH=LAB_PATH),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "port" in proc.stderr
    assert "dpu_lab.iperf udp-send" in proc.stderr


def test_udp_rate_is_converted_from_wire_to_payload_bits() -> None:
    assert udp_payload_rate(8e6, 1400) == round(8e6 * 1400 / wire_bytes_udp(1400))
    args = udp_client_args("10.0.0.2", 5201, 8e6, 1400, 2.0)
    assert args[args.index("-t") + 1] == "2"
    # iperf3's -t takes whole seconds; a fractional UDP duration becomes the packet count the
    # built-in sender would send: ceil(1.5 s / (1442 B * 8 / 8 Mbit/s)).
    args = udp_client_args("10.0.0.2", 5201, 8e6, 1400, 1.5)
    assert "-t" not in args
    assert args[args.index("-k") + 1] == "1041"
