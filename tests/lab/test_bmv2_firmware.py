"""Compromised firmware on bmv2 (dpu_lab.bmv2_firmware): simple_switch_grpc's Thrift API beside P4Runtime.

A simple_switch_grpc with no ports, programmed over P4Runtime as the control plane would; the firmware
then tampers through Thrift, and P4Runtime shows what a controller would see afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from finsy.proto import p4r

from dpu_lab.bmv2_firmware import Bmv2Firmware
from dpu_lab.compromise import compromise
from dpu_lab.targets import TargetProcess, start_target
from dpu_limiter import dataplane as dp
from helpers.bmv2 import bmv2_switch, thrift_firmware_missing
from helpers.p4rt import A_HOST, B_HOST, connect, program_limiter, table_entry, udp, update

pytestmark = [pytest.mark.bmv2, pytest.mark.timeout(120)]


@pytest.fixture
def bmv2(tmp_path: Path) -> Iterator[TargetProcess]:
    """simple_switch_grpc with no ports and no program, with its Thrift port."""
    if reason := thrift_firmware_missing():
        pytest.skip(reason)
    tp = start_target("dpu", "bmv2", 1, {}, tmp_path)
    try:
        yield tp
    finally:
        tp.stop()


def meter_reads(sch: object) -> list[p4r.Entity]:
    """limiter.p4's two meter cells (egress, ingress)."""
    from finsy import P4MeterEntry, P4Schema

    assert isinstance(sch, P4Schema)
    return [P4MeterEntry(dp.METER, index=cell).encode(sch) for cell in dp.CELLS.values()]


async def test_tampering_goes_through_thrift_and_p4runtime_sees_it(bmv2: TargetProcess) -> None:
    async with grpc.aio.insecure_channel(bmv2.address) as channel:
        c = await connect(channel, 1)
        await c.responses.get()  # arbitration done: primary
        sch = await program_limiter(c, 1_000_000, 100_000)
        window = {"budget": 10**6, "mult": 1}
        budgets = [table_entry(sch, dp.TABLE_WINDOW, dp.ACTION_WINDOW, {dp.FIELD_CELL: k}, window) for k in (0, 1)]
        await c.write(*(update(p4r.Update.INSERT, e) for e in budgets))
        fw = bmv2.management()

        with pytest.raises(ValueError, match="forge: bmv2's P4Runtime server reads the very tables"):
            await asyncio.to_thread(compromise, fw, "raise-meter", True)
        bad = update(p4r.Update.MODIFY, p4r.Entity(register_entry=p4r.RegisterEntry(register_id=1)))
        with pytest.raises(ValueError, match="updates: MODIFY of a register_entry"):
            await asyncio.to_thread(fw.write, [bad], False)

        # raise-meter: P4Runtime reads back the open meter, as PI converts it (bytes/us x 10^6).
        await asyncio.to_thread(compromise, fw, "raise-meter")
        opened = [e.meter_entry.config for e in await c.read(*meter_reads(sch))]
        assert [(m.cir, m.cburst) for m in opened] == [(dp.OPEN_METER.cir, dp.OPEN_METER.cburst)] * 2

        # delete-meter: Thrift cannot unconfigure a cell, so it opens it (module docstring); the window
        # budgets go, and PI, which still records them, refuses to insert them again.
        await c.write(*(update(p4r.Update.MODIFY, e) for e in await c.read(*meter_reads(sch))))
        await asyncio.to_thread(compromise, fw, "delete-meter")
        assert [e.meter_entry.config.cir for e in await c.read(*meter_reads(sch))] == [dp.OPEN_METER.cir] * 2
        windows = p4r.Entity(table_entry=p4r.TableEntry(table_id=sch.tables[dp.TABLE_WINDOW].id))  # type: ignore[attr-defined]
        assert await c.read(windows) == []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await c.write(update(p4r.Update.INSERT, budgets[0]))
        assert refused.value.code() == grpc.StatusCode.UNKNOWN  # one update failed: ALREADY_EXISTS

        # forward-unclassified: the /0 entries the firmware adds put PI's view out of sync with bmv2.
        await asyncio.to_thread(compromise, fw, "forward-unclassified")
        src = p4r.Entity(table_entry=p4r.TableEntry(table_id=sch.tables[dp.TABLE_SRC_IN_POD].id))  # type: ignore[attr-defined]
        with pytest.raises(grpc.aio.AioRpcError, match="out-of-sync"):
            await c.read(src)

        # load-pipeline: bmv2 forwards with passthrough.p4; P4Runtime still shows the limiter's P4Info.
        await asyncio.to_thread(compromise, fw, "load-pipeline")
        assert (await asyncio.to_thread(fw.p4info)).pkg_info == sch.p4info.pkg_info  # type: ignore[attr-defined]
        with pytest.raises(grpc.aio.AioRpcError):
            await c.read(*meter_reads(sch))


@pytest.mark.netns
@pytest.mark.parametrize("how", ["raise-meter", "delete-meter", "forward-unclassified", "load-pipeline"])
async def test_tampering_through_thrift_passes_what_the_cap_drops(how: str) -> None:
    frame = udp(A_HOST, B_HOST, 1000)  # pod a's host (port 0) to pod b, out of the uplink (port 1)
    if reason := thrift_firmware_missing():
        pytest.skip(reason)
    with bmv2_switch([0, 1]) as sw:
        assert sw.thrift_port is not None
        async with grpc.aio.insecure_channel(sw.address) as channel:
            c = await connect(channel, 1)
            await c.responses.get()
            await program_limiter(c, rate_bytes_s=1, burst=3000)  # two of these frames, then nothing

            def passed(n: int) -> int:
                return sum(1 for _ in range(n) for port, _ in sw.send(0, frame, wait=0.1) if port == 1)

            assert await asyncio.to_thread(passed, 5) == 2
            # A forward-unclassified DPU also makes the frame's receiver (udp()'s destination MAC) a pod peer,
            # and takes the first of the MACs, the sender's (udp()'s source), as the node's own.
            fw = Bmv2Firmware(sw.thrift_port, sw.address, 1)
            await asyncio.to_thread(compromise, fw, how, False, ("02:00:00:00:00:01", "02:00:00:00:00:02"))
            assert await asyncio.to_thread(passed, 5) == 5
