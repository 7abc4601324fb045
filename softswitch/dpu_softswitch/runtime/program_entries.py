"""The entries a program's JSON installs (P4 `const entries`), read back as simple_switch_grpc answers.

PI reads them from bmv2 (bmv2's PI/src/pi_tables_imp.cpp, emit_entries) and renders them with
parse_match_key (PI's proto/frontend/src/match_key_helpers.cpp): every match field bmv2 holds, wildcards
left out, values as bmv2 stores them, the priority inverted around bmv2's pivot, and the entry's action.
"""

from __future__ import annotations

from finsy.proto import p4i, p4r

from ..tables import Entry
from .binding import Binding, TableBinding
from .codec import encode_bytes


def program_entry(b: Binding, tb: TableBinding, entry: Entry) -> p4r.TableEntry:
    """A const entry as a read returns it (its values are in entry.meta["program"], see switch.pipeline)."""
    te = p4r.TableEntry(table_id=tb.info.preamble.id, priority=entry.priority)
    for mf, shown in zip(tb.match_fields, entry.meta["program"], strict=True):
        fm = _field_match(mf, shown)
        if fm is not None:
            te.match.append(fm)
    info_aid = tb.json_to_info_action.get(entry.action_id)
    if info_aid is not None:
        te.action.action.CopyFrom(b.p4r_action(info_aid, entry.action_data))
    return te


def _field_match(mf: p4i.MatchField, shown: object) -> p4r.FieldMatch | None:
    """One field as PI's parse_match_key writes it, None where PI leaves a wildcard out."""
    kind = p4i.MatchField.MatchType.Name(mf.match_type)
    nbytes = (mf.bitwidth + 7) // 8
    fm = p4r.FieldMatch(field_id=mf.id)
    if kind == "EXACT":
        assert isinstance(shown, int)
        fm.exact.value = encode_bytes(shown)
        return fm
    assert isinstance(shown, tuple)
    a, z = shown
    if kind == "LPM":
        if z == 0:
            return None
        # bmv2 keeps an LPM table's value as the program wrote it, and PI passes it on: 0x11/4 reads back
        # 0x11, where the P4Runtime spec (which refuses such a value in a write) would have 0x10.
        fm.lpm.value, fm.lpm.prefix_len = encode_bytes(a), z
    elif kind == "TERNARY":
        if z == 0:
            return None
        fm.ternary.value, fm.ternary.mask = encode_bytes(a), encode_bytes(z)
    elif kind == "RANGE":
        # PI's range_match_is_dont_care_ compares with the full range of the bytes, not of the field.
        if a == 0 and z == (1 << (8 * nbytes)) - 1:
            return None
        fm.range.low, fm.range.high = encode_bytes(a), encode_bytes(z)
    elif kind == "OPTIONAL":
        # PI's MatchKeyReader::get_optional: a wildcard when the ternary mask's first byte is zero.
        if z >> (8 * (nbytes - 1)) == 0:
            return None
        fm.optional.value = encode_bytes(a)
    else:
        return None
    return fm
