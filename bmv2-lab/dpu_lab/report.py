"""A lab run's outputs: ``report.json``, ``throughput.png`` and ``summary.md``.

Rates are bit/s in JSON and Mbit/s in human-readable text. The plotting series are passed to
``write_report`` separately and never stored in ``report.json``, which stays small.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt
from matplotlib.figure import Figure

from dpu_limiter.units import allowed_window_bytes

Target = Literal["embedded", "bmv2"]
Direction = Literal["egress", "ingress"]
Protocol = Literal["udp", "tcp"]
# Plot series per (pod, direction): times (same time base as the phases) and bit/s.
PlotSeries = dict[tuple[str, str], tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclass
class Result:
    """Compliance of one pod in one direction; ``compliant`` means max window <= allowed.

    ``max_window_bytes`` and ``delivered_bps`` count what crossed the pod's boundary links (boundary.py:
    every frame, whatever it holds), which is what compliance is judged on; ``receivers_*`` are the
    receivers' attribution of the same traffic (by IPv4 source or a lab frame's marker), shown beside it.
    """

    pod: str
    direction: Direction
    cap_bps: float
    window_s: float
    allowed_window_bytes: int
    max_window_bytes: int
    delivered_bps: float
    compliant: bool
    burst_bytes: int = 0
    boundary_bytes: int | None = None  # every byte that crossed (None: a report from before it was counted)
    scaleup_bytes: int | None = None  # of which over scale-up links
    receivers_bytes: int | None = None
    receivers_max_window_bytes: int | None = None
    # The most bytes frames the boundary capture lost (its reader fell behind) can have held on this
    # pod's links in this direction; the verdict counts them as crossed in the busiest window.
    lost_bytes: int = 0

    def __post_init__(self) -> None:
        _check_choice("direction", self.direction, get_args(Direction))

    @property
    def verdict(self) -> str:
        """ "yes" (held, lost frames counted in), "no" (exceeded by what was counted) or "unknown" (only the
        lost frames could have broken it)."""
        if self.compliant:
            return "yes"
        return "no" if self.max_window_bytes > self.allowed_window_bytes else "unknown"

    @classmethod
    def evaluate(
        cls,
        pod: str,
        direction: Direction,
        cap_bps: float,
        window_s: float,
        burst_bytes: int,
        max_window_bytes: int,
        delivered_bps: float,
        lost_bytes: int = 0,
    ) -> Result:
        """Build a result: the allowance is cap/8 x window, the meter's burst bytes and one frame; it is
        compliant when the busiest window, with every byte lost frames can have held, fits."""
        allowed = allowed_window_bytes(cap_bps, window_s, burst_bytes)
        return cls(
            pod=pod,
            direction=direction,
            cap_bps=cap_bps,
            window_s=window_s,
            allowed_window_bytes=allowed,
            max_window_bytes=max_window_bytes,
            delivered_bps=delivered_bps,
            compliant=max_window_bytes + lost_bytes <= allowed,
            burst_bytes=burst_bytes,
            lost_bytes=lost_bytes,
        )


@dataclass
class Flow:
    """One traffic flow between pods, as offered by its sender and seen by its receiver."""

    name: str
    protocol: Protocol
    src_pod: str
    dst_pod: str
    offered_bps: float
    delivered_bps: float
    loss_ratio: float
    shape: str = ""  # an evasion flow's encapsulation and forged source (frames.shape), "" for plain traffic
    # TCP in virtual time: payload bytes delivered in order (delivered_bps counts wire bytes, and so
    # retransmissions), and the segments sent again.
    goodput_bps: float | None = None
    retransmissions: int | None = None

    def __post_init__(self) -> None:
        _check_choice("protocol", self.protocol, get_args(Protocol))


@dataclass
class Phase:
    """A named interval of the scenario, in the same time base as the plot series."""

    name: str
    start: float
    end: float


@dataclass
class Report:
    """Everything ``report.json`` holds about one run."""

    scenario: str
    target: Target
    duration_s: float
    results: list[Result]
    flows: list[Flow]
    phases: list[Phase] = field(default_factory=list)
    traffic: str = "builtin"  # the traffic generator: "iperf3", "builtin" or "simulated"
    time: str = "real"  # "virtual": simulated time on embedded targets
    # The DPUs' own counters at the end of the run (control plane's GetUsage): the limiter's view,
    # for comparison with the receiver-side figures above, which are what compliance is judged on.
    dpu_counters: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # faults injected during the run
    audit: dict[str, Any] | None = None  # the verifier's audit: alerts, detection (audit.Auditor.summary)
    workloads: list[dict[str, Any]] = field(default_factory=list)  # virtual.workload_result per workload
    calibration: dict[str, Any] | None = None  # real time: what the target carried here first (calibrate.py)
    # More than one router: who assigned pods to routers, and each period's assignment (pod -> router).
    routing: dict[str, Any] | None = None
    # Where the compliance figures were counted: the kinds of boundary link, and frames the capture lost
    # (kernel_drops > 0: the boundary counts are low; each result's lost_bytes bounds by how much).
    boundary: dict[str, Any] | None = None
    # Node placement: the crypto engines' stats and sealed bytes per pair of pod mates
    # (evaluate.sealing_summary); missing_bytes > 0: a pod switch diverted or dropped sealed frames.
    sealing: dict[str, Any] | None = None
    # Real time with an audit: `dpu-limiter verify` as a site runs it (site.py): its alerts on the run's
    # time base, detection, and its evidence bundles checked offline.
    verifier: dict[str, Any] | None = None
    # Why the run failed though its cap may have held (replicas_lab.problems): an outage, or an event that did not
    # run as the scenario wrote it. `lab run` exits non-zero when there is any.
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_choice("target", self.target, get_args(Target))

    @property
    def cap_held(self) -> bool:
        """True when there is at least one result and every result is compliant."""
        return bool(self.results) and all(r.compliant for r in self.results)

    def to_json(self) -> dict[str, Any]:
        """Return the report.json document."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        """Build a report from a parsed report.json document."""
        return cls(
            scenario=data["scenario"],
            target=data["target"],
            duration_s=float(data["duration_s"]),
            results=[Result(**r) for r in data["results"]],
            flows=[Flow(**f) for f in data["flows"]],
            phases=[Phase(**p) for p in data.get("phases", [])],
            traffic=str(data.get("traffic", "builtin")),
            time=str(data.get("time", "real")),
            dpu_counters=list(data.get("dpu_counters", [])),
            events=list(data.get("events", [])),
            audit=data.get("audit"),
            workloads=list(data.get("workloads", [])),
            calibration=data.get("calibration"),
            routing=data.get("routing"),
            boundary=data.get("boundary"),
            sealing=data.get("sealing"),
            verifier=data.get("verifier"),
            failures=list(data.get("failures", [])),
        )


def load_report(path: Path) -> Report:
    """Read ``report.json`` (a file or the output folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    return Report.from_json(json.loads(path.read_text()))


def write_report(out_dir: Path, report: Report, series: PlotSeries) -> None:
    """Write report.json, throughput.png and summary.md into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    plot_throughput(report, series).savefig(out_dir / "throughput.png", dpi=100)
    if report.audit is not None:
        plot_detection(report, series).savefig(out_dir / "detection.png", dpi=100)
    sealing = sealing_markdown(report.sealing)
    (out_dir / "summary.md").write_text(summary_markdown(report) + ("\n" + sealing if sealing else ""))


def sealing_markdown(summary: dict[str, Any] | None) -> str:
    """summary.md's tables of the node DPUs' crypto engines and of sealed bytes per pair; "" for none."""
    if not summary:
        return ""
    stats: dict[str, dict[str, Any]] = summary["engines"]
    lines = [
        "## The node DPUs' crypto engines",
        "",
        "Frames each engine sealed for the wire, and of those it received from the wire: opened under its pod's "
        "key (exempt at its DPU), not sealed, rejected (not authentic under the key), replayed; and frames it "
        "dropped.",
        "",
        "| host | sealed | sealed bytes (clear) | opened | opened bytes (sealed) | not sealed | rejected | replayed "
        "| dropped |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for host, st in sorted(stats.items()):
        o = st.get("opener", {})
        lines.append(
            f"| {host} | {st.get('sealed_frames', 0)} | {st.get('sealed_bytes', 0)} | {o.get('opened', 0)} | "
            f"{o.get('opened_bytes', 0)} | {o.get('not_sealed', 0)} | {o.get('rejected', 0)} | "
            f"{o.get('replayed', 0)} | {st.get('dropped', 0)} |"
        )
    lines += [
        "",
        "Sealed bytes (clear lengths) each node sent a pod mate, against those the pod mate opened from it: "
        "bytes missing never reached it (a pod switch diverted or dropped them).",
        "",
        "| pod | from | to | sealed bytes | opened bytes | missing bytes |",
        "|---|---|---|---:|---:|---:|",
    ]
    for p in summary["pairs"]:
        missing = f"**{p['missing_bytes']}**" if p["missing_bytes"] else "0"
        row = (p["pod"], p["from"], p["to"], p["sealed_bytes"], p["opened_bytes"], missing)
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def plot_throughput(report: Report, series: PlotSeries) -> Figure:
    """Return a figure with one subplot per result: throughput, cap, phases, compliance."""
    # Figure without pyplot renders with Agg and leaves no global state behind.
    rows = max(1, len(report.results))
    fig = Figure(figsize=(9, 2.6 * rows), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    if not report.results:
        axes[0].text(0.5, 0.5, "no results", ha="center", va="center", transform=axes[0].transAxes)
    for ax, result in zip(axes, report.results, strict=False):
        times, bps = series.get((result.pod, result.direction), (np.zeros(0), np.zeros(0)))
        ax.plot(times, bps / 1e6, drawstyle="steps-post", label="crossed (boundary)")
        r_times, r_bps = series.get((result.pod, f"{result.direction} (receivers)"), (np.zeros(0), np.zeros(0)))
        if len(r_times):
            ax.plot(r_times, r_bps / 1e6, drawstyle="steps-post", lw=0.8, ls="--", label="receivers' attribution")
        ax.axhline(result.cap_bps / 1e6, color="red", linestyle="--", label="cap")
        for index, phase in enumerate(report.phases):
            # Alternate the shade so that adjacent phases stay distinguishable.
            ax.axvspan(phase.start, phase.end, alpha=0.15 if index % 2 == 0 else 0.05, color="grey", lw=0)
            ax.text(phase.start, 0.97, f" {phase.name}", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
        for ev in report.events:  # injected faults (and, later, detections), on the same time base
            ax.axvline(float(ev["t_s"]), color="black", ls=":", lw=1)
            ax.text(
                float(ev["t_s"]),
                0.85,
                f" {ev['action']} {ev.get('dpu', '')}",
                transform=ax.get_xaxis_transform(),
                va="top",
                fontsize=7,
            )
        verdict = "yes" if result.compliant else "no"
        ax.set_title(f"{result.pod} {result.direction}: compliant {verdict}")
        ax.set_ylabel("Mbit/s")
        # Headroom above the cap line keeps it and the phase names readable.
        ax.set_ylim(0, 1.25 * max(result.cap_bps, float(bps.max(initial=0.0))) / 1e6 or 1.0)
        ax.legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("time (s)")
    fig.suptitle(f"{report.scenario} ({report.target})")
    return fig


def plot_detection(report: Report, series: PlotSeries) -> Figure:
    """Return the detection timeline: delivered throughput above, the audit's alerts per check below."""
    assert report.audit is not None
    fig = Figure(figsize=(9, 5), layout="constrained")
    top, lanes = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    # Effective inter-pod bandwidth: what left each capped pod, counted on its boundary links.
    peak = 0.0
    egress = [r for r in report.results if r.direction == "egress"]
    for result in egress:
        times, bps = series.get((result.pod, result.direction), (np.zeros(0), np.zeros(0)))
        (line,) = top.plot(times, bps / 1e6, drawstyle="steps-post", label=f"{result.pod} egress")
        top.axhline(result.cap_bps / 1e6, color=line.get_color(), linestyle="--", lw=1)
        peak = max(peak, float(bps.max(initial=0.0)))
    lowest_cap = min((r.cap_bps for r in egress), default=1e6)
    top.set_ylim(0, 1.3 * max(peak, lowest_cap) / 1e6)  # a far higher cap elsewhere would flatten the rest
    top.set_ylabel("crossed (Mbit/s)")
    top.legend(loc="upper left", fontsize=8)
    checks = list(report.audit["checks"])
    for i, check in enumerate(checks):
        hits = [a for a in report.audit["alerts"] if a["check"] == check]
        lanes.scatter([a["t_s"] for a in hits], [i] * len(hits), marker="v", s=60, zorder=3)
        for k, a in enumerate(hits):  # alerts at one instant are stacked so that their labels stay apart
            lanes.annotate(
                f" {a['where']}", (a["t_s"], i), xytext=(4, 8 * k - 4), textcoords="offset points", fontsize=7
            )
    lanes.set_yticks(range(len(checks)), checks)
    lanes.set_ylim(-0.7, len(checks) - 0.3)
    lanes.set_xlabel("time (s)")
    for ax in (top, lanes):
        for ev in report.events:
            ax.axvline(float(ev["t_s"]), color="red", ls=":", lw=1.5)
    for ev in report.events:
        what = f"{ev.get('how', ev['action'])}{' (forged)' if ev.get('forge') else ''}"
        where = ev.get("dpu", ev.get("pod", ""))
        top.text(float(ev["t_s"]), 0.97, f" {where}: {what}", transform=top.get_xaxis_transform(), va="top", fontsize=8)
    ttd = report.audit["time_to_detection_s"]
    found = (
        f"detected after {ttd:g} s" if ttd is not None else ("detected" if report.audit["detected"] else "not detected")
    )
    fig.suptitle(f"{report.scenario}: audit every {report.audit['interval_s']:g} s, {found}")
    return fig


def _mbit(bps: float) -> str:
    """Format a bit/s rate as Mbit/s for text."""
    return f"{bps / 1e6:.2f}"


def _count(n: int | None) -> str:
    """A byte count for text, or a dash where the report has none."""
    return "-" if n is None else str(n)


def _receivers_verdict(r: Result) -> str:
    """Whether the receivers' figures alone would have called the cap held."""
    if r.receivers_max_window_bytes is None:
        return "-"
    return "yes" if r.receivers_max_window_bytes <= r.allowed_window_bytes else "no"


def _views_disagree(r: Result) -> bool:
    """True when the receivers' verdict is not the boundary's."""
    return (
        r.receivers_max_window_bytes is not None
        and (r.receivers_max_window_bytes <= r.allowed_window_bytes) != r.compliant
    )


def summary_markdown(report: Report) -> str:
    """Return the short human-readable summary of a report."""
    lines = [
        f"# Lab run: {report.scenario}",
        "",
        f"Target: {report.target}, traffic: {report.traffic}, {report.time} time, duration {report.duration_s:.1f} s.",
        "",
        "## Caps",
        "",
        "Judged on every frame that crossed the pod's boundary, whatever it held (egress: what the router "
        "received on the pod's link; ingress: what the pod's uplink DPUs sent into it, or with no uplink DPU "
        "what the router sent; both ways over scale-up links); the receivers' attribution of the same "
        "traffic (by IPv4 source or lab marker) beside it.",
        "",
        "| pod | direction | cap (Mbit/s) | window (s) | max window bytes | allowed bytes "
        "| crossed (Mbit/s) | compliant | crossed bytes | of which scale-up | receivers' bytes "
        "| receivers' max window | receivers' verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r.pod} | {r.direction} | {_mbit(r.cap_bps)} | {r.window_s:g} | {r.max_window_bytes} "
        f"| {r.allowed_window_bytes} | {_mbit(r.delivered_bps)} | {r.verdict} "
        f"| {_count(r.boundary_bytes)} | {_count(r.scaleup_bytes)} | {_count(r.receivers_bytes)} "
        f"| {_count(r.receivers_max_window_bytes)} | {_receivers_verdict(r)} |"
        for r in report.results
    ]
    disagree = [r for r in report.results if _views_disagree(r)]
    if disagree:
        lines += [
            "",
            "The views disagree on "
            + ", ".join(f"{r.pod} {r.direction}" for r in disagree)
            + ": the receivers' verdict differs from what crossed the boundary (traffic they could not "
            "attribute, or that no receiver took).",
        ]
    if report.boundary is not None and report.boundary.get("kernel_drops"):
        lost = [r for r in report.results if r.lost_bytes]
        lines += [
            "",
            f"**The boundary capture lost {report.boundary['kernel_drops']} frames** (its reader fell behind): "
            "the crossed figures are low"
            + (
                "; the verdict takes what they can have held as crossed in the busiest window ("
                + ", ".join(f"{r.pod} {r.direction}: up to {r.lost_bytes} bytes" for r in lost)
                + "), and says unknown where only they could have broken the cap."
                if lost
                else ", though not on the links any verdict counts."
            ),
        ]
    lines += [
        "",
        "## Flows",
        "",
        "| flow | protocol | from | to | offered (Mbit/s) | delivered (Mbit/s) | loss (%) "
        "| goodput (Mbit/s) | retransmitted |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {f.name} | {f.protocol}{f' ({f.shape})' if f.shape else ''} | {f.src_pod} | {f.dst_pod} "
        f"| {_mbit(f.offered_bps)} | {_mbit(f.delivered_bps)} | {f.loss_ratio * 100:.2f} "
        f"| {'' if f.goodput_bps is None else _mbit(f.goodput_bps)} "
        f"| {'' if f.retransmissions is None else f.retransmissions} |"
        for f in report.flows
    ]
    if report.dpu_counters:
        lines += [
            "",
            "## The DPUs' own counters (not used for compliance)",
            "",
            "| pod | direction | exempt bytes | metered bytes | green bytes | red bytes (dropped) |",
            "|---|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {u['pod']} | {u['direction']} | {u.get('exempt_bytes', 0)} | {u.get('metered_bytes', 0)} "
            f"| {u.get('green_bytes', 0)} | {u.get('red_bytes', 0)} |"
            for u in report.dpu_counters
        ]
    if report.workloads:
        lines += [
            "",
            "## Workloads",
            "",
            "| phase | workload | effective inter-pod rate (Mbit/s) | volume per step | step (s) | slowdown |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for w in report.workloads:
            volume = f"{w['volume_per_step_bytes']:.4g} B" if "volume_per_step_bytes" in w else "-"
            step = f"{w['step_s']:g}" if "step_s" in w else "-"
            slow = w.get("slowdown")
            slowdown = "-" if "slowdown" not in w else ("never finishes" if slow is None else f"{slow:,.1f}x")
            lines.append(
                f"| {w['phase']} | {w['description']} | {_mbit(w['effective_bps'])} | {volume} | {step} | {slowdown} |"
            )
    if report.audit is not None:
        a = report.audit
        ttd = a["time_to_detection_s"]
        lines += [
            "",
            "## The verifier's audit",
            "",
            f"Checks every {a['interval_s']:g} s: {', '.join(a['checks'])}. "
            f"Compromises: {len(a['compromises'])}; detected: {'yes' if a['detected'] else 'no'}"
            + (f" after {ttd:g} s by {', '.join(a['detected_by'])}" if ttd is not None else "")
            + f"; false alarms: {a['false_alarms']}.",
            "",
            "| time (s) | check | where | what |",
            "|---:|---|---|---|",
        ]
        lines += [f"| {x['t_s']:g} | {x['check']} | {x['where']} | {x['detail']} |" for x in a["alerts"]]
    if report.routing is not None:
        r = report.routing
        periods = r["assignments"]
        lines += [
            "",
            "## Routing",
            "",
            "Pods assigned to routers "
            + ("by the operator" if r["assign"] == "operator" else "at random by the verifier")
            + (f", redrawn every {r['period_s']:g} s ({len(periods)} assignments)" if r["period_s"] else "")
            + ". First assignment: "
            + ", ".join(f"{pod} -> {router}" for pod, router in sorted(periods[0]["routers"].items()))
            + ".",
        ]
    if report.calibration is not None:
        c = report.calibration
        lines += [
            "",
            "## Calibration",
            "",
            f"{c['build']} on {c['cpu']} ({c['cores']} cores): carried {_mbit(c['capacity_bps'])} Mbit/s of "
            f"{_mbit(c['offered_bps'])} offered; the scenario needs {_mbit(c['needed_bps'])} ({c['verdict']}: "
            f"{c['note']}).",
        ]
    held = "yes" if report.cap_held else "no"
    if not report.cap_held and report.results and all(r.verdict != "no" for r in report.results):
        held = "unknown (the boundary capture lost frames that could have broken it)"
    lines += ["", f"Cap held: {held}", ""]
    if report.failures:
        lines += [
            f"**The run failed**{', though the cap held' if report.cap_held else ''}:",
            "",
            *(f"- {why}" for why in report.failures),
            "",
        ]
    return "\n".join(lines)
