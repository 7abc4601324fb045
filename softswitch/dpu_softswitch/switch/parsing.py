"""The parser: its states, transitions and ops as closures, and the state machine that runs them.

The generated-source backend (codegen) writes the parser as one function with its states inline
when it can; it cannot for loops (header stacks parsed one element per pass through a state), and
then `interpret` runs the closures here. Generated code also calls these closures for the ops and
select keys it does not write inline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ProgramError, UnsupportedConstruct
from ..externs import ValueSet
from .actions import Primitives
from .expressions import Expressions
from .layout import HeaderLayout
from .loader import Objects
from .packet import NO_STACKS, Expr, Packet, PacketAbort, ParserError

INT_MAX = (1 << 31) - 1
ParseFn = Callable[[Packet, bytes], bool]
StateFn = Callable[[Packet, bytes, int], tuple[str | None, int]]
OpFn = Callable[[Packet, bytes, int], int]
# (0, value, mask, next, None) for a constant case, (1, None, mask, next, set) for a value set.
Transition = tuple[int, int | None, int, str | None, ValueSet | None]


@dataclass
class ParserDef:
    """The program's one parser: its JSON, start state, error codes and states as closures."""

    doc: dict[str, Any]
    init: str | None
    too_short: int  # the PacketTooShort error code
    perr: int  # standard_metadata.parser_error's index, or -1
    states: dict[str, StateFn]


