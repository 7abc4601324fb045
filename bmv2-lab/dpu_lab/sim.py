"""The lab in virtual time: a discrete-event network around embedded targets that share one clock.

Hosts, the pods' switches, the router and every link are simulated; the limiters are real embedded
targets (dpu_softswitch Devices executing limiter.p4's bmv2 JSON, programmed over P4Runtime by the control
plane). A frame's trip is a chain of events: serialisation on each link at its rate (FIFO, so bursts
queue), propagation delay, then the next hop. Every event first moves the shared VirtualClock to its
time, so the targets' meters and timestamps see simulated microseconds.

Frames are switched and routed by Ethernet address (frames.py), so a flow may carry its datagrams in
any shape an evader would try (VLAN, IPv6, GRE, VXLAN, fragments, forged sources) and still be
delivered and counted for its true sender. Traffic sources are paced UDP senders (the scenario's
`udp` flows) and bulk TCP flows (tcp_model.py, whose endpoints hang on the hosts' Receivers).
A source may send large
segments (`segment_bytes`) instead of MTU-sized frames, as TSO does: limiter.p4 meters bytes, so a
segment of N bytes draws the same tokens as its frames would; what changes is granularity: a
segment passes or fails as a whole, so near the end of the bucket up to one segment (not one
frame) can differ. Receivers record wire bytes in 1 ms bins per source, like the real captures.

The compliance view is the boundary's, as in real time (boundary.py): every frame the network moves
across a pod's link to its router, out of its uplink limiters into the pod, or across a scale-up link
between pods, whatever it holds, in 1 ms bins per (pod, direction). A router link's frames are counted
as the router sees them, those it receives on arrival and those it sends as it sends them; an uplink
limiter's as it sends them into the pod; a scale-up link's at its first host's end. The router-link
counts are also the verifier's router counts in the audit (audit.py).

Node DPUs seal what they exempt (docs/exemption.md), as in real time (netns.py): a node limiter's port 2
is its crypto engine. What the limiter sends there is sealed (sealing.Sealer, its host's SCI, its pod's
key) and goes onto the host's link into the pod's switch; what the switch sends toward the host first
meets the engine's opener (sealing.Opener, the pod's key): a frame that opens enters the limiter on port 2,
opened, anything else on port 1 (metered) as it came. Each pod with node placement gets a random key per
SimNetwork (per run). A sealed frame is sealing.OVERHEAD bytes longer; links have no MTU here. Receivers
cannot read a sealed frame: they count it as "non-ipv4", attributed to no sender, as the real captures do.

Not modelled yet: ARP (hosts know the next hop), link loss, and queue limits: links are unbounded
FIFOs, so the limiters' meters are the only place frames are dropped.
"""

from __future__ import annotations

import heapq
import secrets
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpu_softswitch.clock import VirtualClock

from .boundary import key as boundary_key
from .capture import NON_IPV4, Capture, to_capture
from .config import Topology
from .frames import SPORT, Encap, mac_host
from .frames import frame as make_frame
from .netns import SEAL_KEY_BYTES, SEAL_PORT
from .sealing import ETHERTYPE_MACSEC
from .sealing import Engine as SealEngine
from .traffic import Timeline, wire_bytes_udp

heappush = heapq.heappush
NS = 1_000_000_000
DEFAULT_HOST_LINK_BPS = 100e9
DEFAULT_UPLINK_BPS = 400e9  # Amodo's BlueField-3 links


