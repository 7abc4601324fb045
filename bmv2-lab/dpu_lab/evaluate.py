"""Turning a run's receiver-side measurements into the report, and configuring caps as a user would.

Shared by the real-time lab (namespaces, processes) and the virtual-time lab (simulation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.units import allowed_window_bytes

from . import measure
from .capture import Capture
from .config import CapSpec, EventSpec, Scenario
from .report import Direction, Flow, Phase, Report, Result
from .routing import apply_pods, control_pods

PlotSeries = dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]


# A router's limiter is its cell's uplink.
ROLES = {"pod-uplink": pb.DPU_ROLE_POD_UPLINK, "node": pb.DPU_ROLE_NODE, "router": pb.DPU_ROLE_POD_UPLINK}


@dataclass(frozen=True)
class LabDpu:
    """A limiter of the lab as the control plane is told of it."""

    name: str
    role: str
    pod: str
    address: str
    device_id: int
    buffer_bytes: int = 0  # its target's queues after the meter (targets.BUFFER_BYTES)


async def configure(client: LimiterClient, sc: Scenario, dpus: list[LabDpu]) -> None:
    """Declare pods, register each limiter, set caps, wait until every DPU holds them."""
    pods = control_pods(sc, sc.topology.assignment(0))
    for p in pods:
        await client.apply_pod(p.name, p.prefixes)
    for d in dpus:
        await client.register_dpu(
            pb.Dpu(
                name=d.name,
                p4runtime_address=d.address,
                device_id=d.device_id,
                pod=d.pod,
                role=ROLES[d.role],
                host_port=0,
                uplink_port=1,
                buffer_bytes=d.buffer_bytes,
            )
        )
    await apply_pods(client, pods)
    await client.wait_converged(timeout=60)


async def dpu_counters(addr: str) -> list[dict[str, object]]:
    """The DPUs' own usage counters at the end of a run, as JSON-ready rows."""
    from google.protobuf import json_format

    async with LimiterClient(addr) as client:
        usage = await client.usage()
    return [
        json_format.MessageToDict(u, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        for u in usage.usage
    ]


async def set_cap(client: LimiterClient, sc: Scenario, ev: EventSpec, wait: bool) -> None:
    """A set-cap event through the API: the pod's new rates, its scenario cap's window, burst and mode."""
    assert ev.pod is not None and ev.egress is not None and ev.ingress is not None
    cap = sc.cap_of(ev.pod)
    assert cap is not None
    await client.set_pod_cap(ev.pod, ev.egress, ev.ingress, cap.window_s, cap.burst_bytes, cap.rebalance, cap.mode)
    if wait:
        await client.wait_converged(timeout=60)


def directions(egress: float, ingress: float) -> list[tuple[Direction, float]]:
    """(direction, rate) pairs of a cap."""
    return [("egress", egress), ("ingress", ingress)]


def allowance_bytes(cap: CapSpec, rate: float) -> int:
    """Most bytes allowed in any window of the cap's length in one direction (report.json's rule)."""
    return allowed_window_bytes(rate, cap.window_s, cap.bucket_bytes())


def evaluate(
    sc: Scenario,
    captured: list[tuple[str, Capture]],
    phases: list[Phase],
    flows: list[Flow],
    t_start: float,
    duration: float,
    target: Literal["embedded", "bmv2"],
    traffic: str,
) -> tuple[Report, PlotSeries]:
    """Compliance per pod and direction from the receivers' captures (host, capture of one of its
    interfaces), and the plot series."""
    topo = sc.topology
    addr_pod = {topo.address_of(h): topo.pod_of_host(h).name for p in topo.pods for h in p.hosts}
    # Receiver-side series per (pod, direction): egress of P = bytes from P arriving in other pods;
    # ingress of P = bytes arriving at P's hosts from other pods.
    parts: dict[tuple[str, str], list[tuple[float, float, list[int]]]] = {}
    for host, capture in captured:
        dst_pod = topo.pod_of_host(host).name
        for src in capture.by_src:
            src_pod = addr_pod.get(src)
            if src_pod == dst_pod:
                continue
            one = capture.series(src)
            if src_pod is not None:
                parts.setdefault((src_pod, "egress"), []).append(one)
            parts.setdefault((dst_pod, "ingress"), []).append(one)
    results: list[Result] = []
    plot: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for pod in topo.pods:
        cap = sc.cap_of(pod.name)
        if cap is None:
            continue
        for direction, rate in directions(*sc.peak_rates(pod.name)):
            pieces = parts.get((pod.name, direction), [])
            if pieces:
                t0, bin_s, bins = measure.merge_series(pieces)  # type: ignore[arg-type]
            else:
                t0, bin_s, bins = t_start, 0.001, np.zeros(0, dtype=np.int64)
            mwb = measure.max_window_bytes(t0, bin_s, list(bins), cap.window_s) if len(bins) else 0
            total = int(np.sum(bins)) if len(bins) else 0
            burst = cap.bucket_bytes()
            results.append(
                Result.evaluate(
                    pod.name,
                    direction,
                    rate,
                    cap.window_s,
                    burst,
                    mwb,  # type: ignore[arg-type]
                    measure.delivered_bps(total, duration),
                )
            )
            if len(bins):
                times, bps = measure.throughput_series(t0, bin_s, list(bins))
                plot[(pod.name, direction)] = (times - t_start, bps)
    report = Report(
        scenario=sc.name,
        target=target,
        traffic=traffic,
        duration_s=duration,
        results=results,
        flows=flows,
        phases=phases,
    )
    return report, plot
