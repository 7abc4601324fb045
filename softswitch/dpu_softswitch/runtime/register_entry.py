"""RegisterEntry: the cells of register arrays (MODIFY only)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from finsy.proto import p4i, p4r

from ..errors import P4RuntimeError
from ..externs import RegisterArray
from .binding import Binding
from .codec import decode_bytes, encode_bytes, invalid


def write(b: Binding, kind: int, re: p4r.RegisterEntry) -> None:
    """Set one cell or every cell of a register array."""
    if kind != p4r.Update.MODIFY:
        raise invalid("register entries can only be modified")
    info, arr = _register(b, re.register_id)
    if re.data.WhichOneof("data") != "bitstring":
        raise invalid(f"register {info.preamble.name}: data must be a bitstring")
    value = decode_bytes(re.data.bitstring, arr.mask.bit_length(), f"register {info.preamble.name}")
    for idx in _indexes(info, arr, re):
        arr.values[idx] = value


def read(b: Binding, req: p4r.RegisterEntry) -> Iterator[p4r.Entity]:
    """The register cells a read request names."""
    ids = [req.register_id] if req.register_id else list(b.registers)
    for rid in ids:
        info, arr = _register(b, rid)
        for idx in _indexes(info, arr, req):
            out = p4r.RegisterEntry(register_id=rid, index=p4r.Index(index=idx))
            out.data.bitstring = encode_bytes(arr.values[idx])
            yield p4r.Entity(register_entry=out)


def _register(b: Binding, rid: int) -> tuple[p4i.Register, RegisterArray]:
    found = b.registers.get(rid)
    if found is None:
        raise P4RuntimeError(grpc.StatusCode.NOT_FOUND, f"register id {rid} is not in the P4Info")
    return found


def _indexes(info: p4i.Register, arr: RegisterArray, re: p4r.RegisterEntry) -> list[int]:
    if not re.HasField("index"):
        return list(range(arr.size))
    idx = re.index.index
    if not 0 <= idx < arr.size:
        raise P4RuntimeError(
            grpc.StatusCode.OUT_OF_RANGE, f"register {info.preamble.name}: index {idx} outside 0..{arr.size - 1}"
        )
    return [idx]