class Engine:
    """Events in nanoseconds; the shared clock (microseconds) follows each event."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.now_ns = 0
        # (time, sequence, function, argument): the argument saves making a closure per frame.
        self._heap: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.events = 0

    def at(self, t_ns: int, fn: Callable[[Any], None], arg: Any = None) -> None:
        """Run `fn(arg)` at time `t_ns` (not before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(t_ns, self.now_ns), self._seq, fn, arg))

    def run(self, until_ns: int) -> None:
        """Process events up to `until_ns`."""
        heap, clock, pop = self._heap, self.clock, heapq.heappop
        n = 0
        while heap:
            t, seq, fn, arg = pop(heap)
            if t > until_ns:  # popped rather than peeked at: one look at the heap per event, not two
                heappush(heap, (t, seq, fn, arg))
                break
            self.now_ns = t
            clock.us = t // 1000
            fn(arg)
            n += 1
        self.events += n
        self.now_ns = max(self.now_ns, until_ns)
        clock.us = self.now_ns // 1000


@dataclass(slots=True)
class Link:
    """One direction of a link: FIFO serialisation at `rate_bps`, then `delay_ns` of propagation."""

    engine: Engine
    rate_bps: float
    deliver: Callable[[bytes], None]
    delay_ns: int = 1_000
    free_at: int = 0
    bytes_sent: int = 0
    # Serialisation time by frame length: a simulation sends few distinct lengths, and the exact
    # integer arithmetic costs more than the lookup.
    _serial_ns: dict[int, int] = field(default_factory=dict)

    def send(self, frame: bytes) -> None:
        """Queue a frame; it arrives after the queue ahead of it, its serialisation and the delay."""
        # Engine.at written out (this runs for every frame on every hop); the arrival is never in the past.
        engine, n = self.engine, len(frame)
        serial = self._serial_ns.get(n)
        if serial is None:
            serial = self._serial_ns[n] = int(n * 8 * NS / self.rate_bps)
        now, free = engine.now_ns, self.free_at
        free = (now if now > free else free) + serial
        self.free_at = free
        self.bytes_sent += n
        engine._seq += 1
        heappush(engine._heap, (free + self.delay_ns, engine._seq, self.deliver, frame))


@dataclass(slots=True)
class CountedLink(Link):
    """A link whose sending end is watched: each frame is counted in `counts` as it is sent."""

    counts: tuple[Timeline, ...] = ()

    def send(self, frame: bytes) -> None:
        """Count the frame at the sending end, then send it."""
        t, n = self.engine.now_ns / NS, len(frame)
        for tl in self.counts:
            tl.add(t, n)
        Link.send(self, frame)  # slots dataclasses have no zero-argument super()


Processor = Callable[[int, bytes], list[tuple[int, bytes]]]
_MACSEC_HI, _MACSEC_LO = ETHERTYPE_MACSEC >> 8, ETHERTYPE_MACSEC & 0xFF


def flow_mac(net: SimNetwork, host: str, peer: str, port: int) -> bytes:
    """`host`'s source MAC on a flow with `peer`: the flow's port in its last two bytes (how the simulator
    tells flows apart and spreads them over parallel uplinks), except between two hosts of one pod, where
    it is the host's own: a node DPU exempts only frames from its pod mates' own MACs."""
    if net.pod_of_host(host) == net.pod_of_host(peer):
        return net.mac_of[host]
    return net.mac_of[host][:4] + bytes([port >> 8, port & 0xFF])


def l4_flow_port(frame: bytes) -> int:
    """The flow port of a frame from a host's own MAC (flow_mac): the UDP or TCP port that is not the
    senders' fixed source port (frames.SPORT); 0 for anything else."""
    if len(frame) < 38 or frame[12:14] != b"\x08\x00" or frame[23] not in (6, 17):
        return 0
    at = 14 + (frame[14] & 0x0F) * 4
    sport, dport = (frame[at] << 8) | frame[at + 1], (frame[at + 2] << 8) | frame[at + 3]
    return sport if dport == SPORT else dport


