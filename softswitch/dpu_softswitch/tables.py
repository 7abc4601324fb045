"""Match-action tables: exact, LPM, ternary and range keys, with bmv2's lookup rules.

P4's `optional` match kind is a ternary key here, as p4c writes it in the bmv2 JSON and PI writes its
entries to bmv2 (mask all ones, or zero for a wildcard). An LPM entry's value is stored cut to its
prefix, as bmv2's trie compares only the prefix's bits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# One key field's match in an entry: exact -> value; lpm -> (value, prefix_len);
# ternary -> (value, mask); range -> (low, high).
FieldMatch = Any


@dataclass
class Entry:
    """One installed table entry."""

    match: tuple[FieldMatch, ...]
    action_id: int
    action_data: list[int]
    priority: int = 0
    # Opaque per-entry state kept for P4Runtime (the canonical request entity, direct counters).
    meta: dict[str, Any] = field(default_factory=dict)
    packets: int = 0
    bytes: int = 0
    # The entry's direct meter cell (externs.Meter), created when the table has a direct meter.
    meter: Any = None
    # In an indirect table: the action profile member handle the entry points at, or its group handle.
    member: int = -1
    group: int = -1


@dataclass(frozen=True)
class KeyField:
    """A key field's match kind and bit width."""

    match_type: str
    bitwidth: int


class Table:
    """A table's entries and lookup; the lookup strategy follows the key's match kinds."""

    def __init__(self, name: str, key: list[KeyField], size: int) -> None:
        self.name = name
        self.key = key
        self.size = size
        kinds = [k.match_type for k in key]
        self._exact_only = all(k in ("exact", "valid") for k in kinds)
        self._lpm_pos = kinds.index("lpm") if kinds.count("lpm") == 1 else -1
        self._lpm_only = self._lpm_pos >= 0 and all(k in ("exact", "valid", "lpm") for k in kinds)
        self.needs_priority = not (self._exact_only or self._lpm_only)
        self.entries: dict[tuple[Any, ...], Entry] = {}
        self._rebuild()

    def __len__(self) -> int:
        return len(self.entries)

    @staticmethod
    def identity(match: tuple[FieldMatch, ...], priority: int) -> tuple[Any, ...]:
        """The key that makes two entries the same entry (match and priority)."""
        return (match, priority)

    def insert(self, entry: Entry) -> None:
        """Add an entry (the caller checked it is new and within size)."""
        self.entries[self.identity(entry.match, entry.priority)] = entry
        self._rebuild()

    def remove(self, match: tuple[FieldMatch, ...], priority: int) -> Entry:
        """Remove and return an entry."""
        entry = self.entries.pop(self.identity(match, priority))
        self._rebuild()
        return entry

    def clear(self) -> None:
        """Remove every entry."""
        self.entries.clear()
        self._rebuild()

    def _rebuild(self) -> None:
        # Lookup structures are rebuilt and swapped in whole, so that the packet thread
        # always sees a consistent table while the control thread writes.
        if self._exact_only:
            exact = {e.match: e for e in self.entries.values()}
            self.lookup: Callable[[tuple[int, ...]], Entry | None] = exact.get
        elif self._lpm_only:
            self.lookup = self._make_lpm_lookup()
        else:
            ordered = sorted(self.entries.values(), key=lambda e: -e.priority)
            self.lookup = self._make_scan_lookup(ordered)

    def _make_lpm_lookup(self) -> Callable[[tuple[int, ...]], Entry | None]:
        pos = self._lpm_pos
        width = self.key[pos].bitwidth
        by_len: dict[int, dict[tuple[int, ...], Entry]] = {}
        for e in self.entries.values():
            value, plen = e.match[pos]
            k = e.match[:pos] + (value,) + e.match[pos + 1 :]
            by_len.setdefault(plen, {})[k] = e
        levels = [
            (((1 << width) - 1) ^ ((1 << (width - plen)) - 1), d) for plen, d in sorted(by_len.items(), reverse=True)
        ]

        if len(self.key) == 1:  # the key is the prefix alone: levels keyed by the masked value itself
            single = [(mask, {k[0]: e for k, e in d.items()}) for mask, d in levels]

            def lookup_one(key: tuple[int, ...]) -> Entry | None:
                v = key[0]
                for mask, d in single:
                    hit = d.get(v & mask)
                    if hit is not None:
                        return hit
                return None

            return lookup_one

        def lookup(key: tuple[int, ...]) -> Entry | None:
            head, v, tail = key[:pos], key[pos], key[pos + 1 :]
            for mask, d in levels:
                hit = d.get(head + (v & mask,) + tail)
                if hit is not None:
                    return hit
            return None

        return lookup

    def _make_scan_lookup(self, ordered: list[Entry]) -> Callable[[tuple[int, ...]], Entry | None]:
        kinds = [k.match_type for k in self.key]
        widths = [k.bitwidth for k in self.key]

        def matches(e: Entry, key: tuple[int, ...]) -> bool:
            for kind, width, m, v in zip(kinds, widths, e.match, key, strict=True):
                if kind in ("exact", "valid"):
                    if v != m:
                        return False
                elif kind == "ternary":
                    if v & m[1] != m[0]:
                        return False
                elif kind == "lpm":
                    mask = ((1 << width) - 1) ^ ((1 << (width - m[1])) - 1)
                    if v & mask != m[0]:
                        return False
                elif kind == "range" and not m[0] <= v <= m[1]:
                    return False
            return True

        def lookup(key: tuple[int, ...]) -> Entry | None:
            for e in ordered:
                if matches(e, key):
                    return e
            return None

        return lookup
