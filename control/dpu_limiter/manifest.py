"""Declarative files for `dpu-limiter apply -f`: pods, DPUs, caps and routers, or a lab topology.

    pods:  [{name: a, ipv4_prefixes: [10.0.1.0/24]}]
    dpus:  [{name: dpu-a, p4runtime_address: 10.9.0.1:9559, device_id: 1, pod: a,
             role: pod-uplink, host_port: 0, uplink_port: 1}]
    caps:  [{pod: a, egress: 1G, ingress: 1G, window_s: 60, burst_bytes: 0}]
    routers: [{name: r1, pods: [a]}]

A lab topology file (pods with `subnet`) is accepted too: its pods are imported with their subnet
as the pod's prefix, and its routers (names) with the pods its operator routing puts behind each.
Every value is validated by the same code as the API, and errors name the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .models import Cap, Dpu, InvalidArgument, Pod, Role, Router, cut
from .units import UnitError, parse_rate
from .yamlfile import YamlFileError, read_yaml


class ManifestError(ValueError):
    """The file is unreadable or invalid; the message names the file and the field."""


@dataclass
class Manifest:
    """Desired objects from one file."""

    pods: list[Pod] = field(default_factory=list)
    dpus: list[Dpu] = field(default_factory=list)
    caps: dict[str, Cap] = field(default_factory=dict)
    routers: list[Router] = field(default_factory=list)


def _items(doc: dict[str, Any], key: str, path: Path) -> list[dict[str, Any]]:
    items = doc.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ManifestError(f"{path}: {key}: must be a list of mappings")
    return items


# The keys each entry may have: a misspelt one (`burst:` for `burst_bytes:`) must not silently mean the default.
POD_KEYS = {"name", "ipv4_prefixes"}
DPU_KEYS = {
    "name",
    "p4runtime_address",
    "device_id",
    "pod",
    "role",
    "host_port",
    "uplink_port",
    "buffer_bytes",
    "node_mac",
    "seal_port",
}
CAP_KEYS = {"pod", "egress", "ingress", "window_s", "burst_bytes", "mode", "rebalance"}
ROUTER_KEYS = {"name", "pods"}


def _named(key: object) -> str:
    """A key as a field path or a list repeats it: cut (models.cut), so a megabyte key gives a short error."""
    text = str(key)
    if not text.isprintable():  # a line break or an escape sequence must not reach the terminal as such
        text = repr(text)
    return cut(text)


def _listed(keys: set[Any]) -> str:
    """Unknown keys as an error lists them: sorted, each cut, at most five."""
    names = [_named(k) for k in sorted(keys, key=str)]
    return str(names[:5])[:-1] + (f", ... {len(names) - 5} more]" if len(names) > 5 else "]")


def _check_keys(item: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(item) - allowed, key=str)
    if unknown:
        field_name = f"{where}.{_named(unknown[0])}"
        raise InvalidArgument(field_name, item[unknown[0]], f"unknown key (expected {sorted(allowed)})")


def _no_repeat(names: list[str], kind: str, suffix: str = "") -> None:
    first: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in first:
            raise InvalidArgument(f"{kind}[{i}]{suffix}", n, f"named twice (also {kind}[{first[n]}])")
        first[n] = i


def _get(item: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if key in item:
        return item[key]
    if default is ...:
        raise InvalidArgument(f"{where}.{key}", None, "is required")
    return default


def load_manifest(path: Path) -> Manifest:
    """Read and validate a manifest or a lab topology file."""
    try:
        doc = read_yaml(path)
    except YamlFileError as exc:
        raise ManifestError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{path}: must be a mapping with pods, dpus and/or caps")
    # A lab topology's own keys (its name, routers, routing, scale-up links) say nothing to the control plane.
    unknown = set(doc) - {"pods", "dpus", "caps", "name", "routers", "routing", "scaleup_links"}
    if unknown:
        raise ManifestError(f"{path}: unknown keys {_listed(unknown)} (expected pods, dpus, caps)")
    m = Manifest()
    try:
        for i, item in enumerate(_items(doc, "pods", path)):
            where = f"pods[{i}]"
            if "subnet" not in item:  # a lab topology's pod has the lab's keys too, which the lab checks
                _check_keys(item, POD_KEYS, where)
            name = _text(item, "name", where)
            prefixes = [item["subnet"]] if "subnet" in item else _get(item, "ipv4_prefixes", where)
            if not isinstance(prefixes, list):
                raise InvalidArgument(f"{where}.ipv4_prefixes", prefixes, "must be a list")
            m.pods.append(Pod.validated(name, prefixes, where))
        for i, item in enumerate(_items(doc, "dpus", path)):
            where = f"dpus[{i}]"
            _check_keys(item, DPU_KEYS, where)
            role = _get(item, "role", where, "pod-uplink")
            try:
                role_v = Role(role)
            except ValueError:
                raise InvalidArgument(f"{where}.role", role, f"must be one of {[r.value for r in Role]}") from None
            dpu = Dpu(
                _text(item, "name", where),
                _text(item, "p4runtime_address", where),
                _int(item, "device_id", where, None),
                _text(item, "pod", where),
                role_v,
                _int(item, "host_port", where, 0),
                _int(item, "uplink_port", where, 1),
                _int(item, "buffer_bytes", where, 0),
                _text(item, "node_mac", where, ""),
                None if item.get("seal_port") is None else _int(item, "seal_port", where, None),
            )
            m.dpus.append(Dpu.validated(dpu, where))
        caps = _items(doc, "caps", path)
        _no_repeat([str(item.get("pod")) for item in caps], "caps", ".pod")
        for i, item in enumerate(caps):
            where = f"caps[{i}]"
            _check_keys(item, CAP_KEYS, where)
            pod = _text(item, "pod", where)
            rates = {}
            for key in ("egress", "ingress"):
                try:
                    rates[key] = parse_rate(_get(item, key, where), f"{where}.{key}")
                except UnitError as exc:
                    reason = str(exc).removeprefix(f"{where}.{key}: ")
                    raise InvalidArgument(f"{where}.{key}", item.get(key), reason) from None
            window = item.get("window_s")
            if not isinstance(window, int | float) or isinstance(window, bool):
                raise InvalidArgument(f"{where}.window_s", window, "must be a number of seconds")
            rebalance = item.get("rebalance", False)
            if not isinstance(rebalance, bool):
                raise InvalidArgument(f"{where}.rebalance", rebalance, "must be true or false")
            mode = item.get("mode", "rate")
            cap = Cap(
                rates["egress"],
                rates["ingress"],
                float(window),
                _int(item, "burst_bytes", where, 0),
                rebalance,
                str(mode),
            )
            m.caps[pod] = Cap.validated(cap, where)
        m.routers = _routers(doc, path)
        _no_repeat([p.name for p in m.pods], "pods", ".name")
        _no_repeat([d.name for d in m.dpus], "dpus", ".name")
        _no_repeat([r.name for r in m.routers], "routers", ".name")
    except InvalidArgument as exc:
        raise ManifestError(f"{path}: {exc}") from None
    return m


def _routers(doc: dict[str, Any], path: Path) -> list[Router]:
    """A manifest's routers (mappings), or a lab topology's (names, with its operator routing)."""
    items = doc.get("routers") or []
    if not isinstance(items, list):
        raise ManifestError(f"{path}: routers: must be a list")
    if all(isinstance(i, str) for i in items):  # a lab topology: pods go where its routing puts them
        routing = doc.get("routing") or {}
        operator = isinstance(routing, dict) and routing.get("assign", "operator") == "operator"
        placed = routing.get("pods", {}) if operator else {}
        if not isinstance(placed, dict):
            raise InvalidArgument("routing.pods", placed, "must map pods to routers")
        for pod, router in placed.items():
            if not isinstance(router, str) or router not in items:
                known = _listed(set(items))
                raise InvalidArgument(f"routing.pods.{_named(pod)}", router, f"unknown router (routers: {known})")
        behind: dict[str, list[str]] = {r: [] for r in items}
        for pod in (str(p.get("name")) for p in _items(doc, "pods", path)):
            # The lab's rule: unplaced pods, the first router. Randomised routing: nobody's, until dealt.
            router = placed.get(pod, items[0] if items else None) if operator else None
            if router in behind:
                behind[router].append(pod)
        return [Router.validated(r, pods, f"routers[{i}]") for i, (r, pods) in enumerate(behind.items())]
    out = []
    for i, item in enumerate(items):
        where = f"routers[{i}]"
        if not isinstance(item, dict):
            raise InvalidArgument(where, item, "must be a mapping with name and pods")
        _check_keys(item, ROUTER_KEYS, where)
        pods = item.get("pods", [])
        if not isinstance(pods, list):
            raise InvalidArgument(f"{where}.pods", pods, "must be a list of pod names")
        out.append(Router.validated(_text(item, "name", where), pods, where))
    return out


def _text(item: dict[str, Any], key: str, where: str, default: Any = ...) -> str:
    """A string value: YAML reads unquoted 0x10, 010 or 1.10 as numbers, which must not become other names."""
    value = _get(item, key, where, default)
    if not isinstance(value, str):
        raise InvalidArgument(
            f"{where}.{key}", value, "must be a string (quote it: YAML reads 0x10 or 1.10 as a number)"
        )
    return value


def _int(item: dict[str, Any], key: str, where: str, default: int | None) -> int:
    value = item.get(key, default)
    if value is None:
        raise InvalidArgument(f"{where}.{key}", None, "is required")
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{where}.{key}", value, "must be an integer")
    return value


def pod_entry(p: Pod) -> dict[str, Any]:
    """A pod as a manifest's `pods` entry."""
    return {"name": p.name, "ipv4_prefixes": list(p.ipv4_prefixes)}


def dpu_entry(d: Dpu) -> dict[str, Any]:
    """A DPU as a manifest's `dpus` entry (no seal_port key for a DPU without one)."""
    return {k: v for k, v in d.as_dict().items() if k != "seal_port" or v is not None}


def cap_entry(pod: str, c: Cap) -> dict[str, Any]:
    """A pod's cap as a manifest's `caps` entry (rates in bit/s)."""
    return {
        "pod": pod,
        "egress": c.egress_bps,
        "ingress": c.ingress_bps,
        "window_s": c.window_s,
        "burst_bytes": c.burst_bytes,
        "mode": c.mode,
        "rebalance": c.rebalance,
    }


def router_entry(r: Router) -> dict[str, Any]:
    """A router as a manifest's `routers` entry."""
    return {"name": r.name, "pods": list(r.pods)}
