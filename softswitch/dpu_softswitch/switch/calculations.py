"""Calculations (hashes over fields, as bmv2's BufBuilder lays their input out) and the checksums
v1model verifies after the parser and updates before the deparser."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ProgramError, UnsupportedConstruct
from ..hashes import HashFn, algorithm
from .expressions import Expressions
from .loader import Objects
from .packet import Expr, Packet, Stmt


class Calculations:
    """The named calculations of one program, compiled on demand."""

    def __init__(self, objs: Objects) -> None:
        self.layout = objs.layout
        self.calcs = objs.calcs

    def calculation(self, name: Any, where: str) -> Callable[[Packet], int]:
        """Compile a named calculation: its input as bmv2's BufBuilder lays it out, then its algorithm."""
        calc = self.calcs.get(name) if isinstance(name, str) else None
        if calc is None:
            raise ProgramError(f"bmv2 JSON: unknown calculation {name!r} in {where}")
        here = f"calculation {name} in {where}"
        return calc_fn(self.items(calc.get("input", []), here), self.hash_fn(calc.get("algo"), here))

    @staticmethod
    def hash_fn(algo: Any, where: str) -> HashFn:
        """The hash algorithm a calculation or selector names."""
        fn = algorithm(algo) if isinstance(algo, str) else None
        if fn is None:
            raise UnsupportedConstruct(f"hash algorithm {algo}", where)
        return fn

    def items(self, inputs: list[dict[str, Any]], where: str) -> list[tuple[int, int, int, int]]:
        """A calculation's input as (field index or -1, width, header index or -1, constant) items; a varbit
        field's width is -1 - its width slot, read per packet."""
        layout = self.layout
        items: list[tuple[int, int, int, int]] = []

        def width(i: int) -> int:
            slot = layout.vl_width.get(i)
            return layout.field_width[i] if slot is None else -1 - slot

        for item in inputs:
            kind = item.get("type")
            if kind == "field":
                i = layout.field(item["value"], where)
                items.append((i, width(i), layout.field_header[i], 0))
            elif kind == "header":
                h = layout.header(item["value"], where)
                items += [(h.base + j, width(h.base + j), h.index, 0) for j in range(len(h.widths))]
            elif kind == "hexstr":
                items.append((-1, int(item["bitwidth"]), -1, int(item["value"], 16)))
            else:
                raise UnsupportedConstruct(f"calculation input {kind}", where)
        return items


def calc_fn(items: list[tuple[int, int, int, int]], fn: Callable[[bytes], int]) -> Callable[[Packet], int]:
    """A function computing `fn` over a packet's `items`."""
    if any(w < 0 for _, w, _, _ in items):
        return _calc_fn_varbit(items, fn)

    # bmv2 packs the inputs bit by bit, skips fields of invalid headers, and pads the last byte
    # with zeros at its tail.
    def compute(p: Packet) -> int:
        f, v = p.f, p.v
        value = nbits = 0
        for i, w, h, c in items:
            if i < 0:
                value = (value << w) | c
            elif v[h]:
                value = (value << w) | f[i]
            else:
                continue
            nbits += w
        pad = -nbits % 8
        return fn((value << pad).to_bytes((nbits + pad) // 8, "big"))

    return compute


def _calc_fn_varbit(items: list[tuple[int, int, int, int]], fn: Callable[[bytes], int]) -> Callable[[Packet], int]:
    """calc_fn over items with varbit fields, each at its width for the packet (bmv2's Field::get_nbits)."""

    def compute(p: Packet) -> int:
        f, v = p.f, p.v
        value = nbits = 0
        for i, w, h, c in items:
            if i >= 0 and not v[h]:
                continue
            if w < 0:
                w = f[-1 - w]
            value = (value << w) | (c if i < 0 else f[i])
            nbits += w
        pad = -nbits % 8
        return fn((value << pad).to_bytes((nbits + pad) // 8, "big"))

    return compute


def load_checksums(objs: Objects, exprs: Expressions, calcs: Calculations) -> tuple[Stmt, Stmt]:
    """The program's checksums as (verify all, update all) statements."""
    verifies: list[Stmt] = []
    updates: list[Stmt] = []
    cerr = objs.sm.get("checksum_error", -1)
    layout = objs.layout
    for ck in objs.section("checksums"):
        where = f"checksum {ck.get('name')}"
        if ck.get("type", "generic") != "generic":
            raise UnsupportedConstruct(f"checksum type {ck.get('type')}", where)
        compute = calcs.calculation(ck.get("calculation"), where)
        target = layout.field(ck["target"], where)
        target_header = layout.field_header[target]
        cond = exprs.expr(ck["if_cond"], where) if ck.get("if_cond") else None
        if ck.get("verify", True):
            verifies.append(_verify_stmt(compute, target, target_header, cond, cerr))
        if ck.get("update", True):
            updates.append(_update_stmt(compute, target, (1 << layout.field_width[target]) - 1, cond))

    def run_all(stmts: list[Stmt]) -> Stmt:
        def run(p: Packet, ad: list[int]) -> None:
            for s in stmts:
                s(p, ad)

        return run

    return run_all(verifies), run_all(updates)


def _verify_stmt(compute: Callable[[Packet], int], target: int, th: int, cond: Expr | None, cerr: int) -> Stmt:
    # bmv2 skips the verification when the target field's header is invalid or the condition is false.
    def verify(p: Packet, ad: list[int]) -> None:
        if p.v[th] and (cond is None or cond(p, ad)) and compute(p) != p.f[target] and cerr >= 0:
            p.f[cerr] = 1

    return verify


def _update_stmt(compute: Callable[[Packet], int], target: int, mask: int, cond: Expr | None) -> Stmt:
    def update(p: Packet, ad: list[int]) -> None:
        if cond is None or cond(p, ad):
            p.f[target] = compute(p) & mask

    return update
