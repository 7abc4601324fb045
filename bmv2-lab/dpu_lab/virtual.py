"""`dpu-limiter lab run --time virtual`: the same scenario, caps applied through the same API, on
embedded targets that run on simulated time (see sim.py for what is and is not modelled).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from rich.console import Console

from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT, MAX_FRAME_BYTES
from dpu_softswitch.clock import VirtualClock
from dpu_softswitch.firmware import LocalFirmware
from dpu_softswitch.server import Device, add_to_server
from dpu_verifier.checks import ApiView, Auditor, Probe

from .audit import PROBE_PORT, read_back_s, scope
from .compromise import compromise
from .config import ConfigError, EventSpec, Scenario, probe_allowance_bytes
from .evaluate import LabDpu, PlotSeries, configure, dpu_counters, evaluate, host_macs, set_cap
from .frames import Encap, shape
from .outcome import event_record, finish
from .report import Flow, Phase, Protocol, Report
from .routing import cell_name, reroute
from .sim import NS, Engine, SimNetwork, UdpSource, udp_source
from .simclock import SimClock
from .tcp_model import MSS, TcpReceiver, TcpSender, tcp_flow
from .workloads import DilocoSpec, WorkloadSpec, describe, effective_slowdown, expand, workload_step

BASE_PORT = 5201
START_S = 0.1  # traffic starts a little after time zero, like the real lab's start delay
LINGER_S = 0.05
REBALANCE_S = 1.0  # simulated seconds between rebalancing passes of pods that rebalance
WORKLOAD_PAYLOAD = 1400  # datagram payload of workload streams (as a flow's default size)
QUIET_TIMEOUT_S = 30.0  # wall seconds the simulation waits for the control plane at a pause
NEVER_S = 1e6  # "never" within any run (a far larger timeout upsets the gRPC event loop)


@dataclass
class _Sending:
    """One sender of the run: a scenario flow (UDP or TCP), or a stream of a workload (UDP)."""

    phase: Phase
    name: str
    src: str
    dst: str
    segments: list[tuple[int, int, float]]  # (start_ns, end_ns, rate_bps; TCP: bulk, the rate unused)
    payload: int  # UDP: the datagram's payload; TCP: the segment's (MSS)
    encap: Encap = "none"
    spoof_src: str | None = None
    uplink: int | None = None  # pinned to this uplink of its pod (1-based)
    protocol: Protocol = "udp"
    port: int = 0
    source: UdpSource | None = None
    tcp: tuple[TcpSender, TcpReceiver] | None = None
    delivered_bytes: int = 0

    @property
    def on_s(self) -> float:
        """Simulated seconds during which it offered traffic."""
        return sum(end - start for start, end, _ in self.segments) / NS


def workload_result(phase: str, spec: WorkloadSpec, streams: list[_Sending]) -> dict[str, object]:
    """The report's entry for one workload: what it is, what got through, and what that does to training.

    The effective bandwidth is the slowest stream's delivered rate while it was sending (a ring
    all-reduce or a pipeline is as fast as its slowest link). The slowdown assumes communication
    overlaps computation perfectly (a lower bound); DiLoCo blocks on its outer sync instead.
    """
    effective = min((s.delivered_bytes * 8 / s.on_s for s in streams if s.on_s > 0), default=0.0)
    out: dict[str, object] = {
        "phase": phase,
        "kind": spec.kind,
        "description": describe(spec),
        "streams": len(streams),
        "effective_bps": effective,
    }
    volume, step = workload_step(spec)
    if volume is not None and step is not None:
        out["volume_per_step_bytes"] = volume
        out["step_s"] = step
        if effective > 0:
            if isinstance(spec, DilocoSpec):
                unconstrained = step + volume * 8 / spec.link_bps
                out["slowdown"] = (step + volume * 8 / effective) / unconstrained
            else:
                out["slowdown"] = effective_slowdown(volume, step, effective)
        else:
            out["slowdown"] = None  # nothing got through: training cannot proceed at all
    return out


def limiters_of(sc: Scenario) -> list[tuple[str, str, str]]:
    """(name, role, pod) of every limiter the topology's placements call for."""
    topo = sc.topology
    if topo.pods[0].placement == "router":
        return [(f"dpu-{r}", "router", cell_name(r)) for r in topo.routers]
    return [(name, pod.placement, pod.name) for pod in topo.pods for name in pod.limiters()]


