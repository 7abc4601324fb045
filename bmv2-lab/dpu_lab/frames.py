"""Frames the simulated hosts send: plain UDP or TCP over IPv4, and the shapes evasion traffic takes.

An evading sender wraps the same datagram so that a classifier might not see it as inter-pod IPv4:
in a VLAN tag, in IPv6, in a GRE or VXLAN tunnel, as an IPv4 fragment, or with a spoofed IPv4
source. limiter.p4 must meter every one of them (DESIGN.md: only traffic positively identified as
intra-pod is exempt).

The simulator routes and attributes frames by their Ethernet addresses, never by what an evader
may forge: a host's MAC is 02:PP:HH:00:00:00 (pod and host index), and a sender puts its flow's
port in the last two bytes of its source MAC, so receivers know the true sender and flow of any
frame, whatever it encapsulates. Checksums are left zero: nothing on the path checks them.
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


def host_mac(pod_index: int, host_index: int, port: int = 0) -> bytes:
    """A host's MAC, with a flow's port in its last two bytes when it is a source address."""
    return bytes([0x02, pod_index, host_index, 0, port >> 8, port & 0xFF])


def mac_host(mac: bytes) -> tuple[int, int]:
    """(pod index, host index) of a MAC made by host_mac."""
    return mac[1], mac[2]


def mac_port(mac: bytes) -> int:
    """The flow port carried in a source MAC."""
    return (mac[4] << 8) | mac[5]


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
    return header + body


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
    datagram = _udp(dport, bytes(payload))
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
