"""Node DPUs' crypto engines in the lab (docs/exemption.md, "How DPUs can prove intra-pod traffic to each
other"): a node limiter's port 2 leads to its engine, which seals what it gets there under its pod's key;
what arrives from the pod's switch enters the limiter on port 2 only when it opens under that key, and on
port 1 (metered) otherwise. In virtual time (sim.py) and in real time (netns.py: an engine process per node
DPU, in a namespace of its own, between the limiter and the pod's bridge).
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dpu_lab.config import Scenario, Topology, load_scenario
from dpu_lab.netns import SEAL_PORT, WIRE_MTU, LabNetwork
from dpu_lab.runner import LabRun
from dpu_lab.sealing import ETHERTYPE_MACSEC, OVERHEAD
from dpu_lab.sim import NS, Engine, SimNetwork
from dpu_lab.virtual import VirtualLabRun
from dpu_limiter.units import allowed_window_bytes
from dpu_softswitch.clock import VirtualClock
from helpers.netns import can_netns, received
from helpers.paths import ROOT

NODES = ROOT / "bmv2-lab" / "scenarios" / "two-pods-nodes.yaml"
RELAY = ROOT / "bmv2-lab" / "scenarios" / "pod-switch-relay.yaml"
ETH_EXPERIMENTAL = 0x88B5


def raw(dst: bytes, src: bytes, marker: bytes, length: int) -> bytes:
    """A frame of `length` bytes of a local experimental EtherType, `marker` at the start of its payload."""
    head = dst + src + struct.pack("!H", ETH_EXPERIMENTAL) + marker
    return head + bytes(length - len(head))


def pod_mates(topo: Topology, mac_of: dict[str, bytes]) -> dict[str, set[bytes]]:
    """Each host's pod mates' MACs."""
    return {h: {mac_of[m] for m in p.hosts if m != h} for p in topo.pods for h in p.hosts}


# ---------------------------------------------------------------- virtual time


def test_the_simulated_engines_seal_the_seal_port_and_open_only_their_pods_frames() -> None:
    topo = load_scenario(RELAY).topology  # pod a's switch relays frames to a2's MAC to b1
    mac = topo.host_macs()
    mates = pod_mates(topo, mac)
    seen: dict[str, list[tuple[int, bytes]]] = {}

    def node(host: str) -> Any:
        def process(port: int, frame: bytes) -> list[tuple[int, bytes]]:
            if port == 0:  # from the host: to a pod mate (or a forgery's) by the seal port, the rest by the uplink
                return [(SEAL_PORT if frame[:6] in mates[host] or b"forged" in frame else 1, frame)]
            seen.setdefault(host, []).append((port, frame))  # from the switch, through the engine
            return [(0, frame)]

        return process

    net = SimNetwork(topo, {f"dpu-{h}": node(h) for p in topo.pods for h in p.hosts}, Engine(VirtualClock()))
    to_a1 = raw(mac["a1"], mac["a2"], b"a2 to a1, pod mates", 1514)
    to_a2 = raw(mac["a2"], mac["a1"], b"a1 to a2, relayed to b1", 1514)
    to_b2 = raw(mac["b2"], mac["a1"], b"a1 to b2, inter-pod", 600)
    forged = raw(mac["a1"], mac["b1"], b"b1 forged, sealed under pod b's key", 300)
    hops = [("a2", to_a1), ("a1", to_a2), ("a1", to_b2), ("b1", forged)]
    for i, hop in enumerate(hops):
        net.engine.at(i * 1_000_000, lambda h: net.send_from(*h), hop)
    net.engine.run(NS)
    assert net.seal_keys["a"] != net.seal_keys["b"] and len(net.seal_keys["a"]) == 16
    # Sealed by a2's engine, opened by a1's: into a1's DPU on its seal port as a2's DPU sent it.
    assert seen["a1"][0] == (SEAL_PORT, to_a1)
    # Sealed under pod b's key, it does not open in pod a: into a1's DPU on its uplink port, sealed (metered).
    port, foreign = seen["a1"][1]
    assert port == 1 and len(foreign) == len(forged) + OVERHEAD
    assert int.from_bytes(foreign[12:14], "big") == ETHERTYPE_MACSEC
    # The relayed frame left pod a sealed: b1's engine could not open it, so b1's DPU gets ciphertext on port 1.
    ((port, relayed),) = seen["b1"]
    assert port == 1 and len(relayed) == len(to_a2) + OVERHEAD
    assert relayed[:6] == mac["b1"] and int.from_bytes(relayed[12:14], "big") == ETHERTYPE_MACSEC
    assert b"relayed to b1" not in relayed
    assert seen["b2"] == [(1, to_b2)]  # inter-pod: never sealed
    # Pod a's router link carried the relayed frame sealed, and the inter-pod one as it was.
    assert net.boundary().total_bytes("a egress router") == len(relayed) + len(to_b2)
    stats = net.seal_stats()
    assert (stats["a2"]["sealed_frames"], stats["a1"]["sealed_frames"], stats["b1"]["sealed_frames"]) == (1, 1, 1)
    assert stats["a1"]["opener"]["opened"] == 1 and stats["a1"]["opener"]["rejected"] == 1
    assert stats["b1"]["opener"]["rejected"] == 1 and stats["b1"]["opener"]["opened"] == 0
    # A receiver cannot read a sealed frame: counted, attributed to no sender.
    assert net.receivers["b1"].bins.keys() == {"non-ipv4"}


def test_intra_pod_traffic_is_sealed_opened_and_exempt_in_virtual_time(tmp_path: Path) -> None:
    run = VirtualLabRun(short_nodes(2.0), tmp_path / "out")
    r = run.run()
    assert r.cap_held
    check_sealed_intra(run.scenario, r.flows, r.dpu_counters, run.seal_stats, real_time=False)
    # The engines' figures are in the run's folder and summary, as in real time.
    assert json.loads((tmp_path / "out" / "raw" / "seal-a1.json").read_text())["sealed_frames"] > 0
    assert "crypto engines" in (tmp_path / "out" / "summary.md").read_text()


def short_nodes(phase_s: float) -> Scenario:
    """two-pods-nodes.yaml with each phase cut to `phase_s`."""
    sc = load_scenario(NODES)
    return sc.model_copy(update={"phases": [ph.model_copy(update={"duration_s": phase_s}) for ph in sc.phases]})


def check_sealed_intra(
    sc: Scenario, flows: list[Any], counters: list[dict[str, Any]], stats: dict[str, Any], real_time: bool
) -> None:
    """The intra-pod flow a1 -> a2 was exempt at both ends (class intra) and every frame a1's engine sealed
    was opened by a2's. Delivered whole in virtual time; in real time, where a loaded machine drops some
    (1.97 % on bmv2 once), more of it than pod a's cap lets through in its phase (metered, it could not)."""
    intra = next(f for f in flows if f.name == "a1-to-a2-intra")
    if not real_time:
        assert intra.loss_ratio <= 0.01, intra
    else:
        phase_s = next(ph.duration_s for ph in sc.phases if any(f.name == intra.name for f in ph.flows))
        cap = sc.cap_of("a")
        assert cap is not None
        metered_most = allowed_window_bytes(cap.egress, phase_s, cap.bucket_bytes())
        assert intra.delivered_bps * phase_s / 8 > metered_most, (intra, metered_most)
    by = {(u["pod"], u["direction"]): u for u in counters}
    assert int(by[("a", "egress")]["intra_bytes"]) > 0 and int(by[("a", "ingress")]["intra_bytes"]) > 0
    assert stats["a1"]["sealed_frames"] > 0
    assert stats["a1"]["sealed_frames"] == stats["a2"]["opener"]["opened"]
    assert stats["a2"]["sealed_frames"] == stats["a1"]["opener"]["opened"]
    assert all(s["opener"]["rejected"] == s["opener"]["replayed"] == 0 for s in stats.values())


