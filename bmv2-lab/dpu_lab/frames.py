"""Frames the simulated hosts send: plain UDP or TCP over IPv4, and the shapes evasion traffic takes.

An evading sender wraps the same datagram so that a classifier might not see it as inter-pod IPv4:
in a VLAN tag, in IPv6, in a GRE or VXLAN tunnel, as an IPv4 fragment, or with a spoofed IPv4
source. limiter.p4 must meter every one of them (docs/exemption.md: only traffic positively identified as
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

The red-team shapes (REDTEAM, tests/lab/test_redteam.py) are what an attacker holding limiter.p4's source
would try against its exemptions: frames with EtherType ARP that are no ARP (or ARP padded far past
60 bytes, or minimum-size ARP in a flood), IPv4 whose source and destination both claim the SENDER's
pod (CLAIM_HOST, an unused address of it) while the Ethernet destination is a host in another pod
(or broadcast, or multicast), QinQ, an unknown EtherType, IPv4 headers that lie (version, ihl,
options, totalLen), frames cut short of a header, and fragments claiming intra-pod. Wherever a
frame has room, the marker sits where the receiver's capture reads (its first 134 bytes); frames
too short for one are known to the receiver by the flow port in their source MAC (evasion.py).
"""

from __future__ import annotations

import ipaddress
import struct
from typing import Literal, get_args

Encap = Literal[
    "none",
    "vlan",
    "ipv6",
    "gre",
    "vxlan",
    "fragment",
    # The red team's (REDTEAM below).
    "arp-big",
    "arp-padded",
    "arp-min",
    "arp-malformed",
    "arp-vlan",
    "arp-truncated",
    "intra-claim",
    "intra-claim-bcast",
    "intra-claim-mcast",
    "qinq",
    "vlan-claim",
    "ethertype",
    "ipv4-version",
    "ipv4-ihl",
    "ipv4-options",
    "ipv4-len-long",
    "ipv4-len-short",
    "ipv4-truncated",
    "fragment-claim",
    "fragment-later",
]
ENCAPS: tuple[Encap, ...] = get_args(Encap)
# What each red-team shape is, as docs/lab.md's table and the tests' messages name it.
REDTEAM: dict[Encap, str] = {
    "arp-big": "EtherType ARP, no ARP header, full size, unicast to the receiver",
    "arp-padded": "well-formed ARP reply padded to the size of a full IPv4 frame",
    "arp-min": "well-formed ARP reply of 60 bytes (Ethernet's minimum), flooded",
    "arp-malformed": "60-byte ARP with an unknown operation (3)",
    "arp-vlan": "well-formed 60-byte ARP reply behind a VLAN tag",
    "arp-truncated": "EtherType ARP, one byte short of an ARP header (41 bytes)",
    "intra-claim": "UDP from the sender to an unused address of its own pod, Ethernet to the receiver",
    "intra-claim-bcast": "the same to the broadcast Ethernet address",
    "intra-claim-mcast": "the same to a multicast Ethernet address",
    "qinq": "802.1ad outer tag (0x88a8) and 802.1Q inner tag around intra-pod-claiming IPv4",
    "vlan-claim": "802.1Q tag around intra-pod-claiming IPv4, 1518 bytes at most (a 1500-byte MTU's largest)",
    "ethertype": "an arbitrary EtherType (0x88b5, local experimental)",
    "ipv4-version": "intra-pod-claiming IPv4 header with version 6",
    "ipv4-ihl": "intra-pod-claiming IPv4 header with ihl 4",
    "ipv4-options": "intra-pod-claiming IPv4 with 4 bytes of options (ihl 6)",
    "ipv4-len-long": "intra-pod-claiming IPv4 whose totalLen says 65535",
    "ipv4-len-short": "intra-pod-claiming IPv4 whose totalLen says 28 (headers only)",
    "ipv4-truncated": "EtherType IPv4, one byte short of an IPv4 header (33 bytes)",
    "fragment-claim": "intra-pod-claiming first fragment (more-fragments set, offset 0)",
    "fragment-later": "intra-pod-claiming last fragment (offset 1480)",
}
# Shapes whose IPv4 claims both ends in the sender's pod: source the sender, destination CLAIM_HOST.
CLAIMING: frozenset[Encap] = frozenset(
    ("intra-claim", "intra-claim-bcast", "intra-claim-mcast", "qinq", "vlan-claim", "fragment-claim")
    + ("fragment-later",)
    + ("ipv4-version", "ipv4-ihl", "ipv4-options", "ipv4-len-long", "ipv4-len-short", "ipv4-truncated")
)
# Shapes whose frames have one length whatever the flow's `size`: minimum ARP and truncated headers.
FIXED_LENGTH: dict[Encap, int] = {
    "arp-min": 60,
    "arp-malformed": 60,
    "arp-vlan": 64,
    "arp-truncated": 41,
    "ipv4-truncated": 33,
}

