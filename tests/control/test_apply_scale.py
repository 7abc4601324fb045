"""A fleet's file in one Apply: checked in O(n log n), off the event loop, and the server keeps answering.

Real gRPC on loopback to a control plane in this process; the fleet's DPUs point at a closed port
(their agents just fail to connect). bench/apply_scale.py measures the same at 10,000 pods.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ipaddress
import random
import time
from collections.abc import AsyncIterator
from types import ModuleType

import grpc
import pytest

from dpu_limiter import api, planning
from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.client import LimiterClient
from dpu_limiter.convert import change_fields
from dpu_limiter.models import Change, DesiredState, InvalidArgument, Pod
from dpu_limiter.server import ControlPlane
from dpu_limiter.settings import Settings
from helpers.paths import ROOT
from helpers.processes import free_port

pytestmark = pytest.mark.timeout(300)

PODS = 2000
BOUND_S = 1.0  # generous: GetStatus answers and leases are renewed within this while an Apply runs


def _bench() -> ModuleType:
    """bench/apply_scale.py, whose fleet this test applies at a smaller size."""
    spec = importlib.util.spec_from_file_location("apply_scale", ROOT / "bench" / "apply_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fleet(pods: int, address: str) -> pb.ApplyRequest:
    """`pods` pods (10.x.y.0/24 each), two node DPUs per pod (own device ids and MACs), a cap each."""
    request: pb.ApplyRequest = _bench().fleet(pods, 2, address)
    return request


@pytest.fixture
async def plane(db: str) -> AsyncIterator[tuple[ControlPlane, LimiterClient, list[float]]]:
    """A control plane with a short lease (renewed every 0.2 s), each renewal's time noted; and a client."""
    cp = ControlPlane(db, "127.0.0.1:0", settings=Settings(lease_s=0.6))
    renewals: list[float] = []
    renew = cp.service.renew_leases

    def noted() -> dict[str, int]:
        renewals.append(time.monotonic())
        return renew()

    cp.service.renew_leases = noted  # type: ignore[method-assign]
    await cp.start()
    try:
        async with LimiterClient(cp.address) as c:
            yield cp, c, renewals
    finally:
        await cp.stop()


async def while_applying(c: LimiterClient, req: pb.ApplyRequest) -> tuple[pb.WriteResponse, float, list[float]]:
    """Apply `req` while polling GetStatus back to back: (reply, Apply's seconds, each poll's latency
    for the polls that overlapped the Apply)."""
    latencies: list[tuple[float, float, float]] = []  # (start, end)
    done = asyncio.Event()

    async def poll() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            await c.status()
            latencies.append((t0, time.monotonic(), time.monotonic() - t0))
            await asyncio.sleep(0.01)

    poller = asyncio.create_task(poll())
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    reply = await c.stub.Apply(req)
    t1 = time.monotonic()
    done.set()
    await poller
    return reply, t1 - t0, [lat for start, end, lat in latencies if start < t1 and end > t0]


async def test_a_fleet_apply_leaves_the_server_answering(
    plane: tuple[ControlPlane, LimiterClient, list[float]],
) -> None:
    cp, c, renewals = plane
    req = fleet(PODS, f"127.0.0.1:{free_port()}")
    for attempt in ("first", "again"):
        start = time.monotonic()
        reply, took, polls = await while_applying(c, req)
        # Every object once: created the first time, unchanged when the same file comes again.
        verbs = {ch.verb for ch in reply.changes}
        assert len(reply.changes) == 4 * PODS and verbs == ({"create"} if attempt == "first" else {"unchanged"})
        assert polls, f"no GetStatus answered during the {took:.2f} s Apply ({attempt})"
        assert max(polls) < BOUND_S, f"GetStatus took {max(polls):.2f} s during the Apply ({attempt})"
        # The renewal after the Apply too: an Apply shorter than a renewal's interval spans one gap.
        await asyncio.sleep(cp.service.lease_s / 3 + 0.1)
        gaps = [b - a for a, b in zip(renewals, renewals[1:], strict=False) if b > start]
        assert gaps and max(gaps) < cp.service.lease_s / 3 + BOUND_S, f"lease renewals {attempt}: {gaps}"
    status = await c.status()
    assert len(status.dpus) == 2 * PODS and status.generation == reply.generation


