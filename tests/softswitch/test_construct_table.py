"""docs/embedded-target.md's refused constructs are refused: for each refused row, a corpus program's JSON
with that construct added fails to load, naming it. The table and the mutations below must list the same
constructs, so that a row cannot say "refused" about something the target runs, or go untested.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from corpus_semantics_cases import program_json
from dpu_softswitch.errors import ProgramError
from dpu_softswitch.program import Program
from helpers.paths import ROOT

DOC = ROOT / "docs" / "embedded-target.md"
Doc = dict[str, Any]


def refused_rows() -> list[str]:
    """The key (first `code`) of every row of the table whose status is refused."""
    keys = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[1] == "refused":
            match = re.search(r"`([^`]+)`", cells[0])
            assert match, line
            keys.append(match.group(1))
    return keys


def base(name: str = "varbit") -> Doc:
    """A corpus program's JSON to add a construct to."""
    return json.loads(program_json(name))  # type: ignore[no-any-return]


def field_type(d: Doc, extra: list[Any]) -> Doc:
    """probe_t's first field with `extra` elements after its name and width."""
    htype = next(t for t in d["header_types"] if t["name"] == "probe_t")
    htype["fields"][0] = [*htype["fields"][0][:2], *extra]
    return d


def varbit_type(d: Doc, **change: Any) -> Doc:
    """opt_t (a varbit header type) with attributes changed or fields added."""
    htype = next(t for t in d["header_types"] if t["name"] == "opt_t")
    fields = change.pop("fields", [])
    htype["fields"] += fields
    htype.update(change)
    return d


def action_prim(d: Doc, prim: dict[str, Any]) -> Doc:
    """The first action with primitives, with `prim` appended."""
    action = next(a for a in d["actions"] if a["primitives"])
    action["primitives"].append(prim)
    return d


def prim(op: str, *params: dict[str, Any]) -> Callable[[], Doc]:
    """A JSON with primitive `op` in an action."""
    return lambda: action_prim(base(), {"op": op, "parameters": list(params)})


FIELD = {"type": "field", "value": ["probe", "err"]}


def assign_expr(op: str, left: Any, right: Any) -> Callable[[], Doc]:
    """A JSON assigning expression `left op right` to a field in an action."""
    expr = {"type": "expression", "value": {"op": op, "left": left, "right": right}}
    return lambda: action_prim(base(), {"op": "assign", "parameters": [FIELD, expr]})


def header(name: str) -> dict[str, Any]:
    return {"type": "header", "value": name}


def parser_op(d: Doc, op: dict[str, Any]) -> Doc:
    d["parsers"][0]["parse_states"][0]["parser_ops"].append(op)
    return d


def table(d: Doc, **change: Any) -> Doc:
    """The first table of the ingress pipeline with attributes changed."""
    d["pipelines"][0]["tables"][0].update(change)
    return d


def calc(d: Doc, **change: Any) -> Doc:
    d["calculations"][0].update(change)
    return d


def hashes(algo: str) -> Callable[[], Doc]:
    return lambda: calc(base("hashes"), algo=algo)


def union_stack_member() -> dict[str, Any]:
    stack = {"type": "header_union_stack", "value": "us"}
    deref = {"type": "expression", "value": {"op": "dereference_union_stack", "left": stack, "right": _hex(0)}}
    return {"type": "expression", "value": {"op": "access_union_header", "left": deref, "right": 0}}


def _hex(n: int) -> dict[str, Any]:
    return {"type": "hexstr", "value": hex(n)}


def _second_parser() -> Doc:
    d = base()
    d["parsers"].append({**d["parsers"][0], "name": "parser2", "id": 1})
    return d


def _indirect_with_entries() -> Doc:
    d = base("action_selector")
    t = next(t for p in d["pipelines"] for t in p["tables"] if t.get("type") == "indirect_ws")
    t["entries"] = [{"match_key": [], "action_entry": {"action_id": 0, "action_data": []}, "priority": 1}]
    return d


