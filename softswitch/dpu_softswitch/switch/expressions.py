"""bmv2 JSON expressions and operands, compiled to Python source over a program's Layout.

An expression tree becomes the source of one Python expression over `f` (the packet's fields), `v`
(header validity), `p` (the packet) and `ad` (action data), so that evaluating it costs one call, not
one closure call per node. What cannot be written inline (a header stack's `last`, an index into a
stack) is a closure the source calls by name. The helpers at the bottom compile such source once per
distinct text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import CodeType
from typing import Any

from ..errors import ProgramError, UnsupportedConstruct
from ..externs import Clock
from .layout import HeaderLayout, Layout
from .packet import NO_STACKS, Expr, Packet, PacketAbort, ParserError

COMPARE = {"==", "!=", ">", ">=", "<", "<="}


class Expressions:
    """The expression compiler of one program."""

    def __init__(self, layout: Layout, clock: Clock) -> None:
        self.layout = layout
        self.clock = clock

    def expr(self, node: Any, where: str) -> Expr:
        """Compile an expression node into one Python function returning an int (booleans as 0/1).

        The whole expression tree becomes the source of a single function, so evaluating it costs one
        call rather than one closure call per node; what cannot be written inline (stack lookups)
        is a closure the source calls by name.
        """
        env = self.env()
        code = self.src(node, where, env)
        return compile_fn("expr", "p, ad", ["f = p.f", "v = p.v", f"return {code}"], env)  # type: ignore[no-any-return]

    def const(self, node: Any, where: str) -> int:
        """The value of an expression that must be a compile-time constant (a count, a field list id)."""
        env = self.env()
        try:
            return int(eval(self.src(node, where, env), env))  # our own source
        except NameError:
            raise ProgramError(f"bmv2 JSON: expected a constant in {where}") from None

    def env(self) -> dict[str, Any]:
        """A fresh namespace for generated source, holding the helpers it may call."""
        return {
            "_div": _div,
            "_mod": _mod,
            "_PA": PacketAbort,
            "_PE": ParserError,
            "_now": self.clock.now_us,
            "_NOAD": NO_STACKS,
        }

    def src(self, node: Any, where: str, env: dict[str, Any]) -> str:
        """An expression's source."""
        return self.srcb(node, where, env)[0]

    def srcb(self, node: Any, where: str, env: dict[str, Any]) -> tuple[str, int | None]:
        """An expression's source and a bound on its value's bit length (None: unknown, maybe negative).

        The bound lets generated code leave out masks that cannot change the value (p4c's casts).
        """
        if not isinstance(node, dict) or "type" not in node:
            raise ProgramError(f"bmv2 JSON: malformed expression {node!r} in {where}")
        kind: str = node["type"]
        value: Any = node.get("value")
        layout = self.layout
        if kind == "field":
            if isinstance(value, list) and len(value) == 2 and value[1] == "$valid$":
                return f"(1 if v[{layout.header(value[0], where).index}] else 0)", 1
            i = layout.field(value, where)
            return self._read(f"f[{i}]", i), layout.field_width[i] if i not in layout.signed else None
        if kind == "hexstr":
            n = int(value, 16)
            return repr(n), (n.bit_length() if n >= 0 else None)
        if kind == "bool":
            return ("1" if value else "0"), 1
        if kind in ("runtime_data", "local"):  # "local": an action parameter inside an expression
            return f"ad[{int(value)}]", None
        if kind == "header":
            return f"(1 if v[{layout.header(value, where).index}] else 0)", 1
        if kind == "stack_field":
            loc, width = self.stack_field_loc(value, where)
            st = layout.stack(value[0], where)
            first = st.elements[0].base + layout.field_offset(st.elements[0], value[1], where)
            return self._read(f"f[{bind(env, loc)}(p, ad)]", first), width if first not in layout.signed else None
        if kind == "expression":
            # p4c sometimes wraps an expression node in another one.
            if isinstance(value, dict) and "op" not in value:
                return self.srcb(value, where, env)
            return self._op_srcb(value, where, env)
        raise UnsupportedConstruct(f"expression type {kind}", where)

    def _op_srcb(self, node: dict[str, Any], where: str, env: dict[str, Any]) -> tuple[str, int | None]:
        op = node.get("op")
        left_node, right_node = node.get("left"), node.get("right")
        no_nested_runtime_data((left_node, right_node, node.get("cond")), where)

        def sub(n: Any) -> tuple[str, int | None]:
            return self.srcb(n, where, env)

        if op in ("?", "?:"):  # bmv2 JSON's conditional operator is "?"
            (a, ab), (b, bb) = sub(left_node), sub(right_node)
            return f"({a} if {sub(node['cond'])[0]} else {b})", _both(max, ab, bb)
        if op == "valid":
            return sub(right_node)
        if op == "valid_union":
            valid = " or ".join(f"v[{h.index}]" for h in self.layout.union(right_node, where))
            return f"(1 if {valid} else 0)", 1
        if op == "access_field":
            const, dyn, width = self.lvalue({"type": "expression", "value": node}, where)
            hdr, _ = self.header_ref(node["left"], where)
            first = hdr.base + int(node["right"])  # a stack's elements share their type, signedness included
            read = self._read(f"f[{const}]" if dyn is None else f"f[{bind(env, dyn)}(p, ad)]", first)
            return read, width if first not in self.layout.signed else None
        if op in ("last_stack_index", "size_stack"):
            k = self.layout.stack(right_node.get("value") if isinstance(right_node, dict) else None, where).index
            # bmv2's SIZE_STACK is the stack's count (its next index), not its depth
            return (f"(p.stk[{k}] - 1)" if op == "last_stack_index" else f"p.stk[{k}]"), None
        if op in ("d2b", "b2d"):
            a, ab = sub(right_node)
            return (a, 1) if ab is not None and ab <= 1 else (f"(1 if {a} else 0)", 1)  # 0 or 1 already
        if op == "not":
            return f"(0 if {sub(right_node)[0]} else 1)", 1
        if op == "~" and left_node is None:
            return f"(~{sub(right_node)[0]})", None
        if op == "-" and left_node is None:
            return f"(-{sub(right_node)[0]})", None
        if op == "two_comp_mod":
            width = int(eval(sub(right_node)[0], {}))  # a constant in our own source
            mask, sign = (1 << width) - 1, 1 << (width - 1)
            return f"((({sub(left_node)[0]} & {mask}) ^ {sign}) - {sign})", None
        if op in ("usat_cast", "sat_cast"):  # bmv2's Data::usat_cast and sat_cast: |+| and |-| clamp
            width = int(eval(sub(right_node)[0], {}))  # a constant in our own source
            lo, hi = (0, (1 << width) - 1) if op == "usat_cast" else (-(1 << (width - 1)), (1 << (width - 1)) - 1)
            return f"min(max({sub(left_node)[0]}, {lo}), {hi})", (width if op == "usat_cast" else None)
        template = _BINARY.get(op or "")
        if template is None:
            raise UnsupportedConstruct(f"operator {op}", where)
        (a, ab), (b, bb) = sub(left_node), sub(right_node)
        if op == "&":  # a mask wider than the other operand's value changes nothing
            if _is_mask(b) and ab is not None and ab <= int(b).bit_length():
                return a, ab
            if _is_mask(a) and bb is not None and bb <= int(a).bit_length():
                return b, bb
        return template.format(a=a, b=b), _bits(op or "", ab, bb, b)

    def _read(self, src: str, i: int) -> str:
        """A read of field i's slot `src` as bmv2's expressions see it: an int<N> field as a signed value."""
        if i not in self.layout.signed:
            return src
        sign = 1 << (self.layout.field_width[i] - 1)
        return f"(({src} ^ {sign}) - {sign})"

    def cond_src(self, node: Any, where: str, env: dict[str, Any]) -> str:
        """Source whose truth is a boolean expression's (no 0/1 conversion where a bool will do)."""
        if isinstance(node, dict) and node.get("type") == "expression":
            value = node.get("value") if isinstance(node.get("value"), dict) else {}
            assert isinstance(value, dict)
            if value and "op" not in value:
                return self.cond_src(value, where, env)
            op = value.get("op")
            if op in COMPARE:
                no_nested_runtime_data((value["left"], value["right"]), where)
                a, b = self.src(value["left"], where, env), self.src(value["right"], where, env)
                return f"({a} {op} {b})"
            if op in ("and", "or"):
                a, b = self.cond_src(value["left"], where, env), self.cond_src(value["right"], where, env)
                return f"({a} {op} {b})"
            if op == "not":
                return f"(not {self.cond_src(value['right'], where, env)})"
            if op in ("d2b", "valid"):
                return self.cond_src(value["right"], where, env)
        if isinstance(node, dict) and node.get("type") in ("field", "header"):
            ref = node.get("value")
            if node["type"] == "header":
                return f"v[{self.layout.header(ref, where).index}]"
            if isinstance(ref, list) and len(ref) == 2 and ref[1] == "$valid$":
                return f"v[{self.layout.header(ref[0], where).index}]"
        return self.src(node, where, env)

    # ---------------------------------------------------------------- operands (header stacks included)

    def stack_field_loc(self, value: Any, where: str) -> tuple[Callable[[Packet, list[int]], int], int]:
        """Where `stack.last.field` lives for a packet, and its width."""
        st = self.layout.stack(value[0], where)
        j = self.layout.field_offset(st.elements[0], value[1], where)
        bases = [e.base + j for e in st.elements]
        k = st.index

        def loc(p: Packet, ad: list[int]) -> int:
            n = p.stk[k]
            if n == 0:  # bmv2 asserts "stack empty"; this target drops the packet instead
                raise PacketAbort(f"{st.name}.last of an empty stack")
            return bases[n - 1]

        return loc, st.elements[0].widths[j]

    def header_ref(self, node: Any, where: str) -> tuple[HeaderLayout, Callable[[Packet, list[int]], int] | None]:
        """A header operand: (its layout, None) when fixed; for stack[i], (an element, closure giving the index)."""
        if isinstance(node, dict) and node.get("type") == "header":
            return self.layout.header(node.get("value"), where), None
        value = node.get("value") if isinstance(node, dict) and node.get("type") == "expression" else None
        if isinstance(value, dict) and value.get("type") == "expression":
            value = value.get("value")
        # "dereference_stack": bmv2's older name for the same opcode (ExprOpcodesMap).
        if not isinstance(value, dict) or value.get("op") not in ("dereference_header_stack", "dereference_stack"):
            raise UnsupportedConstruct(f"header operand {node!r}", where)
        st = self.layout.stack(value["left"].get("value"), where)
        no_nested_runtime_data((value["right"],), where)
        idx = self.expr(value["right"], where)
        indexes = [e.index for e in st.elements]
        n = len(indexes)

        def deref(p: Packet, ad: list[int]) -> int:
            i = idx(p, ad)
            if i >= n:  # bmv2's elements.at() throws (and simple_switch stops); this target drops the packet
                raise PacketAbort(f"index {i} out of bounds of {st.name}")
            return indexes[i]

        return st.elements[0], deref

    def header_choice(
        self, node: Any, where: str
    ) -> tuple[list[HeaderLayout], Callable[[Packet, list[int]], int] | None]:
        """A header-valued operand: the headers it may name, and None when it names one header, else a
        closure giving the header's index for a packet (a stack element by index, or `c ? h1 : h2`,
        which bmv2 evaluates as an expression of header type when the primitive runs)."""
        value = node.get("value") if isinstance(node, dict) and node.get("type") == "expression" else None
        if isinstance(value, dict) and value.get("type") == "expression":  # p4c's wrapper around an expression
            return self.header_choice(value, where)
        if isinstance(value, dict) and value.get("op") in ("?", "?:"):
            cond = self.expr(value.get("cond"), where)
            left, right = self.header_choice(value.get("left"), where), self.header_choice(value.get("right"), where)
            pick_l, pick_r = _header_picker(*left), _header_picker(*right)

            def choose(p: Packet, ad: list[int]) -> int:
                return pick_l(p, ad) if cond(p, ad) else pick_r(p, ad)

            return left[0] + right[0], choose
        h, deref = self.header_ref(node, where)
        return [h], deref

    def lvalue(self, node: Any, where: str) -> tuple[int, Callable[[Packet, list[int]], int] | None, int]:
        """A field operand: (flat index, None, width) when fixed, else (-1, closure giving the index, width)."""
        layout = self.layout
        if isinstance(node, dict) and node.get("type") == "field":
            i = layout.field(node.get("value"), where)
            return i, None, layout.field_width[i]
        if isinstance(node, dict) and node.get("type") == "stack_field":
            loc, width = self.stack_field_loc(node.get("value"), where)
            return -1, loc, width
        value = node.get("value") if isinstance(node, dict) and node.get("type") == "expression" else None
        if isinstance(value, dict) and value.get("type") == "expression":
            value = value.get("value")
        if not isinstance(value, dict) or value.get("op") != "access_field":
            raise UnsupportedConstruct(f"field operand {node!r}", where)
        hdr, deref = self.header_ref(value["left"], where)
        j = int(value["right"])
        if not 0 <= j < len(hdr.widths):
            raise ProgramError(f"bmv2 JSON: field offset {j} outside header {hdr.name!r} in {where}")
        if deref is None:
            return hdr.base + j, None, hdr.widths[j]
        # Every element of a stack has the same type, so field j is at base_of_element + j.
        base_of = {h.index: h.base + j for h in layout.header_list}
        return -1, lambda p, ad: base_of[deref(p, ad)], hdr.widths[j]


