"""Which store a `--db` value names, opened: a path or sqlite: URL is a SQLite file (store_sqlite.py), a
postgresql:// URL a PostgreSQL database (store_pg.py, which needs psycopg); and the change log of either,
read without migrating it (`audit verify`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from . import audit
from .replay import Db
from .store import Store, audit_rows, is_url, verify_in
from .store_sqlite import SqliteStore
from .store_sqlite import read_only as sqlite_read_only


def open_store(db: Path | str, exclusive: bool = False) -> Store:
    """The store `db` names (exclusive: this process serves it; a second one is refused)."""
    if is_url(db):
        from .store_pg import PgStore  # psycopg is needed only for PostgreSQL

        return PgStore(db, exclusive)
    return SqliteStore(db, exclusive)


def read_audit(path: Path | str) -> list[audit.AuditRecord]:
    """The audit records of a state file, opened read-only (a verifier's copy stays untouched), or of a
    PostgreSQL database (in a read-only transaction)."""
    with read_only(path) as db:
        return audit_rows(db)


def verify_file(path: Path | str, anchor: str | None = None) -> audit.Verdict:
    """`audit verify`: the chain of a state file, its anchor if given, and its tables against the
    chain, opened read-only (a verifier's copy stays untouched, so an old file is read unmigrated);
    or of a PostgreSQL database, in one read-only snapshot."""
    with read_only(path) as db:
        return verify_in(db, anchor)


@contextlib.contextmanager
def read_only(path: Path | str) -> Iterator[Db]:
    """One read-only snapshot of a state file or database, without migrating it."""
    if is_url(path):
        from .store_pg import read_only as pg_read_only

        with pg_read_only(str(path)) as cur:
            yield cur
    else:
        with sqlite_read_only(path) as cur:
            yield cur
