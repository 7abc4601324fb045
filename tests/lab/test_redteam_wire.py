"""The wire red team's shapes (frames.py WIRE_REDTEAM; bmv2-lab/scenarios/redteam-wire.yaml): what else an attacker
holding limiter.p4, whose parser reads Ethernet, IPv4 and ARP only, writes on the wire from a capped pod's hosts:
IPv6 with extension headers, IPv4 in IPv6, MPLS, PPPoE, 802.3 lengths and the 0x05DD..0x05FF gap, tag stacks and
TPIDs no parser here reads, frames cut to their headers, pause/PFC/LLDP/STP frames to the reserved 01:80:c2
addresses and to a host, another host's MAC as source, the pod's broadcast addresses, a probe look-alike, and
intra-pod traffic to a pod peer. Pod a's hosts a1 and a2 send them (each shape from one of them, through its own
node DPU with node placement) at twice a's cap per shape and then as fast as they write, with pod-uplink and node
placement, in real time on the embedded target (a phase per family) and on bmv2 (every shape in one phase, paced
and flat out); and flat out against a cap in window mode, where a sender that never stops meets every slot's edge as the
window slides. In every window of every pod and direction no more crosses the boundary links than the cap allows
(rate x window + bucket + one frame), as the boundary capture counts every frame there, whatever it holds.

Also a node's host that turns its own offloads on and writes GSO frames longer than its MTU: no frame longer
than units.MAX_FRAME_BYTES (the largest the allowance and buffer_bytes assume) crosses; the embedded target
drops them as a NIC does frames over its largest (this was an expected failure until it did).

The shapes are written by this test (raw sockets in the senders' namespaces, one sending process per host and
phase), not as scenario flows: see frames.py.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.layers.ppp import PPP

from dpu_lab.capture import FrameReader, open_socket
from dpu_lab.config import PhaseSpec, Scenario, load_scenario
from dpu_lab.frames import (
    ENCAPS,
    ETH_MAX,
    WIRE_CLAIMING,
    WIRE_FIXED_LENGTH,
    WIRE_REDTEAM,
    WIRE_SHAPES,
    WireShape,
    claimed_dst,
    host_mac,
    ipv4_packet,
    marked,
    marker,
    wire_frame,
    wire_largest_payload,
)
from dpu_lab.netns import entered
from dpu_lab.report import Phase, Report
from dpu_lab.runner import START_DELAY_S as START_S
from dpu_lab.runner import LabRun
from dpu_limiter.units import MAX_FRAME_BYTES
from helpers.netns import can_netns
from helpers.paths import ROOT

SCENARIO = ROOT / "bmv2-lab" / "scenarios" / "redteam-wire.yaml"
CAP_BPS = 8e6  # pod a's cap, both directions (redteam-wire.yaml)
FULL_S = 2.0  # each family again for this long as fast as its senders write
PPS_MOST = 3000  # a paced shape's frames per second at most (a 14-byte runt at twice the cap would be 143,000)
# Each phase's shapes (the scenario's phases by name; "-full" phases send the same as fast as they can).
FAMILIES: dict[str, tuple[WireShape, ...]] = {
    "carriers": (
        "ipv6-ext",
        "ipv6-frag",
        "ipv4-in-ipv6",
        "mpls",
        "mpls-mcast",
        "pppoe-session",
        "pppoe-discovery",
        "llc-snap",
        "llc-gap",
        "llc-len-short",
        "vlan-stack3",
        "vlan-9100",
        "vlan-prio",
        "runt",
        "ipv4-bare",
    ),
    "control": (
        "pause",
        "pfc",
        "lldp",
        "lldp-unicast",
        "stp",
        "src-foreign",
        "src-peer",
        "ipv4-bcast-pod",
        "ipv4-bcast-all",
        "arp-request-bcast",
        "probe-lookalike",
        "intra-peer",
    ),
}
SENDERS = ("a1", "a2")  # a family's shapes go to the senders in turn
ALL = "all"  # a phase of every family at once (the bmv2 runs: fewer phases, the CI's time)


def shapes_of(phase: str) -> tuple[WireShape, ...]:
    """The shapes a phase sends: its family's ("carriers", "carriers-full", ...), or every one ("all-full")."""
    family = phase.partition("-")[0]
    return WIRE_SHAPES if family == ALL else FAMILIES[family]


