"""The embedded target's packet I/O on real veth pairs: frames in, frames out, VLAN tags kept even
when the kernel strips them into metadata (as libpcap restores them for bmv2)."""

from __future__ import annotations

import secrets
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw

from dpu_softswitch.ports import AUX_SPACE, PACKET_AUXDATA, SOL_PACKET, RawPorts, with_vlan_tag
from helpers.netns import can_netns
from helpers.p4rt import A_HOST, B_HOST, connect, program_limiter, udp
from helpers.processes import free_port, start_embedded, stop

pytestmark = [pytest.mark.netns, pytest.mark.timeout(60)]
ETH_P_ALL = 0x0003


@pytest.fixture
def veths() -> Iterator[dict[int, tuple[str, str]]]:
    """Two veth pairs with the kernel's default offloads (VLAN stripping on): (target end, peer)."""
    if reason := can_netns():
        pytest.skip(reason)
    tag = secrets.token_hex(2)
    pairs = {p: (f"dp{tag}{p}", f"dp{tag}{p}p") for p in (0, 1)}
    try:
        for a, b in pairs.values():
            subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
            for name in (a, b):
                Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")
                subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield pairs
    finally:
        for a, _ in pairs.values():
            subprocess.run(["ip", "link", "del", a], capture_output=True)


