"""bmv2's hash algorithms (calculations.cpp) and how it builds their input from packet fields.

Each algorithm maps the input bytes to an unsigned integer exactly as bmv2's registered hash of
the same name does, including the defaults of the configurable CRCs (crc16_custom and
crc32_custom start as crc16 and crc32; this target has no runtime CLI to change them).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

HashFn = Callable[[bytes], int]


def _reflect(value: int, nbits: int) -> int:
    out = 0
    for _ in range(nbits):
        out = (out << 1) | (value & 1)
        value >>= 1
    return out


def crc_fn(width: int, poly: int, init: int, xor_out: int, refin: bool, refout: bool) -> HashFn:
    """A table-driven CRC with bmv2's crc_custom parameters (polynomial, init, final xor, reflections)."""
    top, mask = 1 << (width - 1), (1 << width) - 1
    table = []
    for dividend in range(256):
        rem = dividend << (width - 8)
        for _ in range(8):
            rem = ((rem << 1) ^ poly) if rem & top else (rem << 1)
        table.append(rem & mask)
    shift = width - 8
    byte_in = [_reflect(b, 8) for b in range(256)] if refin else list(range(256))

    def crc(data: bytes) -> int:
        rem = init
        for b in data:
            rem = table[byte_in[b] ^ (rem >> shift)] ^ ((rem << 8) & mask)
        return (_reflect(rem, width) if refout else rem) ^ xor_out

    return crc


def csum16(data: bytes) -> int:
    """The Internet checksum (ones' complement of the ones' complement sum), odd length padded with zero."""
    if len(data) % 2:
        data += b"\0"
    s = sum(int.from_bytes(data[k : k + 2], "big") for k in range(0, len(data), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def identity(data: bytes) -> int:
    """The first 8 bytes of the input as a big-endian integer (bmv2's identity)."""
    return int.from_bytes(data[:8], "big")


def xor_fn(nbytes: int) -> HashFn:
    """XOR of the input's big-endian words of `nbytes`, the last one zero-padded at its tail."""

    def xor(data: bytes) -> int:
        out = 0
        for k in range(0, len(data), nbytes):
            out ^= int.from_bytes(data[k : k + nbytes].ljust(nbytes, b"\0"), "big")
        return out

    return xor


def _crc32(data: bytes) -> int:
    return zlib.crc32(data)  # bmv2's crc32 is the standard reflected CRC-32 (init and final xor all ones)


ALGORITHMS: dict[str, HashFn] = {
    "crc16": crc_fn(16, 0x8005, 0x0000, 0x0000, True, True),
    "crc16_custom": crc_fn(16, 0x8005, 0x0000, 0x0000, True, True),
    "crc32": _crc32,
    "crc32_custom": _crc32,
    "crc8_custom": crc_fn(8, 0x07, 0x00, 0x00, False, False),
    "crc64_custom": crc_fn(64, 0x1B, 0, 0, True, True),
    "crcCCITT": crc_fn(16, 0x1021, 0xFFFF, 0x0000, False, False),
    "csum16": csum16,
    "cksum16": csum16,
    "identity": identity,
    "xor16": xor_fn(2),
    "xor32": xor_fn(4),
}


def algorithm(name: str) -> HashFn | None:
    """The hash function bmv2 registers under `name`, or None when this target lacks it."""
    return ALGORITHMS.get(name)
