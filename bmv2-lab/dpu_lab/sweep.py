"""`dpu-limiter lab sweep FILE --out DIR`: one scenario run over a grid, in virtual time, in parallel.

A sweep file names a base scenario and the axes to vary:

    name: caps-by-attack
    scenario: scenarios/compromised-dpu.yaml   # relative to the sweep file
    axes:
      cap: [10M, 20M]                          # egress and ingress rate of every pod (or of cap_pods)
      placement: [pod-uplink, node]            # every pod's placement
      attack: [none, raise-meter, raise-meter+forge, forward-unclassified]
      routing: [operator, randomised]          # who assigns pods to routers (more than one router)
    attack_at_s: 10                            # when, in the first phase (default: a third of it)
    routing_period_s: 10                       # randomised routing: redrawn this often
    segment_bytes: 16000                       # optional, as --segment-bytes

`attack` replaces the base scenario's events: `none`, or a compromise of the first limiter of the
first pod (`HOW` or `HOW+forge`). With any attack the audit runs (every second, unless the base
scenario sets it). `routing: operator` keeps the topology's own assignment; `randomised` lets the
verifier deal pods over the routers every `routing_period_s`. Each point runs in its own process;
sweep.csv gets one row per point and sweep.png compares effective inter-pod bandwidth across the
grid, marking what the audit caught.

A sweep that outgrows one machine goes to a Dask cluster: with `--scheduler ADDRESS` (a running
`dask scheduler`, e.g. tcp://10.0.0.5:8786) each point is a task on the cluster's workers instead of
a local process (the `cluster` extra: `pip install 'dpu-limiter[cluster]'`). The workers write each
point's folder under `--out`, so `--out` must be on a file system they share with this machine; the
rows come back to this machine, which writes sweep.csv and sweep.png as a local sweep does.
"""

from __future__ import annotations

import csv
import itertools
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dpu_limiter.yamlfile import YamlFileError, read_yaml

from .config import (
    MAX_ERRORS,
    AuditSpec,
    CompromiseHow,
    ConfigError,
    EventSpec,
    RoutingSpec,
    Scenario,
    error_lines,
    load_scenario,
)
from .report import Report
from .virtual import VirtualLabRun, limiters_of

ATTACKS = ["none", *get_args(CompromiseHow), *(f"{h}+forge" for h in get_args(CompromiseHow))]


class Axes(BaseModel):
    """The grid: each axis a list of values (one value: not varied)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cap: list[float | str] = Field(default=["base"], min_length=1)
    placement: list[Literal["base", "pod-uplink", "node", "router"]] = Field(default=["base"], min_length=1)
    attack: list[str] = Field(default=["none"], min_length=1)
    routing: list[Literal["base", "operator", "randomised"]] = Field(default=["base"], min_length=1)

    @field_validator("cap")
    @classmethod
    def _caps(cls, v: list[float | str]) -> list[float | str]:
        from dpu_limiter.units import UnitError, parse_rate

        for c in v:
            if c != "base":
                try:
                    parse_rate(c, "cap")
                except UnitError as exc:
                    raise ValueError(str(exc)) from None
        return v

    @field_validator("attack")
    @classmethod
    def _attacks(cls, v: list[str]) -> list[str]:
        for a in v:
            if a not in ATTACKS:
                raise ValueError(f"attack {a!r}: must be one of {ATTACKS}")
        return v


class SweepSpec(BaseModel):
    """A sweep file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    scenario: str
    axes: Axes = Field(default_factory=Axes)
    attack_at_s: float | None = Field(default=None, ge=0)
    segment_bytes: int | None = Field(default=None, ge=18, le=1 << 20)
    cap_pods: list[str] | None = None  # the pods whose cap the cap axis sets (default: every capped pod)
    routing_period_s: float = Field(default=10.0, gt=0)
    routing_seed: int = 0


