"""The deparser: the program's one deparser as a generated function that packs each valid header.

It has no closure counterpart: packing a fixed list of headers has no control flow to interpret.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ..errors import ProgramError, UnsupportedConstruct
from .expressions import Expressions, bind, compile_fn
from .layout import HeaderLayout, struct_layout
from .loader import Objects
from .packet import Packet


def load_deparser(objs: Objects, exprs: Expressions) -> Callable[[Packet], bytes]:
    """The program's deparser, checked and compiled."""
    deparsers = objs.section("deparsers")
    if len(deparsers) != 1:
        raise ProgramError(f"bmv2 JSON: expected one deparser, found {len(deparsers)}")
    if deparsers[0].get("primitives"):
        raise UnsupportedConstruct("deparser primitives", "deparser")
    order = [objs.layout.header(name, "deparser") for name in deparsers[0].get("order", [])]
    return _generate(order, exprs)


def _generate(order: list[HeaderLayout], exprs: Expressions) -> Callable[[Packet], bytes]:
    """The deparser as one generated function: each valid header packed from its fields."""
    env = exprs.env()
    env["_deparsed"] = deparsed
    lines = ["f = p.f", "v = p.v", "parts = []"]
    for h in order:
        if h.vl >= 0:
            lines += [f"if v[{h.index}]:", f"    parts.append({_varbit_src(h)})"]
            continue
        fmt, units = struct_layout(h.widths)
        args = []
        for sizes, fields in units:
            terms = [f"(f[{h.base + j}] << {pos})" if pos else f"f[{h.base + j}]" for j, pos, _ in fields]
            value = terms[0] if len(terms) == 1 else f"({' | '.join(terms)})"
            shift = sum(sizes) * 8
            for k, size in enumerate(sizes):  # a unit wider than one struct code is split over several
                shift -= size * 8
                part = f"({value} >> {shift})" if shift else value
                args.append(part if k == 0 else f"{part} & {(1 << size * 8) - 1}")  # the top part needs no mask
        lines += [
            f"if v[{h.index}]:",
            f"    parts.append({bind(env, struct.Struct(fmt).pack)}({', '.join(args)}))",
        ]
    lines.append("return _deparsed(parts, p.payload, p.poff)")
    return compile_fn("deparse", "p", lines, env)  # type: ignore[no-any-return]


def _varbit_src(h: HeaderLayout) -> str:
    """A varbit header's bytes as bmv2's Header::deparse writes them: every field at its current width."""

    def concat(fields: list[tuple[int, int]]) -> tuple[str, int]:
        terms, pos = [], sum(w for _, w in fields)
        for i, w in fields:
            pos -= w
            terms.append(f"(f[{i}] << {pos})" if pos else f"f[{i}]")
        return " | ".join(terms) or "0", sum(w for _, w in fields)

    fields = [(h.base + j, w) for j, w in enumerate(h.widths)]
    (head, _), (tail, tail_bits) = concat(fields[: h.vl]), concat(fields[h.vl + 1 :])
    vl, nb = f"f[{h.base + h.vl}]", f"f[{h.vl_slot}]"
    value = f"((({head}) << ({nb} + {tail_bits})) | ({vl} << {tail_bits}) | ({tail}))"
    return f"{value}.to_bytes({h.nbytes} + {nb} // 8, 'big')"


def deparsed(parts: list[bytes], data: bytes, off: int) -> bytes:
    """Emitted headers then the payload data[off:]; the received bytes themselves when the headers come
    out as they went in, which saves copying large segments twice per pass."""
    head = b"".join(parts)
    if len(head) == off and data.__class__ is bytes and data.startswith(head):
        return data
    return b"".join((head, memoryview(data)[off:])) if off else head + data
