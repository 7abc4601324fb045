"""Evasion flows in real time: a paced sender of raw frames shaped as an evader would shape them, and a
receiver that counts them by their marker. Both run inside a host's network namespace.

``ip netns exec NS python -m dpu_lab.evasion send|recv ...``, like dpu_lab.traffic's UDP endpoints
(the same ``--start-at``, ``--duration``, ``--linger`` and ``--out``, and results with the same
fields, so the runner treats them alike).

The sender builds the frames the virtual-time lab sends (frames.py: a VLAN tag, IPv6, GRE, VXLAN, a
first fragment, a forged IPv4 source, the red team's shapes), addressed to the receiving host's MAC
(some red-team shapes: broadcast or multicast), and writes them on its interface through an AF_PACKET
socket, at the flow's rate counted in the frames' wire bytes, or with ``--rate-bps max`` back to back
until its duration is over. The network switches such frames by MAC (netns.py), so they reach the
receiver unchanged, through both pods' limiters. The receiver reads its interface with an AF_PACKET
socket (capture.Incoming: before its own IP stack drops what it cannot use, with a VLAN tag's bytes
counted back) and counts the frames whose marker names this flow's port, or, in frames too short for a
marker, whose source MAC carries it (frames.host_mac).

Standard library only (and the lab's own stdlib-only modules): it starts in a namespace per flow.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from dpu_lab.capture import Incoming
from dpu_lab.frames import ENCAPS, Encap, frame, largest_payload, mac_port, marked
from dpu_lab.traffic import (
    _COUNTED_SEND_ERRORS,
    Arrivals,
    TimelineJson,
    UdpSendResult,
    _non_negative,
    _port,
    _positive,
    _wait_until,
    paced,
    receive_deadline,
    send_result,
    write_json,
)


@dataclass
class FrameRecvResult:
    """Result of ``recv`` (the fields the runner reads match traffic.UdpRecvResult's); arrival times are
    ``None`` when nothing arrived."""

    received_packets: int
    received_wire_bytes: int
    first_arrival: float | None
    last_arrival: float | None
    timeline: TimelineJson
    kernel_drops: int
    protocol: str = "udp"


def send(iface: str, raw: bytes, payload: int, rate_bps: float, duration: float) -> UdpSendResult:
    """Write `raw` (a frame carrying a `payload`-byte datagram) on `iface` at `rate_bps` (its wire bytes;
    math.inf: back to back) for `duration` s."""
    # Protocol 0: this socket only sends, it receives nothing.
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0) as sock:
        sock.bind((iface, 0))
        if rate_bps == math.inf:
            sent, errors, start, end = flood(lambda _: sock.send(raw), duration)
        else:
            sent, errors, start, end = paced(lambda _: sock.send(raw), len(raw) * 8 / rate_bps, duration)
    return send_result(sent, errors, start, end, payload, len(raw))


def flood(send: Callable[[int], object], duration: float) -> tuple[int, int, float, float]:
    """Call ``send(seq)`` back to back until ``duration`` s have passed (what bounds a full-speed sender is
    its time, not a count); returns (sent, send errors counted, start, end), as traffic.paced does."""
    sent = errors = 0
    start, until = time.time(), time.monotonic() + duration
    while time.monotonic() < until:
        try:
            send(sent + errors)
            sent += 1
        except OSError as exc:
            if exc.errno not in _COUNTED_SEND_ERRORS:
                raise
            errors += 1
    return sent, errors, start, time.time()


def ours(head: bytes, port: int) -> bool:
    """Whether a received frame (its first bytes) belongs to flow `port`: its marker names the port, or,
    with no marker (a frame too short for one), its source MAC is a lab host's carrying the port."""
    found = marked(head)
    if found is not None:
        return found[1] == port
    # host_mac(pod, host, port): 02:PP:HH:00:port; routers' and kernels' MACs do not carry lab ports.
    return len(head) >= 12 and head[6] == 0x02 and head[9] == 0 and mac_port(head[6:12]) == port


def receive(iface: str, port: int, deadline: float) -> FrameRecvResult:
    """Count the frames arriving on `iface` that belong to flow `port` (ours), until monotonic `deadline`."""
    arrivals = Arrivals()
    wire_bytes = 0
    incoming = Incoming(iface)
    for stamp, wire, head in incoming.frames(deadline):
        if ours(head, port):
            arrivals.add(stamp, wire)
            wire_bytes += wire
    return FrameRecvResult(
        received_packets=arrivals.packets,
        received_wire_bytes=wire_bytes,
        first_arrival=arrivals.first,
        last_arrival=arrivals.last,
        timeline=arrivals.timeline_json(),
        kernel_drops=incoming.drops,
    )


def _mac(text: str) -> bytes:
    """Parse aa:bb:cc:dd:ee:ff for argparse."""
    try:
        mac = bytes.fromhex(text.replace(":", ""))
    except ValueError:
        mac = b""
    if len(mac) != 6:
        raise argparse.ArgumentTypeError(f"expected a MAC address like 02:00:01:00:00:00, got {text!r}")
    return mac


def _ipv4(text: str) -> str:
    """Check an IPv4 address for argparse."""
    try:
        socket.inet_aton(text)
    except OSError:
        raise argparse.ArgumentTypeError(f"expected an IPv4 address, got {text!r}") from None
    return text


def _rate_bps(text: str) -> float:
    """Parse an offered rate for argparse: bit/s, or max (also inf, as the lab writes math.inf) for full speed."""
    return math.inf if text in ("max", "inf") else _positive(text)


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser for both subcommands."""
    parser = argparse.ArgumentParser(prog="python -m dpu_lab.evasion", description=__doc__.splitlines()[0])
    subs = parser.add_subparsers(dest="command", required=True)
    for name, text in (("send", "paced raw-frame sender"), ("recv", "receiver counting one flow's frames")):
        sub = subs.add_parser(name, help=text, description=text)
        sub.add_argument("--iface", default="eth0", help="the host's interface (default eth0)")
        sub.add_argument("--port", type=_port, required=True, help="the flow's UDP destination port")
        sub.add_argument("--duration", type=_positive, required=True, help="seconds to send (or listen)")
        sub.add_argument("--out", type=Path, required=True, help="JSON result file to write")
        sub.add_argument("--start-at", type=float, help="UNIX time to start at (synchronises senders)")
        if name == "recv":
            sub.add_argument("--linger", type=_non_negative, default=1.0, help="extra seconds for late frames")
            continue
        sub.add_argument("--encap", choices=ENCAPS, required=True, help="the frames' shape (frames.py)")
        sub.add_argument("--src", type=_ipv4, required=True, help="this host's IPv4 address")
        sub.add_argument("--dst", type=_ipv4, required=True, help="the receiving host's IPv4 address")
        sub.add_argument("--spoof-src", type=_ipv4, help="a forged IPv4 source to write instead of --src")
        sub.add_argument("--src-mac", type=_mac, required=True, help="source MAC address")
        sub.add_argument("--dst-mac", type=_mac, required=True, help="the receiving host's MAC address")
        sub.add_argument(
            "--rate-bps", type=_rate_bps, required=True, help="offered rate, bit/s on the wire, or max (full speed)"
        )
        sub.add_argument("--size", type=int, default=1400, help="datagram payload bytes (default 1400)")
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the subcommand described by parsed ``args`` and return its JSON result."""
    if args.command == "recv":
        return asdict(receive(args.iface, args.port, receive_deadline(args.start_at, args.duration, args.linger)))
    encap = cast(Encap, args.encap)
    if not 18 <= args.size <= largest_payload(encap):
        raise SystemExit(f"--size: {args.size} as {encap} must be 18..{largest_payload(encap)} bytes (1500-byte MTU)")
    raw = frame(encap, args.src, args.dst, args.port, args.size, args.src_mac, args.dst_mac, args.spoof_src)
    _wait_until(args.start_at)
    return asdict(send(args.iface, raw, args.size, args.rate_bps, args.duration))


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    args = build_parser().parse_args(argv)
    write_json(args.out, run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
