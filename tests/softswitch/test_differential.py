"""The embedded target and bmv2 give the same outputs and counters for the same program, entries and frames.

bmv2 runs as simple_switch_grpc on veth pairs this test creates (and removes); the embedded target
runs in process. Both are programmed through P4Runtime in the same way; each frame is sent into
bmv2's port 0 and whatever leaves its ports within a short wait is compared with the embedded
target's output for the same frame, then every counter cell limiter.p4 touches is compared.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import grpc
import pytest
from finsy import P4CounterEntry, P4Schema
from finsy.proto import p4r
from scapy.layers.inet import IP, UDP, fragment
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw

from dpu_limiter.units import CPU_PORT
from dpu_softswitch.server import Device
from helpers.bmv2 import bmv2_switch, through_bmv2
from helpers.p4rt import A_HOST, B_HOST, SEAL_PORT, Client, connect, program_limiter, udp

pytestmark = [pytest.mark.bmv2, pytest.mark.netns]


def frames() -> list[tuple[int, bytes]]:
    """(ingress port, frame): every class limiter.p4 tells apart, in both directions."""
    intra = udp(A_HOST, "10.0.1.9", 200)
    out: list[tuple[int, bytes]] = [(0, udp(A_HOST, B_HOST, 1000)) for _ in range(4)]  # 3000-byte bucket: 2 pass
    out += [(0, intra), (1, udp(B_HOST, A_HOST, 1400)), (1, udp(B_HOST, A_HOST, 1400)), (1, udp(B_HOST, A_HOST, 10))]
    out += [(0, bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=A_HOST, pdst="10.0.1.254")))]
    out += [(0, bytes(Ether() / IPv6(src="fd00::1", dst="fd00::2") / UDP() / Raw(b"v" * 40)))]
    out += [(0, bytes(Ether() / Dot1Q(vlan=7) / IP(src=A_HOST, dst="10.0.1.9") / UDP()))]
    out += [(0, bytes(Ether() / f)) for f in fragment(IP(src=A_HOST, dst="10.0.1.9") / UDP() / Raw(b"f" * 600), 256)]
    out += [(0, bytes(Ether(type=0x0800) / Raw(b"\x45\x00\x00\x10")))]  # truncated IPv4
    out += [(0, bytes(Ether() / IP(src=A_HOST, dst=B_HOST, version=6) / UDP()))]
    out += [(0, udp(B_HOST, "10.0.2.9", 300)), (0, udp("10.0.2.7", B_HOST, 300))]  # sources forged: dropped
    out += [(1, udp("10.0.1.7", A_HOST, 300))]  # from outside with pod addresses, but not from a peer: metered
    # Exemption claims and ARP look-alikes (the red-team shapes at the frame level).
    peer, other = "02:00:00:00:00:02", "02:01:01:00:00:00"
    out += [(0, bytes(Ether(dst=other) / IP(src=A_HOST, dst="10.0.1.77") / UDP() / Raw(b"c" * 200)))]
    out += [(0, bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / IP(src=A_HOST, dst="10.0.1.255") / UDP()))]
    out += [(0, bytes(Ether(dst=peer, type=0x0806) / Raw(b"\x00" * 1000)))]  # ARP's EtherType, no ARP in it
    out += [(0, bytes(Ether(dst=peer) / ARP(psrc=A_HOST, pdst="10.0.1.7") / Raw(b"p" * 800)))]  # padded ARP
    out += [(0, bytes(Ether(dst=peer) / ARP(op=9, psrc=A_HOST, pdst="10.0.1.7")))]  # no such operation
    out += [(0, bytes(Ether(dst=peer, type=0x0806) / Raw(b"\x00\x01\x08\x00")))]  # truncated ARP
    out += [(0, bytes(Ether(dst=peer) / ARP(psrc=A_HOST, pdst="10.0.1.7")))] * 3  # minimum ARP: its own bucket
    from_peer = bytes(Ether(src=peer) / IP(src="10.0.1.7", dst=A_HOST) / UDP() / Raw(b"i" * 100))
    out += [(1, from_peer)]  # a peer's MAC on the uplink port: metered
    out += [(SEAL_PORT, from_peer), (SEAL_PORT, udp(B_HOST, A_HOST, 50))]  # opened by the engine: a peer's exempt
    return out


@pytest.fixture
def bmv2() -> Iterator[tuple[str, dict[int, socket.socket]]]:
    """simple_switch_grpc on three veth pairs (host, uplink, seal port); yields its P4Runtime address and
    sockets on the peers."""
    with bmv2_switch((0, 1, SEAL_PORT)) as sw:
        yield sw.address, sw.socks


async def _counters(c: Client, sch: object) -> dict[tuple[str, int], tuple[int, int]]:
    cells = [("LimiterIngress.class_counter", cell * 8 + k) for cell in (0, 1) for k in range(6)]
    cells += [("LimiterIngress.color_counter", cell * 8 + k) for cell in (0, 1) for k in range(6)]
    out = {}
    for name, idx in cells:
        [ent] = await c.read(P4CounterEntry(name, index=idx).encode(sch))  # type: ignore[arg-type]
        out[(name, idx)] = (ent.counter_entry.data.packet_count, ent.counter_entry.data.byte_count)
    return out


async def test_same_frames_same_outputs_and_counters(
    bmv2: tuple[str, dict[int, socket.socket]], in_process_target: tuple[Device, grpc.aio.Channel]
) -> None:
    addr, socks = bmv2
    device, emb_channel = in_process_target
    async with grpc.aio.insecure_channel(addr) as bmv2_channel:
        cb = await connect(bmv2_channel, 5)
        await cb.responses.get()
        ce = await connect(emb_channel, 5)
        await ce.responses.get()
        peers, arp = ("02:00:00:00:00:02",), (1, 100)  # ARP's bucket: two 42-byte frames
        sch = await program_limiter(cb, rate_bytes_s=1, burst=3000, peers=peers, arp=arp)
        await program_limiter(ce, rate_bytes_s=1, burst=3000, peers=peers, arp=arp)
        mismatches = []
        for port, frame in frames():
            want = through_bmv2(socks, port, frame)
            got = device.process(port, frame)
            if sorted(got) != sorted(want):
                mismatches.append((port, frame.hex(), [(p, f.hex()) for p, f in want], [(p, f.hex()) for p, f in got]))
        assert not mismatches, mismatches
        assert await _counters(ce, sch) == await _counters(cb, sch)


async def _echo(c: Client, sch: object, nonce: int, arm: int = 0) -> p4r.PacketIn:
    """Send limiter.p4's clock echo through client `c` (arming lease epoch `arm`); the PacketIn that comes back."""
    from corpus_cases import packet_out, stream_request

    assert isinstance(sch, P4Schema)
    out = packet_out(sch, b"", nonce=nonce.to_bytes(8, "big"), arm=arm.to_bytes(8, "big"))
    c.requests.put_nowait(stream_request(out))
    while True:
        msg = await asyncio.wait_for(c.responses.get(), 10)
        if msg.HasField("packet"):
            return msg.packet


