"""One P4 device: its pipeline (or none), its packet path and what it tells its controllers.

Shared by the P4Runtime service (server.py), the packet threads main.py starts (ports.py), the
firmware socket (firmware.py) and in-process simulations, which drive it without gRPC.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import grpc
from finsy.proto import p4i, p4r

from .errors import P4RuntimeError, ProgramError
from .externs import Clock
from .program import Program, shared_json
from .runtime.pipeline import Pipeline
from .trace import Tracer

NO_PIPELINE = "No forwarding pipeline config set for this device"

# The last few P4Infos set, by their serialised bytes: pipelines of the same program share one copy, which
# holds nothing of the request it came in (a message inside a request keeps the whole request alive, its
# bmv2 JSON included). Nothing writes to a pipeline's P4Info.
_P4INFOS: OrderedDict[bytes, p4i.P4Info] = OrderedDict()
_P4INFOS_KEPT = 4
_P4INFOS_LOCK = threading.Lock()


def shared_p4info(p4info: p4i.P4Info) -> p4i.P4Info:
    """A copy of `p4info` of its own, shared with the other pipelines of this process that set the same one lately."""
    key = p4info.SerializeToString(deterministic=True)
    with _P4INFOS_LOCK:
        if (hit := _P4INFOS.get(key)) is None:
            hit = _P4INFOS[key] = p4i.P4Info()
            hit.CopyFrom(p4info)
            while len(_P4INFOS) > _P4INFOS_KEPT:
                _P4INFOS.popitem(last=False)
        else:
            _P4INFOS.move_to_end(key)
        return hit


class DeviceListener(Protocol):
    """Who hears what a device sends its controller; called from whichever thread processes packets."""

    def stream_message(self, msg: p4r.StreamMessageResponse) -> None:
        """A PacketIn or DigestList for the primary controller."""

    def timers_changed(self) -> None:
        """The device's next digest timeout (next_deadline_us) moved earlier."""


class Device:
    """One P4 device: its pipeline (or none) and its packet path; shared by gRPC and packet I/O."""

    def __init__(
        self, device_id: int, clock: Clock | None = None, cpu_port: int | None = None, trace: Tracer | None = None
    ) -> None:
        self.device_id = device_id
        # --log-console's packet trace: every pipeline built for this device is then a traced one.
        self.trace = trace
        self.clock = clock or Clock()
        # simple_switch_grpc's --cpu-port: frames the pipeline sends there become PacketIns, and
        # PacketOuts enter the pipeline there. None: no packet I/O (PacketOuts are dropped).
        self.cpu_port = cpu_port
        # How a PacketOut's frame enters the pipeline: by default processed here at once and its outputs
        # handed to `transmit`; a packet thread (RawPorts.inject) queues it so that one thread runs packets.
        self.inject: Callable[[int, bytes], None] = self._process_and_transmit
        self.transmit: Callable[[int, bytes], None] | None = None
        self.listeners: list[DeviceListener] = []
        self.pipeline: Pipeline | None = None
        self.saved: Pipeline | None = None
        # Normally None: packets take `pipeline`, the one P4Runtime reads and writes. Set, packets take
        # this one instead while P4Runtime still sees `pipeline`: a device whose firmware lies to its
        # controller (the lab's model of a compromised DPU; bmv2 has nothing like it).
        self.data_plane: Pipeline | None = None
        # Writes and packet processing may run on different threads; table structures are
        # swapped whole, and this lock serialises multi-step control operations.
        self.lock = threading.Lock()

    def build_pipeline(self, config: p4r.ForwardingPipelineConfig) -> Pipeline:
        """Compile and bind a pipeline config, or raise P4RuntimeError INVALID_ARGUMENT."""
        if not config.HasField("p4info"):
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, "pipeline config has no p4info")
        try:
            device_config, doc = shared_json(config.p4_device_config)
            program = Program(doc, self.clock, self.trace)
            return Pipeline(
                program, shared_p4info(config.p4info), config.cookie.cookie, device_config, self._emit, self._wake
            )
        except ProgramError as exc:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, f"invalid pipeline: {exc}") from exc
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise P4RuntimeError(
                grpc.StatusCode.INVALID_ARGUMENT, f"invalid pipeline: malformed bmv2 JSON ({exc!r})"
            ) from exc

    def process(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        """Run a packet through the current pipeline; with no pipeline nothing is forwarded.

        What goes to the CPU port becomes a PacketIn for the listeners, not an output.
        """
        pipeline = self.data_plane or self.pipeline
        if pipeline is None:
            return []
        out = pipeline.program.process(port, data)
        cpu = self.cpu_port
        if cpu is None or all(eport != cpu for eport, _ in out):
            return out
        for eport, frame in out:
            if eport == cpu and (msg := pipeline.packet_io.to_packet_in(frame)) is not None:
                self._emit(p4r.StreamMessageResponse(packet=msg))
        return [(eport, frame) for eport, frame in out if eport != cpu]

    def packet_out(self, msg: p4r.PacketOut) -> None:
        """Inject a PacketOut on the CPU port (raises P4RuntimeError if the device cannot)."""
        pipeline = self.pipeline
        if pipeline is None:
            raise P4RuntimeError(grpc.StatusCode.FAILED_PRECONDITION, NO_PIPELINE)
        if self.cpu_port is None:
            raise P4RuntimeError(grpc.StatusCode.UNKNOWN, "no CPU port: this device was started without --cpu-port")
        self.inject(self.cpu_port, pipeline.packet_io.from_packet_out(msg))

    def digest_ack(self, ack: p4r.DigestListAck) -> None:
        """A controller's DigestListAck."""
        if self.pipeline is not None:
            self.pipeline.digests.ack(ack)

    def tick(self) -> None:
        """Run the digest timeouts due by now (the server does on wall-clock time; a simulation after
        advancing a virtual clock)."""
        if self.pipeline is not None:
            self.pipeline.digests.tick()

    def next_deadline_us(self) -> int | None:
        """When tick() next has something to do, on the device's clock (None: nothing pending)."""
        return None if self.pipeline is None else self.pipeline.digests.next_deadline_us()

    def _process_and_transmit(self, port: int, data: bytes) -> None:
        for eport, frame in self.process(port, data):
            if self.transmit is not None:  # with nowhere to send, frames are dropped (bmv2: no interface)
                self.transmit(eport, frame)

    def _emit(self, msg: p4r.StreamMessageResponse) -> None:
        for listener in self.listeners:
            listener.stream_message(msg)

    def _wake(self) -> None:
        for listener in self.listeners:
            listener.timers_changed()
