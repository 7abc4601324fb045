"""The DPU's inline crypto engine, modelled in userspace: MACsec (IEEE 802.1AE) GCM-AES-128 sealing.

A node DPU exempts an intra-pod frame from its pod's cap only after sealing it under a key of its pod
(docs/exemption.md, "How DPUs can prove intra-pod traffic to each other"). If the pod's switch relays
such a frame out of the pod, it delivers ciphertext that no one outside the pod can read. A frame that a
switch or router forges or replays does not open, so the receiving DPU meters it like any inter-pod frame.
On BlueField the crypto engine is a block of its own, between the flow pipeline and the physical port.
The lab's P4 targets have no cipher externs, and its kernel has neither a MACsec device nor ESP AEAD, so
this module does the engine's work in userspace with the `cryptography` package.

A sealed frame (802.1AE, explicit SCI, confidentiality on, offset 0) is the clear frame's MACs, then:

    0x88E5 | TCI/AN | SL | PN (4) | SCI (8) | encrypted (EtherType + payload) | ICV (16)

That is OVERHEAD (32) bytes more than the clear frame, so a link that carries sealed frames needs an
MTU of at least 1500 + OVERHEAD: the wire link, and the clear link too, which carries the wire's frames
that do not open. GCM's nonce is SCI || PN. The authenticated data is everything before the ciphertext
(28 bytes). All of a pod's DPUs share its key. Each sends under its own SCI (its MAC, which the
control plane keeps unique across the fleet), so no two senders ever use the same nonce. Packet numbers
start at 1 in each Sealer, so a key serves one run of each engine: an engine that restarts needs a fresh
key (as MKA would distribute), or it would reuse nonces, and its peers would take its frames for replays.

The engine process runs in the namespace it is started in, on three interfaces:

    python -m dpu_lab.sealing --clear IF --seal IF --wire IF --mac MAC [--stats PATH]  < key (32 hex digits)

- Frames arriving on --clear (the peer of the DPU's metered uplink port) leave by --wire unchanged.
- Frames arriving on --seal (the peer of the DPU's seal port) leave by --wire sealed.
- Frames arriving on --wire that open (authentic under the key, from another sender, not replayed) leave
  by --seal, opened. Every other frame leaves by --clear unchanged, so the DPU meters it.

The caller turns off checksum and segmentation offloads on all three interfaces (dpu_lab.offload). A
frame the kernel hands over unfinished (a GSO super-packet, a checksum left to the NIC) is dropped and
counted: the engine could not send it as it is. SIGTERM or SIGINT ends the engine. It then writes
--stats (JSON) and exits 0.
"""

from __future__ import annotations

import argparse
import errno
import re
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dpu_lab.capture import PACKET_STATISTICS, open_socket
from dpu_lab.traffic import write_json
from dpu_softswitch.ports import AUX_SPACE, SOL_PACKET, with_vlan_tag

ETHERTYPE_MACSEC = 0x88E5
OVERHEAD = 32  # SecTAG (EtherType, TCI/AN, SL, PN, SCI: 16 bytes) and ICV (16 bytes)

KEY_BYTES = 16  # GCM-AES-128
SCI_BYTES = 8
ICV_BYTES = 16
MAX_PN = 2**32 - 1
# TCI: version 0, ES 0, SC 1 (the SCI is in the SecTAG), SCB 0, E 1 and C 1 (encrypted); AN 0.
TCI_AN = 0x20 | 0x08 | 0x04
SHORT_LENGTH = 48  # secure data shorter than this gives its length in SL (padding may follow on the wire)
_MACS = 12
_ETH_HLEN = 14
_SECTAG = struct.Struct("!HBBI")  # EtherType, TCI/AN, SL, PN; the SCI follows
_HEADER = _MACS + _SECTAG.size + SCI_BYTES  # the authenticated bytes before the ciphertext: 28
_SECURE_MIN = 2  # the secure data holds at least the clear frame's EtherType


