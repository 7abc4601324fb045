"""The control plane programs a real embedded target over P4Runtime and keeps it converged."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from finsy.proto import p4r

from dpu_limiter.client import LimiterClient
from dpu_limiter.reconciler import DriftError
from dpu_limiter.server import ControlPlane
from dpu_softswitch.firmware import LocalFirmware
from helpers.p4rt import LONG_LEASE_US, connect, lease_entry, lease_left_us, schema, table_entry
from helpers.planes import programmed_target, register
from helpers.processes import free_port, start_embedded

pytestmark = pytest.mark.timeout(120)


class TargetProc:
    """An embedded target process that can be killed and restarted on the same port."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = start_embedded(self.port, self.log)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def target(tmp_path: Path) -> Iterator[TargetProc]:
    t = TargetProc(tmp_path / "target.log")
    t.start()
    try:
        yield t
    finally:
        t.kill()


async def _entries(channel: grpc.aio.Channel) -> list[p4r.Entity]:
    c = await connect(channel, 3)
    await c.responses.get()
    return await c.read(p4r.Entity(table_entry=p4r.TableEntry()))


async def _eventually_entries(addr: str, count: int, timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        try:
            async with grpc.aio.insecure_channel(addr) as channel:
                if len(await _entries(channel)) == count:
                    return True
        except grpc.aio.AioRpcError:
            pass  # no pipeline yet, or the target still starting
        await asyncio.sleep(0.2)
    return False


async def test_programs_restores_and_keeps_primacy(db: str, target: TargetProc) -> None:
    from finsy import P4MeterEntry, P4Schema

    from helpers.paths import BMV2_JSON, P4INFO

    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    addr = f"127.0.0.1:{target.port}"
    try:
        async with LimiterClient(plane.address) as c:
            await c.apply_pod("a", ["10.0.1.0/24", "10.0.3.0/24"])
            await register(c, "dpu-a", addr)
            await c.set_pod_cap("a", 20e6, 10e6, 10.0, 50_000)
            await c.wait_converged(timeout=30)
            async with grpc.aio.insecure_channel(addr) as channel:
                entries = await _entries(channel)
                assert len(entries) == 2 + 2 * 2  # two crossings, two prefixes in each of two tables
                sch = P4Schema(P4INFO, BMV2_JSON)
                probe = await connect(channel, 4)
                await probe.responses.get()
                meters = await probe.read(P4MeterEntry("LimiterIngress.boundary_meter", index=1).encode(sch))
                cfg = meters[0].meter_entry.config
                # The cap less ARP's own allowance (1000 B/s, a 600-byte bucket).
                assert (cfg.cir, cfg.cburst, cfg.pir, cfg.pburst) == (1_249_000, 49_400, 1_249_000, 49_400)
                # The operator's controller (a lower election id) is a backup: it cannot write.
                rogue = table_entry(
                    sch,
                    "LimiterIngress.boundary",
                    "LimiterIngress.cross",
                    {"standard_metadata.ingress_port": 5},
                    {"port": 1, "cell": 0, "inside": 1},
                )
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await probe.write(p4r.Update(type=p4r.Update.INSERT, entity=rogue))
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

            # The DPU restarts with nothing: the control plane puts pipeline, entries and meters back.
            target.kill()
            target.start()
            # Right after the restart the control plane may not have noticed yet (converged is old news):
            # wait for what a user would look for, the entries back on the DPU.
            assert await _eventually_entries(addr, 6, timeout=60)

            # A cap change is pushed; an exemption prefix removed from the pod disappears from the DPU.
            await c.apply_pod("a", ["10.0.1.0/24"])
            await c.set_pod_cap("a", 40e6, 40e6, 10.0, 50_000)
            await c.wait_converged(timeout=30)
            async with grpc.aio.insecure_channel(addr) as channel:
                assert len(await _entries(channel)) == 4
            usage = await c.usage("a")
            assert {(u.pod, u.direction) for u in usage.usage} == {("a", "egress"), ("a", "ingress")}
            assert all(u.metered_bytes == 0 for u in usage.usage)
    finally:
        await plane.stop()


@pytest.mark.parametrize("renewed", [False, True])
async def test_drift_is_corrected_and_reported(db: str, renewed: bool) -> None:
    """Also when a lease renewal (our own change) comes before the read-back that finds it."""
    async with programmed_target(db, (20e6, 20e6, 10.0, 50_000)) as (device, plane, c):
        assert (await c.status()).dpus[0].drift_corrections == 0
        # Someone changes the DPU behind the control plane's back: a crossing and a meter.
        assert device.pipeline is not None
        table = device.pipeline.program.tables["LimiterIngress.boundary"].table
        table.remove(next(iter(table.entries.values())).match, 0)
        device.pipeline.program.meters["LimiterIngress.boundary_meter"].set_p4runtime_config(
            0, 10**9, 10**9, 10**9, 10**9
        )
        agent = plane.service.agents["dpu-a"]
        ticket = plane.service.renew_leases()["dpu-a"] if renewed else agent.poke()  # or the periodic resync
        assert await agent.wait_applied(ticket, timeout=30)
        st = (await c.status()).dpus[0]
        assert st.drift_corrections == 1
        assert "1 crossings restored" in st.last_drift and "1 meter cells rewritten" in st.last_drift
        assert "leases" not in st.last_drift  # the renewal is ours
        assert len(table.entries) == 2
        cfg = device.pipeline.program.meters["LimiterIngress.boundary_meter"].get_p4runtime_config(0)
        assert cfg == (2_499_000, 49_400, 2_499_000, 49_400)


async def test_drift_under_a_lease_is_a_loss_the_lease_held_back(db: str) -> None:
    """Someone raises a meter of a leased DPU: since the last read-back it may have passed anything, so the
    correction also holds the lease back as after a reset (here the bucket's fill time, 2 MB at 1 MB/s)."""
    async with programmed_target(db, (8e6, 8e6, 10.0, 2_000_000)) as (device, plane, _c):
        agent = plane.service.agents["dpu-a"]
        assert lease_left_us(device) > 0
        assert device.pipeline is not None
        meter = device.pipeline.program.meters["LimiterIngress.boundary_meter"]
        ours = meter.get_p4runtime_config(0)
        meter.set_p4runtime_config(0, 10**9, 10**9, 10**9, 10**9)
        found = time.monotonic()
        assert await agent.wait_applied(agent.poke(), 30)
        assert meter.get_p4runtime_config(0) == ours
        assert agent.status.drift_corrections == 1 and "1 meter cells rewritten" in agent.status.last_drift
        assert lease_left_us(device) <= 0  # no lease, the floor: as if it had spent its bucket as it was found
        # The hold ends by itself (no renewal due for 10 s): a lease again once the bucket has had time to fill.
        while lease_left_us(device) <= 0:
            assert time.monotonic() - found < 15, "no lease after the hold"
            await asyncio.sleep(0.05)
        assert time.monotonic() - found >= 2.0


async def test_a_lease_forged_during_the_hold_holds_it_again(db: str) -> None:
    """The hold after drift is a lease withheld, which whoever wrote the drift can write back: found at the next
    read-back, that is drift too, and the hold starts again from there."""
    async with programmed_target(db, (8e6, 8e6, 10.0, 2_000_000)) as (device, plane, _c):
        agent = plane.service.agents["dpu-a"]
        assert device.pipeline is not None
        meter = device.pipeline.program.meters["LimiterIngress.boundary_meter"]
        meter.set_p4runtime_config(0, 10**9, 10**9, 10**9, 10**9)
        assert await agent.wait_applied(agent.poke(), 30)
        assert lease_left_us(device) <= 0
        await asyncio.sleep(1.0)  # halfway through the hold (2 MB at 1 MB/s)
        forged = time.monotonic()
        device.pipeline.write(p4r.Update(type=p4r.Update.MODIFY, entity=lease_entry(schema(), 1, LONG_LEASE_US)))
        assert await agent.wait_applied(agent.poke(), 30)
        assert agent.status.drift_corrections == 2 and "1 leases written" in agent.status.last_drift
        assert lease_left_us(device) <= 0
        while lease_left_us(device) <= 0:
            assert time.monotonic() - forged < 15, "no lease after the hold"
            await asyncio.sleep(0.05)
        assert time.monotonic() - forged >= 2.0


async def test_a_pass_that_failed_half_written_is_not_drift_to_the_next(db: str) -> None:
    """A cap change written but never read back (read-backs fail), then changed back: the DPU holds the
    change's meters, which neither the last confirmed intent nor the new one names. Ours, not drift: no hold."""
    async with programmed_target(db, (8e6, 8e6, 10.0, 2_000_000)) as (device, plane, c):
        agent = plane.service.agents["dpu-a"]
        assert device.pipeline is not None
        meter = device.pipeline.program.meters["LimiterIngress.boundary_meter"]
        before, meters = meter.get_p4runtime_config(0), agent.intent_fn()[1].meters
        read_back, reverted = agent._read_back, asyncio.Event()

        async def failing(sw: Any, codec: Any) -> Any:
            if not reverted.is_set():
                raise DriftError("dpu-a: read-back lost")
            return await read_back(sw, codec)

        agent._read_back = failing  # type: ignore[method-assign]
        await c.set_pod_cap("a", 16e6, 16e6, 10.0, 2_000_000)
        while meter.get_p4runtime_config(0) == before:  # written, never read back
            await asyncio.sleep(0.01)
        await c.set_pod_cap("a", 8e6, 8e6, 10.0, 2_000_000)
        while agent.intent_fn()[1].meters != meters:  # the share back where it was confirmed
            await asyncio.sleep(0.01)
        reverted.set()
        assert await agent.wait_applied(agent.poke(), 30)
        assert meter.get_p4runtime_config(0) == before
        assert agent.status.drift_corrections == 0, agent.status.last_drift
        assert lease_left_us(device) > 0


async def test_another_program_with_the_same_tables_is_found_by_its_hash(db: str) -> None:
    async with programmed_target(db, (20e6, 20e6, 10.0, 50_000)) as (device, plane, c):
        agent = plane.service.agents["dpu-a"]
        agent.resync_s = agent.pipeline_check_s = 0.2
        ours = device.pipeline
        assert ours is not None
        # Firmware loads another program with the very same tables (here: one more byte of JSON), so
        # every read still works; only the hash of what the DPU runs tells it apart.
        other = p4r.ForwardingPipelineConfig(p4_device_config=ours.device_config + b" ")
        other.p4info.CopyFrom(ours.p4info)
        other.cookie.cookie = ours.cookie
        LocalFirmware(device).load(other, forge=False)
        async with asyncio.timeout(30):
            while "pipeline reinstalled" not in (status := await c.status()).dpus[0].last_drift:
                await asyncio.sleep(0.1)
        # GetStatus shows, for a verifier, the hash each DPU's pipeline was last read back with (the drift
        # names the other program's, which a read-back after the reinstall may already have replaced with
        # ours), the one the control plane installs, and the change log's head (`audit verify --anchor`).
        found = re.search(r"another pipeline loaded \(sha256 ([0-9a-f]{16})\.\.\.\)", status.dpus[0].last_drift)
        assert found and not status.expected_pipeline_sha256.startswith(found[1]), status.dpus[0].last_drift
        shown = status.dpus[0].pipeline_sha256  # the other program's as found, or ours read back since
        assert shown == status.expected_pipeline_sha256 or shown.startswith(found[1])
        async with asyncio.timeout(30):
            while (await c.status()).dpus[0].pipeline_sha256 != status.expected_pipeline_sha256:
                await asyncio.sleep(0.1)  # read back again after the reinstall
        records = plane.service.store.audit_records()
        assert (status.change_log_seq, status.change_log_hash) == (records[-1].seq, records[-1].hash)
        assert await agent.wait_applied(agent.poke(), timeout=30)
        assert device.pipeline is not None and device.pipeline.device_config == ours.device_config
