"""Workload specs expand into schedules matching the volume formulas; bad specs are refused naming field and value."""

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dpu_lab.workloads import (
    AllreduceRingSpec,
    DilocoSpec,
    ExfiltrationSpec,
    OnOffSpec,
    Stream,
    describe,
    effective_slowdown,
    expand,
    parse_workload,
    ring_allreduce_bytes,
    total_bytes,
)

HOSTS = {"a": ["a1", "a2"], "b": ["b1", "b2"], "c": ["c1"], "d": ["d1"]}


def _check_schedule(stream: Stream, duration_s: float) -> None:
    """Segments are positive, sorted, non-overlapping and inside [0, duration_s]."""
    end = 0.0
    for seg in stream.segments:
        assert seg.duration_s > 0 and seg.rate_bps > 0
        assert seg.start_s >= end - 1e-9
        end = seg.start_s + seg.duration_s
    assert end <= duration_s + 1e-9


def _ring(**kw: Any) -> AllreduceRingSpec:
    spec = parse_workload({"kind": "allreduce-ring", **kw})
    assert isinstance(spec, AllreduceRingSpec)
    return spec


def test_allreduce_ring_volume_per_step_per_pod() -> None:
    spec = _ring(pods=["a", "b", "c", "d"], model_params=1e9, bytes_per_param=2, compression=4, step_s=1.0)
    model_bytes = 1e9 * 2
    per_step = 2 * 3 / 4 * model_bytes / 4
    assert ring_allreduce_bytes(spec) == pytest.approx(per_step)
    streams = expand(spec, HOSTS, duration_s=5.0)
    # First host of each pod, to the next pod's first host, wrapping around.
    assert [(s.src, s.dst) for s in streams] == [("a1", "b1"), ("b1", "c1"), ("c1", "d1"), ("d1", "a1")]
    for s in streams:
        _check_schedule(s, 5.0)
        assert len(s.segments) == 5
        assert [seg.start_s for seg in s.segments] == pytest.approx([0, 1, 2, 3, 4])
        assert all(seg.rate_bps == 100e9 for seg in s.segments)
        assert total_bytes(s) == pytest.approx(5 * per_step)
        assert "saturated" not in s.label


def test_compression_divides_volume() -> None:
    base = dict(pods=["a", "b", "c"], model_params=1e9, step_s=1.0)
    plain = expand(_ring(**base), HOSTS, 10.0)
    packed = expand(_ring(**base, compression=8), HOSTS, 10.0)
    assert total_bytes(plain[0]) == pytest.approx(8 * total_bytes(packed[0]))


def test_allreduce_saturated_burst_fills_each_step() -> None:
    spec = _ring(pods=["a", "b"], model_params=60e12, compression=8, step_s=10.0)
    (first, _) = expand(spec, HOSTS, duration_s=35.0)
    # 15 TB at 100 Gbit/s takes 1,200 s: every step is one long burst, merged into one segment.
    assert len(first.segments) == 1
    assert (first.segments[0].start_s, first.segments[0].duration_s) == (0.0, 35.0)
    assert total_bytes(first) == pytest.approx(100e9 * 35 / 8)
    assert "saturated" in first.label


def test_schedules_truncated_to_duration() -> None:
    spec = _ring(pods=["a", "b"], model_params=1e9, step_s=1.0)  # 2 GB bursts of 0.16 s
    (s, _) = expand(spec, HOSTS, duration_s=2.1)
    _check_schedule(s, 2.1)
    assert s.segments[-1].start_s == pytest.approx(2.0)
    assert s.segments[-1].duration_s == pytest.approx(0.1)


def test_diloco_quiet_then_outer_sync() -> None:
    spec = parse_workload(
        {"kind": "diloco", "pods": ["a", "b"], "model_params": 1e9, "step_s": 1.0, "inner_steps": 5, "link_bps": 1e9}
    )
    assert isinstance(spec, DilocoSpec)
    volume = 2 * 1 / 2 * 2e9  # 2 GB: 16 s at 1 Gbit/s
    assert ring_allreduce_bytes(spec) == pytest.approx(volume)
    streams = expand(spec, HOSTS, duration_s=100.0)
    assert [(s.src, s.dst) for s in streams] == [("a1", "b1"), ("b1", "a1")]
    segs = streams[0].segments
    # Rounds of 5 s quiet + 16 s sync: bursts at 5, 26, 47, 68, 89 (the last cut at 100).
    assert [x.start_s for x in segs] == pytest.approx([5, 26, 47, 68, 89])
    assert [x.duration_s for x in segs] == pytest.approx([16, 16, 16, 16, 11])
    assert total_bytes(streams[0]) == pytest.approx(4 * volume + 11 * 1e9 / 8)
    _check_schedule(streams[0], 100.0)