async def test_the_clock_echo_comes_back_alike_from_both(in_process_target: tuple[Device, grpc.aio.Channel]) -> None:
    # limiter.p4's clock echo (how the control plane places lease deadlines on a DPU's clock): the
    # nonce and the DPU's ingress timestamp come back as PacketIn metadata, and nothing leaves a port.
    # The echo arms the lease epoch only where there is none, and says what it found.
    device, emb_channel = in_process_target
    device.cpu_port = CPU_PORT
    with bmv2_switch((0, 1), cpu_port=CPU_PORT) as sw:
        async with grpc.aio.insecure_channel(sw.address) as bmv2_channel:
            echoes = []
            for channel in (bmv2_channel, emb_channel):
                c = await connect(channel, 5)
                await c.responses.get()
                sch = await program_limiter(c, rate_bytes_s=1, burst=3000)
                first = await _echo(c, sch, 0x0123456789ABCDEF, arm=0xE1)
                second = await _echo(c, sch, 7, arm=0xE2)
                assert await _echo(c, sch, 8, arm=0xE3)  # armed once: 0xE1 stays
                echoes.append((first, second, await _echo(c, sch, 9)))
            outputs = await asyncio.to_thread(sw.collect, 0.3)  # nothing of the echoes left a port
    for first, second, third in echoes:
        meta = [{m.metadata_id: int.from_bytes(m.value, "big") for m in p.metadata} for p in (first, second, third)]
        assert [m[1] for m in meta] == [0x0123456789ABCDEF, 7, 9]
        assert 0 <= meta[0][2] <= meta[1][2] < 1 << 48  # the DPU's clock, in microseconds
        assert [m[3] for m in meta] == [0, 0xE1, 0xE1]  # unarmed, then armed by the first echo only
        assert [m[4] for m in meta] == [meta[0][2]] * 3  # armed at the first echo's time, which all report
        assert first.payload == second.payload == b""
    assert outputs == []
