"""Where a program's headers, header stacks and header unions live in a packet's flat field list.

Every field of every header instance (metadata included) has one index into Packet.f, every header
one index into Packet.v, every stack and union stack one index into Packet.stk. Lookups by JSON name
raise ProgramError naming what is missing and where it was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ProgramError, UnsupportedConstruct


def section(doc: dict[str, Any], key: str) -> list[Any]:
    """A top-level list of the bmv2 JSON (empty when absent)."""
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise ProgramError(f"bmv2 JSON: {key!r} must be a list")
    return value


@dataclass
class HeaderLayout:
    """Where one header instance's fields live in the flat field list."""

    name: str
    index: int
    base: int
    widths: list[int]
    names: list[str]
    metadata: bool
    # A varbit header: its varbit field's offset (its entry in `widths` is 0, as bmv2 counts it before
    # an extract), the largest header in bytes, and the flat index of the slot holding the field's
    # current width in bits, the slot just past the header's fields. -1, 0, -1 for other headers.
    vl: int = -1
    max_bytes: int = 0
    vl_slot: int = -1

    @property
    def nbytes(self) -> int:
        """Header size in bytes (headers are byte-aligned in v1model), a varbit field counted as 0 bits."""
        return sum(self.widths) // 8

    @property
    def span(self) -> int:
        """How many flat slots the header's state takes: its fields, and a varbit field's width."""
        return len(self.widths) + (self.vl >= 0)


@dataclass
class StackLayout:
    """A header stack: its position in Packet.stk and its element headers, in index order."""

    name: str
    index: int
    elements: list[HeaderLayout]


@dataclass
class UnionStackLayout:
    """A header union stack: its position in Packet.stk (after the header stacks') and, for each
    element in index order, the union's member headers in the union type's order."""

    name: str
    index: int
    unions: list[list[HeaderLayout]]
    members: list[str]  # the union type's member names