def _indirect_old_format() -> Doc:
    d = base("action_selector")
    t = next(t for p in d["pipelines"] for t in p["tables"] if t.get("type") == "indirect_ws")
    del t["action_profile"]
    return d


def _list_element(section: str) -> Callable[[], Doc]:
    def mutate() -> Doc:
        d = base("digest" if section == "learn_lists" else "replication")
        d[section][0]["elements"].append({"type": "hexstr", "value": "0x1"})
        return d

    return mutate


def _metadata_varbit() -> Doc:
    d = base()
    d["header_types"].append({"name": "vm_t", "id": 99, "fields": [["x", 8, False], ["v", "*"]], "max_length": 4})
    d["headers"].append({"name": "vm", "id": 99, "header_type": "vm_t", "metadata": True, "pi_omit": True})
    return d


def _runtime_data_index() -> Doc:
    d = base("header_stack")
    pick = next(a for a in d["actions"] if a["name"] == "I.pick")
    pick["primitives"][1]["parameters"][0]["value"]["value"]["left"]["value"]["right"] = {
        "type": "runtime_data",
        "value": 0,
    }
    return d


def _register_operand() -> Doc:
    # bmv2 reads a register cell in an expression (LOAD_REGISTER_REF); varbit.p4 has no register, and
    # the operand is refused before its register is looked up.
    operand = {"type": "register", "value": ["r", _hex(0)]}
    return action_prim(base(), {"op": "assign", "parameters": [FIELD, operand]})


def _int1() -> Doc:
    d = base()
    htype = next(t for t in d["header_types"] if t["name"] == "probe_t")
    htype["fields"][0:1] = [["nbits_hi", 1, True], ["nbits_lo", 7, False]]
    return d


def _deparser_primitives() -> Doc:
    d = base()
    d["deparsers"][0]["primitives"] = [{"op": "no_op", "parameters": []}]
    return d


def _checksum_type() -> Doc:
    d = base("ipv4_csum")
    d["checksums"][0]["type"] = "ipv4"
    return d


def _action_calls() -> Doc:
    d = base()
    d["pipelines"][0]["action_calls"] = [{"name": "call", "id": 0, "action_id": 0, "next_node": None}]
    return d


def _match_kind(kind: str) -> Doc:
    d = base("optional_match")
    t = next(t for p in d["pipelines"] for t in p["tables"] if t["name"] == "I.opt")
    t["key"][0]["match_type"] = kind
    return d