def _checked(name: str, value: bytes, length: int) -> bytes:
    """Return ``value`` as bytes, or raise ValueError naming it when it is not ``length`` bytes long."""
    if len(value) != length:
        raise ValueError(f"{name} must be {length} bytes, got {len(value)}")
    return bytes(value)


def mac_text(mac: bytes) -> str:
    """A MAC address as text, "aa:bb:cc:dd:ee:ff"."""
    return ":".join(f"{b:02x}" for b in mac)


def sci_of(mac: bytes, port: int = 1) -> bytes:
    """The secure channel identifier of a sender: its MAC and a 16-bit port identifier."""
    _checked("mac", mac, 6)
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port must be 0..65535, got {port}")
    return bytes(mac) + port.to_bytes(2, "big")


class PacketNumberExhausted(RuntimeError):
    """A Sealer sent its last packet number; sealing more under its key would reuse GCM nonces."""


class Sealer:
    """The sending half of one DPU's engine: one secure channel (its SCI), packet numbers from 1."""

    def __init__(self, key: bytes, sci: bytes) -> None:
        self._aead = AESGCM(_checked("key", key, KEY_BYTES))
        self.sci = _checked("sci", sci, SCI_BYTES)
        self.next_pn = 1
        self.sealed_frames = 0
        self.sealed_bytes = 0  # clear bytes
        self.sent_bytes: dict[str, int] = {}  # clear bytes sealed, per destination MAC (conservation)

    def seal(self, frame: bytes) -> bytes:
        """The frame (whole Ethernet frame, no FCS) sealed, with its MACs unchanged."""
        if len(frame) < _ETH_HLEN:
            raise ValueError(f"frame must be at least {_ETH_HLEN} bytes, got {len(frame)}")
        pn = self.next_pn
        if pn > MAX_PN:
            # A real engine never gets here: key agreement (MKA) installs a fresh key well before the PN
            # runs out. A second frame under the same key and PN would reuse a GCM nonce, which gives away
            # the XOR of the two plaintexts and lets anyone forge frames.
            raise PacketNumberExhausted(f"packet numbers of SCI {self.sci.hex()} are exhausted; rekey")
        secure = len(frame) - _MACS
        short = secure if secure < SHORT_LENGTH else 0
        header = bytes(frame[:_MACS]) + _SECTAG.pack(ETHERTYPE_MACSEC, TCI_AN, short, pn) + self.sci
        sealed = header + self._aead.encrypt(self.sci + pn.to_bytes(4, "big"), bytes(frame[_MACS:]), header)
        self.next_pn = pn + 1
        self.sealed_frames += 1
        self.sealed_bytes += len(frame)
        dst = mac_text(frame[:6])
        self.sent_bytes[dst] = self.sent_bytes.get(dst, 0) + len(frame)
        return sealed

    def retract(self, sealed: bytes) -> None:
        """Take back the counts of a sealed frame that was not sent after all (its PN stays used)."""
        clear, dst = len(sealed) - OVERHEAD, mac_text(sealed[:6])
        self.sealed_frames -= 1
        self.sealed_bytes -= clear
        self.sent_bytes[dst] -= clear


@dataclass
class OpenCounts:
    """What an Opener did with the frames it was given: frames, and their bytes as they arrived."""

    opened: int = 0
    opened_bytes: int = 0
    not_sealed: int = 0  # not MACsec at all
    not_sealed_bytes: int = 0
    rejected: int = 0  # bad ICV, malformed SecTAG, truncated, or the receiver's own SCI
    rejected_bytes: int = 0
    not_addressed: int = 0  # sealed for another node (relayed or copied here by a switch): not opened
    not_addressed_bytes: int = 0
    replayed: int = 0  # authentic, but its PN is not above the highest accepted from its SCI
    replayed_bytes: int = 0


