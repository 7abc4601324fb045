"""A small async client of the limiter.v1 API, used by the CLI and the lab (as any user's code would).

One method per RPC. Pods, DPUs, caps and routers go in and come back as the control plane's own
models (models.py). What goes in is not checked here: the control plane checks it and answers bad
values with INVALID_ARGUMENT naming the field (grpc.aio.AioRpcError); what comes back goes through
convert.py as the server's own input does. Answers that have no model (status, usage, what a write
changed) are the API's messages, under the names below; `as_dict` gives any answer as the API's
JSON mapping names it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias, overload

import grpc
from google.protobuf import json_format

from ._proto.limiter.v1 import limiter_pb2 as pb
from ._proto.limiter.v1 import limiter_pb2_grpc as pb_grpc
from .convert import (
    cap_from_pb,
    cap_to_pb,
    dpu_from_pb,
    dpu_to_pb,
    pod_from_pb,
    pod_to_pb,
    router_from_pb,
    router_to_pb,
)
from .models import Cap, Dpu, Pod, Router
from .tls import TlsFiles
from .units import GRPC_MESSAGE_OPTIONS, MAX_STATUS_WAIT_S

Status: TypeAlias = pb.GetStatusResponse  # .generation; .dpus: DpuStatus (connected, converged, lease_state, ...)
Usage: TypeAlias = pb.GetUsageResponse  # .usage: DirectionUsage rows (pod, direction, dpu, byte counters)
UsageSample: TypeAlias = pb.UsageSample  # .time (control plane's clock) and .usage, from WatchUsage
DirectionUsage: TypeAlias = pb.DirectionUsage
Written: TypeAlias = pb.WriteResponse  # .changes (verb, kind, name, before and after in words), .generation


class PodCap(NamedTuple):
    """A pod's cap, as SetPodCap and GetPodCap answer."""

    pod: str
    cap: Cap