# The sending process, in a sender's namespace: standard library and dpu_lab.frames only. Its one argument is a
# JSON job: the interface, the frames by shape, the rate per shape (None: as fast as it writes, the shapes in
# turn), when to start and for how long; it prints what it sent per shape ([frames, bytes, errors]) as JSON.
SENDER = r"""
import errno, json, socket, sys, time
job = json.loads(sys.argv[1])
frames = {s: bytes.fromhex(h) for s, h in job["frames"].items()}
names = list(frames)
sent = {s: [0, 0, 0] for s in names}
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
sock.bind((job["iface"], 0))
time.sleep(max(0.0, job["start_at"] - time.time()))
until = time.monotonic() + job["duration"]
def send(s):
    try:
        sock.send(frames[s])
        sent[s][0] += 1
        sent[s][1] += len(frames[s])
    except OSError as exc:
        if exc.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.EMSGSIZE):
            raise
        sent[s][2] += 1
rate = job["rate_bps"]
if rate is None:
    while time.monotonic() < until:
        for s in names:
            send(s)
else:
    gap = {s: max(len(f) * 8 / rate, 1 / job["pps_most"]) for s, f in frames.items()}
    now = time.monotonic()
    due = {s: now for s in names}
    while (now := time.monotonic()) < until:
        s = min(names, key=due.__getitem__)
        if due[s] > now:
            time.sleep(min(due[s] - now, until - now))
            continue
        send(s)
        due[s] = max(due[s] + gap[s], now - 0.05)  # a sender that fell behind catches up 50 ms at most
print(json.dumps(sent))
"""


def wire_scenario(
    placement: str, mode: str = "rate", paced: bool = True, burst_bytes: int | None = None, merged: bool = False
) -> Scenario:
    """redteam-wire.yaml with `placement` for every pod and pod a's cap in `mode` (its bucket `burst_bytes`, if
    given); its phases at twice the cap (if `paced`), then each again as a "-full" phase of FULL_S s; `merged`:
    one phase of every shape ("all") instead of a phase per family."""
    doc: dict[str, Any] = load_scenario(SCENARIO).model_dump(mode="json")
    for pod in doc["topology"]["pods"]:
        pod["placement"] = placement
    doc["caps"][0]["mode"] = mode
    if burst_bytes is not None:
        doc["caps"][0]["burst_bytes"] = burst_bytes
    if merged:
        doc["phases"] = [{**doc["phases"][0], "name": ALL}]
    full = [
        {
            "name": f"{ph['name']}-full",
            "duration_s": FULL_S,
            "flows": [{**f, "name": f"{f['name']}-full"} for f in ph["flows"]],
        }
        for ph in doc["phases"]
    ]
    doc["phases"] = (doc["phases"] if paced else []) + full
    return Scenario.model_validate(doc)


class WireRun(LabRun):
    """A lab run in which, during each phase, pod a's hosts also write the phase's family of wire shapes."""

    senders: list[tuple[str, subprocess.Popen[str]]]
    sent: dict[str, dict[str, list[int]]]  # phase -> shape -> [frames, bytes, errors]
    frames: dict[str, dict[str, bytes]]  # phase -> shape -> the frame its sender wrote (each shape writes one)

    async def begin_phase(self, phase: PhaseSpec) -> Phase:
        started = await super().begin_phase(phase)
        assert self.net is not None
        net, topo = self.net, self.scenario.topology
        full = phase.name.partition("-")[2]
        peers = {"a1": "a2", "a2": "a1"}
        self.senders = getattr(self, "senders", [])
        for k, host in enumerate(SENDERS):
            peer, port = peers[host], self._port
            self._port += 1
            shapes = shapes_of(phase.name)[k :: len(SENDERS)]
            frames = {
                s: wire_frame(
                    s,
                    topo.address_of(host),
                    topo.address_of("b1"),
                    port,
                    wire_largest_payload(s),
                    net.mac_of(host, port),
                    net.mac_of("b1"),
                    peer=(topo.address_of(peer), net.mac_of(peer)),
                ).hex()
                for s in shapes
            }
            job = {
                "iface": "eth0",
                "frames": frames,
                "rate_bps": None if full else 2 * CAP_BPS,
                "pps_most": PPS_MOST,
                "start_at": self.t_start + started.start,
                "duration": phase.duration_s,
            }
            self.frames = getattr(self, "frames", {})
            self.frames.setdefault(phase.name, {}).update({s: bytes.fromhex(f) for s, f in frames.items()})
            cmd = ["ip", "netns", "exec", net.host_ns[host], sys.executable, "-c", SENDER, json.dumps(job)]
            popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.senders.append((phase.name, popen))
        return started

    async def end_phase(self) -> None:
        try:
            await super().end_phase()
        finally:
            self.sent = getattr(self, "sent", {})
            for name, popen in self.senders:
                out, err = popen.communicate(timeout=30)
                assert popen.returncode == 0, err
                self.sent.setdefault(name, {}).update(json.loads(out))
            self.senders = []

    def cleanup(self) -> None:
        for _, popen in getattr(self, "senders", []):
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)  # ours, by handle
                popen.wait(timeout=10)
        super().cleanup()


