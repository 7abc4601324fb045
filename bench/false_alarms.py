"""A long clean run under the verifier's every check: how many alarms it raises (the goal: none).

    python bench/false_alarms.py [--seconds 600] [--time virtual|real] [--target embedded|bmv2]

Two pods on the lab's two-pods topology; pod a capped at 8 Mbit/s (100 kB bucket, 400 kB on bmv2, 2 s window) and
offered twice that, pod b far above and sending 4 Mbit/s to a; audited every second by read-back,
router-count, conservation and active probes (a burst at twice the cap in every interval), with
signed evidence. Nothing is compromised: every alert is a false alarm. Real time needs root (it
builds namespaces; calibration off, as in the tests).

In real time the lab also runs `dpu-limiter verify` as a site runs it (snmpd in the router's namespace,
dpu_lab.site): its alerts and evidence are printed on `verify` lines. It also says how late the audit's
sampler ran and how each capped pod's egress stood under the router-count check (`sampling:` and
`count:` lines): the most bytes between two readings of the router's counters at most the window
apart, against the cap's allowance; and, on the same samples, the most in a window of 0.1 s bins with
the 0.2 s of slack the check used before it judged readings (a late sample puts its whole delay in one
bin: issue 16's false alarm).

Last line: `time=... target=... seconds=... alerts=... false_alarms=... windows=... held=... violated=...
unverified=... evidence_verified=... cap_held=... wall_s=...`
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from dpu_lab.config import load_scenario
from dpu_lab.live_audit import SAMPLE_S, LiveAudit
from dpu_lab.report import Report
from dpu_verifier.checks import max_window_bytes

ROOT = Path(__file__).resolve().parent.parent


# Pod a's bucket: bmv2 queues up to 294 kB after the meter, which the cap must leave room for (as the tests do).
BURST_BYTES = {"embedded": 100_000, "bmv2": 400_000}


def scenario(path: Path, seconds: float, burst_bytes: int = BURST_BYTES["embedded"]) -> Path:
    """The clean audited scenario, `seconds` long, written to `path`."""
    doc = {
        "name": "false-alarms",
        "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"),
        "caps": [
            {"pod": "a", "egress": "8M", "ingress": "8M", "window_s": 2, "burst_bytes": burst_bytes},
            {"pod": "b", "egress": "24M", "ingress": "24M", "window_s": 2, "burst_bytes": 1_000_000},
        ],
        "audit": {"interval_s": 1, "checks": ["read-back", "router-count", "conservation", "probe"]},
        "phases": [
            {
                "name": "clean",
                "duration_s": seconds,
                "flows": [
                    {"name": "a-to-b", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "16M"},
                    {"name": "b-to-a", "protocol": "udp", "src": "b1", "dst": "a1", "rate": "4M"},
                ],
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def run(seconds: float, clock: str, target: str, out: Path) -> tuple[Report, float, LiveAudit | None]:
    """One clean run; its report, wall seconds and (real time) its live audit."""
    sc = load_scenario(scenario(out / "scenario.yaml", seconds, BURST_BYTES[target]))
    t0 = time.monotonic()
    if clock == "virtual":
        from dpu_lab.virtual import VirtualLabRun

        return VirtualLabRun(sc, out / "run", segment_bytes=8000).run(), time.monotonic() - t0, None
    from dpu_lab.runner import LabRun

    lab = LabRun(sc, out / "run", target, "builtin")  # type: ignore[arg-type]
    report = lab.run()
    return report, time.monotonic() - t0, lab.live


def sampling(live: LiveAudit) -> list[str]:
    """How late the live audit's sampler ran, and each capped pod's egress by readings and by bins."""
    assert live.auditor is not None
    first = next(iter(live.readings.values()))
    asked, answered = np.asarray(first.asked), np.asarray(first.answered)
    gaps = np.diff(asked)
    lines = [
        f"sampling: readings={asked.size} every={SAMPLE_S:g}s max_gap_s={gaps.max(initial=0):.3f} "
        f"gaps_over_{2 * SAMPLE_S:g}s={int((gaps > 2 * SAMPLE_S).sum())} "
        f"slowest_answer_s={(answered - asked).max(initial=0):.3f}"
    ]
    for cap in live.auditor.caps:
        key = (cap.pod, "egress")
        allowed = cap.terms(cap.egress_bps).allowance_bytes()
        most, span = live.readings[key].most_within(cap.window_s)
        tl = live.router[key]
        binned, slack = max_window_bytes(tl.bin_s, tl.bins, cap.window_s), int(cap.egress_bps * 2 * SAMPLE_S / 8)
        lines.append(
            f"count: {cap.pod} egress readings_most={most} span_s={span:.3f} allowed={allowed} "
            f"bins_most={binned} bins_allowed={allowed + slack} bins_would_alert={binned > allowed + slack}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0, help="how long the clean run lasts")
    ap.add_argument("--time", choices=("virtual", "real"), default="virtual")
    ap.add_argument("--target", choices=("embedded", "bmv2"), default="embedded", help="real time only")
    ap.add_argument("--keep", type=Path, help="keep the run's folder here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        report, wall, live = run(args.seconds, args.time, args.target, out)
    audit = report.audit or {}
    evidence = audit.get("evidence", {})
    verdicts = evidence.get("verdicts", {})
    for a in audit.get("alerts", []):
        print(f"alert at {a['t_s']:.1f} s: {a['check']} {a['where']}: {a['detail']}")
    if live is not None and live.readings:
        print("\n".join(sampling(live)))
    if (site := report.verifier) is not None:  # real time: `dpu-limiter verify` as a site runs it, over SNMP
        for a in site.get("alerts", []):
            print(f"verify alert at {a['t_s']:.1f} s: {a['check']} {a['where']}: {a['detail']}")
        held: dict[str, int] = {}
        for b in site.get("evidence", []):
            for verdict, n in b["verdicts"].items():
                held[verdict] = held.get(verdict, 0) + n
        bundles = site.get("evidence", [])
        print(
            f"verify: alerts={len(site.get('alerts', []))} false_alarms={site.get('false_alarms')} "
            f"bundles={len(bundles)} verified={all(b['verified'] for b in bundles) and bool(bundles)} "
            f"held={held.get('held', 0)} violated={held.get('violated', 0)} unverified={held.get('unverified', 0)}"
        )
    target = "embedded" if args.time == "virtual" else args.target
    print(
        f"time={args.time} target={target} seconds={args.seconds:g} alerts={len(audit.get('alerts', []))} "
        f"false_alarms={audit.get('false_alarms')} windows={evidence.get('windows')} held={verdicts.get('held', 0)} "
        f"violated={verdicts.get('violated', 0)} unverified={verdicts.get('unverified', 0)} "
        f"evidence_verified={evidence.get('verified')} cap_held={report.cap_held} wall_s={wall:.1f}"
    )


if __name__ == "__main__":
    main()