def test_swarm_pipeline_forward_and_backward() -> None:
    spec = parse_workload(
        {
            "kind": "swarm-pipeline",
            "pods": ["a", "b", "c"],
            "activation_bytes": 64e6,
            "microbatches_per_step": 32,
            "step_s": 10.0,
            "compression": 2,
        }
    )
    streams = expand(spec, HOSTS, duration_s=30.0)
    pairs = [(s.src, s.dst) for s in streams]
    assert pairs == [("a1", "b1"), ("b1", "a1"), ("b1", "c1"), ("c1", "b1")]
    per_step = 64e6 * 32 / 2
    for s in streams:
        _check_schedule(s, 30.0)
        assert total_bytes(s) == pytest.approx(3 * per_step)
    assert "activations" in streams[0].label and "gradients" in streams[1].label


def test_inference_constant_each_way_split_over_hosts() -> None:
    spec = parse_workload(
        {"kind": "inference", "src": ["a1", "a2"], "dst": "c1", "tokens_per_s": 1000, "prompt_tokens_per_s": 3000}
    )
    streams = expand(spec, HOSTS, duration_s=10.0)
    out = sum(total_bytes(s) for s in streams if s.dst == "c1")
    back = sum(total_bytes(s) for s in streams if s.src == "c1")
    assert out == pytest.approx(1000 * 4 * 10)
    assert back == pytest.approx(3000 * 4 * 10)
    assert {s.src for s in streams if s.dst == "c1"} == {"a1", "a2"}


def test_exfiltration_stops_after_total_bytes() -> None:
    spec = parse_workload(
        {"kind": "exfiltration", "src": "a1", "dst": "d1", "total_bytes": 1e9, "rate": 1e9, "start_s": 2.0}
    )
    (s,) = expand(spec, HOSTS, duration_s=60.0)
    assert len(s.segments) == 1
    assert s.segments[0].start_s == 2.0
    assert s.segments[0].duration_s == pytest.approx(8.0)
    assert total_bytes(s) == pytest.approx(1e9)
    # Truncated when the run ends first.
    (cut,) = expand(spec, HOSTS, duration_s=4.0)
    assert total_bytes(cut) == pytest.approx(2 * 1e9 / 8)


def test_constant_and_on_off_with_phase() -> None:
    (c,) = expand(parse_workload({"kind": "constant", "src": "a1", "dst": "b1", "rate": 1e6}), HOSTS, 7.0)
    assert total_bytes(c) == pytest.approx(1e6 * 7 / 8)
    spec = OnOffSpec(src="a1", dst="b1", rate=1e9, on_s=2, off_s=3, phase_s=4)
    (s,) = expand(spec, HOSTS, duration_s=12.0)
    # On at [4, 6), [9, 11) and the tail of the period that started at -1: [0, 1).
    assert [(x.start_s, x.duration_s) for x in s.segments] == [(0.0, 1.0), (4.0, 2.0), (9.0, 2.0)]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"kind": "allreduce-ring", "pods": ["a", "b"], "model_params": 6e13, "step_s": 10, "compression": 0.5},
         ["compression", "0.5"]),
        ({"kind": "allreduce-ring", "pods": ["a"], "model_params": 6e13, "step_s": 10}, ["pods", "['a']"]),
        ({"kind": "allreduce-ring", "pods": ["a", "a"], "model_params": 6e13, "step_s": 10}, ["pods", "unique"]),
        ({"kind": "diloco", "pods": ["a", "b"], "model_params": 1e9, "step_s": 1, "inner_steps": 0},
         ["inner_steps", "0"]),
        ({"kind": "constant", "src": "a1", "dst": "b1", "rate": -5}, ["rate", "-5"]),
        ({"kind": "constant", "src": "a1", "dst": "b1", "rate": 1e6, "colour": "red"}, ["colour", "red"]),
        ({"kind": "constant", "src": "a1", "dst": "a1", "rate": 1e6}, ["src", "dst", "a1"]),
        ({"kind": "on-off", "src": "a1", "dst": "b1", "rate": 1, "on_s": 1, "off_s": 1, "phase_s": 3},
         ["phase_s", "3"]),
        ({"kind": "exfiltration", "src": "a1", "dst": "b1", "total_bytes": float("inf"), "rate": 1},
         ["total_bytes", "inf"]),
        ({"kind": "teleport"}, ["kind", "teleport"]),
    ],
)  # fmt: skip
def test_validation_errors_name_field_and_value(data: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ValidationError) as err:
        parse_workload(data)
    for w in words:
        assert w in str(err.value)