# ---------------------------------------------------------------- real time


def mtu(ns: str | None, ifname: str) -> int:
    """An interface's MTU."""
    cmd = ["ip", *(["-n", ns] if ns else []), "-j", "link", "show", "dev", ifname]
    return int(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)[0]["mtu"])


@pytest.mark.netns
def test_the_engines_seal_on_the_wire_and_open_only_their_pods_frames(tmp_path: Path) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    topo = load_scenario(RELAY).topology
    net = LabNetwork(topo, seal_dir=tmp_path)
    net.build()
    engines = list(net.engines)
    names = list(net.namespaces)
    try:
        lims = {lim.name.removeprefix("dpu-"): lim for lim in net.limiters}
        assert all(set(lim.interfaces()) == {0, 1, SEAL_PORT} for lim in lims.values())
        # One engine per node DPU, each with its pod's key on stdin: never on its command line, nor in the
        # network's repr.
        assert sorted(e.host for e in engines) == ["a1", "a2", "b1", "b2"]
        keys = [k.hex() for k in net.seal_keys.values()]
        assert len(set(keys)) == 2
        for eng in engines:
            assert eng.popen.poll() is None
            cmdline = Path(f"/proc/{eng.pid}/cmdline").read_bytes().decode()
            assert "dpu_lab.sealing" in cmdline and not any(k in cmdline for k in keys)
        assert not any(k in repr(net) for k in keys)
        # MTUs: 1500 at the hosts and the limiters' ports, room for sealed frames on the wire side.
        a1_ns, a1_engine = net.host_ns["a1"], net.engine_ns["a1"]
        assert mtu(a1_ns, "eth0") == 1500
        assert mtu(None, lims["a1"].interfaces()[0]) == mtu(None, lims["a1"].interfaces()[SEAL_PORT]) == 1500
        assert mtu(None, lims["a1"].interfaces()[1]) == mtu(a1_engine, "clear") == WIRE_MTU  # unopened sealed frames
        assert mtu(a1_engine, "wire") == mtu(net.pod_ns["a"], net.bridge_ports[net.pod_ns["a"]][0]["a1"]) == WIRE_MTU
        assert mtu(net.router_ns, net.router_ports["a"]) == WIRE_MTU
        mac = {h: net.mac_of(h) for p in topo.pods for h in p.hosts}
        to_a1 = raw(mac["a1"], mac["a2"], b"a2 to a1, pod mates", 1514)  # sealed: 1546 bytes on the wire
        clear_to_a1 = raw(mac["a1"], mac["a2"], b"a2 to a1, metered", 1514)
        to_a2 = raw(mac["a2"], mac["a1"], b"a1 to a2, relayed to b1", 1514)
        foreign = raw(mac["a1"], mac["b1"], b"b1 to a1, pod b's key", 400)
        socks: dict[str, socket.socket] = {}
        for host, port in (("a1", 1), ("a1", SEAL_PORT), ("a2", 1), ("a2", SEAL_PORT), ("b1", 1), ("b1", SEAL_PORT)):
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            s.bind((lims[host].interfaces()[port], 0))
            socks[f"{host}:{port}"] = s
        # As if each node's DPU sent them: on its seal port (to be sealed) or its uplink port (as they are).
        socks[f"a2:{SEAL_PORT}"].send(to_a1)
        socks["a2:1"].send(clear_to_a1)
        socks[f"a1:{SEAL_PORT}"].send(to_a2)
        socks[f"b1:{SEAL_PORT}"].send(foreign)
        time.sleep(0.5)
        seen: dict[str, list[bytes]] = {}
        for where, s in socks.items():
            if got := received(s, lambda data: data[12:14] in (b"\x88\xb5", b"\x88\xe5")):
                seen[where] = got
    finally:
        net.teardown()
    # Sealed by a2's engine, opened by a1's: on a1's seal port as a2's DPU sent it. The clear one: on the uplink.
    assert seen.pop(f"a1:{SEAL_PORT}") == [to_a1]
    a1_uplink = seen.pop("a1:1")
    assert clear_to_a1 in a1_uplink
    # b1's frame to a1 was sealed under pod b's key: a1's engine passed it on its uplink port, unopened.
    (forged,) = [f for f in a1_uplink if f != clear_to_a1]
    assert len(forged) == len(foreign) + OVERHEAD and forged[12:14] == b"\x88\xe5"
    # Pod a's switch relayed a1's frame to a2 out of the pod to b1: ciphertext, on b1's uplink port.
    (relayed,) = seen.pop("b1:1")
    assert len(relayed) == len(to_a2) + OVERHEAD and relayed[:6] == mac["b1"] and relayed[12:14] == b"\x88\xe5"
    assert b"relayed to b1" not in relayed
    assert seen == {}  # nothing else: nothing opened at a2 or b1
    # The engines were stopped (SIGTERM) and wrote their stats; nothing of the network is left.
    assert all(e.popen.returncode == 0 for e in engines)
    stats = {e.host: json.loads(e.stats.read_text()) for e in engines}
    assert stats["a2"]["sealed_frames"] == stats["a1"]["opener"]["opened"] == 1
    assert stats["a1"]["opener"]["rejected"] == 1 and stats["b1"]["opener"]["rejected"] == 1
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in names)
    assert net.prefix not in subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout


@pytest.mark.netns
@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", ["embedded", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def test_intra_pod_traffic_is_sealed_opened_and_exempt_in_real_time(tmp_path: Path, target: str) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    if target == "bmv2" and shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc is not on PATH (bmv2 not installed)")
    sc = short_nodes(4.0)
    r = LabRun(sc, tmp_path / "out", target, "builtin").run()  # type: ignore[arg-type]
    assert r.cap_held, [(x.pod, x.direction, x.max_window_bytes, x.allowed_window_bytes) for x in r.results]
    raw_dir = tmp_path / "out" / "raw"
    stats = {h: json.loads((raw_dir / f"seal-{h}.json").read_text()) for h in ("a1", "a2", "b1", "b2")}
    check_sealed_intra(sc, r.flows, r.dpu_counters, stats, real_time=True)
    assert "crypto engines" in (tmp_path / "out" / "summary.md").read_text()