def test_a_writes_answer_encoded_in_pieces_is_the_whole_message() -> None:
    # Encoded ENCODED_CHANGES changes at a time (a fleet's answer at once held the interpreter lock ~20 ms):
    # the same bytes as the whole message encoded in one piece, every change in order.
    changes = [
        Change("create", "pod", f"p{i}", None, Pod.validated(f"p{i}", [f"10.0.{i % 256}.0/24"])) for i in range(2345)
    ]
    whole = pb.WriteResponse(generation=7)
    for c in changes:
        whole.changes.add(**change_fields(c))
    assert len(changes) > 2 * api.ENCODED_CHANGES
    assert pb.WriteResponse.FromString(api._written(changes, 7)) == whole
    assert api._written(changes, 7) == whole.SerializeToString()
    assert api._written([], 3) == pb.WriteResponse(generation=3).SerializeToString()


async def test_polling_the_whole_fleets_status_takes_a_bounded_share_of_the_loop(
    plane: tuple[ControlPlane, LimiterClient, list[float]],
) -> None:
    # Four clients ask for every DPU's row back to back: the rows are made at most a tenth of the time
    # (api.WHOLE_STATUS_SHARE), one make allowed over; a write is seen by the next call all the same.
    cp, c, _ = plane
    reply = await c.stub.Apply(fleet(PODS, f"127.0.0.1:{free_port()}"))
    making: list[float] = []
    rows = cp.service.status

    def timed(*args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        try:
            return rows(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            making.append(time.perf_counter() - t0)

    cp.service.status = timed  # type: ignore[method-assign,assignment]
    answers = 0

    async def poll(until: float) -> None:
        nonlocal answers
        while time.monotonic() < until:
            status = await c.status()
            assert len(status.dpus) == 2 * PODS and status.generation >= reply.generation
            answers += 1

    start = time.monotonic()
    await asyncio.gather(*(poll(start + 3.0) for _ in range(4)))
    elapsed = time.monotonic() - start
    chunks = -(-2 * PODS // api.ON_LOOP_ROWS)  # the calls of service.status that make one answer
    one = max(sum(making[i : i + chunks]) for i in range(0, len(making), chunks))
    assert sum(making) <= api.WHOLE_STATUS_SHARE * elapsed + one, (sum(making), elapsed, len(making) // chunks)
    assert answers > len(making) // chunks
    cp.service.status = rows  # type: ignore[method-assign]
    await c.stub.Delete(pb.DeleteRequest(dpus=["dpu-000001"]))
    status = await c.status()
    assert status.generation > reply.generation and len(status.dpus) == 2 * PODS - 1


async def test_overlaps_are_found_at_scale(plane: tuple[ControlPlane, LimiterClient, list[float]]) -> None:
    _, c, _ = plane
    req = fleet(PODS, f"127.0.0.1:{free_port()}")
    await c.stub.Apply(req)

    async def refused(r: pb.ApplyRequest, field: str, value: str, other: str) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.stub.Apply(r)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(f"{field}: overlaps ") and f"of pod {other!r}" in err.value.details()
        assert f"(got {value!r})" in err.value.details()

    # The last pod moved inside the first one's /24 (nested), in the whole file: what changed is named
    # (the rest of the file is as stored, checked when it was written).
    last = req.pods[PODS - 1]
    del last.ipv4_prefixes[:]
    last.ipv4_prefixes.append("10.0.0.128/25")
    await refused(req, f"pods[{PODS - 1}].ipv4_prefixes", "10.0.0.128/25", "pod-00000")
    # ... and alone: against the stored pods.
    alone = pb.ApplyRequest(pods=[last])
    await refused(alone, "pods[0].ipv4_prefixes", "10.0.0.128/25", "pod-00000")
    # A new pod holding many pods' prefixes, and one holding a single address inside one of them.
    wide = pb.ApplyRequest(pods=[pb.Pod(name="wide", ipv4_prefixes=["10.7.0.0/16", "192.168.0.0/24"])])
    await refused(wide, "pods[0].ipv4_prefixes", "10.7.0.0/16", "pod-01792")
    host = pb.ApplyRequest(pods=[pb.Pod(name="host", ipv4_prefixes=["192.168.0.0/24", f"10.3.{232}.77/32"])])
    await refused(host, "pods[0].ipv4_prefixes", "10.3.232.77/32", f"pod-{3 * 256 + 232:05d}")
    # Two new pods of one write that overlap each other (and nothing stored): the first is named.
    pair = pb.ApplyRequest(
        pods=[pb.Pod(name="x", ipv4_prefixes=["172.16.0.0/12"]), pb.Pod(name="y", ipv4_prefixes=["172.20.1.0/24"])]
    )
    await refused(pair, "pods[0].ipv4_prefixes", "172.16.0.0/12", "y")
    # Nothing was stored by any of them; a pod in free space is.
    assert (await c.stub.Apply(pb.ApplyRequest(pods=[pb.Pod(name="free", ipv4_prefixes=["10.200.0.0/16"])]))).changes
    assert len((await c.stub.ListPods(pb.ListPodsRequest())).pods) == PODS + 1


def brute_force(pods: list[Pod]) -> set[str]:
    """The pods with a prefix overlapping another pod's, pair by pair."""
    nets = [(p.name, ipaddress.IPv4Network(q)) for p in pods for q in p.ipv4_prefixes]
    return {a for a, n in nets for b, m in nets if a != b and n.overlaps(m)}


@pytest.mark.parametrize("seed", range(20))
def test_the_sweep_finds_what_comparing_every_pair_finds(seed: int) -> None:
    # Random prefixes of every length in a small space, so that many nest, touch or coincide.
    rng = random.Random(seed)
    pods = []
    for i in range(rng.randint(2, 60)):
        prefixes = set()
        for _ in range(rng.randint(1, 4)):
            length = rng.randint(20, 32)
            addr = (10 << 24) | rng.getrandbits(12) << 8 | rng.getrandbits(8)
            prefixes.add(str(ipaddress.IPv4Network((addr, length), strict=False)))
        try:
            pods.append(Pod.validated(f"p{i}", sorted(prefixes)))
        except InvalidArgument:  # a pod's own prefixes that overlap each other
            continue
    clashing = brute_force(pods)
    st = DesiredState(pods={p.name: p for p in pods})
    for k, pod in enumerate(pods):
        written = [(f"pods[{k}]", pod)]
        if pod.name in clashing:
            with pytest.raises(InvalidArgument) as err:
                planning.check_prefixes(st, written)
            p, q, other = err.value.value, *err.value.reason.split(" of pod ")
            assert p in pod.ipv4_prefixes and other.strip("'") != pod.name
            assert ipaddress.IPv4Network(p).overlaps(ipaddress.IPv4Network(q.removeprefix("overlaps ")))
        else:
            planning.check_prefixes(st, written)


async def test_status_pages_follow_the_fleet_as_it_changes(
    plane: tuple[ControlPlane, LimiterClient, list[float]],
) -> None:
    # The names are sorted once per set of agents: a write that takes one DPU and adds another (as many
    # as before) is listed as it leaves the fleet, page by page, as the whole fleet is.
    _, c, _ = plane
    req = fleet(3, f"127.0.0.1:{free_port()}")
    await c.stub.Apply(req)
    before = [d.name for d in (await c.status()).dpus]
    assert before == sorted(d.name for d in req.dpus)
    await c.stub.Delete(pb.DeleteRequest(dpus=["dpu-000001"]))
    moved = pb.Dpu()
    moved.CopyFrom(req.dpus[1])
    moved.name, moved.device_id, moved.node_mac = "dpu-000009", 99, "02:00:00:00:00:99"
    await c.stub.Apply(pb.ApplyRequest(dpus=[moved]))
    after = sorted({*before, "dpu-000009"} - {"dpu-000001"})
    assert [d.name for d in (await c.status()).dpus] == after
    paged, token = [], ""
    while True:
        page = await c.stub.GetStatus(pb.GetStatusRequest(page_size=4, page_token=token))
        paged += [d.name for d in page.dpus]
        if not (token := page.next_page_token):
            break
    assert paged == after