def as_dict(
    answer: Status | Usage | UsageSample | DirectionUsage | Written | PodCap, *, all_fields: bool = True
) -> dict[str, Any]:
    """An answer as the API's JSON mapping has it (proto field names; 64-bit integers as strings; with
    `all_fields`, zeros and empty values too): what the CLI prints with --json."""
    message = pb.PodCap(pod=answer.pod, cap=cap_to_pb(answer.cap)) if isinstance(answer, PodCap) else answer
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=all_fields
    )


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
        # The generated stub, for tests that send what no model can hold (damaged messages, any values).
        self.stub: Any = pb_grpc.LimiterStub(self.channel)  # type: ignore[no-untyped-call]

    async def __aenter__(self) -> LimiterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    async def apply_pod(self, pod: Pod | str, prefixes: Sequence[str] = ()) -> Pod:
        """Create a pod or replace its prefixes: `apply_pod(Pod(...))` or `apply_pod(name, prefixes)`."""
        if isinstance(pod, str):
            pod = Pod(pod, tuple(prefixes))
        elif prefixes:
            raise TypeError("apply_pod: give a Pod, or a name and its prefixes, not both")
        return pod_from_pb(await self.stub.ApplyPod(pb.ApplyPodRequest(pod=pod_to_pb(pod))))

    async def list_pods(self) -> list[Pod]:
        """Every pod."""
        return [pod_from_pb(p) for p in (await self.stub.ListPods(pb.ListPodsRequest())).pods]

    async def register_dpu(self, dpu: Dpu | pb.Dpu) -> Dpu:
        """Register a DPU (or update it in place), as the control plane stored it. A protobuf Dpu is sent
        as it is (older callers, and tests of values no model holds)."""
        message = dpu if isinstance(dpu, pb.Dpu) else dpu_to_pb(dpu)
        return dpu_from_pb(await self.stub.RegisterDpu(pb.RegisterDpuRequest(dpu=message)))

    async def list_dpus(self) -> list[Dpu]:
        """Every DPU."""
        return [dpu_from_pb(d) for d in (await self.stub.ListDpus(pb.ListDpusRequest())).dpus]

    @overload
    async def set_pod_cap(self, pod: str, cap: Cap, /) -> PodCap: ...

    @overload
    async def set_pod_cap(
        self,
        pod: str,
        egress_bps: float,
        ingress_bps: float,
        window_s: float,
        /,
        burst_bytes: int = 0,
        rebalance: bool = False,
        mode: str = "rate",
    ) -> PodCap: ...

    async def set_pod_cap(
        self,
        pod: str,
        cap: Cap | float,
        ingress_bps: float | None = None,
        window_s: float | None = None,
        /,
        burst_bytes: int = 0,
        rebalance: bool = False,
        mode: str = "rate",
    ) -> PodCap:
        """Set a pod's cap: `set_pod_cap(pod, Cap(...))`, or its fields (bit/s, seconds, bytes; rebalance:
        node shares follow demand; mode "rate" or "window"). Answers the cap stored (the default burst filled)."""
        if not isinstance(cap, Cap):
            if ingress_bps is None or window_s is None:
                raise TypeError("set_pod_cap: give a Cap, or egress_bps, ingress_bps and window_s")
            cap = Cap(cap, ingress_bps, window_s, burst_bytes, rebalance, mode)
        answer = await self.stub.SetPodCap(pb.SetPodCapRequest(pod=pod, cap=cap_to_pb(cap)))
        return PodCap(answer.pod, cap_from_pb(answer.cap))

    async def get_pod_cap(self, pod: str) -> PodCap:
        """A pod's cap (NOT_FOUND when it has none)."""
        answer = await self.stub.GetPodCap(pb.GetPodCapRequest(pod=pod))
        return PodCap(answer.pod, cap_from_pb(answer.cap))

    async def usage(self, pod: str = "", per_dpu: bool = False) -> Usage:
        """Usage per pod and direction (and per DPU); every pod when `pod` is empty."""
        answer: Usage = await self.stub.GetUsage(pb.GetUsageRequest(pod=pod, per_dpu=per_dpu))
        return answer

    async def watch_usage(
        self, pod: str = "", interval_s: float = 1.0, per_dpu: bool = False
    ) -> AsyncIterator[UsageSample]:
        """Usage samples every interval until cancelled."""
        request = pb.WatchUsageRequest(pod=pod, interval_s=interval_s, per_dpu=per_dpu)
        async for sample in self.stub.WatchUsage(request):
            yield sample

    async def status(
        self,
        page_size: int = 0,
        page_token: str = "",
        held_here: bool = False,
        *,
        wait_s: float = 0.0,
        wait_generation: int = 0,
    ) -> Status:
        """Reconciliation status of every DPU (or of a page of them, in order of name: `page_size` rows
        after `page_token`, the answer's `next_page_token` where the next page starts; with `held_here`, of
        the DPUs this replica holds only). With `wait_s`, answered once every DPU the server holds applied
        `wait_generation` (0: its current one), or after `wait_s` seconds."""
        request = pb.GetStatusRequest(
            page_size=page_size,
            page_token=page_token,
            held_here=held_here,
            wait_s=wait_s,
            wait_generation=wait_generation,
        )
        answer: Status = await self.stub.GetStatus(request)
        return answer

    async def apply(
        self,
        pods: Sequence[Pod] = (),
        dpus: Sequence[Dpu] = (),
        caps: Mapping[str, Cap] | None = None,
        routers: Sequence[Router] = (),
        *,
        dry_run: bool = False,
    ) -> Written:
        """Create or update all of them as one write, or none (dry_run: check and say what would change).
        Errors name an entry by its place: `dpus[2].pod`, `caps[0].cap.window_s` (caps in the mapping's order)."""
        request = pb.ApplyRequest(
            pods=[pod_to_pb(p) for p in pods],
            dpus=[dpu_to_pb(d) for d in dpus],
            caps=[pb.PodCap(pod=pod, cap=cap_to_pb(c)) for pod, c in (caps or {}).items()],
            routers=[router_to_pb(r) for r in routers],
            dry_run=dry_run,
        )
        answer: Written = await self.stub.Apply(request)
        return answer

    async def delete(
        self,
        pods: Sequence[str] = (),
        dpus: Sequence[str] = (),
        caps: Sequence[str] = (),
        routers: Sequence[str] = (),
        *,
        dry_run: bool = False,
        missing_ok: bool = False,
    ) -> Written:
        """Delete pods, DPUs, caps (named by their pods) and routers by name as one write, or none
        (missing_ok: leave out names that do not exist instead of refusing with NOT_FOUND)."""
        request = pb.DeleteRequest(
            pods=list(pods),
            dpus=list(dpus),
            caps=list(caps),
            routers=list(routers),
            dry_run=dry_run,
            missing_ok=missing_ok,
        )
        answer: Written = await self.stub.Delete(request)
        return answer

    async def list_routers(self) -> list[Router]:
        """Every router and the pods behind it."""
        return [router_from_pb(r) for r in (await self.stub.ListRouters(pb.ListRoutersRequest())).routers]

    async def wait_converged(self, timeout: float = 30.0, generation: int = 0, held_here: bool = False) -> Status:
        """Wait until every DPU applied `generation` (a write's; 0: the server's current one) and say so in
        its row; raise TimeoutError naming the laggards. The server answers once that holds (GetStatus's
        wait_s): one call, not a poll, unless a row still lags then.

        With replicas (a PostgreSQL database), every DPU this replica holds: the others' rows say "elsewhere"
        (wait on each replica for the whole fleet; `held_here` leaves their rows out of the answer)."""
        deadline = time.monotonic() + timeout
        while True:
            left = min(max(deadline - time.monotonic(), 0.001), MAX_STATUS_WAIT_S)
            st = await self.status(held_here=held_here, wait_s=left, wait_generation=generation)
            gen = generation or st.generation
            lagging = [
                d for d in st.dpus if d.lease_state != "elsewhere" and (not d.converged or d.generation_applied < gen)
            ]
            if not lagging:
                return st
            if time.monotonic() > deadline:
                detail = ", ".join(f"{d.name} (connected={d.connected}, error={d.last_error!r})" for d in lagging[:5])
                more = f" and {len(lagging) - 5} more" if len(lagging) > 5 else ""
                raise TimeoutError(f"{len(lagging)} DPUs not converged after {timeout:g} s: {detail}{more}")
            await asyncio.sleep(0.1)  # the server's wait ended, a row lags all the same: ask again shortly
