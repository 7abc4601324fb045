"""Packet-in and packet-out through the CPU port, as PI's PacketIOMgr (proto/frontend/src/packet_io_mgr.cpp).

PI knows the controller headers only from P4Info: the controller_packet_metadata named exactly
"packet_in" and "packet_out", their fields' bit widths in order, packed without padding. A frame the
pipeline sends to the CPU port loses its first ceil(total bits / 8) bytes, which become the PacketIn's
metadata (canonical byte strings), whether the program emitted its packet_in header there or not; a
shorter frame is dropped. A PacketOut's metadata is packed into such a header (fields it omits are
zero, an unknown id or a value too wide for its field is refused) and put before the payload, and
the result enters the pipeline on the CPU port. Without a "packet_in" (or "packet_out") header the
frame (payload) goes as it is, and a PacketOut with metadata is refused.
"""

from __future__ import annotations

import grpc
from finsy.proto import p4i, p4r

from ..bytestrings import canonical, to_width
from ..errors import P4RuntimeError


class _Header:
    """One controller header: (metadata id, bit width) in order, and its size in bytes."""

    def __init__(self, meta: p4i.ControllerPacketMetadata) -> None:
        self.fields = [(m.id, m.bitwidth) for m in meta.metadata]
        self.nbits = sum(w for _, w in self.fields)
        self.nbytes = (self.nbits + 7) // 8


class PacketIO:
    """A pipeline's packet-in and packet-out conversions (from its P4Info)."""

    def __init__(self, p4info: p4i.P4Info) -> None:
        headers = {m.preamble.name: _Header(m) for m in p4info.controller_packet_metadata}
        self.packet_in = headers.get("packet_in")
        self.packet_out = headers.get("packet_out")

    def to_packet_in(self, frame: bytes) -> p4r.PacketIn | None:
        """The PacketIn for a frame sent to the CPU port, or None when it is too short to hold the header."""
        h = self.packet_in
        if h is None:
            return p4r.PacketIn(payload=frame)
        if len(frame) < h.nbytes:
            return None
        value = int.from_bytes(frame[: h.nbytes], "big") >> (h.nbytes * 8 - h.nbits)
        out = p4r.PacketIn(payload=frame[h.nbytes :])
        shift = h.nbits
        for mid, width in h.fields:
            shift -= width
            field = (value >> shift) & ((1 << width) - 1)
            out.metadata.add(metadata_id=mid, value=canonical(field.to_bytes((width + 7) // 8, "big")))
        return out

    def from_packet_out(self, msg: p4r.PacketOut) -> bytes:
        """The frame a PacketOut injects on the CPU port (raises P4RuntimeError INVALID_ARGUMENT)."""
        h = self.packet_out
        if h is None:
            if msg.metadata:
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, "Unexpected metadata in PacketOut message")
            return bytes(msg.payload)
        given: dict[int, bytes] = {}
        for m in msg.metadata:  # a repeated id: the last one counts, as in PacketOutMutate
            given[m.metadata_id] = m.value
        known = {mid for mid, _ in h.fields}
        for mid in given:
            if mid not in known:
                raise P4RuntimeError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"Unknown metadata id {mid} in PacketOut message"
                )
        value = 0
        for mid, width in h.fields:
            raw = to_width(given.get(mid, b""), width, f"PacketOut metadata id {mid}")
            value = (value << width) | int.from_bytes(raw, "big")
        value <<= h.nbytes * 8 - h.nbits
        return value.to_bytes(h.nbytes, "big") + bytes(msg.payload)