def _socket(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    s.bind((ifname, ETH_P_ALL))
    return s


def _received(s: socket.socket, wait: float = 0.5) -> list[bytes]:
    out = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([s], [], [], left)[0]:
            break
        data, anc, _, addr = s.recvmsg(65535, AUX_SPACE)
        if addr[2] != socket.PACKET_OUTGOING:
            out.append(with_vlan_tag(data, anc))
    return out


def _tagged(payload: int) -> bytes:
    return bytes(
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / Dot1Q(vlan=7)
        / IP(src=A_HOST, dst="10.0.1.9")
        / UDP()
        / Raw(b"t" * payload)
    )


async def test_frames_cross_and_vlan_tags_survive(veths: dict[int, tuple[str, str]], tmp_path: Path) -> None:
    import grpc

    port = free_port()
    target = start_embedded(port, tmp_path / "t.log", ["-i", f"0@{veths[0][0]}", "-i", f"1@{veths[1][0]}"])
    tx, rx = _socket(veths[0][1]), _socket(veths[1][1])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            c = await connect(ch, 5)
            await c.responses.get()
            await program_limiter(c, rate_bytes_s=1, burst=4000)
        inter = udp(A_HOST, B_HOST, 1000)
        tx.send(inter)
        assert _received(rx) == [inter]
        # Tagged but otherwise intra-pod: "other", metered, and forwarded still tagged (the bucket has room).
        small = _tagged(100)
        tx.send(small)
        assert _received(rx) == [small]
        # Two more frames a classifier blind to tags would exempt as intra-pod: metered; the bucket
        # (4000 - 1042 - 146 bytes left) passes one of them, the other is red.
        big = _tagged(1400)
        tx.send(big)
        tx.send(big)
        assert _received(rx) == [big]
    finally:
        tx.close()
        rx.close()
        stop(target)


async def test_packet_out_and_packet_in_through_the_cpu_port(veths: dict[int, tuple[str, str]], tmp_path: Path) -> None:
    """A real target process with --cpu-port: a PacketOut leaves a real port (injected into the packet
    thread), and a frame from a real port punted to the CPU comes up the stream (from that thread)."""
    import asyncio

    import grpc

    from corpus_cases import CPU_PORT, eth, ins, packet_out, pipeline, schema, stream_messages, stream_request

    port = free_port()
    options = ["-i", f"0@{veths[0][0]}", "-i", f"1@{veths[1][0]}"]
    target = start_embedded(port, tmp_path / "t.log", options, cpu_port=CPU_PORT)
    tx, rx = _socket(veths[0][1]), _socket(veths[1][1])
    sch = schema("packet_io")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            c = await connect(ch, 5)
            await c.responses.get()
            await c.set_pipeline(pipeline("packet_io"))
            await c.write(ins(sch, "I.punt", "I.to_cpu", {"hdr.ethernet.etherType": 0x88CC}, reason=2))
            c.requests.put_nowait(stream_request(packet_out(sch, eth(0x0800, b"o" * 40), egress_port=b"\x01")))
            # The loop must run meanwhile: the PacketOut goes out on the stream.
            assert await asyncio.to_thread(_received, rx) == [eth(0x0800, b"o" * 40)]
            tx.send(eth(0x88CC, b"l" * 40))
            [msg] = await stream_messages(c, 0.5)
            assert msg.packet.payload == eth(0x88CC, b"l" * 40)
    finally:
        tx.close()
        rx.close()
        stop(target)


async def test_a_partition_past_the_lease_leaves_the_dpu_at_its_floor(
    veths: dict[int, tuple[str, str]], tmp_path: Path
) -> None:
    """Real processes: the control plane (`dpu-limiter serve --lease-s 2`) is frozen (SIGSTOP, so it
    cannot reach the DPU, as in a partition); the DPU stops passing metered traffic by itself one lease
    later, and passes it again once the control plane is back and renews the lease."""
    import signal
    import sys

    from dpu_limiter.client import LimiterClient
    from helpers.planes import register
    from helpers.processes import wait_port

    port, api_port = free_port(), free_port()
    target = start_embedded(port, tmp_path / "t.log", ["-i", f"0@{veths[0][0]}", "-i", f"1@{veths[1][0]}"])
    with (tmp_path / "cp.log").open("wb") as log:
        control = subprocess.Popen(
            [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", str(tmp_path / "s.db")]
            + ["--listen", f"127.0.0.1:{api_port}", "--lease-s", "2"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    tx, rx = _socket(veths[0][1]), _socket(veths[1][1])
    frame = udp(A_HOST, B_HOST, 1000)

    def crosses() -> bool:
        tx.send(frame)
        return _received(rx, 0.3) == [frame]

    try:
        wait_port(api_port, control)
        async with LimiterClient(f"127.0.0.1:{api_port}") as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "dpu-a", f"127.0.0.1:{port}")
            await c.set_pod_cap("a", 1e9, 1e9, 1.0, 10_000_000)
            await c.wait_converged(timeout=30)
        assert crosses()
        control.send_signal(signal.SIGSTOP)  # the process we started, by its handle
        crosses()  # may latch the last renewal: one lease from now at the latest
        time.sleep(2.2)
        assert not crosses() and not crosses()
        control.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 5
        while not crosses():
            assert time.monotonic() < deadline, "the lease was not renewed after the partition healed"
    finally:
        tx.close()
        rx.close()
        control.send_signal(signal.SIGCONT)
        stop(control)
        stop(target)


def test_a_frame_longer_than_the_largest_is_dropped_on_receipt(veths: dict[int, tuple[str, str]]) -> None:
    """--max-frame-bytes, as a NIC's largest frame: a longer frame (a host's GSO frame arrives whole) is dropped and
    counted; one of the largest size passes."""
    (a0, p0), (a1, p1) = veths[0], veths[1]
    for name in (a0, p0):  # the wire could carry longer frames: only the port's own bound drops them
        subprocess.run(["ip", "link", "set", name, "mtu", "1600"], check=True)
    ports = RawPorts({0: a0, 1: a1}, max_frame=1518)
    ports.start(lambda port, data: [(1, data)])
    try:
        with _socket(p0) as tx, _socket(p1) as rx:
            largest, longer = _tagged(1518 - 18 - 28), _tagged(1600 - 28)
            assert (len(largest), len(longer)) == (1518, 1618)
            tx.send(largest)
            tx.send(longer)
            got = _received(rx)
        assert got == [largest] and ports.rx_oversize == 1
    finally:
        ports.close()
