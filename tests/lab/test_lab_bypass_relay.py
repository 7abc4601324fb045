"""A pod switch that relays a node DPU's exempt frames out of the pod (Topology.switch_relays).

With node placement a node DPU exempts IPv4 between its pod's addresses sent to another node's MAC,
and seals it under its pod's key on the way (its crypto engine, docs/exemption.md). Here pod a's switch
sends frames to a2's MAC to b1 instead. What the model guarantees: the relay and the simulated switch
move the same frames the same way; the frames cross a's DPU exempt and pod a's router link uncounted by
any meter, so a's egress on the wire exceeds its allowance and the verdict says so; but they leave
sealed: b1's engine cannot open them, b1's node DPU meters them as pod b's ingress (class other: not
IPv4), and b's hosts get ciphertext only, none of a1's datagrams (with node placement b's router link,
counted before its node DPUs, carries all of it; with an uplink limiter b's wire ingress holds).
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dpu_lab.config import AuditSpec, ConfigError, FlowSpec, Scenario, Topology, load_scenario
from dpu_lab.frames import frame as make_frame
from dpu_lab.netns import LabNetwork
from dpu_lab.report import Report, Result
from dpu_lab.runner import LabRun, check_relayed_flows
from dpu_lab.sealing import OVERHEAD
from dpu_lab.sim import NS, Engine, SimNetwork
from dpu_lab.virtual import VirtualLabRun
from dpu_softswitch.clock import VirtualClock
from helpers.netns import can_netns, received
from helpers.paths import ROOT

SCENARIO = ROOT / "bmv2-lab" / "scenarios" / "pod-switch-relay.yaml"
ETH_EXPERIMENTAL = 0x88B5


def relay_scenario(duration_s: float, **topology: Any) -> Scenario:
    """pod-switch-relay.yaml with its phase cut to `duration_s` and its topology's fields updated."""
    sc = load_scenario(SCENARIO)
    topo = sc.topology.model_copy(update=topology)
    return sc.model_copy(
        update={"topology": topo, "phases": [sc.phases[0].model_copy(update={"duration_s": duration_s})]}
    )


def by_pod(r: Report) -> dict[tuple[str, str], Result]:
    """The report's results by (pod, direction)."""
    return {(x.pod, x.direction): x for x in r.results}


def counters(r: Report) -> dict[tuple[str, str], dict[str, int]]:
    """The DPUs' byte counters by (pod, direction) (64-bit counts come as strings, as JSON writes them)."""
    return {
        (u["pod"], u["direction"]): {k: int(v) for k, v in u.items() if k.endswith("_bytes")} for u in r.dpu_counters
    }


def check_relayed(r: Report) -> None:
    """What the model guarantees of a run of pod-switch-relay.yaml, real or virtual."""
    res, dpus = by_pod(r), counters(r)
    a_out, b_in = res[("a", "egress")], res[("b", "ingress")]
    # Pod a's cap is bypassed, and the verdict, which counts every frame on the router link, sees it.
    assert not a_out.compliant and not r.cap_held
    assert a_out.max_window_bytes > a_out.allowed_window_bytes
    # They crossed a1's DPU as intra-pod (exempt), not through its meter.
    assert dpus[("a", "egress")]["exempt_bytes"] > a_out.allowed_window_bytes
    # b1's node DPU meters them as pod b's ingress: what b's hosts received holds to b's cap ...
    assert dpus[("b", "ingress")].get("exempt_bytes", 0) == 0 and dpus[("b", "ingress")]["metered_bytes"] > 0
    # ... as frames it cannot read: sealed under pod a's key, not IPv4 (b1's engine could not open them) ...
    assert dpus[("b", "ingress")]["other_bytes"] > 0
    assert b_in.receivers_max_window_bytes is not None and b_in.receivers_bytes
    assert b_in.receivers_max_window_bytes <= b_in.allowed_window_bytes
    # ... so no receiver outside pod a read anything of a1's: b1 got ciphertext only.
    assert a_out.receivers_bytes == 0
    # ... while b's router link, which node placement counts as b's ingress before its DPUs, carried it all.
    assert not b_in.compliant
    flow = r.flows[0]
    assert flow.delivered_bps == 0  # a2 got none of it: every frame to a2's MAC was relayed


# ---------------------------------------------------------------- the topology option