class Layout:
    """The field, header, stack and union layout of one bmv2 JSON program."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.headers: dict[str, HeaderLayout] = {}
        self.stacks: dict[str, StackLayout] = {}
        self.union_stacks: dict[str, UnionStackLayout] = {}
        self.unions: dict[str, list[HeaderLayout]] = {}
        self.union_peers: dict[int, tuple[int, ...]] = {}  # a union member's header index -> its peers'
        self.header_list: list[HeaderLayout] = []
        self.field_index: dict[tuple[str, str], int] = {}
        self.nfields = 0
        self._load()

    def _load(self) -> None:
        types = {ht["name"]: self._header_type(ht) for ht in section(self.doc, "header_types")}
        # int<N> fields hold their two's-complement bits, as bmv2's bytes do (what keys, checksums and the
        # deparser see); expressions read them as signed values (Expressions.srcb).
        self.signed: set[int] = set()
        base = 0
        for i, h in enumerate(section(self.doc, "headers")):
            htype = types.get(h.get("header_type", ""))
            if htype is None:
                raise ProgramError(f"bmv2 JSON: header {h.get('name')!r} has unknown type {h.get('header_type')!r}")
            ftypes, vl, max_bytes = htype
            layout = HeaderLayout(
                name=h["name"],
                index=i,
                base=base,
                widths=[0 if j == vl else w for j, (_, w, _) in enumerate(ftypes)],
                names=[n for n, _, _ in ftypes],
                metadata=bool(h.get("metadata")),
                vl=vl,
                max_bytes=max_bytes,
                vl_slot=base + len(ftypes) if vl >= 0 else -1,
            )
            if not layout.metadata and sum(layout.widths) % 8:
                raise ProgramError(f"bmv2 JSON: header {layout.name!r} is not a whole number of bytes")
            if vl >= 0 and layout.metadata:
                raise UnsupportedConstruct("varbit field in metadata", f"header {layout.name}")
            for j, (fname, _, signed) in enumerate(ftypes):
                self.field_index[(layout.name, fname)] = base + j
                if signed:
                    self.signed.add(base + j)
            base += layout.span
            self.headers[layout.name] = layout
            self.header_list.append(layout)
        self.nfields = base
        self.field_width = [0] * base
        self.field_header = [0] * base
        self.vl_width: dict[int, int] = {}  # a varbit field's flat index -> its width slot's
        for layout in self.header_list:
            for j, w in enumerate(layout.widths):
                self.field_width[layout.base + j] = w
                self.field_header[layout.base + j] = layout.index
            if layout.vl >= 0:
                # The varbit field's values fit its largest width; the slot holds a bit count.
                self.field_width[layout.base + layout.vl] = layout.max_bytes * 8 - sum(layout.widths)
                self.field_width[layout.vl_slot] = 32
                self.field_header[layout.vl_slot] = layout.index
                self.vl_width[layout.base + layout.vl] = layout.vl_slot
        by_id = {int(h.get("id", i)): self.header_list[i] for i, h in enumerate(section(self.doc, "headers"))}
        self._load_unions(by_id)
        for k, st in enumerate(section(self.doc, "header_stacks")):
            try:
                elements = [by_id[int(i)] for i in st["header_ids"]]
            except (KeyError, TypeError, ValueError):
                raise ProgramError(f"bmv2 JSON: header stack {st.get('name')!r} has unknown header ids") from None
            if not elements or any(e.metadata for e in elements):
                raise ProgramError(f"bmv2 JSON: header stack {st.get('name')!r} must hold packet headers")
            self.stacks[st["name"]] = StackLayout(st["name"], k, elements)
        self._load_union_stacks()

    @staticmethod
    def _header_type(ht: dict[str, Any]) -> tuple[list[tuple[str, int, bool]], int, int]:
        """A header type's (name, width, signed) fields, its varbit field's offset (-1: none) and max_length."""
        fields: list[tuple[str, int, bool]] = []
        vl = -1
        where = f"header type {ht.get('name')}"
        for fdef in ht.get("fields", []):
            name, width = fdef[0], fdef[1]
            signed = len(fdef) > 2 and fdef[2] is True
            if len(fdef) > 3 and fdef[3] not in (False, None):
                raise UnsupportedConstruct("saturating field", where)
            if width == "*":
                # bmv2 takes one varbit field per header (HeaderType::push_back_VL_field asserts it); its
                # length_exp (P4_14's header length) p4c never writes for P4_16.
                if vl >= 0 or "length_exp" in ht:
                    raise UnsupportedConstruct("a second varbit field, or a header length expression", where)
                vl, width = len(fields), 0
            if signed and (width == 0 or int(width) < 2):  # bmv2's Field asserts nbits > 1 when signed
                raise UnsupportedConstruct("signed varbit or int<1> field", where)
            fields.append((name, int(width), signed))
        max_bytes = int(ht.get("max_length", 0)) if vl >= 0 else 0
        if vl >= 0 and max_bytes * 8 <= sum(w for _, w, _ in fields):
            raise ProgramError(f"bmv2 JSON: {where} has a varbit field and no max_length past its fixed fields")
        return fields, vl, max_bytes

    def _load_union_stacks(self) -> None:
        unions_by_id = {int(u.get("id", i)): u["name"] for i, u in enumerate(section(self.doc, "header_unions"))}
        types = {t.get("name"): [m[0] for m in t.get("headers", [])] for t in section(self.doc, "header_union_types")}
        for k, st in enumerate(section(self.doc, "header_union_stacks"), start=len(self.stacks)):
            try:
                unions = [self.unions[unions_by_id[int(i)]] for i in st["header_union_ids"]]
                members = types[st["union_type"]]
            except (KeyError, TypeError, ValueError):
                raise ProgramError(f"bmv2 JSON: header union stack {st.get('name')!r} has unknown unions") from None
            if not unions or any(len(u) != len(members) for u in unions):
                raise ProgramError(f"bmv2 JSON: header union stack {st.get('name')!r} must hold unions of its type")
            self.union_stacks[st["name"]] = UnionStackLayout(st["name"], k, unions, members)

    def _load_unions(self, by_id: dict[int, HeaderLayout]) -> None:
        """Header unions: each member's peers, which bmv2 marks invalid when that member becomes valid."""
        for u in section(self.doc, "header_unions"):
            try:
                members = [by_id[int(i)] for i in u["header_ids"]]
            except (KeyError, TypeError, ValueError):
                raise ProgramError(f"bmv2 JSON: header union {u.get('name')!r} has unknown header ids") from None
            if not members or any(m.metadata or m.index in self.union_peers for m in members):
                raise ProgramError(
                    f"bmv2 JSON: header union {u.get('name')!r} must hold packet headers of no other union"
                )
            self.unions[u["name"]] = members
            for m in members:
                self.union_peers[m.index] = tuple(o.index for o in members if o is not m)

    # ---------------------------------------------------------------- lookups by JSON name

    def field(self, ref: Any, where: str) -> int:
        """The flat index of field [header, field]."""
        try:
            hdr, fname = ref
            return self.field_index[(hdr, fname)]
        except (KeyError, TypeError, ValueError):
            raise ProgramError(f"bmv2 JSON: unknown field {ref!r} in {where}") from None

    def header(self, name: Any, where: str) -> HeaderLayout:
        """A header instance by name."""
        layout = self.headers.get(name) if isinstance(name, str) else None
        if layout is None:
            raise ProgramError(f"bmv2 JSON: unknown header {name!r} in {where}")
        return layout

    def stack(self, name: Any, where: str) -> StackLayout:
        """A header stack by name."""
        st = self.stacks.get(name) if isinstance(name, str) else None
        if st is None:
            raise ProgramError(f"bmv2 JSON: unknown header stack {name!r} in {where}")
        return st

    def union_stack(self, name: Any, where: str) -> UnionStackLayout:
        """A header union stack by name."""
        ust = self.union_stacks.get(name) if isinstance(name, str) else None
        if ust is None:
            raise ProgramError(f"bmv2 JSON: unknown header union stack {name!r} in {where}")
        return ust

    @staticmethod
    def union_member(ust: UnionStackLayout, member: Any, where: str) -> int:
        """A union stack's member position by name."""
        try:
            return ust.members.index(member)
        except ValueError:
            raise ProgramError(f"bmv2 JSON: union stack {ust.name!r} has no member {member!r} in {where}") from None

    @staticmethod
    def field_offset(layout: HeaderLayout, fname: Any, where: str) -> int:
        """A field's position within its header."""
        try:
            return layout.names.index(fname)
        except ValueError:
            raise ProgramError(f"bmv2 JSON: header {layout.name!r} has no field {fname!r} in {where}") from None

    def union(self, node: Any, where: str) -> list[HeaderLayout]:
        """A header union operand's member headers."""
        # p4c 1.2.4 types a union stack's element "header" in valid_union; bmv2 refuses that JSON too.
        name = node.get("value") if isinstance(node, dict) and node.get("type") == "header_union" else None
        members = self.unions.get(name) if isinstance(name, str) else None
        if members is None:
            raise ProgramError(f"bmv2 JSON: unknown header union {node!r} in {where}")
        return members

    def peers_src(self, h: HeaderLayout) -> list[str]:
        """Source lines that mark h's union peers invalid, as bmv2's HeaderUnion::make_header_valid does."""
        return [f"v[{k}] = False" for k in self.union_peers.get(h.index, ())]

    def mask(self, i: int) -> int:
        """The all-ones value of field i's width."""
        return (1 << self.field_width[i]) - 1