class Opener:
    """The receiving half of one DPU's engine: frames from every sender of its pod (one key), each
    sender's packet numbers strictly increasing (MACsec's default replay window, 0)."""

    def __init__(self, key: bytes, *, own_sci: bytes | None = None, own_mac: bytes | None = None) -> None:
        self._aead = AESGCM(_checked("key", key, KEY_BYTES))
        # Frames under the receiver's own SCI are its own, reflected back by a switch: never a peer's.
        self._own = None if own_sci is None else _checked("own_sci", own_sci, SCI_BYTES)
        # With its node's MAC, it opens only frames addressed to it: one a switch relays or copies here from
        # another pod mate's traffic is not this node's, and must not count as received (per-pair conservation).
        self._own_mac = None if own_mac is None else _checked("own_mac", own_mac, 6)
        self._highest: dict[bytes, int] = {}  # per SCI, the highest PN accepted
        self.counts = OpenCounts()
        self.received_bytes: dict[str, int] = {}  # clear bytes opened, per the sender's MAC (its SCI's)

    def open(self, frame: bytes) -> bytes | None:
        """The original frame, or None if it is not sealed, not authentic, replayed or truncated."""
        counts, size = self.counts, len(frame)
        if size >= _ETH_HLEN and int.from_bytes(frame[12:14], "big") != ETHERTYPE_MACSEC:
            counts.not_sealed += 1
            counts.not_sealed_bytes += size
            return None
        if self._own_mac is not None and frame[:6] != self._own_mac:
            counts.not_addressed += 1
            counts.not_addressed_bytes += size
            return None
        pn, sci, end = _parse(frame) or (0, b"", 0)
        clear = None
        if pn and sci != self._own:
            try:
                inner = self._aead.decrypt(sci + pn.to_bytes(4, "big"), bytes(frame[_HEADER:end]), frame[:_HEADER])
                clear = bytes(frame[:_MACS]) + inner
            except InvalidTag:
                pass
        if clear is None:
            counts.rejected += 1
            counts.rejected_bytes += size
            return None
        # Only an authentic frame moves the window: a forged one with a high PN must not stall the sender.
        if pn <= self._highest.get(sci, 0):
            counts.replayed += 1
            counts.replayed_bytes += size
            return None
        self._highest[sci] = pn
        counts.opened += 1
        counts.opened_bytes += size
        sender = mac_text(sci[:6])
        self.received_bytes[sender] = self.received_bytes.get(sender, 0) + len(clear)
        return clear


def _parse(frame: bytes) -> tuple[int, bytes, int] | None:
    """(PN, SCI, end of the ICV) of a well-formed SecTAG, else None. Bytes after the ICV of a short
    frame are the padding that brought it to Ethernet's minimum size; 802.1AE discards them."""
    if len(frame) < _HEADER + _SECURE_MIN + ICV_BYTES:
        return None
    _, tci, short, pn = _SECTAG.unpack_from(frame, _MACS)
    if tci != TCI_AN or short >= SHORT_LENGTH or pn == 0:
        return None
    if short:
        end = _HEADER + short + ICV_BYTES
        if short < _SECURE_MIN or len(frame) < end:
            return None
    else:
        end = len(frame)
        if end - _HEADER - ICV_BYTES < SHORT_LENGTH:  # a short frame that does not say so
            return None
    return pn, bytes(frame[_MACS + _SECTAG.size : _HEADER]), end


# The engine process.

Port = Literal["clear", "seal", "wire"]
PORTS: tuple[Port, ...] = ("clear", "seal", "wire")
_VNET = struct.Struct("=BBHHHH")  # struct virtio_net_hdr, which open_socket's sockets read and write
_NO_VNET = bytes(_VNET.size)  # a finished frame: no checksum or segmentation left to do
_VNET_NEEDS_CSUM = 1
_GSO_NONE = 0
_RECV_BYTES = _VNET.size + 65_535 + 8  # the largest frame a Linux link can carry, two VLAN tags included
_ANC_BYTES = socket.CMSG_SPACE(16) + AUX_SPACE  # the receive timestamp open_socket asks for, then auxdata
_BATCH = 64  # frames read from one socket before looking at the others
_SOCKET_BYTES = 4 << 20
_PACKET_ADD_MEMBERSHIP, _PACKET_MR_PROMISC = 1, 1
_TPACKET_STATS = struct.Struct("=II")


