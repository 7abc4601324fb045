"""Usage telemetry: the WatchUsage stream and the Prometheus endpoint, from a DPU's real counters."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import grpc
import pytest

from dpu_limiter.client import LimiterClient
from dpu_limiter.server import ControlPlane
from helpers.p4rt import A_HOST, B_HOST, udp
from helpers.planes import node_pod, register, serve_in_process
from helpers.processes import cli

pytestmark = pytest.mark.timeout(60)


async def _limited_pod(db: str, address: str) -> ControlPlane:
    plane = ControlPlane(db, "127.0.0.1:0", metrics_listen="127.0.0.1:0", metrics_interval_s=0.2)
    await plane.start()
    async with LimiterClient(plane.address) as c:
        await c.apply_pod("a", ["10.0.1.0/24"])
        await register(c, "dpu-a", address)
        # 2000 B/s and a 3600-byte bucket: the data meter gets 1000 B/s and 3000 bytes, ARP the rest.
        await c.set_pod_cap("a", 8 * 2000, 8 * 2000, 1.0, 3600)
        await c.wait_converged(timeout=30)
    return plane


async def test_watch_usage_and_metrics(db: str) -> None:
    device, server, address = await serve_in_process()
    plane = await _limited_pod(db, address)
    try:
        async with LimiterClient(plane.address) as c:
            stream = c.watch_usage("a", 0.2)
            first = await anext(stream)
            assert {(u.pod, u.direction) for u in first.usage} == {("a", "egress"), ("a", "ingress")}
            frame = udp(A_HOST, B_HOST, 958)  # 1000 bytes on the wire
            passed = sum(len(device.process(0, frame)) for _ in range(5))
            assert passed == 3  # the 3000-byte bucket
            while True:
                sample = await anext(stream)
                egress = next(u for u in sample.usage if u.direction == "egress")
                if egress.metered_bytes == 5000:
                    break
            assert (egress.green_bytes, egress.red_bytes, egress.red_packets) == (3000, 2000, 2)
            await stream.aclose()

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await anext(c.watch_usage("a", 0.01))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "interval_s" in (err.value.details() or "")

        assert plane.metrics is not None
        url = f"http://127.0.0.1:{plane.metrics.port}/metrics"
        for _ in range(50):
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
            if 'kind="red",pod="a"} 2000.0' in text:
                break
            await asyncio.sleep(0.1)
        assert 'dpu_limiter_boundary_bytes_total{direction="egress",kind="red",pod="a"} 2000.0' in text
        assert 'dpu_limiter_dpu_converged{dpu="dpu-a"} 1.0' in text
    finally:
        await plane.stop()
        await server.stop(grace=0)


async def test_usage_watch_cli_prints_rates(db: str) -> None:
    import json
    import sys

    device, server, address = await serve_in_process()
    plane = await _limited_pod(db, address)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dpu_limiter.cli",
        "usage",
        "--watch",
        "--json",
        "--interval",
        "0.2",
        "--server",
        plane.address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        for _ in range(3):
            device.process(0, udp(A_HOST, B_HOST, 958))
        for _ in range(50):
            doc = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
            egress = next(r for r in doc["rates_bps"] if r["direction"] == "egress")
            if egress["metered_bytes"] > 0:
                break
        assert egress["green_bytes"] > 0  # 3000 bytes in one interval: a positive rate in bit/s
    finally:
        proc.terminate()
        await proc.wait()
        await plane.stop()
        await server.stop(grace=0)


async def test_usage_per_dpu_beside_the_pods_totals(db: str) -> None:
    served = [await serve_in_process() for _ in range(2)]
    plane = ControlPlane(db, "127.0.0.1:0", metrics_listen="127.0.0.1:0", metrics_interval_s=0.2)
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            await node_pod(c, [addr for _, _, addr in served], "node-")
            await c.set_pod_cap("a", 80e6, 80e6, 1.0, 100_000)
            await c.wait_converged(timeout=30)
            frame = udp(A_HOST, B_HOST, 958)  # 1000 bytes on the wire, out of node-0 only
            for _ in range(4):
                assert served[0][0].process(0, frame)
            rows = {(u.dpu, u.direction): u for u in (await c.usage("a", per_dpu=True)).usage}
            assert set(rows) == {(d, k) for d in ("", "node-0", "node-1") for k in ("egress", "ingress")}
            assert rows[("node-0", "egress")].metered_bytes == 4000 and rows[("node-1", "egress")].metered_bytes == 0
            assert rows[("", "egress")].metered_bytes == 4000 and all(u.pod == "a" for u in rows.values())
            assert {u.dpu for u in (await c.usage("a")).usage} == {""}  # totals only, unless asked

            res = await asyncio.to_thread(cli, "usage", "--per-dpu", "--json", "--server", plane.address)
            assert res.returncode == 0, res.stderr
            by_dpu = {(u.get("dpu", ""), u["direction"]): u for u in json.loads(res.stdout)["usage"]}
            assert by_dpu[("node-0", "egress")]["metered_bytes"] == "4000"  # uint64 in JSON: a string
        assert plane.metrics is not None
        url = f"http://127.0.0.1:{plane.metrics.port}/metrics"
        want = 'dpu_limiter_dpu_bytes_total{direction="egress",dpu="node-0",kind="metered",pod="a"} 4000.0'
        for _ in range(50):
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
            if want in text:
                break
            await asyncio.sleep(0.1)
        assert want in text and 'dpu_limiter_dpu_lease_held{dpu="node-1"} 1.0' in text
    finally:
        await plane.stop()
        for _, server, _ in served:
            await server.stop(grace=0)
