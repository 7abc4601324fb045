"""Which pods the control plane caps, and where: the scenario's pods, or with router placement the
cells of pods behind each router; moving pods between routers through the control plane's API.

With router placement the limiter of router R (dpu-R) holds control-plane pod cell-R: the subnets
of the pods currently behind R, capped at the sum of their caps. A new routing period moves pods
between cells in two steps, as the control plane requires of any change: first every cell keeps
only the pods that stay (and the lesser of its old and new cap), then every cell gets its new
pods. A cell with no pod in between holds a placeholder prefix from RFC 5737's documentation range,
which no lab traffic uses (a control-plane pod needs a prefix).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap

from .config import CapSpec, PodSpec, Scenario

PLACEHOLDERS = ipaddress.IPv4Network("192.0.2.0/24")  # TEST-NET-1: never a lab address


@dataclass(frozen=True)
class ControlPod:
    """A pod as the control plane holds it: name, prefixes and cap (None: no cap)."""

    name: str
    prefixes: list[str]
    cap: CapSpec | None


def cell_name(router: str) -> str:
    """The control-plane pod of router `router`'s cell."""
    return f"cell-{router}"


def control_pods(sc: Scenario, assignment: dict[str, str]) -> list[ControlPod]:
    """What the control plane must hold for `assignment` (pod -> router; with router placement, pods
    it leaves out are in no cell)."""
    topo = sc.topology
    if topo.pods[0].placement != "router":
        return [ControlPod(p.name, [p.subnet], sc.cap_of(p.name)) for p in topo.pods]
    return [_cell(sc, i, r, [p for p in topo.pods if assignment.get(p.name) == r]) for i, r in enumerate(topo.routers)]


def _cell(sc: Scenario, index: int, router: str, members: list[PodSpec]) -> ControlPod:
    name = cell_name(router)
    if not members:
        return ControlPod(name, [str(ipaddress.IPv4Network((int(PLACEHOLDERS.network_address) + index, 32)))], None)
    caps = [sc.cap_of(p.name) for p in members]
    assert all(c is not None for c in caps)  # Scenario: router placement caps every pod
    first = caps[0]
    assert first is not None
    cap = first.model_copy(
        update={
            "pod": name,
            "egress": sum(c.egress for c in caps if c),
            "ingress": sum(c.ingress for c in caps if c),
            "burst_bytes": min(sum(c.burst_bytes for c in caps if c), (1 << 31) - 1),
        }
    )
    return ControlPod(name, [p.subnet for p in members], cap)


async def apply_pods(client: LimiterClient, pods: list[ControlPod]) -> None:
    """Declare each pod with its prefixes and set its cap."""
    for p in pods:
        await client.apply_pod(p.name, p.prefixes)
    for p in pods:
        if p.cap is not None:
            c = p.cap
            await client.set_pod_cap(p.name, Cap(c.egress, c.ingress, c.window_s, c.burst_bytes, c.rebalance, c.mode))


async def reroute(client: LimiterClient, sc: Scenario, old: dict[str, str], new: dict[str, str]) -> None:
    """Move the cells from assignment `old` to `new` (pods leave before others join), and wait."""
    if sc.topology.pods[0].placement != "router":
        return  # the pods' own limiters go with them: nothing to reprogram
    stay = {pod: r for pod, r in new.items() if old[pod] == r}
    between = []
    for before, after, kept in zip(control_pods(sc, old), control_pods(sc, new), control_pods(sc, stay), strict=True):
        cap = kept.cap
        if cap is not None and before.cap is not None and after.cap is not None:
            cap = cap.model_copy(
                update={
                    "egress": min(before.cap.egress, after.cap.egress),
                    "ingress": min(before.cap.ingress, after.cap.ingress),
                    "burst_bytes": min(before.cap.burst_bytes, after.cap.burst_bytes),
                }
            )
        between.append(ControlPod(kept.name, kept.prefixes, cap))
    await apply_pods(client, between)
    await apply_pods(client, control_pods(sc, new))
    await client.wait_converged(timeout=60)
