"""A DPU's queues after its meter: the controller programs every allowance that much smaller.

A receiver can see, in one window, what the meter passed in that window plus whatever sat in the
DPU's queues when the window opened. The cap is judged at the receiver, so a DPU registered with
`buffer_bytes` gets its bucket (rate mode) or window budget (window mode) reduced by as much, and a
cap that would leave less than one frame is refused, naming the field.
"""

from __future__ import annotations

import grpc
import pytest

from dpu_limiter import dataplane as dp
from dpu_limiter import shares
from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Pod
from dpu_limiter.server import ControlPlane
from dpu_limiter.units import MAX_FRAME_BYTES
from helpers.planes import programmed_target, register

pytestmark = pytest.mark.timeout(120)

POD = Pod("a", ("10.0.1.0/24",))


def test_bucket_and_budget_are_reduced_by_the_buffer() -> None:
    dpu = Dpu("d", "127.0.0.1:1", 1, "a", buffer_bytes=300_000)
    rate = dp.intent_for(dpu, POD, Cap(8e6, 16e6, 2.0, 1_000_000))
    # The bucket less the buffer and ARP's own 600-byte bucket; the rate less ARP's 1000 B/s.
    data = {c: (m.cir, m.cburst, m.pburst) for c, m in rate.meters.items() if c < dp.ARP_CELLS}
    assert data == {0: (999_000, 699_400, 699_400), 1: (1_999_000, 699_400, 699_400)}
    assert {rate.meters[dp.ARP_CELLS + c] for c in (0, 1)} == {dp.ARP_METER}
    window = dp.intent_for(dpu, POD, Cap(8e6, 16e6, 4.0, 16_384, mode="window"))
    # The budget less the buffer and all that ARP may pass in a window (1000 B/s x 4 s + its bucket).
    assert {c: w[0] for c, w in window.windows.items()} == {0: 4_000_000 - 304_600, 1: 8_000_000 - 304_600}
    # Without a buffer, the cap's own figures less ARP's.
    plain = dp.intent_for(Dpu("d", "127.0.0.1:1", 1, "a"), POD, Cap(8e6, 16e6, 2.0, 1_000_000))
    assert plain.meters[0].cburst == 1_000_000 - 600


def test_a_buffer_larger_than_the_allowance_fails_closed() -> None:
    dpu = Dpu("d", "127.0.0.1:1", 1, "a", buffer_bytes=2_000_000)
    intent = dp.intent_for(dpu, POD, Cap(8e6, 8e6, 2.0, 1_000_000))
    assert all(m.cburst == 0 and m.pburst == 0 for c, m in intent.meters.items() if c < dp.ARP_CELLS)


def test_node_shares_keep_the_mode_and_leave_room_for_buffers() -> None:
    cap = Cap(8e6, 8e6, 4.0, 1_000_000, mode="window")
    assert {c.mode for c in shares.split(cap, ["n1", "n2"]).values()} == {"window"}
    assert shares.lesser(cap, cap) == Cap(8e6, 8e6, 4.0, 1_000_000, mode="window")
    assert shares.lesser(cap, Cap(8e6, 8e6, 4.0, 1_000_000)) is None  # a mode change passes through the floor
    burst, _ = shares.node_burst(Cap(8e6, 8e6, 2.0, 100_000), 4, 1.0, buffer_bytes=300_000)
    assert burst - 300_000 >= shares.MIN_NODE_BURST


async def _refused(coro: object, field: str, value: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await coro  # type: ignore[misc]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or "") and value in (err.value.details() or "")


async def test_the_api_refuses_what_would_leave_less_than_a_frame(db: str) -> None:
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24"])
            await register(c, "dpu-a", "127.0.0.1:1", buffer_bytes=300_000)
            [listed] = (await c.stub.ListDpus(pb.ListDpusRequest())).dpus
            assert listed.buffer_bytes == 300_000
            await c.set_pod_cap("a", 8e6, 8e6, 2.0, 400_000)
            gen = (await c.status()).generation
            small = 300_000 + MAX_FRAME_BYTES - 1
            await _refused(c.set_pod_cap("a", 8e6, 8e6, 2.0, small), "cap.burst_bytes", str(small))
            await _refused(c.set_pod_cap("a", 2e4, 2e4, 1.0, mode="window"), "cap.window_s", "dpu-a")
            assert (await c.status()).generation == gen
            # Two node DPUs share a's cap: each half of the bucket, less its buffer, must hold a frame.
            await register(c, "dpu-n1", "127.0.0.1:2", pod="a", node=True, buffer_bytes=100_000)
            gen = (await c.status()).generation
            await _refused(
                register(c, "dpu-n2", "127.0.0.1:3", pod="a", node=True, buffer_bytes=199_000),
                "dpu.buffer_bytes",
                "199000",
            )
            assert (await c.status()).generation == gen
            assert [d.name for d in (await c.stub.ListDpus(pb.ListDpusRequest())).dpus] == ["dpu-a", "dpu-n1"]
            assert (await c.get_pod_cap("a")).cap.burst_bytes == 400_000
    finally:
        await plane.stop()


async def test_the_target_holds_the_reduced_bucket(db: str) -> None:
    async with programmed_target(db, (8e6, 8e6, 2.0, 1_000_000), buffer_bytes=294_492) as (device, _, _):
        assert device.pipeline is not None
        meter = device.pipeline.program.meters["LimiterIngress.boundary_meter"]
        # The rate less ARP's 1000 B/s; the bucket less the buffer and ARP's 600 bytes.
        assert meter.get_p4runtime_config(0) == (999_000, 704_908, 999_000, 704_908)
        assert meter.get_p4runtime_config(dp.ARP_CELLS) == (1000, 600, 1000, 600)
