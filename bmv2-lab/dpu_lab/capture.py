"""Receiver-side wire-byte measurement on one interface, run inside a network namespace.

``ip netns exec NS python -m dpu_lab.capture --iface IF --duration S --out F [--linger 1.0]``

An AF_PACKET socket bound to the interface sees every incoming frame addressed to the host
(or broadcast), before the host's IP stack could drop it. Each frame adds its wire length (the
frame as received, Ethernet header included, no FCS, preamble or gap) to a 1 ms bin of its
sender: the true sender a lab frame's marker names (frames.py: evasion frames, whatever they
carry or forge), else its IPv4 source address; everything else is counted under
``"non-ipv4"``. These are the receivers' figures, independent of any DPU's own counters. The
kernel moves a VLAN tag out of the frame before the socket sees it (into PACKET_AUXDATA); its 4
bytes are counted back.

The compliance verdict itself comes from the boundary capture (boundary.py), which counts every frame
on every link between pods, whatever it holds; these per-source receiver figures stand beside it in
the report. Both read frames through the one loop here (FrameReader).

Wire length of offloaded segments: a veth (or a TSO-capable NIC) can deliver a GSO
super-packet of up to 64 KiB that stands for many wire frames. The socket asks for a
virtio-net header with each frame (PACKET_VNET_HDR) and counts such a packet as the frames it
will be split into: ``ceil(payload / gso_size)`` copies of the headers plus the payload.

Timestamps: each frame's kernel receive time (SO_TIMESTAMPNS, nanosecond resolution, taken
when the stack receives it, so independent of how late this process reads it). If the kernel
attaches none, ``time.time()`` at read is used instead; its error is the read backlog, which
is why the socket has a receive buffer of several MB. Either way a 1 ms bin is coarser than
the timestamp error under normal load. ``kernel_drops`` in the output reports frames the
kernel dropped because this reader fell behind; a non-zero value means the counts are low, and
``lost_bytes`` bounds by how much per key (each lost frame as large as any Linux link lets one be).

Direction: a socket is opened for the frames an interface receives or for those it sends, never both
(a classic BPF filter on the packet type decides in the kernel, before the frame is queued), so a
flood one way cannot make the other way's socket lose frames, and a lost frame's direction is known.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from dpu_lab.frames import VLAN_TAG, marked
from dpu_lab.traffic import Timeline, receive_deadline, write_json
from dpu_softswitch.ports import AUX_SPACE, AUXDATA, PACKET_AUXDATA, SOL_PACKET, TP_STATUS_VLAN_VALID

CAPTURE_BIN_S = 0.001
NON_IPV4 = "non-ipv4"
RCVBUF_BYTES = 8 << 20

# Linux constants the socket module does not export (include/uapi/linux/if_packet.h,
# asm-generic/socket.h). SO_TIMESTAMPNS is the 64-bit-time "old" value on 64-bit hosts.
ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
PACKET_STATISTICS = 6
PACKET_VNET_HDR = 15
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33
PACKET_OTHERHOST = 3
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
# Classic BPF (linux/filter.h): load the packet type (an ancillary field), compare, accept or not.
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
_SKF_AD_PKTTYPE = (-0x1000 + 4) & 0xFFFFFFFF
_SOCK_FILTER = struct.Struct("=HBBI")

Way = Literal["in", "out"]  # the frames an interface receives, or those it sends

# struct virtio_net_hdr: flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
_VNET_HDR = struct.Struct("=BBHHHH")
_VNET_F_NEEDS_CSUM = 1
_GSO_NONE = 0
_GSO_ECN = 0x80
_GSO_TCPV4 = 1
_GSO_TCPV6 = 4
_TIMESPEC = struct.Struct("=qq")
_TPACKET_STATS = struct.Struct("=II")
_ETH_HLEN = 14
# The most wire bytes a frame the capture lost can have held: the largest MTU a Linux link can be set
# to (veth's 65,535), its Ethernet header and two VLAN tags. Not the link's MTU when the capture began:
# whoever holds a namespace can raise it meanwhile (a red team did, and its jumbo frames were all lost).
LOST_FRAME_BOUND = 65_535 + _ETH_HLEN + 8
# virtio-net header + Ethernet + the longest IPv4 header + the longest TCP header.
_HEADER_BYTES = _VNET_HDR.size + _ETH_HLEN + 60 + 60

Buffer = bytes | bytearray | memoryview


@dataclass
class SourceBins:
    """Dense 1 ms bins of one source, starting ``first_bin`` bins after the capture's t0."""

    first_bin: int
    bins: list[int]