@dataclass
class Receiver:
    """A host's receive side: wire bytes per sender in 1 ms bins, frames and bytes per flow port.

    The sender and the flow come from the source MAC (frames.py), so a frame is counted for its
    true sender whatever it carries: a tunnel, IPv6, a VLAN tag, a forged IPv4 source.
    """

    address_of: dict[tuple[int, int], str]  # (pod index, host index) -> the host's IPv4 address
    bins: dict[str, Timeline] = field(default_factory=dict)
    packets_by_port: dict[int, int] = field(default_factory=dict)
    bytes_by_port: dict[int, int] = field(default_factory=dict)
    # TCP endpoints on this host by flow port (tcp_model.py): they see the frames after counting.
    endpoints: dict[int, Callable[[bytes], None]] = field(default_factory=dict)

    def receive(self, t_s: float, frame: bytes) -> None:
        """Count one arriving frame."""
        # The source MAC is frame[6:12]: mac_host and mac_port of it, read in place. A sealed frame (MACsec)
        # hides what it holds: like the real captures, the receiver attributes it to no one.
        if len(frame) > 13 and frame[12] == _MACSEC_HI and frame[13] == _MACSEC_LO:
            src = NON_IPV4
        else:
            src = self.address_of.get((frame[7], frame[8]), "unknown")
        tl = self.bins.get(src)
        if tl is None:
            tl = self.bins[src] = Timeline(0.001)
        tl.add(t_s, len(frame))
        port = (frame[10] << 8) | frame[11]
        if port == 0:
            port = l4_flow_port(frame)
        self.packets_by_port[port] = self.packets_by_port.get(port, 0) + 1
        self.bytes_by_port[port] = self.bytes_by_port.get(port, 0) + len(frame)
        if self.endpoints:
            endpoint = self.endpoints.get(port)
            if endpoint is not None:
                endpoint(frame)


