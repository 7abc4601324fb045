"""iperf3 traffic endpoints with the command line and result JSON of ``dpu_lab.traffic``.

Invoked as ``ip netns exec NS python -m dpu_lab.iperf SUBCOMMAND ...`` with exactly the
subcommands and arguments of :mod:`dpu_lab.traffic`; each runs ``iperf3 --json`` as a child
process and converts its report into the same result fields, so the lab runner can use either
module. Exit status 2 means iperf3 is not on PATH (or the arguments are invalid).

Differences from the built-in generator that a reader of the results should know:

* Both ends of a flow must use this module: iperf3 clients speak iperf3's protocol and put
  iperf3's own header in each datagram, which ``dpu_lab.traffic`` does not understand.
* iperf3 opens a TCP control connection to the receiver's ``--port`` (and a UDP test sends
  one 4-byte "connect" datagram each way) before the data starts; this control traffic is
  small (a few kB) but it crosses the emulated network and shows up in captures.
* Receiver timelines use iperf3's 100 ms report intervals (``-i 0.1``), so ``bin_s`` is 0.1
  instead of 0.01, bins are not on the absolute ``k * bin_s`` grid (``t0`` is the start of
  the test) and iperf3's intervals are only approximately 100 ms wide (the last one is
  usually a short remainder). ``first_arrival``/``last_arrival`` are the start of the first
  and the end of the last non-empty interval, i.e. accurate to about one interval.
* iperf3 reports times relative to the test start and the start only to the whole second,
  so the wall-clock start is estimated as "time iperf3 exited minus the test's length";
  on a veth pair this is a few ms late at most.
* iperf3's ``-t`` takes whole seconds. A fractional UDP duration is sent as the packet
  count the built-in sender would send (``-k``); a fractional TCP duration is rounded to
  the nearest whole second (at least 1) with a warning on stderr.
* iperf3's server stops counting when the client's end-of-test message arrives on the
  control connection, so data still in flight then (TCP in socket buffers or queues, a last
  UDP datagram racing that message) is sent but not received; the built-in TCP receiver
  instead reads to EOF.
* ``send_errors`` is always 0: iperf3 retries ``ENOBUFS`` silently and does not count it.
* UDP ``max_seq``/``distinct_seqs`` come from iperf3's own loss accounting (highest
  sequence number seen, minus gaps), which counts a duplicate that fills a gap as distinct.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from types import FrameType
from typing import Any

from dpu_lab.traffic import (
    TCP_CONNECT_RETRY_S,
    UDP_OVERHEAD_BYTES,
    TcpRecvResult,
    TcpSendResult,
    TimelineJson,
    UdpRecvResult,
    UdpSendResult,
    _wait_until,
    build_parser,
    receive_deadline,
    wire_bytes_udp,
    write_json,
)

PROG = "python -m dpu_lab.iperf"
#: iperf3 report interval on the receiver; it becomes the timeline's ``bin_s``.
INTERVAL_S = 0.1
# A client is given this long beyond its test to exchange results before it is stopped.
_CLIENT_GRACE_S = 15.0
# After SIGTERM iperf3 prints its partial report and exits; it gets this long to do so.
_STOP_GRACE_S = 5.0
# iperf3's error when the client went away mid-test; the built-in receiver treats that as the
# normal end of a flow (EOF or reset), not as a failure.
_CLIENT_GONE = "the client has terminated"


class Iperf3Missing(RuntimeError):
    """iperf3 is not on PATH."""


class _Terminated(Exception):
    """This process got SIGTERM; raised so that ``finally`` blocks stop the iperf3 child."""


def iperf3_path() -> str:
    """Return the iperf3 executable on PATH, or raise Iperf3Missing."""
    path = shutil.which("iperf3")
    if path is None:
        raise Iperf3Missing("iperf3 not found on PATH (Debian: apt-get install iperf3); use dpu_lab.traffic instead")
    return path


def udp_payload_rate(rate_bps: float, size: int) -> int:
    """Return iperf3's ``-b`` (payload bit/s) that puts ``rate_bps`` on the wire at ``size``-byte payloads."""
    # iperf3 counts only UDP payload; at least 1 because -b 0 means "unlimited".
    return max(1, round(rate_bps * size / wire_bytes_udp(size)))


def udp_client_args(dst: str, port: int, rate_bps: float, size: int, duration: float) -> list[str]:
    """Return the iperf3 arguments (without the executable) of ``udp-send``."""
    args = ["-c", dst, "-p", str(port), "-u", "-b", str(udp_payload_rate(rate_bps, size)), "-l", str(size)]
    if duration.is_integer():
        return [*args, "-t", str(int(duration)), "--json"]
    # Same count as the built-in sender's schedule: packet n goes out at n * interval < duration.
    interval = wire_bytes_udp(size) * 8 / rate_bps
    return [*args, "-k", str(max(1, math.ceil(duration / interval))), "--json"]


