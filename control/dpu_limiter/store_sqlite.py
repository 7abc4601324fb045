"""The desired state in a SQLite file (WAL, synchronous=FULL): the control plane's embedded default
(store.py holds what both databases share)."""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .replay import Db
from .store import (
    LEGACY_COLUMNS,
    REPLICAS_SCHEMA,
    SCHEMA,
    StateInUse,
    Store,
    add_replica_session,
    schema_v4,
    statements,
)


def _sqlite_v1(db: Db) -> None:
    """Version 1: the schema as it was before versions were counted, and what files older than it lack."""
    for sql in statements(SCHEMA):
        db.execute(sql)
    for table, added in LEGACY_COLUMNS.items():
        have = db.columns(table)
        for name, decl in added:
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")  # names from LEGACY_COLUMNS only


def sqlite_path(db: Path | str) -> str:
    """The file of a path or sqlite: URL (sqlite:///abs/file, sqlite://relative/file, or sqlite:file)."""
    text = str(db)
    if not text.startswith("sqlite:"):
        return text
    rest = text.removeprefix("sqlite:")
    return rest.removeprefix("//") if rest.startswith("//") else rest


def _sqlite_v2(db: Db) -> None:
    """Version 2: the replicas table, as PostgreSQL's (one schema; a SQLite file is served by one control plane,
    which has no use for it)."""
    for sql in statements(REPLICAS_SCHEMA):
        db.execute(sql)


class SqliteCursor(sqlite3.Cursor):
    """A SQLite cursor answering replay.Db's catalog questions (on a cursor of its own: they must not
    replace the rows this one is going through)."""

    def columns(self, table: str) -> set[str]:
        """The table's column names."""
        return {r[1] for r in self.connection.execute(f"PRAGMA table_info({table})")}  # names from the code only

    def triggers(self) -> list[tuple[str, str]]:
        """Every trigger in the file (the control plane makes none)."""
        sql = "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' ORDER BY name"
        return [(r[0], r[1]) for r in self.connection.execute(sql)]


class SqliteStore(Store):
    """The desired state in a SQLite file (WAL, synchronous=FULL): the embedded default."""

    MIGRATIONS = (_sqlite_v1, _sqlite_v2, add_replica_session, schema_v4)
    TOKEN = True  # PRAGMA data_version (_token)

    def __init__(self, path: Path | str, exclusive: bool = False) -> None:
        self.path = sqlite_path(path)
        self._lock_file: IO[bytes] | None = None
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            if exclusive:
                self._lock_file = _lock(Path(f"{self.path}.lock"), self.path)
        # Autocommit mode: transactions are begun explicitly, so that each is exactly one write (without
        # them each statement, each row of an executemany, would be a transaction with its own fsync).
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        try:
            self._open()
        except BaseException:  # a schema newer than ours: nothing of it is kept open
            self._close()
            raise

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Db]:
        # IMMEDIATE: the write lock is taken at BEGIN, so writers queue instead of failing at upgrade.
        cur = self._db.cursor(SqliteCursor)
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[Db]:
        cur = self._db.cursor(SqliteCursor)
        cur.execute("BEGIN")
        try:
            yield cur
        finally:
            cur.execute("COMMIT")

    @contextlib.contextmanager
    def _statement(self) -> Iterator[Db]:
        yield self._db.cursor(SqliteCursor)

    def _token(self) -> object:
        # PRAGMA data_version changes when another connection commits (our own commits leave it).
        return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    def _close(self) -> None:
        self._db.close()
        if self._lock_file is not None:
            self._lock_file.close()


def _lock(lock_path: Path, db_path: str) -> IO[bytes]:
    """An exclusive lock on a state file, held while the returned file stays open: one control plane
    per file (a second one would write from its own stale copy of the state). A lock file of its
    own, and flock, not SQLite's POSIX locks: closing any descriptor of the database would drop those."""
    f = lock_path.open("a+b")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise StateInUse(f"{db_path}: in use by another control plane (locked: {lock_path})") from None
    return f


@contextlib.contextmanager
def read_only(path: Path | str) -> Iterator[Db]:
    """One read-only snapshot of a state file, without migrating it (a verifier's copy stays untouched)."""
    file = Path(sqlite_path(path))
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no such state file")
    db = sqlite3.connect(f"file:{file.resolve()}?mode=ro", uri=True, isolation_level=None)
    try:
        cur = db.cursor(SqliteCursor)
        cur.execute("BEGIN")  # one snapshot: a write in between cannot make chain and tables disagree
        yield cur
        cur.execute("COMMIT")
    finally:
        db.close()
