"""The embedded target and bmv2 give the same outputs and counters for the same program, entries and frames.

bmv2 runs as simple_switch_grpc on veth pairs this test creates (and removes); the embedded target
runs in process. Both are programmed through P4Runtime in the same way; each frame is sent into
bmv2's port 0 and whatever leaves its ports within a short wait is compared with the embedded
target's output for the same frame, then every counter cell limiter.p4 touches is compared.
"""

from __future__ import annotations

import secrets
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest
from finsy import P4CounterEntry
from scapy.layers.inet import IP, UDP, fragment
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw

from conftest import can_netns, free_port, wait_port
from p4rt_helpers import A_HOST, B_HOST, Client, connect, program_limiter, udp
from p4sim.server import Device

pytestmark = [pytest.mark.bmv2, pytest.mark.netns]
ETH_P_ALL = 0x0003


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
    return out


def _link(*args: str) -> None:
    subprocess.run(["ip", "link", *args], check=True, capture_output=True)


@pytest.fixture
def bmv2() -> Iterator[tuple[str, dict[int, socket.socket]]]:
    """simple_switch_grpc on two veth pairs; yields its P4Runtime address and sockets on the peers."""
    if reason := can_netns():
        pytest.skip(reason)
    exe = shutil.which("simple_switch_grpc")
    if exe is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    tag = secrets.token_hex(2)
    names = {p: (f"dd{tag}{p}", f"dd{tag}{p}p") for p in (0, 1)}
    made: list[str] = []
    socks: dict[int, socket.socket] = {}
    proc: subprocess.Popen[bytes] | None = None
    try:
        for sw_if, peer in names.values():
            _link("add", sw_if, "type", "veth", "peer", "name", peer)
            made.append(sw_if)
            for ifname in (sw_if, peer):
                with open(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "w") as f:
                    f.write("1")
                _link("set", ifname, "up")
        port = free_port()
        proc = subprocess.Popen(
            [
                exe,
                "--log-level",
                "off",
                "--device-id",
                "1",
                *[a for p, (i, _) in names.items() for a in ("-i", f"{p}@{i}")],
                "--no-p4",
                "--",
                "--grpc-server-addr",
                f"127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(port, proc)
        for p, (_, peer) in names.items():
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((peer, ETH_P_ALL))
            socks[p] = s
        yield f"127.0.0.1:{port}", socks
    finally:
        for s in socks.values():
            s.close()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        for sw_if in made:
            subprocess.run(["ip", "link", "del", sw_if], capture_output=True)


def _through_bmv2(socks: dict[int, socket.socket], port: int, frame: bytes) -> list[tuple[int, bytes]]:
    for s in socks.values():  # drain anything stale
        s.setblocking(False)
        while True:
            try:
                s.recv(65535)
            except BlockingIOError:
                break
    socks[port].send(frame)
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 0.3
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select(list(socks.values()), [], [], left)
        for s in ready:
            data, addr = s.recvfrom(65535)
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            out.append((next(p for p, x in socks.items() if x is s), data))
    return out


async def _counters(c: Client, sch: object) -> dict[tuple[str, int], tuple[int, int]]:
    cells = [("LimiterIngress.class_counter", cell * 8 + k) for cell in (0, 1) for k in range(5)]
    cells += [("LimiterIngress.color_counter", cell * 4 + k) for cell in (0, 1) for k in range(3)]
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
        sch = await program_limiter(cb, rate_bytes_s=1, burst=3000)
        await program_limiter(ce, rate_bytes_s=1, burst=3000)
        mismatches = []
        for port, frame in frames():
            want = _through_bmv2(socks, port, frame)
            got = device.process(port, frame)
            if sorted(got) != sorted(want):
                mismatches.append((port, frame.hex(), want, got))
        assert not mismatches, mismatches
        assert await _counters(ce, sch) == await _counters(cb, sch)
