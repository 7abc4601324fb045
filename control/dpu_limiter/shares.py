"""Node-level placement (Amodo's): a pod's cap split into shares, one per node DPU of the pod.

Shares are computed in the data plane's own units (whole bytes per second, whole burst bytes) and
rounded down, so the sum of the shares never exceeds the pod's cap. Changing shares goes in two
steps, shrink before grow: first every node gets the smaller of its old and new share, and only
once all of them hold that does anyone get more, so at no instant do the granted shares add up to
more than the cap, also while a change is half applied.
"""

from __future__ import annotations

import dataclasses
import math

from .models import Cap


def split(cap: Cap, nodes: list[str]) -> dict[str, Cap]:
    """Equal static shares of `cap` for `nodes` (rounded down in bytes/s and bytes)."""
    if not nodes:
        return {}
    n = len(nodes)

    def share_bps(rate_bps: float) -> float:
        return (int(rate_bps / 8) // n) * 8.0

    one = dataclasses.replace(
        cap,
        egress_bps=share_bps(cap.egress_bps),
        ingress_bps=share_bps(cap.ingress_bps),
        burst_bytes=cap.burst_bytes // n,
        rebalance=False,
    )
    return dict.fromkeys(nodes, one)


def lesser(a: Cap | None, b: Cap | None) -> Cap | None:
    """The smaller grant of two, field by field (None, no grant, is the smallest)."""
    if a is None or b is None:
        return None
    if a.mode != b.mode:
        return None  # no grant is smaller than both: pass through the floor
    return Cap(
        min(a.egress_bps, b.egress_bps),
        min(a.ingress_bps, b.ingress_bps),
        min(a.window_s, b.window_s),
        min(a.burst_bytes, b.burst_bytes),
        mode=a.mode,
    )


def total(shares: dict[str, Cap | None]) -> tuple[float, float]:
    """Sum of egress and ingress rates granted."""
    granted = [c for c in shares.values() if c is not None]
    return sum(c.egress_bps for c in granted), sum(c.ingress_bps for c in granted)


def allocate(
    cap_bps: float, demands: dict[str, float], floor_frac: float = 0.05, headroom: float = 0.1
) -> dict[str, float]:
    """Max-min fair shares of `cap_bps` from measured demands (BwE-like water-filling).

    A node asking for less than its fair share gets its demand plus `headroom` (at least a floor, so
    an idle node can start); the rest split what remains equally; budget nobody asked for is spread
    evenly, so none is wasted. The result never sums to more than `cap_bps`.
    """
    if not demands:
        return {}
    floor = cap_bps * floor_frac / len(demands)
    want = {k: max(d * (1 + headroom), floor) for k, d in demands.items()}
    alloc: dict[str, float] = {}
    remaining = cap_bps
    pending = sorted(want, key=lambda k: want[k])
    while pending:
        fair = remaining / len(pending)
        k = pending[0]
        if want[k] > fair:
            for rest in pending:
                alloc[rest] = fair
            remaining = 0.0
            break
        alloc[k] = want[k]
        remaining -= want[k]
        pending.pop(0)
    if remaining > 0:
        for k in alloc:
            alloc[k] += remaining / len(alloc)
    return alloc


MIN_NODE_BURST = 16 * 1024  # several full frames: a node's bucket must pass whole frames


def node_burst(cap: Cap, nodes: int, interval_s: float, buffer_bytes: int = 0) -> tuple[int, int]:
    """(each node's bucket, changes allowed per window) for a pod that rebalances every `interval_s`.

    Every change rewrites meters, and a meter write refills its bucket. With at most C changes in a
    window and buckets of B / (nodes x (C + 1)), refills can never add up to more than the pod's
    burst B within one window: the cap's allowance (rate x window + B) still holds. A node's DPU
    programs its bucket less its buffer (dataplane.allowances), so a bucket is at least
    `buffer_bytes` (the largest node buffer) more than the smallest useful one.
    """
    changes = math.ceil(cap.window_s / interval_s)
    burst = max(cap.burst_bytes // (nodes * (changes + 1)), MIN_NODE_BURST + buffer_bytes)
    return burst, max(0, cap.burst_bytes // (nodes * burst) - 1)


def rebalanced(cap: Cap, egress: dict[str, float], ingress: dict[str, float], burst: int) -> dict[str, Cap]:
    """Node grants from measured demands (bit/s per node and direction), each with bucket `burst`."""
    nodes = sorted(egress)
    e, i = allocate(cap.egress_bps, egress), allocate(cap.ingress_bps, ingress)
    return {n: Cap(int(e[n] / 8) * 8.0, int(i[n] / 8) * 8.0, cap.window_s, burst, mode=cap.mode) for n in nodes}


def least_share(cap: Cap, nodes: int, burst: int) -> Cap:
    """The least grant `rebalanced` makes one of `nodes` nodes (bucket `burst`): what a node with no
    demand of its own gets while the others ask for all of the cap (its floor, in each direction).
    The control plane refuses a rebalancing cap under which that leaves a DPU less than one frame."""
    names = [f"n{i}" for i in range(nodes)]

    def demands(rate_bps: float) -> dict[str, float]:
        return {n: 0.0 if k == 0 else rate_bps for k, n in enumerate(names)}

    return rebalanced(cap, demands(cap.egress_bps), demands(cap.ingress_bps), burst)[names[0]]
