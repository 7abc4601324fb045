"""Property-based: whatever values reach the API, it answers OK or INVALID_ARGUMENT naming a field,
never crashes, and a refused request changes nothing stored."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
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
    caps = []
    for p in pods:
        try:
            caps.append((await c.get_pod_cap(p.name)).cap)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND
    routers = (await c.stub.ListRouters(pb.ListRoutersRequest())).routers
    return (tuple(pods), tuple(dpus), tuple(caps), tuple(routers), (await c.status()).generation)


def _names_a_field(details: str) -> bool:
    return any(f in details for f in FIELDS)


def _names_an_entry(details: str) -> bool:
    """A batch's error starts with the entry at fault: pods[0], dpus[2], caps[1], routers[0]."""
    return re.match(r"^(pods|dpus|caps|routers)\[\d+\]", details) is not None


async def _check(c: LimiterClient, call: object, names_field: Callable[[str], bool] = _names_a_field) -> None:
    """The call is done, or refused naming the field at fault with nothing stored changed."""
    before = await _snapshot(c)
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as err:
        assert err.code() in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.ALREADY_EXISTS,
        ), err
        assert names_field(err.details() or ""), err.details()
        assert await _snapshot(c) == before


def _run(db: str, body: object) -> None:
    async def main() -> None:
        plane = ControlPlane(db, "127.0.0.1:0")
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
def test_set_pod_cap_any_values(db: str, egress: float, ingress: float, window: float, burst: int, pod: str) -> None:
    async def body(c: LimiterClient) -> None:
        await _check(c, c.set_pod_cap(pod, egress, ingress, window, burst))
        cap = (await c.get_pod_cap("a")).cap
        assert cap.egress_bps > 0 and math.isfinite(cap.egress_bps) and cap.burst_bytes < 1 << 32

    _run(db, body)


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
    db: str,
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

    _run(db, body)


# Every DPU address a request may carry is invalid or on loopback: a stored DPU is dialled.
addresses = st.sampled_from(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:0", "127.0.0.1:70000", "nowhere", "", "[::1]:1"])
pods_pb = st.builds(pb.Pod, name=names, ipv4_prefixes=prefixes)
dpus_pb = st.builds(
    pb.Dpu,
    name=names,
    p4runtime_address=addresses,
    device_id=st.integers(0, (1 << 64) - 1),
    pod=names,
    role=st.integers(0, 3),
    host_port=st.integers(0, 600),
    uplink_port=st.integers(0, 600),
    buffer_bytes=st.integers(0, (1 << 64) - 1),
)
caps_pb = st.builds(
    pb.PodCap,
    pod=names,
    cap=st.builds(
        pb.Cap,
        egress_bps=floats,
        ingress_bps=floats,
        window_s=floats,
        burst_bytes=st.integers(0, (1 << 64) - 1),
        rebalance=st.booleans(),
        mode=st.integers(0, 2),
    ),
)
stored = st.one_of(st.sampled_from(["a", "b", "b1"]), names)  # names that exist (some of the time)
routers_pb = st.builds(pb.Router, name=names, pods=st.lists(stored, max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pods=st.lists(pods_pb, max_size=3),
    dpus=st.lists(dpus_pb, max_size=3),
    caps=st.lists(caps_pb, max_size=3),
    routers=st.lists(routers_pb, max_size=2),
    dry_run=st.booleans(),
)
def test_apply_any_batch(
    db: str,
    pods: list[pb.Pod],
    dpus: list[pb.Dpu],
    caps: list[pb.PodCap],
    routers: list[pb.Router],
    dry_run: bool,
) -> None:
    async def body(c: LimiterClient) -> None:
        before = await _snapshot(c)
        request = pb.ApplyRequest(pods=pods, dpus=dpus, caps=caps, routers=routers, dry_run=dry_run)
        await _check(c, c.stub.Apply(request), _names_an_entry)
        if dry_run:
            assert await _snapshot(c) == before

    _run(db, body)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pods=st.lists(stored, max_size=3),
    dpus=st.lists(stored, max_size=3),
    caps=st.lists(stored, max_size=3),
    routers=st.lists(st.one_of(st.just("r1"), names), max_size=2),
    dry_run=st.booleans(),
    missing_ok=st.booleans(),
)
def test_delete_any_names(
    db: str,
    pods: list[str],
    dpus: list[str],
    caps: list[str],
    routers: list[str],
    dry_run: bool,
    missing_ok: bool,
) -> None:
    async def body(c: LimiterClient) -> None:
        # Pod b with a DPU, so that some deletes are refused for the DPUs a pod keeps.
        await c.stub.Apply(
            pb.ApplyRequest(
                pods=[pb.Pod(name="b", ipv4_prefixes=["10.0.2.0/24"])],
                dpus=[pb.Dpu(name="b1", p4runtime_address="127.0.0.1:1", device_id=1, pod="b")],
                routers=[pb.Router(name="r1", pods=["b"])],
            )
        )
        request = pb.DeleteRequest(
            pods=pods, dpus=dpus, caps=caps, routers=routers, dry_run=dry_run, missing_ok=missing_ok
        )
        await _check(c, c.stub.Delete(request), _names_an_entry)

    _run(db, body)


# ---------------------------------------------------------------- every RPC, raw bytes and any message

ANSWERS = (
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
)
METHODS = pb.DESCRIPTOR.services_by_name["Limiter"].methods
CALL_S = 10.0  # each call's deadline


def _values(field: FieldDescriptor) -> st.SearchStrategy[object]:
    """Any value of one field, of its type (any address a stored DPU could be dialled at is on loopback)."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return st.deferred(lambda: _messages(field.message_type))
    if field.type == FieldDescriptor.TYPE_STRING:
        return addresses if field.name == "p4runtime_address" else st.one_of(names, stored)
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return floats
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.integers(-3, 5)  # proto3 enums are open: unknown numbers arrive too
    if field.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64):  # signed: negatives arrive too
        bits = 32 if field.type == FieldDescriptor.TYPE_INT32 else 64
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    bits = 32 if field.type == FieldDescriptor.TYPE_UINT32 else 64
    return st.integers(0, (1 << bits) - 1)


def _messages(desc: Descriptor) -> st.SearchStrategy[object]:
    """Any message of `desc`'s type, each field set or not (repeated ones with up to 3 values)."""
    fields = {
        f.name: st.lists(_values(f), max_size=3) if f.label == FieldDescriptor.LABEL_REPEATED else _values(f)
        for f in desc.fields
    }
    cls = message_factory.GetMessageClass(desc)
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: cls(**kw))