@dataclass
class SimNetwork:
    """Pods joined by routers (more than one: through a spine); each pod's limiter(s) where its
    placement puts them.

    pod-uplink: hosts -- pod switch -- limiter -- router (K parallel uplinks: K limiters between the
    switch and the router).   node: host -- limiter -- pod switch -- router.
    router: hosts -- pod switch -- router -- limiter -- spine: pods behind one router (a cell) reach
    each other through the router alone. Each pod hangs on the router `router_of` names, which
    `reroute` changes mid-run (a frame on its way to a router its pod has left is lost).
    `limiters` maps a limiter's name (PodSpec.limiters) to its packet path (port 0 faces the host
    side, port 1 the uplink side; a node limiter's port 2 is its crypto engine, see the module's doc).
    Over parallel uplinks the pod's switch and the router spread
    frames by a hash of the sending flow (source MAC: host and port), as ECMP does, unless the flow
    is pinned to one (`pinned`: an attacker choosing its ports for a compromised uplink). A pod switch
    with a relay (Topology.switch_relays) sends frames from its hosts to the relayed host's MAC out of
    the pod instead, addressed to the far host, as the real lab's relay filter does (relay.py).
    """

    topology: Topology
    limiters: dict[str, Processor]
    engine: Engine
    host_link_bps: float = DEFAULT_HOST_LINK_BPS
    uplink_bps: float = DEFAULT_UPLINK_BPS
    receivers: dict[str, Receiver] = field(default_factory=dict)
    dropped_no_route: int = 0
    # Every frame on each pod's link(s) to its router, per (pod, direction) in 1 ms bins, whatever it
    # holds: the router's own counts (the verifier's, not the DPUs'), and with scaleup_counts (the same
    # on scale-up links between pods) the lab's compliance view.
    router_counts: dict[tuple[str, str], Timeline] = field(default_factory=dict)
    scaleup_counts: dict[tuple[str, str], Timeline] = field(default_factory=dict)
    # What a pod's uplink limiters send into the pod: its ingress past its own DPUs (boundary.py).
    uplink_counts: dict[tuple[str, str], Timeline] = field(default_factory=dict)
    pinned: dict[bytes, int] = field(default_factory=dict)  # a flow's source MAC -> its uplink (0-based)
    router_of: dict[str, str] = field(default_factory=dict)  # pod -> its router (default: the first draw)
    # Node placement: each pod's key (random per network unless given) and each node DPU's crypto engine.
    seal_keys: dict[str, bytes] = field(default_factory=dict, repr=False)
    engines: dict[str, SealEngine] = field(default_factory=dict)  # node host -> its DPU's crypto engine

    def pod_of_host(self, host: str) -> str:
        """The pod a host belongs to."""
        return self._pod_of_host[host]

    def __post_init__(self) -> None:
        topo = self.topology
        # Frames are switched and routed by Ethernet address (frames.host_mac), never by what an
        # evading sender may put in or around its IP header.
        self.mac_of = topo.host_macs()
        self._host_of: dict[tuple[int, int], str] = {mac_host(m): h for h, m in self.mac_of.items()}
        self._pod_of_host = {h: p.name for p in topo.pods for h in p.hosts}
        self._pod_of_id = {mac_host(m): self._pod_of_host[h] for h, m in self.mac_of.items()}
        addresses = {mac_host(m): topo.address_of(h) for h, m in self.mac_of.items()}
        self._from_host: dict[str, Link] = {}  # a host's own link, into its limiter or its switch
        self._switch_to_host: dict[str, Link] = {}  # toward a host: into its limiter or the host itself
        switch_up: dict[str, list[Link]] = {}  # a pod's ways out: into its uplink limiters or the router
        # Per pod, how a frame leaves it and how one enters it (filled in below, once the links exist).
        self._up_send: dict[str, Callable[[bytes], None]] = {}
        self._down_send: dict[str, Callable[[bytes], None]] = {}
        router_down: dict[str, list[Link]] = {}  # the router's ways into a pod
        e, hb, ub = self.engine, self.host_link_bps, self.uplink_bps
        self.router_of = self.router_of or topo.assignment(0)
        self._to_spine: dict[str, Link] = {}  # router -> spine (through its limiter with router placement)
        self._from_spine: dict[str, Link] = {}
        for r in topo.routers:
            down = Link(e, ub, self._router_from_spine(r))
            if topo.pods[0].placement == "router":
                outs = {0: down, 1: Link(e, ub, self._spine_in)}
                self._to_spine[r] = Link(e, ub, self._limiter_in(f"dpu-{r}", 0, outs))
                self._from_spine[r] = Link(e, ub, self._limiter_in(f"dpu-{r}", 1, outs))
            else:
                self._to_spine[r], self._from_spine[r] = Link(e, ub, self._spine_in), down
        # Scale-up links (NVSwitch paths): host to host, no limiter, no router.
        self._scaleup: dict[tuple[str, str], Link] = {}
        self.receivers.update({h: Receiver(addresses) for h in self._pod_of_host})
        for su in topo.scaleup_links:
            pod_a, pod_b = self._pod_of_host[su.a], self._pod_of_host[su.b]
            if pod_a == pod_b:  # inside one pod: no boundary
                self._scaleup[(su.a, su.b)] = Link(e, su.rate, self._host_in(su.b))
                self._scaleup[(su.b, su.a)] = Link(e, su.rate, self._host_in(su.a))
                continue
            # Every frame either host puts on the link, as the real lab counts them in the link's middle.
            sent = (self._tl(self.scaleup_counts, pod_a, "egress"), self._tl(self.scaleup_counts, pod_b, "ingress"))
            got = (self._tl(self.scaleup_counts, pod_b, "egress"), self._tl(self.scaleup_counts, pod_a, "ingress"))
            self._scaleup[(su.a, su.b)] = CountedLink(e, su.rate, self._host_in(su.b), counts=sent)
            self._scaleup[(su.b, su.a)] = Link(e, su.rate, self._arriving(got, self._host_in(su.a)))
        for pod in topo.pods:
            for h in pod.hosts:
                to_host = Link(e, hb, self._host_in(h))
                if pod.placement == "node":
                    name = f"dpu-{h}"
                    # The host's link into the switch carries what the limiter sends on its uplink port as it
                    # is, and what it sends on its seal port sealed by its engine.
                    key = self.seal_keys.setdefault(pod.name, secrets.token_bytes(SEAL_KEY_BYTES))
                    engine = self.engines[h] = SealEngine(key, self.mac_of[h])
                    to_switch = Link(e, hb, self._switch_in(pod.name, from_hosts=True))
                    ports: dict[int, Callable[[bytes], None]] = {
                        0: to_host.send,
                        1: to_switch.send,
                        SEAL_PORT: _sealing(engine, to_switch),
                    }
                    limiter = self._limiter(name, ports)
                    self._from_host[h] = Link(e, hb, _into(limiter, 0))
                    self._switch_to_host[h] = Link(e, hb, _opening(engine, limiter))
                else:
                    self._from_host[h] = Link(e, hb, self._switch_in(pod.name, from_hosts=True))
                    self._switch_to_host[h] = to_host
            # The pod's link(s) to the router, watched at the router's end (boundary.py).
            egress = (self._tl(self.router_counts, pod.name, "egress"),)
            ingress = (self._tl(self.router_counts, pod.name, "ingress"),)
            into_router = self._arriving(egress, self._router_in)
            if pod.placement != "pod-uplink":
                switch_up[pod.name] = [Link(e, ub, into_router)]
                router_down[pod.name] = [CountedLink(e, ub, self._switch_in(pod.name), counts=ingress)]
            else:
                ups: list[Link] = []
                downs: list[Link] = []
                entered = (self._tl(self.uplink_counts, pod.name, "ingress"),)
                for name in pod.limiters():
                    outs = {
                        0: CountedLink(e, ub, self._switch_in(pod.name), counts=entered),
                        1: Link(e, ub, into_router),
                    }
                    ups.append(Link(e, ub, self._limiter_in(name, 0, outs)))
                    downs.append(CountedLink(e, ub, self._limiter_in(name, 1, outs), counts=ingress))
                switch_up[pod.name], router_down[pod.name] = ups, downs
        self._up_send.update({pod: self._spread(links, True) for pod, links in switch_up.items()})
        self._down_send.update({pod: self._spread(links, False) for pod, links in router_down.items()})

    @staticmethod
    def _tl(counts: dict[tuple[str, str], Timeline], pod: str, direction: str) -> Timeline:
        """The timeline of (pod, direction) in `counts`, made on first use."""
        return counts.setdefault((pod, direction), Timeline(0.001))

    def _arriving(self, counts: tuple[Timeline, ...], deliver: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """`deliver`, counting each frame in `counts` as it arrives (a link watched at its receiving end)."""
        engine = self.engine

        def counted(frame: bytes) -> None:
            t, n = engine.now_ns / NS, len(frame)
            for tl in counts:
                tl.add(t, n)
            deliver(frame)

        return counted

    # Addresses are read in place: mac_host(frame[0:6]) is (frame[1], frame[2]), and of the source
    # MAC frame[6:12], (frame[7], frame[8]).

    def _spread(self, links: list[Link], pin: bool) -> Callable[[bytes], None]:
        """Send over one link, or over parallel links by the hash of the frame's flow (ECMP), or over
        the flow's pinned uplink (`pinned`, filled in later: read at each frame)."""
        if len(links) == 1:
            return links[0].send
        pinned: dict[bytes, int] = self.pinned if pin else {}

        def send(frame: bytes) -> None:
            src = frame[6:12]
            k = pinned.get(src)
            links[k if k is not None else zlib.crc32(src) % len(links)].send(frame)

        return send

    def send_from(self, host: str, frame: bytes) -> None:
        """A host puts a frame on its link, or on a scale-up link when that reaches the destination."""
        if self._scaleup:
            dst = self._host_of.get((frame[1], frame[2]))
            bypass = self._scaleup.get((host, dst)) if dst is not None else None
            if bypass is not None:
                bypass.send(frame)
                return
        self._from_host[host].send(frame)

    def _switch_in(self, pod: str, from_hosts: bool = False) -> Callable[[bytes], None]:
        """The pod's switch as a frame reaches it: from the pod's hosts (`from_hosts`) or from outside."""
        host_of, pod_of_host, pod_of_id = self._host_of, self._pod_of_host, self._pod_of_id
        to_host, up_send = self._switch_to_host, self._up_send

        def switch(frame: bytes) -> None:
            dst = host_of.get((frame[1], frame[2]))
            if dst is not None and pod_of_host[dst] == pod:
                to_host[dst].send(frame)
            elif pod_of_id.get((frame[7], frame[8])) == pod:
                up_send[pod](frame)  # leaving the pod (or addressed to no known host)

        relays = {
            self.mac_of[r.addressed_to]: self.mac_of[r.to]
            for r in self.topology.switch_relays
            if from_hosts and pod_of_host[r.addressed_to] == pod
        }
        if not relays:
            return switch
        # The last frame relayed and its rewrite: a source resends one frame object, and the targets
        # remember a frame's parse by its identity (dpu_softswitch's program memo).
        last: list[bytes] = [b"", b""]

        def relaying(frame: bytes) -> None:
            # As the real lab's relay filter on the pod's host ports (relay.py): the whole destination MAC
            # matched, rewritten to the far host's, and the frame sent out of the pod's uplink side
            # whatever its source, instead of being switched.
            to = relays.get(frame[:6])
            if to is None:
                switch(frame)
                return
            if frame is not last[0]:
                last[0], last[1] = frame, to + frame[6:]
            up_send[pod](last[1])

        return relaying

    def _limiter(self, name: str, outs: dict[int, Callable[[bytes], None]]) -> Callable[[int, bytes], None]:
        """A limiter's packet path, frames in on any port, each output sent by its port's sender in `outs`."""
        process = self.limiters[name]

        def limiter(port: int, frame: bytes) -> None:
            for out_port, out in process(port, frame):
                send = outs.get(out_port)
                if send is not None:
                    send(out)

        return limiter

    def seal_stats(self) -> dict[str, dict[str, Any]]:
        """What each node DPU's crypto engine did, by host, in the shape of the real engine's --stats."""
        return {host: engine.report() for host, engine in self.engines.items()}

    def _limiter_in(self, name: str, port: int, outs: dict[int, Link]) -> Callable[[bytes], None]:
        process = self.limiters[name]

        def limiter(frame: bytes) -> None:
            for out_port, out in process(port, frame):
                link = outs.get(out_port)
                if link is not None:
                    link.send(out)

        return limiter

    def reroute(self, router_of: dict[str, str]) -> None:
        """Move pods' uplinks to other routers (the assignment of the next routing period)."""
        self.router_of = dict(router_of)

    def _router_in(self, frame: bytes) -> None:
        """A frame from a pod's uplink reaches its router (counted on its way in): down to a pod of this
        router or up to the spine."""
        pod = self._pod_of_id.get((frame[1], frame[2]))
        if pod is None:
            self.dropped_no_route += 1
            return
        src = self._pod_of_id.get((frame[7], frame[8]))  # the port it came in on
        here = self.router_of[src if src is not None else pod]
        if self.router_of[pod] == here:
            self._down_send[pod](frame)
        else:
            self._to_spine[here].send(frame)

    def _spine_in(self, frame: bytes) -> None:
        pod = self._pod_of_id.get((frame[1], frame[2]))
        if pod is None:
            self.dropped_no_route += 1
            return
        self._from_spine[self.router_of[pod]].send(frame)

    def _router_from_spine(self, router: str) -> Callable[[bytes], None]:
        def from_spine(frame: bytes) -> None:
            pod = self._pod_of_id.get((frame[1], frame[2]))
            if pod is None or self.router_of[pod] != router:
                self.dropped_no_route += 1  # its pod moved to another router meanwhile
                return
            self._down_send[pod](frame)  # counted as it goes down the pod's link

        return from_spine

    def _host_in(self, host: str) -> Callable[[bytes], None]:
        rx = self.receivers[host]

        def deliver(frame: bytes) -> None:
            rx.receive(self.engine.now_ns / NS, frame)

        return deliver

    def captures(self) -> list[tuple[str, Capture]]:
        """Each host's received bytes, in the form the real captures take."""
        return [(h, to_capture(h, 0.0, r.bins, 0, "virtual")) for h, r in self.receivers.items()]

    def boundary(self) -> Capture:
        """Every frame across the pods' boundaries, in the form the real boundary capture takes."""
        timelines = {
            boundary_key(pod, direction, kind): tl
            for kind, counts in (
                ("router", self.router_counts),
                ("scale-up", self.scaleup_counts),
                ("uplink", self.uplink_counts),
            )
            for (pod, direction), tl in counts.items()
        }
        return to_capture("boundary", 0.0, timelines, 0, "virtual")


def _sealing(engine: SealEngine, link: Link) -> Callable[[bytes], None]:
    """A node limiter's seal port: each frame sealed by its engine (as the real engine routes it), then sent
    on the host's link."""
    route, send = engine.route, link.send

    def sealed(frame: bytes) -> None:
        out = route("seal", frame)
        if out is not None:
            send(out[1])

    return sealed


def _into(limiter: Callable[[int, bytes], None], port: int) -> Callable[[bytes], None]:
    """Frames into one port of a limiter."""

    def arrive(frame: bytes) -> None:
        limiter(port, frame)

    return arrive


def _opening(engine: SealEngine, limiter: Callable[[int, bytes], None]) -> Callable[[bytes], None]:
    """A frame from the pod's switch toward a node, as its engine routes it: into its limiter's seal port
    opened if it opens (the pod's key, addressed to this node), else into its uplink port as it came."""
    route = engine.route

    def arrive(frame: bytes) -> None:
        out = route("wire", frame)
        if out is not None:
            limiter(SEAL_PORT if out[0] == "seal" else 1, out[1])

    return arrive


@dataclass
class UdpSource:
    """A paced UDP sender: one frame, repeated at each segment's rate (wire bit/s) during the segment."""

    net: SimNetwork
    host: str
    frame: bytes
    segments: list[tuple[int, int, float]]  # (start_ns, end_ns, rate_bps), in time order, not overlapping
    sent_packets: int = 0
    sent_wire_bytes: int = 0
    _seg: int = 0
    _gaps: list[int] = field(default_factory=list)  # each segment's time between frames

    def start(self) -> None:
        """Schedule the first frame."""
        self._gaps = [int(len(self.frame) * 8 * NS / rate) for _, _, rate in self.segments]
        if self.segments:
            self.net.engine.at(self.segments[0][0], self._send)

    def _send(self, _: object = None) -> None:
        now = self.net.engine.now_ns
        if now >= self.segments[self._seg][1]:
            self._seg += 1
            if self._seg < len(self.segments):
                self.net.engine.at(self.segments[self._seg][0], self._send)
            return
        self.net.send_from(self.host, self.frame)
        self.sent_packets += 1
        self.sent_wire_bytes += len(self.frame)
        self.net.engine.at(now + self._gaps[self._seg], self._send)


def udp_source(
    net: SimNetwork,
    src: str,
    dst: str,
    port: int,
    segments: list[tuple[int, int, float]],
    payload: int,
    encap: Encap = "none",
    spoof_src: str | None = None,
) -> UdpSource:
    """A UDP source from `src` to `dst`'s `port` sending `payload`-byte datagrams on `segments`,
    shaped as `encap` (frames.py) and with a forged IPv4 source if `spoof_src`."""
    topo = net.topology
    src_mac = flow_mac(net, src, dst, port)
    frame = make_frame(
        encap, topo.address_of(src), topo.address_of(dst), port, payload, src_mac, net.mac_of[dst], spoof_src
    )
    assert encap != "none" or len(frame) == wire_bytes_udp(payload)
    return UdpSource(net, src, frame, segments)
