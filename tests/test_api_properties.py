"""Property-based: whatever values reach the API, it answers OK or INVALID_ARGUMENT naming a field,
never crashes, and a refused request changes nothing stored."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane

FIELDS = (
    "cap.egress_bps",
    "cap.ingress_bps",
    "cap.window_s",
    "cap.burst_bytes",
    "pod",
    "pod.name",
    "pod.ipv4_prefixes",
    "dpu.",
)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-300, 1e300]))
names = st.one_of(st.text(max_size=80), st.sampled_from(["a", "b", "", "A", "a" * 64, "a/b", "é"]))
prefixes = st.lists(
    st.one_of(
        st.text(max_size=20),
        st.sampled_from(["10.0.9.0/24", "10.0.1.0/24", "0.0.0.0/0", "10.0.9.1/24", "::/0", "10.0.9.0/33"]),
    ),
    max_size=4,
)


async def _snapshot(c: LimiterClient) -> tuple[object, ...]:
    pods = (await c.stub.ListPods(pb.ListPodsRequest())).pods
    dpus = (await c.stub.ListDpus(pb.ListDpusRequest())).dpus
    return (tuple(pods), tuple(dpus), (await c.get_pod_cap("a")).cap, (await c.status()).generation)


async def _check(c: LimiterClient, call: object) -> None:
    before = await _snapshot(c)
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as err:
        assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), err
        assert any(f in (err.details() or "") for f in FIELDS), err.details()
        assert await _snapshot(c) == before


def _run(tmp_path: Path, body: object) -> None:
    async def main() -> None:
        plane = ControlPlane(tmp_path / "p.db", "127.0.0.1:0")
        await plane.start()
        try:
            async with LimiterClient(plane.address) as c:
                if not (await c.stub.ListPods(pb.ListPodsRequest())).pods:
                    await c.apply_pod("a", ["10.0.1.0/24"])
                    await c.set_pod_cap("a", 1e9, 1e9, 60.0)
                await body(c)  # type: ignore[operator]
        finally:
            await plane.stop()

    asyncio.run(main())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(egress=floats, ingress=floats, window=floats, burst=st.integers(0, (1 << 64) - 1), pod=names)
def test_set_pod_cap_any_values(
    tmp_path: Path, egress: float, ingress: float, window: float, burst: int, pod: str
) -> None:
    async def body(c: LimiterClient) -> None:
        await _check(c, c.set_pod_cap(pod, egress, ingress, window, burst))
        cap = (await c.get_pod_cap("a")).cap
        assert cap.egress_bps > 0 and math.isfinite(cap.egress_bps) and cap.burst_bytes < 1 << 32

    _run(tmp_path, body)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=names,
    pfx=prefixes,
    dpu_name=names,
    addr=names,
    device_id=st.integers(0, (1 << 64) - 1),
    host_port=st.integers(0, (1 << 32) - 1),
    uplink_port=st.integers(0, (1 << 32) - 1),
)
def test_pods_and_dpus_any_values(
    tmp_path: Path,
    name: str,
    pfx: list[str],
    dpu_name: str,
    addr: str,
    device_id: int,
    host_port: int,
    uplink_port: int,
) -> None:
    async def body(c: LimiterClient) -> None:
        await _check(c, c.apply_pod(name, pfx))
        dpu = pb.Dpu(
            name=dpu_name,
            p4runtime_address=addr,
            device_id=device_id,
            pod="a",
            role=pb.DPU_ROLE_POD_UPLINK,
            host_port=host_port,
            uplink_port=uplink_port,
        )
        await _check(c, c.register_dpu(dpu))

    _run(tmp_path, body)
