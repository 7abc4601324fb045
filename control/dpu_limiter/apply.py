"""`dpu-limiter apply -f`: diff a manifest against the control plane, then apply it through the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import grpc

from ._proto.limiter.v1 import limiter_pb2 as pb
from .client import LimiterClient
from .convert import cap_mode, dpu_to_pb
from .manifest import Manifest
from .models import Cap

Verb = Literal["create", "update", "unchanged", "conflict"]


@dataclass(frozen=True)
class Change:
    """One object's fate under the manifest."""

    verb: Verb
    kind: Literal["pod", "dpu", "cap"]
    name: str
    detail: str = ""


def _cap_text(c: Cap | pb.Cap) -> str:
    return (
        f"egress {c.egress_bps / 1e6:g} Mbit/s, ingress {c.ingress_bps / 1e6:g} Mbit/s, "
        f"window {c.window_s:g} s, burst {c.burst_bytes} B"
    )


async def plan_apply(client: LimiterClient, m: Manifest) -> list[Change]:
    """What applying `m` would change, object by object."""
    pods = {p.name: tuple(sorted(p.ipv4_prefixes)) for p in (await client.stub.ListPods(pb.ListPodsRequest())).pods}
    dpus = {d.name: d for d in (await client.stub.ListDpus(pb.ListDpusRequest())).dpus}
    out: list[Change] = []
    for pod in m.pods:
        have = pods.get(pod.name)
        want = tuple(sorted(pod.ipv4_prefixes))
        verb: Verb = "create" if have is None else "unchanged" if have == want else "update"
        out.append(Change(verb, "pod", pod.name, ", ".join(want)))
    for d in m.dpus:
        old = dpus.get(d.name)
        if old is None:
            out.append(Change("create", "dpu", d.name, f"{d.p4runtime_address} device {d.device_id}, pod {d.pod}"))
        elif old == dpu_to_pb(d):
            out.append(Change("unchanged", "dpu", d.name))
        else:
            out.append(
                Change("conflict", "dpu", d.name, "registered with other values; a DPU cannot be changed in place yet")
            )
    for pod_name, cap in m.caps.items():
        try:
            have_cap: pb.Cap | None = (await client.get_pod_cap(pod_name)).cap
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                raise
            have_cap = None
        same = have_cap is not None and (
            have_cap.egress_bps,
            have_cap.ingress_bps,
            have_cap.window_s,
            have_cap.burst_bytes,
            have_cap.rebalance,
            cap_mode(have_cap),
        ) == (cap.egress_bps, cap.ingress_bps, cap.window_s, cap.burst_bytes, cap.rebalance, cap.mode)
        verb = "create" if have_cap is None else "unchanged" if same else "update"
        detail = _cap_text(cap) if have_cap is None or same else f"{_cap_text(have_cap)} -> {_cap_text(cap)}"
        out.append(Change(verb, "cap", pod_name, detail))
    return out


async def apply(client: LimiterClient, m: Manifest, changes: list[Change]) -> None:
    """Apply the changes: pods, then DPUs, then caps (each validated again by the server)."""
    todo = {(c.kind, c.name) for c in changes if c.verb in ("create", "update")}
    for pod in m.pods:
        if ("pod", pod.name) in todo:
            await client.apply_pod(pod.name, list(pod.ipv4_prefixes))
    for d in m.dpus:
        if ("dpu", d.name) in todo:
            await client.register_dpu(dpu_to_pb(d))
    for pod_name, cap in m.caps.items():
        if ("cap", pod_name) in todo:
            await client.set_pod_cap(
                pod_name, cap.egress_bps, cap.ingress_bps, cap.window_s, cap.burst_bytes, cap.rebalance, cap.mode
            )
