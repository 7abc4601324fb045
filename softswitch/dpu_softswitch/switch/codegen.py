"""The generated-source backend: actions, pipelines and the parser written out as Python source.

Each is exec'd once at load time, so that a packet runs a few flat functions: expressions inline,
conditionals as `if`, keyless tables as their default action's statements, header fields unpacked in
place. It stands in for the closure interpreter (actions.py, parsing.py, pipeline.py), which stays
the reference: generated code calls its closures for what it does not write inline (stacks, hashes,
clones, value sets), and the interpreter runs what cannot be written out (parser loops, control flow
past `max_lines`, actions with jumps). dpu_softswitch.program chooses between them, part by part.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from ..profiles import NO_ACTION
from .actions import ActionDef, Primitives, no_action
from .expressions import Expressions, bind, code, compile_fn, masked
from .layout import joined, struct_layout
from .loader import Objects
from .packet import DROP_PORT, Packet, Stmt
from .parsing import ParseFn, ParserDef, Parsing
from .pipeline import PipelineDef, TableDef

MAX_INLINE_ACTIONS = 4  # tables with more actions call the action's function instead of inlining all

Emit = Callable[[str, int], None]


class _TooBig(Exception):
    """Generated source would grow past max_lines (or loop): the interpreter runs that part."""


class Codegen:
    """The source generator of one program; `actions` fills up as the program's actions load."""

    def __init__(
        self,
        objs: Objects,
        exprs: Expressions,
        prims: Primitives,
        parsing: Parsing,
        actions: dict[int, ActionDef],
        max_lines: int,
    ) -> None:
        self.objs = objs
        self.layout = objs.layout
        self.sm = objs.sm
        self.exprs = exprs
        self.prims = prims
        self.parsing = parsing
        self.actions = actions
        self.max_lines = max_lines
        self.action_docs: dict[int, dict[str, Any]] = {}

    # ---------------------------------------------------------------- actions

    def action(self, doc: dict[str, Any], where: str) -> Stmt:
        """An action body as one generated function (bodies with jumps keep the interpreter loop)."""
        self.action_docs[int(doc["id"])] = doc
        prims = doc.get("primitives", [])
        if any(p.get("op") in ("_jump", "_jump_if_zero") for p in prims):
            return self.prims.body_with_jumps(prims, where)
        env = self.exprs.env()
        lines = [line for prim in prims for line in self._primitive_src(prim, where, env)]
        return compile_fn("action", "p, ad", ["f = p.f", "v = p.v", *lines], env)  # type: ignore[no-any-return]

    def _primitive_src(self, prim: dict[str, Any], where: str, env: dict[str, Any]) -> list[str]:
        """Source lines for one primitive; `f`, `v`, `p` and `ad` are in scope, `return` means exit."""
        op = prim.get("op")
        params = prim.get("parameters", [])
        here = f"{where}: primitive {op}"
        objs, layout, exprs, sm = self.objs, self.layout, self.exprs, self.sm
        if op in ("assign", "modify_field") and params[0].get("type") != "header":
            i, loc, width = exprs.lvalue(params[0], here)
            if loc is not None:
                return [f"{bind(env, self.prims.primitive(prim, where))}(p, ad)"]
            if i == sm.get("mcast_grp", -1) >= 0:
                objs.replicates = True
            src, bits = exprs.srcb(params[1], here, env)
            if bits is not None and bits <= width:
                return [f"f[{i}] = {src}"]  # a value no wider than the destination needs no mask
            return [f"f[{i}] = {masked(src, (1 << width) - 1)}"]
        if op in ("mark_to_drop", "drop"):
            mg = sm.get("mcast_grp", -1)
            return [f"f[{sm['egress_spec']}] = {DROP_PORT}"] + ([f"f[{mg}] = 0"] if mg >= 0 else [])
        if op in ("add_header", "setValid") and params[0].get("type") == "header":
            h = layout.header(params[0].get("value"), here)
            n = len(h.widths)
            env[f"_Z{n}"] = (0,) * n
            made_valid = [f"v[{h.index}] = True", *layout.peers_src(h)]
            return [f"if not v[{h.index}]:", f"    f[{h.base}:{h.base + n}] = _Z{n}", *("    " + x for x in made_valid)]
        if op in ("remove_header", "setInvalid") and params[0].get("type") == "header":
            return [f"v[{layout.header(params[0].get('value'), here).index}] = False"]
        if op == "exit":
            return ["p.exited = True", "return"]
        if op in ("no_op", "log_msg"):
            return []
        if op == "generate_digest":
            return [f"p.learn = {self.prims.learn_id(params, here)}"]
        # Indexed externs inline their arrays' own bounds rules (see externs.py): out of range, a meter
        # gives green, a counter and a register write do nothing, a register read gives 0. A constant
        # index (a single cell, as most of limiter.p4's registers) is checked here instead.
        if op == "execute_meter":
            marr = objs.extern(objs.meters, params[0], here)
            m, out = bind(env, marr), layout.field(params[2].get("value"), here)
            units = "p.length" if marr.unit == "bytes" else "1"
            lines, cell, ok = _index(exprs.src(params[1], here, env), marr.size)
            color = _or_zero(ok, f"{m}.cells[{cell}].execute({units}, _now())")
            return [*lines, f"f[{out}] = {masked(color, layout.mask(out))}"]
        if op == "count":
            carr = objs.extern(objs.counters, params[0], here)
            c = bind(env, carr)
            lines, cell, ok = _index(exprs.src(params[1], here, env), carr.size)
            return [*lines, *_guarded(ok, f"{c}.packets[{cell}] += 1; {c}.bytes[{cell}] += p.length")]
        if op == "register_read":
            out = layout.field(params[0].get("value"), here)
            rarr = objs.extern(objs.registers, params[1], here)
            lines, cell, ok = _index(exprs.src(params[2], here, env), rarr.size)
            value = _or_zero(ok, f"{bind(env, rarr)}.values[{cell}]")
            return [*lines, f"f[{out}] = {masked(value, layout.mask(out))}"]
        if op == "register_write":
            rarr = objs.extern(objs.registers, params[0], here)
            lines, cell, ok = _index(exprs.src(params[1], here, env), rarr.size)
            value, bits = exprs.srcb(params[2], here, env)
            fits = bits is not None and bits <= rarr.mask.bit_length()
            store = f"{bind(env, rarr)}.values[{cell}] = {'_w' if fits else f'_w & {rarr.mask}'}"
            return [*lines, f"_w = {value}", *_guarded(ok, store)]
        if op in ("assert", "assume"):
            return [f"if not {exprs.cond_src(params[0], here, env)}:", f"    raise _PA({op + ' failed'!r})"]
        return [f"{bind(env, self.prims.primitive(prim, where))}(p, ad)"]

    def _action_lines(self, aid: int, env: dict[str, Any]) -> list[str]:
        """An action's statements for inlining where `ad` holds its data."""
        a = self.action_docs[aid]
        where = f"action {a.get('name')}"
        prims = a.get("primitives", [])
        if any(p.get("op") in ("_jump", "_jump_if_zero") for p in prims):
            lines = [f"{bind(env, self.actions[aid].body)}(p, ad)"]
            return lines + (["if p.exited:", "    return"] if self._exits(aid) else [])
        return [line for prim in prims for line in self._primitive_src(prim, where, env)]

    def _exits(self, aid: int) -> bool:
        return any(p.get("op") == "exit" for p in self.action_docs[aid].get("primitives", []))

    # ---------------------------------------------------------------- pipelines

    def pipeline(self, pd: PipelineDef) -> Callable[[Packet], None] | None:
        """The pipeline as one generated function, or None if its control flow would not fit.

        The graph of tables and conditionals is a DAG; each branching node's branches are written
        inside an `if` up to the node's immediate post-dominator, where they join again, so each
        node is written once for structured control flow (p4c's output) and duplicated otherwise.
        """
        pname, init, tables, conds = pd.name, pd.init, pd.tables, pd.conds
        succ: dict[str, list[str | None]] = {}
        for name, c in conds.items():
            succ[name] = [c.get("true_next"), c.get("false_next")]
        for name, tdef in tables.items():
            if tdef.uses_hit_miss:
                succ[name] = [tdef.next_hit, tdef.next_miss]
            else:
                succ[name] = list(dict.fromkeys(tdef.next_by_action.values())) or [None]
        order = _postorder(init, succ)
        if order is None:
            return None
        ipdom: dict[str | None, str | None] = {}

        def chain(n: str | None) -> list[str | None]:
            out = [n]
            while n is not None:
                n = ipdom[n]
                out.append(n)
            return out

        for n in order:
            distinct = list(dict.fromkeys(succ[n]))
            if len(distinct) == 1:
                ipdom[n] = distinct[0]
            else:
                others = [set(chain(s)) for s in distinct[1:]]
                ipdom[n] = next(x for x in chain(distinct[0]) if all(x in o for o in others))
        env = self.exprs.env()
        env["_A"] = {aid: a.body for aid, a in self.actions.items()}
        env["_A"][NO_ACTION] = no_action
        lines: list[str] = []
        max_lines = self.max_lines

        def emit(text: str, ind: int) -> None:
            if len(lines) > max_lines:
                raise _TooBig
            lines.append("    " * ind + text)

        def region(n: str | None, stop: str | None, ind: int) -> None:
            start = len(lines)
            while n is not None and n != stop:
                join = ipdom[n]
                if n in conds:
                    where = f"conditional {n} in {pname}"
                    emit(f"if {self.exprs.cond_src(conds[n]['expression'], where, env)}:", ind)
                    region(succ[n][0], join, ind + 1)
                    emit("else:", ind)
                    region(succ[n][1], join, ind + 1)
                else:
                    self._table_src(tables[n], env, emit, ind)
                    branches = list(dict.fromkeys(succ[n]))
                    if len(branches) > 1:
                        self._table_branches(tables[n], succ[n], join, ind, emit, region)
                n = join
            if len(lines) == start:
                emit("pass", ind)

        try:
            region(init, None, 0)
        except _TooBig:
            return None
        # `ad` starts empty for inlined actions without parameters whose helpers take it all the same.
        return compile_fn(f"pipeline_{pname}", "p", ["f = p.f", "v = p.v", "ad = _NOAD", *lines], env)  # type: ignore[no-any-return]

    def _table_branches(
        self,
        tdef: TableDef,
        nexts: list[str | None],
        join: str | None,
        ind: int,
        emit: Emit,
        region: Callable[[str | None, str | None, int], None],
    ) -> None:
        """The `if` over a table's hit/miss or the action it ran, each branch up to `join`."""
        if tdef.uses_hit_miss:
            emit("if e is not None:", ind)
            region(nexts[0], join, ind + 1)
            emit("else:", ind)
            region(nexts[1], join, ind + 1)
            return
        groups: dict[str | None, list[int]] = {}
        for aid, nxt in tdef.next_by_action.items():
            groups.setdefault(nxt, []).append(aid)
        items = list(groups.items())
        for k, (nxt, aids) in enumerate(items):
            if k == len(items) - 1:
                emit("else:", ind)
            else:
                emit(f"{'if' if k == 0 else 'elif'} aid in {tuple(aids)!r}:", ind)
            region(nxt, join, ind + 1)

    def _table_src(self, tdef: TableDef, env: dict[str, Any], emit: Emit, ind: int) -> None:
        """A table's application: lookup, direct counter and meter, then its action, inline.

        Afterwards `e` is the entry hit (None on a miss) and `aid` the action run. A keyless table
        with a const default action (p4c's tbl_* for statements outside actions) runs that action's
        statements directly while it holds no entry.
        """
        fast = not tdef.key_names and not tdef.const_entries and tdef.default_const
        fast = fast and tdef.direct_meter is None and tdef.profile is None
        if fast:
            emit(f"if {bind(env, tdef.table.entries)}:", ind)
            self._table_general(tdef, env, emit, ind + 1)
            emit("else:", ind)
            aid = tdef.default_action_id
            emit(f"e = None; aid = {aid}", ind + 1)
            if tdef.default_action_data or self.actions[aid].param_widths:
                emit(f"ad = {bind(env, tdef.default_action_data)}", ind + 1)
            for line in self._action_lines(aid, env):
                emit(line, ind + 1)
        else:
            self._table_general(tdef, env, emit, ind)

    def _table_general(self, tdef: TableDef, env: dict[str, Any], emit: Emit, ind: int) -> None:
        t, d = bind(env, tdef.table), bind(env, tdef)
        emit(f"e = {t}.lookup({_key_src(tdef.key_src)})", ind)
        emit("if e is None:", ind)
        emit(f"aid = {d}.default_action_id; ad = {d}.default_action_data", ind + 1)
        emit("else:", ind)
        if tdef.profile is not None:
            emit(f"aid, ad = {bind(env, tdef.profile.picker())}(p, e.member, e.group)", ind + 1)
        else:
            emit("aid = e.action_id; ad = e.action_data", ind + 1)
        if tdef.with_counters:
            emit("e.packets += 1; e.bytes += p.length", ind + 1)
        dm = tdef.direct_meter
        if dm is not None:
            # bmv2 executes a direct meter only on a hit, before the action, into the meter's result field.
            units = "p.length" if dm.unit == "bytes" else "1"
            omask = (1 << self.layout.field_width[dm.result]) - 1
            emit("m = e.meter", ind + 1)
            emit(f"f[{dm.result}] = (m.execute({units}, _now()) if m is not None else 0) & {omask}", ind + 1)
        aids = list(dict.fromkeys(tdef.action_ids))
        if len(aids) > MAX_INLINE_ACTIONS:
            emit("_A[aid](p, ad)", ind)
            if any(self._exits(a) for a in {*aids, tdef.default_action_id}):
                emit("if p.exited:", ind)
                emit("return", ind + 1)
            return
        for k, aid in enumerate(aids):
            emit(f"{'if' if k == 0 else 'elif'} aid == {aid}:", ind)
            for line in self._action_lines(aid, env) or ["pass"]:
                emit(line, ind + 1)
        # Any other action id (a default no entry names): called, as the interpreter would.
        other = ind + 1 if aids else ind
        if aids:
            emit("else:", ind)
        emit("_A[aid](p, ad)", other)
        emit("if p.exited:", other)
        emit("return", other + 1)

    # ---------------------------------------------------------------- parser

    def parser(self, pd: ParserDef) -> ParseFn | None:
        """The parser as one generated function with its states inline, or None for loops (stacks).

        Like the interpreter's, it returns whether parsing ended without a parser error.
        """
        pdef, too_short, perr = pd.doc, pd.too_short, pd.perr
        states = {st["name"]: st for st in pdef.get("parse_states", [])}
        env = self.exprs.env()
        lines: list[str] = []
        max_lines = self.max_lines
        parsing = self.parsing

        def emit(text: str, ind: int) -> None:
            if len(lines) > max_lines:
                raise _TooBig
            lines.append("    " * ind + text)

        def state(name: str | None, ind: int, path: tuple[str, ...]) -> None:
            if name is None:
                emit("pass", ind)  # accept
                return
            if name in path:
                raise _TooBig  # a loop: the interpreter's state machine runs it
            st = states[name]
            where = f"parser state {name}"
            for op in st.get("parser_ops", []):
                for line in self._parser_op_src(op, where, too_short, env):
                    emit(line, ind)
            transitions = [parsing.transition(t, where) for t in st.get("transitions", [])]
            keys = [parsing.transition_key(k, where) for k in st.get("transition_key", [])]
            if keys and transitions:
                key = ckey = ""
                for (fn, width), kdoc in zip(keys, st.get("transition_key", []), strict=True):
                    field = kdoc.get("type") == "field"
                    call = (
                        f"f[{self.layout.field(kdoc['value'], where)}]" if field else f"{bind(env, fn)}(p, data, off)"
                    )
                    key = call if not key else f"(({key}) << {(width + 7) // 8 * 8}) | {call}"
                    ckey = call if not ckey else f"(({ckey}) << {width}) | {call}"
                emit(f"k = {key}", ind)
                if any(t[0] == 1 for t in transitions):
                    emit(f"ck = {ckey}", ind)
            for k, (kind, value, mask, nxt, vset) in enumerate(transitions):
                word = "if" if k == 0 else "elif"
                if kind == 0 and value is None:
                    if k == 0:
                        state(nxt, ind, path + (name,))
                    else:
                        emit("else:", ind)
                        state(nxt, ind + 1, path + (name,))
                    return
                if kind == 0:
                    test = f"k == {value}" if mask == -1 else f"k & {mask} == {value}"
                else:
                    test = f"{bind(env, vset)}.matches(ck, {mask})"
                emit(f"{word} {test}:", ind)
                state(nxt, ind + 1, path + (name,))
            if not transitions:
                emit("pass", ind)

        try:
            state(pdef.get("init_state"), 1, ())
        except _TooBig:
            return None
        body = ["f = p.f", "v = p.v", "ad = _NOAD", "n = len(data)", "off = 0", "try:", *lines, "except _PE as err:"]
        if perr >= 0:
            body.append(f"    f[{perr}] = err.code")
        body += [
            "    p.payload, p.poff = data, err.offset",
            "    return False",
            "p.payload, p.poff = data, off",
            "return True",
        ]
        return compile_fn("parse", "p, data", body, env)  # type: ignore[no-any-return]

    def _parser_op_src(self, op: dict[str, Any], where: str, too_short: int, env: dict[str, Any]) -> list[str]:
        """Source lines for one parser op; `off` is the parser's offset into `data` (`n` bytes)."""
        kind = op.get("op")
        params = op.get("parameters", [])
        if kind == "extract" and params[0].get("type") == "regular":
            h = self.layout.header(params[0]["value"], where)
            lines = [f"end = off + {h.nbytes}", "if end > n:", f"    raise _PE({too_short}, off)"]
            fmt, units = struct_layout(h.widths)
            names = [f"u{k}" for k in range(len(fmt) - 1)]
            if names:
                lines.append(f"{', '.join(names)}, = {bind(env, struct.Struct(fmt).unpack_from)}(data, off)")
            for sizes, fields in units:
                unit, names = joined(names[: len(sizes)], sizes), names[len(sizes) :]
                if len(fields) > 1 and len(sizes) > 1:
                    lines.append(f"x = {unit}")
                    unit = "x"
                for j, pos, w in fields:
                    first = pos + w == sum(sizes) * 8  # the unit's top bits need no mask
                    value = f"({unit} >> {pos})" if pos else unit
                    lines.append(f"f[{h.base + j}] = {value if first else f'{value} & {(1 << w) - 1}'}")
            return [*lines, f"v[{h.index}] = True", *self.layout.peers_src(h), "off = end"]
        if kind == "set" and params[1].get("type") != "lookahead":
            return self._primitive_src({"op": "assign", "parameters": params}, where, env)
        if kind == "verify":
            cond, err = self.exprs.cond_src(params[0], where, env), self.exprs.src(params[1], where, env)
            return [f"if not {cond}:", f"    raise _PE({err}, off)"]
        return [f"off = {bind(env, self.parsing.op(op, where, too_short))}(p, data, off)"]


