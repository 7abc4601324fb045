"""The lab's evasion frames, parsed by scapy: every shape is what it claims to be, with valid IPv4 header
checksums and a marker naming its true sender and flow; the largest payload each shape fits in an MTU."""

from __future__ import annotations

import pytest
from scapy.layers.inet import GRE, ICMP, IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.layers.vxlan import VXLAN

from dpu_lab.frames import ENCAPS, ETH_MAX, frame, host_mac, largest_payload, mac_host, mac_port, marked

SRC, DST = host_mac(0, 1, port=5201), host_mac(1, 2)


@pytest.mark.parametrize("encap", ENCAPS)
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


@pytest.mark.parametrize("encap", ENCAPS)
def test_the_largest_payload_fills_an_mtu(encap: str) -> None:
    most = largest_payload(encap)  # type: ignore[arg-type]
    raw = frame(encap, "10.0.1.1", "10.0.2.1", 5201, most, SRC, DST)  # type: ignore[arg-type]
    assert len(raw) == ETH_MAX + (4 if encap == "vlan" else 0)
    assert largest_payload("none") == 1472 and largest_payload("vxlan") == 1422


def test_a_spoofed_source_changes_only_the_ip_header() -> None:
    raw = frame("none", "10.0.1.1", "10.0.2.1", 5201, 10, SRC, DST, spoof_src="10.0.2.7")
    assert Ether(raw)[IP].src == "10.0.2.7" and mac_host(raw[6:12]) == (0, 1)
