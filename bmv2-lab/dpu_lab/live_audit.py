"""The verifier's audit in a real-time lab run: audit.py's checks on the wall clock.

The router is a Linux namespace; the verifier's count per pod is every frame on the pod's port on the
router, whatever it holds (bytes the router received on it are the pod's egress, bytes it sent the
pod's ingress), as the boundary capture counts them for the report (boundary.py: the same counts,
asked for every SAMPLE_S and just before each tick reads the DPUs; an answer covers every frame the
kernel had delivered when it was asked). The control plane is reached through its API, as a verifier
beside it would: read-back is the control plane's reconciler (every DPU read back against desired state every
`interval_s`, each correction counted per DPU in GetStatus), conservation takes the DPUs' counters
from GetUsage, read between two readings of the router's, and alerts after two intervals in a row
out of balance (a software DPU's input queue may hold for a moment what the router already sent).

Probes: the verifier's probe agent on each capped pod's first host (a UDP sender in its namespace)
sends `probe_factor` times the pod's egress cap for `probe_s` at the start of every interval, to the
router's own address in another pod's subnet (so the pod's DPUs meter it as the pod's egress, and no
other pod's ingress cap can hide it). The router counts what arrives on a socket of its own (opened
in its namespace); each datagram carries its send time, so a burst is judged whole at the first tick
after it, however late that tick runs. Its bytes count against the pod's cap at the pod's DPUs, but
no host receives them, so the report's receiver-side figures do not include them.
Not in real time: the pipeline hash. The control plane's reconciler looks at a DPU's pipeline when
its reads fail, and loads its own again if another one runs (or the state is unreadable): that
reload is a drift correction, which read-back reports.
"""

from __future__ import annotations

import asyncio
import math
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dpu_limiter.units import MAX_FRAME_BYTES
from dpu_verifier.checks import ApiView, Auditor, Probe

from .audit import PROBE_PORT, scope
from .config import CapSpec, Scenario, probe_allowance_bytes
from .netns import entered
from .traffic import UDP_HEADER, UDP_OVERHEAD_BYTES, Timeline

SAMPLE_S = 0.1
PROBE_PAYLOAD = 1400
PROBE_LEAD_S = 1.0  # the first probe starts at least this long after the audit: time to start its sender
# A burst's allowance in real time: the cap's, plus frames that cross an interval's edge or straggle.
PROBE_SLACK_BYTES = 4 * MAX_FRAME_BYTES
# Linux's SO_TIMESTAMPNS (asm-generic/socket.h; Python's socket module does not name it): each datagram
# comes with when the kernel received it, as a timespec (seconds, nanoseconds).
SO_TIMESTAMPNS = 35
TIMESPEC = struct.Struct("@qq")

# Starts a process in a namespace and keeps it for the run's cleanup: (name, namespace, module, args).
Spawn = Callable[[str, str, str, list[str]], subprocess.Popen[bytes]]


# The router's counts so far, per (pod, direction): every frame on each pod's port (boundary.py).
RouterCounts = Callable[[], Mapping[tuple[str, str], int]]