def _header_picker(
    headers: list[HeaderLayout], choose: Callable[[Packet, list[int]], int] | None
) -> Callable[[Packet, list[int]], int]:
    if choose is not None:
        return choose
    index = headers[0].index
    return lambda p, ad: index


def no_nested_runtime_data(operands: tuple[Any, ...], where: str) -> None:
    """Refuse what simple_switch refuses to load: an action parameter straight inside an expression."""
    # bmv2's build_expression knows "local" only: p4c 1.2.4 emits "runtime_data" inside an expression
    # for a stack index taken straight from an action parameter, and simple_switch fails to load it.
    for operand in operands:
        if isinstance(operand, dict) and operand.get("type") == "runtime_data":
            raise UnsupportedConstruct("runtime_data inside an expression (bmv2 refuses it too)", where)


# ---------------------------------------------------------------- compiling generated source


@functools.lru_cache(maxsize=8192)
def code(src: str, filename: str, mode: str) -> CodeType:
    """compile(), once per distinct source: the devices of one process that load the same program
    (a lab's or a benchmark's many DPUs) share its code objects and bind them each to their own state."""
    return compile(src, filename, mode)


def compile_fn(name: str, args: str, lines: list[str], env: dict[str, Any]) -> Any:
    """exec one generated function (our own source) in `env` and return it."""
    src = f"def {name}({args}):\n" + "".join(f"    {line}\n" for line in lines)
    exec(code(src, f"<dpu_softswitch {name}>", "exec"), env)
    return env[name]


