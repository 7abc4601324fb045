"""The control plane's desired-state objects and their validation.

Every check raises InvalidArgument naming the field and the offending value, so that the API,
the files and the CLI all report bad input the same way.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from .units import CPU_PORT, MAX_PI_BURST, UnitError, bps_to_bytes_per_s, check_burst, default_burst_bytes

# \Z, not $: "$" also matches before a trailing newline, and "a\n" would pass for a second "a".
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?\Z")
MAX_RATE_BPS = 1.6e12  # 1.6 Tbit/s: well above any DPU link, far below int64 bytes/s
MAX_WINDOW_S = 86_400.0
# A cap's rate leaves data a rate of its own beside each DPU's ARP allowance (8 kbit/s), and its
# window is long enough to hold more than one frame at the smallest rate.
# limiter.p4's tables hold a pod's prefixes (src_in_pod, dst_in_pod: 1024 entries) and, on each node
# DPU, the pod's other nodes (pod_peers: 1024).
MAX_POD_PREFIXES = 1024
MAX_POD_NODE_MACS = 1025
MIN_RATE_BPS = 16_000.0
MIN_WINDOW_S = 0.1
# IPv4 space that no pod's nodes can own: "this network", loopback, link-local, multicast and the
# reserved block with the limited broadcast address. A pod prefix that touches any of them would
# make the data plane treat such traffic as the pod's (0.0.0.0/0: all of IPv4 intra-pod).
# As (first, last address as integers, why): a fleet's file checks tens of thousands of prefixes against them.
NOT_POD_SPACE = tuple(
    (int(n.network_address), int(n.broadcast_address), why)
    for n, why in (
        (ipaddress.IPv4Network(net), why)
        for net, why in (
            ("0.0.0.0/8", "'this network' (0.0.0.0/8)"),
            ("127.0.0.0/8", "loopback (127.0.0.0/8)"),
            ("169.254.0.0/16", "link-local (169.254.0.0/16)"),
            ("224.0.0.0/4", "multicast (224.0.0.0/4)"),
            ("240.0.0.0/4", "reserved and broadcast (240.0.0.0/4)"),
        )
    )
)
PREFIX_CHARS = re.compile(r"[0-9./]+")
# A dotted quad as Python's ipaddress writes it (no leading zeros), with a port without them: a fleet's
# file is mostly these, taken as they are; anything else goes through ipaddress (and its errors).
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
CANONICAL_IPV4_PORT = re.compile(rf"(({_OCTET})\.{_OCTET}\.{_OCTET}\.{_OCTET}):([1-9][0-9]{{0,4}})")
CANONICAL_PREFIX = re.compile(rf"({_OCTET})\.({_OCTET})\.({_OCTET})\.({_OCTET})/(3[0-2]|[12]?[0-9])")
BROADCAST = ipaddress.IPv4Address("255.255.255.255")


SHOWN_CHARS = 80  # at most this much of a bad value is repeated back: an error stays small whatever came in


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """Text an error repeats (a key, a parser's message): at most `limit` characters, with its full length said."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def shown(value: object) -> str:
    """A value as an error message repeats it: its repr, cut to SHOWN_CHARS with its full length said."""
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    size = f"{len(value)} chars" if isinstance(value, str | bytes) else f"{len(text)} chars as written"
    return f"{text[:SHOWN_CHARS]}... ({size})"


class InvalidArgument(ValueError):
    """Bad input: names the field and the value (INVALID_ARGUMENT)."""

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        super().__init__(f"{field_name}: {reason} (got {shown(value)})")
        self.field = field_name
        self.value = value
        self.reason = reason


class NotFound(InvalidArgument):
    """A field refers to an object that does not exist (NOT_FOUND)."""


class AlreadyExists(InvalidArgument):
    """A create names an object that exists already (ALREADY_EXISTS)."""


class Role(str, Enum):
    """Where a limiting device sits."""

    POD_UPLINK = "pod-uplink"
    NODE = "node"


def check_name(field_name: str, value: str) -> str:
    """A DNS-label-like object name."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise InvalidArgument(field_name, value, "must be 1-63 lowercase letters, digits, '.', '_' or '-'")
    return value


def check_seconds(field_name: str, value: float, low: float, high: float) -> float:
    """A duration in seconds, finite and within low..high."""
    try:
        ok = isinstance(value, int | float) and math.isfinite(value) and low <= value <= high
    except OverflowError:  # an int past a float's range
        ok = False
    if not ok:
        raise InvalidArgument(field_name, value, f"must be {low:g}..{high:g} seconds")
    return float(value)


MAC_RE = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


def check_mac(field_name: str, value: str) -> str:
    """A unicast Ethernet address, normalised to lowercase aa:bb:cc:dd:ee:ff ("" stays "": none)."""
    if value == "":
        return value
    text = value.lower().replace("-", ":") if isinstance(value, str) and len(value) == 17 else ""
    if not MAC_RE.fullmatch(text):
        raise InvalidArgument(field_name, value, "must be an Ethernet address like 02:00:00:00:00:01")
    if int(text[:2], 16) & 1:
        raise InvalidArgument(field_name, value, "must be a unicast address (a node's own), not multicast or broadcast")
    if text == "00:00:00:00:00:00":
        raise InvalidArgument(field_name, value, "must not be all zeros")
    return text


DNS_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_RE = re.compile(rf"{DNS_LABEL}(\.{DNS_LABEL})*\.?")
PORT_RE = re.compile(r"[0-9]{1,5}")  # ASCII digits only: str.isdigit() also takes '²' and '١٢٣'


def check_address(field_name: str, value: str) -> str:
    """A host:port gRPC address, normalised so that one endpoint has one spelling (the store compares
    them): an IPv4 address, an [IPv6] one (no scope id: it names an interface of one host) or a DNS
    name in lowercase without a trailing dot; the port without leading zeros."""
    m = CANONICAL_IPV4_PORT.fullmatch(value) if isinstance(value, str) else None
    # Already in its one spelling: what is left to check is the port's range and what one device can be.
    if m and int(m[3]) < 65536 and not 224 <= int(m[2]) < 240 and m[1] not in ("0.0.0.0", "255.255.255.255"):
        return value
    host, sep, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not host or not PORT_RE.fullmatch(port) or not 0 < int(port) < 65536:
        raise InvalidArgument(field_name, value, "must be host:port with a port in 1..65535")
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    if host.startswith("["):
        if not host.endswith("]"):
            raise InvalidArgument(field_name, value, "unterminated IPv6 literal")
        if "%" in host:
            raise InvalidArgument(field_name, value, "an IPv6 scope id is not allowed (give a routable address)")
        try:
            ip = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise InvalidArgument(field_name, value, "not a valid IPv6 address") from None
        if ip.ipv4_mapped is not None:
            raise InvalidArgument(field_name, value, f"give the IPv4 address itself ({ip.ipv4_mapped}:{int(port)})")
        text = f"[{ip.compressed}]"
    else:
        host = host.lower().removesuffix(".")
        if len(host) > 253 or not HOST_RE.fullmatch(host):
            raise InvalidArgument(field_name, value, "host is not an IPv4 address or DNS name")
        if not host.rpartition(".")[2][0].isdigit():
            return f"{host}:{int(port)}"
        # A name whose last label starts with a digit can only be a dotted-quad IPv4 address (no
        # top-level domain does): 0x7f.0.0.1 or 2130706433 would otherwise be a second spelling.
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            raise InvalidArgument(field_name, value, "not a valid IPv4 address (dotted quad)") from None
        text = str(ip)
    if ip.is_unspecified or ip.is_multicast or ip == BROADCAST:
        raise InvalidArgument(
            field_name, value, "must name one device (not an unspecified, multicast or broadcast address)"
        )
    return f"{text}:{int(port)}"


def _canonical_span(prefix: str) -> tuple[int, int] | None:
    """The first and last address of a prefix written as ipaddress writes one, with no host bits set
    (its normal form: 10.0.1.0/24); None for anything else (ipaddress then judges it)."""
    m = CANONICAL_PREFIX.fullmatch(prefix)
    if m is None:
        return None
    first = int(m[1]) << 24 | int(m[2]) << 16 | int(m[3]) << 8 | int(m[4])
    host = (1 << (32 - int(m[5]))) - 1
    return None if first & host else (first, first | host)


@dataclass(frozen=True)
class Pod:
    """A pod and the IPv4 prefixes of its nodes."""

    name: str
    ipv4_prefixes: tuple[str, ...]

    @staticmethod
    def validated(name: str, prefixes: list[str] | tuple[str, ...], field_prefix: str = "pod") -> Pod:
        """Build a Pod, normalising prefixes (10.0.1.0/24); errors name the field."""
        check_name(f"{field_prefix}.name", name)
        if not isinstance(prefixes, list | tuple) or not prefixes:
            raise InvalidArgument(
                f"{field_prefix}.ipv4_prefixes", prefixes, "a pod needs a list of at least one prefix"
            )
        if len(prefixes) > MAX_POD_PREFIXES:
            raise InvalidArgument(
                f"{field_prefix}.ipv4_prefixes", f"{len(prefixes)} prefixes", f"at most {MAX_POD_PREFIXES} per pod"
            )
        norm = []
        for i, p in enumerate(prefixes):
            where = f"{field_prefix}.ipv4_prefixes[{i}]"
            if not isinstance(p, str) or len(p) > 18 or not PREFIX_CHARS.fullmatch(p):
                raise InvalidArgument(where, p, "not an IPv4 prefix like 10.0.1.0/24")
            span, text = _canonical_span(p), p
            if span is None:
                try:
                    net = ipaddress.IPv4Network(p, strict=True)
                except ValueError as exc:
                    raise InvalidArgument(where, p, f"not an IPv4 prefix: {exc}") from None
                span, text = (int(net.network_address), int(net.broadcast_address)), str(net)
            first, last = span
            for lo, hi, why in NOT_POD_SPACE:
                if first <= hi and lo <= last:
                    raise InvalidArgument(where, p, f"overlaps {why}, which no pod's nodes can own")
            norm.append(text)
        return Pod(name=name, ipv4_prefixes=tuple(sorted(set(norm))))


@dataclass(frozen=True)
class Dpu:
    """A limiting device programmed over P4Runtime."""

    name: str
    p4runtime_address: str
    device_id: int
    pod: str
    role: Role = Role.POD_UPLINK
    host_port: int = 0
    uplink_port: int = 1
    # Most bytes the DPU can hold between its meter and the wire (queues after the meter). Bytes it
    # releases in a window can exceed what its meter passed by this much, so the controller programs
    # every allowance this much smaller and the cap still holds where it is measured, at the receiver.
    buffer_bytes: int = 0
    # Node DPUs only: the Ethernet address of the node this DPU fronts. It is the pod's inventory
    # of who is inside: a frame is exempt at a node DPU only when addressed to (or coming from)
    # another node of its pod by this address. "" for a pod uplink, or a node whose intra-pod
    # traffic is to be metered.
    node_mac: str = ""
    # Node DPUs only: the port of its crypto engine, through which alone it exempts intra-pod frames
    # (sealed leaving, authenticated arriving). None: the node exempts nothing.
    seal_port: int | None = None

    def as_dict(self) -> dict[str, object]:
        """Every field by name, the role as files name it: a manifest entry, an audit payload."""
        # Every field is a scalar: no deep copy (dataclasses.asdict), which a fleet's Apply pays per DPU.
        return {f.name: getattr(self, f.name) for f in DPU_FIELDS} | {"role": self.role.value}

    @staticmethod
    def validated(dpu: Dpu, field_prefix: str = "dpu") -> Dpu:
        """Check every field; errors name the field."""
        check_name(f"{field_prefix}.name", dpu.name)
        address = check_address(f"{field_prefix}.p4runtime_address", dpu.p4runtime_address)
        if not 0 <= dpu.device_id < 1 << 63:
            raise InvalidArgument(f"{field_prefix}.device_id", dpu.device_id, "must be in 0..2**63-1")
        check_name(f"{field_prefix}.pod", dpu.pod)
        for fname in ("host_port", "uplink_port"):
            port = getattr(dpu, fname)
            if not 0 <= port < CPU_PORT:
                why = f"must be a data-plane port in 0..{CPU_PORT - 1} ({CPU_PORT} is the CPU's)"
                raise InvalidArgument(f"{field_prefix}.{fname}", port, why)
        if dpu.host_port == dpu.uplink_port:
            raise InvalidArgument(f"{field_prefix}.uplink_port", dpu.uplink_port, "must differ from host_port")
        if dpu.seal_port is not None:
            if dpu.role is not Role.NODE:
                # An uplink exempts nothing, so it has nothing to seal.
                raise InvalidArgument(f"{field_prefix}.seal_port", dpu.seal_port, "only a node DPU has a seal port")
            if not 0 <= dpu.seal_port < CPU_PORT:
                why = f"must be a data-plane port in 0..{CPU_PORT - 1} ({CPU_PORT} is the CPU's)"
                raise InvalidArgument(f"{field_prefix}.seal_port", dpu.seal_port, why)
            if dpu.seal_port in (dpu.host_port, dpu.uplink_port):
                why = "must differ from host_port and uplink_port"
                raise InvalidArgument(f"{field_prefix}.seal_port", dpu.seal_port, why)
            if not dpu.node_mac:
                # The engine seals only the node's own frames and opens only those for it: by its MAC.
                raise InvalidArgument(f"{field_prefix}.seal_port", dpu.seal_port, "needs the node's node_mac")
        if not 0 <= dpu.buffer_bytes <= MAX_PI_BURST:
            raise InvalidArgument(f"{field_prefix}.buffer_bytes", dpu.buffer_bytes, f"must be in 0..{MAX_PI_BURST}")
        mac = check_mac(f"{field_prefix}.node_mac", dpu.node_mac)
        if mac and dpu.role is not Role.NODE:
            # Nothing that crosses a pod uplink is intra-pod: an uplink has no node to name.
            raise InvalidArgument(f"{field_prefix}.node_mac", dpu.node_mac, "only a node DPU has a node MAC")
        if (mac, address) == (dpu.node_mac, dpu.p4runtime_address):
            return dpu
        return dataclasses.replace(dpu, node_mac=mac, p4runtime_address=address)


DPU_FIELDS = dataclasses.fields(Dpu)


@dataclass(frozen=True)
class Cap:
    """A per-direction cap: rates in bit/s, window in seconds, meter burst in bytes."""

    egress_bps: float
    ingress_bps: float
    window_s: float
    burst_bytes: int = 0
    rebalance: bool = False  # node shares follow measured demand (node placement only)
    mode: str = "rate"  # "rate": trTCM meter; "window": at most rate x window bytes in any window

    @staticmethod
    def validated(cap: Cap, field_prefix: str = "cap") -> Cap:
        """Check every field and fill the default burst; errors name the field."""
        for fname in ("egress_bps", "ingress_bps"):
            rate = getattr(cap, fname)
            if not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
                raise InvalidArgument(f"{field_prefix}.{fname}", rate, "must be a rate > 0 bit/s")
            if rate < MIN_RATE_BPS:
                raise InvalidArgument(
                    f"{field_prefix}.{fname}", rate, f"must be >= {MIN_RATE_BPS:g} bit/s (ARP's allowance and data)"
                )
            if rate > MAX_RATE_BPS:
                raise InvalidArgument(f"{field_prefix}.{fname}", rate, f"must be <= {MAX_RATE_BPS:g} bit/s")
            try:
                bps_to_bytes_per_s(rate, f"{field_prefix}.{fname}")
            except UnitError as exc:
                raise InvalidArgument(f"{field_prefix}.{fname}", rate, str(exc)) from None
        w = check_seconds(f"{field_prefix}.window_s", cap.window_s, MIN_WINDOW_S, MAX_WINDOW_S)
        burst = cap.burst_bytes or default_burst_bytes(max(cap.egress_bps, cap.ingress_bps))
        try:
            check_burst(burst, f"{field_prefix}.burst_bytes")
        except UnitError:
            why = f"must be <= {MAX_PI_BURST} (32-bit meter bursts)"
            if not cap.burst_bytes:  # the default was asked for: say that it is what is too large
                why = f"the default, 100 ms at the rate ({burst} bytes), is too large: give a burst {why}"
            raise InvalidArgument(f"{field_prefix}.burst_bytes", cap.burst_bytes, why) from None
        if cap.mode not in ("rate", "window"):
            raise InvalidArgument(f"{field_prefix}.mode", cap.mode, "must be rate or window")
        if cap.mode == "window" and w < 1:
            raise InvalidArgument(f"{field_prefix}.window_s", w, "must be >= 1 second in window mode")
        return Cap(float(cap.egress_bps), float(cap.ingress_bps), float(w), int(burst), bool(cap.rebalance), cap.mode)


@dataclass(frozen=True)
class Router:
    """A router of the fleet's network and the pods whose uplinks land on it (inventory: the
    verifier's map of where pod traffic meets; a pod is behind one router at most)."""

    name: str
    pods: tuple[str, ...] = ()

    @staticmethod
    def validated(name: str, pods: list[str] | tuple[str, ...], field_prefix: str = "router") -> Router:
        """Check the name and the pod names (each once); errors name the field."""
        check_name(f"{field_prefix}.name", name)
        seen: set[str] = set()
        for i, pod in enumerate(pods):
            check_name(f"{field_prefix}.pods[{i}]", pod)
            if pod in seen:
                raise InvalidArgument(f"{field_prefix}.pods[{i}]", pod, "listed twice")
            seen.add(pod)
        return Router(name, tuple(sorted(pods)))


Verb = Literal["create", "update", "unchanged", "delete"]
Kind = Literal["pod", "dpu", "cap", "router"]


@dataclass(frozen=True)
class Change:
    """What a write does (or, in a dry run, would do) to one stored object; a cap is named by its pod."""

    verb: Verb
    kind: Kind
    name: str
    before: Pod | Dpu | Cap | Router | None = None
    after: Pod | Dpu | Cap | Router | None = None


@dataclass
class DesiredState:
    """Everything the control plane wants its DPUs to hold."""

    pods: dict[str, Pod] = field(default_factory=dict)
    dpus: dict[str, Dpu] = field(default_factory=dict)
    caps: dict[str, Cap] = field(default_factory=dict)
    generation: int = 0
    routers: dict[str, Router] = field(default_factory=dict)

    def copy(self) -> DesiredState:
        """A copy whose dicts can be changed without touching this one's."""
        return DesiredState(dict(self.pods), dict(self.dpus), dict(self.caps), self.generation, dict(self.routers))
