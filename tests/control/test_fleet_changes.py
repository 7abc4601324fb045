"""Changing and removing DPUs of a running fleet: a DPU changed in place is programmed at its new
address and let go at its old one; a deleted DPU is let go (its lease then lapses on its own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from finsy.proto import p4r, p4r_grpc

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.reconciler import ELECTION_ID
from dpu_limiter.store import is_url
from dpu_softswitch.server import Device, P4RuntimeService
from helpers.planes import plane_with_pod, register, serve_in_process
from helpers.processes import cli, free_port

pytestmark = pytest.mark.timeout(120)


def controllers(device: Device) -> int:
    """How many controller streams the target holds open."""
    return sum(len(s.streams) for s in device.listeners if isinstance(s, P4RuntimeService))


async def until(check: object, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_dpu_changed_in_place_then_deleted(db: str) -> None:
    (old, old_server, old_addr), (new, new_server, new_addr) = await serve_in_process(), await serve_in_process()
    try:
        async with plane_with_pod(db) as (plane, c):
            await register(c, "dpu-a", old_addr)
            await c.set_pod_cap("a", 1e9, 1e9, 60.0)
            await c.wait_converged(timeout=30)
            assert old.pipeline is not None and controllers(old) == 1
            dpu = (await c.stub.ListDpus(pb.ListDpusRequest())).dpus[0]
            dpu.p4runtime_address = new_addr
            written = await c.stub.Apply(pb.ApplyRequest(dpus=[dpu]))
            assert [(ch.verb, ch.kind, ch.name) for ch in written.changes] == [("update", "dpu", "dpu-a")]
            assert old_addr in written.changes[0].before and new_addr in written.changes[0].after
            await c.wait_converged(timeout=30)
            assert new.pipeline is not None and controllers(new) == 1
            await until(lambda: controllers(old) == 0)
            written = await c.stub.Delete(pb.DeleteRequest(dpus=["dpu-a"]))
            assert [(ch.verb, ch.name) for ch in written.changes] == [("delete", "dpu-a")]
            await until(lambda: controllers(new) == 0)
            assert not (await c.status()).dpus and "dpu-a" not in plane.service.agents
            # The pod and its cap stay; a DPU registered again under the old name is programmed afresh.
            await register(c, "dpu-a", old_addr)
            await c.wait_converged(timeout=30)
            assert controllers(old) == 1
    finally:
        await old_server.stop(grace=0)
        await new_server.stop(grace=0)


async def test_an_old_connection_still_held_does_not_cost_the_election_id(db: str) -> None:
    """The target may still hold the control plane's previous stream (it has not yet seen it close)
    when the agent connects again: the agent waits for it to go and keeps the highest election id,
    instead of bidding lower and serving as a backup (or under an id another controller could top)."""
    device, server, addr = await serve_in_process()
    stale_open, release = asyncio.Event(), asyncio.Event()

    async def stale_requests() -> AsyncIterator[p4r.StreamMessageRequest]:
        arb = p4r.MasterArbitrationUpdate(device_id=1, election_id=p4r.Uint128(high=0, low=ELECTION_ID))
        yield p4r.StreamMessageRequest(arbitration=arb)
        await release.wait()

    async def stale() -> None:
        async with grpc.aio.insecure_channel(addr) as channel:
            call = p4r_grpc.P4RuntimeStub(channel).StreamChannel(stale_requests())  # type: ignore[no-untyped-call]
            async for reply in call:
                assert reply.arbitration.status.code == 0  # primary, as our old connection was
                stale_open.set()
                await release.wait()
                call.cancel()
                return

    holder = asyncio.create_task(stale())
    await asyncio.wait_for(stale_open.wait(), 10)
    try:
        async with plane_with_pod(db) as (plane, c):
            await register(c, "dpu-a", addr)
            if is_url(db):
                # On PostgreSQL every replica that takes a DPU bids a fresh id from the database's sequence, above
                # every id bid before (replicas.py): it outbids the old stream at once instead.
                await c.wait_converged(timeout=30)
                assert plane.service.election_id > ELECTION_ID and plane.service.agents["dpu-a"].switch.is_primary
                release.set()
                await holder
                return
            await asyncio.sleep(1.5)  # the agent meets the old stream's election id in use
            assert not (await c.status()).dpus[0].converged
            release.set()
            await holder
            await c.wait_converged(timeout=30)
            (service,) = [s for s in device.listeners if isinstance(s, P4RuntimeService)]
            assert [s.election_id for s in service.streams] == [ELECTION_ID]
            assert plane.service.agents["dpu-a"].switch.is_primary
    finally:
        await server.stop(grace=0)


async def test_a_dpu_that_does_not_answer_says_so_in_status(db: str) -> None:
    async with plane_with_pod(db) as (_, c):
        closed = f"127.0.0.1:{free_port()}"
        await register(c, "dpu-a", closed)
        await asyncio.sleep(1.2)
        (st,) = (await c.status()).dpus
        assert not st.connected and st.last_error.startswith(f"no connection to {closed} for ")
        # Its counters are not taken for zeros: the pod's totals say one DPU is left out, its rows why.
        rows = (await c.usage("a", per_dpu=True)).usage
        assert {(u.dpu, u.dpus_unread) for u in rows} == {("", 1), ("dpu-a", 0)}
        assert all(u.error == f"ConnectionError: no connection to {closed}" for u in rows if u.dpu)
        out = (await asyncio.to_thread(cli, "usage", "--per-dpu", "--server", c.address)).stdout
        assert "1 DPU" in out and "no connection" in out


def meter(device: Device, cell: int = 0) -> tuple[int, int, int, int]:
    """The target's boundary meter cell as configured (P4Runtime units)."""
    assert device.pipeline is not None
    return tuple(device.pipeline.program.meters["LimiterIngress.boundary_meter"].get_p4runtime_config(cell))


async def test_a_departing_dpu_is_floored_before_the_others_grow(db: str) -> None:
    """Two node DPUs split pod a's cap. When one is deleted, the control plane floors it (and sees it
    floored) before the other is granted the whole cap: at no point do the two hold more than it."""
    (d0, s0, a0), (d1, s1, a1) = await serve_in_process(), await serve_in_process()
    try:
        async with plane_with_pod(db) as (_, c):
            await register(c, "n0", a0, node=True)
            await register(c, "n1", a1, node=True)
            await c.set_pod_cap("a", 80e6, 80e6, 10.0, 1_000_000)
            await c.wait_converged(timeout=30)
            half = meter(d0)
            assert meter(d1) == half and half[0] == 4_999_000  # 40 Mbit/s each, in bytes/s, less ARP's 1000
            seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
            watching = True

            async def watch() -> None:
                while watching:
                    seen.append((meter(d0), meter(d1)))
                    await asyncio.sleep(0.001)

            watcher = asyncio.create_task(watch())
            await c.stub.Delete(pb.DeleteRequest(dpus=["n1"]))
            assert meter(d1) == (0, 0, 0, 0)  # floored before Delete answered
            await c.wait_converged(timeout=30)
            await until(lambda: meter(d0)[0] == 9_999_000)
            watching = False
            await watcher
            assert all(m0[0] + m1[0] <= 10_000_000 for m0, m1 in seen), seen
    finally:
        await s0.stop(grace=0)
        await s1.stop(grace=0)