@dataclass(frozen=True)
class Point:
    """One run of the grid."""

    cap: float | str
    placement: str
    attack: str
    routing: str = "base"

    @property
    def slug(self) -> str:
        """A folder name for the point."""
        cap = self.cap if isinstance(self.cap, str) else f"{self.cap:g}"
        routing = "" if self.routing == "base" else f"_{self.routing}"
        return f"cap-{cap}_{self.placement}_{self.attack}{routing}".replace("+", "-")


def load_sweep(path: Path) -> tuple[SweepSpec, Scenario]:
    """Read a sweep file and its base scenario; ConfigError names the field."""
    try:
        doc = read_yaml(path)
        spec = SweepSpec.model_validate(doc)
    except YamlFileError as exc:
        raise ConfigError(str(exc)) from None
    except ValidationError as exc:
        errs = "; ".join(error_lines(exc, MAX_ERRORS))
        raise ConfigError(f"{path}: invalid sweep: {errs}") from None
    base = load_scenario((path.parent / spec.scenario).resolve())
    unknown = sorted(set(spec.cap_pods or []) - {c.pod for c in base.caps})
    if unknown:
        raise ConfigError(f"{path}: cap_pods: {unknown} have no cap in {spec.scenario}")
    return spec, base


def grid(spec: SweepSpec) -> list[Point]:
    """Every combination of the axes."""
    a = spec.axes
    return [Point(c, p, k, r) for c, p, k, r in itertools.product(a.cap, a.placement, a.attack, a.routing)]


def scenario_at(base: Scenario, spec: SweepSpec, point: Point) -> Scenario:
    """The base scenario with the point's cap, placement and attack."""
    from dpu_limiter.units import parse_rate

    topo = base.topology
    if point.placement != "base":
        pods = [p.model_copy(update={"placement": point.placement}) for p in topo.pods]
        topo = topo.model_copy(update={"pods": pods})
    if point.routing == "randomised":
        routing = RoutingSpec(assign="randomised", period_s=spec.routing_period_s, seed=spec.routing_seed)
        topo = topo.model_copy(update={"routing": routing})
    elif point.routing == "operator" and topo.routing.assign != "operator":
        topo = topo.model_copy(update={"routing": RoutingSpec()})
    caps = base.caps
    if point.cap != "base":
        rate = parse_rate(point.cap, "axes.cap")
        caps = [
            c.model_copy(update={"egress": rate, "ingress": rate})
            if spec.cap_pods is None or c.pod in spec.cap_pods
            else c
            for c in caps
        ]
    sc = base.model_copy(update={"topology": topo, "caps": caps, "name": f"{base.name} {point.slug}"})
    phases = [ph.model_copy(update={"events": []}) for ph in sc.phases]
    audit = sc.audit
    if point.attack != "none":
        how, _, forge = point.attack.partition("+")
        target = limiters_of(sc)[0][0]
        at = spec.attack_at_s if spec.attack_at_s is not None else phases[0].duration_s / 3
        ev = EventSpec(at_s=at, action="compromise", dpu=target, how=how, forge=bool(forge))  # type: ignore[arg-type]
        phases[0] = phases[0].model_copy(update={"events": [ev]})
        audit = audit or AuditSpec()
    if audit is not None and topo.pods[0].placement == "router":
        # Conservation is drawn per pod's own DPUs, which router placement has not.
        audit = audit.model_copy(update={"checks": [c for c in audit.checks if c != "conservation"]})
    sc = sc.model_copy(update={"topology": topo, "phases": phases, "audit": audit})
    try:  # the combination must make a valid scenario, as a file would have to
        return Scenario.model_validate(sc.model_dump())
    except ValidationError as exc:
        raise ConfigError(f"sweep point {point.slug}: {error_lines(exc, 1)[0]}") from None


