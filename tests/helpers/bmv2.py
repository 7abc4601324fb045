"""simple_switch_grpc on veth pairs a test creates (and always removes), for differential tests.

Each switch port N is attached to one end of a veth pair with a unique name; the test holds a raw
socket on the other end, so frames sent there enter bmv2 on port N and whatever bmv2 sends out of
port N is read there.
"""

from __future__ import annotations

import secrets
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from dpu_lab.bmv2_firmware import bmv2_python_dir
from dpu_lab.targets import bmv2_has_thrift, bmv2_options, bmv2_thrift_port
from dpu_softswitch.ports import AUX_SPACE, PACKET_AUXDATA, SOL_PACKET, with_vlan_tag
from helpers.netns import can_netns
from helpers.processes import free_port, stop, wait_port

ETH_P_ALL = 0x0003


def thrift_firmware_missing() -> str | None:
    """Why compromised firmware cannot run on bmv2 here (a skip reason), or None when it can."""
    exe = shutil.which("simple_switch_grpc")
    if exe is None:
        return "simple_switch_grpc is not on PATH (bmv2 not installed)"
    if not bmv2_has_thrift(exe):
        return f"{exe} was built without Thrift (no --thrift-port)"
    try:
        bmv2_python_dir()
    except RuntimeError as exc:
        return str(exc)
    return None


@dataclass
class Bmv2:
    """A running simple_switch_grpc: its P4Runtime address and a socket on the peer of each port."""

    address: str
    socks: dict[int, socket.socket]
    thrift_port: int | None = None  # its Thrift runtime API, where built with it

    def send(self, port: int, frame: bytes, wait: float = 0.3) -> list[tuple[int, bytes]]:
        """Send `frame` into `port` and collect every (port, frame) bmv2 emits within `wait` seconds."""
        return through_bmv2(self.socks, port, frame, wait)

    def collect(self, wait: float = 0.3) -> list[tuple[int, bytes]]:
        """Every (port, frame) bmv2 emits within `wait` seconds (after a PacketOut, say)."""
        return _collect(self.socks, wait)


def skip_reason() -> str | None:
    """Why a bmv2 differential test cannot run here, or None."""
    if reason := can_netns():
        return reason
    if shutil.which("simple_switch_grpc") is None:
        return "simple_switch_grpc is not on PATH (bmv2 not installed)"
    return None


def _link(*args: str) -> None:
    subprocess.run(["ip", "link", *args], check=True, capture_output=True)


@contextmanager
def bmv2_switch(ports: Iterable[int], cpu_port: int | None = None) -> Iterator[Bmv2]:
    """Start simple_switch_grpc (no program, logging off) with `ports` on fresh veth pairs, and packet I/O
    on `cpu_port` if given; skip if unable."""
    if reason := skip_reason():
        pytest.skip(reason)
    exe = shutil.which("simple_switch_grpc")
    assert exe is not None
    tag = secrets.token_hex(2)
    names = {p: (f"dd{tag}{p}", f"dd{tag}{p}p") for p in ports}
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
        thrift_port = bmv2_thrift_port(exe, port)
        interfaces = [a for p, (i, _) in names.items() for a in ("-i", f"{p}@{i}")]
        cpu = ["--cpu-port", str(cpu_port)] if cpu_port is not None else []
        proc = subprocess.Popen(
            [exe, *bmv2_options(thrift_port), "--device-id", "1", *interfaces, "--no-p4"]
            + ["--", "--grpc-server-addr", f"127.0.0.1:{port}", *cpu],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(port, proc)
        for p, (_, peer) in names.items():
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((peer, ETH_P_ALL))
            s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
            socks[p] = s
        yield Bmv2(f"127.0.0.1:{port}", socks, thrift_port)
    finally:
        for s in socks.values():
            s.close()
        if proc is not None:
            stop(proc)
        for sw_if in made:
            subprocess.run(["ip", "link", "del", sw_if], capture_output=True)


def through_bmv2(
    socks: dict[int, socket.socket], port: int, frame: bytes, wait: float = 0.3
) -> list[tuple[int, bytes]]:
    """Send one frame into bmv2's `port` and collect what leaves any port within `wait` seconds."""
    for s in socks.values():  # drain anything stale
        s.setblocking(False)
        while True:
            try:
                s.recv(65535)
            except BlockingIOError:
                break
    socks[port].send(frame)
    return _collect(socks, wait)


def _collect(socks: dict[int, socket.socket], wait: float) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select(list(socks.values()), [], [], left)
        for s in ready:
            data, ancdata, _, addr = s.recvmsg(65535, AUX_SPACE)
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            out.append((next(p for p, x in socks.items() if x is s), with_vlan_tag(data, ancdata)))
    return out
