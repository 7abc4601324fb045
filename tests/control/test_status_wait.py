"""GetStatus's wait (wait_s, wait_generation): one call that answers once a write is applied on every DPU the
control plane holds, in place of polling the whole fleet's rows (which cost a 1,000-DPU replica a tenth of its
loop while a cap change converged: bench/replica_scale.py).

Real parts: control planes on loopback over both stores, embedded P4Runtime targets in this process, and
for replicas a throwaway PostgreSQL cluster. Asserted: when the answer comes, the DPUs hold the write (read
from the target itself, not from our status); a wait that cannot end answers at its time as things stand;
bad values are refused naming the field.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Dpu, Role
from dpu_limiter.replicas import owner
from dpu_limiter.server import ControlPlane
from dpu_softswitch.server import Device
from helpers.planes import plane_with_pod, programmed_target, serve_in_process
from helpers.processes import free_port
from helpers.replica_fleet import settled_fleet

pytestmark = pytest.mark.timeout(120)


def egress_cir(device: Device) -> int | None:
    """The egress meter's committed rate (bytes/s) the target holds, read from the target itself."""
    assert device.pipeline is not None
    cfg = device.pipeline.program.meters["LimiterIngress.boundary_meter"].get_p4runtime_config(0)
    return None if cfg is None else int(cfg[0])


async def test_a_wait_answers_once_the_write_is_on_the_dpu(db: str) -> None:
    async with programmed_target(db, (4e6, 4e6, 10.0, 50_000)) as (device, _plane, c):
        for rate in (8e6, 2e6, 6e6):
            written = await c.apply(caps={"a": Cap(rate, rate, 10.0, 50_000)})
            st = await c.status(wait_s=30, wait_generation=written.generation)
            # The target holds the new meter as the answer arrives: the wait did not end on the old intent.
            assert egress_cir(device) == rate / 8 - 1000, (rate, egress_cir(device))  # less ARP's 1000 B/s
            (row,) = st.dpus
            assert row.converged and row.generation_applied >= written.generation, row
            assert (await c.wait_converged(timeout=30, generation=written.generation)).dpus[0].converged


async def test_a_wait_that_cannot_end_answers_at_its_time_as_things_stand(db: str) -> None:
    async with plane_with_pod(db) as (_plane, c):
        now = (await c.status()).generation
        t0 = time.monotonic()
        st = await c.status(wait_s=0.3, wait_generation=now + 5)  # no such generation yet
        assert time.monotonic() - t0 >= 0.3 and st.generation == now


@pytest.mark.parametrize(
    ("wait_s", "wait_generation", "field"),
    [
        (-1.0, 0, "wait_s"),
        (math.nan, 0, "wait_s"),
        (math.inf, 0, "wait_s"),
        (3601.0, 0, "wait_s"),
        (0.0, 3, "wait_generation"),
    ],
)
async def test_a_wait_out_of_bounds_is_refused_naming_the_field(
    tmp_path: object, wait_s: float, wait_generation: int, field: str
) -> None:
    async with plane_with_pod(f"{tmp_path}/state.db") as (_plane, c):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.status(wait_s=wait_s, wait_generation=wait_generation)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(field), err.value.details()


async def test_a_wait_on_another_replica_waits_for_the_writers_generation(pg_url: str) -> None:
    ids = ["r1", "r2"]
    async with settled_fleet(pg_url, ids, 1, "r1") as (planes, dpus, pods):
        (theirs,) = [p for p in pods if owner(p, ids) == "r2"]
        target = dpus[f"dpu-{theirs}"]
        async with LimiterClient(planes["r1"].address) as c1, LimiterClient(planes["r2"].address) as c2:
            for rate in (4e6, 2e6):
                written = await c1.apply(caps={theirs: Cap(rate, rate, 10.0, 50_000)})  # through r1; r2 holds it
                st = await c2.status(held_here=True, wait_s=30, wait_generation=written.generation)
                assert egress_cir(target.device) == rate / 8 - 1000, (rate, egress_cir(target.device))
                assert st.generation >= written.generation
                assert [d.name for d in st.dpus] == [f"dpu-{theirs}"] and st.dpus[0].converged, st.dpus


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`dpu-limiter ARGS` in a process of its own (the control plane it talks to runs in this one's loop)."""
    command = [sys.executable, "-m", "dpu_limiter.cli", *args]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=90)


async def test_apply_wait_returns_once_the_dpus_hold_the_file_or_names_those_that_do_not(tmp_path: Path) -> None:
    device, server, addr = await serve_in_process()
    try:
        async with plane_with_pod(tmp_path / "state.db") as (plane, _c):
            fleet = tmp_path / "fleet.yaml"
            dpu = (
                f"{{name: dpu-a, p4runtime_address: '{addr}', device_id: 1, pod: a, role: pod-uplink, "
                "host_port: 0, uplink_port: 1}"
            )
            for rate in ("8M", "2M"):
                fleet.write_text(
                    f"pods: [{{name: a, ipv4_prefixes: [10.0.1.0/24]}}]\ndpus: [{dpu}]\n"
                    f"caps: [{{pod: a, egress: {rate}, ingress: {rate}, window_s: 10, burst_bytes: 50000}}]\n"
                )
                res = await cli("apply", "-f", str(fleet), "--wait", "60", "--server", plane.address)
                assert res.returncode == 0, res.stderr
                assert "every DPU applied generation" in res.stdout, res.stdout
                assert egress_cir(device) == float(rate[:-1]) * 1e6 / 8 - 1000  # on the target as the command ends
            # A DPU that cannot be reached: the write is stored, the wait ends at its time naming it.
            dead = dpu.replace(addr, f"127.0.0.1:{free_port()}").replace("dpu-a", "dpu-dead")
            fleet.write_text(f"pods: [{{name: a, ipv4_prefixes: [10.0.1.0/24]}}]\ndpus: [{dead}]\n")
            res = await cli("apply", "-f", str(fleet), "--wait", "1", "--server", plane.address)
            assert res.returncode == 1 and "dpu-dead" in res.stderr and "generation" in res.stderr, res.stderr
            assert "dpu-dead" in plane.service.state.dpus
    finally:
        await server.stop(grace=0)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "3601", "soon"])
