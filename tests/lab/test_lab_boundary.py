"""The lab's compliance view counts every frame that crosses a pod boundary, whatever it holds.

Frames that are not IPv4 (an experimental EtherType, ARP's EtherType on 1500-byte frames) sent from a
pod-a host toward pod b must count as a's egress and b's ingress on the boundary links, byte for byte
what an independent capture (tcpdump on the same interface, read with the small pcap reader below)
sees there; in real time over a scale-up link and through the limiters and the router in a full lab
run, and in virtual time on the simulated links. The data plane may pass such frames or not: these
tests check the counting, not the limiter.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpu_lab.boundary import BoundaryProcess, Counter, Tap, key, taps_of, write_taps
from dpu_lab.capture import LOST_FRAME_BOUND, Capture, load_capture
from dpu_lab.config import Scenario, Topology, load_scenario
from dpu_lab.netns import LabNetwork, entered
from dpu_lab.runner import LabRun
from dpu_lab.sim import NS, Engine, SimNetwork
from dpu_softswitch.clock import VirtualClock
from helpers.netns import can_netns
from helpers.paths import ROOT

FRAME = 1500  # bytes on the wire (Ethernet header included, no FCS)
ETH_EXPERIMENTAL = 0x88B5  # IEEE 802 local experimental EtherType: no limiter or stack knows it
ETH_ARP = 0x0806


def raw_frame(dst: bytes, src: bytes, ethertype: int, seq: int) -> bytes:
    """A FRAME-byte Ethernet frame of `ethertype` (no IPv4 anywhere in it) with a sequence number."""
    return dst + src + struct.pack("!HI", ethertype, seq) + bytes(FRAME - 18)


def topology(name: str) -> Topology:
    """One of the lab's topology files."""
    return Topology.model_validate(yaml.safe_load((ROOT / "bmv2-lab" / "topologies" / name).read_text()))


def scenario(tmp_path: Path, topology: str, caps: list[dict[str, Any]], phases: list[dict[str, Any]]) -> Scenario:
    """A scenario on one of the lab's topologies."""
    doc = {"name": "boundary", "topology": str(ROOT / "bmv2-lab" / "topologies" / topology)}
    path = tmp_path / "boundary.yaml"
    path.write_text(yaml.safe_dump({**doc, "caps": caps, "phases": phases}))
    return load_scenario(path)


# ---------------------------------------------------------------- an independent capture: tcpdump


class Tcpdump:
    """tcpdump writing every frame of one direction of an interface to a pcap file (nanosecond stamps)."""

    def __init__(self, ns: str, iface: str, direction: str, out: Path) -> None:
        cmd = ["tcpdump", "-i", iface, "-Q", direction, "-n", "-U", "-s", "64", "-w", str(out)]
        cmd += ["--time-stamp-precision", "nano", "--immediate-mode"]  # each frame written as it comes
        self.out = out
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *cmd] if ns else cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline().decode()  # "listening on IF, ...": capturing from now on
        assert "listening on" in line, line

    def stop(self) -> str:
        """Stop it (by its handle) and return what it said at exit (its drop counts)."""
        if self.proc.poll() is None:
            time.sleep(0.3)  # the last frames through its reader
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        return err.decode()


def read_pcap(path: Path) -> list[tuple[int, int, int]]:
    """(time in ns, frame length on the wire, EtherType) of each frame in a pcap file."""
    data = path.read_bytes()
    magic = struct.unpack_from("<I", data)[0]
    order = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    nano = struct.unpack_from(order + "I", data)[0] == 0xA1B23C4D
    frames, at = [], 24
    while at + 16 <= len(data):
        sec, frac, incl, orig = struct.unpack_from(order + "IIII", data, at)
        head = data[at + 16 : at + 16 + incl]
        ethertype = struct.unpack_from("!H", head, 12)[0] if len(head) >= 14 else -1
        frames.append((sec * NS + (frac if nano else frac * 1000), orig, ethertype))
        at += 16 + incl
    return frames


