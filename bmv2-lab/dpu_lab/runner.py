"""`dpu-limiter lab run`: build the network, start targets and the control plane, apply caps through
the control plane's API (as a user would), drive traffic, count every frame that crosses a pod boundary
(and what the receivers get), report, clean up.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from dpu_limiter.client import LimiterClient
from dpu_limiter.units import ARP_BURST_BYTES, MAX_FRAME_BYTES
from dpu_softswitch.firmware import Firmware

from .audit import read_back_s
from .bmv2_firmware import NO_FORGE, bmv2_python_dir
from .boundary import BoundaryProcess, taps_of, write_taps
from .calibrate import Calibration, calibrate, scaled
from .capture import load_capture
from .config import ConfigError, PhaseSpec, Scenario
from .driver import Driver, Measured
from .evaluate import LabDpu
from .frames import largest_payload, shape
from .live_audit import LiveAudit
from .netns import LabNetwork, check_prerequisites, mac_text
from .processes import stop_processes
from .replicas_lab import Failover, event_records, markdown, problems
from .replicas_lab import check as check_replicas
from .report import Flow, Phase, Report
from .site import LabSite
from .site import missing as site_missing
from .targets import BUFFER_BYTES, TargetKind, TargetProcess, bmv2_has_thrift, bmv2_path, free_port, start_target

BASE_PORT = 5201
START_DELAY_S = 1.5  # senders start together this long after their commands are issued
LINGER_S = 1.0


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    out: Path


@dataclass
class LabRun:
    """One run of a scenario; `run()` returns the report, and always cleans up."""

    scenario: Scenario
    out_dir: Path
    target: TargetKind = "embedded"
    traffic: Literal["iperf3", "builtin"] = "builtin"
    console: Console = field(default_factory=lambda: Console(stderr=True))
    net: LabNetwork | None = None
    targets: list[TargetProcess] = field(default_factory=list)
    procs: list[_Proc] = field(default_factory=list)
    control: subprocess.Popen[bytes] | None = None
    api: str = ""
    t_start: float = 0.0  # when the captures started: the report's time base
    calibrate: bool = False  # first measure what the target carries here (calibrate.py); the CLI's default
    rescale: bool = False  # and scale a scenario it cannot carry down to what it can, rather than refuse
    calibration: Calibration | None = None
    live: LiveAudit | None = None  # the verifier's audit, when the scenario has one
    site: LabSite | None = None  # and the verifier as a site runs it (snmpd, `dpu-limiter verify`)
    linger_s: float = LINGER_S
    _port: int = BASE_PORT  # the next flow's port
    _crossed: BoundaryProcess | None = None
    _captures: list[tuple[str, _Proc]] = field(default_factory=list)
    _phase: tuple[PhaseSpec, list[_Proc], list[_Proc]] | None = None  # the running phase, its processes
    _phase_start: float = 0.0
    _progress: Progress | None = None
    _flows: list[Flow] = field(default_factory=list)
    # The control plane as replicas on PostgreSQL (scenario control_plane.replicas > 1; replicas_lab.py): the
    # database's URL, the command that stops and starts it (restart-db), and the replicas with their events.
    control_db: str | None = None
    control_db_ctl: str | None = None
    failover: Failover | None = None
    _failover_summary: dict[str, Any] | None = None
    _dpus: list[LabDpu] = field(default_factory=list)
    _phase_index: int = 0

    def run(self) -> Report:
        """Run the scenario end to end."""
        sc = self.scenario
        if self.target == "bmv2":
            refuse_what_bmv2_cannot(sc)
        virtual_only = [
            what
            for what, used in (
                ("workloads", any(ph.workloads for ph in sc.phases)),
                ("parallel uplinks", any(p.uplinks > 1 for p in sc.topology.pods)),
                ("more than one router", len(sc.topology.routers) > 1),
                ("router placement", sc.topology.pods[0].placement == "router"),
            )
            if used
        ]
        if virtual_only:
            raise ConfigError(f"{', '.join(virtual_only)}: modelled in virtual time only for now; use --time virtual")
        check_frame_sizes(sc)
        check_relayed_flows(sc, self.traffic)
        check_replicas(sc, self.control_db, self.control_db_ctl)
        check_prerequisites()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "raw").mkdir(exist_ok=True)
        if self.calibrate:
            quiet = Console(stderr=True, quiet=True)

            def measure(cal: Scenario, out: Path) -> Report:
                return LabRun(cal, out, self.target, self.traffic, console=quiet).run()

            self.calibration = calibrate(
                sc, self.target, measure, self.out_dir / "calibration", self.console, self.rescale
            )
            if self.calibration.verdict == "rescaled":
                room = BUFFER_BYTES[self.target] + ARP_BURST_BYTES + MAX_FRAME_BYTES
                self.scenario = scaled(sc, self.calibration.scale, room)
        with _sigterm_as_interrupt():
            try:
                # The replicas' events are this backend's to carry out (replicas_lab.py), not the driver's.
                report = asyncio.run(Driver(self.scenario.without_replica_events(), self, self.out_dir).run())
            finally:
                self.cleanup()
        if self._failover_summary is not None:
            self._write_failover(self._failover_summary)
        return report

    def _write_failover(self, summary: dict[str, Any]) -> None:
        """Add the failover figures to report.json (`failover`) and summary.md, which the driver wrote."""
        path = self.out_dir / "report.json"
        doc = json.loads(path.read_text())
        doc["failover"] = summary
        path.write_text(json.dumps(doc, indent=2) + "\n")
        with (self.out_dir / "summary.md").open("a") as out:
            out.write("\n" + markdown(summary))

    # ------------------------------------------------------------------ the driver's backend (driver.py)

    def say(self, text: str) -> None:
        """Tell the user, on the console."""
        self.console.print(f"[bold cyan]lab[/] {text}")

    async def start(self) -> tuple[str, list[LabDpu]]:
        """Namespaces, a target process per DPU and the control plane as a process of its own."""
        sc = self.scenario
        self.say(f"scenario [bold]{sc.name}[/] on the {self.target} target, {self.traffic} traffic")
        logs = self.out_dir / "raw"
        # The node DPUs' crypto engines write their logs and stats (raw/seal-HOST.json) beside the rest.
        self.net = LabNetwork(sc.topology, seal_dir=logs)
        self.net.build()
        engines = f", {len(self.net.engines)} crypto engines" if self.net.engines else ""
        self.say(f"network built: {len(self.net.namespaces)} namespaces (prefix {self.net.prefix}){engines}")
        for i, lim in enumerate(self.net.limiters):
            self.targets.append(start_target(lim.name, self.target, i + 1, lim.interfaces(), logs))
        self.say(f"{len(self.targets)} {self.target} targets up")
        if sc.control_plane.replicas > 1:
            assert self.control_db is not None  # check_replicas
            self.failover = Failover(sc, self.control_db, self.control_db_ctl, logs, self._serve_args(), self.say)
            self.api = await self.failover.start()
        else:
            self.api = self._start_control_plane()
            await self._answering()
        self._dpus = [
            LabDpu(lim.name, lim.role, lim.pod, tp.address, tp.device_id, BUFFER_BYTES[tp.kind])
            for tp, lim in zip(self.targets, self.net.limiters, strict=True)
        ]
        return self.api, self._dpus

    async def started(self) -> None:
        """The boundary capture, a capture on every host interface, the verifier's live audit, and with replicas
        the failover watch (once every replica agrees who holds each DPU)."""
        sc = self.scenario
        self._crossed = self._start_boundary()
        self._captures = self._start_captures()
        self.t_start = time.time()
        if self.failover is not None:
            # configure() waited for the DPUs of the replica it asked; wait for every replica's.
            await self.failover.started(self._dpus, self.t_start)
        if sc.audit is not None:
            assert self.net is not None
            self.live = LiveAudit(
                sc,
                self.api,
                self.net.router_ns,
                self._crossed.router_totals,
                self.t_start,
                self.net.host_ns,
                lambda name, ns, module, args: self._spawn(name, ns, module, args).popen,
                self._longest_s(),
                self.out_dir / "evidence",
            )
            self.live.start()
            if (why := site_missing()) is None:
                self.site = LabSite(sc, self.net, self.api, self.out_dir / "raw", self.t_start)
                self.site.start()
            else:
                self.say(f"[yellow]no verifier process beside the audit: {why}[/]")

    async def begin_phase(self, phase: PhaseSpec) -> Phase:
        """Start a receiver and a sender process per flow; they start sending together START_DELAY_S later."""
        assert self.net is not None
        topo = self.scenario.topology
        start_at = time.time() + START_DELAY_S
        receivers, senders = [], []
        for f in phase.flows:
            src_ns, dst_ns = self.net.host_ns[f.src], self.net.host_ns[f.dst]
            port = self._port
            self._port += 1
            common = ["--port", str(port), "--duration", f"{phase.duration_s}", "--start-at", f"{start_at:.6f}"]
            if f.encap != "none" or f.spoof_src:
                module, recv_args, send_args = "dpu_lab.evasion", ["recv"], self._evasion_args(f, port)
            else:
                module, recv_args = self._traffic_module, [f"{f.protocol}-recv"]
                send_args = [f"{f.protocol}-send", "--dst", topo.address_of(f.dst)]
                if f.protocol == "udp":
                    send_args += ["--rate-bps", f"{f.rate:.0f}", "--size", str(f.size)]
            receivers.append(
                self._spawn(f"{f.name}-recv", dst_ns, module, [*recv_args, *common, "--linger", str(LINGER_S)])
            )
            senders.append(self._spawn(f"{f.name}-send", src_ns, module, [*send_args, *common]))
        self._phase = (phase, senders, receivers)
        self._progress = Progress(
            TextColumn("[bold cyan]lab[/] phase {task.description}"),
            BarColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._progress.start()
        self._progress.add_task(phase.name, total=phase.duration_s)
        start = self._phase_start = start_at - self.t_start
        if self.failover is not None:
            self.failover.schedule(self._phase_index, start)
        self._phase_index += 1
        return Phase(phase.name, start, start + phase.duration_s)

    async def wait_until(self, t_s: float) -> float:
        """Sleep until `t_s` into the run, moving the phase's progress bar."""
        while (now := time.time() - self.t_start) < t_s:
            if self.failover is not None:
                self.failover.tick(now)
            if self._progress is not None and self._phase is not None:
                task = self._progress.tasks[0].id
                self._progress.update(task, completed=max(0.0, now - self._phase_start))
            await asyncio.sleep(min(0.05, t_s - now))
        return time.time() - self.t_start

    async def end_phase(self) -> None:
        """Wait for the phase's senders and receivers, and read what each counted."""
        assert self._phase is not None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        phase, senders, receivers = self._phase
        for p in senders + receivers:
            await asyncio.to_thread(self._wait, p, START_DELAY_S + phase.duration_s + LINGER_S + 15)
        for f, s, r in zip(phase.flows, senders, receivers, strict=True):
            self._flows.append(self._flow_result(f, s, r, phase.duration_s))
        self._phase = None

    async def settle(self) -> None:
        """Nothing: on the wall clock the traffic does not wait for the control plane."""

    def firmware(self, dpu: str) -> Firmware:
        """The target's management path (bmv2's Thrift, or the embedded target's firmware socket)."""
        return self._target(dpu)[1].management()

    async def kill(self, dpu: str) -> None:
        """Kill the target's process (by its handle) and remove what it leaves behind."""
        _, tp = self._target(dpu)
        tp.process.kill()
        tp.process.wait(timeout=10)
        tp.stop()

    async def revive(self, dpu: str) -> None:
        """Start the target again, empty, on the same port and interfaces."""
        i, tp = self._target(dpu)
        assert self.net is not None
        lim = next(lm for lm in self.net.limiters if lm.name == dpu)
        port = int(tp.address.rpartition(":")[2])
        self.targets[i] = start_target(
            tp.name, tp.kind, tp.device_id, lim.interfaces(), self.out_dir / "raw", port=port
        )

    async def measured(self) -> Measured:
        """Stop the captures, the audit and the crypto engines (each writes its counts as it stops)."""
        if self.failover is not None:
            await self.failover.finish_events()
        for _, c in self._captures:
            c.popen.terminate()  # captures run until told to stop; SIGTERM makes them write their counts
        for _, c in self._captures:
            self._wait(c, timeout=15)
        if self.live is not None:
            self.live.stop()
        assert self._crossed is not None
        boundary = self._crossed.finish()
        sealing = self.net.stop_engines() if self.net is not None else {}  # they write their stats on SIGTERM
        if boundary.kernel_drops:
            self.say(
                f"[yellow]the boundary capture lost {boundary.kernel_drops} frames: its counts are low, and the "
                "verdict counts what they can have held as crossed[/]"
            )
        if self.live is not None and self.live.error:
            raise RuntimeError(f"the audit failed: {self.live.error}")
        return Measured(
            [(host, load_capture(p.out)) for host, p in self._captures],
            boundary,
            self._flows,
            sealing,
            self.live.auditor if self.live is not None else None,
            self.t_start,
            self.target,
            self.traffic,
        )

    async def annotate(self, report: Report) -> None:
        """The calibration this run was checked or scaled against; with replicas, the failover figures."""
        report.calibration = self.calibration.as_dict() if self.calibration else None
        if self.failover is not None:
            # One replica counts only the DPUs it holds: each pod's counters from a replica that read them all.
            report.dpu_counters = await self.failover.counters()
            self._failover_summary = await self.failover.summary()
            report.failures += problems(self._failover_summary)
            report.events.extend(event_records(self._failover_summary))  # the driver's list: finish() keeps it
            report.events.sort(key=lambda e: float(e["t_s"]))
        if self.site is not None:
            compromised = [float(e["t_s"]) for e in report.events if e["action"] == "compromise"]
            report.verifier = self.site.finish(min(compromised, default=None))
            found = report.verifier["alerts"]
            self.say(
                f"verifier (dpu-limiter verify over SNMP): {len(found)} alert(s)"
                + "".join(f"\n  {a['t_s']:.1f} s {a['check']} {a['where']}: {a['detail']}" for a in found)
            )

    async def close(self) -> None:
        """Stop everything (cleanup)."""
        if self.failover is not None:
            await self.failover.close()
        self.cleanup()

    # ------------------------------------------------------------------ control plane

    def _serve_args(self) -> list[str]:
        """serve's options beyond its store and address: read-back periods, and the scenario's DPU lease."""
        # With an audit, the control plane reads every DPU back (and hashes its pipeline) often enough for
        # the audit to see a correction by its next tick (audit.read_back_s).
        every = read_back_s(self.scenario)
        resync = ["--resync-s", f"{every:g}", "--pipeline-check-s", f"{every:g}"] if every else []
        lease = self.scenario.control_plane.lease_s
        return resync + (["--lease-s", f"{lease:g}"] if lease is not None else [])

    def _start_control_plane(self) -> str:
        port = free_port()
        addr = f"127.0.0.1:{port}"
        db = self.out_dir / "raw" / "control-plane.db"
        db.unlink(missing_ok=True)
        log = (self.out_dir / "raw" / "control-plane.log").open("wb")
        self.control = subprocess.Popen(
            [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", str(db), "--listen", addr, *self._serve_args()],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        return addr

    async def _answering(self, timeout_s: float = 20.0) -> None:
        """Wait until the control plane answers on its API."""
        async with LimiterClient(self.api) as client:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    await client.status()
                    return
                except Exception:
                    if self.control is not None and self.control.poll() is not None:
                        raise RuntimeError("control plane exited; see raw/control-plane.log") from None
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)

    def _target(self, dpu: str) -> tuple[int, TargetProcess]:
        """The target process standing in for a DPU, and its index."""
        return next((i, tp) for i, tp in enumerate(self.targets) if tp.name == dpu)

    # ------------------------------------------------------------------ traffic

    def _spawn(self, name: str, ns: str, module: str, args: list[str]) -> _Proc:
        out = self.out_dir / "raw" / f"{name}.json"
        env = dict(os.environ)
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", module, *args, "--out", str(out)]
        err = (self.out_dir / "raw" / f"{name}.log").open("wb")
        p = _Proc(
            name, subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env), out
        )
        self.procs.append(p)
        return p

    def _longest_s(self) -> float:
        """How long what runs beside the phases (captures, probes) lasts at most; the run stops it (SIGTERM)
        once the last phase is over, so the bound is generous."""
        return 2 * sum(ph.duration_s + START_DELAY_S + 30 for ph in self.scenario.phases)

    def _start_boundary(self) -> BoundaryProcess:
        """The boundary capture (boundary.py): every frame on every link between pods, for the verdict and
        the live audit's router counts. It runs in the root namespace and opens each link's socket in the
        link's own."""
        assert self.net is not None
        raw = self.out_dir / "raw"
        taps = raw / "boundary-taps.json"
        write_taps(taps, taps_of(self.net))
        out = raw / "boundary.json"
        out.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "dpu_lab.boundary", "--taps", str(taps), "--out", str(out)]
        cmd += ["--duration", f"{self._longest_s():.1f}", "--serve"]
        with (raw / "boundary.log").open("wb") as err:
            popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        self.procs.append(_Proc("boundary", popen, out))  # stopped by handle in cleanup, like the rest
        crossed = BoundaryProcess(popen, out)
        crossed.totals(timeout_s=30)  # answers once its sockets are open: nothing crosses uncounted after this
        return crossed

    def _start_captures(self) -> list[tuple[str, _Proc]]:
        """A capture on every interface of every host (eth0, and scale-up links): all a host receives."""
        assert self.net is not None
        total = self._longest_s()
        topo = self.scenario.topology
        out = []
        for host, ns in self.net.host_ns.items():
            for iface in ["eth0", *(f"nvs{i}" for i in topo.scaleup_peer(host).values())]:
                args = ["--iface", iface, "--duration", f"{total:.1f}", "--linger", str(LINGER_S)]
                out.append((host, self._spawn(f"capture-{host}-{iface}", ns, "dpu_lab.capture", args)))
        return out

    def _wait(self, p: _Proc, timeout: float) -> None:
        try:
            p.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_processes(p.popen, timeout=5)
        if p.popen.returncode != 0:
            raise RuntimeError(f"{p.name} failed (exit {p.popen.returncode}); see {p.out.with_suffix('.log')}")

    @property
    def _traffic_module(self) -> str:
        # Both ends of a flow use the same generator: iperf3 talks only to iperf3.
        return "dpu_lab.iperf" if self.traffic == "iperf3" else "dpu_lab.traffic"

    def _evasion_args(self, f, port: int) -> list[str]:  # type: ignore[no-untyped-def]
        """The raw-frame sender's arguments for an evasion flow (evasion.py)."""
        assert self.net is not None
        topo = self.scenario.topology
        args = ["send", "--encap", f.encap, "--src", topo.address_of(f.src), "--dst", topo.address_of(f.dst)]
        args += ["--src-mac", mac_text(self.net.mac_of(f.src, port)), "--dst-mac", mac_text(self.net.mac_of(f.dst))]
        args += ["--rate-bps", f"{f.rate:.0f}", "--size", str(f.size)]
        return args + (["--spoof-src", f.spoof_src] if f.spoof_src else [])

    def _flow_result(self, f, sender: _Proc, receiver: _Proc, duration: float) -> Flow:  # type: ignore[no-untyped-def]
        import json

        topo = self.scenario.topology
        s = json.loads(sender.out.read_text())
        r = json.loads(receiver.out.read_text())
        if f.protocol == "udp":
            offered = s["sent_wire_bytes"] * 8 / duration
            delivered = r["received_wire_bytes"] * 8 / duration
            sent = s["sent_packets"]
            loss = 1 - r["received_packets"] / sent if sent else 0.0
        else:
            # TCP: goodput (payload bytes), the receiver cannot see headers; offered = what was sent.
            offered = s["sent_bytes"] * 8 / duration
            delivered = r["received_bytes"] * 8 / duration
            loss = 0.0
        return Flow(
            name=f.name,
            protocol=f.protocol,
            src_pod=topo.pod_of_host(f.src).name,
            dst_pod=topo.pod_of_host(f.dst).name,
            offered_bps=offered,
            delivered_bps=delivered,
            loss_ratio=max(0.0, loss),
            shape=shape(f.encap, f.spoof_src),
        )

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        """Stop every process we started (by handle) and remove the network."""
        if self.site is not None:
            self.site.stop()
        if self.live is not None:
            self.live.stop()
        stop_processes(*(p.popen for p in self.procs), timeout=5)
        self.procs.clear()
        if self.control is not None:
            stop_processes(self.control, timeout=5)
            self.control = None
        if self.failover is not None:
            self.failover.cleanup()  # its replicas, forwarders and the run's schema in the database
            self.failover = None
        for t in self.targets:
            t.stop()
        self.targets.clear()
        if self.net is not None:
            self.net.teardown()
            self.net = None


