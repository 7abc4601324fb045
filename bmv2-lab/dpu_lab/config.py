"""Topology and scenario files (YAML): models, loading, and errors that name the field and value."""

from __future__ import annotations

import ipaddress
import math
import random
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dpu_limiter.models import NAME_RE, Cap, InvalidArgument, cut, shown
from dpu_limiter.units import (
    DEFAULT_LEASE_S,
    REPLICA_LEASE_S,
    UnitError,
    allowed_window_bytes,
    default_burst_bytes,
    parse_rate,
)
from dpu_limiter.yamlfile import YamlFileError, read_yaml
from dpu_verifier.checks import AuditCheck

from .frames import CLAIMING, Encap, claimed_dst, host_mac
from .workloads import WorkloadSpec, expand


class ConfigError(ValueError):
    """A topology or scenario file is invalid; the message names the file, field and value."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _name(v: str) -> str:
    if not NAME_RE.match(v) or len(v) > 12:
        raise ValueError("must be 1-12 lowercase letters, digits, '.', '_' or '-'")
    return v


class PodSpec(_Model):
    """A pod: its subnet, its hosts, and where its limiter sits."""

    name: str
    subnet: str
    hosts: list[str] = Field(min_length=1, max_length=200)
    # pod-uplink: a limiter on the pod's uplink (Lucid); node: one per host, between it and the pod's
    # switch (Amodo), each enforcing an equal share of the pod's cap; router (virtual time): one
    # limiter per router, where it meets the spine, holding the caps of the pods behind it as one
    # cell (traffic between pods of one cell never reaches it). Router placement is all pods' or none.
    placement: Literal["pod-uplink", "node", "router"] = "pod-uplink"
    # pod-uplink: parallel uplinks (virtual time), each with its limiter enforcing an equal share of the
    # cap; the pod's switch and the router spread flows over them by a hash of the flow (ECMP).
    uplinks: int = Field(default=1, ge=1, le=16)

    _check_name = field_validator("name")(_name)

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str) -> str:
        net = ipaddress.IPv4Network(v, strict=True)
        if net.prefixlen > 29:
            raise ValueError("needs room for hosts and a gateway: prefix length <= 29")
        return str(net)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for h in v:
            _name(h)
        if len(set(v)) != len(v):
            raise ValueError("host names must be unique")
        return v

    @property
    def gateway(self) -> str:
        """The router's address in this pod's subnet (the last usable one)."""
        net = ipaddress.IPv4Network(self.subnet)
        return str(net.broadcast_address - 1)

    def limiters(self) -> list[str]:
        """Names of the pod's limiters: dpu-POD (dpu-POD-K of K parallel uplinks), or dpu-HOST per node
        (with router placement the limiters are the routers', Topology.limiters)."""
        if self.placement == "router":
            return []
        if self.placement == "node":
            return [f"dpu-{h}" for h in self.hosts]
        if self.uplinks == 1:
            return [f"dpu-{self.name}"]
        return [f"dpu-{self.name}-{k}" for k in range(1, self.uplinks + 1)]

    @model_validator(mode="after")
    def _uplinks(self) -> PodSpec:
        if self.uplinks > 1 and self.placement != "pod-uplink":
            raise ValueError(f"uplinks: {self.uplinks} parallel uplinks need placement pod-uplink")
        return self

    def host_address(self, index: int) -> str:
        """Address of the pod's `index`-th host (first usable addresses)."""
        net = ipaddress.IPv4Network(self.subnet)
        return str(net.network_address + 1 + index)


class ScaleUpLink(_Model):
    """An NVSwitch-style scale-up path joining two hosts with no DPU (and no router) on it."""

    a: str
    b: str
    rate: float = 400e9  # far above any cap (in the real lab, the veth runs as fast as the CPU allows)
    known_to_verifier: bool = False

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, v: Any) -> float:
        try:
            return parse_rate(v)
        except UnitError as exc:
            raise ValueError(str(exc)) from None


class SwitchRelay(_Model):
    """A pod switch that betrays its node DPUs' exemption: frames its pod's other hosts address to
    `addressed_to` (exempt at their node DPUs as intra-pod) leave the pod toward `to`, a host of another
    pod, their Ethernet destination rewritten to `to`'s MAC so the router switches them there."""

    addressed_to: str
    to: str


class RoutingSpec(_Model):
    """Which router each pod's uplink lands on (virtual time, with more than one router).

    operator: as `pods` says (pods it leaves out: the first router), fixed for the run; the operator
    chooses, so it can put the pods of one job behind one router. randomised: the verifier deals
    the pods over the routers at random (as evenly as they go) at the start and again every
    `period_s`, from `seed`.
    """

    assign: Literal["operator", "randomised"] = "operator"
    pods: dict[str, str] = Field(default_factory=dict)
    period_s: float | None = Field(default=None, gt=0, le=86_400)
    seed: int = 0

    @model_validator(mode="after")
    def _fields(self) -> RoutingSpec:
        if self.assign == "operator" and self.period_s is not None:
            raise ValueError("period_s: only a randomised assignment is redrawn")
        if self.assign == "randomised" and self.pods:
            raise ValueError("pods: a randomised assignment is the verifier's to draw; remove pods")
        return self