@pytest.mark.parametrize(
    ("relays", "message"),
    [
        ([{"addressed_to": "a9", "to": "b1"}], "switch_relays[0].addressed_to: unknown host 'a9'"),
        ([{"addressed_to": "a2", "to": "b9"}], "switch_relays[0].to: unknown host 'b9'"),
        ([{"addressed_to": "a2", "to": "a1"}], "switch_relays[0].to: 'a1' is in pod 'a', as 'a2' is"),
        (
            [{"addressed_to": "a2", "to": "b1"}, {"addressed_to": "a2", "to": "b2"}],
            "switch_relays[1].addressed_to: frames to 'a2' are already relayed by switch_relays[0]",
        ),
        ([{"addressed_to": "a2", "via": "b1"}], "switch_relays.0.to"),
    ],
)
def test_a_relay_must_name_hosts_of_two_pods(relays: list[dict[str, str]], message: str) -> None:
    doc = load_scenario(SCENARIO).topology.model_dump()
    with pytest.raises(ValidationError) as err:
        Topology.model_validate({**doc, "switch_relays": relays})
    assert message in str(err.value)


def test_flows_that_need_answers_from_the_relayed_host_are_refused_in_real_time() -> None:
    sc = relay_scenario(1.0)
    check_relayed_flows(sc, "builtin")  # UDP from the built-in sender needs no answer
    with pytest.raises(ConfigError, match=r"phases\[0\]\.flows\[0\]: iperf3's control connection needs answers"):
        check_relayed_flows(sc, "iperf3")
    tcp = FlowSpec(name="tcp", protocol="tcp", src="a1", dst="a2")
    sc = sc.model_copy(update={"phases": [sc.phases[0].model_copy(update={"flows": [tcp]})]})
    with pytest.raises(ConfigError, match="TCP needs answers from a2, but switch_relays\\[0\\] sends"):
        check_relayed_flows(sc, "builtin")


# ---------------------------------------------------------------- the same frames, the same way


def probe_frames(topo: Topology, mac_of: dict[str, bytes]) -> list[tuple[str, bytes]]:
    """(sender, frame): to a2's MAC from a1 (IPv4 between pod a's hosts, as exempt; another EtherType), and
    from b1 (arriving at pod a's switch from the router: not from a host of the pod)."""
    udp = make_frame("none", topo.address_of("a1"), topo.address_of("a2"), 5001, 200, mac_of["a1"], mac_of["a2"])
    other = mac_of["a2"] + mac_of["a1"] + struct.pack("!H", ETH_EXPERIMENTAL) + b"relay?" + bytes(100)
    inbound = make_frame("none", topo.address_of("b1"), topo.address_of("a2"), 5002, 300, mac_of["b1"], mac_of["a2"])
    return [("a1", udp), ("a1", other), ("b1", inbound)]


def expected(mac_of: dict[str, bytes], sent: list[tuple[str, bytes]]) -> dict[str, list[bytes]]:
    """Where the probe frames arrive, at each node DPU's switch-facing port, as the relay defines it."""
    (_, udp), (_, other), (_, inbound) = sent
    return {"b1": [mac_of["b1"] + udp[6:], mac_of["b1"] + other[6:]], "a2": [inbound]}


def test_the_simulated_switch_relays_exactly_the_frames_to_the_addressee(tmp_path: Path) -> None:
    topo = load_scenario(SCENARIO).topology
    seen: dict[str, list[bytes]] = {"a2": [], "b1": []}

    def passthrough(name: str) -> Any:
        def process(port: int, frame: bytes) -> list[tuple[int, bytes]]:
            if port == 1 and name in seen:
                seen[name].append(frame)  # what the node's DPU gets from its pod's switch
            return [(1 - port, frame)]

        return process

    net = SimNetwork(topo, {f"dpu-{h}": passthrough(h) for p in topo.pods for h in p.hosts}, Engine(VirtualClock()))
    sent = probe_frames(topo, net.mac_of)
    for i, hop in enumerate(sent):
        net.engine.at(i * 1_000_000, lambda h: net.send_from(*h), hop)  # (sender, frame)
    net.engine.run(NS)
    assert seen == expected(net.mac_of, sent)
    crossed = net.boundary()
    a_out = crossed.total_bytes("a egress router")
    assert a_out == len(sent[0][1]) + len(sent[1][1])  # the relayed frames left pod a on its router link


@pytest.mark.netns
def test_the_real_relay_moves_the_same_frames_as_the_simulated_switch() -> None:
    if reason := can_netns():
        pytest.skip(reason)
    topo = load_scenario(SCENARIO).topology
    net = LabNetwork(topo)
    net.build()
    try:
        # A node DPU's switch-facing port is its limiter's uplink interface, in the root namespace.
        up = {lim.name.removeprefix("dpu-"): lim.uplink_if for lim in net.limiters}
        mac_of = {h: net.mac_of(h) for p in topo.pods for h in p.hosts}
        sent = probe_frames(topo, mac_of)
        socks = {}
        for host in ("a1", "a2", "b1"):
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            s.bind((up[host], 0))
            socks[host] = s
        for host, f in sent:
            socks[host].send(f)  # as if the node's DPU passed it toward the switch
        time.sleep(0.5)
        seen: dict[str, list[bytes]] = {"a2": [], "b1": []}
        markers = {f[14:] for _, f in sent}  # everything after the Ethernet header is left alone
        for host, s in socks.items():
            if got := received(s, lambda data: data[14:] in markers):
                seen.setdefault(host, []).extend(got)
    finally:
        net.teardown()
    assert seen == expected(mac_of, sent)


