"""P4Runtime semantics of digests and packet I/O on the embedded target, as simple_switch_grpc (PI v0.1.1) has them.

The P4Runtime tests go through gRPC on loopback; the timing tests drive digest.p4 on a virtual clock
(Device.tick runs what falls due), where bmv2's learn buffers and PI's periodic tasks are exact.
"""

from __future__ import annotations

import time

import grpc
import pytest
from finsy.proto import p4r

from corpus_cases import (
    CPU_PORT,
    MAC_B,
    Collector,
    digest_id,
    digest_update,
    eth,
    ins,
    packet_out,
    pipeline,
    schema,
    stream_messages,
    stream_request,
)
from dpu_softswitch.clock import VirtualClock
from dpu_softswitch.errors import P4RuntimeError
from dpu_softswitch.main import main
from dpu_softswitch.server import Device
from helpers.p4rt import Client, connect
from helpers.planes import InProcess

MS = 1000  # microseconds
SCH = schema("digest")
MAC = digest_id(SCH, "mac_learn_t")


async def primary(channel: grpc.aio.Channel, name: str) -> Client:
    """A primary client (election id 5) with corpus program `name` set."""
    c = await connect(channel, 5)
    await c.responses.get()
    await c.set_pipeline(pipeline(name))
    return c


# ---------------------------------------------------------------- DigestEntry over P4Runtime


async def test_digest_entry_writes_and_reads_answer_as_pi(in_process_target: InProcess) -> None:
    _, channel = in_process_target
    c = await primary(channel, "digest")
    entry = p4r.Entity(digest_entry=p4r.DigestEntry(digest_id=MAC))

    async def code(*updates: p4r.Update) -> grpc.StatusCode:
        try:
            await c.write(*updates)
        except grpc.aio.AioRpcError as err:
            from helpers.p4rt import detail_codes

            [detail] = detail_codes(err)
            return grpc.StatusCode(next(s for s in grpc.StatusCode if s.value[0] == detail))
        return grpc.StatusCode.OK

    async def read_code(e: p4r.Entity) -> grpc.StatusCode:
        try:
            await c.read(e)
        except grpc.aio.AioRpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    bad = p4r.Update(type=p4r.Update.INSERT, entity=p4r.Entity(digest_entry=p4r.DigestEntry(digest_id=12345)))
    assert await code(bad) == grpc.StatusCode.NOT_FOUND  # "12345 is not a valid digest id"
    assert await code(digest_update(SCH, p4r.Update.MODIFY, "mac_learn_t")) == grpc.StatusCode.NOT_FOUND
    assert await code(digest_update(SCH, p4r.Update.DELETE, "mac_learn_t")) == grpc.StatusCode.NOT_FOUND
    assert await read_code(entry) == grpc.StatusCode.NOT_FOUND  # not configured
    assert await read_code(p4r.Entity(digest_entry=p4r.DigestEntry())) == grpc.StatusCode.UNIMPLEMENTED
    negative = digest_update(SCH, p4r.Update.INSERT, "mac_learn_t", max_list_size=-1)
    assert await code(negative) == grpc.StatusCode.INVALID_ARGUMENT
    written = digest_update(SCH, p4r.Update.INSERT, "mac_learn_t", max_timeout_ns=5, max_list_size=3)
    assert await code(written) == grpc.StatusCode.OK
    assert await code(written) == grpc.StatusCode.ALREADY_EXISTS
    assert await c.read(entry) == [written.entity]
    changed = digest_update(SCH, p4r.Update.MODIFY, "mac_learn_t", ack_timeout_ns=7)
    assert await code(changed) == grpc.StatusCode.OK
    assert await c.read(entry) == [changed.entity]
    assert await code(digest_update(SCH, p4r.Update.DELETE, "mac_learn_t")) == grpc.StatusCode.OK
    assert await read_code(entry) == grpc.StatusCode.NOT_FOUND


async def test_digests_go_to_the_primary_only(in_process_target: InProcess) -> None:
    device, channel = in_process_target
    c = await primary(channel, "digest")
    backup = await connect(channel, 3)
    await backup.responses.get()
    await c.write(
        ins(SCH, "I.dmac", "I.fwd", {"hdr.ethernet.dstAddr": MAC_B}, port=1),
        digest_update(SCH, p4r.Update.INSERT, "mac_learn_t", max_list_size=1),
    )
    device.process(0, eth(0x0800, b"x" * 20))
    [msg] = await stream_messages(c)
    assert (msg.digest.digest_id, msg.digest.list_id, len(msg.digest.data)) == (MAC, 1, 1)
    assert await stream_messages(backup) == []