class Topology(_Model):
    """Pods behind limiting devices, joined by routers (more than one: through a spine), and, to model
    bypasses, scale-up links and pod switches that relay frames out of their pod."""

    name: str
    pods: list[PodSpec] = Field(min_length=1, max_length=16)
    routers: list[str] = Field(default_factory=lambda: ["r1"], min_length=1, max_length=16)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    scaleup_links: list[ScaleUpLink] = Field(default_factory=list, max_length=64)
    switch_relays: list[SwitchRelay] = Field(default_factory=list, max_length=64)

    _check_routers = field_validator("routers")(lambda v: [_name(r) for r in v])

    @model_validator(mode="after")
    def _unique(self) -> Topology:
        names = [p.name for p in self.pods]
        if len(set(names)) != len(names):
            raise ValueError(f"pod names must be unique: {names}")
        hosts = [h for p in self.pods for h in p.hosts]
        if len(set(hosts)) != len(hosts):
            raise ValueError("host names must be unique across pods")
        if len(set(self.routers)) != len(self.routers) or set(self.routers) & set(names):
            raise ValueError(f"router names must be unique and differ from pod names: {self.routers}")
        if len({p.placement == "router" for p in self.pods}) > 1:
            raise ValueError("placement: router placement is every pod's or none's")
        if self.pods[0].placement == "router":
            # Every router's cell needs a pod in every period (a control-plane pod needs a prefix).
            if len(self.pods) < len(self.routers):
                raise ValueError(f"routers: {len(self.routers)} routers, but router placement needs a pod for each")
            if self.routing.assign == "operator":
                empty = sorted(set(self.routers) - set(self.assignment(0).values()))
                if empty:
                    raise ValueError(f"routing.pods: routers {empty} get no pod; router placement needs one each")
        for pod, router in self.routing.pods.items():
            if pod not in names:
                raise ValueError(f"routing.pods: unknown pod {pod!r}")
            if router not in self.routers:
                raise ValueError(f"routing.pods.{pod}: unknown router {router!r} (routers: {self.routers})")
        limiters = self.limiters()
        if len(set(limiters)) != len(limiters):
            raise ValueError(f"limiter names clash (a host named like a pod's uplink?): {sorted(limiters)}")
        nets = [ipaddress.IPv4Network(p.subnet) for p in self.pods]
        for i, a in enumerate(nets):
            for b in nets[i + 1 :]:
                if a.overlaps(b):
                    raise ValueError(f"pod subnets overlap: {a} and {b}")
        for i, link in enumerate(self.scaleup_links):
            for end in (link.a, link.b):
                if end not in hosts:
                    raise ValueError(f"scaleup_links[{i}]: unknown host {end!r}")
            if link.a == link.b:
                raise ValueError(f"scaleup_links[{i}]: a link needs two different hosts")
        self._check_relays(hosts)
        return self

    def _check_relays(self, hosts: list[str]) -> None:
        """Each relay names known hosts of two different pods, and each host's frames go one way only."""
        relayed: dict[str, int] = {}
        for i, relay in enumerate(self.switch_relays):
            for end in ("addressed_to", "to"):
                if getattr(relay, end) not in hosts:
                    raise ValueError(f"switch_relays[{i}].{end}: unknown host {getattr(relay, end)!r}")
            pod = self.pod_of_host(relay.addressed_to).name
            if self.pod_of_host(relay.to).name == pod:
                # Inside its own pod a switch delivers where it likes: no boundary is crossed.
                raise ValueError(
                    f"switch_relays[{i}].to: {relay.to!r} is in pod {pod!r}, as {relay.addressed_to!r} is; "
                    "a relay takes frames out of the pod"
                )
            if relay.addressed_to in relayed:
                raise ValueError(
                    f"switch_relays[{i}].addressed_to: frames to {relay.addressed_to!r} are already relayed "
                    f"by switch_relays[{relayed[relay.addressed_to]}]"
                )
            relayed[relay.addressed_to] = i

    def limiters(self) -> list[str]:
        """Names of every limiter: the pods' (PodSpec.limiters), or dpu-ROUTER per router (router placement)."""
        if self.pods[0].placement == "router":
            return [f"dpu-{r}" for r in self.routers]
        return [n for p in self.pods for n in p.limiters()]

    def assignment(self, draw: int) -> dict[str, str]:
        """Each pod's router in the `draw`-th period of the run (operator routing: always the same)."""
        if self.routing.assign == "operator":
            return {p.name: self.routing.pods.get(p.name, self.routers[0]) for p in self.pods}
        pods = [p.name for p in self.pods]
        random.Random(f"{self.routing.seed}/{draw}").shuffle(pods)
        return {pod: self.routers[i % len(self.routers)] for i, pod in enumerate(pods)}

    def scaleup_peer(self, host: str) -> dict[str, int]:
        """Hosts joined to `host` by a scale-up link: {peer: link index}."""
        out = {}
        for i, link in enumerate(self.scaleup_links):
            if link.a == host:
                out[link.b] = i
            elif link.b == host:
                out[link.a] = i
        return out

    def pod(self, name: str) -> PodSpec:
        """The pod named `name`."""
        return next(p for p in self.pods if p.name == name)

    def host_macs(self) -> dict[str, bytes]:
        """Every host's MAC (frames.host_mac: pod index, host index from 1), by host name."""
        return {h: host_mac(i, j + 1) for i, pod in enumerate(self.pods) for j, h in enumerate(pod.hosts)}

    def pod_of_host(self, host: str) -> PodSpec:
        """The pod a host belongs to."""
        return next(p for p in self.pods if host in p.hosts)

    def address_of(self, host: str) -> str:
        """A host's IPv4 address."""
        pod = self.pod_of_host(host)
        return pod.host_address(pod.hosts.index(host))

    def hosts_by_pod(self) -> dict[str, list[str]]:
        """Each pod's hosts, in order."""
        return {p.name: list(p.hosts) for p in self.pods}


