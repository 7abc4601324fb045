"""The state the audit log says, and where the stored tables differ from it.

Every write stores its rows and one audit record per object (the object's values and the write's
generation) in one transaction, so replaying the records from genesis gives exactly the rows and the
generation the tables must hold. Comparing the two binds the tables to the log: a row edited, added
or removed behind the log is named, with the record that says otherwise. Both sides are read raw
(not through the models), so a value of the wrong type is a difference, not a crash.

Records written before a column existed lack its key: they replay with the default the migration
gives that column (store.py's schema version 1), as the table got it. One pass over the records and one
over the rows: no work grows faster than the state.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .audit import AuditRecord

REQUIRED = object()  # a column every version wrote

# Each table's key and columns as the store writes them, with the default a migration gave each
# column that older versions did not have.
TABLES: dict[str, tuple[str, dict[str, Any]]] = {
    "pods": ("name", {"ipv4_prefixes": REQUIRED}),
    "dpus": (
        "name",
        {
            "p4runtime_address": REQUIRED,
            "device_id": REQUIRED,
            "pod": REQUIRED,
            "role": REQUIRED,
            "host_port": REQUIRED,
            "uplink_port": REQUIRED,
            "buffer_bytes": 0,
            "node_mac": "",
            "seal_port": None,
        },
    ),
    "caps": (
        "pod",
        {
            "egress_bps": REQUIRED,
            "ingress_bps": REQUIRED,
            "window_s": REQUIRED,
            "burst_bytes": REQUIRED,
            "rebalance": 0,
            "mode": "rate",
        },
    ),
    "routers": ("name", {"pods": REQUIRED}),
}
JSON_COLUMNS = {("pods", "ipv4_prefixes"), ("routers", "pods")}  # stored as JSON text

# action -> (table, whether it deletes); the object names the row: "pod/a", "pod/a/cap", "dpu/x", "router/r".
ACTIONS: dict[str, tuple[str, bool]] = {
    "apply-pod": ("pods", False),
    "register-dpu": ("dpus", False),
    "update-dpu": ("dpus", False),
    "set-cap": ("caps", False),
    "apply-router": ("routers", False),
    "delete-pod": ("pods", True),
    "delete-dpu": ("dpus", True),
    "delete-cap": ("caps", True),
    "delete-router": ("routers", True),
}
OBJECTS = {"pods": ("pod/", ""), "dpus": ("dpu/", ""), "caps": ("pod/", "/cap"), "routers": ("router/", "")}

Rows = dict[str, dict[Any, dict[str, Any]]]  # table -> key -> column -> value


class Db(Protocol):
    """A cursor in one of the stores' databases (SQLite or PostgreSQL), in a transaction: SQL with `?`
    placeholders, and the catalog questions whose SQL differs between the two."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Any:
        """Run one statement; the result iterates over its rows (and has fetchone and fetchall)."""

    def executemany(self, sql: str, params: Any, /) -> Any:
        """Run one statement for each parameter tuple."""

    def columns(self, table: str) -> set[str]:
        """The table's column names (empty: no such table)."""

    def triggers(self) -> list[tuple[str, str]]:
        """Each trigger (name, table) that is not the database's own: anything that could change rows
        behind the log."""


class LogError(ValueError):
    """A record that no version of the store writes (only a forger who recomputed the hashes can)."""


@dataclass
class Logged:
    """What the log says: every table's rows, the generation, and which record said each."""

    rows: Rows = field(default_factory=lambda: {t: {} for t in TABLES})
    said_by: dict[tuple[str, Any], int] = field(default_factory=dict)  # (table, key) -> last record writing/deleting it
    generation: int = 0
    generation_seq: int = 0


def replay(records: list[AuditRecord], start: Logged | None = None) -> Logged:
    """The state a (verified) chain of records leaves, from an empty store or from what the records before
    them left (`start`, not changed)."""
    out = Logged()
    if start is not None:
        out.rows = {table: dict(rows) for table, rows in start.rows.items()}  # rows are replaced, never edited
        out.said_by = dict(start.said_by)
        out.generation, out.generation_seq = start.generation, start.generation_seq
    columns = {table: list(cols.items()) for table, (_, cols) in TABLES.items()}
    for r in records:
        if r.action not in ACTIONS:
            raise _bad(r, "no version of the control plane writes this action")
        table, deletes = ACTIONS[r.action]
        prefix, suffix = OBJECTS[table]
        obj, payload = r.object, r.payload
        name = obj[len(prefix) : len(obj) - len(suffix)]
        if not (obj.startswith(prefix) and obj.endswith(suffix) and name and "/" not in name):
            raise _bad(r, f"the object is not a {table[:-1]}'s name")
        if not isinstance(payload, dict):
            raise _bad(r, "the payload is not an object")
        gen = payload.get("generation")
        if type(gen) is not int or gen < out.generation:
            raise _bad(r, f"generation {gen!r} does not follow {out.generation}")
        out.generation, out.generation_seq = gen, r.seq
        out.said_by[table, name] = r.seq
        if deletes:
            out.rows[table].pop(name, None)
            continue
        row: dict[str, Any] = {}
        for col, default in columns[table]:
            value = payload.get(col, default)
            if value is REQUIRED:
                raise _bad(r, f"the payload has no {col}")
            row[col] = value
        out.rows[table][name] = row
    return out


