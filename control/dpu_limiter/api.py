"""The limiter.v1.Limiter gRPC API: proto <-> models, errors -> status codes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from . import heap
from ._proto.limiter.v1 import limiter_pb2 as pb
from ._proto.limiter.v1 import limiter_pb2_grpc as pb_grpc
from .convert import cap_from_pb, cap_to_pb, change_fields, dpu_from_pb, dpu_to_pb, pod_to_pb, router_to_pb
from .models import AlreadyExists, Cap, Change, InvalidArgument, NotFound, Pod, Router, check_name, check_seconds, shown
from .service import FREEZE_EVERY, DpuState, LimiterService
from .store import StateMismatch
from .tls import role_of
from .units import MAX_STATUS_WAIT_S

T = TypeVar("T")
LOG = logging.getLogger(__name__)
ON_LOOP_ROWS = 500  # GetStatus rows made and encoded per turn of the event loop (~5 us each)
ENCODED_CHANGES = 1000  # a write's answer is encoded this many changes at a time (each holds the interpreter lock)
WHOLE_STATUS_SHARE = 0.1  # at most this share of the loop goes to making whole-fleet GetStatus answers
WHOLE_STATUS_MAX_AGE_S = 1.0  # and none is answered older than this


class LimiterApi(pb_grpc.LimiterServicer):
    """gRPC front of LimiterService; with mutual TLS, the client certificate's role gates writes."""

    def __init__(self, service: LimiterService, mtls: bool = False) -> None:
        self.service = service
        self.mtls = mtls
        self._whole_status = Shared[bytes](WHOLE_STATUS_SHARE, WHOLE_STATUS_MAX_AGE_S)

    async def _actor(self, context: grpc.aio.ServicerContext, write: bool) -> str:  # type: ignore[type-arg]
        """Who is calling ("role:name"); refuses unknown roles, and writes by anyone but a verifier."""
        if not self.mtls:
            return "local"  # no TLS: a development or lab setup, with no one to tell apart
        auth = context.auth_context()
        pem = (auth.get("x509_pem_cert") or [b""])[0]
        name = (auth.get("x509_common_name") or [b"?"])[0].decode(errors="replace")
        role = role_of(pem) if pem else None
        if role is None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"client certificate {shown(name)} has no role "
                "(its subject needs exactly one OU: verifier or operator)",
            )
        if write and role != "verifier":
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"role {role} ({shown(name)}) may only read; changes need a verifier certificate",
            )
        # The audit log's actor: a name with line breaks or other controls is written escaped.
        return f"{role}:{name if name.isprintable() else shown(name)}"

    async def _fresh(self) -> None:
        """Before a read of the desired state: take what other replicas wrote (LimiterService.refresh), so that
        every replica answers the latest stored state. Without the database, the state last seen is answered."""
        try:
            await self.service.refresh()
        except Exception as exc:
            LOG.warning("reading the stored state again failed (answering the state last read): %s", exc)

    async def _call(
        self,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
        fn: Callable[[str], Awaitable[T]],
        write: bool,
    ) -> T:
        actor = await self._actor(context, write)
        try:
            return await fn(actor)
        except sqlite3.OperationalError as exc:  # the state file is locked or unwritable: nothing stored
            LOG.warning("state store: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the control plane's state store: {shown(str(exc))}")
        except StateMismatch as exc:  # the state file was edited behind the log: no write is taken
            why = f"the control plane's stored state failed its {exc.verdict.check} check: {exc.verdict.problem}"
            await context.abort(grpc.StatusCode.DATA_LOSS, _bounded(why))
        except InvalidArgument as exc:
            code = (
                grpc.StatusCode.NOT_FOUND
                if isinstance(exc, NotFound)
                else grpc.StatusCode.ALREADY_EXISTS
                if isinstance(exc, AlreadyExists)
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            await context.abort(code, _bounded(str(exc)))
        raise AssertionError("unreachable")

    async def ApplyPod(self, request: pb.ApplyPodRequest, context: grpc.aio.ServicerContext) -> pb.Pod:  # type: ignore[type-arg]  # noqa: N802
        """Create or replace a pod."""

        async def run(actor: str) -> pb.Pod:
            pod = Pod.validated(request.pod.name, list(request.pod.ipv4_prefixes))
            return pod_to_pb(await self.service.apply_pod(pod, actor))

        return await self._call(context, run, write=True)

    async def ListPods(self, request: pb.ListPodsRequest, context: grpc.aio.ServicerContext) -> pb.ListPodsResponse:  # type: ignore[type-arg]  # noqa: N802
        """Every pod."""
        await self._actor(context, write=False)
        await self._fresh()
        pods = sorted(self.service.state.pods.values(), key=lambda p: p.name)
        return pb.ListPodsResponse(pods=[pod_to_pb(p) for p in pods])

    async def RegisterDpu(self, request: pb.RegisterDpuRequest, context: grpc.aio.ServicerContext) -> pb.Dpu:  # type: ignore[type-arg]  # noqa: N802
        """Register a DPU."""

        async def run(actor: str) -> pb.Dpu:
            return dpu_to_pb(await self.service.register_dpu(dpu_from_pb(request.dpu), actor))

        return await self._call(context, run, write=True)

    async def ListRouters(  # noqa: N802
        self,
        request: pb.ListRoutersRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> pb.ListRoutersResponse:
        """Every router."""
        await self._actor(context, write=False)
        await self._fresh()
        routers = sorted(self.service.state.routers.values(), key=lambda r: r.name)
        return pb.ListRoutersResponse(routers=[router_to_pb(r) for r in routers])

    async def ListDpus(self, request: pb.ListDpusRequest, context: grpc.aio.ServicerContext) -> pb.ListDpusResponse:  # type: ignore[type-arg]  # noqa: N802
        """Every DPU."""
        await self._actor(context, write=False)
        await self._fresh()
        dpus = sorted(self.service.state.dpus.values(), key=lambda d: d.name)
        return pb.ListDpusResponse(dpus=[dpu_to_pb(d) for d in dpus])

    async def SetPodCap(self, request: pb.SetPodCapRequest, context: grpc.aio.ServicerContext) -> pb.PodCap:  # type: ignore[type-arg]  # noqa: N802
        """Set a pod's cap."""

        async def run(actor: str) -> pb.PodCap:
            stored = await self.service.set_cap(request.pod, _cap(request), actor)
            return pb.PodCap(pod=request.pod, cap=cap_to_pb(stored))

        return await self._call(context, run, write=True)

    async def Apply(self, request: pb.ApplyRequest, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]  # noqa: N802
        """Create or update pods, DPUs and caps in one write; the WriteResponse is sent as encoded here
        (add_to_server sends bytes as they are)."""

        from .models import Dpu  # for the annotation below

        state = self.service.state  # never changed in place: a write replaces it

        def validated() -> tuple[
            list[tuple[str, Pod]], list[tuple[str, Dpu]], list[tuple[str, str, Cap]], list[tuple[str, Router]]
        ]:
            # An object given exactly as stored (its proto form) is the stored one, validated when it was
            # written: re-applying a fleet's file checks what changed, not all of it again.
            def pod(i: int, p: pb.Pod) -> Pod:
                known = state.pods.get(p.name)
                if known is not None and pod_to_pb(known) == p:
                    return known
                return Pod.validated(p.name, list(p.ipv4_prefixes), f"pods[{i}]")

            def dpu(i: int, d: pb.Dpu) -> Dpu:
                known = state.dpus.get(d.name)
                if known is not None and dpu_to_pb(known) == d:
                    return known
                return dpu_from_pb(d, f"dpus[{i}]")

            # A fleet's pods share a few caps: each set of values is checked once (what passed, that is;
            # a failing one is checked again where it comes, so that its error names that field).
            passed: dict[tuple[float, float, float, int, bool, int], Cap] = {}

            def cap(i: int, c: pb.PodCap) -> Cap:
                if not c.HasField("cap"):
                    return _cap(c, f"caps[{i}].")
                known = state.caps.get(c.pod)
                if known is not None and cap_to_pb(known) == c.cap:
                    return known
                v = c.cap
                values = (v.egress_bps, v.ingress_bps, v.window_s, v.burst_bytes, v.rebalance, v.mode)
                if (checked := passed.get(values)) is None:
                    checked = passed[values] = _cap(c, f"caps[{i}].")
                return checked

            pods = [(f"pods[{i}]", pod(i, p)) for i, p in enumerate(request.pods)]
            dpus = [(f"dpus[{i}]", dpu(i, d)) for i, d in enumerate(request.dpus)]
            caps = [(f"caps[{i}].", c.pod, cap(i, c)) for i, c in enumerate(request.caps)]
            routers = [
                (f"routers[{i}]", Router.validated(r.name, list(r.pods), f"routers[{i}]"))
                for i, r in enumerate(request.routers)
            ]
            for kind, named in (
                ("pods", [p.name for _, p in pods]),
                ("dpus", [d.name for _, d in dpus]),
                ("routers", [r.name for _, r in routers]),
            ):
                _unique(kind, named, ".name")
            _unique("caps", [c.pod for c in request.caps], ".pod")
            return pods, dpus, caps, routers

        async def run(actor: str) -> bytes:
            # A fleet's file is tens of thousands of objects: validating them and writing the answer
            # run in a worker thread, so that the event loop keeps answering and renewing leases; and the
            # collector waits until they are all made (heap.paused).
            size = len(request.pods) + len(request.dpus) + len(request.caps) + len(request.routers)
            with heap.paused() if size >= FREEZE_EVERY else contextlib.nullcontext():
                pods, dpus, caps, routers = await asyncio.to_thread(validated)
                changes = await self.service.apply(pods, dpus, caps, actor, request.dry_run, routers)
                generation = self.service.state.generation  # this write's (read before anything else can write)
                return await asyncio.to_thread(_written, changes, generation)

        return await self._call(context, run, write=True)

    async def Delete(self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]  # noqa: N802
        """Delete pods, DPUs and caps in one write (the WriteResponse encoded, as Apply's)."""

        async def run(actor: str) -> bytes:
            named = {}
            for kind in ("pods", "dpus", "caps", "routers"):
                names = list(getattr(request, kind))
                _unique(kind, names)
                named[kind] = [(f"{kind}[{i}]", n) for i, n in enumerate(names)]
            changes = await self.service.delete(
                named["pods"],
                named["dpus"],
                named["caps"],
                actor,
                request.dry_run,
                request.missing_ok,
                named["routers"],
            )
            generation = self.service.state.generation  # this write's (read before anything else can write)
            return await asyncio.to_thread(_written, changes, generation)

        return await self._call(context, run, write=True)

    async def GetPodCap(self, request: pb.GetPodCapRequest, context: grpc.aio.ServicerContext) -> pb.PodCap:  # type: ignore[type-arg]  # noqa: N802
        """A pod's cap."""

        async def run(actor: str) -> pb.PodCap:
            await self._fresh()
            return pb.PodCap(pod=request.pod, cap=cap_to_pb(self.service.get_cap(request.pod)))

        return await self._call(context, run, write=False)

    async def GetUsage(self, request: pb.GetUsageRequest, context: grpc.aio.ServicerContext) -> pb.GetUsageResponse:  # type: ignore[type-arg]  # noqa: N802
        """Usage per pod and direction."""

        async def run(actor: str) -> pb.GetUsageResponse:
            rows = await self.service.usage(request.pod, request.per_dpu)
            return pb.GetUsageResponse(usage=[pb.DirectionUsage(**r.__dict__) for r in rows])

        return await self._call(context, run, write=False)

    async def WatchUsage(  # noqa: N802
        self,
        request: pb.WatchUsageRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[pb.UsageSample]:
        """Usage samples every interval until the client cancels."""
        await self._actor(context, write=False)
        try:
            interval = check_seconds("interval_s", request.interval_s or 1.0, 0.1, 3600)
        except InvalidArgument as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if request.pod and request.pod not in self.service.state.pods:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(NotFound("pod", request.pod, "no such pod")))
        while True:
            rows = await self.service.usage(request.pod, request.per_dpu)
            yield pb.UsageSample(time=time.time(), usage=[pb.DirectionUsage(**r.__dict__) for r in rows])
            await asyncio.sleep(interval)

    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]  # noqa: N802
        """Every DPU's reconciliation status (a page of them: page_size, page_token), as its GetStatusResponse's
        wire bytes (add_to_server sends them as they are)."""

        async def run(actor: str) -> bytes:
            if request.page_size < 0:
                raise InvalidArgument("page_size", request.page_size, "must be 0 (every DPU) or more")
            if request.page_token:
                check_name("page_token", request.page_token)
            wait = check_seconds("wait_s", request.wait_s, 0, MAX_STATUS_WAIT_S)
            if request.wait_generation and not wait:
                raise InvalidArgument("wait_generation", request.wait_generation, "needs wait_s > 0")
            if wait:
                if request.wait_generation > self.service.state.generation:
                    await self._fresh()  # the writer's generation, not read here yet
                await self.service.wait_applied(request.wait_generation, wait)
                # Made afresh: the shared answer may be from before the wait ended, at the same generation.
                return (await self._status(request))[0]
            if request.page_size or request.page_token:
                return (await self._status(request))[0]
            # The whole fleet's rows (20,000: 0.1 s of the loop) are made once for every caller that asks
            # while they are fresh, so that polling them often cannot take the loop from leases and other calls.
            svc = self.service
            key = (svc.state.generation, svc.state_head, svc.expected_pipeline_sha256, request.held_here)
            return await self._whole_status.get(key, lambda: self._status(request))

        return await self._call(context, run, write=False)

    async def _status(self, request: pb.GetStatusRequest) -> tuple[bytes, float]:
        """GetStatus's answer to a valid `request` (wire bytes), and the seconds of the loop it took to make."""
        t0 = time.perf_counter()
        head = self.service.state_head
        out = pb.GetStatusResponse(
            generation=self.service.state.generation,
            expected_pipeline_sha256=self.service.expected_pipeline_sha256,
            change_log_seq=head[0],
            change_log_hash=head[1],
        )
        # A row per DPU of the page (of the fleet, without one), made and encoded on the event loop
        # ON_LOOP_ROWS at a time (~2.5 ms), which between them keeps renewing leases and answering other calls.
        # (Encoded messages joined are the message that has all their fields, rows in order: so no turn of
        # the loop encodes a whole fleet's. A worker thread would not spare the loop: it takes the
        # interpreter lock in turns with it, 5 ms each, and the loop, which gives the lock up at every poll,
        # waited for it again and again. A write's answer is encoded in one all the same, _written: there
        # the thread's slowness is the writer's, who waits seconds anyway, and the loop is spared.)
        agents, busy, more = self.service.status_snapshot(request.page_token, request.page_size, request.held_here)
        if more:
            out.next_page_token = agents[-1][0]
        parts, cost = [out.SerializeToString()], 0.0
        for start in range(0, len(agents), ON_LOOP_ROWS):
            if start:
                cost += time.perf_counter() - t0
                await asyncio.sleep(0)
                t0 = time.perf_counter()
            rows = self.service.status((agents[start : start + ON_LOOP_ROWS], busy, more))
            parts.append(_status_rows(pb.GetStatusResponse(), rows).SerializeToString())
        return b"".join(parts), cost + time.perf_counter() - t0


class Shared(Generic[T]):
    """An answer made once for every caller that asks for it (by key) while it is fresh: made again when the key
    changes, or after `1 / share - 1` times what it took to make (so that making it takes at most `share` of
    the loop however often it is asked), at most `max_age_s` after it was made. Callers that ask while it
    is being made wait for that one."""

    def __init__(self, share: float, max_age_s: float) -> None:
        self.share, self.max_age_s = share, max_age_s
        self._key: object = None
        self._made: asyncio.Task[T] | None = None
        self._fresh_until = -math.inf

    async def get(self, key: object, make: Callable[[], Awaitable[tuple[T, float]]]) -> T:
        """The answer for `key`; `make` makes one: (the answer, the seconds of the loop it took)."""
        task = self._made
        if task is None or key != self._key or (task.done() and time.monotonic() >= self._fresh_until):
            self._key, self._fresh_until = key, -math.inf
            self._made = task = asyncio.create_task(self._make(make))
        # Shielded: a caller that gives up does not cancel the answer the others wait for.
        return await asyncio.shield(task)

    async def _make(self, make: Callable[[], Awaitable[tuple[T, float]]]) -> T:
        answer, cost = await make()
        if asyncio.current_task() is self._made:  # not one for a key that has changed since
            self._fresh_until = time.monotonic() + min(cost * (1 / self.share - 1), self.max_age_s)
        return answer


def _written(changes: list[Change], generation: int) -> bytes:
    """A write's answer, encoded ENCODED_CHANGES changes at a time: encoded messages joined are the message with
    all their fields (a fleet's 40,000 changes encoded at once held the interpreter lock, and so the event
    loop, for some 20 ms). Changes are added in place: building each message and copying it in costs twice."""
    parts = []
    for start in range(0, len(changes), ENCODED_CHANGES):
        out = pb.WriteResponse()
        add = out.changes.add
        for c in changes[start : start + ENCODED_CHANGES]:
            add(**change_fields(c))
        parts.append(out.SerializeToString())
    parts.append(pb.WriteResponse(generation=generation).SerializeToString())  # last, as in field number order
    return b"".join(parts)


def _status_rows(out: pb.GetStatusResponse, rows: list[DpuState]) -> pb.GetStatusResponse:
    """The GetStatus answer with a row per DPU (added in place: building each message and copying it in
    costs twice)."""
    add = out.dpus.add
    for r in rows:
        add(
            name=r.name,
            connected=r.connected,
            primary=r.primary,
            converged=r.converged,
            last_error=r.last_error,
            generation_applied=r.generation_applied,
            drift_corrections=r.drift_corrections,
            last_drift=r.last_drift,
            lease_state=r.lease_state,
            lease_generation=r.lease_generation,
            lease_age_s=r.lease_age_s,
            lease_lifetime_s=r.lease_lifetime_s,
            pipeline_sha256=r.pipeline_sha256,
        )
    return out


def _cap(request: pb.SetPodCapRequest | pb.PodCap, prefix: str = "") -> Cap:
    """A request's validated cap; errors name `prefix` + "cap.<field>"."""
    if not request.HasField("cap"):
        raise InvalidArgument(f"{prefix}cap", None, "is required")
    for fname in ("egress_bps", "ingress_bps", "window_s"):
        if math.isnan(getattr(request.cap, fname)):
            raise InvalidArgument(f"{prefix}cap.{fname}", "nan", "must be a number")
    return cap_from_pb(request.cap, f"{prefix}cap")


MAX_DETAILS = 1024  # an error's text stays this small, whatever lists or values it names


def _bounded(text: str) -> str:
    """An error's text cut to MAX_DETAILS characters (values are already cut; lists of names may be long)."""
    return text if len(text) <= MAX_DETAILS else f"{text[: MAX_DETAILS - 40]}... ({len(text)} chars in all)"


def _unique(kind: str, names: list[str], suffix: str = "") -> None:
    """Refuse a request that names one object twice (which of the two would win?)."""
    first: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in first:
            raise InvalidArgument(f"{kind}[{i}]{suffix}", n, f"named twice (also {kind}[{first[n]}])")
        first[n] = i


def add_to_server(server: grpc.aio.Server, service: LimiterService, mtls: bool = False) -> LimiterApi:
    """Register the API on a gRPC server; requests are parsed here, so that bytes that are not the
    method's message are refused with INVALID_ARGUMENT (gRPC's own parsing would answer UNKNOWN)."""
    api = LimiterApi(service, mtls)
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Limiter"].methods:
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        impl = getattr(api, method.name)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        wrap = _parsed_stream if method.server_streaming else _parsed
        handlers[method.name] = make(
            wrap(impl, request_type), request_deserializer=None, response_serializer=_wire(response_type)
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("limiter.v1.Limiter", handlers),))
    return api


def _wire(response_type: Any) -> Callable[[Any], bytes]:
    """A method's response serializer: its message encoded, or bytes a method encoded itself sent as they are."""
    encode = response_type.SerializeToString

    def serialize(response: Any) -> bytes:
        return response if isinstance(response, bytes) else encode(response)  # type: ignore[no-any-return]

    return serialize


async def _parse(raw: bytes, request_type: Any, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[type-arg]
    """The request message in `raw`, or the call aborted with INVALID_ARGUMENT."""
    try:
        return request_type.FromString(raw)
    except DecodeError as exc:
        what = request_type.DESCRIPTOR.full_name
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {what} ({shown(str(exc))})")


def _parsed(impl: Callable[..., Awaitable[Any]], request_type: Any) -> Callable[..., Awaitable[Any]]:
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[type-arg]
        return await impl(await _parse(raw, request_type, context), context)

    return handler


def _parsed_stream(impl: Callable[..., AsyncIterator[Any]], request_type: Any) -> Callable[..., AsyncIterator[Any]]:
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # type: ignore[type-arg]
        async for item in impl(await _parse(raw, request_type, context), context):
            yield item

    return handler
