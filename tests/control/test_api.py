"""The control plane's gRPC API: bad input is refused naming field and value, and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane


@pytest.fixture
async def cp(db: str) -> AsyncIterator[tuple[ControlPlane, LimiterClient]]:
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    client = LimiterClient(plane.address)
    try:
        yield plane, client
    finally:
        await client.channel.close()
        await plane.stop()


async def _invalid(
    coro: object, field: str, value: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await coro  # type: ignore[misc]
    assert err.value.code() == code
    assert field in (err.value.details() or "")
    assert value in (err.value.details() or "")


def dpu(name: str = "dpu-a", pod: str = "a", addr: str = "127.0.0.1:1", device_id: int = 1) -> pb.Dpu:
    return pb.Dpu(
        name=name,
        p4runtime_address=addr,
        device_id=device_id,
        pod=pod,
        role=pb.DPU_ROLE_POD_UPLINK,
        host_port=0,
        uplink_port=1,
    )


async def test_bad_input_names_field_and_value_and_stores_nothing(
    cp: tuple[ControlPlane, LimiterClient],
) -> None:
    _, c = cp
    await c.apply_pod("a", ["10.0.1.0/24"])
    await c.register_dpu(dpu())
    await c.set_pod_cap("a", 20e6, 20e6, 10.0, 100_000)
    gen = (await c.status()).generation

    await _invalid(c.apply_pod("b", ["10.0.2.1/24"]), "pod.ipv4_prefixes[0]", "10.0.2.1/24")
    await _invalid(c.apply_pod("b", ["10.0.1.128/25"]), "pod.ipv4_prefixes", "overlaps 10.0.1.0/24")
    await _invalid(c.apply_pod("B!", ["10.0.2.0/24"]), "pod.name", "B!")
    await _invalid(c.register_dpu(dpu(name="dpu-x", pod="nope")), "dpu.pod", "nope", grpc.StatusCode.NOT_FOUND)
    await _invalid(c.register_dpu(dpu(name="dpu-x", addr="127.0.0.1")), "dpu.p4runtime_address", "127.0.0.1")
    await _invalid(c.register_dpu(dpu(name="dpu-x", addr="999.0.0.1:5")), "dpu.p4runtime_address", "999.0.0.1:5")
    await _invalid(c.register_dpu(dpu()), "dpu.name", "dpu-a", grpc.StatusCode.ALREADY_EXISTS)
    await _invalid(
        c.register_dpu(dpu(name="dpu-y")), "dpu.p4runtime_address", "127.0.0.1:1", grpc.StatusCode.ALREADY_EXISTS
    )
    await _invalid(c.set_pod_cap("a", -1, 20e6, 10.0), "cap.egress_bps", "-1")
    await _invalid(c.set_pod_cap("a", 20e6, 0, 10.0), "cap.ingress_bps", "0")
    await _invalid(c.set_pod_cap("a", 20e6, 20e6, 0), "cap.window_s", "0")
    await _invalid(c.set_pod_cap("a", 20e6, 20e6, -3), "cap.window_s", "-3")
    await _invalid(c.set_pod_cap("a", 20e6, 20e6, 10, 1 << 40), "cap.burst_bytes", str(1 << 40))
    await _invalid(c.set_pod_cap("a", 1e12, 1e12, 10), "cap.burst_bytes", "the default, 100 ms at the rate")
    await _invalid(c.set_pod_cap("zz", 20e6, 20e6, 10), "pod", "zz", grpc.StatusCode.NOT_FOUND)
    await _invalid(c.set_pod_cap("a", float("nan"), 20e6, 10), "cap.egress_bps", "nan")

    assert (await c.status()).generation == gen
    cap = (await c.get_pod_cap("a")).cap
    assert (cap.egress_bps, cap.ingress_bps, cap.window_s, cap.burst_bytes) == (20e6, 20e6, 10.0, 100_000)
    dpus = (await c.stub.ListDpus(pb.ListDpusRequest())).dpus
    assert [d.name for d in dpus] == ["dpu-a"]


async def test_unknown_cap_is_not_found(cp: tuple[ControlPlane, LimiterClient]) -> None:
    _, c = cp
    await c.apply_pod("a", ["10.0.1.0/24"])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.get_pod_cap("a")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_state_survives_a_restart(db: str) -> None:
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    async with LimiterClient(plane.address) as c:
        await c.apply_pod("a", ["10.0.1.0/24"])
        await c.register_dpu(dpu())
        await c.set_pod_cap("a", 1e9, 5e8, 60.0)
    await plane.stop()

    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            cap = (await c.get_pod_cap("a")).cap
            assert (cap.egress_bps, cap.ingress_bps, cap.window_s) == (1e9, 5e8, 60.0)
            assert cap.burst_bytes == 12_500_000  # default: 100 ms at the larger rate
            status = await c.status()
            assert [d.name for d in status.dpus] == ["dpu-a"]  # its agent resumed from the store
    finally:
        await plane.stop()