def bytes_in(frames: list[tuple[int, int, int]], lo_ms: int, hi_ms: int) -> int:
    """Bytes of the frames stamped in 1 ms bins lo_ms..hi_ms (on the absolute grid, as the captures bin)."""
    return sum(n for t, n, _ in frames if lo_ms <= t // 1_000_000 <= hi_ms)


def boundary_in(cap: Capture, k: str, lo_ms: int, hi_ms: int) -> int:
    """Bytes the boundary capture counted under key `k` in 1 ms bins lo_ms..hi_ms."""
    t0, bin_s, bins = cap.series(k)
    first = round(t0 / bin_s)
    return sum(b for i, b in enumerate(bins) if lo_ms <= first + i <= hi_ms)


PACKET_QDISC_BYPASS = 20  # linux/if_packet.h: send straight to the driver, past the qdisc and the taps


def inject(ns: str, iface: str, frames: list[bytes], rate_bps: float, start_at: float, bypass: bool = False) -> None:
    """Write `frames` on `iface` in namespace `ns` from `start_at` (UNIX time), paced at about `rate_bps`
    (with `bypass`, past the sender's own taps of outgoing frames)."""
    with entered(ns):  # the socket stays in the host's namespace
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    with sock:
        if bypass:
            sock.setsockopt(263, PACKET_QDISC_BYPASS, 1)  # SOL_PACKET
        sock.bind((iface, 0))
        time.sleep(max(0.0, start_at - time.time()))
        t0, gap = time.monotonic(), FRAME * 8 / rate_bps
        for i, f in enumerate(frames):
            ahead = t0 + i * gap - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            sock.send(f)


# ---------------------------------------------------------------- real time


@pytest.mark.netns
def test_non_ipv4_frames_over_a_scale_up_link_are_counted_for_both_pods(tmp_path: Path) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed (the independent capture this test compares with)")
    net = LabNetwork(topology("two-pods-nvswitch.yaml"))
    net.build()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ns_a, ns_b = net.host_ns["a1"], net.host_ns["b1"]
        # Independent captures at the far end (b1's end of the link) and on the counted end itself.
        far = Tcpdump(ns_b, "nvs0", "in", tmp_path / "far.pcap")
        near = Tcpdump(ns_a, "nvs0", "out", tmp_path / "near.pcap")
        procs += [far.proc, near.proc]
        taps = tmp_path / "taps.json"
        write_taps(taps, taps_of(net))
        popen = subprocess.Popen(
            [sys.executable, "-m", "dpu_lab.boundary", "--taps", str(taps), "--duration", "120"]
            + ["--out", str(tmp_path / "boundary.json"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        procs.append(popen)
        crossed = BoundaryProcess(popen, tmp_path / "boundary.json")
        crossed.totals(timeout_s=60)  # its sockets are open
        mac_a, mac_b = net.mac_of("a1"), net.mac_of("b1")
        frames = [raw_frame(mac_b, mac_a, (ETH_EXPERIMENTAL, ETH_ARP)[i % 2], i) for i in range(400)]
        inject(ns_a, "nvs0", frames, 20e6, time.time())
        live = crossed.totals()
        cap = crossed.finish()
        near_out, far_in = near.stop(), far.stop()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
        net.teardown()
    sent = len(frames) * FRAME
    got_far = sum(n for _, n, _ in read_pcap(tmp_path / "far.pcap"))
    got_near = sum(n for _, n, _ in read_pcap(tmp_path / "near.pcap"))
    assert "\n0 packets dropped by kernel" in near_out and "\n0 packets dropped by kernel" in far_in
    assert got_near == got_far == sent  # nothing else crosses this link
    assert cap.kernel_drops == 0
    # Every frame, none of them IPv4, counted once as a's egress and once as b's ingress.
    for k in (key("a", "egress", "scale-up"), key("b", "ingress", "scale-up")):
        assert abs(cap.total_bytes(k) - got_near) <= FRAME, k
        assert live[k] == cap.total_bytes(k)  # the live answer already held every frame sent before it
    assert cap.total_bytes(key("b", "egress", "scale-up")) == cap.total_bytes(key("a", "ingress", "scale-up")) == 0


def nvs_macs() -> tuple[bytes, bytes]:
    """a1's and b1's MACs on two-pods-nvswitch (a lab network's MACs follow from its topology)."""
    net = LabNetwork(topology("two-pods-nvswitch.yaml"))
    return net.mac_of("a1"), net.mac_of("b1")


def counted_on_scaleup(
    send: Callable[[LabNetwork], None], rcvbuf: int = 8 << 20, extra: Callable[[LabNetwork], list[Tap]] | None = None
) -> Capture:
    """What the boundary capture counts on the two-pods-nvswitch scale-up link while `send` sends frames
    over it (nobody reads meanwhile), with sockets of `rcvbuf` bytes (and on the `extra` taps beside)."""
    net = LabNetwork(topology("two-pods-nvswitch.yaml"))
    net.build()
    try:
        taps = [t for t in taps_of(net) if t.kind == "scale-up"] + (extra(net) if extra else [])
        counter = Counter(taps, rcvbuf=rcvbuf)
        try:
            send(net)
            time.sleep(0.2)
            counter.drain(final=True)
            return counter.result()
        finally:
            counter.close()
    finally:
        net.teardown()


@pytest.mark.netns
def test_a_flood_one_way_loses_frames_only_that_way_and_the_loss_is_bounded(tmp_path: Path) -> None:
    """A reader that falls behind a flood sent from a1 over the scale-up link loses frames of that direction
    only (a socket per direction): what b1 sends back meanwhile is counted whole, and the flood's counts plus
    the bound on what it lost cover every byte sent."""
    if reason := can_netns():
        pytest.skip(reason)
    mac_a, mac_b = nvs_macs()
    flood = [raw_frame(mac_b, mac_a, ETH_EXPERIMENTAL, i) for i in range(2000)]
    back = [raw_frame(mac_a, mac_b, ETH_EXPERIMENTAL, i) for i in range(10)]

    def send(net: LabNetwork) -> None:
        inject(net.host_ns["a1"], "nvs0", flood, 10e9, time.time())  # unpaced, and nobody reads meanwhile
        inject(net.host_ns["b1"], "nvs0", back, 10e9, time.time())

    cap = counted_on_scaleup(send, rcvbuf=64 << 10)  # a few dozen frames: the flood overflows it at once
    sent_keys = (key("a", "egress", "scale-up"), key("b", "ingress", "scale-up"))
    back_keys = (key("b", "egress", "scale-up"), key("a", "ingress", "scale-up"))
    assert cap.kernel_drops > 0  # the test's premise: the reader fell behind
    for k in back_keys:
        assert cap.total_bytes(k) == len(back) * FRAME and cap.lost_bytes.get(k, 0) == 0, k
    for k in sent_keys:
        # Each lost frame is bounded by the largest frame any Linux link carries (65,535 and its headers).
        assert cap.lost_bytes[k] == cap.kernel_drops * LOST_FRAME_BOUND, k
        assert cap.total_bytes(k) + cap.lost_bytes[k] >= len(flood) * FRAME, k
        assert cap.total_bytes(k) < len(flood) * FRAME, k


@pytest.mark.netns
def test_frames_sent_past_the_senders_own_taps_are_counted_where_they_arrive(tmp_path: Path) -> None:
    """A host can send with PACKET_QDISC_BYPASS, which skips its own end's taps of outgoing frames (a red
    team crossed 15,000,000 B uncounted that way when the scale-up link was watched at the sender's end):
    each direction is counted where it arrives."""
    if reason := can_netns():
        pytest.skip(reason)
    mac_a, mac_b = nvs_macs()
    frames = [raw_frame(mac_b, mac_a, ETH_EXPERIMENTAL, i) for i in range(300)]
    cap = counted_on_scaleup(lambda net: inject(net.host_ns["a1"], "nvs0", frames, 20e6, time.time(), bypass=True))
    assert cap.kernel_drops == 0
    for k in (key("a", "egress", "scale-up"), key("b", "ingress", "scale-up")):
        assert cap.total_bytes(k) == len(frames) * FRAME, k


XDP_DROP_PROGRAM = struct.pack("<BBhi", 0xB7, 0, 0, 1) + struct.pack("<BBhi", 0x95, 0, 0, 0)  # return XDP_DROP


def drop_with_xdp(ns: str, iface: str) -> None:
    """Attach an XDP program to `iface` in `ns` that takes every frame off it before the kernel's taps (here it
    drops them; an AF_XDP socket would read them the same way, unseen)."""
    from pyroute2 import IPRoute

    from dpu_lab.relay import BPF_PROG_TYPE_XDP, load

    with entered(ns):
        fd = load(XDP_DROP_PROGRAM, BPF_PROG_TYPE_XDP, b"hide_frames")
        try:
            with IPRoute() as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=iface)[0], xdp_fd=fd)
        finally:
            os.close(fd)  # the interface holds the program now


@pytest.mark.netns
def test_frames_a_receiver_takes_off_its_interface_before_the_taps_are_counted_all_the_same(tmp_path: Path) -> None:
    """A receiving host can take frames off its end of a scale-up link with XDP before the kernel's taps see
    them (a tap at its end, where the capture used to count, sees none): the link is counted in the lab's own
    namespace between the hosts, where no host holds an interface."""
    if reason := can_netns():
        pytest.skip(reason)
    mac_a, mac_b = nvs_macs()
    frames = [raw_frame(mac_b, mac_a, ETH_EXPERIMENTAL, i) for i in range(300)]

    def send(net: LabNetwork) -> None:
        drop_with_xdp(net.host_ns["b1"], "nvs0")
        inject(net.host_ns["a1"], "nvs0", frames, 20e6, time.time(), bypass=True)

    def at_b1(net: LabNetwork) -> list[Tap]:
        return [Tap(net.host_ns["b1"], "nvs0", "router", received=(("hidden", "ingress"),), sent=())]

    cap = counted_on_scaleup(send, extra=at_b1)
    assert cap.kernel_drops == 0
    assert cap.total_bytes(key("hidden", "ingress", "router")) == 0  # the premise: b1's own end saw nothing
    for k in (key("a", "egress", "scale-up"), key("b", "ingress", "scale-up")):
        assert cap.total_bytes(k) == len(frames) * FRAME, k


class InjectingRun(LabRun):
    """A lab run in which pod a's host a1 also writes raw non-IPv4 frames to b1 during the phase, with
    tcpdump on the boundary interfaces from before the boundary capture starts until after it ends."""

    frames: list[bytes]
    dumps: dict[str, Tcpdump]
    injector: threading.Thread

    def _start_boundary(self) -> Any:
        assert self.net is not None
        raw = self.out_dir / "raw"
        net = self.net
        uplink_b = next(lim.host_if for lim in net.limiters if lim.pod == "b")
        self.dumps = {
            "a egress": Tcpdump(net.router_ns, net.router_ports["a"], "in", raw / "a-egress.pcap"),
            "b ingress": Tcpdump("", uplink_b, "out", raw / "b-ingress.pcap"),
        }
        mac_a, mac_b = net.mac_of("a1"), net.mac_of("b1")
        self.frames = [raw_frame(mac_b, mac_a, (ETH_EXPERIMENTAL, ETH_ARP)[i % 2], i) for i in range(3000)]
        return super()._start_boundary()

    async def begin_phase(self, phase: Any) -> Any:
        assert self.net is not None
        started = await super().begin_phase(phase)
        # 3000 frames at 12 Mbit/s take 3 s of the 4 s phase.
        at = self.t_start + started.start + 0.2
        self.injector = threading.Thread(target=inject, args=(self.net.host_ns["a1"], "eth0", self.frames, 12e6, at))
        self.injector.start()
        return started

    async def end_phase(self) -> None:
        try:
            await super().end_phase()
        finally:
            self.injector.join()

    def cleanup(self) -> None:
        for dump in getattr(self, "dumps", {}).values():
            dump.stop()
        super().cleanup()


@pytest.mark.netns
@pytest.mark.timeout(300)
def test_non_ipv4_frames_through_the_router_are_the_senders_egress_and_the_receivers_ingress(
    tmp_path: Path,
) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed (the independent capture this test compares with)")
    caps = [
        {"pod": "a", "egress": "8M", "ingress": "8M", "window_s": 1, "burst_bytes": 100_000},
        {"pod": "b", "egress": "100M", "ingress": "100M", "window_s": 1, "burst_bytes": 1_000_000},
    ]
    flows = [{"name": "a-to-b", "protocol": "udp", "src": "a1", "dst": "b1", "rate": "2M"}]
    sc = scenario(tmp_path, "two-pods.yaml", caps, [{"name": "p", "duration_s": 4, "flows": flows}])
    run = InjectingRun(sc, tmp_path / "out", "embedded", "builtin")
    report = run.run()
    raw = tmp_path / "out" / "raw"
    cap = load_capture(raw / "boundary.json")
    assert cap.kernel_drops == 0
    # Compare over whole 1 ms bins where both certainly ran: from the run's start to the end of its linger.
    lo_ms = math.floor(run.t_start * 1000)
    hi_ms = math.floor((run.t_start + 1.5 + 4 + 1.0) * 1000)
    results = {(r.pod, r.direction): r for r in report.results}
    for where, k in (("a egress", key("a", "egress", "router")), ("b ingress", key("b", "ingress", "uplink"))):
        frames = read_pcap(raw / f"{where.replace(' ', '-')}.pcap")
        independent = bytes_in(frames, lo_ms, hi_ms)
        assert abs(boundary_in(cap, k, lo_ms, hi_ms) - independent) <= FRAME + 18, where
        # The non-IPv4 frames that crossed are in the verdict's figure, which counts all of the link.
        crossed = sum(n for _, n, et in frames if et in (ETH_EXPERIMENTAL, ETH_ARP) and n == FRAME)
        assert crossed > 0, f"no injected frame crossed at {where}"  # a's cap leaves room for some
        pod, direction = where.split()
        assert results[(pod, direction)].boundary_bytes == cap.total_bytes(k)
    # The receivers cannot attribute the non-IPv4 frames to pod a; the boundary counted them as a's.
    a_frames = read_pcap(raw / "a-egress.pcap")
    non_ipv4 = sum(n for _, n, et in a_frames if et in (ETH_EXPERIMENTAL, ETH_ARP) and n == FRAME)
    a_out = results[("a", "egress")]
    assert a_out.receivers_bytes is not None and a_out.boundary_bytes is not None
    assert a_out.boundary_bytes >= a_out.receivers_bytes + non_ipv4
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "receivers' bytes" in summary and str(a_out.boundary_bytes) in summary


# ---------------------------------------------------------------- virtual time


def passthrough(port: int, frame: bytes) -> list[tuple[int, bytes]]:
    """A limiter that forwards every frame to its other port: the counting, not the cap, is tested."""
    return [(1 - port, frame)]


@pytest.mark.parametrize("placement", ["pod-uplink", "node"])
def test_virtual_time_counts_every_frame_on_the_boundary_links(tmp_path: Path, placement: str) -> None:
    base = topology("two-pods-nvswitch.yaml")
    topo = base.model_copy(update={"pods": [p.model_copy(update={"placement": placement}) for p in base.pods]})
    limiters = {name: passthrough for p in topo.pods for name in p.limiters()}
    net = SimNetwork(topo, limiters, Engine(VirtualClock()))
    n = 100
    # a1 reaches b1 over the scale-up link; a2 reaches b2 through the limiters and the router.
    for dst_host, src_host in (("b1", "a1"), ("b2", "a2")):
        for i in range(n):
            frame = raw_frame(net.mac_of[dst_host], net.mac_of[src_host], (ETH_EXPERIMENTAL, ETH_ARP)[i % 2], i)
            net.engine.at(i * 1_000_000, lambda f, s=src_host: net.send_from(s, f), frame)
    net.engine.run(NS)
    cap = net.boundary()
    sent = n * FRAME
    assert cap.total_bytes(key("a", "egress", "scale-up")) == cap.total_bytes(key("b", "ingress", "scale-up")) == sent
    assert cap.total_bytes(key("a", "egress", "router")) == cap.total_bytes(key("b", "ingress", "router")) == sent
    uplink = cap.total_bytes(key("b", "ingress", "uplink"))
    assert uplink == (sent if placement == "pod-uplink" else 0)  # no uplink limiter with node placement
    for k in ("b egress", "a ingress"):
        assert all(cap.total_bytes(f"{k} {kind}") == 0 for kind in ("router", "uplink", "scale-up"))
    # The router's counts (the audit's) are the same frames.
    assert sum(net.router_counts[("a", "egress")].bins) == sum(net.router_counts[("b", "ingress")].bins) == sent
    # Every frame arrived: the receivers got them all.
    assert sum(sum(tl.bins) for tl in net.receivers["b1"].bins.values()) == sent
