"""The embedded target: real P4Runtime over gRPC on loopback, limiter.p4's compiled JSON, real frames.

Frames are injected through the target's packet path in process (no interfaces needed); the lab
tests push the same frames through veth pairs.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from finsy.proto import p4r
from scapy.layers.inet import IP, UDP, fragment
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw

from dpu_limiter.units import CPU_PORT
from helpers.p4rt import (
    A_HOST,
    B_HOST,
    SEAL_PORT,
    config,
    connect,
    detail_codes,
    program_limiter,
    table_entry,
    udp,
    update,
)
from helpers.planes import InProcess


async def test_no_pipeline_forwards_nothing(in_process_target: InProcess) -> None:
    device, _ = in_process_target
    assert device.process(0, udp(A_HOST, B_HOST)) == []


async def test_pipeline_without_entries_forwards_nothing(in_process_target: InProcess) -> None:
    device, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    await c.set_pipeline(config())
    assert device.process(0, udp(A_HOST, B_HOST)) == []
    assert device.process(0, bytes(Ether() / ARP())) == []


async def test_meter_caps_inter_pod_and_exempts_intra_pod(in_process_target: InProcess) -> None:
    device, channel = in_process_target
    c = await connect(channel, 5)
    assert (await c.responses.get()).arbitration.status.code == 0  # primary
    # A node DPU whose pod peer is 02:00:00:00:00:02 (udp()'s destination MAC).
    await program_limiter(c, rate_bytes_s=1, burst=3000, peers=("02:00:00:00:00:02",))
    frame = udp(A_HOST, B_HOST, 1000)  # 1042 bytes on the wire
    out = [device.process(0, frame) for _ in range(4)]
    assert [len(o) for o in out] == [1, 1, 0, 0]  # 2 x 1042 <= 3000 < 3 x 1042
    assert out[0] == [(1, frame)]  # forwarded unchanged to the uplink
    intra = udp(A_HOST, "10.0.1.7", 1000)
    # To a pod peer: exempt, by way of the crypto engine (SEAL_PORT), never to the uplink in the clear.
    assert all(device.process(0, intra) == [(SEAL_PORT, intra)] for _ in range(10))
    arp = bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=A_HOST, pdst="10.0.1.254"))
    assert device.process(0, arp) == [(1, arp)]
    # Ingress direction has its own cell, with its own full bucket.
    back = udp(B_HOST, A_HOST, 1000)
    assert [len(device.process(1, back)) for _ in range(3)] == [1, 1, 0]


async def test_exemption_is_proved_by_placement_never_claimed(in_process_target: InProcess) -> None:
    """Intra-pod addresses buy nothing without a pod peer's MAC; a pod uplink (no peers) exempts nothing."""
    device, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    await program_limiter(c, rate_bytes_s=1, burst=0, peers=("02:00:00:00:00:02",))
    claims = [
        bytes(Ether(src="02:00:00:00:00:01", dst=mac) / IP(src=A_HOST, dst="10.0.1.77") / UDP() / Raw(b"x" * 900))
        for mac in ("02:01:01:00:00:00", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "02:00:00:00:00:01")
    ]
    # Another pod's host, broadcast, multicast, the sender itself: all metered, and the bucket is empty.
    assert all(device.process(0, f) == [] for f in claims)
    # A frame with ARP's EtherType that is not minimum-size, well-formed ARP: metered as any other.
    fat_arp = bytes(Ether(dst="02:00:00:00:00:02", type=0x0806) / Raw(b"\x00" * 1400))
    padded_arp = bytes(Ether(dst="02:00:00:00:00:02") / ARP(psrc=A_HOST, pdst="10.0.1.7") / Raw(b"\x00" * 1000))
    bad_op = bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(op=3, psrc=A_HOST, pdst="10.0.1.7"))
    assert [device.process(0, f) for f in (fat_arp, padded_arp, bad_op)] == [[], [], []]
    # Entering the node, exempt only from a pod peer's MAC, and only opened by the crypto engine
    # (SEAL_PORT): the router's frames with pod addresses are metered, and so is a peer's MAC on the
    # uplink port (a switch relaying, or anyone forging it).
    inward = IP(src="10.0.1.7", dst=A_HOST) / UDP()
    from_router = bytes(Ether(src="02:99:00:00:00:01", dst="02:00:00:00:00:01") / inward)
    from_peer = bytes(Ether(src="02:00:00:00:00:02", dst="02:00:00:00:00:01") / inward)
    assert device.process(1, from_router) == []
    assert device.process(1, from_peer) == []
    assert device.process(SEAL_PORT, from_peer) == [(0, from_peer)]
    assert device.process(SEAL_PORT, from_router) == []  # opened, but not from a pod peer: metered