def tcp_client_args(dst: str, port: int, duration: float) -> list[str]:
    """Return the iperf3 arguments (without the executable) of ``tcp-send``."""
    return ["-c", dst, "-p", str(port), "-t", str(_whole_seconds(duration)), "--json"]


def server_args(port: int) -> list[str]:
    """Return the iperf3 arguments (without the executable) of both receivers."""
    return ["-s", "-1", "-p", str(port), "-B", "0.0.0.0", "-i", str(INTERVAL_S), "--json"]


def _whole_seconds(duration: float) -> int:
    """Return ``duration`` as iperf3's whole-second ``-t``, warning when it had to round."""
    seconds = max(1, round(duration))
    if seconds != duration:
        print(f"iperf3 takes whole seconds: running {seconds} s instead of {duration} s", file=sys.stderr)
    return seconds


class _Report:
    """One iperf3 run: its parsed JSON report, exit time and whether we stopped it."""

    def __init__(self, data: dict[str, Any], launched: float, exited: float, stopped: bool, stderr: str) -> None:
        self.data = data
        self.launched = launched
        self.exited = exited
        self.stopped = stopped
        self.stderr = stderr

    @property
    def error(self) -> str | None:
        """Return iperf3's error message, if it reported one."""
        error = self.data.get("error")
        return str(error) if error else None

    def end_sum(self, key: str) -> dict[str, Any]:
        """Return ``end[key]`` (``sum_sent``/``sum_received``), empty when iperf3 never got there."""
        value = self.data.get("end", {}).get(key)
        return value if isinstance(value, dict) else {}

    def intervals(self) -> list[dict[str, Any]]:
        """Return the ``sum`` of each report interval."""
        return [iv["sum"] for iv in self.data.get("intervals", []) if isinstance(iv.get("sum"), dict)]

    def test_start(self, end_key: str) -> float:
        """Estimate the wall-clock time of the test start (see the module docstring)."""
        # Report times are relative to the test start; iperf3 exits right after its test ends.
        ivs = self.intervals()
        end = self.end_sum(end_key).get("end") or (ivs[-1]["end"] if ivs else 0.0)
        return max(self.launched, self.exited - float(end))


def _run_iperf3(args: Sequence[str], deadline: float) -> _Report:
    """Run iperf3 with ``args``; SIGTERM it at monotonic ``deadline`` so that it reports what it has."""
    command = [iperf3_path(), *args]
    launched = time.time()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stopped = False
    try:
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stopped = True
            # Not processes.stop_processes: its report comes through pipes, which communicate() drains as it waits.
            proc.terminate()
            out, err = proc.communicate(timeout=_STOP_GRACE_S)
        exited = time.time()
    finally:
        if proc.poll() is None:  # we were interrupted, or iperf3 ignored SIGTERM
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # Argument errors are printed as plain text, not JSON.
        message = (err.decode(errors="replace") or text).strip() or f"iperf3 exited with status {proc.returncode}"
        data = {"error": message}
    if not isinstance(data, dict):
        data = {"error": f"unexpected iperf3 output: {text[:200]!r}"}
    return _Report(data, launched, exited, stopped, err.decode(errors="replace"))


def _run_client(args: Sequence[str], duration: float) -> _Report:
    """Run an iperf3 client, retrying while the receiver is not listening yet (as ``traffic`` does)."""
    give_up = time.monotonic() + TCP_CONNECT_RETRY_S
    while True:
        report = _run_iperf3(args, time.monotonic() + duration + _CLIENT_GRACE_S)
        if "Connection refused" not in (report.error or "") or time.monotonic() >= give_up:
            return report
        time.sleep(0.1)


