"""The P4Runtime gRPC service (p4.v1.P4Runtime) of the embedded target.

Arbitration follows the specification: per role, the stream with the highest election id is
primary; the primary and backups are told on every change (OK for the primary, ALREADY_EXISTS
for backups, with the primary's election id); a duplicate election id is refused; only the
primary may write or set the pipeline. Error texts match simple_switch_grpc's where clients
(finsy, p4runtime-shell) look for them.

Stream messages as simple_switch_grpc's PI server (proto/server/pi_server.cpp) handles them:
PacketIn and DigestList go to the primary of the default role only (PI v0.1.1 has no roles: its
one primary gets them), and nowhere when there is none; a PacketOut or DigestListAck from any
other stream, or before arbitration, is ignored without an error. A PacketOut the device refuses
(unknown metadata, no CPU port) is dropped silently too: PI reports it as a StreamError only when
its ServerConfig enables stream error reporting, which is off by default.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from finsy.proto import p4i, p4r, p4r_grpc, rpc_code, rpc_status
from google.protobuf import any_pb2

# Device is re-exported: the lab (dpu_lab), bench/targets_host.py and many tests import it from here.
from .device import NO_PIPELINE, Device
from .errors import P4RuntimeError
from .runtime.pipeline import Pipeline

LOG = logging.getLogger(__name__)

API_VERSION = "1.4.0"


@dataclass(eq=False)
class _Stream:
    """One controller's stream: its role, election id and outgoing messages."""

    role: str
    election_id: int
    queue: asyncio.Queue[p4r.StreamMessageResponse | BaseException]


def _u128(eid: p4r.Uint128) -> int:
    return (eid.high << 64) | eid.low


def _to_u128(value: int) -> p4r.Uint128:
    return p4r.Uint128(high=value >> 64, low=value & ((1 << 64) - 1))


