"""Workload descriptions (training, inference, exfiltration) expanded into traffic schedules for the simulator.

A spec is one of the pydantic models below, told apart by ``kind``; :func:`expand` turns it into
:class:`Stream` s of constant-rate :class:`Segment` s that the simulator replays. Units: rates in bit/s,
volumes in bytes, times in seconds. Volumes are application bytes and are offered as wire bit/s unchanged:
header overhead (a few percent) is ignored, which slightly flatters the sender.

Training kinds use the first host of each pod as that pod's sender and receiver: a pod's uplink cap applies
to the pod as a whole, so which node carries the traffic does not change what crosses the boundary.

Pure module: no I/O and no imports from the rest of the lab.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator

# A schedule longer than this is almost certainly a unit mistake (e.g. step_s in ms); refuse it rather than hang.
_MAX_SEGMENTS = 1_000_000


@dataclass(frozen=True)
class Segment:
    """A constant offered rate over ``[start_s, start_s + duration_s)``."""

    start_s: float  # relative to the workload's start
    duration_s: float
    rate_bps: float  # wire bit/s offered during the segment


@dataclass(frozen=True)
class Stream:
    """One sender-receiver pair and its schedule (segments sorted and non-overlapping)."""

    src: str
    dst: str
    segments: tuple[Segment, ...]
    label: str


class _Spec(BaseModel):
    # allow_inf_nan=False: an infinite rate or NaN step would silently produce empty or endless schedules.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _PairSpec(_Spec):
    src: str = Field(min_length=1)
    dst: str = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> _PairSpec:
        if self.src == self.dst:
            raise ValueError(f"src and dst must differ (both {self.src!r})")
        return self


class ConstantSpec(_PairSpec):
    """A constant rate from src to dst for the whole run."""

    kind: Literal["constant"] = "constant"
    rate: float = Field(gt=0)


class OnOffSpec(_PairSpec):
    """``rate`` for ``on_s``, silent for ``off_s``; on-periods start at ``phase_s + k*(on_s + off_s)``."""

    kind: Literal["on-off"] = "on-off"
    rate: float = Field(gt=0)
    on_s: float = Field(gt=0)
    off_s: float = Field(ge=0)
    phase_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _phase_within_period(self) -> OnOffSpec:
        if self.phase_s >= self.on_s + self.off_s:
            raise ValueError(f"phase_s={self.phase_s} must be < on_s + off_s = {self.on_s + self.off_s}")
        return self


def _unique_pods(v: list[str]) -> list[str]:
    dups = sorted({p for p in v if v.count(p) > 1})
    if dups:
        raise ValueError(f"pod names must be unique, repeated: {dups}")
    return v


class _TrainingSpec(_Spec):
    pods: list[str] = Field(min_length=2)
    model_params: float = Field(gt=0)
    bytes_per_param: float = Field(default=2.0, gt=0)  # 2 = bf16; 0.5 = 4-bit
    compression: float = Field(default=1.0, ge=1)  # divides every transferred volume
    step_s: float = Field(gt=0)
    link_bps: float = Field(default=100e9, gt=0)  # what a sender would use when unconstrained

    _check_pods = field_validator("pods")(_unique_pods)


class AllreduceRingSpec(_TrainingSpec):
    """Synchronous data-parallel training: one ring all-reduce of the gradients across pods every step.

    Each step, pod i sends :func:`ring_allreduce_bytes` to pod (i+1) % P as one burst at ``link_bps`` from the
    step's start. If that takes longer than ``step_s`` the burst fills the whole step ("saturated" in the label)
    and the schedule carries less than the formula's volume: the real run would slow down instead.
    """

    kind: Literal["allreduce-ring"] = "allreduce-ring"


class DilocoSpec(_TrainingSpec):
    """DiLoCo: ``inner_steps`` local steps with no inter-pod traffic, then one outer all-reduce; repeat.

    The outer all-reduce moves the same ring volume as :class:`AllreduceRingSpec` (pseudo-gradients are
    model-sized) at ``link_bps``; a round lasts ``inner_steps * step_s`` plus that transfer.
    """

    kind: Literal["diloco"] = "diloco"
    inner_steps: int = Field(ge=1)


class SwarmPipelineSpec(_Spec):
    """SWARM-style pipeline: stage i in ``pods[i]``; activations flow forward, their gradients backward.

    ``activation_bytes`` is the boundary tensor of one microbatch, for a transformer
    ``hidden_size * seq_len * microbatch_size * bytes_per_value``; the gradient sent back has the same size.
    """

    kind: Literal["swarm-pipeline"] = "swarm-pipeline"
    pods: list[str] = Field(min_length=2)
    activation_bytes: float = Field(gt=0)
    microbatches_per_step: int = Field(ge=1)
    step_s: float = Field(gt=0)
    compression: float = Field(default=1.0, ge=1)

    _check_pods = field_validator("pods")(_unique_pods)


class InferenceSpec(_Spec):
    """Serving: prompts flow from the client ``dst`` to the ``src`` hosts, generated tokens flow back.

    Both directions are modelled as constant rates (token streams are steady at this granularity), split
    evenly over the ``src`` hosts. ``prompt_tokens_per_s`` defaults to ``tokens_per_s``.
    """

    kind: Literal["inference"] = "inference"
    src: list[str] = Field(min_length=1)  # hosts of the serving pod
    dst: str = Field(min_length=1)
    tokens_per_s: float = Field(gt=0)
    prompt_tokens_per_s: float | None = Field(default=None, ge=0)
    bytes_per_token: float = Field(default=4.0, gt=0)  # a token id; raise it to model JSON/HTTP framing

    @model_validator(mode="after")
    def _dst_not_in_src(self) -> InferenceSpec:
        if self.dst in self.src or len(set(self.src)) != len(self.src):
            raise ValueError(f"src hosts must be unique and exclude dst; got src={self.src}, dst={self.dst!r}")
        return self


class ExfiltrationSpec(_PairSpec):
    """One bulk transfer of ``total_bytes`` (e.g. model_params * bytes_per_param) at ``rate`` from ``start_s``."""

    kind: Literal["exfiltration"] = "exfiltration"
    total_bytes: float = Field(gt=0)
    rate: float = Field(gt=0)
    start_s: float = Field(default=0.0, ge=0)


WorkloadSpec = Annotated[
    ConstantSpec | OnOffSpec | AllreduceRingSpec | DilocoSpec | SwarmPipelineSpec | InferenceSpec | ExfiltrationSpec,
    Field(discriminator="kind"),
]


class Workload(RootModel[WorkloadSpec]):
    """Any workload spec; named so that validation errors read "validation error for Workload"."""


def parse_workload(data: Mapping[str, Any]) -> WorkloadSpec:
    """Validate a mapping (e.g. from YAML) into a spec; raises pydantic.ValidationError naming field and value."""
    return Workload.model_validate(data).root


def ring_allreduce_bytes(spec: AllreduceRingSpec | DilocoSpec) -> float:
    """Bytes each pod sends to its ring neighbour for one all-reduce of the model's gradients."""
    # Ring all-reduce = reduce-scatter + all-gather, each P-1 rounds of 1/P of the data:
    # 2*(P-1)/P * N bytes per participant (Patarasuk & Yuan 2009; the NCCL "bus bandwidth" factor).
    p = len(spec.pods)
    return 2 * (p - 1) / p * spec.model_params * spec.bytes_per_param / spec.compression