def assert_held(r: Report) -> None:
    """Every pod and direction, its largest window on the wire within its allowance."""
    seen = [(x.pod, x.direction, x.max_window_bytes, x.allowed_window_bytes) for x in r.results]
    assert {(pod, d) for pod, d, _, _ in seen} == {(p, d) for p in ("a", "b") for d in ("egress", "ingress")}
    assert r.cap_held, seen
    assert all(most <= allowed for _, _, most, allowed in seen), seen


def assert_attacked(r: Report, run: WireRun) -> None:
    """The attack was real: every shape was sent, and in every phase pod a's hosts wrote more than one window's
    allowance (else a held cap would prove nothing)."""
    allowance = next(x.allowed_window_bytes for x in r.results if (x.pod, x.direction) == ("a", "egress"))
    for ph in run.scenario.phases:
        shapes = run.sent[ph.name]
        assert set(shapes) == set(shapes_of(ph.name)), ph.name
        assert all(frames > 0 for frames, _, _ in shapes.values()), (ph.name, shapes)
        assert sum(b for _, b, _ in shapes.values()) > allowance, (ph.name, shapes)


def run_wire(tmp_path: Path, target: str, sc: Scenario) -> tuple[Report, WireRun]:
    """Run `sc` on `target` with the wire shapes, or skip saying what is missing."""
    if reason := can_netns():
        pytest.skip(reason)
    if target == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    run = WireRun(sc, tmp_path / "out", target, "builtin")  # type: ignore[arg-type]
    return run.run(), run


# ---------------------------------------------------------------- the shapes


SRC_MAC, DST_MAC, PEER_MAC = host_mac(0, 1, port=5201), host_mac(1, 1), host_mac(0, 2)


def shaped(shape: WireShape, payload: int = 1000) -> bytes:
    """A frame of `shape` from 10.0.1.1 (flow 5201) toward 10.0.2.1, its pod peer 10.0.1.2."""
    return wire_frame(shape, "10.0.1.1", "10.0.2.1", 5201, payload, SRC_MAC, DST_MAC, peer=("10.0.1.2", PEER_MAC))


def test_every_wire_shape_is_in_a_family_and_none_is_an_encap() -> None:
    assert sorted(s for f in FAMILIES.values() for s in f) == sorted(WIRE_SHAPES) == sorted(WIRE_REDTEAM)
    assert not set(WIRE_SHAPES) & set(ENCAPS)
    assert [ph.name for ph in load_scenario(SCENARIO).phases] == list(FAMILIES)


@pytest.mark.parametrize("shape", WIRE_SHAPES)
def test_each_wire_shape_fits_the_mtu_and_carries_the_marker(shape: WireShape) -> None:
    raw = shaped(shape, wire_largest_payload(shape))
    assert len(raw) == WIRE_FIXED_LENGTH.get(shape, ETH_MAX), WIRE_REDTEAM[shape]
    assert len(shaped(shape)) == WIRE_FIXED_LENGTH.get(shape, 14 + 20 + 8 + 1000)
    if shape not in WIRE_FIXED_LENGTH or shape == "arp-request-bcast":
        assert marked(raw[:134]) == ("10.0.1.1", 5201)  # where a receiver's capture reads
    if shape in WIRE_CLAIMING:
        claim = bytes(map(int, claimed_dst("10.0.1.1").split(".")))
        assert claim in raw and b"\x0a\x00\x01\x01" in raw  # the sender's pod at both ends