# ---------------------------------------------------------------- the whole scenario


def test_the_relay_bypasses_pod_as_cap_in_virtual_time(tmp_path: Path) -> None:
    run = VirtualLabRun(relay_scenario(4.0), tmp_path / "out")
    r = run.run()
    check_relayed(r)
    res, dpus = by_pod(r), counters(r)
    a_out, b_in = res[("a", "egress")], res[("b", "ingress")]
    # Deterministic: every frame a1 sent crossed a1's DPU exempt and left pod a sealed (OVERHEAD bytes more
    # each), four times the cap; b1's engine could open none of them.
    sealed = run.seal_stats["a1"]["sealed_frames"]
    assert run.seal_stats["b1"]["opener"] == {**run.seal_stats["b1"]["opener"], "opened": 0, "rejected": sealed}
    assert a_out.boundary_bytes == b_in.boundary_bytes == dpus[("a", "egress")]["exempt_bytes"] + OVERHEAD * sealed
    assert a_out.boundary_bytes is not None and a_out.boundary_bytes >= 0.99 * 32e6 * 4 / 8
    assert a_out.max_window_bytes > 3 * a_out.allowed_window_bytes
    assert dpus[("b", "ingress")]["metered_bytes"] == dpus[("b", "ingress")]["other_bytes"] == b_in.boundary_bytes
    # Per-pair conservation of sealed bytes shows the diversion though only ciphertext left: none reached a2.
    assert r.sealing is not None
    [pair] = [p for p in r.sealing["pairs"] if (p["from"], p["to"]) == ("a1", "a2")]
    assert (
        pair["opened_bytes"] == 0
        and pair["missing_bytes"] == pair["sealed_bytes"] == dpus[("a", "egress")]["exempt_bytes"]
    )


def test_without_the_relay_the_same_traffic_stays_in_the_pod(tmp_path: Path) -> None:
    run = VirtualLabRun(relay_scenario(2.0, switch_relays=[]), tmp_path / "out")
    r = run.run()
    assert r.cap_held
    assert all(x.boundary_bytes == 0 for x in r.results)
    assert r.flows[0].loss_ratio == 0.0  # exempt, and delivered to a2
    assert run.seal_stats["a1"]["sealed_frames"] == run.seal_stats["a2"]["opener"]["opened"] > 0  # sealed, opened
    assert r.sealing is not None and r.sealing["missing_bytes"] == 0 and r.sealing["pairs"]


def test_an_uplink_limiter_holds_the_relayed_frames_to_b_as_ingress_cap(tmp_path: Path) -> None:
    sc = relay_scenario(4.0)
    pods = [sc.topology.pods[0], sc.topology.pods[1].model_copy(update={"placement": "pod-uplink"})]
    sc = sc.model_copy(update={"topology": sc.topology.model_copy(update={"pods": pods})})
    res = by_pod(VirtualLabRun(sc, tmp_path / "out").run())
    assert not res[("a", "egress")].compliant
    # Counted past b's uplink limiter, as what entered pod b: held, on the wire.
    assert res[("b", "ingress")].compliant


def test_the_verifiers_audit_sees_the_relay_at_the_router(tmp_path: Path) -> None:
    sc = relay_scenario(3.0).model_copy(update={"audit": AuditSpec(interval_s=1.0)})
    audit = VirtualLabRun(sc, tmp_path / "out").run().audit
    assert audit is not None and audit["detected"] and audit["false_alarms"] == 0
    # The router counted what left pod a; a's DPUs passed none of it through a meter (all was exempt).
    flagged = {(a["check"], a["where"]) for a in audit["alerts"]}
    assert ("conservation", "a egress") in flagged and ("router-count", "a egress") in flagged
    assert all(where == "a egress" for _, where in flagged)  # b's DPUs account for all that entered b


@pytest.mark.netns
@pytest.mark.timeout(300)
def test_the_relay_bypasses_pod_as_cap_in_real_time(tmp_path: Path) -> None:
    if reason := can_netns():
        pytest.skip(reason)
    check_relayed(LabRun(relay_scenario(3.0), tmp_path / "out", "embedded", "builtin").run())
