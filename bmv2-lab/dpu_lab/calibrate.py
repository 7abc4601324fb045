"""Calibration before a real-time run: what this machine's target, traffic generator and veths carry.

A real-time result is only about the cap if the target forwards well above it: a switch that tops
out below the cap "holds" any cap. Before a scenario runs, the lab runs a short calibration of its
own: two pods, the same target kind and traffic generator, a cap far above any link, and one UDP
flow offered at twice the rate the scenario needs. What the receiver gets is the capacity.

The scenario needs, through any one limiter direction at once, the larger of the highest cap it
sets and the UDP load it offers. A capacity below 1.25 x the highest cap refuses the run (the cap
would not be what limits), or with `rescale` runs the scenario with every rate and burst scaled
down by the same factor until it fits, saying so (the report's caps and rates are then the scaled
ones: a result about the same cap-to-load ratios, at a smaller scale); a capacity below the offered
load is recorded as a warning (loss figures then include the target's own drops, the cap still binds).
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from .config import Scenario
from .report import Report
from .targets import BMV2_BINARY, TargetKind

CAL_SECONDS = 3.0
CAL_CEILING_BPS = 10e9  # never offer more than this in calibration
MARGIN = 1.25  # capacity must exceed the highest cap by this factor


class CalibrationError(RuntimeError):
    """The target cannot carry the scenario's cap on this machine."""


@dataclass(frozen=True)
class Calibration:
    """What calibration measured, as report.json records it."""

    target: str
    build: str
    cpu: str
    cores: int
    offered_bps: float
    capacity_bps: float
    needed_bps: float
    highest_cap_bps: float
    verdict: Literal["ok", "warning", "rescaled"]
    note: str
    scale: float = 1.0  # every rate and burst of the scenario was multiplied by this

    def as_dict(self) -> dict[str, object]:
        """report.json's `calibration` section."""
        return asdict(self)


def needed(sc: Scenario) -> tuple[float, float]:
    """(highest cap rate, highest UDP load offered through one pod and direction at once, the audit's
    probes included), bit/s."""
    caps = [max(sc.peak_rates(c.pod)) for c in sc.caps]
    factor = sc.audit.probe_factor if sc.audit is not None and "probe" in sc.audit.checks else 0.0
    probes = {(c.pod, "egress"): factor * sc.peak_rates(c.pod)[0] for c in sc.caps if factor}
    load = 0.0
    for ph in sc.phases:
        per = dict(probes)
        for f in ph.flows:
            if f.rate is None:
                continue
            src, dst = sc.topology.pod_of_host(f.src).name, sc.topology.pod_of_host(f.dst).name
            if src != dst:
                per[(src, "egress")] = per.get((src, "egress"), 0.0) + f.rate
                per[(dst, "ingress")] = per.get((dst, "ingress"), 0.0) + f.rate
        load = max([load, *per.values()])
    return max(caps, default=0.0), load


def calibration_scenario(rate_bps: float) -> Scenario:
    """Two pods, a cap far above the offered rate, one UDP flow at `rate_bps`."""
    return Scenario.model_validate(
        {
            "name": "calibration",
            "topology": {
                "name": "calibration",
                "pods": [
                    {"name": "a", "subnet": "10.0.1.0/24", "hosts": ["a1"]},
                    {"name": "b", "subnet": "10.0.2.0/24", "hosts": ["b1"]},
                ],
            },
            "caps": [
                {"pod": p, "egress": 400e9, "ingress": 400e9, "window_s": 1, "burst_bytes": (1 << 31) - 1}
                for p in ("a", "b")
            ],
            "phases": [
                {
                    "name": "flood",
                    "duration_s": CAL_SECONDS,
                    "flows": [{"name": "flood", "protocol": "udp", "src": "a1", "dst": "b1", "rate": rate_bps}],
                }
            ],
        }
    )