def test_expand_rejects_unknown_hosts_pods_and_bad_duration() -> None:
    with pytest.raises(ValueError, match="dst='zz'"):
        expand(ExfiltrationSpec(src="a1", dst="zz", total_bytes=1, rate=1), HOSTS, 1.0)
    with pytest.raises(ValueError, match="'x'"):
        expand(_ring(pods=["a", "x"], model_params=1e9, step_s=1), HOSTS, 1.0)
    with pytest.raises(ValueError, match="duration_s=0"):
        expand(_ring(pods=["a", "b"], model_params=1e9, step_s=1), HOSTS, 0.0)
    with pytest.raises(ValueError, match="periods"):
        expand(_ring(pods=["a", "b"], model_params=1, step_s=1e-6), HOSTS, 10.0)


def test_describe() -> None:
    ring = _ring(pods=["a", "b"], model_params=60e12, compression=8, step_s=10)
    assert describe(ring) == (
        "allreduce-ring over 2 pods: 60T-parameter model, 8x compressed, 1 step per 10 s: 15 TB per step per pod"
    )
    exfil = parse_workload({"kind": "exfiltration", "src": "a1", "dst": "b1", "total_bytes": 120e12, "rate": 1e9})
    assert describe(exfil) == "exfiltration a1->b1: 120 TB at 1 Gbit/s from t=0 s (takes 11.1 days)"
    on_off = OnOffSpec(src="a1", dst="b1", rate=1e9, on_s=1, off_s=3)
    assert describe(on_off) == "on-off a1->b1: 1 Gbit/s for 1 s, off 3 s (average 250 Mbit/s)"
    swarm = parse_workload(
        {
            "kind": "swarm-pipeline",
            "pods": ["a", "b"],
            "activation_bytes": 1e9,
            "microbatches_per_step": 10,
            "step_s": 8,
        }
    )
    assert "10 GB each way per step" in describe(swarm) and "10 Gbit/s" in describe(swarm)
    assert "uncompressed" in describe(swarm)


def test_effective_slowdown() -> None:
    # 15 TB per 10 s step through 1 Gbit/s: 120,000 s of transfer per step -> 12,000x slower.
    assert effective_slowdown(15e12, 10.0, 1e9) == pytest.approx(12_000)
    assert effective_slowdown(1e6, 10.0, 1e9) == 1.0  # already fits: no slowdown
    assert effective_slowdown(0.0, 1.0, 1e9) == 1.0
    with pytest.raises(ValueError, match="cap_bps=0"):
        effective_slowdown(1.0, 1.0, 0.0)


# No deadline: a 10 ms on-period over 1000 s is 100,000 segments, slow on a busy machine by design.
@settings(deadline=None)
@given(
    rate=st.floats(1e3, 1e12),
    on_s=st.floats(0.01, 100),
    off_s=st.floats(0, 100),
    phase_frac=st.floats(0, 0.999),
    duration_s=st.floats(0.01, 1000),
)
def test_on_off_bounded_by_rate_and_inside_duration(
    rate: float, on_s: float, off_s: float, phase_frac: float, duration_s: float
) -> None:
    spec = OnOffSpec(src="a1", dst="b1", rate=rate, on_s=on_s, off_s=off_s, phase_s=phase_frac * (on_s + off_s))
    (s,) = expand(spec, HOSTS, duration_s)
    _check_schedule(s, duration_s)
    assert all(x.start_s >= 0 for x in s.segments)
    assert total_bytes(s) <= rate * duration_s / 8 * (1 + 1e-9)
    # Over whole periods the on-fraction holds; allow one period of slack at the edges.
    expected = rate / 8 * duration_s * on_s / (on_s + off_s)
    assert math.isclose(total_bytes(s), expected, abs_tol=rate / 8 * on_s + 1e-6 * expected)
