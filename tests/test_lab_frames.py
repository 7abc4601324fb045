"""The simulator's frames, parsed by scapy: every evasion shape is what it claims to be."""

from __future__ import annotations

import pytest
from scapy.layers.inet import GRE, IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.layers.vxlan import VXLAN

from dpu_lab.frames import ENCAPS, frame, host_mac, mac_host, mac_port

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


def test_a_spoofed_source_changes_only_the_ip_header() -> None:
    raw = frame("none", "10.0.1.1", "10.0.2.1", 5201, 10, SRC, DST, spoof_src="10.0.2.7")
    assert Ether(raw)[IP].src == "10.0.2.7" and mac_host(raw[6:12]) == (0, 1)
