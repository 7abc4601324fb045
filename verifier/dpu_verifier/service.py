"""`dpu-limiter verify`: the verifier as a long-running service beside the control plane.

Every `sample_s` it reads the routers' own octet counters over SNMP (routers.py) into bins per pod and
direction; every `interval_s` it runs the checks (checks.py) against the caps the control plane's API
says are in force, reads the DPUs' counters and read-back state through that API, signs the interval's
figures into an evidence bundle (evidence.py), logs one line per alert and exposes Prometheus metrics
(alert rules: verifier/alerts.yml). It reaches the control plane only through its API and trusts it for
nothing it judges: the caps it reads are what the figures are judged against, and they are signed.

With a `probes` section (and "probe" among the checks) it is also the receiver of the pods' probe agents
(probes.py, docs/probes.md): every sample it takes what reached its probe sockets, and at every tick it
judges each burst that ended (more than the cap allows; far less than the cap left free; datagrams refused).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import cut, shown
from dpu_limiter.units import MAX_FRAME_BYTES, UnitError, parse_rate
from dpu_limiter.yamlfile import YamlFileError, read_yaml

from .api_view import ApiView
from .checks import CHECKS, AuditCheck, Auditor, CapScope, Probe
from .evidence import load_public_key, load_signer
from .probes import (
    Pending,
    ProbeError,
    ProbeReceiver,
    ProbeSchedule,
    ProbeSink,
    Report,
    burst_plan,
    check_pod,
    close_bursts,
    count_bursts,
    load_key,
    min_payload,
)
from .readings import Readings
from .routers import PortCounter, SnmpError, SnmpRouter

LOG = logging.getLogger("dpu_verifier")
MIN_INTERVAL_S = 1.0


class ConfigError(ValueError):
    """A verifier config that cannot run, naming the field and the value."""


@dataclass(frozen=True)
class RouterConfig:
    """One router: its SNMP agent, read-only community, and which pod each of its ports (by ifName) faces."""

    name: str
    host: str
    port: int
    community: str
    ports: dict[str, str]


@dataclass(frozen=True)
class ProbePod:
    """One pod's probe agent as the verifier receives it: where, under which key, at what rate it sends."""

    pod: str
    host: str
    port: int
    key: bytes = field(repr=False)
    rate_bps: float


@dataclass(frozen=True)
class ProbesConfig:
    """The probe agents' shared schedule (their --start-at, --period-s, --burst-s, --size) and pods."""

    start_at: float
    period_s: float
    burst_s: float
    pods: tuple[ProbePod, ...]
    size: int = 1400
    clock_skew_s: float = 0.05  # how far an agent's clock may run ahead of the verifier's


@dataclass(frozen=True)
class VerifyConfig:
    """`dpu-limiter verify --config FILE`, validated."""

    control_plane: str
    routers: tuple[RouterConfig, ...]
    evidence: Path  # a new bundle directory per run is made in it
    key: Path  # the verifier's private signing key (evidence keygen)
    interval_s: float = 10.0
    sample_s: float = 1.0
    checks: tuple[AuditCheck, ...] = ("read-back", "router-count", "conservation")
    metrics: str = ""  # host:port of the Prometheus endpoint ("": none)
    # How stale a router's counters may be (agents refresh them every few seconds): the window and the
    # balance allow what the link can carry in that time.
    counter_lag_s: float = 5.0
    probes: ProbesConfig | None = None
    # A replicated control plane's other replicas (API addresses): each DPU's figures come from its holder.
    replicas: tuple[str, ...] = ()


def _field(doc: dict[str, Any], name: str, kind: type, where: str = "") -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ConfigError(f"{where}{name}: expected {kind.__name__}, got {str(value)[:80]!r}")
    return value


def _number(
    doc: dict[str, Any], name: str, where: str = "", default: float | None = None, zero_ok: bool = False
) -> float:
    """A finite number > 0 (>= 0 with `zero_ok`): every numeric field of the config goes through here."""
    value: Any = doc.get(name, default)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{where}{name}: expected a finite number {'>=' if zero_ok else '>'} 0, got {shown(value)}")
    return float(value)