@dataclass
class Capture:
    """A capture file: wire bytes per IPv4 source (or ``"non-ipv4"``) in bins from ``t0``."""

    iface: str
    bin_s: float
    t0: float
    by_src: dict[str, SourceBins]
    kernel_drops: int = 0
    timestamps: str = "kernel"
    # Per key, the most bytes the frames the kernel dropped (the reader fell behind) can have held.
    lost_bytes: dict[str, int] = field(default_factory=dict)

    def series(self, src: str) -> tuple[float, float, list[int]]:
        """Return ``(t0, bin_s, bins)`` of one source, the form ``measure`` functions take."""
        entry = self.by_src.get(src)
        if entry is None:
            return self.t0, self.bin_s, []
        return self.t0 + entry.first_bin * self.bin_s, self.bin_s, entry.bins

    def total_bytes(self, src: str) -> int:
        """Return all wire bytes captured from ``src``."""
        entry = self.by_src.get(src)
        return sum(entry.bins) if entry is not None else 0


def load_capture(path: Path) -> Capture:
    """Read a capture JSON file written by this module."""
    data = json.loads(Path(path).read_text())
    return Capture(
        iface=data["iface"],
        bin_s=float(data["bin_s"]),
        t0=float(data["t0"]),
        by_src={src: SourceBins(int(e["first_bin"]), [int(b) for b in e["bins"]]) for src, e in data["by_src"].items()},
        kernel_drops=int(data.get("kernel_drops", 0)),
        timestamps=str(data.get("timestamps", "kernel")),
        lost_bytes={str(k): int(v) for k, v in data.get("lost_bytes", {}).items()},
    )


def frame_wire_bytes(vnet: Buffer, frame: Buffer, frame_len: int | None = None) -> int:
    """Return the wire bytes of a frame, expanding a GSO super-packet into its segments.

    ``frame`` may be just the start of the frame when ``frame_len`` gives its full length.
    """
    length = len(frame) if frame_len is None else frame_len
    flags, gso_type, hdr_len, gso_size, csum_start, _ = (int(v) for v in _VNET_HDR.unpack_from(vnet))
    gso_type &= ~_GSO_ECN
    if gso_type == _GSO_NONE or gso_size == 0:
        return length
    if flags & _VNET_F_NEEDS_CSUM and csum_start + 13 <= len(frame):
        # csum_start is the offset of the L4 header from the start of the frame.
        l4 = csum_start
        l4_len = (frame[l4 + 12] >> 4) * 4 if gso_type in (_GSO_TCPV4, _GSO_TCPV6) else 8
        headers = l4 + l4_len
    else:
        headers = hdr_len
    segments = max(1, math.ceil((length - headers) / gso_size))
    return length + (segments - 1) * headers


def source_key(frame: Buffer) -> str:
    """Return the true sender a lab frame's marker names, else the IPv4 source address of an Ethernet
    frame, or ``"non-ipv4"``."""
    found = marked(bytes(frame))
    if found is not None:
        return found[0]
    if len(frame) >= _ETH_HLEN + 20 and frame[12] == ETH_P_IP >> 8 and frame[13] == ETH_P_IP & 0xFF:
        return socket.inet_ntoa(bytes(frame[26:30]))
    return NON_IPV4


def open_socket(iface: str, way: Way = "in", rcvbuf: int = RCVBUF_BYTES) -> socket.socket:
    """Open an AF_PACKET socket on ``iface`` that reads, with metadata, the frames it receives (``way``
    "in") or those it sends ("out")."""
    # Protocol 0 receives nothing until bind(), so no frame of another interface or without
    # the options below can slip in first.
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        # As root the buffer may exceed net.core.rmem_max (often 208 KiB, a few hundred frames): a reader
        # that falls behind for a moment then loses nothing.
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    _attach_direction_filter(sock, way)
    sock.bind((iface, ETH_P_ALL))  # the socket module applies htons() to bind addresses
    return sock


