"""Load what a bmv2 JSON program declares, as bmv2's P4Objects does, before anything is compiled.

The layout, error codes, standard_metadata's fields, counters, meters, registers, value sets, learn
lists, field lists and calculations: named objects that the compilers (expressions, actions, parser,
pipelines) look up. Nothing here turns into code that runs per packet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ProgramError, UnsupportedConstruct
from ..externs import Clock, CounterArray, MeterArray, RegisterArray, ValueSet
from .layout import Layout, section

# The standard_metadata fields this target reads or writes; -1 where a program leaves one out.
_SM_FIELDS = (
    "ingress_port",
    "egress_spec",
    "egress_port",
    "packet_length",
    "mcast_grp",
    "egress_rid",
    "instance_type",
    "ingress_global_timestamp",
    "egress_global_timestamp",
    "parser_error",
    "checksum_error",
)


@dataclass
class DirectMeterDef:
    """A direct meter: the table it is bound to, where its colour goes, and its unit."""

    name: str
    table: str
    result: int
    unit: str
    rate_count: int


@dataclass
class LearnListDef:
    """A learn list (v1model digest()): its id, name, and the fields it samples (flat indexes, bit widths)."""

    id: int
    name: str
    fields: list[int]
    widths: list[int]


class Objects:
    """The named objects of one bmv2 JSON program, loaded and checked in bmv2's order."""

    def __init__(self, doc: dict[str, Any], clock: Clock) -> None:
        if not isinstance(doc, dict):
            raise ProgramError("bmv2 JSON: top level must be an object")
        self.doc = doc
        self.clock = clock
        self.vsets: dict[str, ValueSet] = {}
        self.direct_meters: dict[str, DirectMeterDef] = {}
        self.errors: dict[str, int] = {}
        self.counters: dict[str, CounterArray] = {}
        self.meters: dict[str, MeterArray] = {}
        self.registers: dict[str, RegisterArray] = {}
        # Set while compiling when the program clones, resubmits, recirculates or writes mcast_grp:
        # its packets then take simple_switch's general loop (v1model's process_general).
        self.replicates = False
        self.layout = Layout(doc)
        self._load_errors()
        self.sm = {name: self.layout.field_index.get(("standard_metadata", name), -1) for name in _SM_FIELDS}
        for need in ("ingress_port", "egress_spec", "egress_port"):
            if self.sm[need] < 0:
                raise ProgramError(f"bmv2 JSON: standard_metadata.{need} is missing (not a v1model program?)")
        self._load_externs()
        self._check_unsupported_sections()
        self.learn_lists = self._load_learn_lists()
        self.calcs = {c.get("name"): c for c in self.section("calculations")}
        self.field_lists = self._load_field_lists()

    def section(self, key: str) -> list[Any]:
        """A top-level list of the JSON (empty when absent)."""
        return section(self.doc, key)

    def extern(self, table: dict[str, Any], ref: dict[str, Any], where: str) -> Any:
        """The counter, meter or register array a primitive's parameter names."""
        obj = table.get(str(ref.get("value")))
        if obj is None:
            raise ProgramError(f"bmv2 JSON: unknown extern {ref.get('value')!r} in {where}")
        return obj

    def _load_errors(self) -> None:
        for name, value in self.doc.get("errors", []):
            self.errors[name] = int(value)

    def _load_externs(self) -> None:
        self.direct_counters: dict[str, str] = {}  # table name -> direct counter name
        for c in self.section("counter_arrays"):
            if c.get("is_direct"):
                self.direct_counters[str(c.get("binding"))] = c["name"]
                continue  # direct counters live on table entries
            self.counters[c["name"]] = CounterArray(c["name"], int(c["size"]))
        for m in self.section("meter_arrays"):
            unit = m.get("type", "bytes")
            if unit not in ("bytes", "packets"):
                raise ProgramError(f"bmv2 JSON: meter {m['name']!r} has unknown type {unit!r}")
            if m.get("is_direct"):
                target = self.layout.field(m.get("result_target"), f"direct meter {m['name']}")
                self.direct_meters[m["name"]] = DirectMeterDef(
                    m["name"], str(m.get("binding")), target, unit, int(m.get("rate_count", 2))
                )
                continue
            self.meters[m["name"]] = MeterArray(m["name"], int(m["size"]), int(m.get("rate_count", 2)), unit)
        for r in self.section("register_arrays"):
            self.registers[r["name"]] = RegisterArray(r["name"], int(r["size"]), int(r["bitwidth"]))

    def _check_unsupported_sections(self) -> None:
        for vs in self.section("parse_vsets"):
            self.vsets[vs["name"]] = ValueSet(vs["name"], int(vs["compressed_bitwidth"]), int(vs.get("max_size", 0)))
        if self.section("extern_instances"):
            raise UnsupportedConstruct("extern_instances", "program")

    def _load_learn_lists(self) -> dict[int, LearnListDef]:
        lists: dict[int, LearnListDef] = {}
        for ll in self.section("learn_lists"):
            where = f"learn list {ll.get('name')}"
            fields = []
            for el in ll.get("elements", []):
                if el.get("type") != "field":  # bmv2 asserts the same (P4Objects::init_learn_lists)
                    raise UnsupportedConstruct(f"learn list element {el.get('type')}", where)
                fields.append(self.layout.field(el.get("value"), where))
            lid = int(ll["id"])
            if lid <= 0 or lid in lists:
                raise ProgramError(f"bmv2 JSON: {where} has id {lid!r}, not a unique id above 0")
            lists[lid] = LearnListDef(lid, str(ll["name"]), fields, [self.layout.field_width[i] for i in fields])
        return lists

    def _load_field_lists(self) -> dict[int, list[int]]:
        lists: dict[int, list[int]] = {}
        for fl in self.section("field_lists"):
            where = f"field list {fl.get('name')}"
            fields = []
            for el in fl.get("elements", []):
                if el.get("type") != "field":
                    raise UnsupportedConstruct(f"field list element {el.get('type')}", where)
                fields.append(self.layout.field(el["value"], where))
            lists[int(fl["id"])] = fields
        return lists