def bind(env: dict[str, Any], value: Any) -> str:
    """Put a closure into generated code's namespace under a fresh name."""
    name = f"_c{len(env)}"
    env[name] = value
    return name


def masked(src: str, mask: int) -> str:
    """`src & mask`, computed now when `src` names nothing (a constant), else written out."""
    if not code(src, "<dpu_softswitch expression>", "eval").co_names:
        return str(eval(src, {}) & mask)  # our own source, a constant
    return f"{src} & {mask}"


def _div(x: int, y: int) -> int:
    return x // y if y else 0


def _mod(x: int, y: int) -> int:
    return x % y if y else 0


def _both(fn: Callable[[int, int], int], a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else fn(a, b)


def _is_mask(src: str) -> bool:
    """Whether source `src` is a literal 2**k - 1 (k >= 1)."""
    return src.isdigit() and int(src) > 0 and int(src) & (int(src) + 1) == 0


def _bits(op: str, a: int | None, b: int | None, b_code: str) -> int | None:
    """A bound on the bit length of `a op b` from its operands' bounds (None: unknown or maybe negative)."""
    if op in COMPARE or op in ("and", "or"):
        return 1
    if op == "&":
        return _both(min, a, b) if a is not None and b is not None else a if a is not None else b
    if op in ("|", "^"):
        return _both(max, a, b)
    if op == "+":
        return _both(lambda x, y: max(x, y) + 1, a, b)
    if op == "*":
        return _both(lambda x, y: x + y, a, b)
    if op == "<<":
        return a + int(b_code) if a is not None and b is not None and b_code.isdigit() else None
    if op in (">>", "/"):
        return a if b is not None else None
    if op == "%":
        return b if a is not None else None
    return None  # "-": maybe negative


# Source templates of bmv2's binary operators (results are Python ints; comparisons give 0/1).
_BINARY: dict[str, str] = {
    "+": "({a} + {b})",
    "-": "({a} - {b})",
    "*": "({a} * {b})",
    "/": "_div({a}, {b})",
    "%": "_mod({a}, {b})",
    "<<": "({a} << {b})",
    ">>": "({a} >> {b})",
    "&": "({a} & {b})",
    "|": "({a} | {b})",
    "^": "({a} ^ {b})",
    "==": "(1 if {a} == {b} else 0)",
    "!=": "(1 if {a} != {b} else 0)",
    ">": "(1 if {a} > {b} else 0)",
    ">=": "(1 if {a} >= {b} else 0)",
    "<": "(1 if {a} < {b} else 0)",
    "<=": "(1 if {a} <= {b} else 0)",
    "and": "(1 if ({a}) and ({b}) else 0)",
    "or": "(1 if ({a}) or ({b}) else 0)",
}