def workload_step(spec: WorkloadSpec) -> tuple[float | None, float | None]:
    """(bytes each sender moves per step or round, the step's or round's compute time); None when not training."""
    if isinstance(spec, AllreduceRingSpec):
        return ring_allreduce_bytes(spec), spec.step_s
    if isinstance(spec, DilocoSpec):
        return ring_allreduce_bytes(spec), spec.inner_steps * spec.step_s
    if isinstance(spec, SwarmPipelineSpec):
        return spec.activation_bytes * spec.microbatches_per_step / spec.compression, spec.step_s
    return None, None


def total_bytes(stream: Stream) -> float:
    """Bytes the stream offers over its whole schedule."""
    return sum(s.rate_bps * s.duration_s / 8 for s in stream.segments)


def effective_slowdown(volume_bytes_per_step: float, step_s: float, cap_bps: float) -> float:
    """How many times longer a step takes when its inter-pod volume must fit through ``cap_bps``.

    Assumes perfect overlap of communication with computation (as Lucid grants the adversary): a step lasts
    max(step_s, volume*8/cap_bps), so the result is a lower bound; it is 1 when the volume already fits.
    """
    if not volume_bytes_per_step >= 0 or not step_s > 0 or not cap_bps > 0:
        args = f"volume_bytes_per_step={volume_bytes_per_step}, step_s={step_s}, cap_bps={cap_bps}"
        raise ValueError(f"need volume >= 0 and step_s, cap_bps > 0; got {args}")
    return max(1.0, volume_bytes_per_step * 8 / cap_bps / step_s)


def _si(value: float, unit: str, sep: str = " ") -> str:
    # Pick the prefix after rounding to 3 significant digits, so 999.96e9 prints as "1 T", not "1e+03 G".
    for scale, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale * 0.9995:
            return f"{value / scale:.3g}{sep}{prefix}{unit}"
    return f"{value:.3g}{sep}{unit}"