def _attach_direction_filter(sock: socket.socket, way: Way) -> None:
    """Let only frames of one direction into the socket's queue (outgoing ones are PACKET_OUTGOING)."""
    accept, reject = (0, 1) if way == "out" else (1, 0)  # jump offsets when the type is PACKET_OUTGOING
    prog = b"".join(
        _SOCK_FILTER.pack(*ins)
        for ins in (
            (_BPF_LD_W_ABS, 0, 0, _SKF_AD_PKTTYPE),
            (_BPF_JEQ_K, accept, reject, PACKET_OUTGOING),
            (_BPF_RET_K, 0, 0, 0xFFFFFFFF),  # the whole frame
            (_BPF_RET_K, 0, 0, 0),
        )
    )
    buf = ctypes.create_string_buffer(prog, len(prog))
    # struct sock_fprog: the instruction count, then a pointer to them (the kernel copies them).
    fprog = struct.pack("HL", len(prog) // _SOCK_FILTER.size, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def _kernel_drops(sock: socket.socket) -> int:
    """Return frames the kernel dropped for this socket since the last call (reading clears the count)."""
    _, drops = _TPACKET_STATS.unpack(sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size))
    return int(drops)


_stop_requested = False


def _request_stop(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT end the capture early; what was counted is still written."""
    global _stop_requested
    _stop_requested = True


class WireFrame(NamedTuple):
    """One frame as an AF_PACKET socket saw it."""

    stamp: float  # the kernel's receive (or send) time, else time.time() at read
    wire: int  # its wire bytes: Ethernet header included, no FCS; a stripped VLAN tag and GSO segments counted
    head: bytes  # its first bytes (up to the longest Ethernet, IPv4 and TCP headers)
    pkttype: int  # PACKET_HOST, PACKET_BROADCAST, ..., PACKET_OTHERHOST, PACKET_OUTGOING


class FrameReader:
    """The one loop that reads frames off an AF_PACKET socket (receiver captures, evasion receivers and
    the boundary capture all count what it yields), with their wire bytes and kernel timestamps."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.kernel_stamps = True  # every frame had the kernel's time (else some had time.time())
        self.drops = 0  # frames the kernel dropped because the reader fell behind
        # Only headers are read: MSG_TRUNC makes recvmsg return the full frame length anyway,
        # and skipping the copy of up to 64 KiB per GSO packet keeps up with higher rates.
        self._buf = bytearray(_HEADER_BYTES)
        self._view = memoryview(self._buf)
        self._ancillary = socket.CMSG_SPACE(_TIMESPEC.size) + AUX_SPACE

    def frames(self, deadline: float | None) -> Iterator[WireFrame]:
        """Each frame until monotonic ``deadline`` (or SIGTERM); with ``deadline`` None, each frame waiting
        in the socket now, without blocking."""
        sock, buf, view = self.sock, self._buf, self._view
        sock.settimeout(0.0 if deadline is None else None)
        try:
            # A drain (no deadline) reads what is there even after SIGTERM: it is how a capture ends.
            while deadline is None or not _stop_requested:
                if deadline is not None:
                    if (remaining := deadline - time.monotonic()) <= 0:
                        break
                    sock.settimeout(min(remaining, 0.1))
                try:
                    n, ancdata, _, addr = sock.recvmsg_into([buf], self._ancillary, socket.MSG_TRUNC)
                except TimeoutError:
                    continue
                except BlockingIOError:
                    break  # drained
                if n < _VNET_HDR.size:
                    continue
                stamp = _timestamp(ancdata)
                if stamp is None:
                    self.kernel_stamps = False
                    stamp = time.time()
                frame = view[_VNET_HDR.size : min(n, len(buf))]
                wire = frame_wire_bytes(view, frame, n - _VNET_HDR.size) + vlan_tag_bytes(ancdata)
                yield WireFrame(stamp, wire, bytes(frame), int(addr[2]))
        finally:  # also when the caller stops early (its socket may be closed by then)
            with contextlib.suppress(OSError):
                self.drops += _kernel_drops(sock)


@dataclass
class Incoming:
    """Frames arriving on an interface, read until a deadline (or SIGTERM)."""

    iface: str
    kernel_stamps: bool = True  # every frame had the kernel's receive time (else some had time.time())
    drops: int = 0  # frames the kernel dropped because the reader fell behind

    def frames(self, deadline: float) -> Iterator[tuple[float, int, bytes]]:
        """(receive time, wire bytes, the frame's first bytes) of each frame addressed to this host, until
        monotonic ``deadline``."""
        with open_socket(self.iface) as sock:
            reader = FrameReader(sock)
            for f in reader.frames(deadline):
                if f.pkttype != PACKET_OTHERHOST:
                    yield f.stamp, f.wire, f.head
            self.kernel_stamps, self.drops = reader.kernel_stamps, reader.drops


def capture(iface: str, deadline: float) -> Capture:
    """Count incoming wire bytes per source on ``iface`` until monotonic ``deadline`` (or SIGTERM)."""
    started = time.time()
    timelines: dict[str, Timeline] = {}
    incoming = Incoming(iface)
    for stamp, wire, frame in incoming.frames(deadline):
        timelines.setdefault(source_key(frame), Timeline(CAPTURE_BIN_S)).add(stamp, wire)
    stamps = "kernel" if incoming.kernel_stamps else "user"
    return to_capture(iface, started, timelines, incoming.drops, stamps)


def vlan_tag_bytes(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The bytes of the VLAN tag the kernel took out of a received frame (PACKET_AUXDATA), if any."""
    for level, kind, data in ancdata:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= AUXDATA.size:
            return VLAN_TAG if AUXDATA.unpack_from(data)[0] & TP_STATUS_VLAN_VALID else 0
    return 0


def _timestamp(ancdata: list[tuple[int, int, bytes]]) -> float | None:
    """Return the kernel receive time from recvmsg ancillary data, if present."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            if sec or nsec:
                return int(sec) + int(nsec) * 1e-9
    return None


def to_capture(iface: str, started: float, timelines: dict[str, Timeline], drops: int, stamps: str) -> Capture:
    """Put per-source timelines on one grid whose bin 0 is the earliest non-empty bin."""
    firsts = [tl.first_index for tl in timelines.values() if tl.first_index is not None]
    base = min(firsts) if firsts else math.floor(started / CAPTURE_BIN_S)
    by_src = {
        key: SourceBins(tl.first_index - base, tl.bins) for key, tl in timelines.items() if tl.first_index is not None
    }
    return Capture(iface, CAPTURE_BIN_S, base * CAPTURE_BIN_S, by_src, drops, stamps)


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser."""
    parser = argparse.ArgumentParser(prog="python -m dpu_lab.capture", description=__doc__.splitlines()[0])
    parser.add_argument("--iface", required=True, help="interface to capture incoming frames on")
    parser.add_argument("--duration", type=float, required=True, help="seconds to capture")
    parser.add_argument("--out", type=Path, required=True, help="JSON result file to write")
    parser.add_argument("--linger", type=float, default=1.0, help="extra seconds for late packets (default 1.0)")
    parser.add_argument(
        "--start-at", type=float, help="UNIX time the traffic starts; capture runs until then + duration"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.duration > 0 or not args.linger >= 0:
        parser.error("--duration must be > 0 and --linger >= 0")
    deadline = receive_deadline(args.start_at, args.duration, args.linger)
    return count_and_write(f"capture on {args.iface}", args.out, lambda: capture(args.iface, deadline))


def count_and_write(name: str, out: Path, count: Callable[[], Capture]) -> int:
    """Run ``count`` (SIGTERM or SIGINT end it early, and what it counted is still written), write its
    capture to ``out``, say when the kernel dropped frames; returns the exit status."""
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    result = count()
    write_json(out, asdict(result))
    if result.kernel_drops:
        print(f"{name}: kernel dropped {result.kernel_drops} frames", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