def row(point: Point, report: Report) -> dict[str, Any]:
    """The CSV row of one point."""
    egress = [r for r in report.results if r.direction == "egress"]
    inter = sum(f.delivered_bps for f in report.flows if f.src_pod != f.dst_pod)
    audit = report.audit or {}
    return {
        "cap": point.cap,
        "placement": point.placement,
        "attack": point.attack,
        "routing": point.routing,
        "compliant": report.cap_held,
        "worst_window_ratio": max((r.max_window_bytes / r.allowed_window_bytes for r in egress), default=0.0),
        "inter_pod_mbps": inter / 1e6,
        # A workload's effective bandwidth is its slowest stream's (virtual.workload_result).
        "workload_mbps": min((w["effective_bps"] / 1e6 for w in report.workloads), default=None),
        "detected": audit.get("detected", False),
        "time_to_detection_s": audit.get("time_to_detection_s"),
        "detected_by": " ".join(audit.get("detected_by", [])),
        "false_alarms": audit.get("false_alarms", 0),
    }


def _run_point(args: tuple[Scenario, Path, int | None]) -> Report:
    sc, out, segment = args
    return VirtualLabRun(sc, out, segment).run()


def run_sweep(path: Path, out: Path, jobs: int | None = None, scheduler: str | None = None) -> list[dict[str, Any]]:
    """Run every point of the sweep file at `path` (in `jobs` local processes, or as tasks of the Dask
    cluster whose scheduler is at `scheduler`); write sweep.csv and sweep.png."""
    spec, base = load_sweep(path)
    points = grid(spec)
    work = [(scenario_at(base, spec, p), out / p.slug, spec.segment_bytes) for p in points]
    out.mkdir(parents=True, exist_ok=True)
    if scheduler is not None:
        reports = _on_cluster(scheduler, work)
    else:
        # Each point gets a fresh process: its own event loop, gRPC servers and simulated clock.
        with mp.get_context("spawn").Pool(jobs or os.cpu_count() or 1) as pool:
            reports = pool.map(_run_point, work)
    rows = [row(p, r) for p, r in zip(points, reports, strict=True)]
    with (out / "sweep.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot_sweep(spec.name, rows).savefig(out / "sweep.png", dpi=100)
    return rows


def _on_cluster(scheduler: str, work: list[tuple[Scenario, Path, int | None]]) -> list[Report]:
    """Run each point as a task of the Dask cluster at `scheduler`; their reports, in the points' order."""
    try:
        from distributed import Client
    except ImportError:
        raise ConfigError("--scheduler needs Dask's distributed package: pip install 'dpu-limiter[cluster]'") from None
    try:
        client = Client(scheduler, timeout=30)
    except OSError as exc:  # refused, unreachable, or no scheduler answered in time
        raise ConfigError(f"--scheduler {scheduler}: {exc}") from None
    with client:
        # pure=False: a point is a run to make, not a value to share between equal-looking calls.
        futures = client.map(_run_point, work, pure=False)
        return list(client.gather(futures))


def plot_sweep(name: str, rows: list[dict[str, Any]]) -> Figure:
    """Effective inter-pod bandwidth per point, grouped by attack; hatched where the audit caught it."""
    fig = Figure(figsize=(max(6.0, 0.5 * len(rows) + 2), 4), layout="constrained")
    ax = fig.subplots()
    labels = [
        f"{r['attack']}\n{r['placement']}, cap {r['cap']}"
        + (f", {r['routing']} routing" if r["routing"] != "base" else "")
        for r in rows
    ]
    bars = ax.bar(
        range(len(rows)),
        [r["inter_pod_mbps"] for r in rows],
        color=["tab:red" if not r["compliant"] else "tab:green" for r in rows],
    )
    for bar, r in zip(bars, rows, strict=True):
        if r["detected"]:
            bar.set_hatch("//")
            ttd = r["time_to_detection_s"]  # None: detected, with no compromise to time it from
            ax.annotate(
                "detected" if ttd is None else f"{ttd:g} s",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("effective inter-pod bandwidth (Mbit/s)")
    ax.set_title(f"{name}\ngreen = cap held, red = not; hatched = detected (time to detection)", fontsize=9)
    return fig
