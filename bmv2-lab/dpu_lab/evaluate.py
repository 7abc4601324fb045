"""Turning a run's measurements into the report (compliance from what crossed the pods' boundaries, the
receivers' view beside it), and configuring caps as a user would.

Shared by the real-time lab (namespaces, processes) and the virtual-time lab (simulation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from dpu_limiter.client import LimiterClient, as_dict
from dpu_limiter.models import Cap, Dpu, Role
from dpu_limiter.units import allowed_window_bytes

from . import boundary, measure
from .capture import Capture
from .config import CapSpec, EventSpec, Scenario
from .netns import SEAL_PORT
from .report import Direction, Flow, Phase, Report, Result
from .routing import apply_pods, control_pods

PlotSeries = dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]
Series = tuple[float, float, list[int]]


# A router's limiter is its cell's uplink.
ROLES = {"pod-uplink": Role.POD_UPLINK, "node": Role.NODE, "router": Role.POD_UPLINK}


@dataclass(frozen=True)
class LabDpu:
    """A limiter of the lab as the control plane is told of it."""

    name: str
    role: str
    pod: str
    address: str
    device_id: int
    buffer_bytes: int = 0  # its target's queues after the meter (targets.BUFFER_BYTES)


def host_macs(sc: Scenario) -> dict[str, str]:
    """Every host's MAC as text, by host name."""
    return {h: mac.hex(":") for h, mac in sc.topology.host_macs().items()}


def node_mac(sc: Scenario, d: LabDpu) -> str:
    """The MAC of the host a node limiter (dpu-HOST) fronts; "" for other limiters."""
    return host_macs(sc)[d.name.removeprefix("dpu-")] if d.role == "node" else ""


async def configure(client: LimiterClient, sc: Scenario, dpus: list[LabDpu]) -> None:
    """Declare pods, register each limiter, set caps, wait until every DPU holds them."""
    pods = control_pods(sc, sc.topology.assignment(0))
    for p in pods:
        await client.apply_pod(p.name, p.prefixes)
    for d in dpus:
        await client.register_dpu(
            Dpu(
                name=d.name,
                p4runtime_address=d.address,
                device_id=d.device_id,
                pod=d.pod,
                role=ROLES[d.role],
                host_port=0,
                uplink_port=1,
                buffer_bytes=d.buffer_bytes,
                node_mac=node_mac(sc, d),
                # A node DPU exempts intra-pod frames only through its crypto engine, on this port.
                seal_port=SEAL_PORT if d.role == "node" else None,
            )
        )
    await apply_pods(client, pods)
    await client.wait_converged(timeout=60)


