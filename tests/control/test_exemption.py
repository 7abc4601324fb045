"""Exemption is proved by where a device sits, never claimed by a frame: the control plane's side.

A pod uplink exempts nothing; a node DPU exempts only IPv4 to (or from) another node of its pod, by
the node MACs the control plane holds as inventory. ARP's own small meter is carved out of the cap,
so that the data meter and ARP's together never pass more than the cap.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from dpu_limiter import dataplane as dp
from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, InvalidArgument, Pod, Role, check_mac
from dpu_limiter.stores import open_store
from dpu_limiter.units import ARP_BURST_BYTES, ARP_RATE_BPS, allowed_window_bytes
from dpu_softswitch.device import Device
from helpers.planes import plane_with_pod, programmed_target

pytestmark = pytest.mark.timeout(120)

POD = Pod("a", ("10.0.1.0/24",))
MACS = ("02:00:01:00:00:00", "02:00:02:00:00:00", "02:00:03:00:00:00")


def node(name: str, mac: str) -> Dpu:
    return Dpu(name, "127.0.0.1:1", 1, "a", role=Role.NODE, node_mac=mac)


def test_a_pod_uplink_exempts_nothing_and_a_node_only_its_pod_mates() -> None:
    uplink = dp.intent_for(Dpu("u", "127.0.0.1:1", 1, "a"), POD, None, peers=MACS)
    assert uplink.peers == ()
    n1 = dp.intent_for(node("n1", MACS[0]), POD, None, peers=MACS)
    assert n1.peers == MACS[1:]  # the others, never itself
    entries = [e for e in dp.exemption_entities(n1) if e.table_id == dp.TABLE_PEERS]
    assert len(entries) == 2


@pytest.mark.parametrize("mode", ["rate", "window"])
def test_data_and_arp_meters_together_never_pass_more_than_the_cap(mode: str) -> None:
    cap = Cap(8e6, 24e6, 2.0, 400_000, mode=mode)
    intent = dp.intent_for(node("n1", MACS[0]), POD, cap, lease=dp.Lease(1, 10.0, 10**7))
    for direction, cell in dp.CELLS.items():
        rate = getattr(cap, f"{direction}_bps")
        arp = intent.meters[dp.ARP_CELLS + cell]
        assert (arp.cir, arp.cburst) == (ARP_RATE_BPS / 8, ARP_BURST_BYTES)
        # What both may pass in one window of the cap, against what the cap allows in it.
        arp_most = arp.cir * cap.window_s + arp.cburst
        if mode == "window":
            data_most = intent.windows[cell][0]
            allowed = int(rate / 8 * cap.window_s)
        else:
            data = intent.meters[cell]
            data_most = data.cir * cap.window_s + data.cburst
            allowed = allowed_window_bytes(rate, cap.window_s, cap.burst_bytes) - 1518
        assert data_most + arp_most <= allowed
        assert data_most + arp_most >= allowed - 8  # and the cap is not wasted (rounding only)


def test_a_share_smaller_than_arp_allowance_gives_the_data_meter_nothing() -> None:
    intent = dp.intent_for(node("n1", MACS[0]), POD, Cap(4000, 4000, 1.0, 300), lease=dp.Lease(1, 10.0, 10**7))
    assert intent.meters[0].cir == 0 and intent.meters[dp.ARP_CELLS].cir == 500
    assert intent.meters[0].cburst == 0 and intent.meters[dp.ARP_CELLS].cburst == 300


def test_no_grant_is_the_floor_for_arp_too() -> None:
    """A DPU with no share (no cap, or between shrink and grow) passes no ARP: the sum of what a pod's
    DPUs hold never exceeds its cap, also while shares move."""
    intent = dp.intent_for(node("n1", MACS[0]), POD, None)
    assert intent.meters[0] == dp.FLOOR and intent.meters[dp.ARP_CELLS] == dp.FLOOR


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("ff:ff:ff:ff:ff:ff", "unicast"),
        ("01:00:5e:00:00:01", "unicast"),
        ("00:00:00:00:00:00", "zeros"),
        ("02:00:00:00:00", "Ethernet address"),
        ("02:00:00:00:00:0g", "Ethernet address"),
        ("02:00:00:00:00:01\n", "Ethernet address"),
        ("x" * 10_000, "Ethernet address"),
    ],
)
def test_node_macs_are_checked(value: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_mac("dpu.node_mac", value)
    assert err.value.field == "dpu.node_mac" and why in err.value.reason


def test_node_macs_are_normalised_and_only_nodes_have_one() -> None:
    assert Dpu.validated(node("n1", "02-00-01-00-00-AB")).node_mac == "02:00:01:00:00:ab"
    with pytest.raises(InvalidArgument) as err:
        Dpu.validated(Dpu("u", "127.0.0.1:1", 1, "a", node_mac=MACS[0]))
    assert err.value.field == "dpu.node_mac"


def test_node_macs_survive_the_store(db: str) -> None:
    store = open_store(db)
    store.put_pod(POD)
    store.add_dpu(node("n1", MACS[0]))
    store.close()
    assert open_store(db).load().dpus["n1"].node_mac == MACS[0]


async def test_one_mac_names_one_node_across_the_fleet(db: str) -> None:
    async with plane_with_pod(db) as (_, client):
        await client.apply_pod("b", ["10.0.2.0/24"])
        await _register_nodes(client)


async def _register_nodes(client: LimiterClient) -> None:
    def pb_node(name: str, pod: str, mac: str, port: int) -> pb.Dpu:
        return pb.Dpu(
            name=name,
            p4runtime_address=f"127.0.0.1:{port}",
            device_id=1,
            pod=pod,
            role=pb.DPU_ROLE_NODE,
            uplink_port=1,
            node_mac=mac,
        )

    got = await client.register_dpu(pb_node("n1", "a", "02:00:01:00:00:AA", 1))
    assert got.node_mac == "02:00:01:00:00:aa"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.register_dpu(pb_node("n2", "b", "02:00:01:00:00:aa", 2))  # pod a's node, claimed by pod b
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "node_mac" in (err.value.details() or "") and "n1" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.register_dpu(pb_node("n3", "a", "01:00:5e:00:00:01", 3))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    listed = await client.stub.ListDpus(pb.ListDpusRequest())
    assert [d.name for d in listed.dpus] == ["n1"]  # nothing else stored


async def test_usage_counts_arp_its_meter_passed_apart_from_what_it_dropped(db: str) -> None:
    """A flood of minimum-size ARP: usage says how much ARP crossed (its bucket) and how much was dropped."""
    from scapy.layers.l2 import ARP, Ether

    async with programmed_target(db, (8e6, 8e6, 2.0, 100_000)) as (device, _, c):
        arp = bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="10.0.1.1", pdst="10.0.1.254"))  # 42 bytes
        passed = sum(len(device.process(0, arp)) for _ in range(100))
        assert passed == ARP_BURST_BYTES // len(arp)  # its own bucket, nothing from the cap's
        egress = next(u for u in (await c.usage("a")).usage if u.direction == "egress")
        assert egress.arp_bytes == passed * len(arp) == egress.exempt_bytes
        assert egress.arp_dropped_bytes == (100 - passed) * len(arp)
        assert egress.intra_bytes == 0 and egress.metered_bytes == 0


def sealed_node(name: str, mac: str, seal_port: int | None = 2) -> Dpu:
    return Dpu(name, "127.0.0.1:1", 1, "a", role=Role.NODE, node_mac=mac, seal_port=seal_port)


def test_a_node_exempts_only_through_its_crypto_engine() -> None:
    """Intra-pod frames from the host leave by the seal port; only frames the engine opened are intra-pod
    arriving, and they enter through the ingress cell like anything else from outside."""
    n1 = dp.intent_for(sealed_node("n1", MACS[0]), POD, None, peers=MACS)
    assert n1.sealing == ((0, 2, MACS[0]), (2, None, MACS[0]))  # the node's own MAC: source sealed, opened to
    assert (2, 0, dp.CELLS["ingress"], 0) in n1.boundary
    actions = sorted(e.action.name for e in dp.sealing_entities(n1) if e.action is not None)
    assert actions == [dp.ACTION_OPENED, dp.ACTION_SEAL_VIA]
    # No engine: nothing to exempt through, so no sealing entry (limiter.p4 then exempts nothing).
    bare = dp.intent_for(sealed_node("n1", MACS[0], None), POD, None, peers=MACS)
    assert bare.sealing == () and dp.sealing_entities(bare) == []


@pytest.mark.parametrize(
    ("dpu", "why"),
    [
        (Dpu("u", "127.0.0.1:1", 1, "a", seal_port=2), "only a node DPU"),
        (sealed_node("n1", MACS[0], 1), "must differ"),
        (sealed_node("n1", MACS[0], 0), "must differ"),
        (sealed_node("n1", MACS[0], 510), "data-plane port"),
        (sealed_node("n1", MACS[0], -1), "data-plane port"),
        (sealed_node("n1", "", 2), "node_mac"),
    ],
)
def test_seal_ports_are_checked(dpu: Dpu, why: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        Dpu.validated(dpu)
    assert err.value.field == "dpu.seal_port" and why in err.value.reason


def test_seal_ports_survive_the_store_the_api_and_files(db: str) -> None:
    from dpu_limiter.convert import dpu_from_pb, dpu_to_pb
    from dpu_limiter.manifest import dpu_entry

    store = open_store(db)
    store.put_pod(POD)
    store.add_dpu(sealed_node("n1", MACS[0]))
    store.add_dpu(sealed_node("n2", MACS[1], None))
    store.close()
    dpus = open_store(db).load().dpus
    assert (dpus["n1"].seal_port, dpus["n2"].seal_port) == (2, None)
    assert dpu_from_pb(dpu_to_pb(dpus["n1"])).seal_port == 2
    assert dpu_from_pb(dpu_to_pb(dpus["n2"])).seal_port is None  # unset, not port 0
    assert dpu_entry(dpus["n1"])["seal_port"] == 2 and "seal_port" not in dpu_entry(dpus["n2"])


@contextlib.asynccontextmanager
async def sealed_nodes(db: str) -> AsyncIterator[tuple[Device, LimiterClient]]:
    """Pod a with node DPUs n1 and n2 (MACS[0], MACS[1]), seal port 2, each an in-process embedded target,
    converged; yields n1's device and a client."""
    from helpers.planes import serve_in_process

    device, server, addr = await serve_in_process()
    _, server2, addr2 = await serve_in_process()
    try:
        async with plane_with_pod(db) as (_, client):
            for name, mac, port in (("n1", MACS[0], addr), ("n2", MACS[1], addr2)):
                await client.register_dpu(
                    Dpu(name, port, 1, "a", Role.NODE, host_port=0, uplink_port=1, node_mac=mac, seal_port=2)
                )
            await client.wait_converged(timeout=30)
            yield device, client
    finally:
        await server.stop(grace=0)
        await server2.stop(grace=0)