class Parsing:
    """The parser compiler of one program."""

    def __init__(self, objs: Objects, exprs: Expressions, prims: Primitives) -> None:
        self.objs = objs
        self.layout = objs.layout
        self.exprs = exprs
        self.prims = prims

    def load(self) -> ParserDef:
        """The program's parser, checked, with every state compiled into a closure."""
        parsers = self.objs.section("parsers")
        if len(parsers) != 1:
            raise ProgramError(f"bmv2 JSON: expected one parser, found {len(parsers)}")
        pdef = parsers[0]
        too_short = self.objs.errors.get("PacketTooShort", 1)
        perr = self.objs.sm.get("parser_error", -1)
        states: dict[str, StateFn] = {}
        for st in pdef.get("parse_states", []):
            states[st["name"]] = self._state(st, too_short, perr)
        init = pdef.get("init_state")
        if init not in states:
            raise ProgramError(f"bmv2 JSON: parser init_state {init!r} is not a state")
        for st in pdef.get("parse_states", []):
            for t in st.get("transitions", []):
                if t.get("next_state") is not None and t["next_state"] not in states:
                    raise ProgramError(f"bmv2 JSON: parser state {st['name']} goes to unknown {t['next_state']!r}")
        return ParserDef(pdef, init, too_short, perr, states)

    def _state(self, st: dict[str, Any], too_short: int, perr: int) -> StateFn:
        where = f"parser state {st.get('name')}"
        ops = [self.op(op, where, too_short) for op in st.get("parser_ops", [])]
        keys = [self.transition_key(k, where) for k in st.get("transition_key", [])]
        transitions = [self.transition(t, where) for t in st.get("transitions", [])]
        # bmv2 builds the select key byte-wise: each component padded to whole bytes, concatenated;
        # a value set is matched on the components concatenated bit by bit ("compressed").
        padded = [(fn, (w + 7) // 8 * 8) for fn, w in keys]
        compressed = [(fn, w) for fn, w in keys]
        need_compressed = any(t[0] == 1 for t in transitions)

        if not transitions:

            def state_no_select(p: Packet, data: bytes, off: int) -> tuple[str | None, int]:
                for op in ops:
                    off = op(p, data, off)
                return None, off

            return state_no_select

        if not need_compressed:
            cases = [(value, mask, nxt) for _, value, mask, nxt, _ in transitions]

            def state_select(p: Packet, data: bytes, off: int) -> tuple[str | None, int]:
                for op in ops:
                    off = op(p, data, off)
                key = 0
                for fn, width in padded:
                    key = (key << width) | fn(p, data, off)
                for value, mask, nxt in cases:
                    if value is None or key & mask == value:
                        return nxt, off
                return None, off  # no match: bmv2 accepts

            return state_select

        def state(p: Packet, data: bytes, off: int) -> tuple[str | None, int]:
            for op in ops:
                off = op(p, data, off)
            key = ckey = 0
            for fn, width in padded:
                key = (key << width) | fn(p, data, off)
            for fn, width in compressed:
                ckey = (ckey << width) | fn(p, data, off)
            for kind, value, mask, nxt, vset in transitions:
                if kind == 0:
                    if value is None or key & mask == value:
                        return nxt, off
                elif vset is not None and vset.matches(ckey, mask):
                    return nxt, off
            return None, off  # no match: bmv2 accepts

        return state

    def transition_key(self, k: dict[str, Any], where: str) -> tuple[OpFn, int]:
        """A select key component as a function of (packet, data, offset), and its width."""
        kind = k.get("type")
        if kind == "field":
            i = self.layout.field(k["value"], where)
            return (lambda p, data, off: p.f[i]), self.layout.field_width[i]
        if kind == "stack_field":
            loc, width = self.exprs.stack_field_loc(k["value"], where)
            return (lambda p, data, off: p.f[loc(p, [])]), width
        if kind == "union_stack_field":
            return self._union_stack_field(k["value"], where)
        if kind == "lookahead":
            bit_off, width = int(k["value"][0]), int(k["value"][1])
            # bmv2 peeks without a length check; bytes past the end read as zero here.
            return peek(bit_off, width, check=None), width
        raise UnsupportedConstruct(f"transition key type {kind}", where)

    def transition(self, t: dict[str, Any], where: str) -> Transition:
        """(0, value, mask, next, None) for a constant case, (1, None, mask, next, set) for a value set."""
        ttype, nxt = t.get("type", "hexstr"), t.get("next_state")
        mask = int(t["mask"], 16) if t.get("mask") else -1
        if ttype == "default" or (ttype == "hexstr" and t.get("value") == "default"):
            return 0, None, 0, nxt, None
        if ttype == "hexstr":
            value = int(t["value"], 16)
            return 0, value & mask, mask, nxt, None
        if ttype == "parse_vset":
            vset = self.objs.vsets.get(str(t.get("value")))
            if vset is None:
                raise ProgramError(f"bmv2 JSON: unknown value set {t.get('value')!r} in {where}")
            return 1, None, mask, nxt, vset
        raise UnsupportedConstruct(f"transition type {ttype}", where)

    def op(self, op: dict[str, Any], where: str, too_short: int) -> OpFn:
        """A parser op as a function of (packet, data, offset) returning the new offset."""
        kind = op.get("op")
        params = op.get("parameters", [])
        layout = self.layout
        if kind == "advance":
            if len(params) != 1 or params[0].get("type") not in ("hexstr", "field", "expression"):
                raise UnsupportedConstruct("advance without one hexstr, field or expression", where)
            return self._advance(self.exprs.expr(params[0], where), too_short)
        if kind in ("extract", "extract_VL"):
            return self._extract_op(params, kind == "extract_VL", where, too_short)
        if kind == "set":
            if params[1].get("type") == "lookahead":
                i = layout.field(params[0].get("value"), where)
                bit_off, width = int(params[1]["value"][0]), int(params[1]["value"][1])
                look = peek(bit_off, width, check=too_short)
                fmask = (1 << layout.field_width[i]) - 1

                def set_lookahead(p: Packet, data: bytes, off: int) -> int:
                    p.f[i] = look(p, data, off) & fmask
                    return off

                return set_lookahead
            stmt = self.prims.primitive({"op": "assign", "parameters": params}, where)

            def set_(p: Packet, data: bytes, off: int) -> int:
                stmt(p, [])
                return off

            return set_
        if kind == "verify":
            cond = self.exprs.expr(params[0], where)
            code = self.exprs.expr(params[1], where)

            def verify(p: Packet, data: bytes, off: int) -> int:
                if not cond(p, []):
                    raise ParserError(code(p, []), off)
                return off

            return verify
        if kind == "primitive":
            stmt = self.prims.primitive(params[0], where)

            def primitive(p: Packet, data: bytes, off: int) -> int:
                stmt(p, [])
                return off

            return primitive
        raise UnsupportedConstruct(f"parser op {kind}", where)

    def _extract_op(self, params: list[Any], vl: bool, where: str, too_short: int) -> OpFn:
        """extract and extract_VL into a header, a stack's next element or a union stack's next union's member."""
        layout = self.layout
        ptype = params[0].get("type") if params else None
        if ptype == "regular":
            headers, k = [layout.header(params[0]["value"], where)], -1
        elif ptype == "stack":
            st = layout.stack(params[0]["value"], where)
            headers, k = st.elements, st.index
        elif ptype == "union_stack":
            name, member = params[0]["value"]
            ust = layout.union_stack(name, where)
            headers, k = [u[layout.union_member(ust, member, where)] for u in ust.unions], ust.index
        else:
            raise UnsupportedConstruct(f"extract of {ptype}", where)
        if headers[0].vl >= 0 and not vl:  # bmv2 refuses it (P4Objects::init_parsers): a varbit needs extract_VL
            raise ProgramError(f"bmv2 JSON: 'extract' of varbit header {headers[0].name!r} in {where}")
        if vl and (headers[0].vl < 0 or len(params) != 2 or params[1].get("type") != "expression"):
            raise ProgramError(f"bmv2 JSON: extract_VL needs a varbit header and a length expression in {where}")
        if not vl:
            return self._extract(headers[0], too_short) if k < 0 else self._extract_next(headers, k, too_short)
        length = self.exprs.expr(params[1]["value"], where)
        steps = [self._vl_step(h, too_short) for h in headers]
        if k < 0:
            step = steps[0]
            return lambda p, data, off: step(p, data, off, length(p, NO_STACKS))
        out_of_bounds, size = self.objs.errors.get("StackOutOfBounds", 3), len(steps)

        # bmv2's ParserOpExtractStack and ParserOpExtractUnionStack with a length: a full stack first.
        def extract_next_vl(p: Packet, data: bytes, off: int) -> int:
            n = p.stk[k]
            if n >= size:
                raise ParserError(out_of_bounds, off)
            end = steps[n](p, data, off, length(p, NO_STACKS))
            p.stk[k] = n + 1
            return end

        return extract_next_vl

    def _union_stack_field(self, value: Any, where: str) -> tuple[OpFn, int]:
        """A field of a member of a union stack's last extracted union, as a parser's transition key."""
        layout = self.layout
        ust = layout.union_stack(value[0], where)
        m = layout.union_member(ust, value[1], where)
        j = layout.field_offset(ust.unions[0][m], value[2], where)
        fields = [u[m].base + j for u in ust.unions]
        k = ust.index

        def key(p: Packet, data: bytes, off: int) -> int:
            n = p.stk[k]
            if n == 0:  # bmv2 asserts on an empty stack's last element; this target drops the packet
                raise PacketAbort(f"{ust.name}.last of an empty union stack")
            return p.f[fields[n - 1]]

        return key, ust.unions[0][m].widths[j]

    def _extract(self, h: HeaderLayout, too_short: int) -> OpFn:
        nbytes, base, hidx = h.nbytes, h.base, h.index
        peers = self.layout.union_peers.get(hidx, ())
        shifts = []
        pos = sum(h.widths)
        for w in h.widths:
            pos -= w
            shifts.append((pos, (1 << w) - 1))

        # The unpacking is inlined (not _unpacker's closure): this is the hottest parser path.
        def extract(p: Packet, data: bytes, off: int) -> int:
            end = off + nbytes
            if end > len(data):
                raise ParserError(too_short, off)
            value = int.from_bytes(data[off:end], "big")
            f = p.f
            for j, (sh, m) in enumerate(shifts):
                f[base + j] = (value >> sh) & m
            p.v[hidx] = True
            for k in peers:
                p.v[k] = False
            return end

        return extract

    def _advance(self, amount: Expr, too_short: int) -> OpFn:
        """bmv2's ParserOpAdvance: skip `amount` bits, which leave the packet with the parsed headers."""
        invalid = self.objs.errors.get("ParserInvalidArgument", 6)

        def advance(p: Packet, data: bytes, off: int) -> int:
            nbits = amount(p, NO_STACKS)
            if nbits < 0:  # bmv2 asserts (p4c types the amount bit<32>); this target drops the packet
                raise PacketAbort(f"advance by {nbits} bits")
            if nbits % 8:
                raise ParserError(invalid, off)
            if len(data) - off < nbits // 8:
                raise ParserError(too_short, off)
            return off + nbits // 8

        return advance

    def _vl_step(self, h: HeaderLayout, too_short: int) -> Callable[[Packet, bytes, int, int], int]:
        """bmv2's extract_VL (parser.cpp): header h with its varbit field `nbits` long, errors checked in
        bmv2's order; returns the new offset."""
        errors = self.objs.errors
        invalid, header_short = errors.get("ParserInvalidArgument", 6), errors.get("HeaderTooShort", 4)
        base, hidx, slot, fixed = h.base, h.index, h.vl_slot, h.nbytes
        peers = self.layout.union_peers.get(hidx, ())
        before, vl = h.widths[: h.vl], h.vl
        after = [(h.base + j, w) for j, w in enumerate(h.widths) if j > vl]
        after_bits = sum(w for _, w in after)

        def extract_vl(p: Packet, data: bytes, off: int, nbits: int) -> int:
            f = p.f
            # bmv2 reads the length as a C int (Data::get<int>, boost's convert_to, which saturates): a
            # width past INT_MAX is no multiple of 8. A negative one, which p4c's bit<32> rules out and
            # bmv2 would turn into a size_t, is refused here too (a deviation).
            nbits = min(nbits, INT_MAX)
            if nbits % 8 or nbits < 0:
                raise ParserError(invalid, off)
            # bmv2 counts the header's current size (the varbit's width from an earlier extract or
            # assignment of this packet included, not only the fixed fields) plus the new width.
            need = fixed + f[slot] // 8 + nbits // 8
            if len(data) - off < need:
                raise ParserError(too_short, off)
            if need > h.max_bytes:
                raise ParserError(header_short, off)
            end = off + fixed + nbits // 8
            value = int.from_bytes(data[off:end], "big")
            pos = (end - off) * 8
            for j, w in enumerate(before):
                pos -= w
                f[base + j] = (value >> pos) & ((1 << w) - 1)
            f[base + vl] = (value >> after_bits) & ((1 << nbits) - 1)
            pos = after_bits
            for i, w in after:
                pos -= w
                f[i] = (value >> pos) & ((1 << w) - 1)
            f[slot] = nbits
            p.v[hidx] = True
            for k in peers:
                p.v[k] = False
            return end

        return extract_vl

    def _extract_next(self, headers: list[HeaderLayout], k: int, too_short: int) -> OpFn:
        """Extract into the next element of a stack (`headers`: that element's header, by index)."""
        out_of_bounds = self.objs.errors.get("StackOutOfBounds", 3)
        peers_of = self.layout.union_peers
        elems = [(e.index, e.nbytes, _unpacker(e), peers_of.get(e.index, ())) for e in headers]
        size = len(elems)

        def extract_next(p: Packet, data: bytes, off: int) -> int:
            n = p.stk[k]
            if n >= size:
                raise ParserError(out_of_bounds, off)
            hidx, nbytes, unpack, peers = elems[n]
            end = off + nbytes
            if end > len(data):
                raise ParserError(too_short, off)
            unpack(p, data, off)
            p.v[hidx] = True
            for j in peers:
                p.v[j] = False
            p.stk[k] = n + 1
            return end

        return extract_next


def interpret(pd: ParserDef) -> ParseFn:
    """The parser as a state machine over the state closures."""
    init, states, perr = pd.init, pd.states, pd.perr

    def parse(p: Packet, data: bytes) -> bool:
        state: str | None = init
        off = 0
        try:
            while state is not None:
                state, off = states[state](p, data, off)
        except ParserError as err:
            if perr >= 0:
                p.f[perr] = err.code
            p.payload, p.poff = data, err.offset
            return False
        p.payload, p.poff = data, off
        return True

    return parse


def _unpacker(h: HeaderLayout) -> Callable[[Packet, bytes, int], None]:
    """Write header h's fields from data[off:off + nbytes] (the caller checked the length)."""
    nbytes, base = h.nbytes, h.base
    shifts = []
    pos = sum(h.widths)
    for w in h.widths:
        pos -= w
        shifts.append((pos, (1 << w) - 1))

    def unpack(p: Packet, data: bytes, off: int) -> None:
        value = int.from_bytes(data[off : off + nbytes], "big")
        f = p.f
        for j, (sh, m) in enumerate(shifts):
            f[base + j] = (value >> sh) & m

    return unpack


def peek(bit_off: int, width: int, check: int | None) -> OpFn:
    """The `width` bits at `bit_off` bits past the parser's offset; with `check`, PacketTooShort as bmv2's
    ParserOpSet<ParserLookAhead> (which counts only the looked-at bytes, not the offset)."""
    first, skip = bit_off // 8, bit_off % 8
    span = (skip + width + 7) // 8
    nbytes = (width + 7) // 8
    drop = span * 8 - skip - width
    mask = (1 << width) - 1

    def peek(p: Packet, data: bytes, off: int) -> int:
        if check is not None and len(data) - off < nbytes:
            raise ParserError(check, off)
        chunk = data[off + first : off + first + span]
        return (int.from_bytes(chunk.ljust(span, b"\0"), "big") >> drop) & mask

    return peek
