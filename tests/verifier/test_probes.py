"""Authenticated probes with real processes and sockets on loopback: `dpu-limiter probe-agent run` sends, a
relay written here stands for the pod's DPU (passing, dropping or tampering) and for the router (it counts
what it forwards), and the product's receiver and the audit's checks judge what arrives.

What is asserted are guarantees, not timings: every authenticated byte counted and no alert for a clean run;
each kind of tampering refused by reason, never counted, and alerted; a burst dropped while nothing else
used the cap alerted as loss; and the figures signed so that `evidence verify` re-derives the verdict."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dpu_lab.traffic import Timeline
from dpu_verifier.checks import Auditor, CapScope, Facts, Probe
from dpu_verifier.evidence import BUNDLE_FILE, load_public_key, verify_bundle
from dpu_verifier.probes import (
    KEY_BYTES,
    Pending,
    ProbeDatagram,
    ProbeReceiver,
    ProbeSchedule,
    ProbeSink,
    Report,
    burst_plan,
    close_bursts,
    count_bursts,
    encode,
    generate_key,
    load_key,
    wire_bytes,
)
from helpers.processes import stop

pytestmark = pytest.mark.timeout(120)

CAP_BPS = 16e6  # pod a's cap; its agent sends at half of it, so that nothing is over the cap on loopback
RATE_BPS = 8e6
BURST_S, PERIOD_S, BURSTS, SIZE = 0.25, 0.6, 4, 1000
LEAD_S = 1.0  # time for the agent to start before its first burst
RELAY_HOST = "127.0.0.2"  # where the relay listens; the receiver is on 127.0.0.1


class FakeView:
    """The control plane's side of the evidence (no control plane here: the probe path is what is tested)."""

    async def facts(self) -> Facts:
        """A fleet with no DPUs read."""
        return Facts("0" * 64, {}, (0, ""), {})

    async def read_back(self) -> list[tuple[str, str]]:
        """Nothing found."""
        return []

    async def counters(self) -> dict[str, tuple[str, tuple[int, int] | None]]:
        """Nothing read."""
        return {}


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# What the relay does with the n-th datagram it got, bound for `port`: the datagrams to send on, and where.
Tamper = Callable[[int, bytes, int], list[tuple[bytes, int]]]


def passing(_n: int, data: bytes, port: int) -> list[tuple[bytes, int]]:
    return [(data, port)]


@dataclass
class Relay:
    """A UDP forwarder on loopback standing for the pod's DPU, and for the router: it counts the wire bytes
    of what it sends on (in the audit's time, from `origin`) as a router counts its port."""

    to_port: int
    tamper: Tamper
    origin: float
    series: Timeline = field(default_factory=lambda: Timeline(0.05))
    _sock: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Relay:
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        # The receiver's port on another loopback address: the agent's tag names the port it sends to, and a
        # DPU in the path changes no port.
        self._sock.bind((RELAY_HOST, self.to_port))
        self._sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)
        self._sock.close()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            for out, port in self.tamper(n, data, self.to_port):
                self._sock.sendto(out, ("127.0.0.1", port))
                self.series.add(time.time() - self.origin, wire_bytes(len(out)))
            n += 1


