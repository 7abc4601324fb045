"""Tests for dpu_lab.report: the three output files and the report.json schema."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpu_lab.report import Flow, Phase, Report, Result, load_report, write_report
from dpu_limiter.units import MAX_FRAME_BYTES


def _report() -> Report:
    return Report(
        scenario="two-pods-udp",
        target="bmv2",
        duration_s=10.0,
        results=[
            Result.evaluate("pod-a", "egress", 20e6, 1.0, 16_000, 2_400_000, 19.4e6),
            Result.evaluate("pod-b", "ingress", 20e6, 1.0, 16_000, 2_600_000, 20.1e6),
        ],
        flows=[Flow("a-to-b", "udp", "pod-a", "pod-b", 40e6, 19.4e6, 0.515)],
        phases=[Phase("warm-up", 0.0, 2.0), Phase("overload", 2.0, 10.0)],
    )


def _series() -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    times = np.arange(0.0, 10.0, 0.5)
    return {("pod-a", "egress"): (times, np.full(times.size, 19.4e6)), ("pod-b", "ingress"): (times, times * 2e6)}


def test_evaluate_computes_allowance_and_compliance() -> None:
    ok, over = _report().results
    assert ok.allowed_window_bytes == 2_500_000 + 16_000 + MAX_FRAME_BYTES
    assert ok.compliant and not over.compliant


def test_write_report_writes_three_files(tmp_path: Path) -> None:
    write_report(tmp_path / "out", _report(), _series())
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"report.json", "throughput.png", "summary.md"}
    assert (tmp_path / "out" / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "Cap held: no" in summary
    assert "| a-to-b | udp | pod-a | pod-b | 40.00 | 19.40 | 51.50 |" in summary


def test_report_json_has_schema_fields_with_types(tmp_path: Path) -> None:
    write_report(tmp_path, _report(), _series())
    data = json.loads((tmp_path / "report.json").read_text())
    assert isinstance(data["scenario"], str)
    assert data["target"] in ("embedded", "bmv2")
    assert isinstance(data["duration_s"], float)
    result_types = {
        "pod": str,
        "direction": str,
        "cap_bps": float,
        "window_s": float,
        "allowed_window_bytes": int,
        "max_window_bytes": int,
        "delivered_bps": float,
        "compliant": bool,
    }
    flow_types = {
        "name": str,
        "protocol": str,
        "src_pod": str,
        "dst_pod": str,
        "offered_bps": float,
        "delivered_bps": float,
        "loss_ratio": float,
        "shape": str,
    }
    for result in data["results"]:
        assert {k: type(result[k]) for k in result_types} == result_types
        assert result["direction"] in ("egress", "ingress")
    for flow in data["flows"]:
        assert {k: type(flow[k]) for k in flow_types} == flow_types
        assert flow["protocol"] in ("udp", "tcp")
    assert "series" not in data
    assert load_report(tmp_path) == _report()


def test_summary_says_cap_held_when_all_compliant(tmp_path: Path) -> None:
    report = _report()
    report.results = report.results[:1]
    write_report(tmp_path, report, {})
    assert "Cap held: yes" in (tmp_path / "summary.md").read_text()


def test_invalid_choices_are_rejected() -> None:
    with pytest.raises(ValueError, match="target"):
        Report("s", "tofino", 1.0, [], [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="direction"):
        Result.evaluate("p", "sideways", 1e6, 1.0, 0, 0, 0.0)  # type: ignore[arg-type]


def test_both_views_are_shown_and_a_disagreement_is_named(tmp_path: Path) -> None:
    report = _report()
    ok, over = report.results
    # What crossed a's boundary broke the cap; the receivers, who attributed less of it to a, saw it held.
    over.boundary_bytes, over.scaleup_bytes = 9_000_000, 0
    over.receivers_bytes, over.receivers_max_window_bytes = 4_000_000, 1_000_000
    ok.boundary_bytes, ok.scaleup_bytes, ok.receivers_bytes, ok.receivers_max_window_bytes = 5, 0, 5, 5
    report.boundary = {"links": ["router"], "kernel_drops": 0, "timestamps": "kernel"}
    write_report(tmp_path, report, _series())
    summary = (tmp_path / "summary.md").read_text()
    assert "| 9000000 | 0 | 4000000 | 1000000 | yes |" in summary  # crossed beside received, receivers' verdict
    assert "The views disagree on pod-b ingress" in summary and "pod-a egress" not in summary.split("disagree")[1]
    assert load_report(tmp_path) == report


def test_frames_the_capture_lost_count_as_crossed_and_can_only_make_the_verdict_unknown(tmp_path: Path) -> None:
    # 2,400,000 counted against 2,517,518 allowed: held, unless the lost frames can have held the rest.
    allowed = 2_500_000 + 16_000 + MAX_FRAME_BYTES
    fits = Result.evaluate("pod-a", "egress", 20e6, 1.0, 16_000, 2_400_000, 19.4e6, allowed - 2_400_000)
    unsure = Result.evaluate("pod-a", "egress", 20e6, 1.0, 16_000, 2_400_000, 19.4e6, allowed - 2_400_000 + 1)
    over = Result.evaluate("pod-b", "ingress", 20e6, 1.0, 16_000, 2_600_000, 20.1e6, 1_000)
    assert (fits.compliant, fits.verdict) == (True, "yes")
    assert (unsure.compliant, unsure.verdict) == (False, "unknown")
    assert (over.compliant, over.verdict) == (False, "no")
    report = _report()
    report.results = [unsure]
    report.boundary = {"links": ["router"], "kernel_drops": 3, "timestamps": "kernel"}
    assert not report.cap_held
    write_report(tmp_path, report, _series())
    summary = (tmp_path / "summary.md").read_text()
    assert "| unknown |" in summary and f"pod-a egress: up to {unsure.lost_bytes} bytes" in summary
    assert "Cap held: unknown" in summary
    assert load_report(tmp_path) == report