def _host_port(value: Any, name: str) -> str:
    """`value` if it is host:port with a port 0..65535 (ConfigError naming `name` otherwise)."""
    _, sep, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) <= 65535):
        raise ConfigError(f"{name}: expected host:port, got {shown(value)}")
    return value


def _replicas(doc: Any) -> tuple[str, ...]:
    """`replicas`: the control plane's other replicas, a list of host:port."""
    if not isinstance(doc, list):
        raise ConfigError(f"replicas: expected a list of host:port, got {shown(doc)}")
    return tuple(_host_port(a, f"replicas[{i}]") for i, a in enumerate(doc))


def _signing_key(value: Any) -> Path:
    """`key`: the verifier's private key, read and checked (with its KEY.pub) before anything is made."""
    key = Path(value)
    pub = key.with_name(key.name + ".pub")  # what the bundle is checked with when it closes
    for path, load in ((key, load_signer), (pub, load_public_key)):
        try:
            load(path)
        except OSError as exc:
            raise ConfigError(f"key: cannot read {shown(str(path))}: {exc.strerror or exc}") from None
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            why = cut(str(exc).partition("\n")[0] or type(exc).__name__)
            raise ConfigError(f"key: {shown(str(path))}: not the verifier's key (evidence keygen): {why}") from None
    return key


def _probes(doc: Any) -> ProbesConfig:
    """The `probes` section: the agents' schedule and, per pod, listen address, key file and rate."""
    if not isinstance(doc, dict):
        raise ConfigError("probes: expected a mapping")
    where = "probes."
    start_at = _number(doc, "start_at", where)
    period_s = _number(doc, "period_s", where)
    burst_s = _number(doc, "burst_s", where)
    if burst_s >= period_s:
        raise ConfigError(f"probes.burst_s: {burst_s:g} must be shorter than period_s ({period_s:g})")
    size = doc.get("size", ProbesConfig.size)
    skew = _number(doc, "clock_skew_s", where, ProbesConfig.clock_skew_s, zero_ok=True)
    pods = []
    for name, p in _field(doc, "pods", dict, where).items():
        at = f"probes.pods.{str(name)[:40]}."
        try:
            check_pod(str(name))
            if isinstance(size, bool) or not isinstance(size, int) or not min_payload(str(name)) <= size <= 65507:
                raise ConfigError(
                    f"probes.size: expected {min_payload(str(name))}..65507 bytes, got {str(size)[:80]!r}"
                )
            if not isinstance(p, dict):
                raise ConfigError(f"{at[:-1]}: expected a mapping")
            host, _, port = _field(p, "listen", str, at).rpartition(":")
            if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"{at}listen: expected host:port, got {p['listen'][:80]!r}")
            key = load_key(Path(_field(p, "key", str, at)))
            rate = parse_rate(str(p.get("rate"))[:80], "rate")
        except (ProbeError, UnitError) as exc:
            raise ConfigError(f"{at}{str(exc)[:200]}") from None
        pods.append(ProbePod(str(name), host.strip("[]"), int(port), key, rate))
    if not pods:
        raise ConfigError("probes.pods: expected at least one pod")
    return ProbesConfig(start_at, period_s, burst_s, tuple(pods), size, skew)


