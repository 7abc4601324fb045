"""P4Runtime byte strings and the INVALID_ARGUMENT error every entity kind raises."""

from __future__ import annotations

import grpc

from ..errors import P4RuntimeError


def invalid(msg: str) -> P4RuntimeError:
    """An INVALID_ARGUMENT error."""
    return P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, msg)


def decode_bytes(data: bytes, bitwidth: int, what: str) -> int:
    """Decode a P4Runtime byte string, refusing values wider than the field."""
    if not data:
        raise invalid(f"{what}: empty byte string")
    value = int.from_bytes(data, "big")
    if value >> bitwidth:
        raise P4RuntimeError(
            grpc.StatusCode.OUT_OF_RANGE, f"{what}: value 0x{data.hex()} does not fit in {bitwidth} bits"
        )
    return value


def encode_bytes(value: int) -> bytes:
    """Encode a value as P4Runtime's canonical (shortest) byte string."""
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
