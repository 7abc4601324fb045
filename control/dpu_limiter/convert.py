"""Conversions between the API's protobuf messages and the control plane's models (both directions)."""

from __future__ import annotations

from ._proto.limiter.v1 import limiter_pb2 as pb
from .models import Cap, Dpu, InvalidArgument, Pod, Role

ROLE_FROM_PB = {
    pb.DPU_ROLE_UNSPECIFIED: Role.POD_UPLINK,
    pb.DPU_ROLE_POD_UPLINK: Role.POD_UPLINK,
    pb.DPU_ROLE_NODE: Role.NODE,
}
ROLE_TO_PB = {Role.POD_UPLINK: pb.DPU_ROLE_POD_UPLINK, Role.NODE: pb.DPU_ROLE_NODE}


def pod_to_pb(pod: Pod) -> pb.Pod:
    """Model to proto."""
    return pb.Pod(name=pod.name, ipv4_prefixes=list(pod.ipv4_prefixes))


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


def cap_from_pb(c: pb.Cap) -> Cap:
    """Proto to validated model."""
    modes = {pb.CAP_MODE_RATE: "rate", pb.CAP_MODE_WINDOW: "window"}
    if c.mode not in modes:
        raise InvalidArgument("cap.mode", c.mode, "unknown mode")
    return Cap.validated(Cap(c.egress_bps, c.ingress_bps, c.window_s, c.burst_bytes, c.rebalance, modes[c.mode]))


def cap_mode(c: pb.Cap) -> str:
    """A proto cap's mode as the models name it."""
    return "window" if c.mode == pb.CAP_MODE_WINDOW else "rate"
