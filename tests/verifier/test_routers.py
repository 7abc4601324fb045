"""The routers' own counters over SNMP: a real snmpd (Debian's net-snmp) started by the test on loopback,
IF-MIB's 64-bit octet counters of an interface named as an operator names it, deltas between polls, and
no delta across what breaks their continuity (an agent restart, a wrap, an interface that changed)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpu_verifier.routers import WRAP, PortCounter, PortReading, SnmpError, SnmpRouter
from helpers.processes import stop

SNMPD = shutil.which("snmpd") or ("/usr/sbin/snmpd" if os.path.exists("/usr/sbin/snmpd") else None)
COMMUNITY = "verifier"


def free_port(kind: str = "udp") -> int:
    """A loopback UDP port that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_snmpd(folder: Path, port: int) -> subprocess.Popen[bytes]:
    """net-snmp's agent in the foreground on 127.0.0.1:`port`, read-only for COMMUNITY, state in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "snmpd.conf"
    conf.write_text(f"rocommunity {COMMUNITY} 127.0.0.1\n")
    env = {**os.environ, "MIBS": "", "SNMP_PERSISTENT_DIR": str(folder)}
    assert SNMPD is not None
    cmd = [SNMPD, "-f", "-Lf", str(folder / "log"), "-C", "-c", str(conf), f"udp:127.0.0.1:{port}"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def snmpd(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    if SNMPD is None:
        pytest.skip("snmpd (Debian's snmpd package) is not installed")
    port = free_port("udp")
    proc = start_snmpd(tmp_path / "snmpd", port)
    try:
        yield port, tmp_path / "snmpd"
    finally:
        stop(proc)


async def answered(router: SnmpRouter, timeout_s: float = 10.0) -> tuple[int, dict[str, PortReading | None]]:
    """The first reading the agent answers (it takes a moment to start)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await router.read()
        except SnmpError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def send_udp(nbytes: int) -> int:
    """Send `nbytes` of UDP payload over loopback to a socket of our own; the bytes on the wire."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sent = 0
    try:
        while sent < nbytes:
            tx.sendto(b"x" * 1000, rx.getsockname())
            sent += 1000
    finally:
        tx.close()
        rx.close()
    return sent


async def test_loopback_counters_grow_by_what_crossed(snmpd: tuple[int, Path]) -> None:
    port, _ = snmpd
    router = SnmpRouter("127.0.0.1", port, COMMUNITY, {"lo": "a"})
    counter = PortCounter("lo")
    uptime, readings = await answered(router)
    assert counter.advance(readings["lo"], uptime) is None  # the first reading starts the count
    sent = send_udp(2_000_000)
    # net-snmp refreshes interface counters every few seconds (as routers' agents do, at their own pace):
    # the bytes show within that, and the deltas sum to them.
    got = [0, 0]
    deadline = time.monotonic() + 15
    while got[0] < sent and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        uptime, readings = await router.read()
        delta = counter.advance(readings["lo"], uptime)
        assert delta is not None
        got = [got[0] + delta[0], got[1] + delta[1]]
    # Loopback receives what it sends; the SNMP exchanges and anything else on lo add to both.
    assert got[0] >= sent and got[1] >= sent and got[0] < sent + 1_000_000


async def test_an_agent_restart_gives_no_delta_then_counting_resumes(tmp_path: Path, snmpd: tuple[int, Path]) -> None:
    port, _ = snmpd
    router = SnmpRouter("127.0.0.1", port, COMMUNITY, {"lo": "a"})
    counter = PortCounter("lo")
    uptime, readings = await answered(router)
    counter.advance(readings["lo"], uptime)
    await asyncio.sleep(1.0)  # sysUpTime is in hundredths: let it run on before the restart
    uptime, readings = await router.read()
    assert counter.advance(readings["lo"], uptime) is not None
    # A second agent on another port stands for the router restarted: its sysUpTime starts again.
    port2 = free_port("udp")
    proc = start_snmpd(tmp_path / "snmpd2", port2)
    try:
        router2 = SnmpRouter("127.0.0.1", port2, COMMUNITY, {"lo": "a"})
        uptime2, readings2 = await answered(router2)
        assert uptime2 < uptime
        assert counter.advance(readings2["lo"], uptime2) is None
        await asyncio.sleep(0.1)
        uptime2, readings2 = await router2.read()
        assert counter.advance(readings2["lo"], uptime2) is not None
    finally:
        stop(proc)


async def test_an_unknown_port_reads_as_none_and_a_silent_router_is_an_error(snmpd: tuple[int, Path]) -> None:
    port, _ = snmpd
    router = SnmpRouter("127.0.0.1", port, COMMUNITY, {"lo": "a", "no-such-port": "b"})
    _, readings = await answered(router)
    assert readings["no-such-port"] is None and readings["lo"] is not None
    silent = SnmpRouter("127.0.0.1", free_port("udp"), COMMUNITY, {"lo": "a"})
    with pytest.raises(SnmpError, match=r"router 127\.0\.0\.1:\d+"):
        await silent.read()
    wrong = SnmpRouter("127.0.0.1", port, "not-the-community", {"lo": "a"})
    with pytest.raises(SnmpError):
        await wrong.read()


def test_counter_continuity_rules() -> None:
    c = PortCounter("r-a")
    assert c.advance(PortReading("r-a", 100, 50, 0), 1000) is None
    assert c.advance(PortReading("r-a", 400, 80, 0), 1100) == (300, 30)
    # A 64-bit counter that goes back with nothing else changed wrapped.
    assert c.advance(PortReading("r-a", 10, 90, 0), 1200) == (WRAP - 400 + 10, 10)
    # The interface's discontinuity time moved (its counters were reset): no delta, then on again.
    assert c.advance(PortReading("r-a", 5, 5, 1150), 1300) is None
    assert c.advance(PortReading("r-a", 25, 7, 1150), 1400) == (20, 2)
    # The agent restarted (sysUpTime went back), a reading was missing, or the index names another port.
    assert c.advance(PortReading("r-a", 30, 8, 1150), 10) is None
    assert c.advance(None, 20) is None
    assert c.advance(PortReading("r-a", 40, 9, 1150), 30) is None  # the first after a missing one
    assert c.advance(PortReading("r-b", 50, 9, 1150), 40) is None