def _index(src: str, size: int) -> tuple[list[str], str, str]:
    """(lines computing an extern index, the index, the in-range test), constants checked now."""
    if not code(src, "<dpu_softswitch expression>", "eval").co_names:
        i = eval(src, {})  # our own source, a constant
        return [], str(i), str(0 <= i < size)
    return [f"_i = {src}"], "_i", f"0 <= _i < {size}"


def _guarded(ok: str, stmt: str) -> list[str]:
    """`stmt` under the test `ok` (left out when `ok` is known)."""
    if ok == "True":
        return [stmt]
    if ok == "False":
        return []
    return [f"if {ok}:", f"    {stmt}"]


def _or_zero(ok: str, src: str) -> str:
    """`src` where the test `ok` holds, else 0 (green, for a meter); decided now when `ok` is known."""
    if ok == "True":
        return src
    if ok == "False":
        return "0"
    return f"({src} if {ok} else 0)"


def _key_src(parts: list[str]) -> str:
    return f"({', '.join(parts)},)" if parts else "()"


def _postorder(init: str | None, succ: dict[str, list[str | None]]) -> list[str] | None:
    """Nodes reachable from `init`, each after all its successors; None if the graph has a cycle."""
    if init is None:
        return []
    order: list[str] = []
    state = {init: 1}  # 1: on the current path, 2: done
    stack = [(init, iter(succ[init]))]
    while stack:
        node, it = stack[-1]
        for s in it:
            if s is None:
                continue
            seen = state.get(s)
            if seen == 1:
                return None
            if seen is None:
                state[s] = 1
                stack.append((s, iter(succ[s])))
                break
        else:
            stack.pop()
            state[node] = 2
            order.append(node)
    return order
