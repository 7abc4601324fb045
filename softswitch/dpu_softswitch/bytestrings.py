"""P4Runtime byte strings as PI converts them (proto/frontend/src/common.cpp)."""

from __future__ import annotations

import grpc

from .errors import P4RuntimeError


def canonical(data: bytes) -> bytes:
    """P4Runtime's canonical byte string: no leading zero bytes (at least one byte)."""
    return data.lstrip(b"\0") or b"\0"


def to_width(data: bytes, bitwidth: int, what: str) -> bytes:
    """PI's bytestring_p4rt_to_pi: `data` as exactly (bitwidth + 7) // 8 bytes; shorter (even empty) is
    zero-padded, a value with bits set beyond `bitwidth` is INVALID_ARGUMENT."""
    nbytes = (bitwidth + 7) // 8
    value = int.from_bytes(data, "big")
    if value >> bitwidth:
        raise P4RuntimeError(
            grpc.StatusCode.INVALID_ARGUMENT, f"{what}: 0x{data.hex()} does not fit within {bitwidth} bits"
        )
    return value.to_bytes(nbytes, "big")
