"""bmv2's primitives (the statements of actions, and of parser `set` and `primitive` ops) as closures.

These closures are the reference building blocks: the generated-source backend (codegen) writes the
common primitives inline and calls these for the rest (stacks, hashes, clones, dynamic validity),
and an action body with jumps (p4c's lowering of `if` inside an action) runs them in a loop here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ProgramError, UnsupportedConstruct
from .calculations import Calculations
from .expressions import Expressions
from .layout import HeaderLayout
from .loader import Objects
from .packet import DROP_PORT, Expr, Packet, PacketAbort, Stmt

U64 = (1 << 64) - 1


@dataclass
class ActionDef:
    """A compiled action: its name, parameter widths and body."""

    id: int
    name: str
    param_widths: list[int]
    param_names: list[str]
    body: Stmt


class Primitives:
    """The primitive compiler of one program."""

    def __init__(self, objs: Objects, exprs: Expressions, calcs: Calculations) -> None:
        self.objs = objs
        self.layout = objs.layout
        self.sm = objs.sm
        self.exprs = exprs
        self.calcs = calcs

    def primitive(self, prim: dict[str, Any], where: str) -> Stmt:
        """One primitive as a statement closure."""
        op = prim.get("op")
        params = prim.get("parameters", [])
        where = f"{where}: primitive {op}"
        objs, layout, exprs = self.objs, self.layout, self.exprs
        if op == "assign_header" or (op in ("assign", "modify_field") and params[0].get("type") == "header"):
            return self._assign_header(params[0].get("value"), params[1], where)
        if op == "assign_union":
            return self._assign_union(params[0], params[1], where)
        if op in ("assign_header_stack", "assign_union_stack"):
            return self._assign_stack(params[0], params[1], op == "assign_union_stack", where)
        if op == "assign_VL":
            return self._assign_vl(params[0], params[1], where)
        if op in ("assign", "modify_field"):
            dst, src = params
            i, loc, width = exprs.lvalue(dst, where)
            if i == self.sm.get("mcast_grp", -1) >= 0:
                objs.replicates = True
            mask = (1 << width) - 1
            s = exprs.expr(src, where)
            if loc is not None:
                return _assign_at(loc, s, mask)

            def assign(p: Packet, ad: list[int]) -> None:
                p.f[i] = s(p, ad) & mask

            return assign
        if op in ("clone_ingress_pkt_to_egress", "clone_egress_pkt_to_egress", "resubmit", "recirculate"):
            return self._replication_primitive(op, params, where)
        if op == "modify_field_with_hash_based_offset":
            return self._hash_primitive(params, where)
        if op in ("push", "pop"):
            return self._stack_shift(params[0], params[1], op == "push", where)
        if op == "mark_to_drop" or op == "drop":
            es, mg = self.sm["egress_spec"], self.sm.get("mcast_grp", -1)

            def mark_to_drop(p: Packet, ad: list[int]) -> None:
                p.f[es] = DROP_PORT
                if mg >= 0:
                    p.f[mg] = 0

            return mark_to_drop
        if op == "count":
            arr = objs.extern(objs.counters, params[0], where)
            idx = exprs.expr(params[1], where)
            return lambda p, ad: arr.count(idx(p, ad), p.length)
        if op == "execute_meter":
            marr = objs.extern(objs.meters, params[0], where)
            idx = exprs.expr(params[1], where)
            out = layout.field(params[2].get("value"), where)
            omask = (1 << layout.field_width[out]) - 1
            now = objs.clock.now_us

            def execute_meter(p: Packet, ad: list[int]) -> None:
                p.f[out] = marr.execute(idx(p, ad), p.length, now()) & omask

            return execute_meter
        if op == "register_read":
            out = layout.field(params[0].get("value"), where)
            omask = (1 << layout.field_width[out]) - 1
            rarr = objs.extern(objs.registers, params[1], where)
            idx = exprs.expr(params[2], where)

            def register_read(p: Packet, ad: list[int]) -> None:
                p.f[out] = rarr.read(idx(p, ad)) & omask

            return register_read
        if op == "register_write":
            rarr = objs.extern(objs.registers, params[0], where)
            idx = exprs.expr(params[1], where)
            val = exprs.expr(params[2], where)
            return lambda p, ad: rarr.write(idx(p, ad), val(p, ad))
        if op in ("add_header", "setValid", "remove_header", "setInvalid") and params[0].get("type") != "header":
            return self._dyn_validity(params[0], op in ("add_header", "setValid"), where)
        if op in ("add_header", "setValid"):
            h = layout.header(params[0].get("value"), where)
            lo, hi = h.base, h.base + len(h.widths)
            peers = layout.union_peers.get(h.index, ())

            def add_header(p: Packet, ad: list[int]) -> None:
                if not p.v[h.index]:
                    p.f[lo:hi] = [0] * (hi - lo)
                    p.v[h.index] = True
                    for k in peers:
                        p.v[k] = False

            return add_header
        if op in ("remove_header", "setInvalid"):
            hi_ = layout.header(params[0].get("value"), where).index

            def remove_header(p: Packet, ad: list[int]) -> None:
                p.v[hi_] = False

            return remove_header
        if op == "exit":

            def exit_(p: Packet, ad: list[int]) -> None:
                p.exited = True

            return exit_
        if op in ("no_op", "log_msg"):
            return lambda p, ad: None
        if op == "generate_digest":
            lid = self.learn_id(params, where)

            def generate_digest(p: Packet, ad: list[int]) -> None:
                p.learn = lid  # the last call wins, as simple_switch keeps one learn register

            return generate_digest
        if op in ("assert", "assume"):
            cond = exprs.expr(params[0], where)

            def check(p: Packet, ad: list[int]) -> None:
                if not cond(p, ad):
                    raise PacketAbort(f"{op} failed")

            return check
        raise UnsupportedConstruct(f"primitive {op}", where)

    def learn_id(self, params: list[Any], where: str) -> int:
        """generate_digest's learn list id (its first parameter, the receiver, bmv2 ignores)."""
        lid = self.exprs.const(params[1], where) if len(params) == 2 else -1
        if lid not in self.objs.learn_lists:
            raise ProgramError(f"bmv2 JSON: {where} names learn list {lid}, which is not in learn_lists")
        return lid

    def body_with_jumps(self, prims: list[dict[str, Any]], where: str) -> Stmt:
        """An action body run primitive by primitive, following its jumps."""
        # p4c lowers if-statements inside actions to _jump/_jump_if_zero with absolute offsets.
        program: list[tuple[int, Any, Any]] = []
        for prim in prims:
            op = prim.get("op")
            params = prim.get("parameters", [])
            if op == "_jump":
                program.append((1, int(params[0]["value"]), None))
            elif op == "_jump_if_zero":
                program.append((2, int(params[1]["value"]), self.exprs.expr(params[0], where)))
            else:
                program.append((0, self.primitive(prim, where), None))

        def body(p: Packet, ad: list[int]) -> None:
            pc = 0
            while pc < len(program):
                kind, a, cond = program[pc]
                if kind == 0:
                    a(p, ad)
                    if p.exited:
                        return
                    pc += 1
                elif kind == 1 or not cond(p, ad):
                    pc = a
                else:
                    pc += 1

        return body

    def _replication_primitive(self, op: str, params: list[Any], where: str) -> Stmt:
        self.objs.replicates = True
        field_lists = self.objs.field_lists
        if op in ("resubmit", "recirculate"):
            fl = self.exprs.const(params[0], where) if params else 0
            if fl and fl not in field_lists:
                raise ProgramError(f"bmv2 JSON: unknown field list {fl} in {where}")

            def resubmit(p: Packet, ad: list[int]) -> None:
                p.resubmit = fl  # type: ignore[attr-defined]

            def recirculate(p: Packet, ad: list[int]) -> None:
                p.recirc = fl  # type: ignore[attr-defined]

            return resubmit if op == "resubmit" else recirculate
        session = self.exprs.expr(params[0], where)
        fl = self.exprs.const(params[1], where) if len(params) > 1 else 0
        if fl and fl not in field_lists:
            raise ProgramError(f"bmv2 JSON: unknown field list {fl} in {where}")

        def clone(p: Packet, ad: list[int]) -> None:
            p.clone = (session(p, ad), fl)  # type: ignore[attr-defined]  # the last call wins, as in bmv2

        return clone

    def _hash_primitive(self, params: list[Any], where: str) -> Stmt:
        i, loc, width = self.exprs.lvalue(params[0], where)
        mask = (1 << width) - 1
        base = self.exprs.expr(params[1], where)
        compute = self.calcs.calculation(params[2].get("value"), where)
        size = self.exprs.expr(params[3], where)

        # simple_switch: dst = (H(data) % max + base) in uint64 arithmetic, a max of 0 taken as 1.
        def hash_(p: Packet, ad: list[int]) -> None:
            sz = size(p, ad) & U64 or 1
            value = ((compute(p) % sz) + (base(p, ad) & U64)) & U64 & mask
            p.f[loc(p, ad) if loc is not None else i] = value

        return hash_

    def _dyn_validity(self, node: Any, valid: bool, where: str) -> Stmt:
        _, deref = self.exprs.header_ref(node, where)
        assert deref is not None
        spans = {h.index: (h.base, h.base + len(h.widths)) for h in self.layout.header_list}

        def set_validity(p: Packet, ad: list[int]) -> None:
            h = deref(p, ad)
            if valid and not p.v[h]:
                lo, hi = spans[h]
                p.f[lo:hi] = [0] * (hi - lo)  # add_header zeroes an invalid header's fields, as bmv2
            p.v[h] = valid

        return set_validity

    def _assign_header(self, dst_name: str, src: dict[str, Any], where: str) -> Stmt:
        dst = self.layout.header(dst_name, where)
        sources, choose = self.exprs.header_choice(src, where)
        if any(dst.widths != s.widths for s in sources):
            raise ProgramError(f"bmv2 JSON: header assignment between different types in {where}")
        if choose is not None:  # the source is chosen per packet (`c ? h1 : h2`, a stack element)
            return self._assign_chosen_header(dst, choose)
        s = sources[0]
        dlo, slo, n, di = dst.base, s.base, dst.span, dst.index  # a varbit's width slot with its value
        peers = self.layout.union_peers.get(di, ())

        # bmv2's assign_header: an invalid source only invalidates the destination (its fields stay);
        # a valid one makes it valid (invalidating its union peers) and copies every field.
        def assign_header(p: Packet, ad: list[int]) -> None:
            if not p.v[s.index]:
                p.v[di] = False
                return
            p.v[di] = True
            for k in peers:
                p.v[k] = False
            p.f[dlo : dlo + n] = p.f[slo : slo + n]

        return assign_header

    def _assign_chosen_header(self, dst: HeaderLayout, choose: Callable[[Packet, list[int]], int]) -> Stmt:
        """assign_header from a header chosen per packet, with bmv2's rules (see _assign_header)."""
        dlo, n, di = dst.base, dst.span, dst.index
        peers = self.layout.union_peers.get(di, ())
        bases = {h.index: h.base for h in self.layout.header_list}

        def assign_chosen_header(p: Packet, ad: list[int]) -> None:
            si = choose(p, ad)
            if not p.v[si]:
                p.v[di] = False
                return
            p.v[di] = True
            for k in peers:
                p.v[k] = False
            slo = bases[si]
            p.f[dlo : dlo + n] = p.f[slo : slo + n]

        return assign_chosen_header

    def _assign_vl(self, dst: Any, src: Any, where: str) -> Stmt:
        """bmv2's assign_VL (Field::assign_VL): the value and the width, whatever either header's validity."""
        layout = self.layout
        d, s = layout.field(dst.get("value"), where), layout.field(src.get("value"), where)
        ds, ss = layout.vl_width.get(d), layout.vl_width.get(s)
        if ds is None or ss is None or dst.get("type") != "field" or src.get("type") != "field":
            raise UnsupportedConstruct("assign_VL of other than two varbit fields", where)

        def assign_vl(p: Packet, ad: list[int]) -> None:
            f = p.f
            f[d], f[ds] = f[s], f[ss]

        return assign_vl

    def _assign_union(self, dst: Any, src: Any, where: str) -> Stmt:
        """bmv2's assign_union: assign_header member by member, in declaration order."""
        pairs = zip(self.layout.union(dst, where), self.layout.union(src, where), strict=True)
        steps = [self._assign_header(d.name, {"type": "header", "value": s.name}, where) for d, s in pairs]

        def assign_union(p: Packet, ad: list[int]) -> None:
            for step in steps:
                step(p, ad)

        return assign_union

    def _assign_stack(self, dst: Any, src: Any, unions: bool, where: str) -> Stmt:
        """bmv2's assign_header_stack and assign_union_stack: the next index, then assign_header (or
        assign_union, member by member) element by element."""
        layout = self.layout
        names = [n.get("value") if isinstance(n, dict) else None for n in (dst, src)]
        if unions:
            d, s = (layout.union_stack(n, where) for n in names)
            kd, ks, de, se = d.index, s.index, d.unions, s.unions
        else:
            ds, ss = (layout.stack(n, where) for n in names)
            kd, ks, de, se = ds.index, ss.index, [[e] for e in ds.elements], [[e] for e in ss.elements]
        if len(de) != len(se) or any(len(a) != len(b) for a, b in zip(de, se, strict=True)):
            raise ProgramError(f"bmv2 JSON: stack assignment between different stack types in {where}")
        pairs = [(dh, sh) for du, su in zip(de, se, strict=True) for dh, sh in zip(du, su, strict=True)]
        steps = [self._assign_header(dh.name, {"type": "header", "value": sh.name}, where) for dh, sh in pairs]

        def assign_stack(p: Packet, ad: list[int]) -> None:
            p.stk[kd] = p.stk[ks]
            for step in steps:
                step(p, ad)

        return assign_stack

    def _stack_shift(self, stack: Any, count: Any, push: bool, where: str) -> Stmt:
        name = stack.get("value") if isinstance(stack, dict) else None
        if isinstance(stack, dict) and stack.get("type") == "header_union_stack":
            ust = self.layout.union_stack(name, where)
            k, elements = ust.index, ust.unions
            # bmv2 "invalidates" the unions shifted in with HeaderUnion::mark_invalid, which does
            # nothing: they keep what the shift swapped into them, so a union stack rotates.
            invalidate = False
        else:
            st = self.layout.stack(name, where)
            k, elements, invalidate = st.index, [[e] for e in st.elements], True
        num = self.exprs.const(count, where)
        size = len(elements)
        # bmv2's Field::swap_values swaps a varbit's width too: the spans take its slot.
        spans = [[(h.index, h.base, h.base + h.span) for h in e] for e in elements]

        def swap(p: Packet, a: int, b: int) -> None:
            f, v = p.f, p.v
            for (ha, la, ua), (hb, lb, ub) in zip(spans[a], spans[b], strict=True):
                f[la:ua], f[lb:ub] = f[lb:ub], f[la:ua]
                v[ha], v[hb] = v[hb], v[ha]

        def invalid(p: Packet, i: int) -> None:
            if invalidate:
                for h, _, _ in spans[i]:
                    p.v[h] = False

        # bmv2's StackP4_16 (the default, --enable-WP4-16-stacks): the whole stack shifts, the
        # elements shifted in are invalid, and the next index moves by `num` within 0..size.
        def push_front(p: Packet, ad: list[int]) -> None:
            p.stk[k] = min(size, p.stk[k] + num)
            for i in range(size - 1, num - 1, -1):
                swap(p, i, i - num)
            for i in range(min(size, num)):
                invalid(p, i)

        def pop_front(p: Packet, ad: list[int]) -> None:
            p.stk[k] -= min(p.stk[k], num)
            i = 0
            if num < size:
                for i in range(size - num):
                    swap(p, i, i + num)
                i = size - num
            for j in range(i, size):
                invalid(p, j)

        return push_front if push else pop_front


def _assign_at(loc: Callable[[Packet, list[int]], int], s: Expr, mask: int) -> Stmt:
    def assign_at(p: Packet, ad: list[int]) -> None:
        p.f[loc(p, ad)] = s(p, ad) & mask

    return assign_at


def no_action(p: Packet, ad: list[int]) -> None:
    """What a miss without a default entry, or a lookup yielding an empty group, runs: nothing."""
