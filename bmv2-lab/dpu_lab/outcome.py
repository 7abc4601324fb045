"""What a lab run ends with, written once for both clocks: each event's record, the audit's summary and
its evidence, the sealing engines' summary, the report's files and the verdict said on the console.

A real-time run (runner.py) and a virtual-time one (virtual.py) differ in how they make traffic and time;
what they report, and how, is here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpu_verifier.checks import Auditor

from .config import EventSpec, Scenario
from .evaluate import PlotSeries, sealing_summary
from .report import Report, write_report


def event_record(ev: EventSpec, t_s: float, scheduled_t_s: float) -> dict[str, object]:
    """The report's entry for a scenario event due `scheduled_t_s` into the run and carried out at `t_s` (later
    when what came before it held the run up)."""
    base: dict[str, object] = {"t_s": round(t_s, 3), "scheduled_t_s": round(scheduled_t_s, 3), "action": ev.action}
    if ev.action == "set-cap":
        return {**base, "pod": ev.pod, "egress": ev.egress, "ingress": ev.ingress}
    if ev.action == "restart-dpu":
        return {**base, "dpu": ev.dpu, "down_s": ev.down_for_s}
    return {**base, "dpu": ev.dpu, "how": ev.how, "forge": ev.forge}


def finish(
    sc: Scenario,
    out_dir: Path,
    report: Report,
    series: PlotSeries,
    events: list[dict[str, object]],
    auditor: Auditor | None,
    sealing: dict[str, dict[str, Any]],
    say: Callable[[str], None],
) -> Report:
    """Complete the report (events, audit and its evidence, sealing), write its files and say the verdict."""
    report.events = events
    if auditor is not None and sc.audit is not None:
        compromises = [e for e in events if e["action"] == "compromise"]
        broken = {f"{r.pod} {r.direction}" for r in report.results if r.verdict == "no"}
        report.audit = auditor.summary(sc.audit.interval_s, compromises, broken)
        report.audit["evidence"] = auditor.close_evidence()
        found = report.audit["alerts"]
        say(
            f"audit: {len(found)} alert(s)"
            + "".join(f"\n  {a['t_s']:.1f} s {a['check']} {a['where']}: {a['detail']}" for a in found)
        )
    report.sealing = sealing_summary(sc, sealing)
    write_report(out_dir, report, series)
    verdict = "[green]held[/]" if report.cap_held else "[red]NOT held[/]"
    if not report.cap_held and report.results and all(r.verdict != "no" for r in report.results):
        verdict = "[red]not shown to hold[/] (the boundary capture lost frames)"
    say(f"cap {verdict}; report in {out_dir}")
    for why in report.failures:
        say(f"[red]run failed[/]: {why}")
    return report
