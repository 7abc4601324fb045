"""Every way a DPU can be compromised, against `dpu-limiter verify` as a site runs it: detected, by which
check, how fast; and a clean run's false alarms.

    sudo python bench/verify_detection.py [--target embedded|bmv2] [--out DIR]

Each row is a real-time lab run of bmv2-lab/scenarios/site-verifier.yaml (pod a capped at 8 Mbit/s over
10 s windows and offered three times that, its DPU compromised 3 s in) with the row's compromise; the
lab starts snmpd in the router's namespace and `verify` beside it (dpu_lab.site). The verifier's figures
are its own: its alert lines on the run's time base. The lab's own audit (which counts every frame at
the router as it passes) is printed beside it, and whether the cap held on the wire (the boundary
capture). bmv2 cannot forge (dpu_lab.bmv2_firmware.NO_FORGE): its rows without forge only.

Last line: `target=... ways=... detected=... max_time_to_detect_s=... clean_false_alarms=... bundles_verified=...`
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from dpu_lab.config import EventSpec, load_scenario
from dpu_lab.runner import LabRun

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "bmv2-lab" / "scenarios" / "site-verifier.yaml"
WAYS = ["raise-meter", "delete-meter", "forward-unclassified", "load-pipeline"]
BMV2_BURST_BYTES = 400_000  # pod a's bucket on bmv2 (as bench/false_alarms.py and the tests give it)


def run(target: str, out: Path, how: str | None, forge: bool) -> dict[str, Any]:
    """One run with DPU a compromised `how` (None: clean); the verifier's and the lab's figures."""
    sc = load_scenario(SCENARIO)
    events = [] if how is None else [EventSpec(at_s=3, action="compromise", dpu="dpu-a", how=how, forge=forge)]
    sc = sc.model_copy(update={"phases": [sc.phases[0].model_copy(update={"events": events})]})
    if target == "bmv2":  # bmv2 queues up to 294 kB after the meter: the cap's bucket must leave room for it
        caps = [c.model_copy(update={"burst_bytes": BMV2_BURST_BYTES}) if c.pod == "a" else c for c in sc.caps]
        sc = sc.model_copy(update={"caps": caps})
    r = LabRun(sc, out, target, "builtin", console=Console(stderr=True, quiet=True)).run()  # type: ignore[arg-type]
    v, a = r.verifier or {}, r.audit or {}
    return {
        "how": how or "clean",
        "forge": forge,
        "verify_detected": v.get("detected"),
        "verify_s": v.get("time_to_detection_s"),
        "verify_by": ",".join(v.get("detected_by", [])),
        "verify_false": v.get("false_alarms"),
        "lab_s": a.get("time_to_detection_s"),
        "cap_held": r.cap_held,
        "bundles_ok": all(b["verified"] for b in v.get("evidence", [])) and bool(v.get("evidence")),
    }


def main() -> None:
    """Run every way, and a clean run; print a row each and the summary line."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=["embedded", "bmv2"], default="embedded")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out = args.out or Path(tempfile.mkdtemp(prefix="verify-detection-"))
    rows = [run(args.target, out / "clean", None, False)]
    for how in WAYS:
        for forge in (False, True) if args.target == "embedded" else (False,):
            rows.append(run(args.target, out / f"{how}-{'forged' if forge else 'plain'}", how, forge))
    print("| compromise | forge | verify detected | after (s) | by | false alarms | lab's audit (s) | cap held |")
    print("|---|---|---|---:|---|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['how']} | {'yes' if r['forge'] else 'no'} | {r['verify_detected']} | {r['verify_s']} | "
            f"{r['verify_by']} | {r['verify_false']} | {r['lab_s']} | {r['cap_held']} |"
        )
    ways = rows[1:]
    times = [r["verify_s"] for r in ways if r["verify_s"] is not None]
    print(
        f"target={args.target} ways={len(ways)} detected={sum(bool(r['verify_detected']) for r in ways)} "
        f"max_time_to_detect_s={max(times, default=float('nan')):.2f} clean_false_alarms={rows[0]['verify_false']} "
        f"bundles_verified={sum(r['bundles_ok'] for r in rows)}/{len(rows)}"
    )


if __name__ == "__main__":
    main()
