"""The lab's evasion frames, parsed by scapy: every shape is what it claims to be, with valid IPv4 header
checksums and a marker naming its true sender and flow (or, too short for one, a source MAC naming the
flow); the largest payload each shape fits in an MTU."""

from __future__ import annotations

import struct

import pytest
from scapy.layers.inet import GRE, ICMP, IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1AD, Dot1Q, Ether
from scapy.layers.vxlan import VXLAN

from dpu_lab.evasion import ours
from dpu_lab.frames import (
    BROADCAST,
    CLAIMING,
    ENCAPS,
    ETH_MAX,
    FIXED_LENGTH,
    MULTICAST,
    REDTEAM,
    claimed_dst,
    frame,
    host_mac,
    largest_payload,
    mac_host,
    mac_port,
    marked,
)

SRC, DST = host_mac(0, 1, port=5201), host_mac(1, 2)
EVASION = [e for e in ENCAPS if e not in REDTEAM]
HEAD = 134  # what a receiver's capture reads of a frame (capture._HEADER_BYTES without the virtio header)


@pytest.mark.parametrize("encap", EVASION)
def test_each_shape_carries_the_datagram(encap: str) -> None:
    raw = frame(encap, "10.0.1.1", "10.0.2.1", 5201, 1000, SRC, DST)  # type: ignore[arg-type]
    pkt = Ether(raw)
    assert pkt.src == "02:00:01:00:14:51" and mac_host(raw[6:12]) == (0, 1) and mac_port(raw[6:12]) == 5201
    assert mac_host(raw[0:6]) == (1, 2)
    if encap == "vlan":
        assert pkt[Dot1Q].vlan == 100 and pkt[Dot1Q].type == 0x0800
    if encap == "ipv6":
        assert pkt[IPv6].dst == "::ffff:10.0.2.1" and pkt[IPv6].nh == 17
    elif encap == "fragment":
        assert pkt[IP].flags == "MF" and pkt[IP].frag == 0
    elif encap == "gre":
        assert pkt[IP].proto == 47 and pkt[GRE].proto == 0x0800 and pkt[GRE][IP].dst == "10.0.2.1"
    elif encap == "vxlan":
        assert pkt[UDP].dport == 4789 and pkt[VXLAN].vni == 42 and pkt[VXLAN][IP].dst == "10.0.2.1"
    else:
        assert pkt[IP].src == "10.0.1.1" and pkt[IP].dst == "10.0.2.1"
    inner = pkt[UDP] if encap != "vxlan" else pkt[VXLAN][UDP]
    assert inner.dport == 5201 and len(inner.payload) == 1000
    # Every IPv4 header, outer and tunnelled, has its checksum: a Linux bridge drops IPv4 with a wrong one.
    for ip in (pkt.getlayer(IP, nb=n) for n in (1, 2)):
        if ip is not None:
            fresh = ip.copy()
            del fresh.chksum
            assert IP(bytes(fresh)).chksum == ip.chksum
    assert marked(raw) == ("10.0.1.1", 5201)


def test_the_marker_names_the_true_sender_and_icmp_quoting_it_is_not_marked() -> None:
    raw = frame("none", "10.0.1.1", "10.0.2.1", 5201, 100, SRC, DST, spoof_src="10.0.2.7")
    assert marked(raw) == ("10.0.1.1", 5201)
    assert marked(frame("none", "10.0.1.1", "10.0.2.1", 5201, 10, SRC, DST)) is None  # too short for a marker
    # An ICMP error from the receiver quotes the datagram, marker and all: it is the receiver's own.
    error = bytes(Ether(src=DST, dst=SRC) / IP(src="10.0.2.1", dst="10.0.1.1") / ICMP(type=3, code=3) / raw[14:])
    assert b"DPULAB" in error and marked(error) is None


@pytest.mark.parametrize("encap", [e for e in ENCAPS if e not in FIXED_LENGTH])
def test_the_largest_payload_fills_an_mtu(encap: str) -> None:
    most = largest_payload(encap)  # type: ignore[arg-type]
    raw = frame(encap, "10.0.1.1", "10.0.2.1", 5201, most, SRC, DST)  # type: ignore[arg-type]
    # A Linux sender allows a 802.1Q tag on top of the MTU, not an 802.1ad one (QinQ's outer tag).
    assert len(raw) == ETH_MAX + (4 if encap in ("vlan", "arp-vlan", "vlan-claim") else 0)
    assert largest_payload("none") == 1472 and largest_payload("vxlan") == 1422 and largest_payload("qinq") == 1464


def test_a_spoofed_source_changes_only_the_ip_header() -> None:
    raw = frame("none", "10.0.1.1", "10.0.2.1", 5201, 10, SRC, DST, spoof_src="10.0.2.7")
    assert Ether(raw)[IP].src == "10.0.2.7" and mac_host(raw[6:12]) == (0, 1)