def test_the_wire_shapes_are_what_they_say() -> None:
    pkt = {s: Ether(shaped(s)) for s in WIRE_SHAPES}
    assert pkt["ipv6-ext"][IPv6].nh == 0 and pkt["ipv6-ext"][UDP].dport == 5201
    assert pkt["ipv6-frag"][IPv6ExtHdrFragment].m == 1 and pkt["ipv6-frag"][IPv6ExtHdrFragment].offset == 0
    assert pkt["ipv4-in-ipv6"][IPv6].nh == 4 and pkt["ipv4-in-ipv6"][IP].dst == "10.0.1.77"
    assert pkt["pppoe-session"][PPP].proto == 0x0021 and pkt["pppoe-session"][IP].dst == "10.0.1.77"
    assert pkt["llc-snap"][IP].dst == "10.0.1.77"
    tags = [pkt["vlan-stack3"].getlayer(Dot1Q, nb=n) for n in (1, 2, 3)]
    assert [t.vlan for t in tags if t is not None] == [100, 200, 300]
    assert pkt["vlan-prio"][Dot1Q].vlan == 0 and pkt["vlan-prio"][Dot1Q].prio == 7
    assert pkt["probe-lookalike"][UDP].dport == 60000 and bytes(pkt["probe-lookalike"][UDP].payload)[:6] == b"DLP1\x01a"
    assert pkt["arp-request-bcast"][ARP].op == 1 and pkt["arp-request-bcast"].dst == "ff:ff:ff:ff:ff:ff"
    raw = {s: shaped(s) for s in WIRE_SHAPES}
    assert {s: raw[s][12:14].hex() for s in ("mpls", "mpls-mcast", "llc-gap", "vlan-9100", "pause", "lldp")} == {
        "mpls": "8847",
        "mpls-mcast": "8848",
        "llc-gap": "05ff",
        "vlan-9100": "9100",
        "pause": "8808",
        "lldp": "88cc",
    }
    assert raw["pause"][:6].hex() == "0180c2000001" and raw["lldp"][:6].hex() == "0180c200000e"
    assert raw["stp"][:6].hex() == "0180c2000000" and raw["llc-len-short"][12:14] == b"\x00\x2e"
    assert raw["pfc"][14:16] == b"\x01\x01" and raw["pfc"][:6] == DST_MAC
    assert raw["src-foreign"][6:12] == DST_MAC and raw["src-peer"][6:12] == PEER_MAC
    assert raw["intra-peer"][:6] == PEER_MAC and pkt["intra-peer"][IP].dst == "10.0.1.2"
    assert pkt["ipv4-bcast-pod"][IP].dst == "10.0.1.255" and pkt["ipv4-bcast-all"][IP].dst == "255.255.255.255"
    assert raw["runt"] == DST_MAC + SRC_MAC + b"\x08\x00" and pkt["ipv4-bare"][IP].len == 20
    with pytest.raises(ValueError, match="needs a pod peer"):
        wire_frame("intra-peer", "10.0.1.1", "10.0.2.1", 5201, 100, SRC_MAC, DST_MAC)


# ---------------------------------------------------------------- real time