async def test_the_control_plane_programs_the_seal_port(db: str) -> None:
    """End to end on an in-process embedded target: a node registered with a seal port sends its pod
    mates' frames there, and takes a pod mate's frame as intra-pod only when it arrives opened."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    async with sealed_nodes(db) as (device, client):
        await client.set_pod_cap("a", 8e6, 8e6, 2.0, 100_000)
        await client.wait_converged(timeout=30)
        out = bytes(Ether(src=MACS[0], dst=MACS[1]) / IP(src="10.0.1.1", dst="10.0.1.2") / UDP() / Raw(b"x" * 900))
        assert device.process(0, out) == [(2, out)]
        back = bytes(Ether(src=MACS[1], dst=MACS[0]) / IP(src="10.0.1.2", dst="10.0.1.1") / UDP() / Raw(b"y" * 900))
        assert device.process(2, back) == [(0, back)]
        device.process(1, back)  # a pod mate's MAC on the uplink port: metered, not intra-pod
        # From a source the host chose (the engine leaves MACs in the clear: six readable bytes a relaying
        # switch would carry out of the pod): metered, to the uplink, never sealed.
        chosen = bytes(Ether(src="02:53:45:43:52:54", dst=MACS[1]) / IP(src="10.0.1.1", dst="10.0.1.2") / UDP())
        assert device.process(0, chosen) == [(1, chosen)]
        # Opened, but addressed to another node (relayed here): metered as ingress, not intra-pod.
        elsewhere = bytes(Ether(src=MACS[1], dst=MACS[2]) / IP(src="10.0.1.2", dst="10.0.1.1") / UDP())
        assert device.process(2, elsewhere) == [(0, elsewhere)]
        usage = {u.direction: u for u in (await client.usage("a", per_dpu=True)).usage if u.dpu == "n1"}
        assert usage["egress"].intra_bytes == len(out) and usage["egress"].metered_bytes == len(chosen)
        assert usage["ingress"].intra_bytes == len(back)
        assert usage["ingress"].metered_bytes == len(back) + len(elsewhere)


async def test_a_node_that_leaves_its_pod_is_floored_without_its_exemption(db: str) -> None:
    """Deleted (or moved: its old agent floors it first), a node DPU keeps neither its pod's prefixes nor
    its peers: what it sent its old pod mates is metered (at the floor: dropped), not sealed and exempt."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    async with sealed_nodes(db) as (device, client):
        out = bytes(Ether(src=MACS[0], dst=MACS[1]) / IP(src="10.0.1.1", dst="10.0.1.2") / UDP() / Raw(b"x" * 900))
        assert device.process(0, out) == [(2, out)]  # intra-pod, sealed: no cap needed
        await client.delete(dpus=["n1"])
        assert device.process(0, out) == []  # no longer exempt, and the floor passes nothing