async def test_arp_has_its_own_small_meter(in_process_target: InProcess) -> None:
    """Minimum-size ARP passes when the cap's meter is empty, but only within ARP's own bucket."""
    device, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    await program_limiter(c, rate_bytes_s=1, burst=0, arp=(1, 600))
    arp = bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=A_HOST, pdst="10.0.1.254"))  # 42 bytes
    assert device.process(0, udp(A_HOST, B_HOST, 100)) == []  # the cap's bucket is empty
    passed = sum(len(device.process(0, arp)) for _ in range(40))
    assert passed == 600 // len(arp)  # 14 of 42 bytes fill the 600-byte bucket
    # The other direction has its own ARP bucket.
    assert device.process(1, arp) == [(0, arp)]


async def test_forged_sources_from_inside_are_dropped_and_counted(in_process_target: InProcess) -> None:
    from finsy import P4CounterEntry

    device, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    sch = await program_limiter(c, rate_bytes_s=10**9, burst=10**6)
    forged = [udp("10.0.2.7", B_HOST), udp(B_HOST, "10.0.2.9"), udp("10.9.9.9", A_HOST)]
    assert all(device.process(0, f) == [] for f in forged)  # from the hosts, with a source not the pod's
    assert device.process(0, udp(A_HOST, B_HOST)) == [(1, udp(A_HOST, B_HOST))]
    assert device.process(1, udp("10.0.1.7", A_HOST)) != []  # from outside, sources are not checked
    spoofed = await c.read(P4CounterEntry("LimiterIngress.class_counter", index=5).encode(sch))  # type: ignore[arg-type]
    assert spoofed[0].counter_entry.data.packet_count == len(forged)


async def test_everything_unclassified_is_metered_and_counted(
    in_process_target: InProcess,
) -> None:
    from finsy import P4CounterEntry

    device, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    sch = await program_limiter(c, rate_bytes_s=0, burst=0)  # the floor: nothing metered passes
    intra_v6 = bytes(Ether() / IPv6(src="fd00::1", dst="fd00::2") / UDP() / Raw(b"x" * 100))
    vlan = bytes(Ether() / Dot1Q(vlan=5) / IP(src=A_HOST, dst="10.0.1.7") / UDP() / Raw(b"x" * 100))
    frags = [bytes(Ether() / f) for f in fragment(IP(src=A_HOST, dst="10.0.1.7") / UDP() / Raw(b"y" * 3000), 1000)]
    bad_version = bytes(Ether() / IP(src=A_HOST, dst="10.0.1.7", version=6) / UDP())
    truncated = bytes(Ether(type=0x0800) / Raw(b"\x45\x00\x00"))
    for frame in [intra_v6, vlan, *frags, bad_version, truncated]:
        assert device.process(0, frame) == [], frame.hex()
    counts = {}
    for ent in await c.read(
        *(
            P4CounterEntry("LimiterIngress.class_counter", index=i).encode(sch)  # type: ignore[arg-type]
            for i in range(8)
        )
    ):
        counts[ent.counter_entry.index.index] = ent.counter_entry.data.packet_count
    assert counts[0] == 0  # nothing exempt
    assert counts[3] == len(frags)  # fragments, even intra-pod ones
    assert counts[4] == 4  # IPv6, VLAN, bad version, truncated: "other"
    red = [
        e.counter_entry.data.packet_count
        for e in await c.read(P4CounterEntry("LimiterIngress.color_counter", index=2).encode(sch))
    ]  # type: ignore[arg-type]
    assert red == [len(frags) + 4]