def _payloads(desc: Descriptor) -> st.SearchStrategy[bytes]:
    """Bytes for a method taking `desc`: random, a message of the type, or one with a byte changed or cut short."""
    encoded = _messages(desc).map(lambda m: m.SerializeToString())  # type: ignore[attr-defined]

    def damage(data: bytes, at: int, byte: int, cut: bool) -> bytes:
        if not data:
            return bytes([byte])
        at %= len(data)
        return data[:at] if cut else data[:at] + bytes([byte]) + data[at + 1 :]

    damaged = st.builds(damage, encoded, st.integers(0, 1 << 16), st.integers(0, 255), st.booleans())
    return st.one_of(st.binary(max_size=64), encoded, damaged)


@pytest.mark.parametrize("method", [m.name for m in METHODS])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_rpc_any_bytes(db: str, method: str, data: st.DataObject) -> None:
    """Whatever bytes reach any RPC: an answer the proto lists, a bounded error, nothing stored by a refusal."""
    desc = pb.DESCRIPTOR.services_by_name["Limiter"].methods_by_name[method]
    payload = data.draw(_payloads(desc.input_type))

    async def body(c: LimiterClient) -> None:
        before = await _snapshot(c)
        path = f"/limiter.v1.Limiter/{method}"
        try:
            if desc.server_streaming:
                call = c.channel.unary_stream(path)(payload, timeout=CALL_S)
                await anext(aiter(call))
                call.cancel()
            else:
                await c.channel.unary_unary(path)(payload, timeout=CALL_S)
        except grpc.aio.AioRpcError as err:
            waited = err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and _asks_to_wait(method, payload, CALL_S)
            assert err.code() in ANSWERS or waited, (err.code(), err.details())
            assert len(err.details() or "") <= 1024
            assert await _snapshot(c) == before

    _run(db, body)


def _asks_to_wait(method: str, payload: bytes, deadline_s: float) -> bool:
    """Whether `payload` is a GetStatus that may wait (wait_s, up to an hour: a valid request) about as long as
    the call's deadline or longer: then running out of time is the caller's doing (CI drew wait_s over 10 s)."""
    if method != "GetStatus":
        return False
    try:
        request = pb.GetStatusRequest.FromString(payload)
    except DecodeError:
        return False
    return request.wait_s >= deadline_s - 2
