"""Node-level placement (Amodo's): a pod's cap split into shares, one per node DPU of the pod.

Shares are computed in the data plane's own units (whole bytes per second, whole burst bytes) and
rounded down, so the sum of the shares never exceeds the pod's cap. Changing shares goes in two
steps, shrink before grow: first every node gets the smaller of its old and new share, and only
once all of them hold that does anyone get more, so at no instant do the granted shares add up to
more than the cap, also while a change is half applied.
"""

from __future__ import annotations

from .models import Cap


def split(cap: Cap, nodes: list[str]) -> dict[str, Cap]:
    """Equal static shares of `cap` for `nodes` (rounded down in bytes/s and bytes)."""
    if not nodes:
        return {}
    n = len(nodes)

    def share_bps(rate_bps: float) -> float:
        return (int(rate_bps / 8) // n) * 8.0

    one = Cap(share_bps(cap.egress_bps), share_bps(cap.ingress_bps), cap.window_s, cap.burst_bytes // n)
    return dict.fromkeys(nodes, one)


def lesser(a: Cap | None, b: Cap | None) -> Cap | None:
    """The smaller grant of two, field by field (None, no grant, is the smallest)."""
    if a is None or b is None:
        return None
    return Cap(
        min(a.egress_bps, b.egress_bps),
        min(a.ingress_bps, b.ingress_bps),
        min(a.window_s, b.window_s),
        min(a.burst_bytes, b.burst_bytes),
    )


def total(shares: dict[str, Cap | None]) -> tuple[float, float]:
    """Sum of egress and ingress rates granted."""
    granted = [c for c in shares.values() if c is not None]
    return sum(c.egress_bps for c in granted), sum(c.ingress_bps for c in granted)