def _checksum_ok(header: bytes) -> bool:
    """Whether an IPv4 header's checksum is right for its bytes (a Linux bridge drops it otherwise)."""
    words = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while words > 0xFFFF:
        words = (words & 0xFFFF) + (words >> 16)
    return words == 0xFFFF


def redteam(encap: str, payload: int = 1000) -> bytes:
    """A red-team frame from 10.0.1.1 (flow 5201) to 10.0.2.1."""
    return frame(encap, "10.0.1.1", "10.0.2.1", 5201, payload, SRC, DST)  # type: ignore[arg-type]


@pytest.mark.parametrize("encap", list(REDTEAM))
def test_each_red_team_shape_is_what_it_says(encap: str) -> None:
    raw = redteam(encap)
    pkt = Ether(raw)
    # As long as the plain frame (with QinQ's tags, the options), or of the shape's fixed length.
    plain = len(redteam("none")) + {"qinq": 8, "vlan-claim": 4, "ipv4-options": 4}.get(encap, 0)
    assert len(raw) == FIXED_LENGTH.get(encap, plain)  # type: ignore[call-overload]
    assert raw[6:12] == SRC
    dst_mac = {"intra-claim-bcast": BROADCAST, "intra-claim-mcast": MULTICAST}.get(encap, DST)
    assert raw[0:6] == dst_mac
    if encap in CLAIMING and encap != "ipv4-truncated":
        at = {"qinq": 22, "vlan-claim": 18}.get(encap, 14)  # the IPv4 header, after any tags
        header = raw[at : at + (24 if encap == "ipv4-options" else 20)]
        assert (header[12:16], header[16:20]) == (bytes([10, 0, 1, 1]), bytes([10, 0, 1, 77])), "the sender's pod"
        assert _checksum_ok(header)
    checks = {
        "arp-big": lambda: pkt.type == 0x0806 and raw[14:20] == b"DPULAB",
        "arp-padded": lambda: pkt[ARP].op == 2 and pkt[ARP].psrc == "10.0.1.1" and pkt[ARP].pdst == "10.0.2.1",
        "arp-min": lambda: (
            (pkt[ARP].hwtype, pkt[ARP].ptype, pkt[ARP].hwlen, pkt[ARP].plen, pkt[ARP].op) == (1, 0x0800, 6, 4, 2)
        ),
        "arp-malformed": lambda: pkt[ARP].op == 3,
        "arp-vlan": lambda: pkt[Dot1Q].type == 0x0806 and pkt[ARP].op == 2,
        "arp-truncated": lambda: pkt.type == 0x0806 and len(raw) == 14 + 27,
        "intra-claim": lambda: pkt[UDP].dport == 5201,
        "intra-claim-bcast": lambda: pkt[UDP].dport == 5201,
        "intra-claim-mcast": lambda: raw[0] & 1 == 1 and pkt[UDP].dport == 5201,
        "qinq": lambda: pkt.type == 0x88A8 and pkt[Dot1AD].type == 0x8100 and pkt[Dot1Q].type == 0x0800,
        "vlan-claim": lambda: pkt[Dot1Q].vlan == 100 and pkt[Dot1Q].type == 0x0800,
        "ethertype": lambda: pkt.type == 0x88B5,
        "ipv4-version": lambda: raw[14] == 0x65,
        "ipv4-ihl": lambda: raw[14] == 0x44,
        "ipv4-options": lambda: pkt[IP].ihl == 6 and pkt[UDP].dport == 5201,
        "ipv4-len-long": lambda: pkt[IP].len == 65535,
        "ipv4-len-short": lambda: pkt[IP].len == 28 and len(raw) - 14 > 28,
        "ipv4-truncated": lambda: pkt.type == 0x0800 and raw[14] == 0x45 and len(raw) == 14 + 19,
        "fragment-claim": lambda: pkt[IP].flags == "MF" and pkt[IP].frag == 0,
        "fragment-later": lambda: pkt[IP].flags == 0 and pkt[IP].frag == 185 and raw[34:40] == b"DPULAB",
    }
    assert checks[encap](), REDTEAM[encap]  # type: ignore[index]
    # The receiver of flow 5201 knows every shape as its own: by the marker within what its capture reads,
    # or, in the two frames too short for one, by the flow port in the source MAC.
    if encap in ("arp-truncated", "ipv4-truncated"):
        assert marked(raw) is None
    else:
        assert marked(raw[:HEAD]) == ("10.0.1.1", 5201)
    assert ours(raw[:HEAD], 5201) and not ours(raw[:HEAD], 5202)


def test_the_claim_is_an_unused_address_of_the_senders_pod_and_other_macs_are_not_a_flows() -> None:
    assert claimed_dst("10.0.1.1") == "10.0.1.77" and claimed_dst("192.168.7.200") == "192.168.7.77"
    # A routed frame's source MAC is the router's: it names no flow, however its last bytes read.
    routed = bytes.fromhex("0201010000005e6d2c0014510800") + bytes(20)
    assert not ours(routed, 0x1451)
