"""A small async client of the limiter.v1 API, used by the CLI and the lab (as any user's code would)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from ._proto.limiter.v1 import limiter_pb2 as pb
from ._proto.limiter.v1 import limiter_pb2_grpc as pb_grpc
from .tls import TlsFiles
from .units import GRPC_MESSAGE_OPTIONS


class LimiterClient:
    """Async client; use as `async with LimiterClient(address) as c:`."""

    def __init__(self, address: str, tls: TlsFiles | None = None) -> None:
        self.address = address
        if tls is None:
            self.channel = grpc.aio.insecure_channel(address, options=GRPC_MESSAGE_OPTIONS)
        else:
            ca, cert, key = tls.read()
            creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
            self.channel = grpc.aio.secure_channel(address, creds, options=GRPC_MESSAGE_OPTIONS)
        self.stub = pb_grpc.LimiterStub(self.channel)  # type: ignore[no-untyped-call]

    async def __aenter__(self) -> LimiterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    async def apply_pod(self, name: str, prefixes: list[str]) -> pb.Pod:
        """Create or replace a pod."""
        return await self.stub.ApplyPod(pb.ApplyPodRequest(pod=pb.Pod(name=name, ipv4_prefixes=prefixes)))

    async def register_dpu(self, dpu: pb.Dpu) -> pb.Dpu:
        """Register a DPU."""
        return await self.stub.RegisterDpu(pb.RegisterDpuRequest(dpu=dpu))

    async def set_pod_cap(
        self,
        pod: str,
        egress_bps: float,
        ingress_bps: float,
        window_s: float,
        burst_bytes: int = 0,
        rebalance: bool = False,
        mode: str = "rate",
    ) -> pb.PodCap:
        """Set a pod's cap (bit/s, seconds, bytes; rebalance: node shares follow demand)."""
        cap = pb.Cap(
            egress_bps=egress_bps,
            ingress_bps=ingress_bps,
            window_s=window_s,
            burst_bytes=burst_bytes,
            rebalance=rebalance,
            mode=pb.CAP_MODE_WINDOW if mode == "window" else pb.CAP_MODE_RATE,
        )
        return await self.stub.SetPodCap(pb.SetPodCapRequest(pod=pod, cap=cap))

    async def get_pod_cap(self, pod: str) -> pb.PodCap:
        """A pod's cap."""
        return await self.stub.GetPodCap(pb.GetPodCapRequest(pod=pod))

    async def usage(self, pod: str = "", per_dpu: bool = False) -> pb.GetUsageResponse:
        """Usage per pod and direction (and per DPU)."""
        return await self.stub.GetUsage(pb.GetUsageRequest(pod=pod, per_dpu=per_dpu))

    async def watch_usage(
        self, pod: str = "", interval_s: float = 1.0, per_dpu: bool = False
    ) -> AsyncIterator[pb.UsageSample]:
        """Usage samples every interval until cancelled."""
        request = pb.WatchUsageRequest(pod=pod, interval_s=interval_s, per_dpu=per_dpu)
        async for sample in self.stub.WatchUsage(request):
            yield sample

    async def status(self) -> pb.GetStatusResponse:
        """Reconciliation status of every DPU."""
        return await self.stub.GetStatus(pb.GetStatusRequest())

    async def wait_converged(self, timeout: float = 30.0) -> pb.GetStatusResponse:
        """Poll until every DPU applied the current generation; raise TimeoutError naming the laggards."""
        deadline = time.monotonic() + timeout
        while True:
            st = await self.status()
            lagging = [d for d in st.dpus if not d.converged or d.generation_applied < st.generation]
            if not lagging:
                return st
            if time.monotonic() > deadline:
                detail = ", ".join(f"{d.name} (connected={d.connected}, error={d.last_error!r})" for d in lagging)
                raise TimeoutError(f"DPUs not converged after {timeout:.0f} s: {detail}")
            await asyncio.sleep(0.1)