class P4RuntimeService(p4r_grpc.P4RuntimeServicer):
    """P4Runtime for one device."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.streams: list[_Stream] = []
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # created outside a loop: the first RPC brings it
            self._loop = None
        self._timer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        device.listeners.append(self)

    # ---------------------------------------------------------------- messages from the device

    def stream_message(self, msg: p4r.StreamMessageResponse) -> None:
        """Queue a PacketIn or DigestList for the primary (from any thread)."""
        if self._loop is not None:  # no loop yet: no stream yet, so no primary to tell
            self._loop.call_soon_threadsafe(self._to_primary, msg)

    def timers_changed(self) -> None:
        """Wake the digest timer (from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._start_timer)

    def _to_primary(self, msg: p4r.StreamMessageResponse) -> None:
        primary = self._primary("")
        if primary is not None:
            primary.queue.put_nowait(msg)

    def _start_timer(self) -> None:
        """Run the digest timeouts on wall-clock time (a virtual clock's owner calls Device.tick)."""
        if not self.device.clock.realtime:
            return
        self._wake.set()
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._run_timer())

    async def _run_timer(self) -> None:
        device = self.device
        while (deadline := device.next_deadline_us()) is not None:
            self._wake.clear()
            delay = max(0, deadline - device.clock.now_us()) / 1e6
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass
            with device.lock:
                device.tick()

    # ---------------------------------------------------------------- arbitration

    def _primary(self, role: str) -> _Stream | None:
        candidates = [s for s in self.streams if s.role == role]
        return max(candidates, key=lambda s: s.election_id, default=None)

    def _arbitration_msg(self, s: _Stream, primary: _Stream | None) -> p4r.StreamMessageResponse:
        msg = p4r.StreamMessageResponse()
        arb = msg.arbitration
        arb.device_id = self.device.device_id
        if s.role:
            arb.role.name = s.role
        if primary is not None:
            arb.election_id.CopyFrom(_to_u128(primary.election_id))
        if primary is s:
            arb.status.code = rpc_code.OK
            arb.status.message = "Is primary"
        else:
            arb.status.code = rpc_code.ALREADY_EXISTS
            arb.status.message = "Is backup"
        return msg

    def _notify(self, role: str, only: _Stream | None = None) -> None:
        primary = self._primary(role)
        for s in self.streams:
            if s.role == role and (only is None or s is only):
                s.queue.put_nowait(self._arbitration_msg(s, primary))

    async def StreamChannel(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[p4r.StreamMessageRequest],
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[p4r.StreamMessageResponse]:
        """Arbitration and stream messages for one controller connection."""
        self._loop = asyncio.get_running_loop()
        stream: _Stream | None = None
        reader_done = asyncio.Event()
        outbox: asyncio.Queue[p4r.StreamMessageResponse | BaseException] = asyncio.Queue()

        async def reader() -> None:
            nonlocal stream
            try:
                async for req in request_iterator:
                    kind = req.WhichOneof("update")
                    if kind == "arbitration":
                        stream = self._arbitrate(req.arbitration, stream, outbox)
                    elif stream is not None and self._primary(stream.role) is stream:
                        self._from_primary(req)
            except P4RuntimeError as exc:
                outbox.put_nowait(exc)
            finally:
                reader_done.set()
                outbox.put_nowait(StopAsyncIteration())

        task = asyncio.create_task(reader())
        try:
            while True:
                item = await outbox.get()
                if isinstance(item, P4RuntimeError):
                    await context.abort(item.code, item.message)
                if isinstance(item, BaseException):
                    break
                yield item
        finally:
            task.cancel()
            if stream is not None and stream in self.streams:
                role = stream.role
                was_primary = self._primary(role) is stream
                self.streams.remove(stream)
                if was_primary:
                    self._notify(role)

    def _from_primary(self, req: p4r.StreamMessageRequest) -> None:
        kind = req.WhichOneof("update")
        try:
            if kind == "packet":
                self.device.packet_out(req.packet)
            elif kind == "digest_ack":
                with self.device.lock:
                    self.device.digest_ack(req.digest_ack)
        except P4RuntimeError as exc:
            LOG.debug("packet-out dropped: %s", exc.message)

    def _arbitrate(
        self,
        arb: p4r.MasterArbitrationUpdate,
        current: _Stream | None,
        outbox: asyncio.Queue[p4r.StreamMessageResponse | BaseException],
    ) -> _Stream:
        if arb.device_id != self.device.device_id:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"Invalid device id {arb.device_id}")
        role = arb.role.name if arb.HasField("role") else ""
        eid = _u128(arb.election_id) if arb.HasField("election_id") else 0
        for s in self.streams:
            if s is not current and s.role == role and s.election_id == eid:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, "Election id already exists")
        old_primary = self._primary(role)
        if current is None:
            current = _Stream(role=role, election_id=eid, queue=outbox)
            self.streams.append(current)
        else:
            current.election_id = eid
        new_primary = self._primary(role)
        if new_primary is not old_primary:
            self._notify(role)
        else:
            self._notify(role, only=current)
        return current

    def _check_primary(self, role: str, election_id: p4r.Uint128) -> None:
        primary = self._primary(role)
        if primary is None or primary.election_id != _u128(election_id):
            raise P4RuntimeError(grpc.StatusCode.PERMISSION_DENIED, "Not primary")

    def _check_device(self, device_id: int) -> None:
        if device_id != self.device.device_id:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"Invalid device id {device_id}")

    def _pipeline(self) -> Pipeline:
        pipeline = self.device.pipeline
        if pipeline is None:
            raise P4RuntimeError(grpc.StatusCode.FAILED_PRECONDITION, NO_PIPELINE)
        return pipeline

    # ---------------------------------------------------------------- unary RPCs

    async def SetForwardingPipelineConfig(  # noqa: N802
        self,
        request: p4r.SetForwardingPipelineConfigRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> p4r.SetForwardingPipelineConfigResponse:
        """Verify, save and/or commit a pipeline."""
        try:
            self._check_device(request.device_id)
            self._check_primary(request.role, request.election_id)
            action = request.action
            A = p4r.SetForwardingPipelineConfigRequest.Action  # noqa: N806
            dev = self.device
            if action in (A.VERIFY, A.VERIFY_AND_SAVE, A.VERIFY_AND_COMMIT):
                pipeline = await asyncio.to_thread(dev.build_pipeline, request.config)
                with dev.lock:
                    if action == A.VERIFY_AND_SAVE:
                        dev.saved = pipeline
                    elif action == A.VERIFY_AND_COMMIT:
                        dev.pipeline, dev.saved = pipeline, None
            elif action == A.COMMIT:
                with dev.lock:
                    if dev.saved is None:
                        raise P4RuntimeError(grpc.StatusCode.FAILED_PRECONDITION, "no saved pipeline config to commit")
                    dev.pipeline, dev.saved = dev.saved, None
            else:
                raise P4RuntimeError(
                    grpc.StatusCode.UNIMPLEMENTED, f"pipeline action {A.Name(action)} is not supported"
                )
        except P4RuntimeError as exc:
            await context.abort(exc.code, exc.message)
        return p4r.SetForwardingPipelineConfigResponse()

    async def GetForwardingPipelineConfig(  # noqa: N802
        self,
        request: p4r.GetForwardingPipelineConfigRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> p4r.GetForwardingPipelineConfigResponse:
        """Return the committed pipeline, in part or whole, as response_type asks."""
        try:
            self._check_device(request.device_id)
            pipeline = self._pipeline()
        except P4RuntimeError as exc:
            await context.abort(exc.code, exc.message)
        R = p4r.GetForwardingPipelineConfigRequest.ResponseType  # noqa: N806
        out = p4r.GetForwardingPipelineConfigResponse()
        rt = request.response_type
        if rt in (R.ALL, R.P4INFO_AND_COOKIE):
            out.config.p4info.CopyFrom(pipeline.p4info)
        if rt in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            out.config.p4_device_config = pipeline.device_config
        out.config.cookie.cookie = pipeline.cookie
        return out

    async def Write(  # noqa: N802
        self,
        request: p4r.WriteRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> p4r.WriteResponse:
        """Apply a batch of updates, each on its own; failures are reported per update."""
        try:
            self._check_device(request.device_id)
            self._check_primary(request.role, request.election_id)
            pipeline = self._pipeline()
            if request.atomicity != p4r.WriteRequest.CONTINUE_ON_ERROR:
                raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED, "only CONTINUE_ON_ERROR atomicity is supported")
        except P4RuntimeError as exc:
            await context.abort(exc.code, exc.message)
        # Errors by update index; the per-update details are built only when one fails.
        failures: dict[int, p4r.Error] = {}
        self._loop = asyncio.get_running_loop()
        with self.device.lock:
            for i, update in enumerate(request.updates):
                try:
                    pipeline.write(update)
                except P4RuntimeError as exc:
                    failures[i] = p4r.Error(canonical_code=exc.code.value[0], message=exc.message)
        if failures:
            ok = p4r.Error(canonical_code=rpc_code.OK)
            await _abort_with_details(context, [failures.get(i, ok) for i in range(len(request.updates))])
        return p4r.WriteResponse()

    async def Read(  # noqa: N802
        self,
        request: p4r.ReadRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> AsyncIterator[p4r.ReadResponse]:
        """Stream the entities matching the request."""
        try:
            self._check_device(request.device_id)
            pipeline = self._pipeline()
            out = p4r.ReadResponse()
            with self.device.lock:
                for entity in request.entities:
                    out.entities.extend(pipeline.read(entity))
        except P4RuntimeError as exc:
            await context.abort(exc.code, exc.message)
        yield out

    async def Capabilities(  # noqa: N802
        self,
        request: p4r.CapabilitiesRequest,
        context: grpc.aio.ServicerContext,  # type: ignore[type-arg]
    ) -> p4r.CapabilitiesResponse:
        """The P4Runtime API version this target implements."""
        return p4r.CapabilitiesResponse(p4runtime_api_version=API_VERSION)


async def _abort_with_details(context: grpc.aio.ServicerContext, errors: list[p4r.Error]) -> None:  # type: ignore[type-arg]
    status = rpc_status.Status(code=grpc.StatusCode.UNKNOWN.value[0], message="Write failure.")
    for err in errors:
        detail = any_pb2.Any()
        detail.Pack(err)
        status.details.append(detail)
    await context.abort(
        grpc.StatusCode.UNKNOWN,
        status.message,
        trailing_metadata=(("grpc-status-details-bin", status.SerializeToString()),),
    )


def add_to_server(server: grpc.aio.Server, device: Device) -> P4RuntimeService:
    """Register the P4Runtime service for `device` on a gRPC server."""
    service = P4RuntimeService(device)
    p4r_grpc.add_P4RuntimeServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    return service


__all__ = ["Device", "P4RuntimeService", "add_to_server", "p4i"]