def refuse_what_bmv2_cannot(sc: Scenario) -> None:
    """Refuse, before anything starts, compromise events that bmv2 cannot carry out, naming each."""
    for pi, ph in enumerate(sc.phases):
        for ei, ev in enumerate(ph.events):
            if ev.action != "compromise":
                continue
            where = f"phases[{pi}].events[{ei}] (compromise of {ev.dpu}, {ev.how})"
            if ev.forge:
                raise ConfigError(f"{where}: forge: not on bmv2: {NO_FORGE}; use --target embedded")
            if not bmv2_has_thrift(bmv2_path()):
                raise ConfigError(
                    f"{where}: compromised firmware on bmv2 writes through its Thrift runtime API, and the "
                    f"{bmv2_path()} here was built without it (no --thrift-port); use --target embedded"
                )
            try:
                bmv2_python_dir()
            except RuntimeError as exc:
                raise ConfigError(f"{where}: {exc}; use --target embedded") from None


def check_frame_sizes(sc: Scenario) -> None:
    """Refuse an evasion flow whose frames would not fit the veths' 1500-byte MTU."""
    for pi, ph in enumerate(sc.phases):
        for fi, f in enumerate(ph.flows):
            if f.size > (most := largest_payload(f.encap)):
                raise ConfigError(
                    f"phases[{pi}].flows[{fi}].size: {f.size} bytes shaped as {f.encap} make frames longer than a "
                    f"1500-byte MTU carries in real time; at most {most}"
                )


