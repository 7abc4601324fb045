"""The verifier's audit in a real-time lab run: audit.py's checks on the wall clock.

The router is a Linux namespace; the verifier's count per pod is every frame on the pod's port on the
router, whatever it holds (bytes the router received on it are the pod's egress, bytes it sent the
pod's ingress), as the boundary capture counts them for the report (boundary.py: the same counts,
asked for every SAMPLE_S and just before each tick reads the DPUs; an answer covers every frame the
kernel had delivered when it was asked). Each reading keeps when it was asked for and when it was
answered (checks.Readings), and the router-count check judges the bytes between two readings whose span
fits in the cap's window against its allowance: on a loaded machine the sampler can run far later than
SAMPLE_S, so no fixed slack on bins would do, and none is needed (the span is known). The control plane
is reached through its API, as a verifier beside it would: read-back is the control plane's reconciler
(every DPU read back against desired state every `interval_s`, each correction counted per DPU in
GetStatus), conservation takes the DPUs' counters from GetUsage, read between two readings of the
router's, and alerts after two intervals in a row out of balance (a software DPU's input queue may hold
for a moment what the router already sent).

Probes: the verifier's probe agent (dpu_verifier.probes, the product's own) on each capped pod's first
host sends `probe_factor` times the pod's egress cap for `probe_s` at the start of every interval, to
the router's own address in another pod's subnet (so the pod's DPUs meter it as the pod's egress, and
no other pod's ingress cap can hide it). Each pod's agent gets a key of its own, made for the run. The
router takes what arrives on a socket of its own (opened in its namespace) through the product's
receiver: only datagrams whose HMAC verifies for that pod and port, not replayed, with a stamp that can
be true, count; the rest are refused and reported (`probe-forged`). Each datagram carries its send
time, so a burst is judged whole at the first tick after it, however late that tick runs; once its
stragglers are all in, a burst that got far less than the cap left free of the pod's other traffic
(the router's own count) is `probe-loss`. Its bytes count against the pod's cap at the pod's DPUs, but
no host receives them, so the report's receiver-side figures do not include them.
Not in real time: the pipeline hash. The control plane's reconciler looks at a DPU's pipeline when
its reads fail, and loads its own again if another one runs (or the state is unreadable): that
reload is a drift correction, which read-back reports.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dpu_limiter.units import MAX_FRAME_BYTES
from dpu_verifier.api_view import ApiView
from dpu_verifier.checks import Auditor, Probe
from dpu_verifier.probes import (
    Pending,
    ProbeReceiver,
    ProbeSchedule,
    ProbeSink,
    Report,
    burst_plan,
    close_bursts,
    count_bursts,
    generate_key,
    load_key,
)
from dpu_verifier.readings import Readings

from .audit import PROBE_PORT, scope
from .config import CapSpec, Scenario, probe_allowance_bytes
from .netns import entered
from .traffic import Timeline

SAMPLE_S = 0.1
PROBE_PAYLOAD = 1400
PROBE_LEAD_S = 1.0  # the first probe starts at least this long after the audit: time to start its sender
# A burst's allowance in real time: the cap's, plus frames that cross an interval's edge or straggle.
PROBE_SLACK_BYTES = 4 * MAX_FRAME_BYTES

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
    readings: dict[tuple[str, str], Readings] = field(default_factory=dict)  # the same counts, as read
    auditor: Auditor | None = None
    error: str | None = None
    _last: dict[tuple[str, str], int] = field(default_factory=dict)  # the router's last counts
    _first_read: tuple[float, float] = (0.0, 0.0)  # when the audit's first reading was asked for and answered
    # Readings are timed on the monotonic clock (a step of the wall clock must not shorten a span), set to
    # agree with the run's time (time.time() - t_start) when the audit starts.
    _mono0: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _probe_sink: ProbeSink = field(default_factory=ProbeSink)  # the router's sockets, port -> pod's receiver
    _probe_keys: str | None = None  # the directory of the run's probe keys (removed at stop)
    _probe_senders: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # (sent at, port, wire bytes, received at: the router's kernel timestamp), authenticated
    _probe_pending: list[Pending] = field(default_factory=list)
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
            checks=self.scenario.audit.checks,
            readings=self.readings,
            resample=self._resample,
            persist=2,
        )
        if "probe" in self.scenario.audit.checks:
            self.auditor.probes = self._start_probes()
        if self.evidence_dir is not None:
            self.auditor.open_evidence(self.evidence_dir, interval_s=self.scenario.audit.interval_s)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._loop()), name="live-audit", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current step, and stop the probes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for proc in self._probe_senders:
            if proc.poll() is None:
                proc.terminate()  # only the signal: the runner's cleanup waits for them (and kills any that linger)
        self._probe_sink.close()
        if self._probe_keys is not None:
            shutil.rmtree(self._probe_keys, ignore_errors=True)
            self._probe_keys = None

    def _start_probes(self) -> list[Probe]:
        """Open the router's probe sockets and start each capped pod's probe agent (the module's docstring)."""
        sc, audit = self.scenario, self.scenario.audit
        assert audit is not None and self.spawn is not None
        interval = audit.interval_s
        first = self._probe_first = self.t_start + math.ceil(PROBE_LEAD_S / interval) * interval
        schedule = ProbeSchedule(first, interval)
        self._probe_keys = tempfile.mkdtemp(prefix="dpu-probe-keys-")
        for i, cap in enumerate(sc.caps):
            pod, port = sc.topology.pod(cap.pod), PROBE_PORT + i
            to = next(p for p in sc.topology.pods if p.name != cap.pod).gateway  # the router, outside the pod
            key_file = generate_key(Path(self._probe_keys) / f"pod-{i}.key")
            rx = ProbeReceiver(cap.pod, load_key(key_file), port, schedule)
            with entered(self.router_ns):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._probe_sink.listen(sock, to, rx)
            rate = sc.peak_rates(cap.pod)[0]
            args = ["run", "--pod", cap.pod, "--to", f"{to}:{port}", "--rate", f"{audit.probe_factor * rate:.0f}"]
            args += ["--size", str(PROBE_PAYLOAD), "--burst-s", str(audit.probe_s), "--period-s", str(interval)]
            args += ["--duration", f"{self.run_s:.1f}", "--start-at", f"{first:.6f}", "--key", str(key_file)]
            self._probe_senders.append(
                self.spawn(f"probe-{cap.pod}", self.host_ns[pod.hosts[0]], "dpu_verifier.probe_agent", args)
            )
            offered = int(audit.probe_factor * rate * audit.probe_s / 8)
            allowed = probe_allowance_bytes(cap, rate, audit.probe_s) + PROBE_SLACK_BYTES
            # Under-delivery is judged against the lowest rate the pod's cap takes in the run; not at all where a
            # DPU restarts (it passes nothing, rightly, until its hold ends: leases.md).
            events = [e for ph in sc.phases for e in ph.events]
            changes = [float(e.egress) for e in events if e.pod == cap.pod and e.egress is not None]
            restarts = any(e.action == "restart-dpu" for e in events)
            lowest = 0.0 if restarts else min([cap.egress, *changes])
            self._probes[port] = Probe(cap.pod, offered, allowed, floor_bps=lowest, rejected=rx.rejected)
            self._probe_caps[port] = (cap, rate)
        return list(self._probes.values())

    def _drain_probes(self) -> None:
        """Take what reached the router's probe sockets since the last sample (authenticated), with when it arrived."""
        self._probe_pending += self._probe_sink.drain()

    def _judge_probes(self, boundary: float) -> None:
        """Count every probe datagram sent before `boundary` (an interval's end) against the burst it was sent
        in, for the coming tick; the burst that just ended is judged even if none of it arrived; hand the
        audit each burst whose stragglers are all in, for the under-delivery check (probes.close_bursts).

        A sender's stamp is only believed where it can be true (red team, 2026-12-03: ProbeSchedule.refuse),
        so that no stamp reopens an old burst, seeds a future one, or stops the audit."""
        audit = self.scenario.audit
        assert audit is not None
        self._drain_probes()
        schedule = ProbeSchedule(self._probe_first, audit.interval_s)

        def allowed(port: int, seconds: float) -> int:
            cap, rate = self._probe_caps[port]
            return probe_allowance_bytes(cap, rate, seconds) + PROBE_SLACK_BYTES

        self._probe_pending = count_bursts(
            self._probe_pending, boundary, schedule, self._probes, self._probe_arrivals, allowed, audit.probe_s
        )
        for port, rx in self._probe_sink.receivers.items():
            rate = self._probe_caps[port][1]
            n, gap = burst_plan(audit.probe_factor * rate, audit.probe_s, PROBE_PAYLOAD)
            planned = Report(n, n * PROBE_PAYLOAD, (n - 1) * gap)
            close_bursts(self._probes[port], rx, boundary, planned, lambda t: t - self.t_start)

    def _now(self) -> float:
        """The run's time (seconds since t_start), on the monotonic clock."""
        return time.monotonic() - self._mono0

    def _read(self) -> tuple[float, float, dict[tuple[str, str], int]]:
        """The router's counts so far, with when they were asked for and when they were answered."""
        asked = self._now()
        counts = dict(self.counts())
        return asked, self._now(), counts

    def _resample(self) -> None:
        """Add the router's counts since the last sample to its timelines and readings."""
        t = time.time() - self.t_start
        asked, answered, counts = self._read()
        for where, n in counts.items():
            # A pod and direction first seen now had no bytes when the audit began (the capture was running).
            self.router.setdefault(where, Timeline(SAMPLE_S)).add(t, n - self._last.get(where, 0))
            self.readings.setdefault(where, Readings([self._first_read[0]], [self._first_read[1]], [0]))
            self.readings[where].read(asked, answered, n)
        self._last = counts

    async def _loop(self) -> None:
        assert self.auditor is not None and self.scenario.audit is not None
        interval = self.scenario.audit.interval_s
        self._mono0 = time.monotonic() - (time.time() - self.t_start)
        asked, answered, self._last = self._read()
        self._first_read = (asked, answered)
        for where, n in self._last.items():
            self.readings[where] = Readings([asked], [answered], [n])
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