@dataclass
class EngineStats:
    """What the engine did, written to --stats when it stops."""

    forwarded: dict[str, int] = field(default_factory=dict)  # frames per path, "clear->wire" and so on
    dropped: int = 0
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    kernel_drops: int = 0  # frames the kernel dropped because the engine fell behind


class Engine:
    """Where each frame goes, and as what (no sockets: the process below moves the frames)."""

    def __init__(self, key: bytes, mac: bytes) -> None:
        sci = sci_of(mac)
        self.mac = mac
        self.sealer = Sealer(key, sci)
        self.opener = Opener(key, own_sci=sci, own_mac=mac)
        self.stats = EngineStats()

    def route(self, came_in: Port, frame: bytes) -> tuple[Port, bytes] | None:
        """The port a frame that arrived on ``came_in`` leaves by and the frame it leaves as; None: dropped."""
        if came_in == "clear":
            return "wire", frame
        if came_in == "seal":
            if frame[6:12] != self.mac:
                # The MACs stay in the clear: a source of the host's choosing would carry six readable bytes
                # out of the pod in every frame a switch relays. Only the node's own frames are sealed.
                self.drop("not_own_source")
                return None
            try:
                return "wire", self.sealer.seal(frame)
            except (PacketNumberExhausted, ValueError):
                self.drop("not_sealable")  # never out in the clear
                return None
        opened = self.opener.open(frame)
        return ("seal", opened) if opened is not None else ("clear", frame)

    def pass_on(self, came_in: Port, frame: bytes, send: Callable[[Port, bytes], object]) -> None:
        """Route a frame and send it; one that cannot go (too large for the link, queue full) is counted
        as dropped, never fatal."""
        out = self.route(came_in, frame)
        if out is None:
            return
        try:
            send(*out)
        except OSError as exc:
            self.drop("too_large" if exc.errno == errno.EMSGSIZE else "send_failed")
            if came_in == "seal":
                self.sealer.retract(out[1])  # per-peer conservation counts what left
            return
        path = f"{came_in}->{out[0]}"
        self.stats.forwarded[path] = self.stats.forwarded.get(path, 0) + 1

    def drop(self, reason: str) -> None:
        """Count a frame the engine could not pass on."""
        self.stats.dropped += 1
        self.stats.dropped_by_reason[reason] = self.stats.dropped_by_reason.get(reason, 0) + 1

    def report(self) -> dict[str, Any]:
        """The stats file's contents."""
        return {
            "opener": asdict(self.opener.counts),
            "sealed_frames": self.sealer.sealed_frames,
            "sealed_bytes": self.sealer.sealed_bytes,
            "sent_bytes": dict(self.sealer.sent_bytes),
            "received_bytes": dict(self.opener.received_bytes),
            **asdict(self.stats),
        }


def _open(iface: str) -> socket.socket:
    """A socket that reads the frames ``iface`` receives (not those the engine sends) and sends on it."""
    sock = open_socket(iface, way="in", rcvbuf=_SOCKET_BYTES)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BYTES)
        # Frames on the wire are addressed to the hosts, not to this interface: a real NIC would filter them.
        mreq = struct.pack("iHH8s", socket.if_nametoindex(iface), _PACKET_MR_PROMISC, 0, b"")
        sock.setsockopt(SOL_PACKET, _PACKET_ADD_MEMBERSHIP, mreq)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _receive(sock: socket.socket, buf: bytearray, engine: Engine) -> bytes | None:
    """The next whole frame waiting on ``sock`` (its VLAN tag put back), b"" for one dropped, None when
    none is waiting."""
    try:
        n, ancdata, _, _ = sock.recvmsg_into([buf], _ANC_BYTES, socket.MSG_TRUNC)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENETDOWN:  # reported once when the link goes down; a link that flaps is no crash
            return None
        raise
    if n > len(buf) or n < _VNET.size + _ETH_HLEN:
        engine.drop("truncated")
        return b""
    flags, gso_type, *_ = _VNET.unpack_from(buf)
    if flags & _VNET_NEEDS_CSUM or gso_type != _GSO_NONE:
        engine.drop("offloaded")  # checksum or segmentation offloads are on: dpu_lab.offload
        return b""
    return with_vlan_tag(bytes(buf[_VNET.size : n]), ancdata)


