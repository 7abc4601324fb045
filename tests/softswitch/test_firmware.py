"""The embedded target's firmware socket (dpu_softswitch.firmware): the management path beside P4Runtime that
the lab's compromised DPUs use. Changes go to the pipeline P4Runtime sees, or with forge to a copy
only packets take; bad requests get their error back and change nothing."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from dpu_lab.compromise import compromise
from dpu_limiter import dataplane as dp
from dpu_softswitch.firmware import FirmwareClient, serve
from helpers.planes import programmed_target

pytestmark = pytest.mark.timeout(120)
METER = "LimiterIngress.boundary_meter"


async def test_firmware_tampers_with_or_lies_about_the_pipeline(tmp_path: Path) -> None:
    async with programmed_target(tmp_path / "state.db", (8e6, 8e6, 2.0, 100_000)) as (device, _, _):
        assert device.pipeline is not None
        honest = device.pipeline.program.meters[METER].get_p4runtime_config(dp.CELLS["egress"])
        with tempfile.TemporaryDirectory(prefix="p4fw-") as d:  # a Unix socket's path must stay short
            path = Path(d) / "socket"
            server = await serve(device, path)
            try:
                fw = FirmwareClient(path)
                assert (path.stat().st_mode & 0o777) == 0o600
                with pytest.raises(RuntimeError, match="op: unknown operation 'melt'"):
                    await asyncio.to_thread(fw._call, {"op": "melt"})
                # Forged: packets take a raised copy, P4Runtime still reads the honest meter.
                await asyncio.to_thread(compromise, fw, "raise-meter", True)
                assert device.data_plane is not None and device.data_plane is not device.pipeline
                assert device.pipeline.program.meters[METER].get_p4runtime_config(0) == honest
                raised = device.data_plane.program.meters[METER].get_p4runtime_config(0)
                assert raised is not None and honest is not None and raised[0] > honest[0]
                # Not forged: the pipeline P4Runtime reads is the one changed.
                await asyncio.to_thread(compromise, fw, "raise-meter", False)
                assert device.pipeline.program.meters[METER].get_p4runtime_config(0) == raised
            finally:
                server.close()
                await server.wait_closed()