# Each refused row's key -> (a JSON with that construct, a fragment the error names).
MUTATIONS: dict[str, tuple[Callable[[], Doc], str]] = {
    "saturating field": (lambda: field_type(base(), [False, True]), "saturating field"),
    "length_exp": (lambda: varbit_type(base(), length_exp={"type": "hexstr", "value": "0x8"}), "length expression"),
    "two varbit fields": (lambda: varbit_type(base(), fields=[["more", "*"]]), "a second varbit field"),
    "varbit in metadata": (_metadata_varbit, "varbit field in metadata"),
    "signed int<1> field": (_int1, "int<1>"),
    "runtime_data inside an expression": (_runtime_data_index, "runtime_data inside an expression"),
    "register": (_register_operand, "expression type register"),
    "==h": (assign_expr("==h", header("probe"), header("copy")), "operator ==h"),
    "!=h": (assign_expr("!=h", header("probe"), header("copy")), "operator !=h"),
    "==u": (assign_expr("==u", header("probe"), header("copy")), "operator ==u"),
    "!=u": (assign_expr("!=u", header("probe"), header("copy")), "operator !=u"),
    "==b": (assign_expr("==b", {"type": "bool", "value": True}, {"type": "bool", "value": False}), "operator ==b"),
    "!=b": (assign_expr("!=b", {"type": "bool", "value": True}, {"type": "bool", "value": False}), "operator !=b"),
    "dereference_union_stack": (
        lambda: action_prim(base(), {"op": "remove_header", "parameters": [union_stack_member()]}),
        "dereference_union_stack",
    ),
    "access_union_header": (
        lambda: action_prim(base(), {"op": "remove_header", "parameters": [union_stack_member()]}),
        "access_union_header",
    ),
    "more than one parser": (_second_parser, "expected one parser"),
    "extract of a varbit header": (
        lambda: parser_op(base(), {"op": "extract", "parameters": [{"type": "regular", "value": "copy"}]}),
        "'extract' of varbit header",
    ),
    "shift": (lambda: parser_op(base(), {"op": "shift", "parameters": [_hex(1)]}), "parser op shift"),
    "deparser primitives": (_deparser_primitives, "deparser primitives"),
    "calculation input payload": (lambda: calc(base("hashes"), input=[{"type": "payload"}]), "input payload"),
    "hash algorithm xxh64": (hashes("xxh64"), "hash algorithm xxh64"),
    "hash algorithm toeplitz": (hashes("toeplitz"), "hash algorithm toeplitz"),
    "hash algorithm round_robin": (hashes("round_robin"), "hash algorithm round_robin"),
    "hash algorithm round_robin_consistent": (hashes("round_robin_consistent"), "round_robin_consistent"),
    "checksum type": (_checksum_type, "checksum type"),
    "learn list element": (_list_element("learn_lists"), "learn list element hexstr"),
    "field list element": (_list_element("field_lists"), "field list element hexstr"),
    "extern_instances": (lambda: {**base(), "extern_instances": [{"name": "x", "id": 0, "type": "t"}]}, "extern"),
    "action_calls": (_action_calls, "action_calls"),
    "table type": (lambda: table(base(), type="indirect_xyz"), "table type indirect_xyz"),
    "indirect table without action_profile": (_indirect_old_format, "old JSON format"),
    "match kind optional": (lambda: _match_kind("optional"), "match kind optional"),
    "support_timeout": (lambda: table(base(), support_timeout=True), "idle timeout"),
    "const entries in an indirect table": (_indirect_with_entries, "const entries in an indirect table"),
    "modify_field_rng_uniform": (prim("modify_field_rng_uniform", FIELD, _hex(0), _hex(7)), "primitive"),
    "truncate": (prim("truncate", _hex(20)), "primitive truncate"),
    "add_to_field": (prim("add_to_field", FIELD, _hex(1)), "primitive add_to_field"),
    "subtract_from_field": (prim("subtract_from_field", FIELD, _hex(1)), "primitive subtract_from_field"),
    "add": (prim("add", FIELD, _hex(1), _hex(2)), "primitive add"),
    "subtract": (prim("subtract", FIELD, _hex(1), _hex(2)), "primitive subtract"),
    "bit_xor": (prim("bit_xor", FIELD, _hex(1), _hex(2)), "primitive bit_xor"),
    "bit_or": (prim("bit_or", FIELD, _hex(1), _hex(2)), "primitive bit_or"),
    "bit_and": (prim("bit_and", FIELD, _hex(1), _hex(2)), "primitive bit_and"),
    "shift_left": (prim("shift_left", FIELD, FIELD, _hex(2)), "primitive shift_left"),
    "shift_right": (prim("shift_right", FIELD, FIELD, _hex(2)), "primitive shift_right"),
    "add_header_fast": (prim("add_header_fast", header("copy")), "primitive add_header_fast"),
    "copy_header": (prim("copy_header", header("copy"), header("opt")), "primitive copy_header"),
}


def test_table_and_mutations_list_the_same_constructs() -> None:
    assert sorted(refused_rows()) == sorted(MUTATIONS)


@pytest.mark.parametrize("key", sorted(MUTATIONS))
def test_refused_construct_is_refused(key: str) -> None:
    mutate, fragment = MUTATIONS[key]
    with pytest.raises(ProgramError) as err:
        Program(mutate())
    assert fragment in str(err.value)


def test_the_bases_load() -> None:
    """Each program a mutation starts from loads as committed, so the refusal is the construct's."""
    for name in ("varbit", "hashes", "ipv4_csum", "digest", "replication", "action_selector", "optional_match"):
        Program(base(name))
    Program(base("header_stack"))