def _seconds(s: float) -> str:
    if s < 2 * 3600:
        return f"{s:.3g} s" if s < 100 else f"{s:,.0f} s"  # "1,200 s", not "1.2e+03 s"
    return f"{s / 3600:.3g} h" if s < 2 * 86400 else f"{s / 86400:.3g} days"


def _comp(compression: float) -> str:
    return "uncompressed" if compression == 1 else f"{compression:g}x compressed"


def _model(spec: AllreduceRingSpec | DilocoSpec) -> str:
    model = _si(spec.model_params, "", sep="")
    return f"{model}-parameter model, {_comp(spec.compression)}, 1 step per {spec.step_s:g} s"


def describe(spec: WorkloadSpec) -> str:
    """One line for reports: what the workload is and the volume it must move."""
    if isinstance(spec, ConstantSpec):
        return f"constant {spec.src}->{spec.dst}: {_si(spec.rate, 'bit/s')}"
    if isinstance(spec, OnOffSpec):
        avg = spec.rate * spec.on_s / (spec.on_s + spec.off_s)
        return (
            f"on-off {spec.src}->{spec.dst}: {_si(spec.rate, 'bit/s')} for {spec.on_s:g} s, off {spec.off_s:g} s "
            f"(average {_si(avg, 'bit/s')})"
        )
    if isinstance(spec, AllreduceRingSpec):
        vol = ring_allreduce_bytes(spec)
        return f"allreduce-ring over {len(spec.pods)} pods: {_model(spec)}: {_si(vol, 'B')} per step per pod"
    if isinstance(spec, DilocoSpec):
        vol = ring_allreduce_bytes(spec)
        return (
            f"diloco over {len(spec.pods)} pods: {_model(spec)}, outer sync every {spec.inner_steps} steps: "
            f"{_si(vol, 'B')} per sync per pod"
        )
    if isinstance(spec, SwarmPipelineSpec):
        vol = spec.activation_bytes * spec.microbatches_per_step / spec.compression
        return (
            f"swarm-pipeline over {len(spec.pods)} stages: {spec.microbatches_per_step} microbatches of "
            f"{_si(spec.activation_bytes, 'B')} per {spec.step_s:g} s step, {_comp(spec.compression)}: "
            f"{_si(vol, 'B')} each way per step per stage boundary ({_si(vol * 8 / spec.step_s, 'bit/s')})"
        )
    if isinstance(spec, InferenceSpec):
        prompt = spec.tokens_per_s if spec.prompt_tokens_per_s is None else spec.prompt_tokens_per_s
        return (
            f"inference {','.join(spec.src)}<->{spec.dst}: {_si(spec.tokens_per_s, 'tokens/s')} out "
            f"({_si(spec.tokens_per_s * spec.bytes_per_token * 8, 'bit/s')}), {_si(prompt, 'tokens/s')} in "
            f"({_si(prompt * spec.bytes_per_token * 8, 'bit/s')})"
        )
    return (
        f"exfiltration {spec.src}->{spec.dst}: {_si(spec.total_bytes, 'B')} at {_si(spec.rate, 'bit/s')} "
        f"from t={spec.start_s:g} s (takes {_seconds(spec.total_bytes * 8 / spec.rate)})"
    )


class _Builder:
    """Accumulates clipped segments, merging back-to-back ones of equal rate (a saturated burst per step)."""

    def __init__(self, duration_s: float) -> None:
        self.duration_s = duration_s
        self.segments: list[Segment] = []

    def add(self, start: float, end: float, rate: float) -> None:
        s, e = max(0.0, start), min(self.duration_s, end)
        if e <= s:
            return
        last = self.segments[-1] if self.segments else None
        # k*step + step and (k+1)*step may differ in the last bit; treat them as the same instant.
        if last and last.rate_bps == rate and math.isclose(last.start_s + last.duration_s, s, abs_tol=1e-9):
            self.segments[-1] = Segment(last.start_s, e - last.start_s, rate)
        else:
            self.segments.append(Segment(s, e - s, rate))

    def periodic(self, period: float, offset: float, on_s: float, rate: float) -> tuple[Segment, ...]:
        """On for ``on_s`` from ``offset + k*period`` for every integer k (0 <= offset < period)."""
        count = math.ceil(self.duration_s / period) + 1
        if count > _MAX_SEGMENTS:
            raise ValueError(f"schedule would need {count} periods of {period:g} s; limit {_MAX_SEGMENTS}")
        # k = -1 catches an on-period that started before 0 and is still running at 0.
        for k in range(-1, count):
            start = offset + k * period  # multiply, not accumulate, so long runs do not drift
            if start >= self.duration_s:
                break
            self.add(start, start + on_s, rate)
        return tuple(self.segments)