def load_config(path: Path) -> VerifyConfig:
    """Read and check a verifier config (YAML); errors name the file, the field and the value."""
    try:
        doc = read_yaml(path)  # the one hardened loader: size, depth, aliases and duplicate keys bounded
    except YamlFileError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping at the top")
    try:
        routers = []
        for i, r in enumerate(_field(doc, "routers", list)):
            where = f"routers[{i}]."
            if not isinstance(r, dict):
                raise ConfigError(f"routers[{i}]: expected a mapping")
            host, _, port = _field(r, "snmp", str, where).rpartition(":")
            if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"{where}snmp: expected host:port, got {r['snmp'][:80]!r}")
            ports = _field(r, "ports", dict, where)
            if not ports or not all(isinstance(k, str) and isinstance(v, str) for k, v in ports.items()):
                raise ConfigError(f"{where}ports: expected a mapping of interface names to pods")
            name = _field(r, "name", str, where)
            routers.append(RouterConfig(name, host, int(port), _field(r, "community", str, where), dict(ports)))
        checks = doc.get("checks", VerifyConfig.checks)
        if not isinstance(checks, list | tuple) or not checks:
            raise ConfigError(f"checks: expected a list of {', '.join(CHECKS)}, got {shown(checks)}")
        unknown = [c for c in checks if c not in CHECKS]
        if unknown:
            raise ConfigError(f"checks: {shown(unknown)}: each must be one of {', '.join(CHECKS)}")
        metrics = doc.get("metrics", "")
        evidence = Path(_field(doc, "evidence", str))
        if evidence.exists() and not evidence.is_dir():
            raise ConfigError(f"evidence: {shown(str(evidence))} is not a directory")
        config = VerifyConfig(
            control_plane=_field(doc, "control_plane", str),
            routers=tuple(routers),
            evidence=evidence,
            key=_signing_key(_field(doc, "key", str)),
            interval_s=_number(doc, "interval_s", default=VerifyConfig.interval_s),
            sample_s=_number(doc, "sample_s", default=VerifyConfig.sample_s),
            checks=tuple(checks),
            metrics="" if metrics in ("", None) else _host_port(metrics, "metrics"),
            counter_lag_s=_number(doc, "counter_lag_s", default=VerifyConfig.counter_lag_s, zero_ok=True),
            probes=None if doc.get("probes") is None else _probes(doc["probes"]),
            replicas=_replicas(doc.get("replicas", [])),
        )
        if ("probe" in checks) != (config.probes is not None):
            raise ConfigError("checks, probes: the probe check needs a probes section, and a probes section the check")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: {cut(str(exc), 200)}") from None
    if not (math.isfinite(config.interval_s) and config.interval_s >= MIN_INTERVAL_S):
        raise ConfigError(f"{path}: interval_s: must be >= {MIN_INTERVAL_S:g} s, got {config.interval_s!r}")
    if not (math.isfinite(config.sample_s) and 0 < config.sample_s <= config.interval_s):
        raise ConfigError(f"{path}: sample_s: must be in (0, interval_s], got {config.sample_s!r}")
    return config


@dataclass
class Bins:
    """Bytes counted per bin of `bin_s` seconds since the verifier began (checks.Series)."""

    bin_s: float
    bins: list[int] = field(default_factory=list)

    def t0(self, default: float) -> float:
        """The series starts when the verifier began."""
        return 0.0

    def add(self, t: float, nbytes: int) -> None:
        """Count `nbytes` in the bin of time `t` (seconds since the verifier began)."""
        index = max(0, math.floor(t / self.bin_s))
        if index >= len(self.bins):
            self.bins.extend([0] * (index + 1 - len(self.bins)))
        self.bins[index] += nbytes


