"""The lab in virtual time: a discrete-event network around embedded targets that share one clock.

Hosts, the pods' switches, the router and every link are simulated; the limiters are real embedded
targets (p4sim Devices executing limiter.p4's bmv2 JSON, programmed over P4Runtime by the control
plane). A frame's trip is a chain of events: serialisation on each link at its rate (FIFO, so bursts
queue), propagation delay, then the next hop. Every event first moves the shared VirtualClock to its
time, so the targets' meters and timestamps see simulated microseconds.

Traffic sources are paced UDP senders (the scenario's `udp` flows). A source may send large
segments (`segment_bytes`) instead of MTU-sized frames, as TSO does: limiter.p4 meters bytes, so a
segment of N bytes draws the same tokens as its frames would; what changes is granularity: a
segment passes or fails as a whole, so near the end of the bucket up to one segment (not one
frame) can differ. Receivers record wire bytes in 1 ms bins per source, like the real captures.

Not modelled yet: TCP (scenarios with TCP flows need real time), ARP (hosts know the next hop),
link loss, and node-level placement.
"""

from __future__ import annotations

import heapq
import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from p4sim.clock import VirtualClock

from .capture import Capture, to_capture
from .config import FlowSpec, Topology
from .traffic import Timeline, wire_bytes_udp

NS = 1_000_000_000
DEFAULT_HOST_LINK_BPS = 100e9
DEFAULT_UPLINK_BPS = 400e9  # Amodo's BlueField-3 links
ETH_IPV4_UDP = 42


class Engine:
    """Events in nanoseconds; the shared clock (microseconds) follows each event."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.now_ns = 0
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self.events = 0

    def at(self, t_ns: int, fn: Callable[[], None]) -> None:
        """Run `fn` at time `t_ns` (not before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t_ns, self.now_ns), self._seq, fn))

    def run(self, until_ns: int) -> None:
        """Process events up to `until_ns`."""
        heap, clock = self._heap, self.clock
        while heap and heap[0][0] <= until_ns:
            t, _, fn = heapq.heappop(heap)
            self.now_ns = t
            clock.us = t // 1000
            fn()
            self.events += 1
        self.now_ns = max(self.now_ns, until_ns)
        clock.us = self.now_ns // 1000


@dataclass
class Link:
    """One direction of a link: FIFO serialisation at `rate_bps`, then `delay_ns` of propagation."""

    engine: Engine
    rate_bps: float
    deliver: Callable[[bytes], None]
    delay_ns: int = 1_000
    free_at: int = 0
    bytes_sent: int = 0

    def send(self, frame: bytes) -> None:
        """Queue a frame; it arrives after the queue ahead of it, its serialisation and the delay."""
        start = max(self.engine.now_ns, self.free_at)
        self.free_at = start + int(len(frame) * 8 * NS / self.rate_bps)
        self.bytes_sent += len(frame)
        self.engine.at(self.free_at + self.delay_ns, lambda: self.deliver(frame))


Processor = Callable[[int, bytes], list[tuple[int, bytes]]]


def udp_frame(src: str, dst: str, dport: int, payload: int) -> bytes:
    """An Ethernet/IPv4/UDP frame (checksums left zero: nothing on the path checks them)."""
    total = 20 + 8 + payload
    ip = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        total & 0xFFFF,
        0,
        0,
        64,
        17,
        0,
        ipaddress.IPv4Address(src).packed,
        ipaddress.IPv4Address(dst).packed,
    )
    udp = struct.pack("!HHHH", 40000, dport, (8 + payload) & 0xFFFF, 0)
    eth = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00"
    return eth + ip + udp + bytes(payload)


@dataclass
class Receiver:
    """A host's receive side: wire bytes per source in 1 ms bins, datagrams per destination port."""

    bins: dict[str, Timeline] = field(default_factory=dict)
    packets_by_port: dict[int, int] = field(default_factory=dict)
    bytes_by_port: dict[int, int] = field(default_factory=dict)

    def receive(self, t_s: float, frame: bytes) -> None:
        """Count one arriving frame."""
        src = str(ipaddress.IPv4Address(frame[26:30])) if frame[12:14] == b"\x08\x00" else "non-ipv4"
        tl = self.bins.get(src)
        if tl is None:
            tl = self.bins[src] = Timeline(0.001)
        tl.add(t_s, len(frame))
        if frame[12:14] == b"\x08\x00" and frame[23] == 17:
            port = int.from_bytes(frame[36:38], "big")
            self.packets_by_port[port] = self.packets_by_port.get(port, 0) + 1
            self.bytes_by_port[port] = self.bytes_by_port.get(port, 0) + len(frame)