def _rate(v: Any, field: str = "rate") -> float | None:
    """A rate field as files write it (20M, 1G, 1e9, ...), in bit/s; None stays None."""
    if v is None:
        return None
    try:
        return parse_rate(v, field)
    except UnitError as exc:
        raise ValueError(str(exc)) from None


# The control plane's names for a cap's fields (its API's) that a scenario names otherwise.
CAP_FIELDS = {"egress_bps": "egress", "ingress_bps": "ingress"}


def control_plane_cap(cap: CapSpec, egress: float, ingress: float) -> None:
    """Check `cap` at these rates with the control plane's validation (ValueError naming the scenario's field)."""
    try:
        Cap.validated(Cap(egress, ingress, cap.window_s, cap.burst_bytes, cap.rebalance, cap.mode), "cap")
    except InvalidArgument as exc:
        name = exc.field.removeprefix("cap.")
        raise ValueError(f"{CAP_FIELDS.get(name, name)}: {exc.reason} (got {shown(exc.value)})") from None


class CapSpec(_Model):
    """A pod's cap as the scenario sets it (rates accept 20M, 1G, ...)."""

    pod: str
    egress: float
    ingress: float
    window_s: float = Field(gt=0, le=86_400)
    burst_bytes: int = Field(default=0, ge=0, le=(1 << 31) - 1)
    rebalance: bool = False  # node placement: shares follow measured demand
    mode: Literal["rate", "window"] = "rate"

    _rates = field_validator("egress", "ingress", mode="before")(lambda v, info: _rate(v, info.field_name))

    @model_validator(mode="after")
    def _as_the_control_plane_takes_it(self) -> CapSpec:
        # The control plane's own rules (window, rates, burst, mode): a cap it would refuse is refused here,
        # before the lab builds anything, rather than mid-run.
        control_plane_cap(self, self.egress, self.ingress)
        return self

    def bucket_bytes(self) -> int:
        """The bucket allowed on top of the rate: its burst (or the default); none in window mode."""
        if self.mode == "window":
            return 0  # window mode is exact: the allowance is the budget itself
        return self.burst_bytes or default_burst_bytes(max(self.egress, self.ingress))


FULL_SPEED = "max"  # a raw-frame flow's rate: as fast as its sender can write, for the phase's duration