def build_of(kind: TargetKind) -> str:
    """The target's version string."""
    if kind == "bmv2":
        path = shutil.which(BMV2_BINARY)
        if path is None:
            return "not installed"
        res = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
        return f"{BMV2_BINARY} {(res.stdout or res.stderr).strip()}"
    from importlib.metadata import version

    return f"embedded target (dpu-limiter {version('dpu-limiter')})"


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def scaled(sc: Scenario, k: float, dpu_room: int = 0) -> Scenario:
    """The scenario with every cap rate, burst, UDP rate and set-cap rate multiplied by `k` (< 1).

    A burst is not scaled below what each of its pod's limiters needs to pass a frame (`dpu_room`
    bytes each: the target's buffer after the meter, ARP's bucket and one frame), or the control plane
    would refuse the cap; nor above what the scenario gave.
    """

    def rates(m: Any, *names: str) -> Any:
        return m.model_copy(update={n: getattr(m, n) * k for n in names if getattr(m, n) is not None})

    limiters = {p.name: max(1, len(p.limiters())) for p in sc.topology.pods}

    def burst(c: Any) -> int:
        return min(c.burst_bytes, max(int(c.burst_bytes * k), dpu_room * limiters.get(c.pod, 1)))

    caps = [rates(c, "egress", "ingress").model_copy(update={"burst_bytes": burst(c)}) for c in sc.caps]
    phases = [
        ph.model_copy(
            update={
                "flows": [rates(f, "rate") for f in ph.flows],
                "events": [rates(e, "egress", "ingress") for e in ph.events],
            }
        )
        for ph in sc.phases
    ]
    return sc.model_copy(update={"caps": caps, "phases": phases, "name": f"{sc.name} (rates x {k:.3g})"})


def calibrate(
    sc: Scenario,
    kind: TargetKind,
    run: Callable[[Scenario, Path], Report],
    out_dir: Path,
    console: Console,
    rescale: bool = False,
) -> Calibration:
    """Measure the capacity the scenario needs, with `run` (a lab run of the calibration scenario on the same
    target and traffic, its report in the given folder); raise CalibrationError when the cap would not be
    what limits (with `rescale`, return the factor that makes it fit instead: verdict "rescaled", `scale`)."""
    highest_cap, load = needed(sc)
    offered = min(CAL_CEILING_BPS, 2 * max(highest_cap, load))
    report = run(calibration_scenario(offered), out_dir)
    capacity = report.flows[0].delivered_bps
    base = dict(
        target=kind,
        build=build_of(kind),
        cpu=cpu_model(),
        cores=os.cpu_count() or 1,
        offered_bps=offered,
        capacity_bps=capacity,
        needed_bps=max(highest_cap, load),
        highest_cap_bps=highest_cap,
    )
    mbit = 1e6
    if capacity < MARGIN * highest_cap and rescale:
        # Three significant digits, rounded down: a factor a reader can apply by hand.
        k = capacity / (MARGIN * max(highest_cap, load))
        k = math.floor(k * 10 ** (2 - math.floor(math.log10(k)))) / 10 ** (2 - math.floor(math.log10(k)))
        note = (
            f"the target carries {capacity / mbit:.1f} Mbit/s, less than {MARGIN:g} x the highest cap of "
            f"{highest_cap / mbit:.1f} Mbit/s: every rate and burst scaled by {k:.3g} to fit"
        )
        console.print(f"[bold cyan]lab[/] [yellow]calibration: rescaled:[/] {note}")
        return Calibration(**base, verdict="rescaled", note=note, scale=k)  # type: ignore[arg-type]
    if capacity < MARGIN * highest_cap:
        raise CalibrationError(
            f"the {kind} target carries at most {capacity / mbit:.1f} Mbit/s here (calibrated, {CAL_SECONDS:g} s "
            f"at {offered / mbit:.1f} Mbit/s offered), less than {MARGIN:g} x the scenario's highest cap of "
            f"{highest_cap / mbit:.1f} Mbit/s: the switch, not the cap, would limit. Lower the scenario's rates "
            "and caps, let the lab scale them (--rescale), or run it with --time virtual"
        )
    if capacity < load:
        note = (
            f"the target carries {capacity / mbit:.1f} Mbit/s, less than the {load / mbit:.1f} Mbit/s offered: "
            "loss figures include its own drops (the cap still binds)"
        )
        console.print(f"[bold cyan]lab[/] [yellow]calibration warning:[/] {note}")
        return Calibration(**base, verdict="warning", note=note)  # type: ignore[arg-type]
    note = f"carries {capacity / mbit:.1f} Mbit/s, the scenario needs {max(highest_cap, load) / mbit:.1f}"
    console.print(f"[bold cyan]lab[/] calibration: the {kind} target {note}")
    return Calibration(**base, verdict="ok", note=note)  # type: ignore[arg-type]