@dataclass
class Site:
    """The verifier's side: pod a's receiver on a socket of its own, its probe, the audit."""

    tmp: Path
    first: float
    key: bytes
    port: int = field(default_factory=free_udp_port)
    sink: ProbeSink = field(default_factory=ProbeSink)
    pending: list[Pending] = field(default_factory=list)
    arrivals: dict[tuple[int, int], list[tuple[float, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.schedule = ProbeSchedule(self.first, PERIOD_S)
        self.rx = ProbeReceiver("a", self.key, self.port, self.schedule)
        self.sink.listen(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), "127.0.0.1", self.rx)
        offered = int(RATE_BPS * BURST_S / 8)
        self.probe = Probe("a", offered, self.allowed(self.port, BURST_S), floor_bps=CAP_BPS, rejected=self.rx.rejected)

    @staticmethod
    def allowed(_port: int, seconds: float) -> int:
        return int(CAP_BPS * seconds / 8) + 4 * 1518

    def drain_while(self, proc: subprocess.Popen[bytes]) -> None:
        """Take what arrives while the agent runs (a socket's buffer holds less than a run)."""
        while proc.poll() is None:
            self.pending += self.sink.drain()
            time.sleep(0.02)
        time.sleep(0.2)  # the relay's last datagrams
        self.pending += self.sink.drain()

    async def judge(self, auditor: Auditor) -> None:
        """Judge every burst the agent sent, as the audit's ticks would once they were all in."""
        boundary = self.schedule.deadline(BURSTS)
        self.pending = count_bursts(
            self.pending, boundary, self.schedule, {self.port: self.probe}, self.arrivals, self.allowed, BURST_S
        )
        n, gap = burst_plan(RATE_BPS, BURST_S, SIZE)
        close_bursts(self.probe, self.rx, boundary, Report(n, n * SIZE, (n - 1) * gap), lambda t: t - self.first)
        await auditor.tick(boundary - self.first)

    def auditor(self, router: Timeline) -> Auditor:
        """The audit of pod a's probe against `router`, signing into a bundle under tmp."""
        auditor = Auditor(
            [CapScope("a", CAP_BPS, CAP_BPS, 1.0, 0)], {("a", "egress"): router}, FakeView(), checks=["probe"]
        )
        auditor.probes = [self.probe]
        auditor.open_evidence(self.tmp / "evidence")
        return auditor


def agent(tmp: Path, key: Path, port: int, first: float, pod: str = "a") -> subprocess.Popen[bytes]:
    """`dpu-limiter probe-agent run`, as a pod's host runs it, sending BURSTS bursts to the relay's `port`."""
    args = [sys.executable, "-m", "dpu_verifier.probe_agent", "run", "--pod", pod, "--to", f"{RELAY_HOST}:{port}"]
    args += ["--rate", f"{RATE_BPS:.0f}", "--burst-s", str(BURST_S), "--period-s", str(PERIOD_S)]
    args += ["--start-at", f"{first:.6f}", "--size", str(SIZE), "--key", str(key)]
    args += ["--duration", str(BURSTS * PERIOD_S - 0.01), "--out", str(tmp / f"agent-{pod}.json")]
    return subprocess.Popen(args, stdin=subprocess.DEVNULL)


def key_file(tmp: Path, name: str = "a.key") -> Path:
    return generate_key(tmp / name)


async def run_through(tmp: Path, tamper: Tamper) -> tuple[Site, Auditor, Relay, dict[str, int]]:
    """Pod a's agent through a relay doing `tamper` to the receiver; everything judged and signed."""
    key = key_file(tmp)
    first = time.time() + LEAD_S
    site = Site(tmp, first, load_key(key))
    with Relay(site.port, tamper, first) as relay:
        proc = agent(tmp, key, site.port, first)
        try:
            site.drain_while(proc)
        finally:
            stop(proc)
        assert proc.returncode == 0
        auditor = site.auditor(relay.series)
        await site.judge(auditor)
    site.sink.close()
    auditor.close_evidence()
    sent: dict[str, int] = json.loads((tmp / "agent-a.json").read_text())
    return site, auditor, relay, sent


def record_checks(tmp: Path) -> list[dict[str, str]]:
    """Each signed window's checks (the bundle verified first, as a third party would)."""
    bundle = tmp / "evidence"
    check = verify_bundle(bundle, load_public_key(bundle / "verifier.key.pub"))
    assert check.ok, check.problem
    out = []
    for line in (bundle / BUNDLE_FILE).read_text().splitlines():
        pred = json.loads(base64.b64decode(json.loads(line)["payload"]))["predicate"]
        if pred["kind"] == "window" and pred["figures"]["direction"] == "egress":
            out.append(pred["checks"])
    return out


async def test_a_clean_run_counts_every_byte_and_raises_no_alert(tmp_path: Path) -> None:
    site, auditor, relay, sent = await run_through(tmp_path, passing)
    assert sent["bursts"] == BURSTS and sent["send_errors"] == 0
    # Every datagram the agent sent was authenticated and counted: wire bytes, burst by burst.
    assert sum(site.probe.bursts.values()) == sent["payload_bytes"] + 42 * sent["datagrams"]
    assert sum(b.datagrams for b in site.rx.seen.values()) == sent["datagrams"]
    assert site.rx.rejected == {} and auditor.alerts == []
    # Each burst was judged for loss, with the agent's own report of what it sent where the next burst
    # carried it; the "router" counted what the probe's receiver took.
    assert sorted(site.probe.closed) == list(range(BURSTS)) == sorted(site.probe.loss_judged)
    assert [site.probe.closed[k].sent_bytes for k in range(BURSTS - 1)] == [
        site.rx.reports[k].wire() for k in range(BURSTS - 1)
    ]
    assert sum(relay.series.bins) == sum(site.probe.bursts.values())
    checks = record_checks(tmp_path)
    assert checks and all(c["probe"] == "pass" for c in checks)
    assert any(c.get("probe-loss") == "pass" for c in checks)
    assert all(c["probe-forged"] == "pass" for c in checks)


async def test_a_dpu_that_drops_probes_is_caught_while_nothing_else_uses_the_cap(tmp_path: Path) -> None:
    def drop_nine_in_ten(n: int, data: bytes, port: int) -> list[tuple[bytes, int]]:
        return [(data, port)] if n % 10 == 0 else []

    site, auditor, _relay, sent = await run_through(tmp_path, drop_nine_in_ten)
    got = sum(site.probe.bursts.values())
    assert got * 9 < sent["payload_bytes"] + 42 * sent["datagrams"]  # a tenth went through
    assert site.rx.rejected == {}  # dropped, not tampered with
    loss = [a for a in auditor.alerts if a.check == "probe-loss"]
    assert [(a.check, a.where) for a in auditor.alerts] == [("probe-loss", "a egress")]
    assert "authenticated bytes arrived" in loss[0].detail and "(0 other traffic)" in loss[0].detail
    checks = record_checks(tmp_path)
    assert any(c.get("probe-loss") == "fail" for c in checks)


async def test_a_burst_dropped_whole_is_caught_once_the_agent_was_heard(tmp_path: Path) -> None:
    # Bursts 1 and 2 lost entirely: no report of 1 ever comes (2 carried it); 3 says what 2 was.
    def drop_middle(_n: int, data: bytes, port: int) -> list[tuple[bytes, int]]:
        burst = int.from_bytes(data[6 : 6 + 4], "big")  # after magic, the name's length and "a"
        return [] if burst in (1, 2) else [(data, port)]

    site, auditor, _relay, _sent = await run_through(tmp_path, drop_middle)
    assert site.probe.bursts.get(1, 0) == site.probe.bursts.get(2, 0) == 0
    assert [(a.check, a.where) for a in auditor.alerts] == [("probe-loss", "a egress")]
    assert "probe burst 1:" in auditor.alerts[0].detail


async def test_tampered_probes_are_refused_never_counted_and_alerted(tmp_path: Path) -> None:
    """A DPU that rewrites a byte, truncates, replays within a burst or replays an earlier burst later."""

    def tamper(n: int, data: bytes, port: int) -> list[tuple[bytes, int]]:
        if n == 3:
            relay_held.append(data)  # burst 0's, replayed in burst 3 (after burst 0's deadline)
        if n % 50 == 7:
            flipped = bytearray(data)
            flipped[100] ^= 1
            return [(bytes(flipped), port)]
        if n % 50 == 17:
            return [(data[:-10], port)]
        if n % 50 == 27:
            return [(data, port), (data, port)]
        if relay_held and int.from_bytes(data[6:10], "big") == 3 and n % 50 == 37:
            return [(data, port), (relay_held[0], port)]
        return [(data, port)]

    relay_held: list[bytes] = []
    site, auditor, _relay, sent = await run_through(tmp_path, tamper)
    rejected = dict(site.rx.rejected)
    assert rejected["bad-mac"] >= 2 * sent["bursts"]  # flipped and truncated: the tag no longer matches
    assert rejected["replay"] >= sent["bursts"]  # the same (burst, seq) twice
    assert rejected["stale"] >= 1  # burst 0's datagram again in burst 3
    # Only what the agent sent, untouched, counted: the refused ones and the copies are not.
    good = sent["datagrams"] - rejected["bad-mac"]
    assert sum(b.datagrams for b in site.rx.seen.values()) == good
    assert sum(site.probe.bursts.values()) == good * wire_bytes(SIZE)
    forged = [a for a in auditor.alerts if a.check == "probe-forged"]
    # A stale datagram is refused, not called forged: a loaded target's late one looks the same.
    refused = sum(n for why, n in rejected.items() if why != "stale")
    assert len(forged) == 1 and f"{refused} datagrams refused" in forged[0].detail
    checks = record_checks(tmp_path)
    assert any(c.get("probe-forged") == "fail" for c in checks)


async def test_another_key_another_pod_or_another_port_is_refused(tmp_path: Path) -> None:
    """Datagrams sent with real sockets, built by hand: a forged key, one of pod b (its own key, or a key
    wrongly shared with a), one meant for another port, a stamp in the wrong burst, garbage."""
    key_a = load_key(key_file(tmp_path))
    key_b = load_key(key_file(tmp_path, "b.key"))
    first = time.time() - 0.1
    site = Site(tmp_path, first, key_a)
    now = time.time()

    def dgram(pod: str, key: bytes, port: int, burst: int = 0, seq: int = 0, sent: float = now) -> bytes:
        return encode(key, port, ProbeDatagram(pod, burst, seq, sent, None), SIZE)

    sends = [
        dgram("a", os.urandom(KEY_BYTES), site.port),  # a forged key
        dgram("b", key_b, site.port),  # pod b's agent feeding a's probe
        dgram("a", key_b, site.port, seq=1),  # b's host claiming to be a
        dgram("a", key_a, site.port + 1, seq=2),  # meant for another port (redirected here)
        dgram("a", key_a, site.port, burst=1, seq=3),  # a burst its stamp is not in
        b"DLP1" + bytes(10),  # truncated to nothing
        dgram("a", key_a, site.port, seq=4),  # the one good datagram
    ]
    shared = ProbeReceiver("a", key_a, site.port, site.schedule)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
        for data in sends:
            out.sendto(data, ("127.0.0.1", site.port))
        out.sendto(dgram("b", key_a, site.port), ("127.0.0.1", site.port))  # b with a's key, wrongly shared
    time.sleep(0.2)
    taken = site.sink.drain()
    site.sink.close()
    assert [(p[1], p[2]) for p in taken] == [(site.port, wire_bytes(SIZE))]
    assert dict(site.rx.rejected) == {"bad-mac": 4, "implausible": 1, "malformed": 1, "other-pod": 1}
    # A receiver that took the good one already refuses it again: a replay.
    assert shared.accept(sends[-1], now + 0.01) != "replay"
    assert shared.accept(sends[-1], now + 0.02) == "replay"


def test_keys_and_bad_input_are_refused_with_the_field_named(tmp_path: Path) -> None:
    key = tmp_path / "k"
    cli = [sys.executable, "-m", "dpu_limiter.cli"]
    ok = subprocess.run([*cli, "probe-agent", "keygen", str(key)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and len(key.read_bytes()) == KEY_BYTES and key.stat().st_mode & 0o777 == 0o600
    again = subprocess.run([*cli, "probe-agent", "keygen", str(key)], capture_output=True, text=True, check=False)
    assert again.returncode == 2 and "exists" in again.stderr
    base = ["probe-agent", "run", "--pod", "a", "--to", "127.0.0.1:9", "--rate", "8M", "--burst-s", "0.2"]
    base += ["--period-s", "1", "--key", str(key), "--duration", "1"]
    short = tmp_path / "short"
    short.write_bytes(b"x" * 5)
    for args, field_name in [
        ([*base, "--size", "20"], "size:"),
        ([*base[:-2], "--duration", "nan"], "--duration"),
        ([*base, "--key", str(short)], "key:"),
        ([*base[:7], "fast", *base[8:]], "--rate"),
        ([*base[:9], "2", *base[10:]], "burst_s:"),
        ([*base[:3], "x" * 100, *base[4:]], "pod:"),
        ([*base[:5], "nohost", *base[6:]], "--to"),
    ]:
        r = subprocess.run([*cli, *args], capture_output=True, text=True, check=False)
        assert r.returncode == 2 and field_name in r.stderr, (args, r.stderr)
        assert len(r.stderr) < 2000  # bounded, whatever was passed


async def test_the_verifier_service_receives_probes_and_catches_their_loss(tmp_path: Path) -> None:
    """`dpu-limiter verify` with a probes section, against a control plane and a real snmpd on loopback (its
    `lo` is the router's port facing pod a): pod a's agent sends through a relay that drops 9 in 10; the
    service logs a probe-loss alert and signs it into a bundle that verifies."""
    from test_routers import SNMPD, free_port, start_snmpd
    from test_verify_service import config

    from dpu_limiter.client import LimiterClient
    from dpu_limiter.server import ControlPlane

    if SNMPD is None:
        pytest.skip("snmpd (Debian's snmpd package) is not installed")
    snmp_port, probe_port = free_port(), free_udp_port()
    key = key_file(tmp_path)
    first = float(int(time.time()) + 4)
    probes = {
        "start_at": first,
        "period_s": 1.0,
        "burst_s": BURST_S,
        "size": SIZE,
        "pods": {"a": {"listen": f"127.0.0.1:{probe_port}", "key": str(key), "rate": f"{RATE_BPS:.0f}"}},
    }
    snmpd = start_snmpd(tmp_path / "snmpd", snmp_port)
    plane = ControlPlane(tmp_path / "s.db")
    await plane.start()
    verifier = proc = None
    log_path = tmp_path / "verify.log"
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await c.set_pod_cap("a", CAP_BPS, CAP_BPS, 2.0, 100_000)
        path = config(tmp_path, plane.address, snmp_port, checks=["probe"], probes=probes)
        cmd = [sys.executable, "-m", "dpu_limiter.cli", "verify", "--config", str(path)]
        with log_path.open("wb") as log:
            verifier = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

        def drop(n: int, data: bytes, port: int) -> list[tuple[bytes, int]]:
            return [(data, port)] if n % 10 == 0 else []

        with Relay(probe_port, drop, first):
            args = [sys.executable, "-m", "dpu_verifier.probe_agent", "run", "--pod", "a"]
            args += ["--to", f"{RELAY_HOST}:{probe_port}", "--rate", f"{RATE_BPS:.0f}", "--burst-s", str(BURST_S)]
            args += ["--period-s", "1", "--start-at", str(first), "--size", str(SIZE), "--key", str(key)]
            proc = subprocess.Popen([*args, "--duration", "30"], stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 40
            while b"check=probe-loss place=a egress" not in log_path.read_bytes():
                assert verifier.poll() is None, log_path.read_text()[-2000:]
                assert time.monotonic() < deadline, log_path.read_text()[-2000:]
                await asyncio.sleep(0.5)
        verifier.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(verifier.wait, 30) == 0
    finally:
        for p in (proc, verifier):
            if p is not None:
                stop(p)
        await plane.stop()
        stop(snmpd)
    assert b"check=probe-forged" not in log_path.read_bytes()  # dropped, not tampered with
    (bundle,) = (tmp_path / "evidence").iterdir()
    check = verify_bundle(bundle, load_public_key(tmp_path / "verifier.key.pub"))
    assert check.ok and check.verdicts.get("violated", 0) >= 1, check


def test_probe_figures_are_re_derived_offline_and_old_bundles_still_verify(tmp_path: Path) -> None:
    """A bundle signed before authenticated probes (three probe figures) reads back as written; in a new one,
    `evidence verify` re-derives probe-loss and probe-forged from the figures, and refuses a record re-signed
    with a verdict they do not give."""
    from test_evidence import SCOPE, T0, figures, resign

    from dpu_verifier.evidence import EvidenceWriter, ProbeResult, judge, load_signer
    from dpu_verifier.evidence import generate_key as evidence_key

    key = tmp_path / "verifier.key"
    pub = load_public_key(evidence_key(key))
    lost = ProbeResult(250_000, 25_000, 506_072, least_bytes=118_968, rejected=0, burst=3)
    forged = ProbeResult(250_000, 250_000, 506_072, rejected=5, burst=4)
    w = EvidenceWriter(tmp_path / "b", load_signer(key), SCOPE, T0)
    for pod, direction in SCOPE:
        probes = {("a", "egress"): (lost,), ("b", "egress"): (forged,)}.get((pod, direction))
        w.window(figures(pod, direction, T0) if probes is None else figures(pod, direction, T0, probes=probes))
    w.close(T0 + 10.0)
    check = verify_bundle(tmp_path / "b", pub)
    assert check.ok and check.verdicts == {"held": 2, "violated": 2}, check
    records = [
        json.loads(base64.b64decode(json.loads(line)["payload"])) for line in (tmp_path / "b" / BUNDLE_FILE).open()
    ]
    old_style = records[2]["predicate"]  # a ingress: the old three figures, nothing added
    assert set(old_style["figures"]["probes"][0]) == {"sent_bytes", "received_bytes", "allowed_bytes"}
    assert records[1]["predicate"]["checks"]["probe-loss"] == "fail"
    assert records[3]["predicate"]["checks"]["probe-forged"] == "fail"
    assert judge(figures("a", "egress", T0, probes=(ProbeResult(1, 2, 3, least_bytes=2, rejected=0),)))[0] == {
        "cap": "pass",
        "conservation": "pass",
        "pipeline": "pass",
        "probe": "pass",
        "probe-loss": "pass",
        "probe-forged": "pass",
    }

    # The signer calls the lost burst held: re-signed with the verifier's own key, and still refused.
    def held(statement: dict[str, object]) -> None:
        pred = statement["predicate"]
        assert isinstance(pred, dict)
        pred["checks"]["probe-loss"], pred["verdict"] = "pass", "held"

    lines = (tmp_path / "b" / BUNDLE_FILE).read_text().splitlines()
    lines[1] = resign(lines[1], load_signer(key), held)
    (tmp_path / "b" / BUNDLE_FILE).write_text("\n".join(lines) + "\n")
    check = verify_bundle(tmp_path / "b", pub)
    assert not check.ok and "record 1" in check.problem and "probe-loss fail" in check.problem, check.problem


def test_hostile_agent_arguments_are_refused_before_sending(tmp_path: Path) -> None:
    """Red team, 2026-12-03: --key /dev/zero hung, a 100,000-char --to host raised a UnicodeError, an --out
    in a missing directory failed after the run, --start-at 1e300 exited 0 having sent nothing."""
    key = tmp_path / "k"
    key.write_bytes(b"k" * KEY_BYTES)
    base = ["probe-agent", "run", "--pod", "a", "--to", "127.0.0.1:9", "--rate", "8M", "--burst-s", "0.2"]
    base += ["--period-s", "1", "--key", str(key), "--duration", "1"]
    cli = [sys.executable, "-m", "dpu_limiter.cli"]
    for args, named in [
        ([*base, "--key", "/dev/zero"], "key:"),
        ([*base[:5], "h" * 100_000 + ":9", *base[6:]], "--to"),
        ([*base, "--out", str(tmp_path / "missing" / "out.json")], "out:"),
        ([*base, "--out", str(tmp_path)], "out:"),
        ([*base, "--start-at", "1e300"], "--start-at"),
        ([*base, "--start-at", "-5"], "--start-at"),
    ]:
        r = subprocess.run([*cli, *args], capture_output=True, text=True, check=False, timeout=30)
        assert r.returncode == 2 and named in r.stderr, (args[-2:], r.stderr[-2000:])
        assert len(r.stderr) < 2000 and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == [key]