async def test_timeouts_run_on_wall_clock_time_in_the_server(in_process_target: InProcess) -> None:
    device, channel = in_process_target
    c = await primary(channel, "digest")
    await c.write(digest_update(SCH, p4r.Update.INSERT, "mac_learn_t", max_timeout_ns=100 * 10**6))
    device.process(0, eth(0x0800, b"x" * 20))
    device.process(0, eth(0x0800, b"x" * 20, src=MAC_B))
    assert await stream_messages(c, 0.05) == []
    # bmv2's buffer goes to PI after 100 ms, PI's task sends it on its second run after that (<= 300 ms).
    [msg] = await stream_messages(c, 1.0)
    assert (msg.digest.list_id, len(msg.digest.data)) == (1, 2)


# ---------------------------------------------------------------- packet I/O over P4Runtime


async def test_packet_in_to_primary_and_packet_out_from_primary_only(in_process_target: InProcess) -> None:
    device, channel = in_process_target
    device.cpu_port = CPU_PORT
    sent: list[tuple[int, bytes]] = []
    device.transmit = lambda port, frame: sent.append((port, frame))
    c = await primary(channel, "packet_io")
    backup = await connect(channel, 3)
    await backup.responses.get()
    sch = schema("packet_io")
    await c.write(ins(sch, "I.punt", "I.to_cpu", {"hdr.ethernet.etherType": 0x88CC}, reason=1))
    assert device.process(2, eth(0x88CC)) == []
    [msg] = await stream_messages(c)
    assert msg.packet.payload == eth(0x88CC)
    assert await stream_messages(backup) == []
    out = packet_out(sch, eth(0x0800), egress_port=b"\x01")
    backup.requests.put_nowait(stream_request(out))  # PI ignores a backup's packet-out, without an error
    assert await stream_messages(backup) == [] and sent == []
    c.requests.put_nowait(stream_request(out))
    await stream_messages(c, 0.1)
    assert sent == [(1, eth(0x0800))]


async def test_packet_out_without_cpu_port_or_with_bad_metadata_is_dropped(in_process_target: InProcess) -> None:
    device, channel = in_process_target
    sent: list[tuple[int, bytes]] = []
    device.transmit = lambda port, frame: sent.append((port, frame))
    c = await primary(channel, "packet_io")
    sch = schema("packet_io")
    c.requests.put_nowait(stream_request(packet_out(sch, eth(0x0800), egress_port=b"\x01")))  # no CPU port
    assert await stream_messages(c, 0.1) == []
    device.cpu_port = CPU_PORT
    c.requests.put_nowait(stream_request(packet_out(sch, eth(0x0800), egress_port=b"\x02\x00")))  # 512: 10 bits
    # No StreamError either: PI's stream error reporting is off by default. The stream still works.
    assert await stream_messages(c) == [] and sent == []
    c.requests.put_nowait(stream_request(packet_out(sch, eth(0x0800), egress_port=b"\x01")))
    await stream_messages(c, 0.1)
    assert sent == [(1, eth(0x0800))]


def test_packet_out_metadata_packs_as_pi() -> None:
    device = Device(1, VirtualClock(), cpu_port=CPU_PORT)
    device.pipeline = device.build_pipeline(pipeline("packet_io"))
    frames: list[tuple[int, bytes]] = []
    device.inject = lambda port, frame: frames.append((port, frame))
    sch = schema("packet_io")
    device.packet_out(packet_out(sch, b"pay", egress_port=b"\x01\x23", tag=b"\x01"))
    # egress_port 0x123 in 9 bits, tag 1 in 1 bit, 6 pad bits: 1001 0001 1100 0000.
    assert frames == [(CPU_PORT, b"\x91\xc0pay")]
    with pytest.raises(P4RuntimeError, match="Unknown metadata id 9"):
        bad = p4r.PacketOut(payload=b"x")
        bad.metadata.add(metadata_id=9, value=b"\x01")
        device.packet_out(bad)


def test_cpu_port_option_is_checked() -> None:
    with pytest.raises(SystemExit) as err:
        main(["--cpu-port", "0", "--no-p4"])
    assert err.value.code == 2
    with pytest.raises(SystemExit) as err:
        main(["--cpu-port", "3", "-i", "3@veth0", "--no-p4"])
    assert err.value.code == 2


# ---------------------------------------------------------------- timing, on a virtual clock


def virtual_digest_device() -> tuple[Device, VirtualClock, Collector]:
    """digest.p4 on a virtual clock, dmac forwarding MAC_B to port 1, and a listener collecting messages."""
    clock = VirtualClock()
    device = Device(1, clock)
    heard = Collector()
    device.listeners.append(heard)
    device.pipeline = device.build_pipeline(pipeline("digest"))
    device.pipeline.write(ins(SCH, "I.dmac", "I.fwd", {"hdr.ethernet.dstAddr": MAC_B}, port=1))
    return device, clock, heard


def at(device: Device, clock: VirtualClock, us: int) -> None:
    """Move virtual time to `us` and run what falls due, as a simulation does."""
    clock.advance_to(us)
    device.tick()


def configure(device: Device, kind: int = p4r.Update.INSERT, **config: int) -> None:
    """Write mac_learn_t's DigestEntry straight to the pipeline."""
    assert device.pipeline is not None
    device.pipeline.write(digest_update(SCH, kind, "mac_learn_t", **config))