ETH_IPV4, ETH_IPV6, ETH_VLAN, ETH_ARP, ETH_QINQ, ETH_EXPERIMENTAL = 0x0800, 0x86DD, 0x8100, 0x0806, 0x88A8, 0x88B5
BROADCAST = b"\xff" * 6
MULTICAST = bytes.fromhex("01005e00004d")  # the IPv4 multicast MAC of group x.0.0.77
CLAIM_HOST = 77  # the last octet of the sender's-pod address intra-claiming shapes send to
VLAN_ID = 100
INNER_VLAN_ID = 200
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


def _ipv4(
    src: str,
    dst: str,
    proto: int,
    body: bytes,
    flags_frag: int = 0,
    options: bytes = b"",
    version: int = 4,
    ihl: int | None = None,
    total_len: int | None = None,
) -> bytes:
    """An IPv4 header (with its checksum) and `body`; `version`, `ihl` and `total_len` may lie, as an
    evader's would (by default they tell the truth: 4, the header's words, header and body)."""
    words = ihl if ihl is not None else 5 + len(options) // 4
    length = total_len if total_len is not None else 20 + len(options) + len(body)
    header = (
        struct.pack(
            "!BBHHHBBH4s4s",
            version << 4 | words,
            0,
            length & 0xFFFF,
            0,
            flags_frag,
            64,
            proto,
            0,
            ipaddress.IPv4Address(src).packed,
            ipaddress.IPv4Address(dst).packed,
        )
        + options
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


def claimed_dst(src: str) -> str:
    """The address intra-claiming shapes send to: the sender's with its last octet CLAIM_HOST (the lab's
    pods are /24s whose hosts take the first addresses; config.Scenario checks it is in the pod, unused)."""
    return str(ipaddress.IPv4Address((int(ipaddress.IPv4Address(src)) & ~0xFF) | CLAIM_HOST))


def _filler(mark: bytes, n: int) -> bytes:
    """`n` bytes of a body that is no header of any kind: the marker, then zeros."""
    return (mark + bytes(n))[:n]


def _arp(oper: int, src: str, dst: str, src_mac: bytes, dst_mac: bytes) -> bytes:
    """An ARP header (Ethernet, IPv4) from `src` at `src_mac` about `dst` at `dst_mac`."""
    s, d = ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed
    return struct.pack("!HHBBH6s4s6s4s", 1, ETH_IPV4, 6, 4, oper, src_mac, s, dst_mac, d)


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

    `spoof_src` replaces the (outer) IPv4 source address, as a sender forging it would. Red-team shapes
    (REDTEAM) that carry no datagram are as long as the plain frame would be, unless FIXED_LENGTH.
    """
    eth = dst_mac + src_mac
    ip_src = spoof_src or src
    mark = marker(src, dport) if payload >= _MARKED.size else b""
    datagram = _udp(dport, mark + bytes(payload - len(mark)))
    if encap in REDTEAM:
        return _redteam(encap, ip_src, dst, datagram, marker(src, dport), src_mac, dst_mac)
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


def _redteam(encap: Encap, src: str, dst: str, datagram: bytes, mark: bytes, src_mac: bytes, dst_mac: bytes) -> bytes:
    """A red-team shape (REDTEAM) of the frame that would carry `datagram` from `src` to `dst`."""
    eth_ipv4 = dst_mac + src_mac + struct.pack("!H", ETH_IPV4)
    if encap in CLAIMING:
        claim = claimed_dst(src)
        # The Ethernet destination is what decides where the lab's network takes a frame; the IPv4
        # header claims it never leaves the pod.
        to = {"intra-claim-bcast": BROADCAST, "intra-claim-mcast": MULTICAST}.get(encap, dst_mac)
        eth_ipv4 = to + src_mac + struct.pack("!H", ETH_IPV4)
        lies: dict[Encap, bytes] = {
            "intra-claim": _ipv4(src, claim, 17, datagram),
            "intra-claim-bcast": _ipv4(src, claim, 17, datagram),
            "intra-claim-mcast": _ipv4(src, claim, 17, datagram),
            "ipv4-version": _ipv4(src, claim, 17, datagram, version=6),
            "ipv4-ihl": _ipv4(src, claim, 17, datagram, ihl=4),
            "ipv4-options": _ipv4(src, claim, 17, datagram, options=b"\x01\x01\x01\x00"),  # NOP x3, end
            "ipv4-len-long": _ipv4(src, claim, 17, datagram, total_len=0xFFFF),
            "ipv4-len-short": _ipv4(src, claim, 17, datagram, total_len=28),
            "ipv4-truncated": _ipv4(src, claim, 17, datagram)[:19],
            "fragment-claim": _ipv4(src, claim, 17, datagram, flags_frag=0x2000),
            # A last fragment carries data, no UDP header: the marker starts it.
            "fragment-later": _ipv4(src, claim, 17, _filler(mark, len(datagram)), flags_frag=1480 // 8),
        }
        tags = {
            "qinq": struct.pack("!HHHH", ETH_QINQ, VLAN_ID, ETH_VLAN, INNER_VLAN_ID),
            "vlan-claim": struct.pack("!HH", ETH_VLAN, VLAN_ID),
        }
        if encap in tags:
            return dst_mac + src_mac + tags[encap] + struct.pack("!H", ETH_IPV4) + _ipv4(src, claim, 17, datagram)
        return eth_ipv4 + lies[encap]
    eth = dst_mac + src_mac
    body = 20 + len(datagram)  # as long as the IPv4 packet the plain frame would carry
    arp_reply = _arp(2, src, dst, src_mac, dst_mac)
    shapes: dict[Encap, bytes] = {
        "arp-big": struct.pack("!H", ETH_ARP) + _filler(mark, body),
        "arp-padded": struct.pack("!H", ETH_ARP) + arp_reply + _filler(mark, body - len(arp_reply)),
        # Ethernet's 60-byte minimum: the ARP header and 18 bytes of padding, where the marker goes.
        "arp-min": struct.pack("!H", ETH_ARP) + arp_reply + _filler(mark, 18),
        "arp-malformed": struct.pack("!H", ETH_ARP) + _arp(3, src, dst, src_mac, dst_mac) + _filler(mark, 18),
        "arp-vlan": struct.pack("!HHH", ETH_VLAN, VLAN_ID, ETH_ARP) + arp_reply + _filler(mark, 18),
        "arp-truncated": struct.pack("!H", ETH_ARP) + arp_reply[:27],
        "ethertype": struct.pack("!H", ETH_EXPERIMENTAL) + _filler(mark, body),
    }
    return eth + shapes[encap]


def tag_allowance(encap: Encap) -> int:
    """Bytes beyond ETH_MAX a 1500-byte MTU lets the shape's frames have: a Linux sender allows a
    802.1Q tag (EtherType 0x8100 first) on top, not an 802.1ad one."""
    return VLAN_TAG if encap in ("vlan", "arp-vlan", "vlan-claim") else 0


def largest_payload(encap: Encap) -> int:
    """The largest datagram payload whose frame, shaped as `encap`, a 1500-byte MTU carries (for shapes
    of a fixed length, the largest any UDP flow takes: their frames do not grow with it)."""
    if encap in FIXED_LENGTH:
        return ETH_MAX - 42
    overhead = len(frame(encap, "0.0.0.0", "0.0.0.0", 0, 0, bytes(6), bytes(6)))
    return ETH_MAX + tag_allowance(encap) - overhead


# ---------------------------------------------------------------- the wire red team's shapes
#
# A second red team's shapes (tests/lab/test_redteam_wire.py, bmv2-lab/scenarios/redteam-wire.yaml): what else an
# attacker holding limiter.p4 would put on the wire, whose parser knows Ethernet, IPv4 and ARP only. Tunnels and
# carriers the parser never looks into (IPv6 with extension headers, IPv4 in IPv6, MPLS, PPPoE), 802.3 frames (a
# length where the EtherType goes, and the 0x05DD..0x05FF gap that is neither), tag stacks deeper than any parser
# here reads, frames cut to their headers, link-local control frames (pause, PFC, LLDP, STP) to the reserved
# 01:80:c2 addresses and to a host, frames from another host's MAC, IPv4 to broadcast addresses of the pod, a
# datagram that looks like the verifier's probe, and real intra-pod traffic to a pod peer (exempt at a node DPU:
# it must never reach the boundary). They are sent by the test itself (raw sockets in the sender's namespace),
# not as scenario flows: `Encap` and `ENCAPS` stay the corpus above, which tests/lab/test_lab_frames.py and
# tests/lab/test_redteam.py check shape by shape.

WireShape = Literal[
    "ipv6-ext",
    "ipv6-frag",
    "ipv4-in-ipv6",
    "mpls",
    "mpls-mcast",
    "pppoe-session",
    "pppoe-discovery",
    "probe-lookalike",
    "llc-snap",
    "llc-gap",
    "llc-len-short",
    "vlan-stack3",
    "vlan-9100",
    "vlan-prio",
    "runt",
    "ipv4-bare",
    "pause",
    "pfc",
    "lldp",
    "lldp-unicast",
    "stp",
    "src-foreign",
    "src-peer",
    "ipv4-bcast-pod",
    "ipv4-bcast-all",
    "arp-request-bcast",
    "intra-peer",
]
WIRE_SHAPES: tuple[WireShape, ...] = get_args(WireShape)
# What each shape is, as the test's messages name it.
WIRE_REDTEAM: dict[WireShape, str] = {
    "ipv6-ext": "IPv6 with hop-by-hop, routing and destination-options headers, then UDP, to the receiver",
    "ipv6-frag": "IPv6 first fragment (fragment header, more-fragments set) of a UDP datagram",
    "ipv4-in-ipv6": "IPv6 (next header 4) around intra-pod-claiming IPv4",
    "mpls": "MPLS unicast (0x8847), two labels, around intra-pod-claiming IPv4",
    "mpls-mcast": "MPLS multicast (0x8848), one label, around intra-pod-claiming IPv4",
    "pppoe-session": "PPPoE session (0x8864), PPP protocol IPv4, around intra-pod-claiming IPv4",
    "pppoe-discovery": "PPPoE discovery (0x8863) PADI whose tags carry the data",
    "probe-lookalike": "UDP to the probe port whose payload starts as a probe of the sender's pod (DLP1, pod a)",
    "llc-snap": "802.3 length 1500, LLC/SNAP with EtherType IPv4, around intra-pod-claiming IPv4",
    "llc-gap": "type/length 0x05FF (neither a length nor an EtherType), then intra-pod-claiming IPv4",
    "llc-len-short": "802.3 length 46 on a full-size frame (the length lies), LLC UI",
    "vlan-stack3": "three 802.1Q tags around intra-pod-claiming IPv4",
    "vlan-9100": "a tag with the pre-802.1ad QinQ TPID 0x9100 around intra-pod-claiming IPv4",
    "vlan-prio": "802.1Q priority tag (VID 0, PCP 7) around intra-pod-claiming IPv4",
    "runt": "14 bytes: an Ethernet header with EtherType IPv4 and nothing after it",
    "ipv4-bare": "34 bytes: an intra-pod-claiming IPv4 header (totalLen 20) and nothing after it",
    "pause": "802.3x PAUSE (0x8808, opcode 1) to 01:80:c2:00:00:01, full size",
    "pfc": "PFC (0x8808, opcode 0x0101, every class paused) unicast to the receiver, full size",
    "lldp": "LLDP (0x88cc) to the nearest-bridge address 01:80:c2:00:00:0e, full size",
    "lldp-unicast": "LLDP (0x88cc) unicast to the receiver, full size",
    "stp": "an 802.3/LLC STP BPDU to 01:80:c2:00:00:00, padded to full size",
    "src-foreign": "UDP from the sender to the receiver with the receiver's own MAC (another pod's host) as source",
    "src-peer": "intra-pod-claiming UDP to the receiver with a pod peer's MAC as source",
    "ipv4-bcast-pod": "UDP to the sender's pod's directed broadcast address (x.x.x.255), Ethernet to the receiver",
    "ipv4-bcast-all": "UDP to 255.255.255.255, Ethernet broadcast",
    "arp-request-bcast": "well-formed 60-byte ARP request to the Ethernet broadcast address, flooded",
    "intra-peer": "real intra-pod UDP to a pod peer at its MAC (exempt at a node DPU, sealed)",
}
# Shapes whose frames have one length whatever the payload.
WIRE_FIXED_LENGTH: dict[WireShape, int] = {"runt": 14, "ipv4-bare": 34, "arp-request-bcast": 60}
# Shapes that claim both ends in the sender's pod (frames.claimed_dst), as CLAIMING does.
WIRE_CLAIMING: frozenset[WireShape] = frozenset(
    ("ipv4-in-ipv6", "mpls", "mpls-mcast", "pppoe-session", "llc-snap", "llc-gap", "vlan-stack3", "vlan-9100")
    + ("vlan-prio", "ipv4-bare", "src-peer")
)

ETH_MPLS, ETH_MPLS_MCAST, ETH_PPPOE_DISC, ETH_PPPOE_SESS = 0x8847, 0x8848, 0x8863, 0x8864
ETH_MAC_CONTROL, ETH_LLDP, ETH_QINQ_OLD = 0x8808, 0x88CC, 0x9100
PAUSE_MAC = bytes.fromhex("0180c2000001")
LLDP_MAC = bytes.fromhex("0180c200000e")
STP_MAC = bytes.fromhex("0180c2000000")
LLC_GAP = 0x05FF  # above 1500 (no 802.3 length) and below 0x0600 (no EtherType)
PROBE_PORT = 60000  # the verifier's probe port in docs/probes.md's example
IPV6_HBH, IPV6_ROUTING, IPV6_FRAGMENT, IPV6_DSTOPTS = 0, 43, 44, 60


def _ipv6_header(src: str, dst: str, next_header: int, body: bytes) -> bytes:
    """An IPv6 header with IPv4-mapped addresses (the same hosts, seen through IPv6) and `body`."""
    s = ipaddress.IPv6Address(f"::ffff:{src}").packed
    d = ipaddress.IPv6Address(f"::ffff:{dst}").packed
    return struct.pack("!IHBB", 6 << 28, len(body), next_header, 64) + s + d + body


def _ipv6_ext(next_header: int, body: bytes = b"") -> bytes:
    """An 8-byte IPv6 extension header (hop-by-hop, routing or destination options) padded with PadN."""
    if body:
        return struct.pack("!BB", next_header, 0) + body
    return struct.pack("!BBBB", next_header, 0, 1, 4) + bytes(4)  # PadN of 4 bytes fills the 8


def _mpls(labels: list[int], inner: bytes) -> bytes:
    """An MPLS label stack (TTL 64, bottom of stack on the last) and `inner`."""
    stack = b"".join(
        struct.pack("!I", label << 12 | (1 << 8 if k == len(labels) - 1 else 0) | 64) for k, label in enumerate(labels)
    )
    return stack + inner


def _mac_control(opcode: int, quanta: bytes, mark: bytes, size: int) -> bytes:
    """A MAC control frame's body (after its EtherType) of `size` bytes: opcode, parameters, then the data."""
    head = struct.pack("!H", opcode) + quanta
    return head + _filler(mark, size - len(head))


def _lldp(src_mac: bytes, mark: bytes, size: int) -> bytes:
    """An LLDPDU of `size` bytes: chassis ID, port ID, TTL, an organizationally specific TLV with the data, end."""

    def tlv(kind: int, value: bytes) -> bytes:
        return struct.pack("!H", kind << 9 | len(value)) + value

    head = tlv(1, b"\x04" + src_mac) + tlv(2, b"\x07eth0") + tlv(3, b"\x00\x78")
    room = size - len(head) - 2 - 2  # the org TLV's header and the end TLV
    return head + tlv(127, _filler(b"\x00\x80\xc2\x7f" + mark, room)) + struct.pack("!H", 0)


def _probe_lookalike(dport: int, mark: bytes, size: int) -> bytes:
    """A UDP datagram of `size` payload bytes that starts as a probe of pod "a" would (docs/probes.md): magic,
    name, burst 0, sequence 0, a send time, no report, zeros, a tag of zeros (it cannot know the pod's key)."""
    body = b"DLP1" + b"\x01a" + struct.pack("!IIdIQI", 0, 0, 0.0, 0xFFFFFFFF, 0, 0) + mark
    return _udp(dport, (body + bytes(size))[:size])


def wire_frame(
    shape: WireShape,
    src: str,
    dst: str,
    dport: int,
    payload: int,
    src_mac: bytes,
    dst_mac: bytes,
    peer: tuple[str, bytes] | None = None,
) -> bytes:
    """One frame of a wire red-team shape (WIRE_REDTEAM) from `src` at `src_mac` toward `dst` at `dst_mac`, as long
    as a `payload`-byte UDP datagram's plain frame would be (unless WIRE_FIXED_LENGTH); `peer` is a pod mate's
    (address, MAC), which "src-peer" and "intra-peer" need."""
    mark = marker(src, dport)

    def udp(less: int = 0) -> bytes:
        """The datagram, its payload `less` bytes shorter (room for what a shape adds), the marker first."""
        n = max(0, payload - less)
        return _udp(dport, (mark + bytes(n))[:n])

    def claiming(less: int = 0) -> bytes:
        """IPv4 from `src` to an unused address of its own pod (claimed_dst) around udp(less)."""
        return _ipv4(src, claimed_dst(src), 17, udp(less))

    datagram = udp()
    claim = claimed_dst(src)
    eth = dst_mac + src_mac
    size = 20 + len(datagram)  # the IPv4 packet the plain frame would carry: what follows the EtherType
    if shape in ("src-peer", "intra-peer"):
        if peer is None:
            raise ValueError(f"{shape} needs a pod peer's address and MAC")
        if shape == "intra-peer":
            return peer[1] + src_mac + struct.pack("!H", ETH_IPV4) + _ipv4(src, peer[0], 17, datagram)
        return dst_mac + peer[1] + struct.pack("!H", ETH_IPV4) + claiming()
    ipv4 = struct.pack("!H", ETH_IPV4)
    shapes: dict[WireShape, bytes] = {}
    if shape == "ipv6-ext":
        # Hop-by-hop, routing (type 0, no segments left) and destination options: 40 + 24 bytes for IPv4's 20.
        chain = _ipv6_ext(IPV6_ROUTING) + _ipv6_ext(IPV6_DSTOPTS, bytes(6)) + _ipv6_ext(17)
        shapes[shape] = struct.pack("!H", ETH_IPV6) + _ipv6_header(src, claim, IPV6_HBH, chain + udp(44))
    elif shape == "ipv6-frag":
        frag = struct.pack("!BBHI", 17, 0, 1, 0x1234)  # offset 0, more fragments
        shapes[shape] = struct.pack("!H", ETH_IPV6) + _ipv6_header(src, dst, IPV6_FRAGMENT, frag + udp(28))
    elif shape == "ipv4-in-ipv6":
        shapes[shape] = struct.pack("!H", ETH_IPV6) + _ipv6_header(src, claim, 4, claiming(40))
    elif shape == "mpls":
        shapes[shape] = struct.pack("!H", ETH_MPLS) + _mpls([16, 17], claiming(8))
    elif shape == "mpls-mcast":
        shapes[shape] = struct.pack("!H", ETH_MPLS_MCAST) + _mpls([18], claiming(4))
    elif shape == "pppoe-session":
        ppp = struct.pack("!H", 0x0021) + claiming(8)
        shapes[shape] = struct.pack("!HBBHH", ETH_PPPOE_SESS, 0x11, 0, 0x0001, len(ppp)) + ppp
    elif shape == "pppoe-discovery":
        tag = struct.pack("!HH", 0x0103, size - 10) + _filler(mark, size - 10)  # Host-Uniq: the data
        shapes[shape] = struct.pack("!H", ETH_PPPOE_DISC) + struct.pack("!BBHH", 0x11, 0x09, 0, len(tag)) + tag
    elif shape == "probe-lookalike":
        shapes[shape] = ipv4 + _ipv4(src, dst, 17, _probe_lookalike(PROBE_PORT, mark, payload))
    elif shape == "llc-snap":
        snap = b"\xaa\xaa\x03\x00\x00\x00" + ipv4
        shapes[shape] = struct.pack("!H", size) + snap + claiming(8)
    elif shape == "llc-gap":
        shapes[shape] = struct.pack("!H", LLC_GAP) + claiming()
    elif shape == "llc-len-short":
        shapes[shape] = struct.pack("!H", 46) + b"\x42\x42\x03" + _filler(mark, size - 3)
    elif shape in ("vlan-stack3", "vlan-9100", "vlan-prio"):
        tags = {
            "vlan-stack3": struct.pack("!HHHHHH", ETH_VLAN, VLAN_ID, ETH_VLAN, INNER_VLAN_ID, ETH_VLAN, 300),
            "vlan-9100": struct.pack("!HH", ETH_QINQ_OLD, VLAN_ID),
            "vlan-prio": struct.pack("!HH", ETH_VLAN, 7 << 13),
        }[shape]
        shapes[shape] = tags + ipv4 + claiming(len(tags))
    elif shape == "runt":
        shapes[shape] = ipv4
    elif shape == "ipv4-bare":
        shapes[shape] = ipv4 + _ipv4(src, claim, 17, b"")
    elif shape == "pause":
        return PAUSE_MAC + src_mac + struct.pack("!H", ETH_MAC_CONTROL) + _mac_control(1, b"\xff\xff", mark, size)
    elif shape == "pfc":
        quanta = struct.pack("!H", 0xFF) + b"\xff\xff" * 8  # class-enable vector, then a time per class
        shapes[shape] = struct.pack("!H", ETH_MAC_CONTROL) + _mac_control(0x0101, quanta, mark, size)
    elif shape == "lldp":
        return LLDP_MAC + src_mac + struct.pack("!H", ETH_LLDP) + _lldp(src_mac, mark, size)
    elif shape == "lldp-unicast":
        shapes[shape] = struct.pack("!H", ETH_LLDP) + _lldp(src_mac, mark, size)
    elif shape == "stp":
        bpdu = b"\x42\x42\x03" + struct.pack("!HBB", 0, 0, 0) + bytes(31)  # configuration BPDU, all zero
        return STP_MAC + src_mac + struct.pack("!H", size) + bpdu + _filler(mark, size - len(bpdu))
    elif shape == "src-foreign":
        return dst_mac + dst_mac + ipv4 + _ipv4(src, dst, 17, datagram)
    elif shape == "ipv4-bcast-pod":
        pod_bcast = str(ipaddress.IPv4Address(int(ipaddress.IPv4Address(src)) | 0xFF))
        shapes[shape] = ipv4 + _ipv4(src, pod_bcast, 17, datagram)
    elif shape == "ipv4-bcast-all":
        return BROADCAST + src_mac + ipv4 + _ipv4(src, "255.255.255.255", 17, datagram)
    elif shape == "arp-request-bcast":
        request = _arp(1, src, dst, src_mac, bytes(6))
        return BROADCAST + src_mac + struct.pack("!H", ETH_ARP) + request + _filler(mark, 18)
    return eth + shapes[shape]


def wire_largest_payload(shape: WireShape) -> int:
    """The largest datagram payload whose frame, shaped as `shape`, a 1500-byte MTU carries (every shape is as
    long as the plain frame, so the plain frame's: 1472)."""
    return ETH_MAX - 42


def ipv4_packet(src: str, dst: str, proto: int, body: bytes) -> bytes:
    """An IPv4 packet from `src` to `dst` carrying `body` as protocol `proto`, its header checksum filled in."""
    return _ipv4(src, dst, proto, body)