def _kernel_drops(sock: socket.socket) -> int:
    """Frames the kernel dropped for ``sock`` since the last call."""
    _, drops = _TPACKET_STATS.unpack(sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size))
    return int(drops)


def run(ifaces: dict[Port, str], engine: Engine, stats: Path | None) -> int:
    """Move frames between the three interfaces until SIGTERM or SIGINT; returns the exit status."""
    stop: list[int] = []

    def request_stop(signum: int, frame: object) -> None:
        stop.append(signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    socks: dict[Port, socket.socket] = {}
    try:
        for port in PORTS:
            socks[port] = _open(ifaces[port])
        buf = bytearray(_RECV_BYTES)

        def send(port: Port, frame: bytes) -> int:
            return socks[port].send(_NO_VNET + frame)

        with selectors.DefaultSelector() as sel:
            for port, sock in socks.items():
                sel.register(sock, selectors.EVENT_READ, port)
            print(f"sealing: ready on {', '.join(f'{p}={ifaces[p]}' for p in PORTS)}", flush=True)
            while not stop:
                for key, _ in sel.select(0.2):  # a signal wakes it; the timeout bounds the wait if not
                    came_in: Port = key.data
                    for _ in range(_BATCH):
                        frame = _receive(socks[came_in], buf, engine)
                        if frame is None:
                            break
                        if frame:
                            engine.pass_on(came_in, frame, send)
        for sock in socks.values():
            engine.stats.kernel_drops += _kernel_drops(sock)
    finally:
        for sock in socks.values():
            sock.close()
        if stats is not None:
            write_json(stats, engine.report())
    return 0


def _mac(text: str) -> bytes:
    """A MAC address from "aa:bb:cc:dd:ee:ff" (argparse type)."""
    if not re.fullmatch(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}", text):
        raise argparse.ArgumentTypeError(f"not a MAC address: {text!r}")
    return bytes.fromhex(text.replace(":", ""))


def _key(line: str) -> bytes | None:
    """The key from its line on stdin (32 hex digits), else None."""
    text = line.strip()
    return bytes.fromhex(text) if re.fullmatch(r"[0-9a-fA-F]{32}", text) else None


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m dpu_lab.sealing", description=__doc__.splitlines()[0])
    parser.add_argument("--clear", required=True, help="interface whose frames go out --wire unchanged")
    parser.add_argument("--seal", required=True, help="interface whose frames go out --wire sealed")
    parser.add_argument("--wire", required=True, help="interface to the pod's switch")
    parser.add_argument("--mac", required=True, type=_mac, help="this DPU's MAC; its SCI is the MAC and port 1")
    parser.add_argument("--stats", type=Path, help="JSON file written when the engine stops")
    args = parser.parse_args(argv)
    # On stdin, never the command line: any process can read another's arguments (ps).
    key = _key(sys.stdin.readline())
    if key is None:
        parser.error("stdin must hold the key: one line of 32 hex digits")
    ifaces: dict[Port, str] = {"clear": args.clear, "seal": args.seal, "wire": args.wire}
    if len(set(ifaces.values())) != len(PORTS):
        parser.error("--clear, --seal and --wire must be three different interfaces")
    try:
        return run(ifaces, Engine(key, args.mac), args.stats)
    except OSError as exc:
        print(f"sealing: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
