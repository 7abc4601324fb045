"""Frames the simulated hosts send: plain UDP or TCP over IPv4, and the shapes evasion traffic takes.

An evading sender wraps the same datagram so that a classifier might not see it as inter-pod IPv4:
in a VLAN tag, in IPv6, in a GRE or VXLAN tunnel, as an IPv4 fragment, or with a spoofed IPv4
source. limiter.p4 must meter every one of them (DESIGN.md: only traffic positively identified as
intra-pod is exempt).

The simulator routes and attributes frames by their Ethernet addresses, never by what an evader
may forge: a host's MAC is 02:PP:HH:00:00:00 (pod and host index), and a sender puts its flow's
port in the last two bytes of its source MAC, so receivers know the true sender and flow of any
frame, whatever it encapsulates. IPv4 headers carry their checksums (a Linux bridge drops IPv4 whose
header checksum is wrong); UDP checksums are left zero (none, over IPv4): nothing on the path checks them.

In real time (evasion.py) routers rewrite no MACs for these frames (netns.py switches them by
destination MAC), but a receiver's capture cannot tell hosts by source MAC alone; so the datagram's
payload starts with a marker, MARK followed by the true sender's IPv4 address and the flow's port,
which receivers find wherever the shape puts the datagram.
"""

from __future__ import annotations

import ipaddress
import struct
from typing import Literal

Encap = Literal["none", "vlan", "ipv6", "gre", "vxlan", "fragment"]
ENCAPS: tuple[Encap, ...] = ("none", "vlan", "ipv6", "gre", "vxlan", "fragment")

ETH_IPV4, ETH_IPV6, ETH_VLAN = 0x0800, 0x86DD, 0x8100
VLAN_ID = 100
VXLAN_PORT = 4789
VNI = 42
SPORT = 40000
MARK = b"DPULAB"
_MARKED = struct.Struct("!6s4sH")  # MARK, the true sender's IPv4 address, the flow's port
ETH_MAX = 1514  # the largest untagged frame a 1500-byte MTU carries (no FCS)
VLAN_TAG = 4


def host_mac(pod_index: int, host_index: int, port: int = 0) -> bytes:
    """A host's MAC, with a flow's port in its last two bytes when it is a source address."""
    return bytes([0x02, pod_index, host_index, 0, port >> 8, port & 0xFF])


def mac_host(mac: bytes) -> tuple[int, int]:
    """(pod index, host index) of a MAC made by host_mac."""
    return mac[1], mac[2]


def mac_port(mac: bytes) -> int:
    """The flow port carried in a source MAC."""
    return (mac[4] << 8) | mac[5]


def shape(encap: Encap, spoof_src: str | None) -> str:
    """How a flow's frames evade, as reports name it: "vxlan", "spoof_src 10.0.2.7", both, or "" (none)."""
    return ", ".join(([encap] if encap != "none" else []) + ([f"spoof_src {spoof_src}"] if spoof_src else []))


def marker(src: str, port: int) -> bytes:
    """The start of every datagram payload: who really sent it, on which flow."""
    return _MARKED.pack(MARK, ipaddress.IPv4Address(src).packed, port)


def marked(data: bytes | bytearray) -> tuple[str, int] | None:
    """(true sender's IPv4 address, flow port) from the marker in a frame's first bytes, if there is one."""
    if data[12:14] == b"\x08\x00" and data[23:24] == b"\x01":
        return None  # ICMP: an error quotes the datagram it answers, marker and all, but it is not that datagram
    at = data.find(MARK)
    if at < 0 or at + _MARKED.size > len(data):
        return None
    _, src, port = _MARKED.unpack_from(data, at)
    return str(ipaddress.IPv4Address(src)), port


