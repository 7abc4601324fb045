"""The typed client (dpu_limiter.client): one method per RPC of limiter.v1, in the control plane's models."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import grpc
import pytest

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient, PodCap, as_dict
from dpu_limiter.models import Cap, Dpu, Pod, Role, Router
from dpu_limiter.server import ControlPlane
from dpu_limiter.units import default_burst_bytes

# RPCs whose method is not the RPC's name in snake case.
METHOD_OF = {"GetUsage": "usage", "GetStatus": "status"}


@pytest.fixture
async def client(db: str) -> AsyncIterator[LimiterClient]:
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            yield c
    finally:
        await plane.stop()


def test_every_rpc_has_a_method() -> None:
    for rpc in pb.DESCRIPTOR.services_by_name["Limiter"].methods:
        name = METHOD_OF.get(rpc.name) or re.sub(r"(?<!^)([A-Z])", r"_\1", rpc.name).lower()
        assert callable(getattr(LimiterClient, name, None)), f"{rpc.name}: no LimiterClient.{name}"


async def test_pods_dpus_and_caps_go_in_and_come_back_as_models(client: LimiterClient) -> None:
    c = client
    a = Pod("a", ("10.0.1.0/24",))
    assert await c.apply_pod(a) == a
    assert await c.apply_pod("b", ["10.0.2.0/24"]) == Pod("b", ("10.0.2.0/24",))
    assert await c.list_pods() == [a, Pod("b", ("10.0.2.0/24",))]

    uplink = Dpu("dpu-a", "127.0.0.1:1", 1, "a", buffer_bytes=3036)
    assert await c.register_dpu(uplink) == uplink
    node = Dpu("n1", "LocalHost.:9559", 2, "b", Role.NODE, 0, 1, 0, "02:00:00:00:00:AA")
    stored = await c.register_dpu(node)  # as the control plane normalised it
    assert (stored.p4runtime_address, stored.node_mac) == ("localhost:9559", "02:00:00:00:00:aa")
    assert await c.list_dpus() == [uplink, stored]

    burst = default_burst_bytes(20e6)
    assert await c.set_pod_cap("a", Cap(20e6, 10e6, 10.0)) == PodCap("a", Cap(20e6, 10e6, 10.0, burst))
    window = Cap(1e9, 1e9, 60.0, 0, True, "window")
    set_by_fields = await c.set_pod_cap("b", 1e9, 1e9, 60.0, rebalance=True, mode="window")
    assert set_by_fields.cap == Cap(1e9, 1e9, 60.0, default_burst_bytes(1e9), True, "window")
    assert await c.set_pod_cap("b", window) == set_by_fields
    assert await c.get_pod_cap("b") == set_by_fields
    assert as_dict(await c.get_pod_cap("a")) == {
        "pod": "a",
        "cap": {
            "egress_bps": 20e6,
            "ingress_bps": 10e6,
            "window_s": 10.0,
            "burst_bytes": str(burst),  # the API's JSON mapping: 64-bit integers as strings
            "rebalance": False,
            "mode": "CAP_MODE_RATE",
        },
    }


async def test_a_file_is_one_write_and_answers_are_messages(client: LimiterClient) -> None:
    c = client
    pods = [Pod("a", ("10.0.1.0/24",)), Pod("b", ("10.0.2.0/24",))]
    dpus = [Dpu("dpu-a", "127.0.0.1:1", 1, "a")]
    caps = {"a": Cap(8e6, 8e6, 2.0, 400_000)}
    routers = [Router("r1", ("a", "b"))]
    dry = await c.apply(pods, dpus, caps, routers, dry_run=True)
    assert [(ch.verb, ch.kind, ch.name) for ch in dry.changes] == [
        ("create", "pod", "a"),
        ("create", "pod", "b"),
        ("create", "dpu", "dpu-a"),
        ("create", "cap", "a"),
        ("create", "router", "r1"),
    ]
    assert await c.list_pods() == []  # a dry run stores nothing
    written = await c.apply(pods, dpus, caps, routers)
    assert written.generation > dry.generation
    assert {ch.verb for ch in (await c.apply(pods, dpus, caps, routers)).changes} == {"unchanged"}
    assert await c.list_routers() == routers
    assert (await c.get_pod_cap("a")).cap == caps["a"]

    with pytest.raises(grpc.aio.AioRpcError) as err:  # all or nothing; errors name the entry
        await c.apply(caps={"a": Cap(8e6, 8e6, 2.0), "nosuch": Cap(8e6, 8e6, 2.0)})
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "caps[1].pod" in (err.value.details() or "")

    status = await c.status()
    assert [d.name for d in status.dpus] == ["dpu-a"] and status.generation == written.generation
    usage = await c.usage("a", per_dpu=True)
    assert {(u.dpu, u.direction) for u in usage.usage} >= {("", "egress"), ("", "ingress")}
    sample = await anext(c.watch_usage("a", 0.1))
    assert sample.time > 0 and {u.pod for u in sample.usage} == {"a"}
    assert as_dict(usage.usage[0])["dpus_unread"] == 1  # dpu-a does not answer: left out, and said so

    gone = await c.delete(dpus=["dpu-a"], caps=["a"], routers=["r1"], dry_run=True)
    assert sorted((ch.verb, ch.kind, ch.name) for ch in gone.changes) == [
        ("delete", "cap", "a"),
        ("delete", "dpu", "dpu-a"),
        ("delete", "router", "r1"),
    ]
    await c.delete(["a", "b"], ["dpu-a"], ["a"], ["r1"])
    assert (await c.list_pods(), await c.list_dpus(), await c.list_routers()) == ([], [], [])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.delete(pods=["a"])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert not (await c.delete(pods=["a"], missing_ok=True)).changes


async def test_models_are_checked_by_the_control_plane_not_the_client(client: LimiterClient) -> None:
    """The client sends what it is given: bad values are refused by the server, naming the field."""
    for call, field in (
        (client.apply_pod(Pod("B!", ("10.0.2.0/24",))), "pod.name"),
        (client.register_dpu(Dpu("d", "127.0.0.1", 1, "a")), "dpu.p4runtime_address"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (err.value.details() or "")
    await client.apply_pod("a", ["10.0.1.0/24"])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.set_pod_cap("a", Cap(20e6, 20e6, 0.0))
    assert "cap.window_s" in (err.value.details() or "")
    with pytest.raises(TypeError):
        await client.apply_pod(Pod("a", ("10.0.1.0/24",)), ["10.0.3.0/24"])


async def test_status_comes_in_pages_in_order_of_name(client: LimiterClient) -> None:
    """GetStatus pages (page_size rows after page_token): every DPU exactly once, in order; the last page
    says so with an empty token; bad paging is refused naming the field."""
    await client.apply_pod("a", ["10.0.1.0/24"])
    names = [f"dpu-{i:02d}" for i in range(7)]
    await client.apply(dpus=[Dpu(n, f"127.0.0.1:{i + 1}", i + 1, "a", Role.NODE) for i, n in enumerate(names)])
    assert [d.name for d in (await client.status()).dpus] == names  # no page_size: every DPU
    for size in (1, 3, 7, 10):
        seen, token, pages = [], "", 0
        while True:
            page = await client.status(page_size=size, page_token=token)
            pages += 1
            assert len(page.dpus) <= size
            seen += [d.name for d in page.dpus]
            if not (token := page.next_page_token):
                break
        assert seen == names and pages == -(-len(names) // size)
    assert [d.name for d in (await client.status(page_size=2, page_token="dpu-04")).dpus] == ["dpu-05", "dpu-06"]
    # One control plane holds every DPU: its own are the fleet.
    assert [d.name for d in (await client.status(held_here=True)).dpus] == names
    for request, field in (
        (pb.GetStatusRequest(page_size=-1), "page_size"),
        (pb.GetStatusRequest(page_token="A B"), "page_token"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.stub.GetStatus(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (err.value.details() or "")
