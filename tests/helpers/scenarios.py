"""Lab scenarios the tests write: pod a attacked, probed or audited."""

from __future__ import annotations

from pathlib import Path

import yaml

from helpers.paths import ROOT


def attacked_pod_caps(rate: float | str, burst_bytes: int, b_rate: str = "1G") -> list[dict[str, object]]:
    """Scenario caps for pod a (`rate`, 2 s window) and b far above it (`b_rate`), so a's DPUs alone hold
    a's traffic."""
    return [
        {"pod": "a", "egress": rate, "ingress": rate, "window_s": 2, "burst_bytes": burst_bytes},
        {"pod": "b", "egress": b_rate, "ingress": b_rate, "window_s": 2, "burst_bytes": 1_000_000},
    ]


def probed_scenario(
    tmp_path: Path,
    checks: list[str],
    event: dict[str, object] | None,
    b_rate: str = "1G",
    burst_bytes: int = 100_000,
    **audit: object,
) -> Path:
    """Pod a capped at 8 Mbit/s (bucket `burst_bytes`) and sending only 4 for 6 s, b's cap far above
    (`b_rate`), audited by `checks` every second, with `event` (a compromise, say) if given."""
    doc = {
        "name": "probe",
        "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"),
        "caps": attacked_pod_caps("8M", burst_bytes, b_rate),
        "audit": {"interval_s": 1, "checks": checks, **audit},
        "phases": [
            {
                "name": "p",
                "duration_s": 6,
                "flows": [{"name": "a-to-b", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "4M"}],
                "events": [event] if event else [],
            }
        ],
    }
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def audited_scenario(
    tmp_path: Path, event: dict[str, object] | None, interval_s: float, burst_bytes: int = 100_000
) -> Path:
    """Pod a capped at 8 Mbit/s with `burst_bytes` and offered twice that for 8 s (b's cap far above, so a's
    DPU alone holds a's), audited every `interval_s`, with `event` (a compromise, say) if given."""
    doc = {
        "name": "audit",
        "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"),
        "caps": attacked_pod_caps("8M", burst_bytes),
        "audit": {"interval_s": interval_s},
        "phases": [
            {
                "name": "p",
                "duration_s": 8,
                "flows": [
                    {"name": "a-to-b", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "16M"},
                    {"name": "b-to-a", "protocol": "udp", "src": "b1", "dst": "a1", "rate": "4M"},
                ],
                "events": [event] if event else [],
            }
        ],
    }
    path = tmp_path / "audit.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
