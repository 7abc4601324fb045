"""Packet I/O on real Linux interfaces through AF_PACKET raw sockets, as bmv2 does with libpcap."""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable

ETH_P_ALL = 0x0003
PACKET_IGNORE_OUTGOING = 23  # linux/if_packet.h, Linux >= 4.20
PACKET_OUTGOING = 4
SOL_PACKET = 263  # linux/socket.h; not exported by every Python build
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
# struct tpacket_auxdata: status, len, snaplen, mac, net (u32 u32 u32 u16 u16), vlan_tci, vlan_tpid (u16 u16).
AUXDATA = struct.Struct("=IIIHHHH")
AUX_SPACE = socket.CMSG_SPACE(AUXDATA.size)
MAX_FRAME = 65535
BATCH = 64  # frames drained from one socket before looking at the others

Processor = Callable[[int, bytes], list[tuple[int, bytes]]]


def parse_interface(spec: str) -> tuple[int, str]:
    """Parse simple_switch's `-i PORT@IFNAME` into (port, ifname)."""
    port, sep, ifname = spec.partition("@")
    if not sep or not port.isdigit() or not ifname:
        raise ValueError(f"interface {spec!r}: expected PORT@IFNAME, e.g. 0@veth0")
    if len(ifname) > 15:
        raise ValueError(f"interface {spec!r}: name longer than 15 characters")
    return int(port), ifname


def with_vlan_tag(frame: bytes, ancillary: list[tuple[int, int, bytes]]) -> bytes:
    """The frame with the VLAN tag the kernel moved into PACKET_AUXDATA put back after the MACs."""
    for level, kind, data in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= AUXDATA.size:
            status, _, _, _, _, tci, tpid = AUXDATA.unpack_from(data)
            if status & TP_STATUS_VLAN_VALID:
                tpid = tpid if status & TP_STATUS_VLAN_TPID_VALID and tpid else 0x8100
                return frame[:12] + struct.pack("!HH", tpid, tci) + frame[12:]
    return frame


class RawPorts:
    """Numbered ports bound to interfaces; a thread moves frames through a processor."""

    def __init__(self, interfaces: dict[int, str], max_frame: int = MAX_FRAME) -> None:
        self.interfaces = dict(interfaces)
        self.socks: dict[int, socket.socket] = {}
        # The longest frame a port takes, as a NIC's largest frame size: the kernel hands a packet socket a
        # host's GSO frame whole (a veth carries it whatever its MTU), a frame no Ethernet wire carries.
        self.max_frame = max_frame
        self.rx_frames = 0
        self.rx_oversize = 0  # frames longer than max_frame, dropped on receipt
        self.tx_frames = 0
        self.tx_errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Frames injected from other threads (PacketOuts), and a pipe that wakes the forwarding thread for them.
        self._injected: deque[tuple[int, bytes]] = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        try:
            for port, ifname in self.interfaces.items():
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                try:
                    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                except OSError:
                    pass  # older kernels: outgoing frames are filtered by pkttype below
                # A NIC (or veth) may strip an 802.1Q tag into metadata; ask for it to put it back, as
                # libpcap does for bmv2: a tagged frame must reach the pipeline tagged.
                s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
                s.bind((ifname, ETH_P_ALL))
                s.setblocking(False)
                self.socks[port] = s
        except OSError:
            self.close()
            raise

    def start(self, process: Processor) -> None:
        """Start forwarding in a background thread."""
        self._thread = threading.Thread(target=self._run, args=(process,), name="dpu_softswitch-ports", daemon=True)
        self._thread.start()

    def inject(self, port: int, data: bytes) -> None:
        """Have the forwarding thread process `data` as if received on `port` (from any thread)."""
        self._injected.append((port, data))
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def _run(self, process: Processor) -> None:
        poller = select.epoll()
        by_fd = {s.fileno(): (port, s) for port, s in self.socks.items()}
        for fd in by_fd:
            poller.register(fd, select.EPOLLIN)
        poller.register(self._wake_r, select.EPOLLIN)
        try:
            while not self._stop.is_set():
                for fd, _ in poller.poll(0.2):
                    if fd == self._wake_r:
                        self._drain_injected(process)
                        continue
                    port, s = by_fd[fd]
                    for _ in range(BATCH):
                        try:
                            data, anc, _, addr = s.recvmsg(MAX_FRAME, AUX_SPACE)
                        except BlockingIOError:
                            break
                        except OSError:
                            break
                        if addr[2] == PACKET_OUTGOING:
                            continue
                        if anc:
                            data = with_vlan_tag(data, anc)
                        if len(data) > self.max_frame:
                            self.rx_oversize += 1
                            continue
                        self.rx_frames += 1
                        self._forward(process(port, data))
        finally:
            poller.close()

    def _drain_injected(self, process: Processor) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._injected:
            self._forward(process(*self._injected.popleft()))

    def _forward(self, outputs: list[tuple[int, bytes]]) -> None:
        """Send each (port, frame) out of its interface."""
        socks = self.socks
        for eport, out in outputs:
            tx = socks.get(eport)
            if tx is None:
                continue  # no interface on that port: bmv2 drops silently
            try:
                tx.send(out)
                self.tx_frames += 1
            except OSError as exc:
                if exc.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ENETDOWN, errno.EMSGSIZE, errno.ENXIO):
                    raise
                self.tx_errors += 1

    def stop(self) -> None:
        """Stop the forwarding thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def close(self) -> None:
        """Stop and close every socket."""
        self.stop()
        for s in self.socks.values():
            s.close()
        self.socks.clear()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