@dataclass
class VirtualLabRun:
    """One scenario in virtual time; `run()` returns the report."""

    scenario: Scenario
    out_dir: Path
    segment_bytes: int | None = None
    console: Console = field(default_factory=lambda: Console(stderr=True))
    stats: dict[str, float] = field(default_factory=dict)
    _workloads: list[tuple[str, WorkloadSpec, list[_Sending]]] = field(default_factory=list)
    series: PlotSeries = field(default_factory=dict)  # receiver-side throughput, as plotted (after run())
    seal_stats: dict[str, dict[str, object]] = field(default_factory=dict)  # node DPUs' engines (after run())
    # Each probe, and where its receiver counts bytes by port (_count_probes).
    _probe_feeds: list[tuple[Probe, dict[int, int], int]] = field(default_factory=list)

    def run(self) -> Report:
        """Run the scenario end to end."""
        for f in (f for ph in self.scenario.phases for f in ph.flows if f.protocol == "tcp"):
            if f.encap != "none" or f.spoof_src is not None:
                raise ConfigError(
                    f"flow {f.name!r}: a TCP flow is plain TCP/IPv4 in virtual time; remove encap/spoof_src"
                )
        for f in (f for ph in self.scenario.phases for f in ph.flows if f.rate == math.inf):
            # Virtual links have no sender speed to run at: the flow would never let the clock move.
            raise ConfigError(f"flow {f.name!r}: rate: max is real time only; give a rate in virtual time")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "raw").mkdir(exist_ok=True)
        return asyncio.run(self._run())

    def _say(self, text: str) -> None:
        self.console.print(f"[bold magenta]lab (virtual time)[/] {text}")

    async def _run(self) -> Report:
        sc = self.scenario
        clock = VirtualClock()
        devices: dict[str, Device] = {}
        self._servers: dict[str, tuple[grpc.aio.Server, int]] = {}
        dpus: list[LabDpu] = []
        db = self.out_dir / "raw" / "control-plane.db"
        db.unlink(missing_ok=True)
        # The control plane runs its own loops (leases, rebalancing, holds, read-back) on the simulation's
        # clock: it acts at the simulated instants it asks for, while the simulation waits, so a run does
        # not depend on how fast this machine is. It reads DPUs back only for an audit.
        self._clock = SimClock()
        every = read_back_s(sc) or NEVER_S
        plane = ControlPlane(
            db,
            "127.0.0.1:0",
            Settings(rebalance_interval_s=REBALANCE_S, resync_s=every, pipeline_check_s=every, clock=self._clock),
        )
        try:
            for name, role, pod_name in limiters_of(sc):
                device = Device(len(devices) + 1, clock, cpu_port=CPU_PORT)
                server = grpc.aio.server()
                add_to_server(server, device)
                port = server.add_insecure_port("127.0.0.1:0")
                await server.start()
                devices[name], self._servers[name] = device, (server, port)
                dpus.append(LabDpu(name, role, pod_name, f"127.0.0.1:{port}", len(devices)))
            await plane.start()
            async with LimiterClient(plane.address) as client:
                await configure(client, sc, dpus)
            self._say(f"scenario [bold]{sc.name}[/]: {len(devices)} embedded targets programmed by the control plane")
            report, series, auditor, events = await self._simulate(clock, devices, plane)
            self.series = series
            report.dpu_counters = await dpu_counters(plane.address)
        finally:
            await plane.stop()
            for server, _ in self._servers.values():
                await server.stop(grace=0)
        for host, stats in self.seal_stats.items():  # as the real engines write theirs (netns.py)
            (self.out_dir / "raw" / f"seal-{host}.json").write_text(json.dumps(stats, indent=2) + "\n")
        return finish(sc, self.out_dir, report, series, events, auditor, self.seal_stats, self._say)

    async def _event(
        self, ev: EventSpec, t_s: float, devices: dict[str, Device], plane: ControlPlane
    ) -> dict[str, object]:
        """Carry out a scenario event at simulated time `t_s`; returns its record for the report."""
        if ev.action == "set-cap":
            async with LimiterClient(plane.address) as client:
                await set_cap(client, self.scenario, ev, wait=False)
            await self._quiet(plane)  # the simulation waits: no simulated time
            self._say(f"t={t_s:.1f} s: pod {ev.pod} cap set to {ev.egress:g}/{ev.ingress:g} bit/s")
            return event_record(ev, t_s)
        assert ev.dpu is not None
        if ev.action == "restart-dpu":
            await self._kill(ev.dpu, devices[ev.dpu])
            self._say(f"t={t_s:.1f} s: {ev.dpu} down for {ev.down_s:g} s, back with no pipeline")
            return event_record(ev, t_s)
        assert ev.how is not None
        compromise(LocalFirmware(devices[ev.dpu]), ev.how, ev.forge, list(host_macs(self.scenario).values()))
        self._say(f"t={t_s:.1f} s: {ev.dpu} compromised ({ev.how}{', forging' if ev.forge else ''})")
        return event_record(ev, t_s)

    async def _kill(self, name: str, device: Device) -> None:
        """The DPU dies: its P4Runtime server goes away and it forgets its pipeline and state."""
        server, _ = self._servers[name]
        await server.stop(grace=0)
        with device.lock:
            device.pipeline = device.saved = device.data_plane = None
            device.listeners.clear()  # the dead server's P4Runtime service; the revived one registers anew

    async def _revive(self, name: str, device: Device, plane: ControlPlane, timeout_s: float = 60.0) -> None:
        """The DPU is back, empty, on the same address; the simulation waits for the control plane.

        Reprogramming takes no simulated time (the simulation is paused meanwhile): what the run
        shows is the outage and that the DPU comes back capped, not how long a control plane takes.
        """
        _, port = self._servers[name]
        server = grpc.aio.server()
        add_to_server(server, device)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._servers[name] = (server, port)
        deadline = time.monotonic() + timeout_s
        # Reprogrammed, as the API says; its lease comes later, on the simulation's clock: the control
        # plane holds a DPU that lost its state without one for a while (docs/leases.md).
        async with LimiterClient(plane.address) as client:
            while True:
                status = await client.status()
                row = next(d for d in status.dpus if d.name == name)
                if device.pipeline is not None and row.connected and row.generation_applied >= status.generation:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: not reprogrammed within {timeout_s:g} s of its restart")
                await asyncio.sleep(0.05)
        await self._quiet(plane)

    async def _simulate(
        self, clock: VirtualClock, devices: dict[str, Device], plane: ControlPlane
    ) -> tuple[Report, PlotSeries, Auditor | None, list[dict[str, object]]]:
        sc = self.scenario
        engine = Engine(clock)
        net = SimNetwork(sc.topology, {name: d.process for name, d in devices.items()}, engine)
        t = START_S
        phases: list[Phase] = []
        sending: list[_Sending] = []
        hosts = sc.topology.hosts_by_pod()
        for ph in sc.phases:
            phase = Phase(ph.name, t, t + ph.duration_s)
            phases.append(phase)
            for f in ph.flows:
                seg = [(int(t * NS), int((t + ph.duration_s) * NS), f.rate or 0.0)]
                payload = self.segment_bytes or (f.size if f.protocol == "udp" else MSS)
                sending.append(
                    _Sending(phase, f.name, f.src, f.dst, seg, payload, f.encap, f.spoof_src, f.uplink, f.protocol)
                )
            for w in ph.workloads:
                first = len(sending)
                for stream in expand(w, hosts, ph.duration_s):
                    seg = [
                        (int((t + s.start_s) * NS), int((t + s.start_s + s.duration_s) * NS), s.rate_bps)
                        for s in stream.segments
                    ]
                    payload = self.segment_bytes or WORKLOAD_PAYLOAD
                    sending.append(_Sending(phase, stream.label, stream.src, stream.dst, seg, payload))
                self._workloads.append((ph.name, w, sending[first:]))
            t += ph.duration_s
        for port, s in enumerate(sending, BASE_PORT):
            s.port = port
            if s.uplink is not None:
                net.pinned[net.mac_of[s.src][:4] + port.to_bytes(2, "big")] = s.uplink - 1
            if s.protocol == "tcp":
                ((start_ns, end_ns, _),) = s.segments
                s.tcp = tcp_flow(net, s.src, s.dst, port, start_ns, end_ns, s.payload)
                continue
            s.source = udp_source(net, s.src, s.dst, port, s.segments, s.payload, s.encap, s.spoof_src)
            s.source.start()
        end_ns = int((t + LINGER_S) * NS)
        probes = self._probes(net, end_ns) if sc.audit is not None and "probe" in sc.audit.checks else []
        cpu0, wall0 = time.process_time(), time.monotonic()
        auditor = None
        if sc.audit is not None:
            view = ApiView(plane.address)
            # Frames (or segments) between a DPU and the router at a tick: a few of the largest.
            largest = max(MAX_FRAME_BYTES, (self.segment_bytes or 0) + 42)
            auditor = Auditor(
                scope(sc), net.router_counts, view, slack_bytes=4 * largest, checks=sc.audit.checks, probes=probes
            )
            auditor.open_evidence(self.out_dir / "evidence")
        plan = _stops(sc, end_ns, sc.audit.interval_s if sc.audit else None, sc.topology.routing.period_s)
        events: list[dict[str, object]] = []
        assignments: list[dict[str, object]] = [{"t_s": 0.0, "routers": dict(net.router_of)}]
        for t_ns, todo in self._pauses(plan):
            # The targets' gRPC servers stay responsive on this loop while the simulation runs in a thread.
            await asyncio.to_thread(engine.run, t_ns)
            # The control plane, the audit and compromised firmware act in no simulated time: the control
            # plane's timers due now fire, and the simulation waits until it has done what they started.
            if self._clock.advance(t_ns / NS):
                await self._quiet(plane)
            if "reroute" in todo:
                new = sc.topology.assignment(len(assignments))
                async with LimiterClient(plane.address) as client:
                    await reroute(client, sc, net.router_of, new)
                await self._quiet(plane)
                net.reroute(new)
                assignments.append({"t_s": t_ns / NS, "routers": new})
            if "audit" in todo and auditor is not None:
                self._count_probes(t_ns / NS)
                await auditor.tick(t_ns / NS)
            for ev in todo.get("revive", []):
                assert isinstance(ev, EventSpec) and ev.dpu is not None
                await self._revive(ev.dpu, devices[ev.dpu], plane)
                self._say(f"t={t_ns / NS:.1f} s: {ev.dpu} back, reprogrammed by the control plane")
            for ev in todo.get("events", []):
                assert isinstance(ev, EventSpec)
                events.append(await self._event(ev, t_ns / NS, devices, plane))
        self.seal_stats = dict(net.seal_stats())
        self.stats = {
            "virtual_s": end_ns / NS,
            "cpu_s": time.process_time() - cpu0,
            "wall_s": time.monotonic() - wall0,
            "events": engine.events,
        }
        self._say(
            f"simulated {end_ns / NS:.1f} s in {self.stats['wall_s']:.1f} s "
            f"({engine.events:,} events, {self.stats['cpu_s']:.1f} CPU-s)"
        )
        flows = []
        for s in sending:
            rx = net.receivers[s.dst]
            dur = s.phase.end - s.phase.start
            received = rx.packets_by_port.get(s.port, 0)
            s.delivered_bytes = rx.bytes_by_port.get(s.port, 0)  # wire bytes: retransmissions included
            goodput, retransmitted = None, None
            if s.tcp is not None:
                sender, receiver = s.tcp
                sent, sent_bytes = sender.sent_segments, sender.sent_wire_bytes
                goodput, retransmitted = receiver.goodput_bytes * 8 / dur, sender.retransmissions
            else:
                assert s.source is not None
                sent, sent_bytes = s.source.sent_packets, s.source.sent_wire_bytes
            flows.append(
                Flow(
                    name=s.name,
                    protocol=s.protocol,
                    src_pod=sc.topology.pod_of_host(s.src).name,
                    dst_pod=sc.topology.pod_of_host(s.dst).name,
                    offered_bps=sent_bytes * 8 / dur,
                    delivered_bps=s.delivered_bytes * 8 / dur,
                    loss_ratio=max(0.0, 1 - received / sent) if sent else 0.0,
                    shape=shape(s.encap, s.spoof_src),
                    goodput_bps=goodput,
                    retransmissions=retransmitted,
                )
            )
        duration = sum(ph.duration_s for ph in sc.phases)
        report, series = evaluate(
            sc, net.captures(), net.boundary(), phases, flows, 0.0, duration, "embedded", "simulated"
        )
        report.time = "virtual"
        if len(sc.topology.routers) > 1:
            routing = sc.topology.routing
            report.routing = {"assign": routing.assign, "period_s": routing.period_s, "assignments": assignments}
        report.workloads = [workload_result(phase, w, streams) for phase, w, streams in self._workloads]
        return report, series, auditor, events

    def _pauses(self, plan: list[tuple[int, dict[str, list[object]]]]) -> Iterator[tuple[int, dict[str, list[object]]]]:
        """The scenario's stops, and between them each instant a timer of the control plane is due at
        (with nothing of the scenario's to do), in time order up to the last stop."""
        for t_ns, todo in plan:
            while (due := self._clock.next_due()) is not None and (due_ns := math.ceil(due * NS)) < t_ns:
                yield due_ns, {}
            yield t_ns, todo

    async def _quiet(self, plane: ControlPlane) -> None:
        """Wait until the control plane has done what it started (QUIET_TIMEOUT_S of wall time at most)."""
        if not await plane.quiet(QUIET_TIMEOUT_S):
            self._say(f"t={self._clock.now:.1f} s: the control plane is still busy after {QUIET_TIMEOUT_S:g} s")

    def _probes(self, net: SimNetwork, end_ns: int) -> list[Probe]:
        """Start each capped pod's probe: a burst at the start of every audit interval (audit.py)."""
        sc = self.scenario
        assert sc.audit is not None
        interval, probe_s = sc.audit.interval_s, sc.audit.probe_s
        payload = self.segment_bytes or WORKLOAD_PAYLOAD
        largest = max(MAX_FRAME_BYTES, payload + 42)
        out = []
        for i, cap in enumerate(sc.caps):
            src_pod = sc.topology.pod(cap.pod)
            # To the pod with the most room to receive, so that its ingress cap does not hide the probe.
            others = [p for p in sc.topology.pods if p.name != cap.pod]
            dst_pod = max(others, key=lambda p: sc.peak_rates(p.name)[1] if sc.cap_of(p.name) else float("inf"))
            rate = sc.peak_rates(cap.pod)[0]
            bursts = [
                (int(k * interval * NS) + 1_000, int((k * interval + probe_s) * NS), sc.audit.probe_factor * rate)
                for k in range(int(end_ns / (interval * NS)))
            ]
            port = PROBE_PORT + i
            source = udp_source(net, src_pod.hosts[0], dst_pod.hosts[0], port, bursts, payload)
            source.start()
            probe = Probe(
                cap.pod,
                int(sc.audit.probe_factor * rate * probe_s / 8),
                probe_allowance_bytes(cap, rate, probe_s) + largest,
            )
            out.append(probe)
            self._probe_feeds.append((probe, net.receivers[dst_pod.hosts[0]].bytes_by_port, port))
        return out

    def _count_probes(self, t_s: float) -> None:
        """Before the audit's tick at `t_s`: what arrived since the last is the burst that began one interval
        ago (simulated time has no stragglers: each burst ends well before the tick)."""
        assert self.scenario.audit is not None
        burst = round(t_s / self.scenario.audit.interval_s) - 1
        for probe, received, port in self._probe_feeds:
            probe.bursts[burst] = received.get(port, 0) - sum(probe.bursts.values())


def _stops(
    sc: Scenario, end_ns: int, audit_s: float | None, reroute_s: float | None
) -> list[tuple[int, dict[str, list[object]]]]:
    """Simulated instants where the scenario pauses the simulation, each with what happens then, in time
    order (the control plane's own timers add theirs: VirtualLabRun._pauses)."""
    stops: dict[int, dict[str, list[object]]] = {end_ns: {}}
    every_s = (("audit", audit_s), ("reroute", reroute_s))
    for what, every in every_s:
        if every is not None:
            for k in range(1, int(end_ns / (every * NS)) + 1):
                stops.setdefault(int(k * every * NS), {})[what] = []
    start = START_S
    for ph in sc.phases:
        for ev in ph.events:
            stops.setdefault(int((start + ev.at_s) * NS), {}).setdefault("events", []).append(ev)
            if ev.action == "restart-dpu":
                stops.setdefault(int((start + ev.at_s + ev.down_s) * NS), {}).setdefault("revive", []).append(ev)
        start += ph.duration_s
    return sorted((t, todo) for t, todo in stops.items() if t <= end_ns)