async def test_p4runtime_write_rules(in_process_target: InProcess) -> None:
    _, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    sch = await program_limiter(c, 1000, 3000)
    entry = table_entry(
        sch,
        "LimiterIngress.boundary",
        "LimiterIngress.cross",
        {"standard_metadata.ingress_port": 0},
        {"port": 1, "cell": 0, "inside": 1},
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.write(update(p4r.Update.INSERT, entry))
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert detail_codes(err.value) == [grpc.StatusCode.ALREADY_EXISTS.value[0]]
    missing = table_entry(
        sch,
        "LimiterIngress.boundary",
        "LimiterIngress.cross",
        {"standard_metadata.ingress_port": 7},
        {"port": 1, "cell": 0, "inside": 1},
    )
    ok = table_entry(
        sch,
        "LimiterIngress.boundary",
        "LimiterIngress.cross",
        {"standard_metadata.ingress_port": 9},
        {"port": 1, "cell": 0, "inside": 1},
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.write(update(p4r.Update.DELETE, missing), update(p4r.Update.INSERT, ok))
    # Per-update errors in order: the failed delete does not stop the insert after it.
    assert detail_codes(err.value) == [grpc.StatusCode.NOT_FOUND.value[0], 0]
    read = await c.read(p4r.Entity(table_entry=p4r.TableEntry(table_id=entry.table_entry.table_id)))
    assert len(read) == 3
    pipeline = await c.stub.GetForwardingPipelineConfig(
        p4r.GetForwardingPipelineConfigRequest(
            device_id=1, response_type=p4r.GetForwardingPipelineConfigRequest.COOKIE_ONLY
        )
    )
    assert pipeline.config.cookie.cookie == 42 and not pipeline.config.HasField("p4info")


async def test_arbitration_primary_and_backup(in_process_target: InProcess) -> None:
    _, channel = in_process_target
    low = await connect(channel, 5)
    assert (await low.responses.get()).arbitration.status.code == 0
    high = await connect(channel, 9)
    assert (await high.responses.get()).arbitration.status.code == 0
    demoted = await low.responses.get()  # the old primary hears of the new one
    assert demoted.arbitration.status.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert demoted.arbitration.election_id.low == 9
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await low.set_pipeline(config())
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    dup = await connect(channel, 9)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in dup.call:  # type: ignore[attr-defined]
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    high.requests.put_nowait(None)  # the primary leaves: the backup is promoted
    promoted = await low.responses.get()
    assert promoted.arbitration.status.code == 0


async def test_invalid_pipeline_is_refused_with_a_clear_error(
    in_process_target: InProcess,
) -> None:
    _, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    bad = config()
    bad.p4_device_config = b'{"header_types": [], "headers": [], "parsers": [], "pipelines": []}'
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.set_pipeline(bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "standard_metadata" in (err.value.details() or "")
    bad.p4_device_config = b"not json"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.set_pipeline(bad)
    assert "not valid JSON" in (err.value.details() or "")


async def test_without_a_lease_arp_passes_only_between_pod_mates(in_process_target: InProcess) -> None:
    """A lapsed lease stops everything metered; a node's ARP with its pod peers still passes (its own meter)."""
    from helpers.p4rt import lease_entry

    device, channel = in_process_target
    c = await connect(channel, 5)
    await c.responses.get()
    peer = "02:00:00:00:00:02"
    sch = await program_limiter(c, rate_bytes_s=10**6, burst=10**6, peers=(peer,), arp=(10**6, 10**6))
    await c.write(update(p4r.Update.MODIFY, lease_entry(sch, 2, 1)))  # a lease that ended 1 us after the start
    to_peer = bytes(Ether(dst=peer) / ARP(op=2, psrc=A_HOST, pdst="10.0.1.7"))
    broadcast = bytes(Ether(dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=A_HOST, pdst="10.0.1.254"))
    assert device.process(0, udp(A_HOST, B_HOST, 100)) == []  # metered traffic: no lease, nothing crosses
    assert device.process(0, broadcast) == []  # ARP to anyone but a pod mate: no lease, nothing crosses
    assert device.process(0, to_peer) == [(1, to_peer)]
    from_peer = bytes(Ether(src=peer, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="10.0.1.7", pdst=A_HOST))
    assert device.process(1, from_peer) == [(0, from_peer)]


async def test_a_lease_passes_only_in_the_epoch_it_was_granted_in(in_process_target: InProcess) -> None:
    """A lease entry carries the lease epoch it was granted under: restored by firmware after a restart
    (the epoch register starts at 0 again), it passes nothing until the controller arms and grants anew."""
    from finsy import P4TableAction, P4TableEntry

    from corpus_cases import packet_out, stream_request
    from helpers.p4rt import LONG_LEASE_US, lease_entry

    device, channel = in_process_target
    device.cpu_port = CPU_PORT
    c = await connect(channel, 5)
    await c.responses.get()
    sch = await program_limiter(c, rate_bytes_s=10**6, burst=10**6)
    frame = udp(A_HOST, B_HOST, 100)
    assert device.process(0, frame) == [(1, frame)]  # epoch 0 in both: unarmed, as the helpers grant
    restored = P4TableAction("LimiterIngress.lease", gen=7, deadline=LONG_LEASE_US, epoch=0xBEEF)
    entry = P4TableEntry("LimiterIngress.lease_cfg", action=restored, is_default_action=True)
    await c.write(update(p4r.Update.MODIFY, entry.encode(sch)))
    assert device.process(0, frame) == []  # a lease of another epoch: nothing metered crosses
    c.requests.put_nowait(stream_request(packet_out(sch, b"", nonce=bytes(8), arm=(0xBEEF).to_bytes(8, "big"))))
    while not (await asyncio.wait_for(c.responses.get(), 10)).HasField("packet"):
        pass
    assert device.process(0, frame) == [(1, frame)]  # armed with its epoch: it passes
    await c.write(update(p4r.Update.MODIFY, lease_entry(sch, 8, LONG_LEASE_US)))
    assert device.process(0, frame) == []  # epoch 0 no longer matches the armed register