class FlowSpec(_Model):
    """One traffic flow between two hosts."""

    name: str
    protocol: Literal["udp", "tcp"]
    src: str
    dst: str
    # UDP offered rate, bit/s (wire bytes); `max` (math.inf): a raw-frame sender writes back to back until
    # the phase ends (real time; evasion.py), bounded by its duration, not by a rate.
    rate: float | None = None
    size: int = Field(default=1400, ge=18, le=1472)
    # Evasion: the datagrams' shape (frames.py, red-team shapes included) and a forged IPv4 source address
    # (UDP only; in real time raw frames, evasion.py).
    encap: Encap = "none"
    spoof_src: str | None = None
    # Virtual time: the sender picked its ports so that its pod's ECMP puts the flow on this uplink
    # (1-based), as an attacker who knows a compromised uplink would; otherwise the hash decides.
    uplink: int | None = Field(default=None, ge=1, le=16)

    @field_validator("spoof_src")
    @classmethod
    def _ipv4(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                ipaddress.IPv4Address(v)
            except ValueError:
                raise ValueError(f"spoof_src: {v!r} is not an IPv4 address") from None
        return v

    @field_validator("rate", mode="before")
    @classmethod
    def _full_speed(cls, v: Any) -> float | None:
        return math.inf if v == FULL_SPEED else _rate(v)

    @property
    def raw_frames(self) -> bool:
        """Whether the flow's sender writes raw frames (evasion.py) rather than using a socket."""
        return self.encap != "none" or self.spoof_src is not None

    @model_validator(mode="after")
    def _udp_rate(self) -> FlowSpec:
        if self.protocol == "udp" and self.rate is None:
            raise ValueError(f"flow {self.name!r}: a UDP flow needs a rate")
        if self.protocol == "tcp" and self.rate is not None:
            raise ValueError(f"flow {self.name!r}: a TCP flow is bulk; remove rate")
        if self.protocol == "tcp" and (self.encap != "none" or self.spoof_src):
            raise ValueError(f"flow {self.name!r}: encap and spoof_src shape UDP datagrams; a TCP flow takes neither")
        if self.rate == math.inf and not self.raw_frames:
            # A socket sender paces at a rate; only the raw-frame sender has a full-speed mode.
            raise ValueError(f"flow {self.name!r}: rate: {FULL_SPEED} is for raw-frame flows (an encap or spoof_src)")
        return self


# What a compromised DPU does to itself (compromise.py).
CompromiseHow = Literal["raise-meter", "delete-meter", "forward-unclassified", "load-pipeline"]

# Events done to the control plane's replicas and their database (replicas_lab.py; real time only): the
# real-time runner carries them out itself, the driver never sees them.
REPLICA_ACTIONS = frozenset(
    {"kill-replica", "restart-db", "cut-replica-db", "start-replicas-at-once", "end-replica-session", "pause-replica"}
)
# The replicas' events that act on the replica primary for a pod's DPUs.
POD_REPLICA_ACTIONS = frozenset({"kill-replica", "cut-replica-db", "end-replica-session", "pause-replica"})
# The events that last `down_s` (1 s unless the file says); on any other, down_s would mean nothing.
DOWN_ACTIONS = frozenset({"restart-dpu", "restart-db", "cut-replica-db", "end-replica-session", "pause-replica"})
DEFAULT_DOWN_S = 1.0
DEFAULT_START_COUNT = 2  # replicas a start-replicas-at-once event starts when it gives no count
# The most replicas a run starts at once: at the start (control_plane.replicas), in one start-replicas-at-once
# event, and in all of those events together.
MAX_REPLICAS = 8


class EventSpec(_Model):
    """Something done to the system during a phase, `at_s` seconds after the phase's traffic starts.

    restart-dpu: the DPU's target dies and comes back empty after `down_s`.
    compromise: the DPU's own firmware tampers with it as `how` says, and with `forge` also lies to the
    controller (compromise.py; on bmv2, through its Thrift API, without forge: bmv2_firmware.py).
    set-cap: the pod's cap changes to `egress`/`ingress` (its window and burst kept), through the
    control plane's API, as an operator's policy change would.

    With control_plane.replicas > 1 (real time; replicas_lab.py):
    kill-replica: kill -9 of the replica that is primary for `pod`'s DPUs.
    restart-db: the database stopped, and started again `down_s` later (`lab run --control-db-ctl`).
    cut-replica-db: the replica primary for `pod`'s DPUs loses the database for `down_s` (its connections
    dropped and new ones refused), then gets it back.
    start-replicas-at-once: `count` new replicas (default 2) started on the database together.
    end-replica-session: the database ends the session the replica primary for `pod`'s DPUs writes through (an
    operator's pg_terminate_backend, a connection dropped on the way); for `down_s` the run watches whether
    another replica takes them (it should not: the replica takes a new session within its grace).
    pause-replica: the replica primary for `pod`'s DPUs stopped (SIGSTOP) for `down_s`, then continued: its
    sessions stay open, its lease runs out, another takes its DPUs; continued, it must stop writing and join
    again.
    """

    at_s: float = Field(ge=0)
    action: Literal[
        "restart-dpu",
        "compromise",
        "set-cap",
        "kill-replica",
        "restart-db",
        "cut-replica-db",
        "start-replicas-at-once",
        "end-replica-session",
        "pause-replica",
    ]
    dpu: str | None = None
    # None on the events that take none (DOWN_ACTIONS take DEFAULT_DOWN_S when the file gives none).
    down_s: float | None = Field(default=None, ge=0, le=600)
    how: CompromiseHow | None = None
    forge: bool = False
    pod: str | None = None
    egress: float | None = Field(default=None, gt=0)
    ingress: float | None = Field(default=None, gt=0)
    count: int | None = Field(default=None, ge=1, le=MAX_REPLICAS)

    _rates = field_validator("egress", "ingress", mode="before")(lambda v, info: _rate(v, info.field_name))

    @model_validator(mode="before")
    @classmethod
    def _default_down(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("action") in DOWN_ACTIONS and data.get("down_s") is None:
            return {**data, "down_s": DEFAULT_DOWN_S}
        return data

    @property
    def down_for_s(self) -> float:
        """How long the event lasts (`down_s`; only the events that take one, DOWN_ACTIONS, have it)."""
        assert self.down_s is not None, self.action
        return self.down_s

    @property
    def start_count(self) -> int:
        """How many replicas a start-replicas-at-once event starts (`count`, DEFAULT_START_COUNT if none)."""
        return self.count or DEFAULT_START_COUNT

    @model_validator(mode="after")
    def _fields(self) -> EventSpec:
        if self.down_s is not None and self.action not in DOWN_ACTIONS:
            raise ValueError(f"down_s: {self.action} lasts no time; remove down_s")
        if self.action == "compromise" and self.how is None:
            raise ValueError(
                "how: a compromise needs how (raise-meter, delete-meter, forward-unclassified or load-pipeline)"
            )
        if self.action != "compromise" and (self.how is not None or self.forge):
            raise ValueError(f"how, forge: only a compromise takes them, not {self.action}")
        if self.count is not None and self.action != "start-replicas-at-once":
            raise ValueError(f"count: only start-replicas-at-once takes it, not {self.action}")
        if self.action in REPLICA_ACTIONS:
            if self.dpu is not None or self.egress is not None or self.ingress is not None:
                raise ValueError(f"dpu, egress, ingress: {self.action} acts on the control plane and takes none")
            needs_pod = self.action in POD_REPLICA_ACTIONS
            if needs_pod and self.pod is None:
                raise ValueError(f"pod: {self.action} needs the pod whose DPUs' primary replica it acts on")
            if not needs_pod and self.pod is not None:
                raise ValueError(f"pod: {self.action} acts on no pod's replica; remove pod")
        elif self.action == "set-cap":
            if self.pod is None or self.egress is None or self.ingress is None:
                raise ValueError("pod, egress, ingress: set-cap needs all three")
        elif self.dpu is None:
            raise ValueError(f"dpu: {self.action} needs the DPU it acts on")
        return self


class ControlPlaneSpec(_Model):
    """How a real-time run runs the control plane: one `serve` on a SQLite file of the run's own (replicas 1,
    the default), or `replicas` `serve` processes on one PostgreSQL database (docs/replicas.md), which the
    run is given (`lab run --control-db URL`). `lease_s` is the DPUs' lease (`serve --lease-s`) and
    `replica_lease_s` each replica's lease in the database (`--replica-lease-s`); None: serve's defaults."""

    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    lease_s: float | None = Field(default=None, gt=0, le=3600)
    # serve refuses a replica lease of 3 s or less (more than three times its 1 s fencing margin).
    replica_lease_s: float | None = Field(default=None, gt=3, le=600)

    def dpu_lease(self) -> float:
        """The DPUs' lease the run's control plane uses: lease_s, or serve's default."""
        return DEFAULT_LEASE_S if self.lease_s is None else self.lease_s

    def replica_lease(self) -> float:
        """Each replica's lease in the database: replica_lease_s, or serve's default."""
        return REPLICA_LEASE_S if self.replica_lease_s is None else self.replica_lease_s

    def check_leases(self) -> None:
        """A replica's lease below a third of the DPUs' (ValueError naming the field): a replica that stalls
        keeps its DPUs until its own lease runs out, and theirs, renewed every third, must outlast that."""
        if self.replicas == 1 and self.replica_lease_s is None:
            return  # one control plane on a file has no replica lease
        lease, replica = self.dpu_lease(), self.replica_lease()
        if replica < lease / 3:
            return
        default = ", serve's default"
        if self.replica_lease_s is not None:
            raise ValueError(
                f"control_plane.replica_lease_s: {replica:g} must be below a third of control_plane.lease_s "
                f"({lease:g}{'' if self.lease_s is not None else default}): a replica that stalls keeps its DPUs "
                "until its own lease runs out, and theirs would lapse first"
            )
        raise ValueError(
            f"control_plane.lease_s: {lease:g} must be more than three times control_plane.replica_lease_s "
            f"({replica:g}{default}): a replica that stalls keeps its DPUs until its own lease runs out, and "
            "theirs would lapse first"
        )


# Probes send traffic of their own (part of the pod's cap): a scenario asks for them.
DEFAULT_CHECKS: list[AuditCheck] = ["read-back", "router-count", "conservation"]


class AuditSpec(_Model):
    """The verifier's audit beside the control plane (live_audit.py in real time): which checks, how often.

    probe: every interval, the verifier's probe agent on each capped pod's first host sends
    `probe_factor` times the pod's egress cap for `probe_s` out of the pod (virtual time: to a host in
    another pod; real time: to the router), and the probe's receiver checks that no more arrived than
    the cap allows in that time.
    """

    interval_s: float = Field(default=1.0, gt=0, le=3600)
    checks: list[AuditCheck] = Field(default_factory=lambda: list(DEFAULT_CHECKS), min_length=1)
    probe_s: float = Field(default=0.5, gt=0, le=3600)
    probe_factor: float = Field(default=2.0, gt=1, le=1000)

    @model_validator(mode="after")
    def _probe_fits(self) -> AuditSpec:
        if "probe" in self.checks and self.probe_s >= self.interval_s:
            raise ValueError(f"probe_s: {self.probe_s} must be shorter than interval_s ({self.interval_s})")
        return self


class PhaseSpec(_Model):
    """A stretch of time with its own flows, workloads (workloads.py; virtual time) and events."""

    name: str
    duration_s: float = Field(gt=0, le=3600)
    flows: list[FlowSpec] = Field(default_factory=list)
    workloads: list[WorkloadSpec] = Field(default_factory=list)
    events: list[EventSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _traffic(self) -> PhaseSpec:
        if not self.flows and not self.workloads:
            raise ValueError(f"phase {self.name!r}: needs flows or workloads")
        return self


class Scenario(_Model):
    """A topology, caps on its pods, and phases of traffic."""

    name: str
    topology: Topology
    caps: list[CapSpec]
    phases: list[PhaseSpec] = Field(min_length=1)
    audit: AuditSpec | None = None
    control_plane: ControlPlaneSpec = Field(default_factory=ControlPlaneSpec)

    @model_validator(mode="after")
    def _refs(self) -> Scenario:
        self._replica_events()
        self._set_caps()
        if self.audit is not None and "probe" in self.audit.checks:
            if len(self.topology.pods) < 2:
                raise ValueError("audit.checks: a probe needs a second pod to send to")
            for c in self.caps:
                need = probe_seconds_needed(c, self.peak_rates(c.pod)[0], self.audit.probe_factor)
                if self.audit.probe_s <= need:
                    raise ValueError(
                        f"audit.probe_s: {self.audit.probe_s} s at {self.audit.probe_factor:g}x pod {c.pod}'s cap "
                        f"cannot offer more than the cap allows in that time; needs more than {need:.3g} s"
                    )
        if self.topology.pods[0].placement == "router":
            self._router_placement()
        pods = {p.name for p in self.topology.pods}
        hosts = {h for p in self.topology.pods for h in p.hosts}
        for i, c in enumerate(self.caps):
            if c.pod not in pods:
                raise ValueError(f"caps[{i}].pod: unknown pod {c.pod!r} (pods: {sorted(pods)})")
        names = set()
        limiters = set(self.topology.limiters())
        for pi, ph in enumerate(self.phases):
            for ei, ev in enumerate(ph.events):
                if ev.action == "set-cap":
                    if self.cap_of(str(ev.pod)) is None:
                        raise ValueError(f"phases[{pi}].events[{ei}].pod: {ev.pod!r} has no cap to change")
                elif ev.action in REPLICA_ACTIONS:
                    if ev.pod is not None and (ev.pod not in pods or not self.topology.pod(ev.pod).limiters()):
                        raise ValueError(f"phases[{pi}].events[{ei}].pod: {ev.pod!r} is not a pod with DPUs")
                elif ev.dpu not in limiters:
                    raise ValueError(f"phases[{pi}].events[{ei}].dpu: unknown DPU {ev.dpu!r} ({sorted(limiters)})")
                if ev.at_s > ph.duration_s:
                    raise ValueError(f"phases[{pi}].events[{ei}].at_s: {ev.at_s} is after the phase ends")
            for wi, w in enumerate(ph.workloads):
                try:
                    expand(w, self.topology.hosts_by_pod(), ph.duration_s)
                except ValueError as exc:
                    raise ValueError(f"phases[{pi}].workloads[{wi}]: {exc}") from None
            for fi, f in enumerate(ph.flows):
                for end in ("src", "dst"):
                    if getattr(f, end) not in hosts:
                        raise ValueError(f"phases[{pi}].flows[{fi}].{end}: unknown host {getattr(f, end)!r}")
                if f.uplink is not None and f.uplink > self.topology.pod_of_host(f.src).uplinks:
                    pod = self.topology.pod_of_host(f.src)
                    raise ValueError(
                        f"phases[{pi}].flows[{fi}].uplink: {f.uplink}, but pod {pod.name!r} has {pod.uplinks} uplink(s)"
                    )
                if f.encap in CLAIMING and f.spoof_src is None:
                    self._check_claim(f"phases[{pi}].flows[{fi}].encap", f)
                if f.name in names:
                    raise ValueError(f"phases[{pi}].flows[{fi}].name: duplicate flow name {f.name!r}")
                names.add(f.name)
        return self

    def _replica_events(self) -> None:
        """Events on replicas need more than one of them, and the audit reads one control plane's API."""
        self.control_plane.check_leases()
        replicas = self.control_plane.replicas
        for pi, ph in enumerate(self.phases):
            for ei, ev in enumerate(ph.events):
                if ev.action in REPLICA_ACTIONS and replicas < 2:
                    raise ValueError(
                        f"phases[{pi}].events[{ei}].action: {ev.action} needs control_plane.replicas of 2 or more "
                        f"(got {replicas})"
                    )
                if ev.action == "restart-db" and ev.at_s + ev.down_for_s > ph.duration_s:
                    # Stopped past the phase's end, it would be started again only by the run's cleanup.
                    raise ValueError(
                        f"phases[{pi}].events[{ei}].down_s: {ev.down_for_s:g} s from at_s {ev.at_s:g} runs past the "
                        f"phase's end ({ph.duration_s:g} s)"
                    )
        self._replica_counts()
        if replicas > 1 and self.audit is not None:
            raise ValueError(
                "audit: not yet with control_plane.replicas > 1 (the audit reads one control plane's API, which "
                "counts only the DPUs that replica holds)"
            )

    def _replica_counts(self) -> None:
        """In the order the events come: every kill leaves a live replica to serve the API and take its DPUs
        (a start counts from its time on), and the start-replicas-at-once events start MAX_REPLICAS at most."""
        first, started, killed = self.control_plane.replicas, 0, 0
        # A kill at the time of a start is counted first: the new replicas may not have joined yet.
        order = sorted(
            (
                (pi, ev.at_s, ev.action != "kill-replica", ei, ev)
                for pi, ph in enumerate(self.phases)
                for ei, ev in enumerate(ph.events)
            ),
            key=lambda x: x[:4],
        )
        for pi, _, _, ei, ev in order:
            where = f"phases[{pi}].events[{ei}]"
            if ev.action == "start-replicas-at-once":
                started += ev.start_count
                if started > MAX_REPLICAS:
                    raise ValueError(
                        f"{where}.count: the start-replicas-at-once events together start {started} replicas; at most "
                        f"{MAX_REPLICAS} in a run"
                    )
            elif ev.action == "kill-replica":
                if first + started - killed < 2:
                    raise ValueError(
                        f"{where}.action: kill-replica would leave no live replica (control_plane.replicas {first}, "
                        f"{started} started by events before it, {killed} killed)"
                    )
                killed += 1

    def replica_events(self) -> list[tuple[int, EventSpec]]:
        """The events on replicas and their database, with the index of their phase."""
        return [(pi, ev) for pi, ph in enumerate(self.phases) for ev in ph.events if ev.action in REPLICA_ACTIONS]

    def without_replica_events(self) -> Scenario:
        """The scenario as the driver runs it: the real-time runner carries out the replicas' events itself."""
        phases = [
            ph.model_copy(update={"events": [e for e in ph.events if e.action not in REPLICA_ACTIONS]})
            for ph in self.phases
        ]
        return self.model_copy(update={"phases": phases})

    def _check_claim(self, where: str, f: FlowSpec) -> None:
        """An intra-pod claim must name an unused address of the sender's pod (frames.claimed_dst). Not asked of
        a flow with a forged source: its claim follows the forgery, and the sender's DPU drops it as spoofed."""
        pod = self.topology.pod_of_host(f.src)
        claim = claimed_dst(self.topology.address_of(f.src))
        used = {pod.host_address(i) for i in range(len(pod.hosts))} | {pod.gateway}
        if ipaddress.IPv4Address(claim) not in ipaddress.IPv4Network(pod.subnet) or claim in used:
            raise ValueError(
                f"{where}: {f.encap} claims {claim}, which is not an unused address of pod {pod.name!r} ({pod.subnet})"
            )

    def _set_caps(self) -> None:
        """Each set-cap event's cap as the control plane will be asked to take it (its pod's cap, new rates)."""
        for i, ph in enumerate(self.phases):
            for j, ev in enumerate(ph.events):
                cap = self.cap_of(ev.pod) if ev.action == "set-cap" and ev.pod is not None else None
                if cap is not None and ev.egress is not None and ev.ingress is not None:
                    try:
                        control_plane_cap(cap, ev.egress, ev.ingress)
                    except ValueError as exc:
                        raise ValueError(f"phases[{i}].events[{j}].{exc}") from None

    def _router_placement(self) -> None:
        """A router's limiter holds its cell's pods as one (routing.py): their caps must add up."""
        caps = {c.pod: c for c in self.caps}
        missing = [p.name for p in self.topology.pods if p.name not in caps]
        if missing:
            raise ValueError(f"caps: router placement caps every pod; {missing} have no cap")
        kinds = {(c.window_s, c.mode) for c in self.caps}
        if len(kinds) > 1 or any(c.rebalance for c in self.caps):
            raise ValueError("caps: router placement needs the same window_s and mode in every cap, and no rebalance")
        if any(e.action == "set-cap" for ph in self.phases for e in ph.events):
            raise ValueError("events: set-cap is not modelled with router placement")
        if self.audit is not None and "conservation" in self.audit.checks:
            raise ValueError("audit.checks: conservation is drawn per pod's DPUs; router placement has none of its own")

    def cap_of(self, pod: str) -> CapSpec | None:
        """The cap set on `pod`, if any."""
        return next((c for c in self.caps if c.pod == pod), None)

    def peak_rates(self, pod: str) -> tuple[float, float]:
        """The largest egress and ingress rates `pod`'s cap takes during the run (set-cap events too)."""
        cap = self.cap_of(pod)
        assert cap is not None
        changes = [e for ph in self.phases for e in ph.events if e.action == "set-cap" and e.pod == pod]
        return (
            max([cap.egress, *(float(e.egress or 0) for e in changes)]),
            max([cap.ingress, *(float(e.ingress or 0) for e in changes)]),
        )


def probe_allowance_bytes(cap: CapSpec, rate: float, seconds: float) -> int:
    """Most bytes a pod may pass at `rate` in `seconds` (at most its window): rate x time + bucket +
    one frame in rate mode, the whole window budget in window mode."""
    if cap.mode == "window":
        return allowed_window_bytes(rate, cap.window_s, 0)
    return allowed_window_bytes(rate, seconds, cap.bucket_bytes())


def probe_seconds_needed(cap: CapSpec, rate: float, factor: float) -> float:
    """The shortest probe at `factor` x `rate` that offers more than the cap allows in its time."""
    lo, hi = 0.0, 3600.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if factor * rate * mid / 8 > probe_allowance_bytes(cap, rate, mid):
            hi = mid
        else:
            lo = mid
    return hi


# A field path at the start of a validator's message ("phases[0].events[1].at_s: ..."); group 1 the path.
LEADING_PATH = re.compile(r"([A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*): ")


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """A pydantic error's location as the lab's messages write a field: phases[0].events[1].at_s."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def error_lines(exc: ValidationError, limit: int) -> list[str]:
    """Each of `exc`'s errors (at most `limit`) as one bounded line, "FIELD.PATH: what (got VALUE)", in one
    style whichever validator found it."""
    lines = []
    for err in exc.errors()[:limit]:
        where, msg, value = field_path(err["loc"]), err["msg"], err.get("input")
        if err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            named = LEADING_PATH.match(msg)
            # A model's validator (its input the model's mapping) names the field from where that model sits; a
            # field's validator may repeat the field's own name.
            if named and isinstance(value, dict):
                where, msg = f"{where}.{named[1]}" if where else named[1], msg[named.end() :]
            elif named and named[1] == str(err["loc"][-1] if err["loc"] else ""):
                msg = msg[named.end() :]
        # A mapping or list is the model's own input: the message names what in it is wrong.
        got = "" if isinstance(value, dict | list) else f" (got {shown(value)})"
        lines.append(f"{cut(where, 200) + ': ' if where else ''}{cut(msg, 200)}{got}")
    return lines


def _format_error(path: Path, exc: ValidationError) -> str:
    # Bounded however large the file's values are: each part cut, at most MAX_ERRORS lines.
    lines = [f"{path}: invalid scenario", *(f"  {line}" for line in error_lines(exc, MAX_ERRORS))]
    if exc.error_count() > MAX_ERRORS:
        lines.append(f"  ... and {exc.error_count() - MAX_ERRORS} more")
    return "\n".join(lines)


MAX_ERRORS = 20


def load_scenario(path: Path) -> Scenario:
    """Load a scenario file; `topology:` may be inline or a path relative to the file."""
    try:
        doc = read_yaml(path)
    except YamlFileError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: a scenario must be a mapping at the top level")
    topo = doc.get("topology")
    if isinstance(topo, str):
        tpath = (path.parent / topo).resolve()
        try:
            doc["topology"] = read_yaml(tpath)
        except YamlFileError as exc:
            raise ConfigError(f"{path}: topology: {exc}") from None
        # Any file parses as something (/etc/shadow's lines as keys): one that is not a topology is refused
        # naming its path only, so that a scenario cannot make an error repeat what another file holds.
        tdoc = doc["topology"]
        if not isinstance(tdoc, dict) or not set(tdoc) <= set(Topology.model_fields):
            fields = ", ".join(Topology.model_fields)
            raise ConfigError(f"{path}: topology: {cut(str(tpath), 200)}: not a topology (a YAML mapping of {fields})")
    try:
        return Scenario.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(_format_error(path, exc)) from None
