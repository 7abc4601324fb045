"""Conversions between the API's protobuf messages and the control plane's models (both directions)."""

from __future__ import annotations

import functools

from ._proto.limiter.v1 import limiter_pb2 as pb
from .models import Cap, Change, Dpu, InvalidArgument, Pod, Role, Router

ROLE_FROM_PB = {
    pb.DPU_ROLE_UNSPECIFIED: Role.POD_UPLINK,
    pb.DPU_ROLE_POD_UPLINK: Role.POD_UPLINK,
    pb.DPU_ROLE_NODE: Role.NODE,
}
ROLE_TO_PB = {Role.POD_UPLINK: pb.DPU_ROLE_POD_UPLINK, Role.NODE: pb.DPU_ROLE_NODE}


def pod_to_pb(pod: Pod) -> pb.Pod:
    """Model to proto."""
    return pb.Pod(name=pod.name, ipv4_prefixes=list(pod.ipv4_prefixes))


def pod_from_pb(p: pb.Pod) -> Pod:
    """Proto to model, as the control plane answers it (checked there)."""
    return Pod(p.name, tuple(p.ipv4_prefixes))


def dpu_to_pb(d: Dpu) -> pb.Dpu:
    """Model to proto."""
    return pb.Dpu(
        name=d.name,
        p4runtime_address=d.p4runtime_address,
        device_id=d.device_id,
        pod=d.pod,
        role=ROLE_TO_PB[d.role],
        host_port=d.host_port,
        uplink_port=d.uplink_port,
        buffer_bytes=d.buffer_bytes,
        node_mac=d.node_mac,
        seal_port=d.seal_port,
    )


def cap_to_pb(cap: Cap) -> pb.Cap:
    """Model to proto."""
    return pb.Cap(
        egress_bps=cap.egress_bps,
        ingress_bps=cap.ingress_bps,
        window_s=cap.window_s,
        burst_bytes=cap.burst_bytes,
        rebalance=cap.rebalance,
        mode=pb.CAP_MODE_WINDOW if cap.mode == "window" else pb.CAP_MODE_RATE,
    )


def cap_from_pb(c: pb.Cap, field_prefix: str = "cap") -> Cap:
    """Proto to validated model."""
    modes = {pb.CAP_MODE_RATE: "rate", pb.CAP_MODE_WINDOW: "window"}
    if c.mode not in modes:
        raise InvalidArgument(f"{field_prefix}.mode", c.mode, "unknown mode")
    cap = Cap(c.egress_bps, c.ingress_bps, c.window_s, c.burst_bytes, c.rebalance, modes[c.mode])
    return Cap.validated(cap, field_prefix)


def dpu_from_pb(d: pb.Dpu, field_prefix: str = "dpu") -> Dpu:
    """Proto to validated model (an unset uplink port, with an unset host port, means 1)."""
    if d.role not in ROLE_FROM_PB:
        raise InvalidArgument(f"{field_prefix}.role", d.role, "unknown role")
    dpu = Dpu(
        d.name,
        d.p4runtime_address,
        d.device_id,
        d.pod,
        ROLE_FROM_PB[d.role],
        d.host_port,
        d.uplink_port if d.uplink_port or d.host_port else 1,
        d.buffer_bytes,
        d.node_mac,
        d.seal_port if d.HasField("seal_port") else None,
    )
    return Dpu.validated(dpu, field_prefix)


def describe(obj: Pod | Dpu | Cap | Router | None) -> str:
    """An object's values in words, as the CLI's diff shows them."""
    if obj is None:
        return ""
    if isinstance(obj, Pod):
        return ", ".join(obj.ipv4_prefixes)
    if isinstance(obj, Router):
        return f"pods {', '.join(obj.pods)}" if obj.pods else "no pods"
    if isinstance(obj, Dpu):
        return (
            f"{obj.p4runtime_address} device {obj.device_id}, pod {obj.pod}, {obj.role.value}, "
            f"ports host {obj.host_port} uplink {obj.uplink_port}, buffer {obj.buffer_bytes} B"
            + (f", node MAC {obj.node_mac}" if obj.node_mac else "")
            + (f", seal port {obj.seal_port}" if obj.seal_port is not None else "")
        )
    return _described_cap(obj)


@functools.lru_cache(maxsize=1024)
def _described_cap(cap: Cap) -> str:
    """A cap in words (a fleet's pods share a few caps: each is written out once)."""
    return (
        f"{cap.mode} mode, egress {cap.egress_bps / 1e6:g} Mbit/s, ingress {cap.ingress_bps / 1e6:g} Mbit/s, "
        f"window {cap.window_s:g} s, burst {cap.burst_bytes} B{', rebalance' if cap.rebalance else ''}"
    )


def change_to_pb(c: Change) -> pb.Change:
    """Model to proto."""
    return pb.Change(**change_fields(c))


def change_fields(c: Change) -> dict[str, str]:
    """A change's proto fields by name (a write's answer adds them in place: WriteResponse.changes.add)."""
    after = describe(c.after)
    before = after if c.verb == "unchanged" else describe(c.before)  # a re-applied file is mostly unchanged
    return {"verb": c.verb, "kind": c.kind, "name": c.name, "before": before, "after": after}


def router_to_pb(r: Router) -> pb.Router:
    """Model to proto."""
    return pb.Router(name=r.name, pods=list(r.pods))


def router_from_pb(r: pb.Router) -> Router:
    """Proto to model, as the control plane answers it (checked there)."""
    return Router(r.name, tuple(r.pods))