@dataclass
class LiveAudit:
    """Samples the router and ticks the audit in a thread of its own, from `start()` to `stop()`."""

    scenario: Scenario
    api: str
    router_ns: str
    counts: RouterCounts  # the router's counts so far (BoundaryProcess.router_totals)
    t_start: float  # the run's time zero (time.time())
    host_ns: dict[str, str] = field(default_factory=dict)  # host -> its namespace (probe senders)
    spawn: Spawn | None = None  # how probe senders are started (the runner's, which cleans them up)
    run_s: float = 0.0  # an upper bound on the run's length: how long probe senders send
    evidence_dir: Path | None = None  # where the audit signs its figures (Auditor.open_evidence)
    router: dict[tuple[str, str], Timeline] = field(default_factory=dict)
    auditor: Auditor | None = None
    error: str | None = None
    _last: dict[tuple[str, str], int] = field(default_factory=dict)  # the router's last counts
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _probe_socks: dict[int, socket.socket] = field(default_factory=dict)  # port -> the router's socket
    _probe_senders: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # (sent at, port, wire bytes, received at: the router's kernel timestamp)
    _probe_pending: list[tuple[float, int, int, float]] = field(default_factory=list)
    _probes: dict[int, Probe] = field(default_factory=dict)  # port -> its probe (bytes counted per burst)
    _probe_caps: dict[int, tuple[CapSpec, float]] = field(default_factory=dict)  # port -> its pod's cap and rate
    # (port, burst) -> each of its datagrams' (arrival, wire bytes), for its arrival curve
    _probe_arrivals: dict[tuple[int, int], list[tuple[float, int]]] = field(default_factory=dict)
    _probe_first: float = 0.0  # when the first bursts start (time.time()); one every interval after

    def start(self) -> None:
        """Begin sampling and checking."""
        assert self.scenario.audit is not None
        self.auditor = Auditor(
            scope(self.scenario),
            self.router,
            ApiView(self.api),
            # A window of sampled bins can be up to two samples longer than the window.
            count_slack_s=2 * SAMPLE_S,
            checks=self.scenario.audit.checks,
            resample=self._resample,
            persist=2,
        )
        if "probe" in self.scenario.audit.checks:
            self.auditor.probes = self._start_probes()
        if self.evidence_dir is not None:
            self.auditor.open_evidence(self.evidence_dir)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._loop()), name="live-audit", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current step, and stop the probes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for proc in self._probe_senders:
            if proc.poll() is None:
                proc.terminate()
        for sock in self._probe_socks.values():
            sock.close()
        self._probe_socks.clear()

    def _start_probes(self) -> list[Probe]:
        """Open the router's probe sockets and start each capped pod's probe sender (the module's docstring)."""
        sc, audit = self.scenario, self.scenario.audit
        assert audit is not None and self.spawn is not None
        interval = audit.interval_s
        first = self._probe_first = self.t_start + math.ceil(PROBE_LEAD_S / interval) * interval
        for i, cap in enumerate(sc.caps):
            pod, port = sc.topology.pod(cap.pod), PROBE_PORT + i
            to = next(p for p in sc.topology.pods if p.name != cap.pod).gateway  # the router, outside the pod
            with entered(self.router_ns):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # when each datagram arrived
            sock.bind((to, port))
            sock.setblocking(False)
            self._probe_socks[port] = sock
            rate = sc.peak_rates(cap.pod)[0]
            args = ["udp-send", "--dst", to, "--port", str(port), "--rate-bps", f"{audit.probe_factor * rate:.0f}"]
            args += ["--size", str(PROBE_PAYLOAD), "--burst-s", str(audit.probe_s), "--period-s", str(interval)]
            args += ["--duration", f"{self.run_s:.1f}", "--start-at", f"{first:.6f}"]
            self._probe_senders.append(
                self.spawn(f"probe-{cap.pod}", self.host_ns[pod.hosts[0]], "dpu_lab.traffic", args)
            )
            offered = int(audit.probe_factor * rate * audit.probe_s / 8)
            allowed = probe_allowance_bytes(cap, rate, audit.probe_s) + PROBE_SLACK_BYTES
            self._probes[port] = Probe(cap.pod, offered, allowed)
            self._probe_caps[port] = (cap, rate)
        return list(self._probes.values())

    def _drain_probes(self) -> None:
        """Read what reached the router's probe sockets since the last sample, with when it arrived."""
        buf = bytearray(65536)
        for port, sock in self._probe_socks.items():
            while True:
                try:
                    n, ancillary, _, _ = sock.recvmsg_into([buf], socket.CMSG_SPACE(TIMESPEC.size))
                except BlockingIOError:
                    break
                arrived = time.time()
                for level, kind, data in ancillary:
                    if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS):
                        sec, nsec = TIMESPEC.unpack_from(data)
                        arrived = sec + nsec * 1e-9
                if n >= UDP_HEADER.size:
                    sent = UDP_HEADER.unpack_from(buf)[1]
                    self._probe_pending.append((sent, port, n + UDP_OVERHEAD_BYTES, arrived))

    def _judge_probes(self, boundary: float) -> None:
        """Count every probe datagram sent before `boundary` (an interval's end) against the burst it was sent
        in, for the coming tick; the burst that just ended is judged even if none of it arrived.

        A sender's stamp is only believed where it can be true (red team, 2026-12-03): finite, not after the
        datagram arrived, and in a burst it arrived within an interval of the end of (a straggler); anything
        else is dropped, so that no stamp reopens an old burst, seeds a future one, or stops the audit."""
        assert self.scenario.audit is not None
        interval = self.scenario.audit.interval_s
        ended = round((boundary - self._probe_first) / interval) - 1
        self._drain_probes()
        keep = []
        touched: set[tuple[int, int]] = set()
        for sent, port, wire, arrived in self._probe_pending:
            if not (math.isfinite(sent) and self._probe_first <= sent <= arrived):
                continue
            if sent >= boundary:
                keep.append((sent, port, wire, arrived))
                continue
            k = math.floor((sent - self._probe_first) / interval)
            if arrived >= self._probe_first + (k + 2) * interval:
                continue  # arrived more than an interval after its burst: not a straggler of it
            probe = self._probes[port]
            probe.bursts[k] = probe.bursts.get(k, 0) + wire
            self._probe_arrivals.setdefault((port, k), []).append((arrived, wire))
            touched.add((port, k))
        self._probe_pending = keep
        for port, k in touched:
            cap, rate = self._probe_caps[port]
            self._probes[port].allowances[k] = self._burst_allowance(
                cap, rate, self._probe_arrivals[(port, k)], self._probe_first + k * interval
            )
        if ended >= 0:
            for probe in self._probes.values():
                probe.bursts.setdefault(ended, 0)

    def _burst_allowance(self, cap: CapSpec, rate: float, arrivals: list[tuple[float, int]], start: float) -> int:
        """What a burst that arrived as `arrivals` (time, wire bytes) may hold: the cap over the time it took
        to get through (a loaded target passes it more slowly than it was sent: a clean run's one alarm,
        4,374 B over), but judged along its arrival curve from the burst's start, not only whole, so that a
        burst passed at line rate with one datagram held back does not buy the longer time (red team:
        997,864 B within 0.5 s against 607,590)."""
        assert self.scenario.audit is not None
        probe_s = self.scenario.audit.probe_s
        arrivals.sort()
        origin = max(start, arrivals[0][0])
        total = sum(w for _, w in arrivals)

        def allowed(seconds: float) -> int:
            return probe_allowance_bytes(cap, rate, seconds) + PROBE_SLACK_BYTES

        # As an allowance for the whole: the total, less the most any prefix went over the cap over its time
        # (never less than the burst was sent over). The last prefix is the whole burst.
        excess, so_far = -math.inf, 0
        for t, w in arrivals:
            so_far += w
            excess = max(excess, so_far - allowed(max(probe_s, t - origin)))
        return int(total - excess)

    def _resample(self) -> None:
        """Add the router's counts since the last sample to its timelines."""
        t = time.time() - self.t_start
        counts = dict(self.counts())
        for where, n in counts.items():
            # A pod and direction first seen now had no bytes when the audit began (the capture was running).
            self.router.setdefault(where, Timeline(SAMPLE_S)).add(t, n - self._last.get(where, 0))
        self._last = counts

    async def _loop(self) -> None:
        assert self.auditor is not None and self.scenario.audit is not None
        interval = self.scenario.audit.interval_s
        self._last = dict(self.counts())
        next_tick = self.t_start + interval
        try:
            while not self._stop.is_set():
                await asyncio.sleep(SAMPLE_S)
                self._resample()  # also just before a tick reads the DPUs
                self._drain_probes()
                now = time.time()
                if now >= next_tick:
                    self._judge_probes(next_tick)
                    await self.auditor.tick(round(now - self.t_start, 3))
                    next_tick += interval
        except Exception as exc:  # reported with the run, not lost in a thread
            self.error = f"{type(exc).__name__}: {exc}"
