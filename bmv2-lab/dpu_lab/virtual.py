"""`dpu-limiter lab run --time virtual`: the same scenario, caps applied through the same API, on
embedded targets that run on simulated time (see sim.py for what is and is not modelled).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from rich.console import Console

from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from dpu_limiter.units import CPU_PORT, MAX_FRAME_BYTES
from dpu_softswitch.clock import VirtualClock
from dpu_softswitch.firmware import Firmware, LocalFirmware
from dpu_softswitch.server import Device, add_to_server
from dpu_verifier.api_view import ApiView
from dpu_verifier.checks import Auditor, Probe

from .audit import PROBE_PORT, read_back_s, scope
from .config import ConfigError, PhaseSpec, Scenario, probe_allowance_bytes
from .driver import Driver, Measured
from .evaluate import LabDpu, PlotSeries
from .frames import Encap, shape
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
    """One scenario in virtual time; `run()` returns the report (the driver's backend: driver.py)."""

    scenario: Scenario
    out_dir: Path
    segment_bytes: int | None = None
    console: Console = field(default_factory=lambda: Console(stderr=True))
    stats: dict[str, float] = field(default_factory=dict)
    series: PlotSeries = field(default_factory=dict)  # receiver-side throughput, as plotted (after run())
    seal_stats: dict[str, dict[str, object]] = field(default_factory=dict)  # node DPUs' engines (after run())
    linger_s: float = LINGER_S
    _workloads: list[tuple[str, WorkloadSpec, list[_Sending]]] = field(default_factory=list)
    _sending: list[_Sending] = field(default_factory=list)
    # Each probe, and where its receiver counts bytes by port (_count_probes).
    _probe_feeds: list[tuple[Probe, dict[int, int], int]] = field(default_factory=list)
    _devices: dict[str, Device] = field(default_factory=dict)
    _servers: dict[str, tuple[grpc.aio.Server, int]] = field(default_factory=dict)
    _plane: ControlPlane | None = None
    _auditor: Auditor | None = None
    _stops: list[tuple[int, set[str]]] = field(default_factory=list)  # the audit's and rerouting's, due first last
    _assignments: list[dict[str, object]] = field(default_factory=list)  # routers' assignments over time
    _t: float = START_S  # where the next phase starts
    _port: int = BASE_PORT  # the next sender's
    _started: tuple[float, float] = (0.0, 0.0)  # CPU and wall time when the simulation started

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
        driver = Driver(self.scenario, self, self.out_dir)
        report = asyncio.run(driver.run())
        self.series = driver.series
        return report

    # ------------------------------------------------------------------ the driver's backend (driver.py)

    def say(self, text: str) -> None:
        """Tell the user, on the console."""
        self.console.print(f"[bold magenta]lab (virtual time)[/] {text}")

    async def start(self) -> tuple[str, list[LabDpu]]:
        """An embedded target per DPU on simulated time, and the control plane, in this process."""
        sc = self.scenario
        self._vclock = VirtualClock()
        db = self.out_dir / "raw" / "control-plane.db"
        db.unlink(missing_ok=True)
        # The control plane runs its own loops (leases, rebalancing, holds, read-back) on the simulation's
        # clock: it acts at the simulated instants it asks for, while the simulation waits, so a run does
        # not depend on how fast this machine is. It reads DPUs back only for an audit.
        self._clock = SimClock()
        every = read_back_s(sc) or NEVER_S
        self._plane = ControlPlane(
            db,
            "127.0.0.1:0",
            Settings(rebalance_interval_s=REBALANCE_S, resync_s=every, pipeline_check_s=every, clock=self._clock),
        )
        dpus = []
        for name, role, pod_name in limiters_of(sc):
            device = Device(len(self._devices) + 1, self._vclock, cpu_port=CPU_PORT)
            server = grpc.aio.server()
            add_to_server(server, device)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            self._devices[name], self._servers[name] = device, (server, port)
            dpus.append(LabDpu(name, role, pod_name, f"127.0.0.1:{port}", len(self._devices)))
        await self._plane.start()
        return self._plane.address, dpus

    async def started(self) -> None:
        """The simulated network, the probes and the audit; the audit's and rerouting's pauses."""
        sc = self.scenario
        self.say(f"scenario [bold]{sc.name}[/]: {len(self._devices)} embedded targets programmed by the control plane")
        self._engine = Engine(self._vclock)
        self._net = net = SimNetwork(sc.topology, {n: d.process for n, d in self._devices.items()}, self._engine)
        end_ns = int((START_S + sum(ph.duration_s for ph in sc.phases) + LINGER_S) * NS)
        probes = self._probes(net, end_ns) if sc.audit is not None and "probe" in sc.audit.checks else []
        if sc.audit is not None:
            assert self._plane is not None
            # Frames (or segments) between a DPU and the router at a tick: a few of the largest.
            largest = max(MAX_FRAME_BYTES, (self.segment_bytes or 0) + 42)
            self._auditor = Auditor(
                scope(sc),
                net.router_counts,
                ApiView(self._plane.address),
                slack_bytes=4 * largest,
                checks=sc.audit.checks,
                probes=probes,
            )
            self._auditor.open_evidence(self.out_dir / "evidence", interval_s=sc.audit.interval_s)
        self._stops = _stops(end_ns, sc.audit.interval_s if sc.audit else None, sc.topology.routing.period_s)
        self._assignments = [{"t_s": 0.0, "routers": dict(net.router_of)}]
        self._started = (time.process_time(), time.monotonic())

    async def begin_phase(self, phase: PhaseSpec) -> Phase:
        """Its flows' and workloads' senders, each on a port of its own, sending from the phase's start."""
        net, t = self._net, self._t
        ph = Phase(phase.name, t, t + phase.duration_s)
        self._t += phase.duration_s
        added: list[_Sending] = []
        for f in phase.flows:
            seg = [(int(t * NS), int((t + phase.duration_s) * NS), f.rate or 0.0)]
            payload = self.segment_bytes or (f.size if f.protocol == "udp" else MSS)
            added.append(_Sending(ph, f.name, f.src, f.dst, seg, payload, f.encap, f.spoof_src, f.uplink, f.protocol))
        hosts = self.scenario.topology.hosts_by_pod()
        for w in phase.workloads:
            streams = []
            for stream in expand(w, hosts, phase.duration_s):
                seg = [
                    (int((t + s.start_s) * NS), int((t + s.start_s + s.duration_s) * NS), s.rate_bps)
                    for s in stream.segments
                ]
                payload = self.segment_bytes or WORKLOAD_PAYLOAD
                streams.append(_Sending(ph, stream.label, stream.src, stream.dst, seg, payload))
            self._workloads.append((phase.name, w, streams))
            added += streams
        for s in added:
            s.port = port = self._port
            self._port += 1
            if s.uplink is not None:
                net.pinned[net.mac_of[s.src][:4] + port.to_bytes(2, "big")] = s.uplink - 1
            if s.protocol == "tcp":
                ((start_ns, end_ns, _),) = s.segments
                s.tcp = tcp_flow(net, s.src, s.dst, port, start_ns, end_ns, s.payload)
                continue
            s.source = udp_source(net, s.src, s.dst, port, s.segments, s.payload, s.encap, s.spoof_src)
            s.source.start()
        self._sending += added
        return ph

    async def wait_until(self, t_s: float) -> float:
        """Run the simulation to `t_s`, pausing where the audit ticks, routers are reassigned, or a timer of
        the control plane is due: at each pause the control plane, the audit and compromised firmware act
        in no simulated time (the simulation waits until the control plane has done what they started)."""
        t_ns = int(t_s * NS)
        while True:
            stop, todo = t_ns, set[str]()
            if self._stops and self._stops[-1][0] <= t_ns:
                stop, todo = self._stops[-1]
            due = self._clock.next_due()
            if due is not None and (due_ns := math.ceil(due * NS)) < stop:
                stop, todo = due_ns, set()
            elif todo:
                self._stops.pop()
            await self._pause(stop, todo)
            if stop == t_ns and not (self._stops and self._stops[-1][0] == t_ns):
                return t_ns / NS

    async def _pause(self, t_ns: int, todo: set[str]) -> None:
        """Run the simulation to `t_ns`, then what is due there."""
        # The targets' gRPC servers stay responsive on this loop while the simulation runs in a thread.
        await asyncio.to_thread(self._engine.run, t_ns)
        if self._clock.advance(t_ns / NS):
            await self._quiet()
        if "reroute" in todo:
            assert self._plane is not None
            new = self.scenario.topology.assignment(len(self._assignments))
            async with LimiterClient(self._plane.address) as client:
                await reroute(client, self.scenario, self._net.router_of, new)
            await self._quiet()
            self._net.reroute(new)
            self._assignments.append({"t_s": t_ns / NS, "routers": new})
        if "audit" in todo and self._auditor is not None:
            self._count_probes(t_ns / NS)
            await self._auditor.tick(t_ns / NS)

    async def end_phase(self) -> None:
        """Nothing: every sender stops at its phase's end by itself."""

    async def settle(self) -> None:
        """The simulation waits (no simulated time) until the control plane has done the change."""
        await self._quiet()

    def firmware(self, dpu: str) -> Firmware:
        """The in-process target's firmware."""
        return LocalFirmware(self._devices[dpu])

    async def kill(self, dpu: str) -> None:
        """The DPU dies: its P4Runtime server goes away and it forgets its pipeline and state."""
        server, _ = self._servers[dpu]
        await server.stop(grace=0)
        device = self._devices[dpu]
        with device.lock:
            device.pipeline = device.saved = device.data_plane = None
            device.listeners.clear()  # the dead server's P4Runtime service; the revived one registers anew

    async def revive(self, dpu: str, timeout_s: float = 60.0) -> None:
        """The DPU is back, empty, on the same address; the simulation waits for the control plane.

        Reprogramming takes no simulated time (the simulation is paused meanwhile): what the run
        shows is the outage and that the DPU comes back capped, not how long a control plane takes.
        """
        assert self._plane is not None
        device = self._devices[dpu]
        _, port = self._servers[dpu]
        server = grpc.aio.server()
        add_to_server(server, device)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._servers[dpu] = (server, port)
        deadline = time.monotonic() + timeout_s
        # Reprogrammed, as the API says; its lease comes later, on the simulation's clock: the control
        # plane holds a DPU that lost its state without one for a while (docs/leases.md).
        async with LimiterClient(self._plane.address) as client:
            while True:
                status = await client.status()
                row = next(d for d in status.dpus if d.name == dpu)
                if device.pipeline is not None and row.connected and row.generation_applied >= status.generation:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{dpu}: not reprogrammed within {timeout_s:g} s of its restart")
                await asyncio.sleep(0.05)
        await self._quiet()

    async def measured(self) -> Measured:
        """What the simulated receivers, links and engines counted."""
        sc, net = self.scenario, self._net
        cpu0, wall0 = self._started
        self.seal_stats = dict(net.seal_stats())
        self.stats = {
            "virtual_s": self._engine.now_ns / NS,
            "cpu_s": time.process_time() - cpu0,
            "wall_s": time.monotonic() - wall0,
            "events": self._engine.events,
        }
        self.say(
            f"simulated {self.stats['virtual_s']:.1f} s in {self.stats['wall_s']:.1f} s "
            f"({self._engine.events:,} events, {self.stats['cpu_s']:.1f} CPU-s)"
        )
        for host, stats in self.seal_stats.items():  # as the real engines write theirs (netns.py)
            (self.out_dir / "raw" / f"seal-{host}.json").write_text(json.dumps(stats, indent=2) + "\n")
        flows = []
        for s in self._sending:
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
        return Measured(
            net.captures(), net.boundary(), flows, self.seal_stats, self._auditor, 0.0, "embedded", "simulated"
        )

    async def annotate(self, report: Report) -> None:
        """Virtual time, the routers' assignments over time, and what the workloads got."""
        report.time = "virtual"
        if len(self.scenario.topology.routers) > 1:
            routing = self.scenario.topology.routing
            report.routing = {"assign": routing.assign, "period_s": routing.period_s, "assignments": self._assignments}
        report.workloads = [workload_result(phase, w, streams) for phase, w, streams in self._workloads]

    async def close(self) -> None:
        """Stop the control plane and the targets' servers."""
        if self._plane is not None:
            await self._plane.stop()
            self._plane = None
        for server, _ in self._servers.values():
            await server.stop(grace=0)

    async def _quiet(self) -> None:
        """Wait until the control plane has done what it started (QUIET_TIMEOUT_S of wall time at most)."""
        assert self._plane is not None
        if not await self._plane.quiet(QUIET_TIMEOUT_S):
            self.say(f"t={self._clock.now:.1f} s: the control plane is still busy after {QUIET_TIMEOUT_S:g} s")

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


def _stops(end_ns: int, audit_s: float | None, reroute_s: float | None) -> list[tuple[int, set[str]]]:
    """Simulated instants where the audit ticks or routers are reassigned, each with which, the latest
    first (the scenario's events are the driver's; the control plane's timers add their own pauses)."""
    stops: dict[int, set[str]] = {}
    for what, every in (("audit", audit_s), ("reroute", reroute_s)):
        if every is not None:
            for k in range(1, int(end_ns / (every * NS)) + 1):
                stops.setdefault(int(k * every * NS), set()).add(what)
    return sorted(((t, todo) for t, todo in stops.items() if t <= end_ns), reverse=True)
