"""The verifier's audit in a real-time lab run: audit.py's checks on the wall clock.

The router is a Linux namespace; its own interface counters are the verifier's count per pod (the
pod's port on the router: bytes received are the pod's egress, bytes sent its ingress), sampled
every SAMPLE_S. The control plane is reached through its API, as a verifier beside it would:
read-back is the control plane's reconciler (every DPU read back against desired state every
`interval_s`, each correction counted per DPU in GetStatus), conservation takes the DPUs' counters
from GetUsage, read between two readings of the router's, and alerts after two intervals in a row
out of balance (a software DPU's input queue may hold for a moment what the router already sent).
Not in real time: the pipeline hash (the reconciler puts its own pipeline back when the cookie
differs) and active probes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from dataclasses import dataclass, field

from dpu_limiter.client import LimiterClient

from .audit import Auditor
from .config import Scenario
from .traffic import Timeline

SAMPLE_S = 0.1


@dataclass
class ApiView:
    """The DPUs as the control plane's API shows them."""

    address: str
    _drift: dict[str, int] = field(default_factory=dict)

    async def read_back(self) -> list[tuple[str, str]]:
        """New drift corrections of the control plane's periodic read-back, per DPU."""
        async with LimiterClient(self.address) as client:
            status = await client.status()
        found = []
        for d in status.dpus:
            if d.drift_corrections > self._drift.get(d.name, 0):
                found.append((d.name, d.last_drift.partition(": ")[2] or d.last_drift))
            self._drift[d.name] = d.drift_corrections
        return found

    async def counters(self) -> dict[str, tuple[str, tuple[int, int] | None]]:
        """Each pod's counters, summed over its DPUs by the control plane."""
        async with LimiterClient(self.address) as client:
            usage = await client.usage()
        out: dict[str, tuple[int, int]] = {}
        for u in usage.usage:
            passed, metered = out.get(u.pod, (0, 0))
            if u.direction == "egress":
                passed += u.green_bytes + u.yellow_bytes
            else:
                metered += u.green_bytes + u.yellow_bytes + u.red_bytes + u.window_bytes + u.lease_bytes
            out[u.pod] = (passed, metered)
        return {pod: (pod, counts) for pod, counts in out.items()}


def router_counters(ns: str, ports: dict[str, str]) -> dict[str, tuple[int, int]]:
    """(bytes received from, bytes sent to) each pod's port on the router namespace `ns`."""
    res = subprocess.run(
        ["ip", "-n", ns, "-s", "-j", "link", "show"], capture_output=True, text=True, check=True, timeout=10
    )
    stats = {link["ifname"]: link["stats64"] for link in json.loads(res.stdout)}
    return {pod: (stats[ifname]["rx"]["bytes"], stats[ifname]["tx"]["bytes"]) for pod, ifname in ports.items()}


@dataclass
class LiveAudit:
    """Samples the router and ticks the audit in a thread of its own, from `start()` to `stop()`."""

    scenario: Scenario
    api: str
    router_ns: str
    ports: dict[str, str]  # pod -> its port on the router
    t_start: float  # the run's time zero (time.time())
    router: dict[tuple[str, str], Timeline] = field(default_factory=dict)
    auditor: Auditor | None = None
    error: str | None = None
    _last: dict[str, tuple[int, int]] = field(default_factory=dict)  # the router's last counts per pod
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin sampling and checking."""
        assert self.scenario.audit is not None
        self.auditor = Auditor(
            self.scenario,
            self.router,
            ApiView(self.api),
            # A window of sampled bins can be up to two samples longer than the window.
            count_slack_s=2 * SAMPLE_S,
            checks=self.scenario.audit.checks,
            resample=self._resample,
            persist=2,
        )
        self._thread = threading.Thread(target=lambda: asyncio.run(self._loop()), name="live-audit", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current step."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _resample(self) -> None:
        """Add the router's counts since the last sample to its timelines."""
        t = time.time() - self.t_start
        counts = router_counters(self.router_ns, self.ports)
        for pod, (rx, tx) in counts.items():
            last_rx, last_tx = self._last.get(pod, (rx, tx))
            for direction, delta in (("egress", rx - last_rx), ("ingress", tx - last_tx)):
                self.router.setdefault((pod, direction), Timeline(SAMPLE_S)).add(t, delta)
        self._last = counts

    async def _loop(self) -> None:
        assert self.auditor is not None and self.scenario.audit is not None
        interval = self.scenario.audit.interval_s
        self._last = router_counters(self.router_ns, self.ports)
        next_tick = self.t_start + interval
        try:
            while not self._stop.is_set():
                await asyncio.sleep(SAMPLE_S)
                self._resample()  # also just before a tick reads the DPUs
                now = time.time()
                if now >= next_tick:
                    await self.auditor.tick(round(now - self.t_start, 3))
                    next_tick += interval
        except Exception as exc:  # reported with the run, not lost in a thread
            self.error = f"{type(exc).__name__}: {exc}"