def check_relayed_flows(sc: Scenario, traffic: str) -> None:
    """Refuse a flow that needs answers from a host whose pod's switch relays its pod mates' frames away
    (Topology.switch_relays): TCP, or any socket flow iperf3 drives, which sets up over a TCP control
    connection that the relay would carry off too, so the run could measure nothing."""
    relayed = {r.addressed_to: (i, r.to) for i, r in enumerate(sc.topology.switch_relays)}
    for pi, ph in enumerate(sc.phases):
        for fi, f in enumerate(ph.flows):
            if f.dst not in relayed or sc.topology.pod_of_host(f.src) != sc.topology.pod_of_host(f.dst):
                continue
            i, to = relayed[f.dst]
            if f.protocol == "tcp" or (traffic == "iperf3" and not f.raw_frames):
                how = "TCP" if f.protocol == "tcp" else "iperf3's control connection"
                raise ConfigError(
                    f"phases[{pi}].flows[{fi}]: {how} needs answers from {f.dst}, but switch_relays[{i}] sends "
                    f"what {f.src} sends {f.dst} to {to}; use UDP with --traffic builtin"
                )


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def default_traffic() -> Literal["iperf3", "builtin"]:
    """iperf3 where installed, the built-in generator otherwise."""
    return "iperf3" if shutil.which("iperf3") else "builtin"


def default_out_dir() -> Path:
    """A fresh output folder when the user gives none."""
    return Path(tempfile.mkdtemp(prefix="dpu-lab-"))