@dataclass
class SimNetwork:
    """Pods with one limiter each on their uplink, joined by a router; hosts on each pod's switch."""

    topology: Topology
    limiters: dict[str, Processor]  # pod -> the limiter's packet path (port 0 host side, 1 uplink)
    engine: Engine
    host_link_bps: float = DEFAULT_HOST_LINK_BPS
    uplink_bps: float = DEFAULT_UPLINK_BPS
    receivers: dict[str, Receiver] = field(default_factory=dict)
    dropped_no_route: int = 0

    def __post_init__(self) -> None:
        topo = self.topology
        self._host_of: dict[bytes, str] = {
            ipaddress.IPv4Address(topo.address_of(h)).packed: h for p in topo.pods for h in p.hosts
        }
        self._pod_of_host = {h: p.name for p in topo.pods for h in p.hosts}
        self._nets = [(ipaddress.IPv4Network(p.subnet), p.name) for p in topo.pods]
        # Host -> switch and switch -> host links, limiter <-> switch, limiter <-> router.
        self._to_switch: dict[str, Link] = {}
        self._to_host: dict[str, Link] = {}
        for pod in topo.pods:
            for h in pod.hosts:
                self.receivers[h] = Receiver()
                self._to_switch[h] = Link(self.engine, self.host_link_bps, self._switch_in(pod.name))
                self._to_host[h] = Link(self.engine, self.host_link_bps, self._host_in(h))
        self._switch_to_limiter = {
            p.name: Link(self.engine, self.uplink_bps, self._limiter_in(p.name, 0)) for p in topo.pods
        }
        self._limiter_to_switch = {
            p.name: Link(self.engine, self.uplink_bps, self._switch_in(p.name)) for p in topo.pods
        }
        self._limiter_to_router = {p.name: Link(self.engine, self.uplink_bps, self._router_in) for p in topo.pods}
        self._router_to_limiter = {
            p.name: Link(self.engine, self.uplink_bps, self._limiter_in(p.name, 1)) for p in topo.pods
        }

    def pod_of_ip(self, packed: bytes) -> str | None:
        """The pod whose subnet holds an address."""
        addr = ipaddress.IPv4Address(packed)
        return next((name for net, name in self._nets if addr in net), None)

    def send_from(self, host: str, frame: bytes) -> None:
        """A host puts a frame on its link."""
        self._to_switch[host].send(frame)

    def _switch_in(self, pod: str) -> Callable[[bytes], None]:
        def switch(frame: bytes) -> None:
            dst = self._host_of.get(frame[30:34])
            if dst is not None and self._pod_of_host[dst] == pod:
                self._to_host[dst].send(frame)  # stays inside the pod: no limiter on the path
            else:
                self._switch_to_limiter[pod].send(frame)

        return switch

    def _limiter_in(self, pod: str, port: int) -> Callable[[bytes], None]:
        process = self.limiters[pod]

        def limiter(frame: bytes) -> None:
            for out_port, out in process(port, frame):
                if out_port == 1:
                    self._limiter_to_router[pod].send(out)
                elif out_port == 0:
                    self._limiter_to_switch[pod].send(out)

        return limiter

    def _router_in(self, frame: bytes) -> None:
        pod = self.pod_of_ip(frame[30:34]) if frame[12:14] == b"\x08\x00" else None
        if pod is None:
            self.dropped_no_route += 1
            return
        self._router_to_limiter[pod].send(frame)

    def _host_in(self, host: str) -> Callable[[bytes], None]:
        rx = self.receivers[host]

        def deliver(frame: bytes) -> None:
            rx.receive(self.engine.now_ns / NS, frame)

        return deliver

    def captures(self) -> dict[str, Capture]:
        """Each host's received bytes, in the form the real captures take."""
        return {h: to_capture(h, 0.0, r.bins, 0, "virtual") for h, r in self.receivers.items()}


@dataclass
class UdpSource:
    """A paced UDP sender: frames of `segment` payload bytes at `rate_bps` wire bits per second."""

    net: SimNetwork
    host: str
    frame: bytes
    rate_bps: float
    start_ns: int
    end_ns: int
    sent_packets: int = 0
    sent_wire_bytes: int = 0

    def start(self) -> None:
        """Schedule the first frame."""
        self.net.engine.at(self.start_ns, self._send)

    def _send(self) -> None:
        now = self.net.engine.now_ns
        if now >= self.end_ns:
            return
        self.net.send_from(self.host, self.frame)
        self.sent_packets += 1
        self.sent_wire_bytes += len(self.frame)
        gap = int(len(self.frame) * 8 * NS / self.rate_bps)
        self.net.engine.at(now + gap, self._send)


def udp_source(
    net: SimNetwork, flow: FlowSpec, port: int, start_ns: int, end_ns: int, segment_bytes: int | None
) -> UdpSource:
    """A source for a scenario's UDP flow; `segment_bytes` (payload) overrides the flow's size."""
    topo = net.topology
    payload = segment_bytes or flow.size
    assert flow.rate is not None
    frame = udp_frame(topo.address_of(flow.src), topo.address_of(flow.dst), port, payload)
    assert len(frame) == wire_bytes_udp(payload)
    return UdpSource(net, flow.src, frame, flow.rate, start_ns, end_ns)