def sealing_summary(sc: Scenario, stats: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """report.json's `sealing`: each node DPU's crypto engine's stats (by host), and per pair of pod mates
    the sealed bytes one sent the other against those the other opened from it (docs/exemption.md, item 2:
    a pod switch that diverts or drops sealed frames shows up as `missing_bytes`, though it carried only
    ciphertext). None without node placement."""
    if not stats:
        return None
    host_of = {mac: host for host, mac in host_macs(sc).items()}
    pairs = []
    for sender, st in sorted(stats.items()):
        mac = host_macs(sc)[sender]
        for dst, sent in sorted(st.get("sent_bytes", {}).items()):
            receiver = host_of.get(dst, dst)
            got = int(stats.get(receiver, {}).get("received_bytes", {}).get(mac, 0))
            pod = sc.topology.pod_of_host(sender).name
            row = {"pod": pod, "from": sender, "to": receiver, "sealed_bytes": int(sent), "opened_bytes": got}
            pairs.append(row | {"missing_bytes": max(0, int(sent) - got)})
    return {"engines": stats, "pairs": pairs, "missing_bytes": sum(p["missing_bytes"] for p in pairs)}


async def dpu_counters(addr: str) -> list[dict[str, object]]:
    """The DPUs' own usage counters at the end of a run, as JSON-ready rows."""
    async with LimiterClient(addr) as client:
        usage = await client.usage()
    return [as_dict(u) for u in usage.usage]


async def set_cap(client: LimiterClient, sc: Scenario, ev: EventSpec, wait: bool) -> None:
    """A set-cap event through the API: the pod's new rates, its scenario cap's window, burst and mode."""
    assert ev.pod is not None and ev.egress is not None and ev.ingress is not None
    cap = sc.cap_of(ev.pod)
    assert cap is not None
    await client.set_pod_cap(ev.pod, Cap(ev.egress, ev.ingress, cap.window_s, cap.burst_bytes, cap.rebalance, cap.mode))
    if wait:
        await client.wait_converged(timeout=60)


def directions(egress: float, ingress: float) -> list[tuple[Direction, float]]:
    """(direction, rate) pairs of a cap."""
    return [("egress", egress), ("ingress", ingress)]


def allowance_bytes(cap: CapSpec, rate: float) -> int:
    """Most bytes allowed in any window of the cap's length in one direction (report.json's rule)."""
    return allowed_window_bytes(rate, cap.window_s, cap.bucket_bytes())


def _merged(pieces: list[tuple[float, float, list[int]]], t_start: float) -> tuple[float, float, np.ndarray]:
    """Series merged on one grid (an empty one at ``t_start`` when there are none)."""
    if not pieces:
        return t_start, 0.001, np.zeros(0, dtype=np.int64)
    return measure.merge_series(pieces)  # type: ignore[arg-type]


def _most_in_window(bins: np.ndarray, bin_s: float, window_s: float) -> int:
    """The most bytes in any window of ``window_s`` (0 for an empty series)."""
    return measure.max_window_bytes(0.0, bin_s, list(bins), window_s) if len(bins) else 0


def receivers_view(sc: Scenario, captured: list[tuple[str, Capture]]) -> dict[tuple[str, str], list[Series]]:
    """The receivers' series per (pod, direction): egress of P = bytes attributed to P (IPv4 source or a
    lab frame's marker) arriving in other pods; ingress of P = bytes arriving at P's hosts from elsewhere."""
    topo = sc.topology
    addr_pod = {topo.address_of(h): topo.pod_of_host(h).name for p in topo.pods for h in p.hosts}
    parts: dict[tuple[str, str], list[Series]] = {}
    for host, cap in captured:
        dst_pod = topo.pod_of_host(host).name
        for src in cap.by_src:
            src_pod = addr_pod.get(src)
            if src_pod == dst_pod:
                continue
            one = cap.series(src)
            if src_pod is not None:
                parts.setdefault((src_pod, "egress"), []).append(one)
            parts.setdefault((dst_pod, "ingress"), []).append(one)
    return parts


def evaluate(
    sc: Scenario,
    captured: list[tuple[str, Capture]],
    crossed: Capture,
    phases: list[Phase],
    flows: list[Flow],
    t_start: float,
    duration: float,
    target: Literal["embedded", "bmv2"],
    traffic: str,
) -> tuple[Report, PlotSeries]:
    """Compliance per pod and direction from what crossed the pods' boundaries (``crossed``: the boundary
    capture, boundary.py), the receivers' view of the same beside it (``captured``: host, capture of one
    of its interfaces), and the plot series (``(pod, direction)``: the boundary's; ``(pod, direction
    + " (receivers)")``: the receivers')."""
    received = receivers_view(sc, captured)
    results: list[Result] = []
    plot: PlotSeries = {}
    for pod in sc.topology.pods:
        cap = sc.cap_of(pod.name)
        if cap is None:
            continue
        for direction, rate in directions(*sc.peak_rates(pod.name)):
            # Every frame on the pod's boundary links, whatever it holds: the verdict.
            kinds = boundary.verdict_kinds(direction, pod.placement)
            t0, bin_s, bins = _merged(boundary.series(crossed, pod.name, direction, kinds), t_start)
            total = int(np.sum(bins)) if len(bins) else 0
            # The receivers' attribution of the same traffic, shown beside it.
            r_t0, r_bin_s, r_bins = _merged(received.get((pod.name, direction), []), t_start)
            result = Result.evaluate(
                pod.name,
                direction,
                rate,
                cap.window_s,
                cap.bucket_bytes(),
                _most_in_window(bins, bin_s, cap.window_s),
                measure.delivered_bps(total, duration),
                boundary.lost_bytes(crossed, pod.name, direction, kinds),
            )
            result.boundary_bytes = total
            result.scaleup_bytes = boundary.total_bytes(crossed, pod.name, direction, ("scale-up",))
            result.receivers_bytes = int(np.sum(r_bins)) if len(r_bins) else 0
            result.receivers_max_window_bytes = _most_in_window(r_bins, r_bin_s, cap.window_s)
            results.append(result)
            for name, (s_t0, s_bin_s, s_bins) in (
                (direction, (t0, bin_s, bins)),
                (f"{direction} (receivers)", (r_t0, r_bin_s, r_bins)),
            ):
                if len(s_bins):
                    times, bps = measure.throughput_series(s_t0, s_bin_s, list(s_bins))
                    plot[(pod.name, name)] = (times - t_start, bps)
    report = Report(
        scenario=sc.name,
        target=target,
        traffic=traffic,
        duration_s=duration,
        results=results,
        flows=flows,
        phases=phases,
        boundary={
            "links": sorted({k.rsplit(" ", 2)[2] for k in crossed.by_src}),
            "kernel_drops": crossed.kernel_drops,
            "timestamps": crossed.timestamps,
        },
    )
    return report, plot