def _steady(duration_s: float, rate: float) -> tuple[Segment, ...]:
    return (Segment(0.0, duration_s, rate),)


def _host(hosts_by_pod: Mapping[str, Sequence[str]], field: str, name: str) -> str:
    if not any(name in hosts for hosts in hosts_by_pod.values()):
        raise ValueError(f"{field}={name!r} is not a host of any pod")
    return name


def _first_host(hosts_by_pod: Mapping[str, Sequence[str]], pod: str) -> str:
    hosts = hosts_by_pod.get(pod)
    if not hosts:
        raise ValueError(f"pods: {pod!r} is not a pod with hosts (known: {sorted(hosts_by_pod)})")
    return hosts[0]


def expand(spec: WorkloadSpec, hosts_by_pod: Mapping[str, Sequence[str]], duration_s: float) -> list[Stream]:
    """Turn a spec into streams whose schedules cover ``[0, duration_s)`` at most."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s={duration_s} must be a positive finite number")
    duration_s = float(duration_s)

    if isinstance(spec, ConstantSpec | OnOffSpec | ExfiltrationSpec):
        src, dst = _host(hosts_by_pod, "src", spec.src), _host(hosts_by_pod, "dst", spec.dst)
        b = _Builder(duration_s)
        if isinstance(spec, ConstantSpec):
            b.segments.extend(_steady(duration_s, spec.rate))
        elif isinstance(spec, OnOffSpec):
            b.periodic(spec.on_s + spec.off_s, spec.phase_s, spec.on_s, spec.rate)
        else:
            b.add(spec.start_s, spec.start_s + spec.total_bytes * 8 / spec.rate, spec.rate)
        return [Stream(src, dst, tuple(b.segments), f"{spec.kind} {src}->{dst}")]

    if isinstance(spec, AllreduceRingSpec | DilocoSpec):
        hosts = [_first_host(hosts_by_pod, p) for p in spec.pods]
        vol = ring_allreduce_bytes(spec)
        burst_s = vol * 8 / spec.link_bps
        streams = []
        for i, src in enumerate(hosts):
            dst = hosts[(i + 1) % len(hosts)]
            label = f"{spec.kind} {src}->{dst}"
            if isinstance(spec, AllreduceRingSpec):
                if burst_s > spec.step_s:
                    # The link cannot move a step's volume within the step: the burst fills every step and the
                    # schedule under-states the volume (training would slow down instead).
                    need = f"{_si(vol, 'B')} per step needs {_seconds(burst_s)} at {_si(spec.link_bps, 'bit/s')}"
                    label += f" (saturated: {need} > {spec.step_s:g} s step)"
                segs = _Builder(duration_s).periodic(spec.step_s, 0.0, min(burst_s, spec.step_s), spec.link_bps)
            else:
                # Basic DiLoCo blocks on the outer sync, so a round lasts H steps plus the transfer.
                quiet = spec.inner_steps * spec.step_s
                segs = _Builder(duration_s).periodic(quiet + burst_s, quiet, burst_s, spec.link_bps)
            streams.append(Stream(src, dst, segs, label))
        return streams

    if isinstance(spec, SwarmPipelineSpec):
        hosts = [_first_host(hosts_by_pod, p) for p in spec.pods]
        # Simplification: a step's microbatches are spread evenly over the step, so each boundary carries a
        # constant rate rather than per-microbatch bursts; the same bytes cross the boundary per step.
        rate = spec.activation_bytes * spec.microbatches_per_step / spec.compression * 8 / spec.step_s
        streams = []
        for up, down in itertools.pairwise(hosts):
            for src, dst, what in ((up, down, "activations"), (down, up, "gradients")):
                streams.append(Stream(src, dst, _steady(duration_s, rate), f"swarm-pipeline {what} {src}->{dst}"))
        return streams

    # InferenceSpec
    client = _host(hosts_by_pod, "dst", spec.dst)
    prompt = spec.tokens_per_s if spec.prompt_tokens_per_s is None else spec.prompt_tokens_per_s
    streams = []
    for h in spec.src:
        server = _host(hosts_by_pod, "src", h)
        flows = ((server, client, spec.tokens_per_s, "response"), (client, server, prompt, "request"))
        for src, dst, tokens, what in flows:
            if tokens == 0:
                continue  # prompt_tokens_per_s=0: a response-only model, no empty stream
            rate = tokens * spec.bytes_per_token * 8 / len(spec.src)
            streams.append(Stream(src, dst, _steady(duration_s, rate), f"inference {what} {src}->{dst}"))
    return streams