def _checksum(header: bytes) -> int:
    """The Internet checksum of an IPv4 header (RFC 1071) whose checksum field is zero."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ipv4(src: str, dst: str, proto: int, body: bytes, flags_frag: int = 0) -> bytes:
    header = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        (20 + len(body)) & 0xFFFF,
        0,
        flags_frag,
        64,
        proto,
        0,
        ipaddress.IPv4Address(src).packed,
        ipaddress.IPv4Address(dst).packed,
    )
    return header[:10] + struct.pack("!H", _checksum(header)) + header[12:] + body


def _udp(dport: int, payload: bytes) -> bytes:
    return struct.pack("!HHHH", SPORT, dport, (8 + len(payload)) & 0xFFFF, 0) + payload


TCP_ACK = 0x10
TCP_HEADER_BYTES = 20
SEQ_OFFSET = 14 + 20 + 4  # where a plain TCP/IPv4 frame's sequence number starts (the ack follows)


def tcp_frame(
    src: str, dst: str, sport: int, dport: int, window: int, payload: int, src_mac: bytes, dst_mac: bytes
) -> bytes:
    """A TCP/IPv4 frame (ACK flag, sequence and ack numbers zero: senders patch them in place)."""
    # The window field is scaled by 2**14 (a window-scale option at the handshake, not modelled).
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, TCP_ACK, min(window >> 14, 0xFFFF), 0, 0)
    return dst_mac + src_mac + struct.pack("!H", ETH_IPV4) + _ipv4(src, dst, 6, tcp + bytes(payload))


def _ipv6(src: str, dst: str, body: bytes) -> bytes:
    # IPv4-mapped addresses: the same hosts, seen through IPv6.
    s = ipaddress.IPv6Address(f"::ffff:{src}").packed
    d = ipaddress.IPv6Address(f"::ffff:{dst}").packed
    return struct.pack("!IHBB", 6 << 28, len(body), 17, 64) + s + d + body


def frame(
    encap: Encap,
    src: str,
    dst: str,
    dport: int,
    payload: int,
    src_mac: bytes,
    dst_mac: bytes,
    spoof_src: str | None = None,
) -> bytes:
    """One frame carrying a `payload`-byte UDP datagram from `src` to `dst`, shaped as `encap`.

    `spoof_src` replaces the (outer) IPv4 source address, as a sender forging it would.
    """
    eth = dst_mac + src_mac
    ip_src = spoof_src or src
    mark = marker(src, dport) if payload >= _MARKED.size else b""
    datagram = _udp(dport, mark + bytes(payload - len(mark)))
    if encap == "none":
        return eth + struct.pack("!H", ETH_IPV4) + _ipv4(ip_src, dst, 17, datagram)
    if encap == "vlan":
        return eth + struct.pack("!HHH", ETH_VLAN, VLAN_ID, ETH_IPV4) + _ipv4(ip_src, dst, 17, datagram)
    if encap == "ipv6":
        return eth + struct.pack("!H", ETH_IPV6) + _ipv6(src, dst, datagram)
    if encap == "fragment":
        # A first fragment (more-fragments set): its header looks like any datagram's.
        return eth + struct.pack("!H", ETH_IPV4) + _ipv4(ip_src, dst, 17, datagram, flags_frag=0x2000)
    inner = _ipv4(src, dst, 17, datagram)
    if encap == "gre":
        return eth + struct.pack("!H", ETH_IPV4) + _ipv4(ip_src, dst, 47, struct.pack("!HH", 0, ETH_IPV4) + inner)
    # vxlan: a whole inner Ethernet frame in UDP to port 4789.
    vxlan = struct.pack("!II", 0x08000000, VNI << 8) + eth + struct.pack("!H", ETH_IPV4) + inner
    return eth + struct.pack("!H", ETH_IPV4) + _ipv4(ip_src, dst, 17, _udp(VXLAN_PORT, vxlan))


def largest_payload(encap: Encap) -> int:
    """The largest datagram payload whose frame, shaped as `encap`, a 1500-byte MTU carries."""
    overhead = len(frame(encap, "0.0.0.0", "0.0.0.0", 0, 0, bytes(6), bytes(6)))
    return ETH_MAX + (VLAN_TAG if encap == "vlan" else 0) - overhead