_STRUCT_CODES = {8: "Q", 4: "I", 2: "H", 1: "B"}


def struct_layout(widths: list[int]) -> tuple[str, list[tuple[list[int], list[tuple[int, int, int]]]]]:
    """A byte-aligned header as a struct format: the fields cut into byte-aligned units, each unit read as
    one or more big-endian integers. Returns the format and, per unit, its integers' sizes in bytes and
    its fields as (field offset, bit position in the unit, width)."""
    units: list[tuple[list[int], list[tuple[int, int, int]]]] = []
    fields: list[tuple[int, int]] = []
    bits = 0
    for j, w in enumerate(widths):
        fields.append((j, w))
        bits += w
        if bits % 8 == 0:
            sizes, rest = [], bits // 8
            for size in (8, 4, 2, 1):
                while rest >= size:
                    sizes.append(size)
                    rest -= size
            placed, pos = [], bits
            for k, width in fields:
                pos -= width
                placed.append((k, pos, width))
            units.append((sizes, placed))
            fields, bits = [], 0
    return "!" + "".join(_STRUCT_CODES[size] for sizes, _ in units for size in sizes), units


def joined(names: list[str], sizes: list[int]) -> str:
    """The integer that struct values `names` (of `sizes` bytes, most significant first) make together."""
    shift = sum(sizes) * 8
    terms = []
    for name, size in zip(names, sizes, strict=True):
        shift -= size * 8
        terms.append(f"({name} << {shift})" if shift else name)
    return terms[0] if len(terms) == 1 else f"({' | '.join(terms)})"
