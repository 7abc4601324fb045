"""Shared fixtures: real processes and servers on loopback, real namespaces where marked (their helpers: helpers/)."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from helpers.netns import NsPair, ip
from helpers.planes import InProcess, serve_in_process
from helpers.processes import free_port, start_embedded, stop


@pytest.fixture
def embedded_target(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An embedded target process on a free loopback port: (address, its log file)."""
    port = free_port()
    log = tmp_path / "target.log"
    proc = start_embedded(port, log)
    try:
        yield f"127.0.0.1:{port}", log
    finally:
        stop(proc)


@pytest.fixture
async def in_process_target() -> AsyncIterator[InProcess]:
    """An in-process embedded target (no CPU port: set device.cpu_port for packet I/O) and a channel to it."""
    device, server, address = await serve_in_process(cpu_port=None)
    channel = grpc.aio.insecure_channel(address)
    try:
        yield device, channel
    finally:
        await channel.close()
        await server.stop(grace=0)


@pytest.fixture
def ns_pair() -> Iterator[NsPair]:
    """Create two namespaces with a veth pair and IPv6 off; always delete them afterwards."""
    tag = "dlt" + secrets.token_hex(3)
    subnet = secrets.randbelow(256)
    pair = NsPair(f"{tag}-a", f"{tag}-b", f"{tag}a", f"{tag}b", f"10.199.{subnet}.1", f"10.199.{subnet}.2")
    created: list[str] = []
    try:
        for ns in (pair.ns_a, pair.ns_b):
            ip("netns", "add", ns)
            created.append(ns)
            ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
            ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
        ip("link", "add", pair.if_a, "netns", pair.ns_a, "type", "veth", "peer", "name", pair.if_b, "netns", pair.ns_b)
        for ns, iface, addr in ((pair.ns_a, pair.if_a, pair.ip_a), (pair.ns_b, pair.if_b, pair.ip_b)):
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", iface)
            ip("-n", ns, "link", "set", iface, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