def learn(device: Device, host: int, port: int = 0) -> None:
    """A frame from source MAC 02:00:00:00:00:<host> on `port` (smac misses: mac_learn_t)."""
    device.process(port, eth(0x0800, b"x" * 20, src=f"02:00:00:00:00:{host:02x}"))


def lists(heard: Collector) -> list[tuple[int, int, list[int]]]:
    """(list id, time in ms, source hosts) of each DigestList so far."""
    out = []
    for m in heard.messages:
        hosts = [d.struct.members[0].bitstring[-1] for d in m.digest.data]
        out.append((m.digest.list_id, m.digest.timestamp // 1_000_000, hosts))
    return out


def test_nothing_is_sent_without_a_digest_entry_but_bmv2s_buffer_is() -> None:
    device, clock, heard = virtual_digest_device()
    learn(device, 1)
    at(device, clock, 1100 * MS)  # bmv2's default buffer (16 samples, 1 s) went to PI, which dropped it
    learn(device, 2)
    at(device, clock, 1500 * MS)
    assert heard.messages == []
    # The INSERT sets bmv2's buffer to one sample, which flushes the one waiting since 1.1 s into a
    # digest that is configured by then: PI's config write comes before the target's.
    configure(device, max_list_size=1)
    assert lists(heard) == [(1, 1500, [2])]


def test_lists_batch_on_bmv2s_timeout_then_pis_second_periodic_run() -> None:
    device, clock, heard = virtual_digest_device()
    configure(device, max_timeout_ns=200 * 10**6)  # max_list_size 0: bmv2 holds up to 1024 samples
    at(device, clock, 10 * MS)
    learn(device, 1)
    at(device, clock, 50 * MS)
    learn(device, 2)
    learn(device, 1)  # already in bmv2's buffer
    at(device, clock, 590 * MS)
    # bmv2 sent both at 210 ms; PI's task (every 200 ms) saw the data at 400 ms and sends at 600 ms.
    assert heard.messages == []
    at(device, clock, 600 * MS)
    assert lists(heard) == [(1, 600, [1, 2])]


def test_ack_timeout_caches_until_acked_or_expired() -> None:
    device, clock, heard = virtual_digest_device()
    configure(device, max_list_size=1, ack_timeout_ns=10**9)
    learn(device, 1)
    learn(device, 1, port=0)
    learn(device, 2)
    assert lists(heard) == [(1, 0, [1]), (2, 0, [2])]
    device.digest_ack(p4r.DigestListAck(digest_id=MAC, list_id=1))
    learn(device, 1)
    learn(device, 2)  # list 2 is not acked: still cached
    assert lists(heard)[2:] == [(3, 0, [1])]
    at(device, clock, 1999 * MS)  # the ack task saw list 2 at 1 s; it expires it on its next run
    learn(device, 2)
    at(device, clock, 2000 * MS)
    learn(device, 2)
    assert lists(heard)[3:] == [(4, 2000, [2])]


def test_without_ack_timeout_duplicates_are_sent_and_only_the_timeout_sends() -> None:
    device, clock, heard = virtual_digest_device()
    configure(device, max_list_size=1)
    learn(device, 1)
    learn(device, 1)
    assert lists(heard) == [(1, 0, [1]), (2, 0, [1])]
    # max_list_size 2 without an ack timeout: PI counts cached samples only, so size never sends.
    configure(device, p4r.Update.MODIFY, max_list_size=2, max_timeout_ns=100 * 10**6)
    learn(device, 3)
    learn(device, 4)  # bmv2's buffer of 2 goes to PI at once; PI waits for its task
    at(device, clock, 150 * MS)
    assert len(heard.messages) == 2
    at(device, clock, 200 * MS)
    assert lists(heard)[2:] == [(3, 200, [3, 4])]


def test_delete_forgets_the_cache_and_stops_sending() -> None:
    device, _, heard = virtual_digest_device()
    configure(device, max_list_size=1, ack_timeout_ns=10**9)
    learn(device, 1)
    configure(device, p4r.Update.DELETE)
    learn(device, 2)
    configure(device, max_list_size=1, ack_timeout_ns=10**9)
    learn(device, 1)  # no longer cached
    assert lists(heard) == [(1, 0, [1]), (2, 0, [1])]


def test_a_far_jump_of_virtual_time_runs_the_periodic_tasks_without_looping() -> None:
    device, clock, heard = virtual_digest_device()
    configure(device, max_list_size=1, max_timeout_ns=1, ack_timeout_ns=1)  # both tasks every 100 ms
    learn(device, 1)
    start = time.process_time()
    at(device, clock, 10**12)  # eleven days: 10^7 runs of each task, most of them idle
    assert time.process_time() - start < 1
    learn(device, 1)  # expired long ago
    assert lists(heard) == [(1, 0, [1]), (2, 10**9, [1])]
    assert device.next_deadline_us() == 10**12 + 100 * MS