def _arrivals(t0: float, intervals: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """Return (start of first, end of last) interval that received any bytes, as wall-clock times."""
    busy = [iv for iv in intervals if iv.get("bytes", 0) > 0]
    if not busy:
        return None, None
    return t0 + float(busy[0]["start"]), t0 + float(busy[-1]["end"])


def _receiver_failed(report: _Report) -> str | None:
    """Return why a receiver run failed, or None when it ended normally or by our deadline."""
    if report.error is None or report.stopped or _CLIENT_GONE in report.error:
        return None
    return report.error


def _udp_wire_bytes(interval: dict[str, Any]) -> int:
    """Return the wire bytes of the datagrams one UDP report interval received."""
    packets = int(interval.get("packets", 0)) - int(interval.get("lost_packets", 0))
    return int(interval.get("bytes", 0)) + packets * UDP_OVERHEAD_BYTES


def udp_send(dst: str, port: int, rate_bps: float, size: int, duration: float) -> tuple[UdpSendResult, str | None]:
    """Send UDP with iperf3 at ``rate_bps`` (wire bytes); return the result and any iperf3 error."""
    report = _run_client(udp_client_args(dst, port, rate_bps, size, duration), duration)
    sent = report.end_sum("sum_sent")
    packets = int(sent.get("packets", 0))
    start = report.test_start("sum_sent")
    seconds = float(sent.get("seconds", 0.0))
    wire = packets * wire_bytes_udp(size)
    result = UdpSendResult(
        sent_packets=packets,
        sent_payload_bytes=int(sent.get("bytes", 0)),
        sent_wire_bytes=wire,
        send_errors=0,
        start=start,
        end=start + seconds,
        offered_bps=wire * 8 / seconds if seconds > 0 else 0.0,
    )
    return result, report.error


def udp_recv(port: int, deadline: float) -> tuple[UdpRecvResult, str | None]:
    """Receive one iperf3 UDP test on ``port`` until monotonic ``deadline``; return result and failure."""
    report = _run_iperf3(server_args(port), deadline)
    total = report.end_sum("sum_received")
    received = int(total.get("packets", 0)) - int(total.get("lost_packets", 0))
    payload = int(total.get("bytes", 0))
    t0 = report.test_start("sum_received")
    ivs = report.intervals()
    first, last = _arrivals(t0, ivs)
    bins = [_udp_wire_bytes(iv) for iv in ivs]
    highest = int(total.get("packets", 0))  # iperf3 numbers datagrams from 1
    result = UdpRecvResult(
        received_packets=received,
        received_payload_bytes=payload,
        received_wire_bytes=payload + received * UDP_OVERHEAD_BYTES,
        first_arrival=first,
        last_arrival=last,
        max_seq=highest - 1 if highest > 0 else None,
        distinct_seqs=received,
        timeline=TimelineJson(INTERVAL_S, t0 if ivs else report.launched, bins),
    )
    return result, _receiver_failed(report)


def tcp_send(dst: str, port: int, duration: float) -> TcpSendResult:
    """Send bulk TCP with iperf3 for ``duration`` s; iperf3's error, if any, goes in ``error``."""
    report = _run_client(tcp_client_args(dst, port, duration), duration)
    sent = report.end_sum("sum_sent")
    start = report.test_start("sum_sent")
    return TcpSendResult(
        sent_bytes=int(sent.get("bytes", 0)),
        start=start,
        end=start + float(sent.get("seconds", 0.0)),
        error=report.error,
    )


def tcp_recv(port: int, deadline: float) -> tuple[TcpRecvResult, str | None]:
    """Receive one iperf3 TCP test on ``port`` until monotonic ``deadline``; return result and failure."""
    report = _run_iperf3(server_args(port), deadline)
    t0 = report.test_start("sum_received")
    ivs = report.intervals()
    first, last = _arrivals(t0, ivs)
    result = TcpRecvResult(
        received_bytes=int(report.end_sum("sum_received").get("bytes", 0)),
        first_arrival=first,
        last_arrival=last,
        timeline=TimelineJson(INTERVAL_S, t0 if ivs else report.launched, [int(iv["bytes"]) for iv in ivs]),
    )
    return result, _receiver_failed(report)


def parser() -> argparse.ArgumentParser:
    """Return ``dpu_lab.traffic``'s parser, relabelled for this module."""
    p = build_parser()
    p.prog = PROG
    p.description = __doc__.splitlines()[0] if __doc__ else None
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sub.prog = f"{PROG} {name}"
    return p


def run(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """Run the subcommand of parsed ``args``; return its JSON result and an error message or None."""
    iperf3_path()  # fail before sleeping until --start-at
    if getattr(args, "burst_s", None) is not None or getattr(args, "period_s", None) is not None:
        raise SystemExit("--burst-s, --period-s: iperf3 paces no bursts; use python -m dpu_lab.traffic")
    if args.command == "udp-send":
        _wait_until(args.start_at)
        udp, error = udp_send(args.dst, args.port, args.rate_bps, args.size, args.duration)
        return asdict(udp), error
    if args.command == "tcp-send":
        _wait_until(args.start_at)
        tcp = tcp_send(args.dst, args.port, args.duration)
        return asdict(tcp), tcp.error
    deadline = receive_deadline(args.start_at, args.duration, args.linger)
    received: UdpRecvResult | TcpRecvResult
    if args.command == "udp-recv":
        received, error = udp_recv(args.port, deadline)
    else:
        received, error = tcp_recv(args.port, deadline)
    return asdict(received), error


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    args = parser().parse_args(argv)
    # The runner stops overdue endpoints with SIGTERM; unwind so the iperf3 child dies too.
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result, error = run(args)
    except Iperf3Missing as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 2
    except _Terminated:
        return 128 + signal.SIGTERM
    write_json(args.out, result)
    if error:
        print(f"{args.command}: iperf3: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
