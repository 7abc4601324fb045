"""`dpu-limiter apply -f` and `delete -f`: a manifest as one Apply or Delete request (all or nothing)."""

from __future__ import annotations

from ._proto.limiter.v1 import limiter_pb2 as pb
from .convert import cap_to_pb, dpu_to_pb, pod_to_pb, router_to_pb
from .manifest import Manifest


def apply_request(m: Manifest, dry_run: bool) -> pb.ApplyRequest:
    """Every object of the manifest, in its order (the server's errors name these positions)."""
    return pb.ApplyRequest(
        pods=[pod_to_pb(p) for p in m.pods],
        dpus=[dpu_to_pb(d) for d in m.dpus],
        caps=[pb.PodCap(pod=pod, cap=cap_to_pb(c)) for pod, c in m.caps.items()],
        routers=[router_to_pb(r) for r in m.routers],
        dry_run=dry_run,
    )


def delete_request(m: Manifest, dry_run: bool, missing_ok: bool) -> pb.DeleteRequest:
    """Everything the manifest names: its routers, caps, DPUs and pods (with their caps)."""
    return pb.DeleteRequest(
        pods=[p.name for p in m.pods],
        dpus=[d.name for d in m.dpus],
        caps=list(m.caps),
        routers=[r.name for r in m.routers],
        dry_run=dry_run,
        missing_ok=missing_ok,
    )
