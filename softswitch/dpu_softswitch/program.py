"""Load a bmv2 JSON program (as p4c-bm2-ss emits it for v1model) and compile it into Python.

The JSON is compiled once, at SetForwardingPipelineConfig time, by the parts in dpu_softswitch.switch: the
loader reads what it declares; expressions, primitives, parser states and pipeline nodes become
closures over precomputed field offsets; and actions, pipelines and the parser are then also written
out as Python source over the same offsets (switch.codegen), so that the per-packet path does no
name lookups, no JSON walking and few calls. This module chooses, part by part, the generated
function where there is one and the closure interpreter where there is not, and hands the parts to
simple_switch's loop (dpu_softswitch.v1model). Constructs this target does not implement are rejected here,
with the construct's name, never later at packet time.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .errors import ProgramError
from .externs import Clock
from .switch import parsing, pipeline
from .switch.actions import ActionDef, Primitives
from .switch.calculations import Calculations, load_checksums
from .switch.codegen import Codegen
from .switch.deparsing import load_deparser
from .switch.expressions import Expressions
from .switch.loader import Objects
from .switch.packet import Packet
from .switch.pipeline import Pipelines, TableDef
from .trace import TracedPrimitives, Tracer
from .v1model import SimpleSwitch

# A generated function that would grow past this many lines is left to the closure interpreter
# (tests set it to -1 to run every pipeline and parser on the interpreter).
_MAX_LINES = 20_000

# The last few bmv2 JSONs parsed, by their bytes: the devices of one process that load the same program
# (bench/targets_host.py runs thousands) share one parsed document and one copy of its bytes. Nothing
# mutates a document once parsed; the compilers only read it.
_DOCS: OrderedDict[bytes, tuple[bytes, Any]] = OrderedDict()
_DOCS_KEPT = 4
_DOCS_LOCK = threading.Lock()


def shared_json(data: bytes) -> tuple[bytes, Any]:
    """`data` parsed as JSON, and bytes equal to `data`: both shared with every other device of this process
    that loaded the same bytes lately (raises ProgramError if it is not JSON)."""
    data = bytes(data)  # a no-op for bytes; a bytearray or memoryview cannot be a key
    with _DOCS_LOCK:
        if (hit := _DOCS.get(data)) is not None:
            _DOCS.move_to_end(data)
            return hit
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramError(f"bmv2 JSON: not valid JSON: {exc}") from exc
    with _DOCS_LOCK:
        hit = _DOCS.setdefault(data, (data, doc))
        while len(_DOCS) > _DOCS_KEPT:
            _DOCS.popitem(last=False)
    return hit


class Program(SimpleSwitch):
    """A bmv2 JSON program compiled for execution."""

    def __init__(self, doc: dict[str, Any], clock: Clock | None = None, trace: Tracer | None = None) -> None:
        objs = Objects(doc, clock or Clock())
        self.doc = doc
        self.layout = objs.layout
        self.counters = objs.counters
        self.meters = objs.meters
        self.registers = objs.registers
        self.vsets = objs.vsets
        exprs = Expressions(objs.layout, objs.clock)
        calcs = Calculations(objs)
        # Traced (--log-console): primitives that trace themselves, and no generated code anywhere.
        prims = Primitives(objs, exprs, calcs) if trace is None else TracedPrimitives(objs, exprs, calcs, trace)
        parse_compiler = parsing.Parsing(objs, exprs, prims)
        self.actions: dict[int, ActionDef] = {}
        gen = Codegen(objs, exprs, prims, parse_compiler, self.actions, _MAX_LINES)
        for a in objs.section("actions"):
            where = f"action {a.get('name')}"
            adef = ActionDef(
                id=int(a["id"]),
                name=a["name"],
                param_widths=[int(r["bitwidth"]) for r in a.get("runtime_data", [])],
                param_names=[r["name"] for r in a.get("runtime_data", [])],
                body=gen.action(a, where) if trace is None else prims.body_with_jumps(a.get("primitives", []), where),
            )
            if trace is not None:
                adef.body = trace.action(adef, adef.body)
            self.actions[adef.id] = adef
        pdef = parse_compiler.load()
        parse = gen.parser(pdef) if trace is None else trace.parser(pdef, objs.layout, objs.errors)
        deparse = load_deparser(objs, exprs)
        if trace is not None:
            order = objs.section("deparsers")[0].get("order", [])
            deparse = trace.deparser(order, objs.layout, deparse)
        checksums = load_checksums(objs, exprs, calcs)
        pipelines = {p.get("name"): p for p in objs.section("pipelines")}
        for name in ("ingress", "egress"):
            if name not in pipelines:
                raise ProgramError(f"bmv2 JSON: pipeline {name!r} is missing")
        pipes = Pipelines(objs, exprs, calcs, self.actions)
        if trace is None:
            ingress = _compiled(gen, pipes.load(pipelines["ingress"]))
            egress = _compiled(gen, pipes.load(pipelines["egress"]))
        else:
            ingress = trace.pipeline(pipes.load(pipelines["ingress"]), exprs)
            egress = trace.pipeline(pipes.load(pipelines["egress"]), exprs)
        self.tables: dict[str, TableDef] = pipes.tables
        self.profiles = pipes.profiles
        super().__init__(
            objs,
            parse if parse is not None else parsing.interpret(pdef),
            deparse,
            checksums,
            ingress,
            egress,
            egress_empty=pipelines["egress"].get("init_table") is None,
            trace=trace,
        )

    @classmethod
    def from_bytes(cls, data: bytes, clock: Clock | None = None, trace: Tracer | None = None) -> Program:
        """Parse and compile bmv2 JSON bytes (traced to `trace` when given)."""
        return cls(shared_json(data)[1], clock, trace)


def _compiled(gen: Codegen, pd: pipeline.PipelineDef) -> Callable[[Packet], None]:
    """A pipeline as generated code, or as the interpreter over its nodes where generation gives up."""
    generated = gen.pipeline(pd)
    return generated if generated is not None else pipeline.interpret(pd)