def _bad(r: AuditRecord, why: str) -> LogError:
    return LogError(f"record {r.seq} ({r.action} {r.object}): {why}")


def stored_rows(db: Db) -> tuple[Rows, dict[str, Any]]:
    """The tables' rows as stored (a column an unmigrated file lacks reads as its migration default),
    and the meta table."""
    rows: Rows = {}
    for table, (key, columns) in TABLES.items():
        present = db.columns(table)
        rows[table] = {}
        if not present:  # a table older files do not have (routers)
            continue
        cols = [c for c in columns if c in present]
        sql = f"SELECT {', '.join([key, *cols])} FROM {table}"  # names from TABLES only
        for values in db.execute(sql):
            row = {c: columns[c] for c in columns if c not in present}  # REQUIRED if a column was dropped
            row.update(zip(cols, values[1:], strict=True))
            for col in row:
                if (table, col) in JSON_COLUMNS and isinstance(row[col], str):
                    try:
                        row[col] = json.loads(row[col])
                    except ValueError:
                        pass  # stays text: differs from the list the log has
            rows[table][values[0]] = row
    meta = {k: v for k, v in db.execute("SELECT key, value FROM meta")} if db.columns("meta") else {}
    return rows, meta


def differences(db: Db, logged: Logged) -> list[str]:
    """Every way the stored state differs from what the (verified) records say (`logged`: their replay), first
    one first: schema, then pods, dpus, caps and routers by name, then the generation."""
    out = [
        f"schema: trigger {name!r} on {on} is not the control plane's (it could change rows behind the log)"
        for name, on in db.triggers()
    ]
    stored, meta = stored_rows(db)
    for table, (_, columns) in TABLES.items():
        have, want = stored[table], logged.rows[table]
        found: list[tuple[str, int, str]] = []
        for name, row in have.items():
            seq = logged.said_by.get((table, name))
            if name not in want:
                why = f"the log deleted it (record {seq})" if seq else "no record in the log writes it"
                found.append((str(name), 0, f"{table}/{name}: stored, but {why}"))
                continue
            for i, col in enumerate(columns):
                if not _same(row[col], want[name][col]):
                    said = f"stored {_show(row[col])}, the log says {_show(want[name][col])} (record {seq})"
                    found.append((str(name), i, f"{table}/{name}.{col}: {said}"))
        for name in want.keys() - have.keys():
            seq = logged.said_by[table, name]
            found.append((name, 0, f"{table}/{name}: not stored, but the log has it (record {seq})"))
        out += [text for _, _, text in sorted(found)]
    # Only the generation is read from meta; other keys change nothing the control plane does.
    stored_gen = meta.get("generation")
    records = logged.generation_seq > 0  # every record carries its write's generation
    if records and stored_gen != str(logged.generation):
        stored_text = "nothing" if stored_gen is None else _show_meta(stored_gen)
        out.append(
            f"meta/generation: stored {stored_text}, the log says {logged.generation} (record {logged.generation_seq})"
        )
    elif not records and stored_gen is not None:
        out.append(f"meta/generation: stored {_show_meta(stored_gen)}, but the log has no records")
    return out


def _same(stored: Any, logged: Any) -> bool:
    """Equal as the control plane reads them: numbers by value (REAL 8e6 is the log's 8000000; the
    rebalance flag is stored 0/1), anything else by type and value."""
    if stored is REQUIRED:
        return False
    numbers = (int, float)
    if isinstance(stored, numbers) and isinstance(logged, numbers):
        return bool(stored == logged)
    return type(stored) is type(logged) and bool(stored == logged)


def _show(value: Any) -> str:
    if value is REQUIRED:
        return "nothing (no such column)"
    if isinstance(value, float) and not isinstance(value, bool):
        short = format(value, "g")
        return short if float(short) == value else repr(value)
    if isinstance(value, list):
        return json.dumps(value)
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:80]}... ({len(text)} chars)"


def _show_meta(value: Any) -> str:
    return value if isinstance(value, str) and value.isdigit() and len(value) <= 20 else _show(value)