@pytest.mark.netns
@pytest.mark.timeout(300)
@pytest.mark.parametrize("placement", ["pod-uplink", "node"])
@pytest.mark.parametrize("target", ["embedded", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def test_no_wire_shape_gets_past_the_cap_in_real_time(tmp_path: Path, target: str, placement: str) -> None:
    # Two node DPUs on bmv2 split a's bucket; each needs room for bmv2's 294 kB of queues after its meter. On bmv2
    # every shape is in one phase at twice the cap and one flat out (the CI's time), not a phase per family.
    embedded = target == "embedded"
    burst = None if embedded or placement == "pod-uplink" else 800_000
    sc = wire_scenario(placement, burst_bytes=burst, merged=not embedded)
    r, run = run_wire(tmp_path, target, sc)
    assert_attacked(r, run)
    assert_held(r)


@pytest.mark.netns
@pytest.mark.timeout(300)
def test_no_wire_shape_gets_past_a_window_budget_flat_out(tmp_path: Path) -> None:
    # Flat out, a's senders spend the budget within a fraction of a second and then meet every slot that leaves
    # the window as it leaves it: the window's edge, all the time.
    r, run = run_wire(tmp_path, "embedded", wire_scenario("pod-uplink", mode="window", paced=False, merged=True))
    assert_attacked(r, run)
    assert_held(r)
    a_out = next(x for x in r.results if (x.pod, x.direction) == ("a", "egress"))
    assert a_out.max_window_bytes > 0.5 * CAP_BPS / 8 * a_out.window_s  # the budget was spent, not starved
    assert math.isclose(a_out.cap_bps, CAP_BPS)


# A node's host, which holds its own namespace, turns its interface's offloads on and writes GSO frames (a
# virtio-net header, PACKET_VNET_HDR) of one segment longer than its 1500-byte MTU: a veth forwards a GSO frame
# whatever its length, and the node DPU's uplink port, sized for sealed frames, has an MTU of 1600.
GSO_SENDER = r"""
import json, socket, struct, sys, time
from pyroute2.ethtool import Ethtool
job = json.loads(sys.argv[1])
with Ethtool() as et:
    feats = et.get_features("eth0")
    for name in ("tx-checksum-ip-generic", "tx-scatter-gather", "tx-tcp-segmentation", "tx-generic-segmentation"):
        f = feats.features.get(name)
        if f is not None and f.available:
            f.enable = True
    et.set_features("eth0", feats)
    if not et.get_features("eth0").features["tx-tcp-segmentation"].enable:
        sys.exit("eth0 kept TSO off: the kernel would cut the GSO frames to the MTU before the DPU")
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
sock.setsockopt(263, 15, 1)  # SOL_PACKET, PACKET_VNET_HDR
sock.bind(("eth0", 0))
frame = bytes.fromhex(job["frame"])
vnet = struct.pack("=BBHHHH", 1, 1, 54, 1448, 34, 16)  # needs checksum, TCPv4 GSO, headers 54, MSS 1448
time.sleep(max(0.0, job["start_at"] - time.time()))
until, gap, sent = time.monotonic() + job["duration"], len(frame) * 8 / job["rate_bps"], 0
due = time.monotonic()
while time.monotonic() < until:
    time.sleep(max(0.0, due - time.monotonic()))
    sock.send(vnet + frame)
    sent += 1
    due += gap
print(json.dumps(sent))
"""
GSO_FRAME = 1614  # a 1600-byte IPv4 packet: the uplink port's MTU


class OversizeRun(LabRun):
    """A lab run in which a1 writes GSO_FRAME-byte TCP/IPv4 frames to b1 at twice a's cap, and a socket at the
    router's end of pod a's link records the longest frame that crossed it."""

    gso: subprocess.Popen[str] | None = None
    longest: int = 0
    sent: int = 0
    reader: threading.Thread | None = None

    async def begin_phase(self, phase: PhaseSpec) -> Phase:
        started = await super().begin_phase(phase)
        assert self.net is not None
        net, topo = self.net, self.scenario.topology
        port = self._port
        self._port += 1
        src, dst = topo.address_of("a1"), topo.address_of("b1")
        tcp = struct.pack("!HHIIBBHHH", 40000, port, 1, 0, 5 << 4, 0x18, 65535, 0, 0)
        body = marker(src, port) + bytes(GSO_FRAME - 14 - 20 - 20 - 12)
        frame = net.mac_of("b1") + net.mac_of("a1", port) + b"\x08\x00" + ipv4_packet(src, dst, 6, tcp + body)
        with entered(net.router_ns):
            sock = open_socket(net.router_ports["a"], "in")
        deadline = time.monotonic() + START_S + phase.duration_s + 1.0

        def read() -> None:
            with sock:
                for f in FrameReader(sock).frames(deadline):
                    self.longest = max(self.longest, f.wire)

        self.reader = threading.Thread(target=read)
        self.reader.start()
        job = {"frame": frame.hex(), "rate_bps": 2 * CAP_BPS}
        job |= {"start_at": self.t_start + started.start, "duration": phase.duration_s}
        cmd = ["ip", "netns", "exec", net.host_ns["a1"], sys.executable, "-c", GSO_SENDER, json.dumps(job)]
        self.gso = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return started

    async def end_phase(self) -> None:
        try:
            await super().end_phase()
        finally:
            if self.gso is not None:
                out, err = self.gso.communicate(timeout=30)
                assert self.gso.returncode == 0, err
                self.sent = json.loads(out)
            if self.reader is not None:
                self.reader.join(timeout=30)

    def cleanup(self) -> None:
        if self.gso is not None and self.gso.poll() is None:
            self.gso.send_signal(signal.SIGTERM)  # ours, by handle
            self.gso.wait(timeout=10)
        super().cleanup()


@pytest.mark.netns
@pytest.mark.timeout(300)
def test_no_frame_longer_than_the_lab_assumes_crosses_from_a_node(tmp_path: Path) -> None:
    """A node host that turns TSO on and writes one-segment GSO frames of 1,614 B: before the embedded target took
    no frame longer than units.MAX_FRAME_BYTES (its --max-frame-bytes, as a NIC's largest frame), 1,020 of them
    crossed in 3 s at 16 Mbit/s, longer than the one frame each window's allowance and each DPU's buffer_bytes
    count on (the cap held: 1,189,846 B of a1's 1,201,518 B share). On bmv2 they did not cross."""
    if reason := can_netns():
        pytest.skip(reason)
    doc: dict[str, Any] = load_scenario(SCENARIO).model_dump(mode="json")
    for pod in doc["topology"]["pods"]:
        pod["placement"] = "node"
    doc["phases"] = [{**doc["phases"][0], "duration_s": 2.0}]
    run = OversizeRun(Scenario.model_validate(doc), tmp_path / "out", "embedded", "builtin")
    r = run.run()
    assert run.sent > 0 and run.longest > 0
    assert_held(r)
    assert run.longest <= MAX_FRAME_BYTES, f"a {run.longest}-byte frame crossed ({run.sent} sent)"
