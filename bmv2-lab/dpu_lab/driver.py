"""One scenario driver for both clocks: phases, events, results, audit and report, written once.

A scenario runs on a backend: network namespaces and target processes on the wall clock (runner.py's
`LabRun`), or the simulator and in-process targets on simulated time (virtual.py's `VirtualLabRun`).
The driver does what does not depend on which: it applies the scenario's caps through the control
plane's API, runs the phases in order, carries out each event at its time (a cap change through the
API, a DPU killed and brought back, its firmware compromised), and turns what the backend measured into
the report (evaluate.py, outcome.py). A backend provides the network, time and traffic:

    start()             network, targets, control plane; the API's address and the DPUs to register
    started()           after the caps are in place: captures, boundary counts, the audit; time zero
    begin_phase(...)    start a phase's traffic; the phase's place on the run's time base
    wait_until(t)       let time run to `t` seconds into the run; the time reached
    end_phase()         the phase's traffic is over
    settle()            after a change through the API: wait for the control plane where time can wait
    firmware(dpu) / kill(dpu) / revive(dpu)
    measured()          what the run measured (after the last phase and its linger)
    annotate(report)    what only this backend knows (calibration, routing, workloads)
    close()             stop everything it started
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from dpu_limiter.client import LimiterClient
from dpu_softswitch.firmware import Firmware
from dpu_verifier.checks import Auditor

from .capture import Capture
from .compromise import compromise
from .config import EventSpec, PhaseSpec, Scenario
from .evaluate import LabDpu, PlotSeries, configure, dpu_counters, evaluate, host_macs, set_cap
from .outcome import event_record, finish
from .report import Flow, Phase, Report


@dataclass
class Measured:
    """What a backend measured over the run, for the report."""

    captures: list[tuple[str, Capture]]  # (host, everything one of its interfaces received)
    boundary: Capture  # every frame that crossed a pod's boundary (boundary.py)
    flows: list[Flow]
    sealing: dict[str, dict[str, Any]]  # node DPUs' crypto engines' stats, by host
    auditor: Auditor | None
    time_zero: float  # the captures' time of the run's time zero
    target: Literal["embedded", "bmv2"]
    traffic: str


class Backend(Protocol):
    """Network, time and traffic for the driver (see the module's docstring)."""

    linger_s: float  # after the last phase: late frames still counted

    def say(self, text: str) -> None:
        """Tell the user (the console)."""

    async def start(self) -> tuple[str, list[LabDpu]]:
        """Build the network, start the targets and the control plane; its API address and the DPUs."""

    async def started(self) -> None:
        """The caps are in place: start counting (captures, boundary, audit); time zero is now."""

    async def begin_phase(self, phase: PhaseSpec) -> Phase:
        """Start the phase's traffic; when it runs on the run's time base."""

    async def wait_until(self, t_s: float) -> float:
        """Let time run to `t_s` into the run (the phase's traffic flowing); the time reached."""

    async def end_phase(self) -> None:
        """The current phase is over: collect its senders."""

    async def settle(self) -> None:
        """After a change through the API: wait until the control plane has done it, where time can wait."""

    def firmware(self, dpu: str) -> Firmware:
        """The DPU's firmware, as compromised firmware would reach it."""

    async def kill(self, dpu: str) -> None:
        """The DPU dies, losing its pipeline and state."""

    async def revive(self, dpu: str) -> None:
        """The DPU is back, empty, on the same address."""

    async def measured(self) -> Measured:
        """Stop counting; what the run measured."""

    async def annotate(self, report: Report) -> None:
        """Add what only this backend knows to the report."""

    async def close(self) -> None:
        """Stop everything the backend started (idempotent)."""


@dataclass(order=True)
class _Step:
    """Something the scenario does at `t_s` into the run: an event, or a restarted DPU coming back."""

    t_s: float
    seq: int
    event: EventSpec = field(compare=False)
    revive: bool = field(default=False, compare=False)


@dataclass
class Driver:
    """Runs one scenario on a backend; `run()` returns the report."""

    scenario: Scenario
    backend: Backend
    out_dir: Path
    api: str = ""
    events: list[dict[str, object]] = field(default_factory=list)
    series: PlotSeries = field(default_factory=dict)  # the report's plot series (after run())
    _steps: list[_Step] = field(default_factory=list)
    _seq: Callable[[], int] = field(default_factory=lambda: itertools.count().__next__)

    async def run(self) -> Report:
        """Run the scenario end to end; the backend is closed whatever happens."""
        sc, b = self.scenario, self.backend
        try:
            self.api, dpus = await b.start()
            async with LimiterClient(self.api) as client:
                await configure(client, sc, dpus)
            b.say("caps applied through the control plane; every DPU converged (read back)")
            await b.started()
            phases = []
            for spec in sc.phases:
                phase = await b.begin_phase(spec)
                phases.append(phase)
                for ev in spec.events:
                    self._schedule(phase.start + ev.at_s, ev)
                await self._until(phase.end)
                await b.end_phase()
                b.say(f"phase [bold]{spec.name}[/] done ({spec.duration_s:g} s)")
            await self._until(phases[-1].end + b.linger_s)  # late frames of the last phase
            m = await b.measured()
            duration = sum(ph.duration_s for ph in sc.phases)
            report, series = evaluate(
                sc, m.captures, m.boundary, phases, m.flows, m.time_zero, duration, m.target, m.traffic
            )
            self.series = series
            report.dpu_counters = await dpu_counters(self.api)
            report.events = self.events
            await b.annotate(report)
        finally:
            await b.close()
        return finish(sc, self.out_dir, report, series, self.events, m.auditor, m.sealing, b.say)

    def _schedule(self, t_s: float, ev: EventSpec, revive: bool = False) -> None:
        heapq.heappush(self._steps, _Step(t_s, self._seq(), ev, revive))

    async def _until(self, t_s: float) -> None:
        """Let time run to `t_s`, carrying out every step due on the way at its time (steps due later wait
        for a later call: one due after the run's end never happens)."""
        while self._steps and self._steps[0].t_s <= t_s:
            step = heapq.heappop(self._steps)
            await self._act(step, await self.backend.wait_until(step.t_s))
        await self.backend.wait_until(t_s)

    async def _act(self, step: _Step, t_s: float) -> None:
        """Carry out a step reached at `t_s`: a cap change through the API, a DPU killed or brought back,
        or its firmware compromised."""
        b, ev = self.backend, step.event
        if step.revive:
            assert ev.dpu is not None
            await b.revive(ev.dpu)
            b.say(f"{t_s:.1f} s: {ev.dpu} back, reprogrammed by the control plane")
            return
        if ev.action == "set-cap":
            async with LimiterClient(self.api) as client:
                await set_cap(client, self.scenario, ev, wait=False)  # traffic does not wait for it
            await b.settle()
            b.say(f"{t_s:.1f} s: pod {ev.pod} cap set to {ev.egress:g}/{ev.ingress:g} bit/s")
        elif ev.action == "restart-dpu":
            assert ev.dpu is not None
            await b.kill(ev.dpu)
            self._schedule(step.t_s + ev.down_for_s, ev, revive=True)
            b.say(f"{t_s:.1f} s: {ev.dpu} killed, back in {ev.down_for_s:g} s with no pipeline")
        else:
            assert ev.dpu is not None and ev.how is not None
            compromise(b.firmware(ev.dpu), ev.how, ev.forge, list(host_macs(self.scenario).values()))
            b.say(f"{t_s:.1f} s: {ev.dpu} compromised ({ev.how}{', forging' if ev.forge else ''})")
        self.events.append(event_record(ev, t_s, step.t_s))
