"""What a write would change in the desired state, and whether the state it makes holds.

Pure functions of the state (they run in a worker thread while the event loop serves; the state is only
read): a write's changes, checked together against the state they would make, each check indexing the
state once (by pod, endpoint, MAC, prefix), so O(n log n) in the fleet's size. Errors name the request
field at fault (InvalidArgument, NotFound, AlreadyExists).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

from . import dataplane as dp
from . import shares
from .models import (
    MAX_POD_NODE_MACS,
    AlreadyExists,
    Cap,
    Change,
    DesiredState,
    Dpu,
    InvalidArgument,
    Kind,
    NotFound,
    Pod,
    Role,
    Router,
    Verb,
)

T = TypeVar("T")
Obj = TypeVar("Obj", Pod, Dpu, Cap, Router)


def _change(kind: Kind, name: str, before: Obj | None, after: Obj) -> Change:
    verb: Verb = "create" if before is None else "unchanged" if before == after else "update"
    return Change(verb, kind, name, before, after)


def planned_apply(
    base: DesiredState,
    pods: Sequence[tuple[str, Pod]],
    dpus: Sequence[tuple[str, Dpu]],
    caps: Sequence[tuple[str, str, Cap]],
    routers: Sequence[tuple[str, Router]],
    create_only: bool,
    rebalance_interval_s: float,
) -> tuple[list[Change], DesiredState]:
    """What a write of these objects would change in `base`, and the state it would make; raises
    InvalidArgument (NotFound, AlreadyExists) naming the first field at fault.

    Pure (runs in a worker thread, `base` is only read) and O(n log n) in the fleet's size: each check
    indexes the state once (by pod, endpoint, MAC, prefix) instead of comparing every pair.
    """
    st = base.copy()
    for where, dpu in dpus:
        if create_only and dpu.name in st.dpus:
            raise AlreadyExists(f"{where}.name", dpu.name, "a DPU with this name is already registered")
    changes = [_change("pod", pod.name, st.pods.get(pod.name), pod) for _, pod in pods]
    st.pods.update((pod.name, pod) for _, pod in pods)
    changes += [_change("dpu", dpu.name, st.dpus.get(dpu.name), dpu) for _, dpu in dpus]
    st.dpus.update((dpu.name, dpu) for _, dpu in dpus)
    changes += [_change("cap", pod, st.caps.get(pod), cap) for _, pod, cap in caps]
    st.caps.update((pod, cap) for _, pod, cap in caps)
    changes += [_change("router", r.name, st.routers.get(r.name), r) for _, r in routers]
    st.routers.update((r.name, r) for _, r in routers)
    # What the write leaves as it was is consistent with the rest of the state already (it passed these
    # checks when it was written), and every check is of a written object against all others: a
    # re-applied fleet's file checks only what changed.
    same = {(c.kind, c.name) for c in changes if c.verb == "unchanged"}
    pods = [(w, p) for w, p in pods if ("pod", p.name) not in same]
    dpus = [(w, d) for w, d in dpus if ("dpu", d.name) not in same]
    caps = [(w, pod, cap) for w, pod, cap in caps if ("cap", pod) not in same]
    routers = [(w, r) for w, r in routers if ("router", r.name) not in same]
    _check_routers(st, routers)
    check_prefixes(st, pods)
    _check_dpus(base, st, dpus)
    for where, pod, _ in caps:
        if pod not in st.pods:
            raise NotFound(f"{where}pod", pod, "no such pod")
    # Every pod whose cap or DPUs change must leave each of its DPUs room for a frame.
    # The error names the cap when the write sets it, else a DPU the write adds to the pod.
    cap_fields = {pod: f"{where}cap" for where, pod, _ in caps}
    written: dict[str, dict[str, str]] = {}  # pod -> {DPU written to it: its field}
    for where, dpu in dpus:
        written.setdefault(dpu.pod, {})[dpu.name] = where
    members = pod_members(st)
    for pod in dict.fromkeys([pod for _, pod, _ in caps] + [dpu.pod for _, dpu in dpus]):
        ours = [st.dpus[n] for n in members.get(pod, ())]
        mine = written.get(pod, {})
        first = next(iter(mine.values()), "dpu")
        blamed = {} if pod in cap_fields else {d.name: mine.get(d.name, first) for d in ours}
        _check_fits(st.caps.get(pod), ours, cap_fields.get(pod, "cap"), blamed, rebalance_interval_s)
    return changes, st


def planned_delete(
    base: DesiredState,
    pods: Sequence[tuple[str, str]],
    dpus: Sequence[tuple[str, str]],
    caps: Sequence[tuple[str, str]],
    routers: Sequence[tuple[str, str]],
    missing_ok: bool,
) -> tuple[list[Change], DesiredState]:
    """What deleting these (by name, with the field that named each) would change in `base`, and the
    state it would make; pure and O(n log n), like planned_apply."""
    st = base.copy()
    changes: list[Change] = []

    def known(table: dict[str, T], where: str, name: str, what: str) -> T | None:
        if name not in table and not missing_ok:
            raise NotFound(where, name, f"no such {what}")
        return table.get(name)

    for where, name in routers:
        if (router := known(st.routers, where, name, "router")) is not None:
            changes.append(Change("delete", "router", name, before=router))
            del st.routers[name]
    for where, name in caps:
        if (cap := known(st.caps, where, name, "cap (of pod)")) is not None:
            changes.append(Change("delete", "cap", name, before=cap))
            del st.caps[name]
    for where, name in dpus:
        if (dpu := known(st.dpus, where, name, "DPU")) is not None:
            changes.append(Change("delete", "dpu", name, before=dpu))
            del st.dpus[name]
    members = pod_members(st) if pods else {}
    behind_of: dict[str, list[str]] = {}
    for r in st.routers.values() if pods else ():
        for p in r.pods:
            behind_of.setdefault(p, []).append(r.name)
    for where, name in pods:
        if (pod := known(st.pods, where, name, "pod")) is None:
            continue
        left = sorted(members.get(name, ()))
        if left:
            raise InvalidArgument(where, name, f"pod still has DPUs {left}; delete them first (or with it)")
        behind = sorted(behind_of.get(name, ()))
        if behind:
            raise InvalidArgument(where, name, f"pod is behind routers {behind}; change or delete them first")
        if name in st.caps:
            changes.append(Change("delete", "cap", name, before=st.caps.pop(name)))
        changes.append(Change("delete", "pod", name, before=pod))
        del st.pods[name]
    # Routers and caps first, pods last: the store's references hold at every step.
    changes.sort(key=lambda c: ("router", "cap", "dpu", "pod").index(c.kind))
    return changes, st


def state_changes(old: DesiredState, new: DesiredState) -> list[Change]:
    """What turned `old` into `new` (another replica's writes, read back from the store), as the writes'
    own changes: pods, routers, DPUs and caps made or changed, then those deleted (caps first)."""
    made: list[Change] = []
    deleted: list[Change] = []
    _diff("pod", old.pods, new.pods, made, deleted)
    _diff("router", old.routers, new.routers, made, deleted)
    _diff("dpu", old.dpus, new.dpus, made, deleted)
    _diff("cap", old.caps, new.caps, made, deleted)
    return made + deleted[::-1]  # caps, DPUs and routers go before the pods they name


def _diff(kind: Kind, before: dict[str, Obj], after: dict[str, Obj], made: list[Change], deleted: list[Change]) -> None:
    for name, obj in after.items():
        if (was := before.get(name)) != obj:
            made.append(Change("create" if was is None else "update", kind, name, was, obj))
    deleted.extend(Change("delete", kind, n, obj) for n, obj in before.items() if n not in after)


def pod_members(st: DesiredState) -> dict[str, list[str]]:
    """Each pod's DPUs' names, in the state's order."""
    out: dict[str, list[str]] = {}
    for d in st.dpus.values():
        out.setdefault(d.pod, []).append(d.name)
    return out


def _span(prefix: str) -> tuple[int, int]:
    """The first and last address of a normalised IPv4 prefix ("10.0.1.0/24"), as integers."""
    addr, _, length = prefix.partition("/")
    a, b, c, d = addr.split(".")
    first = int(a) << 24 | int(b) << 16 | int(c) << 8 | int(d)
    return first, first | ((1 << (32 - int(length))) - 1)


def overlapping(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether any prefix of `a` overlaps any of `b` (normalised IPv4 prefixes)."""
    spans = [_span(q) for q in b]
    return any(first <= y and x <= last for p in a for first, last in [_span(p)] for x, y in spans)


def check_prefixes(st: DesiredState, pods: Sequence[tuple[str, Pod]]) -> None:
    """No prefix of a written pod may overlap another pod's.

    Two prefixes overlap only when one holds the other, so one sweep over every pod's prefixes in
    address order (each prefix before those it holds) finds them all: the prefixes holding the
    current one are the stack of those still open, and the nearest of another pod is a clash of
    both pods. Every pod with a clash gets one (if P's x holds Q's y, the first prefix of another
    pod than P's below x on the stack met one of P's), so O(n log n) in prefixes, whatever nests.
    """
    if not pods:
        return
    spans = sorted(
        (first, -last, pod.name, p) for pod in st.pods.values() for p in pod.ipv4_prefixes for first, last in [_span(p)]
    )
    clash: dict[str, tuple[str, str, str]] = {}  # pod -> (its prefix, the other pod's, the other pod)
    stack: list[tuple[int, str, str]] = []  # (last address, pod, prefix) of the prefixes holding this one
    for first, neg_last, name, p in spans:
        while stack and stack[-1][0] < first:
            stack.pop()
        for _, other, q in reversed(stack):  # at most 33 of one pod's own prefixes before another pod's
            if other != name:
                clash.setdefault(name, (p, q, other))
                clash.setdefault(other, (q, p, name))
                break
        stack.append((-neg_last, name, p))
    for where, pod in pods:
        if pod.name in clash:
            # Named by value, not index: the pod's prefixes are kept sorted, not in the request's order.
            p, q, other = clash[pod.name]
            raise InvalidArgument(f"{where}.ipv4_prefixes", p, f"overlaps {q} of pod {other!r}")


def _check_routers(st: DesiredState, routers: Sequence[tuple[str, Router]]) -> None:
    """Every written router lists known pods, none of which is behind another router."""
    if not routers:
        return
    order = {r.name: k for k, (_, r) in enumerate(routers)}
    owners: dict[str, list[str]] = {}  # pod -> the routers listing it, in the state's order
    for r in st.routers.values():
        for pod in r.pods:
            owners.setdefault(pod, []).append(r.name)
    for k, (where, r) in enumerate(routers):
        for pod in r.pods:  # named by value: a router's pods are kept sorted
            if pod not in st.pods:
                raise NotFound(f"{where}.pods", pod, "no such pod")
            for other in owners.get(pod, ()):
                # Two of this write listing one pod: the later one is at fault.
                if other != r.name and order.get(other, -1) < k:
                    raise InvalidArgument(f"{where}.pods", pod, f"already behind router {other!r}")


def _check_dpus(base: DesiredState, st: DesiredState, dpus: Sequence[tuple[str, Dpu]]) -> None:
    """Every written DPU names a pod and has an endpoint (address and device id) and node MAC of its own; of two
    that clash, the one that did not hold it before the write (`base`) is at fault, else the later one."""
    if not dpus:
        return
    endpoints: dict[tuple[str, int], list[str]] = {}
    macs: dict[str, list[str]] = {}
    peers: dict[str, int] = {}  # node MACs per pod
    for d in st.dpus.values():
        endpoints.setdefault((d.p4runtime_address, d.device_id), []).append(d.name)
        if d.node_mac:
            macs.setdefault(d.node_mac, []).append(d.name)
            peers[d.pod] = peers.get(d.pod, 0) + 1
    written = {dpu.name: (i, where) for i, (where, dpu) in enumerate(dpus)}
    for i, (where, dpu) in enumerate(dpus):
        if dpu.pod not in st.pods:
            raise NotFound(f"{where}.pod", dpu.pod, "no such pod; apply the pod first")
        if dpu.node_mac and peers[dpu.pod] > MAX_POD_NODE_MACS:
            # Each node DPU holds its pod's other nodes in limiter.p4's pod_peers table.
            raise InvalidArgument(
                f"{where}.node_mac", dpu.node_mac, f"pod {dpu.pod!r} would have more than {MAX_POD_NODE_MACS} node MACs"
            )
        had_endpoint, had_mac = functools.partial(_had_endpoint, base, dpu), functools.partial(_had_mac, base, dpu)
        for other in endpoints[(dpu.p4runtime_address, dpu.device_id)]:
            if (earlier := _clash(other, dpu.name, written, i, had_endpoint)) is not None:
                also = f"also given to DPU {other!r} at {earlier}"
                said = also if earlier else f"already registered as DPU {other!r}"
                raise AlreadyExists(
                    f"{where}.p4runtime_address", dpu.p4runtime_address, f"{said} with device id {dpu.device_id}"
                )
        # One node, one MAC: a MAC named twice would make one pod's exemption reach another's node.
        for other in macs.get(dpu.node_mac, ()) if dpu.node_mac else ():
            if (earlier := _clash(other, dpu.name, written, i, had_mac)) is not None:
                also = f"also given to DPU {other!r} at {earlier}"
                said = also if earlier else f"already the node MAC of DPU {other!r}"
                raise AlreadyExists(f"{where}.node_mac", dpu.node_mac, said)


def _clash(
    other: str, name: str, written: dict[str, tuple[int, str]], at: int, had: Callable[[str], bool]
) -> str | None:
    """Whether DPU `other` holding what the write's `at`-th DPU `name` asks for (an endpoint or a node MAC; `had`
    says whether a DPU held it before the write) is an error at `name`: None if not (it is `name` itself, or
    `name` held it before, or the write gives it to `other` later: the error is `other`'s then), else the field
    the write gives it to `other` at, or "" when `other` held it before or is not in the write."""
    if other == name:
        return None
    given = written.get(other)
    if given is None or had(other):
        return ""
    if had(name):
        return None
    return None if given[0] > at else given[1]


def _had_endpoint(base: DesiredState, dpu: Dpu, name: str) -> bool:
    """Whether DPU `name` had `dpu`'s endpoint before the write."""
    d = base.dpus.get(name)
    return d is not None and (d.p4runtime_address, d.device_id) == (dpu.p4runtime_address, dpu.device_id)


def _had_mac(base: DesiredState, dpu: Dpu, name: str) -> bool:
    """Whether DPU `name` had `dpu`'s node MAC before the write."""
    d = base.dpus.get(name)
    return d is not None and d.node_mac == dpu.node_mac


def _check_fits(
    cap: Cap | None, dpus: list[Dpu], cap_field: str, dpu_fields: dict[str, str], rebalance_interval_s: float
) -> None:
    """Refuse a cap (or DPU set) under which some DPU's buffer would leave it less than one frame.

    Each layer is checked under the grants its DPUs can get: equal shares, and with `rebalance` both
    the first grants (equal shares with rebalancing's smaller buckets, shares.node_burst) and the
    least a node can be granted by demand (its floor, when the others take the rest). The error
    names the DPU's buffer when that DPU is being written (in `dpu_fields`), else the cap.
    """
    if cap is None:
        return
    if not dpus:  # a cap no DPU could hold is refused before any DPU joins (and then blames the DPU)
        dpus = [Dpu("without-a-buffer", "", 0, "")]
    by_name = {d.name: d for d in dpus}
    for layer in dpu_layers(dpus):
        # The DPU with the largest buffer has the least left: when it fits, so do the others.
        buffer_bytes = max(by_name[n].buffer_bytes for n in layer)
        if _layer_fits(cap, len(layer), buffer_bytes, rebalance_interval_s):
            continue
        for grant, what in _grants(cap, len(layer), buffer_bytes, rebalance_interval_s):
            for n in layer:  # the first at fault in name order, as the error names it
                dp.check_fits(by_name[n], grant, what, dpu_fields.get(n), cap_field)


@functools.lru_cache(maxsize=1024)
def _layer_fits(cap: Cap, n: int, buffer_bytes: int, rebalance_interval_s: float) -> bool:
    """Whether a DPU with `buffer_bytes` in a layer of `n` has a frame left under every grant `cap` can
    give it (a fleet's pods mostly share a few caps and layer sizes: each is worked out once)."""
    probe = Dpu("probe", "", 0, "", buffer_bytes=buffer_bytes)
    try:
        for grant, what in _grants(cap, n, buffer_bytes, rebalance_interval_s):
            dp.check_fits(probe, grant, what)
    except InvalidArgument:
        return False
    return True


def _grants(cap: Cap, n: int, buffer_bytes: int, rebalance_interval_s: float) -> list[tuple[Cap, str]]:
    """The grants a DPU of a layer of `n` can hold under `cap` (each with how an error names it)."""
    equal = next(iter(shares.split(cap, [f"n{i}" for i in range(n)]).values()))
    what = "the pod's cap" if n == 1 else f"an equal share of the pod's cap ({n} DPUs)"
    if not cap.rebalance:
        return [(equal, what)]
    burst, _ = shares.node_burst(cap, n, rebalance_interval_s, buffer_bytes)
    least = shares.least_share(cap, n, burst)
    return [
        (dataclasses.replace(equal, burst_bytes=burst), f"{what} with rebalancing's bucket of {burst} bytes"),
        (least, f"the least share rebalancing grants a node ({n} DPUs)"),
    ]


def dpu_layers(dpus: list[Dpu]) -> list[list[str]]:
    """DPU names grouped by role (each group sorted): the layers of parallel devices of one pod."""
    by_role: dict[Role, list[str]] = {}
    for d in dpus:
        by_role.setdefault(d.role, []).append(d.name)
    return [sorted(names) for _, names in sorted(by_role.items())]