async def test_apply_wait_out_of_bounds_is_refused_naming_the_flag(tmp_path: Path, value: str) -> None:
    (tmp_path / "f.yaml").write_text("pods: [{name: a, ipv4_prefixes: [10.0.1.0/24]}]\n")
    res = await cli("apply", "-f", str(tmp_path / "f.yaml"), "--wait", value, "--server", "127.0.0.1:1")
    assert res.returncode == 2 and "--wait" in res.stderr and value in res.stderr, res.stderr


async def test_a_wait_during_a_writes_follow_up_waits_for_the_write(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The state (and its generation) is set before the write's agents and shares are: a wait that came in
    # between found every DPU holding the old intent and answered it as the new one (a review found it).
    async with programmed_target(db, (4e6, 4e6, 10.0, 50_000)) as (device, plane, c):
        svc = plane.service
        follow = svc._followed

        async def slow_followed(*args: object) -> None:
            await asyncio.sleep(1.0)  # as a floor of a leaving DPU or a fleet's batches take the loop's turns
            await follow(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(svc, "_followed", slow_followed)
        write = asyncio.create_task(c.apply(caps={"a": Cap(8e6, 8e6, 10.0, 50_000)}))
        while svc.state.caps["a"].egress_bps != 8e6:  # stored, its follow-up not under way yet
            await asyncio.sleep(0.01)
        st = await c.status(wait_s=30)  # the current generation: the write's
        assert egress_cir(device) == 8e6 / 8 - 1000, egress_cir(device)
        assert st.dpus[0].converged
        await write


async def test_a_wait_outlives_a_share_pass_replaced_under_it(tmp_path: Path) -> None:
    # A pod's pass cancelled because a newer one took over (or the pod went) raised CancelledError into the
    # waiting GetStatus, which then never answered (a review found it).
    async with plane_with_pod(tmp_path / "state.db") as (plane, _c):
        svc = plane.service
        first = asyncio.create_task(asyncio.sleep(30))
        svc._resharing["a"] = first
        waiting = asyncio.create_task(svc.settle("a"))
        await asyncio.sleep(0.05)
        first.cancel()
        svc._resharing["a"] = asyncio.create_task(asyncio.sleep(0.2))  # the newer pass
        await asyncio.wait_for(waiting, 5)  # ends with the newer pass, raising nothing
        assert svc._resharing["a"].done()


async def test_a_wait_does_not_outwait_a_dpu_deleted_under_it(tmp_path: Path) -> None:
    # The agents were listed once: one stopped mid-wait (its DPU deleted, changed or moved to another replica)
    # never converged again, and the wait ran to its end (up to an hour) before answering (a review found it).
    async with plane_with_pod(tmp_path / "state.db") as (plane, c):
        dead = f"127.0.0.1:{free_port()}"
        await c.apply(dpus=[Dpu("dpu-dead", dead, 1, "a", Role.POD_UPLINK, 0, 1)])
        t0 = time.monotonic()
        waiting = asyncio.create_task(plane.service.wait_converged(20))
        await asyncio.sleep(0.3)
        await c.delete(dpus=["dpu-dead"])
        assert await waiting and time.monotonic() - t0 < 10, time.monotonic() - t0


class IdleCutter:
    """A TCP relay on loopback that drops a connection once no byte crossed it either way for `idle_s`, as
    proxies and NAT tables do."""

    def __init__(self, upstream_port: int, idle_s: float) -> None:
        self.upstream_port, self.idle_s = upstream_port, idle_s
        self.cut = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen; returns the port."""
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        self.server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _relay(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        loop = asyncio.get_running_loop()
        last = loop.time()

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal last
            while data := await r.read(65536):
                last = loop.time()
                w.write(data)
                await w.drain()

        pumps = [asyncio.create_task(pump(down_r, up_w)), asyncio.create_task(pump(up_r, down_w))]
        try:
            while not any(p.done() for p in pumps):
                await asyncio.sleep(0.05)
                if loop.time() - last > self.idle_s:
                    self.cut += 1
                    break
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (down_w, up_w):
                w.transport.abort()
            self._tasks.discard(task)


@pytest.mark.parametrize("keepalive_s", [0.2, 0.0], ids=["pinged", "not-pinged"])
async def test_a_long_wait_outlives_a_proxy_that_drops_idle_connections(tmp_path: Path, keepalive_s: float) -> None:
    # A wait sends nothing until it answers: without the server's pings, a relay with a 2 s idle timeout drops
    # the call (UNAVAILABLE); with them, it answers at its time.
    plane = ControlPlane(tmp_path / "state.db", "127.0.0.1:0", keepalive_s=keepalive_s)
    await plane.start()
    cutter = IdleCutter(plane.port, idle_s=2.0)
    port = await cutter.start()
    try:
        async with LimiterClient(f"127.0.0.1:{port}") as c:
            now = (await c.status()).generation
            if keepalive_s:
                st = await c.status(wait_s=5.0, wait_generation=now + 1)
                assert st.generation == now and cutter.cut == 0
            else:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.status(wait_s=5.0, wait_generation=now + 1)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE and cutter.cut == 1
    finally:
        await cutter.stop()
        await plane.stop()
