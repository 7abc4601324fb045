"""Traffic endpoints that run inside network namespaces as separate processes.

Invoked by the lab runner as ``ip netns exec NS python -m dpu_lab.traffic SUBCOMMAND ...``.
Every subcommand runs for ``--duration`` seconds (receivers add ``--linger`` to catch late
packets), writes one JSON result file (``--out``) and exits 0.

``--start-at UNIX_TIME`` synchronises senders in different namespaces: a sender sleeps until
then; a receiver starts listening at once and keeps listening until
``start_at + duration + linger``.

Times in results are wall-clock ``time.time()`` seconds so that results from different
processes share one time base; pacing and deadlines use ``time.monotonic()`` so that clock
steps cannot distort them.

This module deliberately imports only the standard library: it starts in every namespace of
every run, and numpy's import time would delay the start of traffic.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Each UDP datagram starts with this header: sequence number (u64) and send time (f64).
UDP_HEADER = struct.Struct("!Qd")
UDP_OVERHEAD_BYTES = 8 + 20 + 14  # UDP + IPv4 (no options) + Ethernet (no FCS, preamble or gap)
TIMELINE_BIN_S = 0.01
TCP_BUFFER_BYTES = 64 * 1024
TCP_CONNECT_RETRY_S = 5.0
# A stray datagram with a huge sequence number must not make the receiver allocate gigabytes.
_MAX_TRACKED_SEQ = 1 << 28
# Receive sockets wake up this often to check their deadline.
_POLL_S = 0.1
# Errors a paced sender expects and counts instead of failing on: a full qdisc (a raw socket's may say
# EAGAIN), an ICMP port-unreachable reported on a connected socket before the receiver is up, or a
# neighbour that did not answer ARP in time (a flood far over a DPU's rate can crowd out the replies).
_COUNTED_SEND_ERRORS = {errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED, errno.EHOSTUNREACH}


def wire_bytes_udp(payload: int) -> int:
    """Return the on-wire bytes of one UDP/IPv4/Ethernet frame carrying ``payload`` bytes."""
    return payload + UDP_OVERHEAD_BYTES


class Timeline:
    """Byte counts in fixed-width time bins on the absolute grid ``k * bin_s``.

    Bins sit on a grid shared by every process, so series from different receivers merge
    without resampling.
    """

    def __init__(self, bin_s: float) -> None:
        self.bin_s = bin_s
        self.first_index: int | None = None
        self.bins: list[int] = []

    def add(self, t: float, nbytes: int) -> None:
        """Add ``nbytes`` that arrived at wall-clock time ``t``."""
        index = math.floor(t / self.bin_s)
        if self.first_index is None:
            self.first_index = index
        offset = index - self.first_index
        if offset < 0:
            # Timestamps may arrive slightly out of order; grow the series to the left.
            self.bins[0:0] = [0] * -offset
            self.first_index = index
            offset = 0
        if offset >= len(self.bins):
            self.bins.extend([0] * (offset + 1 - len(self.bins)))
        self.bins[offset] += nbytes

    def t0(self, default: float) -> float:
        """Return the start time of bin 0, or ``default`` aligned to the grid when empty."""
        index = self.first_index if self.first_index is not None else math.floor(default / self.bin_s)
        return index * self.bin_s


@dataclass
class TimelineJson:
    """The compact timeline stored in receiver results."""

    bin_s: float
    t0: float
    bins: list[int]


@dataclass
class UdpSendResult:
    """Result of ``udp-send``."""

    sent_packets: int
    sent_payload_bytes: int
    sent_wire_bytes: int
    send_errors: int
    start: float
    end: float
    offered_bps: float
    protocol: str = "udp"


@dataclass
class UdpRecvResult:
    """Result of ``udp-recv``; arrival times are ``None`` when nothing arrived."""

    received_packets: int
    received_payload_bytes: int
    received_wire_bytes: int
    first_arrival: float | None
    last_arrival: float | None
    max_seq: int | None
    distinct_seqs: int
    timeline: TimelineJson
    protocol: str = "udp"


@dataclass
class TcpSendResult:
    """Result of ``tcp-send``; ``error`` says why sending stopped early, if it did."""

    sent_bytes: int
    start: float
    end: float
    error: str | None = None
    protocol: str = "tcp"


@dataclass
class TcpRecvResult:
    """Result of ``tcp-recv``; arrival times are ``None`` when nothing arrived."""

    received_bytes: int
    first_arrival: float | None
    last_arrival: float | None
    timeline: TimelineJson
    protocol: str = "tcp"


@dataclass
class _SeqTracker:
    """Distinct sequence numbers seen, one byte per number (cheaper than a set of ints)."""

    seen: bytearray = field(default_factory=bytearray)
    distinct: int = 0
    max_seq: int | None = None

    def add(self, seq: int) -> None:
        """Record one received sequence number."""
        if seq >= _MAX_TRACKED_SEQ:
            return
        if seq >= len(self.seen):
            self.seen.extend(bytes(max(seq + 1, 2 * len(self.seen)) - len(self.seen)))
        if not self.seen[seq]:
            self.seen[seq] = 1
            self.distinct += 1
        self.max_seq = seq if self.max_seq is None else max(self.max_seq, seq)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON atomically, so a reader never sees a partial file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def _wait_until(unix_time: float | None) -> None:
    """Sleep until wall-clock ``unix_time`` (no-op when None or already past)."""
    if unix_time is not None:
        delay = unix_time - time.time()
        if delay > 0:
            time.sleep(delay)


def receive_deadline(start_at: float | None, duration: float, linger: float) -> float:
    """Return the monotonic time at which a receiver that starts listening now stops."""
    wait = max(0.0, start_at - time.time()) if start_at is not None else 0.0
    return time.monotonic() + wait + duration + linger


def paced(
    send: Callable[[int], object], interval: float, duration: float, bursts: tuple[float, float] | None = None
) -> tuple[int, int, float, float]:
    """Call ``send(seq)`` every ``interval`` s for ``duration`` s (with ``bursts`` = (on, period) s, only
    during the first ``on`` s of every ``period``); returns (sent, send errors counted, start, end)."""
    # Sends per burst, and the period between bursts' starts; without bursts, one endless burst.
    per_burst, period = (max(1, round(bursts[0] / interval)), bursts[1]) if bursts else (1, interval)
    sent = errors = seq = 0
    start, mono0 = time.time(), time.monotonic()
    # Send n is due at a fixed time after mono0: an absolute schedule never drifts, and a
    # sender that fell behind catches up by sending back-to-back.
    while (due := mono0 + (seq // per_burst) * period + (seq % per_burst) * interval) < mono0 + duration:
        ahead = due - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        try:
            send(seq)
            sent += 1
        except OSError as exc:
            if exc.errno not in _COUNTED_SEND_ERRORS:
                raise
            errors += 1
        seq += 1
    return sent, errors, start, time.time()


def send_result(sent: int, errors: int, start: float, end: float, payload: int, wire: int) -> UdpSendResult:
    """What a paced sender of ``payload``-byte datagrams in ``wire``-byte frames reports."""
    return UdpSendResult(
        sent_packets=sent,
        sent_payload_bytes=sent * payload,
        sent_wire_bytes=sent * wire,
        send_errors=errors,
        start=start,
        end=end,
        offered_bps=sent * wire * 8 / (end - start),
    )


def udp_send(
    dst: str, port: int, rate_bps: float, size: int, duration: float, bursts: tuple[float, float] | None = None
) -> UdpSendResult:
    """Send paced UDP datagrams at ``rate_bps`` (counted in wire bytes) for ``duration`` s; with
    ``bursts`` = (on, period) s, only during the first ``on`` s of every ``period``."""
    wire = wire_bytes_udp(size)
    padding = bytes(size - UDP_HEADER.size)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((dst, port))
        sent, errors, start, end = paced(
            lambda seq: sock.send(UDP_HEADER.pack(seq, time.time()) + padding), wire * 8 / rate_bps, duration, bursts
        )
    return send_result(sent, errors, start, end, size, wire)


@dataclass
class Arrivals:
    """What a receiver counts: packets, wire bytes in time bins, the first and last arrival."""

    started: float = field(default_factory=time.time)
    timeline: Timeline = field(default_factory=lambda: Timeline(TIMELINE_BIN_S))
    packets: int = 0
    first: float | None = None
    last: float | None = None

    def add(self, t: float, wire: int) -> None:
        """Count one packet of ``wire`` bytes that arrived at wall-clock time ``t``."""
        self.first = t if self.first is None else self.first
        self.last = t
        self.packets += 1
        self.timeline.add(t, wire)

    def timeline_json(self) -> TimelineJson:
        """The timeline as results store it."""
        return TimelineJson(TIMELINE_BIN_S, self.timeline.t0(self.started), self.timeline.bins)


def udp_recv(port: int, deadline: float) -> UdpRecvResult:
    """Receive UDP datagrams on ``port`` until monotonic ``deadline``."""
    arrivals = Arrivals()
    seqs = _SeqTracker()
    payload_bytes = 0
    buf = bytearray(65536)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(("0.0.0.0", port))
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(min(remaining, _POLL_S))
            try:
                n = sock.recv_into(buf)
            except TimeoutError:
                continue
            arrivals.add(time.time(), wire_bytes_udp(n))
            payload_bytes += n
            if n >= UDP_HEADER.size:
                seqs.add(UDP_HEADER.unpack_from(buf)[0])
    return UdpRecvResult(
        received_packets=arrivals.packets,
        received_payload_bytes=payload_bytes,
        received_wire_bytes=payload_bytes + arrivals.packets * UDP_OVERHEAD_BYTES,
        first_arrival=arrivals.first,
        last_arrival=arrivals.last,
        max_seq=seqs.max_seq,
        distinct_seqs=seqs.distinct,
        timeline=arrivals.timeline_json(),
    )


def _connect(dst: str, port: int, deadline: float) -> socket.socket:
    """Connect to ``dst:port``, retrying while the receiver comes up, until ``deadline``."""
    while True:
        try:
            return socket.create_connection((dst, port), timeout=max(0.1, deadline - time.monotonic()))
        except (ConnectionRefusedError, TimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def tcp_send(dst: str, port: int, duration: float) -> TcpSendResult:
    """Send bulk TCP data to ``dst:port`` for ``duration`` s (connect time included)."""
    mono0 = time.monotonic()
    stop = mono0 + duration
    start = time.time()
    try:
        sock = _connect(dst, port, mono0 + TCP_CONNECT_RETRY_S)
    except OSError as exc:
        return TcpSendResult(sent_bytes=0, start=start, end=time.time(), error=f"connect: {exc}")
    data = memoryview(bytes(TCP_BUFFER_BYTES))
    sent = 0
    error: str | None = None
    with sock:
        start = time.time()
        # send() rather than sendall(): it reports how many bytes went out even when the
        # deadline or an error interrupts a buffer half-way.
        while (remaining := stop - time.monotonic()) > 0:
            sock.settimeout(remaining)
            try:
                sent += sock.send(data)
            except TimeoutError:
                break
            except OSError as exc:
                error = f"send: {exc}"
                break
        end = time.time()
        with contextlib.suppress(OSError):  # the receiver already closed; nothing left to signal
            sock.shutdown(socket.SHUT_WR)
    return TcpSendResult(sent_bytes=sent, start=start, end=end, error=error)


def tcp_recv(port: int, deadline: float) -> TcpRecvResult:
    """Accept one TCP connection on ``port`` and read until EOF or monotonic ``deadline``."""
    timeline = Timeline(TIMELINE_BIN_S)
    received = 0
    first: float | None = None
    last: float | None = None
    started = time.time()
    buf = bytearray(256 * 1024)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", port))
        listener.listen(1)
        conn = _accept(listener, deadline)
        if conn is not None:
            with conn:
                while (remaining := deadline - time.monotonic()) > 0:
                    conn.settimeout(min(remaining, _POLL_S))
                    try:
                        n = conn.recv_into(buf)
                    except TimeoutError:
                        continue
                    except ConnectionResetError:
                        break
                    if n == 0:
                        break
                    now = time.time()
                    first = now if first is None else first
                    last = now
                    received += n
                    timeline.add(now, n)
    return TcpRecvResult(
        received_bytes=received,
        first_arrival=first,
        last_arrival=last,
        timeline=TimelineJson(TIMELINE_BIN_S, timeline.t0(started), timeline.bins),
    )


def _accept(listener: socket.socket, deadline: float) -> socket.socket | None:
    """Accept one connection before monotonic ``deadline``, or return None."""
    while (remaining := deadline - time.monotonic()) > 0:
        listener.settimeout(min(remaining, _POLL_S))
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        return conn
    return None


def _positive(text: str) -> float:
    """Parse a strictly positive float for argparse."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    """Parse a finite float >= 0 for argparse."""
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _port(text: str) -> int:
    """Parse a UDP/TCP port number for argparse."""
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {text!r}")
    return value


def _payload_size(text: str) -> int:
    """Parse a UDP payload size that fits the sequence header and one datagram."""
    value = int(text)
    if not UDP_HEADER.size <= value <= 65507:
        raise argparse.ArgumentTypeError(f"size must be {UDP_HEADER.size}..65507 bytes, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser for all subcommands."""
    parser = argparse.ArgumentParser(prog="python -m dpu_lab.traffic", description=__doc__.splitlines()[0])
    subs = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str, *, sender: bool) -> argparse.ArgumentParser:
        sub = subs.add_parser(name, help=help_text, description=help_text)
        if sender:
            sub.add_argument("--dst", required=True, help="destination IPv4 address")
        sub.add_argument("--port", type=_port, required=True, help="UDP/TCP port")
        sub.add_argument("--duration", type=_positive, required=True, help="seconds to send (or listen)")
        sub.add_argument("--out", type=Path, required=True, help="JSON result file to write")
        sub.add_argument("--start-at", type=float, help="UNIX time to start at (synchronises senders)")
        if not sender:
            sub.add_argument("--linger", type=_non_negative, default=1.0, help="extra seconds for late packets")
        return sub

    udp = add("udp-send", "paced UDP sender (rate counted in on-wire bytes)", sender=True)
    udp.add_argument("--rate-bps", type=_positive, required=True, help="offered rate, bit/s on the wire")
    udp.add_argument("--size", type=_payload_size, default=1400, help="UDP payload bytes (default 1400)")
    udp.add_argument("--burst-s", type=_positive, help="send only this long at the start of every --period-s")
    udp.add_argument("--period-s", type=_positive, help="seconds between the starts of bursts (with --burst-s)")
    add("udp-recv", "UDP receiver counting packets, bytes and loss", sender=False)
    add("tcp-send", "bulk TCP sender", sender=True)
    add("tcp-recv", "TCP receiver for one connection", sender=False)
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the subcommand described by parsed ``args`` and return its JSON result."""
    result: UdpSendResult | UdpRecvResult | TcpSendResult | TcpRecvResult
    if args.command == "udp-send":
        bursts = None
        if args.burst_s is not None or args.period_s is not None:
            if args.burst_s is None or args.period_s is None or args.burst_s >= args.period_s:
                raise SystemExit(f"--burst-s {args.burst_s}, --period-s {args.period_s}: give both, burst shorter")
            bursts = (args.burst_s, args.period_s)
        _wait_until(args.start_at)
        result = udp_send(args.dst, args.port, args.rate_bps, args.size, args.duration, bursts)
    elif args.command == "udp-recv":
        result = udp_recv(args.port, receive_deadline(args.start_at, args.duration, args.linger))
    elif args.command == "tcp-send":
        _wait_until(args.start_at)
        result = tcp_send(args.dst, args.port, args.duration)
    else:
        result = tcp_recv(args.port, receive_deadline(args.start_at, args.duration, args.linger))
    return asdict(result)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    args = build_parser().parse_args(argv)
    result = run(args)
    write_json(args.out, result)
    if result.get("error"):
        print(f"{args.command}: {result['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