class Verifier:
    """The service: SNMP samples, the checks at every interval, evidence, alerts and metrics."""

    def __init__(self, config: VerifyConfig, tls: Any = None) -> None:
        self.config = config
        self._tls = tls
        self.routers = [SnmpRouter(r.host, r.port, r.community, r.ports) for r in config.routers]
        self._counters = {(i, name): PortCounter(name) for i, r in enumerate(config.routers) for name in r.ports}
        self.series: dict[tuple[str, str], Bins] = {}
        self.t_start = time.monotonic()
        self.bundle: Path | None = None
        registry = CollectorRegistry()
        self.registry = registry
        self._alerts = Counter("dpu_verifier_alerts", "alerts raised", ["check", "place"], registry=registry)
        self._verdict = Gauge(
            "dpu_verifier_window_held",
            "1 when the last window's verdict was held, 0 when violated, -1 when unverified",
            ["pod", "direction"],
            registry=registry,
        )
        self._unread = Counter("dpu_verifier_router_unread", "router polls that failed", ["router"], registry=registry)
        # Each pod's and direction's running total per poll, with when the poll was asked and answered: the
        # cap is judged on the real span between two polls (checks.Readings), not on bins of sample time
        # (an agent that refreshes every 3 s puts 3 s of traffic into one bin: a false alarm, issue 16).
        self.readings: dict[tuple[str, str], Readings] = {}
        self.auditor = Auditor(
            [],
            self.series,
            ApiView(config.control_plane, config.replicas),
            checks=config.checks,
            readings=self.readings,
        )
        self.auditor.resample = self.sample
        self._seen_alerts = 0
        self._wall0 = time.time()  # the wall clock at t_start: probes' stamps are wall-clock times
        self._sink = ProbeSink()
        self._probe_pods: dict[int, ProbePod] = {}
        self._probes: dict[int, Probe] = {}
        self._pending: list[Pending] = []
        self._arrivals: dict[tuple[int, int], list[tuple[float, int]]] = {}
        if config.probes is not None:
            self._listen(config.probes)

    def _listen(self, pc: ProbesConfig) -> None:
        """Open each pod's probe socket (ConfigError naming the pod if it cannot be bound)."""
        schedule = ProbeSchedule(pc.start_at, pc.period_s, pc.clock_skew_s)
        for p in pc.pods:
            rx = ProbeReceiver(p.pod, p.key, p.port, schedule)
            family = socket.AF_INET6 if ":" in p.host else socket.AF_INET
            try:
                self._sink.listen(socket.socket(family, socket.SOCK_DGRAM), p.host, rx)
            except OSError as exc:
                self._sink.close()
                raise ConfigError(
                    f"probes.pods.{p.pod}.listen: cannot bind {p.host}:{p.port}: {exc.strerror}"
                ) from None
            offered = int(p.rate_bps * pc.burst_s / 8)
            self._probe_pods[p.port] = p
            self._probes[p.port] = Probe(p.pod, offered, 0, rejected=rx.rejected)

    def _judge_probes(self, caps: list[CapScope]) -> None:
        """Count what the probes took against the bursts that ended, and hand closed bursts to the audit."""
        pc = self.config.probes
        if pc is None:
            return
        self._pending += self._sink.drain()
        first, period = pc.start_at, pc.period_s
        boundary = first + math.floor((time.time() - first) / period) * period  # the last burst's edge
        if boundary <= first:
            return
        by_pod = {c.pod: c for c in caps}
        slack = 4 * MAX_FRAME_BYTES

        def allowed(port: int, seconds: float) -> int:
            cap = by_pod.get(self._probe_pods[port].pod)
            # No cap in force: nothing to go over (and no floor to fall short of).
            return cap.egress_over(seconds) + slack if cap is not None else 1 << 62

        schedule = ProbeSchedule(first, period, pc.clock_skew_s)
        self._pending = count_bursts(
            self._pending, boundary, schedule, self._probes, self._arrivals, allowed, pc.burst_s
        )
        for port, rx in self._sink.receivers.items():
            p, probe = self._probe_pods[port], self._probes[port]
            cap = by_pod.get(p.pod)
            probe.allowance_bytes = allowed(port, pc.burst_s)
            probe.floor_bps = cap.egress_bps if cap is not None else 0.0
            n, gap = burst_plan(p.rate_bps, pc.burst_s, pc.size)
            close_bursts(probe, rx, boundary, Report(n, n * pc.size, (n - 1) * gap), lambda t: t - self._wall0)
        self.auditor.probes = [pr for pr in self._probes.values() if pr.pod in by_pod]

    async def sample(self) -> None:
        """Read every router's counters now and add what crossed since the last read to the series."""
        t = time.monotonic() - self.t_start
        self._pending += self._sink.drain()
        counted: dict[tuple[str, str], int] = {}
        unread: set[str] = set()  # pods on a router that did not answer: no reading of theirs this poll
        for i, (rc, router) in enumerate(zip(self.config.routers, self.routers, strict=True)):
            try:
                uptime, ports = await router.read()
            except SnmpError as exc:
                self._unread.labels(rc.name).inc()
                LOG.warning("router %s: %s", rc.name, exc)
                unread.update(rc.ports.values())
                continue
            for name, pod in rc.ports.items():
                delta = self._counters[(i, name)].advance(ports.get(name), uptime)
                if delta is None:
                    continue  # a discontinuity: nothing counted for this poll, as for a DPU that restarted
                # What the router received on the pod's port left the pod; what it sent went in.
                for direction, n in (("egress", delta[0]), ("ingress", delta[1])):
                    self.series.setdefault((pod, direction), Bins(self.config.sample_s)).add(t, n)
                    counted[(pod, direction)] = counted.get((pod, direction), 0) + n
        answered = time.monotonic() - self.t_start
        # A poll's totals are each port's counter at some moment between `t` less the agents' lag and
        # `answered`. A pod whose router did not answer gets no reading: its bytes since come with its next,
        # whose span then starts at the last reading it had.
        for pod in {pod for rc in self.config.routers for pod in rc.ports.values()} - unread:
            for direction in ("egress", "ingress"):
                r = self.readings.setdefault((pod, direction), Readings())
                last = r.last()
                r.read(t, answered, (last[2] if last else 0) + counted.get((pod, direction), 0))

    async def caps(self) -> list[CapScope]:
        """The caps in force, through the control plane's API, for the pods the routers face."""
        pods = {pod for r in self.config.routers for pod in r.ports.values()}
        out = []
        async with LimiterClient(self.config.control_plane) as client:
            for pod in sorted(pods):
                try:
                    c = (await client.get_pod_cap(pod)).cap
                except Exception as exc:  # no cap (or no pod): nothing to judge the rate against
                    LOG.warning("pod %s: no cap to judge: %s", pod, exc)
                    continue
                bucket = 0 if c.mode == 2 else c.burst_bytes  # CAP_MODE_WINDOW: the budget is exact
                mode = "window" if c.mode == 2 else "rate"
                out.append(CapScope(pod, c.egress_bps, c.ingress_bps, c.window_s, bucket, mode))
        return out

    async def tick(self) -> None:
        """One interval: the checks on what was sampled, signed; alerts logged and counted."""
        t = round(time.monotonic() - self.t_start, 3)
        caps = await self.caps()
        if self.auditor.evidence is not None and {c.pod for c in caps} != {c.pod for c in self.auditor.caps}:
            self._close()  # the capped pods changed: a bundle covers one set of them throughout
        self.auditor.caps = caps
        self._judge_probes(caps)
        lag = self.config.counter_lag_s
        self.auditor.count_slack_s = lag
        self.auditor.slack_ratio = 0.001
        if self.auditor.evidence is None:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            self.bundle = self.config.evidence / f"{stamp}-{t:.0f}"
            self.auditor.open_evidence(self.bundle, key=self.config.key, interval_s=self.config.interval_s)
        await self.auditor.tick(t)
        for a in self.auditor.alerts[self._seen_alerts :]:
            LOG.error("ALERT t=%.1fs check=%s place=%s %s", a.t_s, a.check, a.where, a.detail)
            self._alerts.labels(a.check, a.where).inc()
        self._seen_alerts = len(self.auditor.alerts)
        for _, where, verdict in self.auditor.signed[-2 * len(self.auditor.caps) :]:
            pod, direction = where.split(" ")
            self._verdict.labels(pod, direction).set({"held": 1, "violated": 0}.get(verdict, -1))

    async def run(self, stop: asyncio.Event) -> None:
        """Sample and tick until `stop` is set; then close the bundle."""
        if self.config.metrics:
            host, _, port = self.config.metrics.rpartition(":")
            start_http_server(int(port), host or "127.0.0.1", self.registry)
        next_tick = self.config.interval_s
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), self.config.sample_s)
                except TimeoutError:
                    pass
                await self.sample()
                if time.monotonic() - self.t_start >= next_tick:
                    await self.tick()
                    next_tick += self.config.interval_s
        finally:
            if self.auditor.evidence is not None:
                self._close()
            self._sink.close()

    def _close(self) -> None:
        result = self.auditor.close_evidence()
        LOG.info("evidence %s: %s", result["bundle"], "verified" if result["verified"] else result["problem"])
