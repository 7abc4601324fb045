"""Durable desired state: one store over SQLite (the embedded default: WAL, synchronous=FULL) or
PostgreSQL (store_pg.py: for more than one replica on one database). Either way an acknowledged write
survives a crash, every write is one transaction with its hash-chained audit records, and the schema
is versioned (a schema_version table, migration steps applied in order at open)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from . import audit, replay
from .models import Cap, Change, DesiredState, Dpu, Pod, Role, Router
from .replay import Db

LOG = logging.getLogger(__name__)

HOLDS_PER_STATEMENT = 499  # growth holds stored by one INSERT (998 parameters: within SQLite's oldest limit, 999)


@dataclasses.dataclass(frozen=True)
class Grant:
    """A DPU's share of its pod's cap as granted (None: its floor)."""

    dpu: str
    share: Cap | None


@dataclasses.dataclass(frozen=True)
class GrowthHold:
    """No DPU of `pod` may grow before `until` (seconds since the epoch)."""

    pod: str
    until: float


SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pods (name TEXT PRIMARY KEY, ipv4_prefixes TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dpus (
    name TEXT PRIMARY KEY, p4runtime_address TEXT NOT NULL, device_id INTEGER NOT NULL,
    pod TEXT NOT NULL REFERENCES pods(name), role TEXT NOT NULL,
    host_port INTEGER NOT NULL, uplink_port INTEGER NOT NULL, buffer_bytes INTEGER NOT NULL DEFAULT 0,
    node_mac TEXT NOT NULL DEFAULT '', seal_port INTEGER);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY, ts REAL NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
    object TEXT NOT NULL, payload TEXT NOT NULL, prev TEXT NOT NULL, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS routers (name TEXT PRIMARY KEY, pods TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS grants (dpu TEXT PRIMARY KEY, share TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS growth_holds (id INTEGER PRIMARY KEY, pod TEXT NOT NULL, until REAL NOT NULL);
CREATE TABLE IF NOT EXISTS lease_holds (dpu TEXT PRIMARY KEY, until REAL NOT NULL);
CREATE TABLE IF NOT EXISTS caps (
    pod TEXT PRIMARY KEY REFERENCES pods(name), egress_bps REAL NOT NULL, ingress_bps REAL NOT NULL,
    window_s REAL NOT NULL, burst_bytes INTEGER NOT NULL, rebalance INTEGER NOT NULL DEFAULT 0,
    mode TEXT NOT NULL DEFAULT 'rate');
"""

# Columns added after the first state files were written: an older file gets them, with these defaults,
# in schema version 1 (replay.TABLES gives the log's records from before them the same defaults).
LEGACY_COLUMNS = {
    "caps": [("rebalance", "INTEGER NOT NULL DEFAULT 0"), ("mode", "TEXT NOT NULL DEFAULT 'rate'")],
    "dpus": [
        ("buffer_bytes", "INTEGER NOT NULL DEFAULT 0"),
        ("node_mac", "TEXT NOT NULL DEFAULT ''"),
        ("seal_port", "INTEGER"),
    ],
}

# Schema version 2: the replicas serving one database (replicas.py), each with a lease on the database's own
# clock (seconds since the epoch there: the replicas' clocks need not agree). Not desired state and not audited,
# as grants are not: who serves changes nothing a DPU enforces.
REPLICAS_SCHEMA = """
CREATE TABLE IF NOT EXISTS replicas (
    id TEXT PRIMARY KEY, address TEXT NOT NULL, lease_until REAL NOT NULL, joined REAL NOT NULL);
"""
# Version 3: the database session a replica writes through, as its last renewal named it (Store.session): the
# server process's id, and when the server that runs it started. NULL where the database has no sessions.
REPLICA_SESSION_COLUMNS = (("session_pid", "INTEGER"), ("session_epoch", "REAL"))

# Version 4: the pipeline instance (its lease epoch, limiter.p4) each DPU's holder last found on it, and when
# that DPU's state was lost as the holder judged it (seconds since the epoch; NULL: nothing passed before it to
# wait for). A successor (another replica, or this control plane restarted) resumes from it rather than take
# an instance armed by its predecessor for a stranger's, which holds a DPU without a lease for a window.
EPOCHS_SCHEMA = """
CREATE TABLE IF NOT EXISTS dpu_epochs (dpu TEXT PRIMARY KEY, epoch TEXT NOT NULL, lost_at REAL);
"""
# And each replica's lease lengths, as its last renewal named them: its own in the database, and the one it
# gives DPUs. A replica taking DPUs over counts the longest of them, not its own, as what the one before it may
# still have in force (LimiterService._adopt): replicas need not all run with the same settings.
REPLICA_LEASE_COLUMNS = (("lease_s", "REAL"), ("dpu_lease_s", "REAL"))

Migration = Callable[[Db], None]
Session = tuple[int, float]  # a database session: its server process's id, and when that server started


def add_replica_session(db: Db, real: str = "REAL") -> None:
    """Version 3 (both databases): the replicas table's session columns (REPLICA_SESSION_COLUMNS); `real` is the
    database's 8-byte float type."""
    _add_columns(db, "replicas", REPLICA_SESSION_COLUMNS, real)


def schema_v4(db: Db, real: str = "REAL") -> None:
    """Version 4 (both databases): the dpu_epochs table (EPOCHS_SCHEMA) and the replicas' lease lengths
    (REPLICA_LEASE_COLUMNS); `real` is the database's 8-byte float type."""
    for sql in statements(EPOCHS_SCHEMA.replace(" REAL", f" {real}")):
        db.execute(sql)
    _add_columns(db, "replicas", REPLICA_LEASE_COLUMNS, real)


def _add_columns(db: Db, table: str, columns: tuple[tuple[str, str], ...], real: str) -> None:
    for name, decl in columns:
        if name not in db.columns(table):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl.replace('REAL', real)}")  # names from the code


def statements(script: str) -> list[str]:
    """A script's statements, to run one at a time in a transaction (sqlite3's executescript commits first)."""
    return [s.strip() for s in script.split(";") if s.strip()]


def is_url(db: Path | str) -> bool:
    """Whether `--db` names a PostgreSQL database (postgresql:// or postgres://) rather than a SQLite file."""
    return str(db).startswith(("postgresql://", "postgres://"))


def shown_db(db: Path | str) -> str:
    """`--db` as messages and logs show it: a URL without its password."""
    parts = urlsplit(str(db))
    if not is_url(db) or parts.password is None:
        return str(db)
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


_UNBOUND = object()  # verify_state has not yet seen the tables match the log


class StateMismatch(ValueError):
    """A state file (or database) whose audit log is broken, or whose tables are not what the log says: the
    control plane does not start on it. The message is one line naming the file and the first
    difference."""

    def __init__(self, path: Path | str, verdict: audit.Verdict, doing: str = "not starting") -> None:
        what = (
            "the stored state is not what its audit log says"
            if verdict.check == "state"
            else "its audit log is not intact"
        )
        super().__init__(
            f"{path}: {what}: {verdict.problem}; {doing} (restore the file from a backup; "
            f"`dpu-limiter audit verify --db {path}` shows the same)"
        )
        self.path = str(path)
        self.verdict = verdict


class Store:
    """The desired state in a database; every method is one transaction.

    `stores.open_store(db)` opens the right implementation for `db`: a path (or sqlite://PATH) is a SQLite
    file (store_sqlite.SqliteStore), a postgresql:// URL a PostgreSQL database (store_pg.PgStore). Everything above the
    connection is here, shared: the SQL (written in the dialect both accept, `?` placeholders), the
    change log's chaining, the binding of tables to the log, and the schema's versions. A subclass gives
    its connection, transactions, catalog and migration steps.
    """

    MIGRATIONS: tuple[Migration, ...] = ()  # step i takes the schema from version i to i + 1
    GREATEST = "MAX"  # the larger of two values in an expression (PostgreSQL's is GREATEST)
    # The database's clock in seconds since the epoch, as an expression: replicas' leases are judged on it.
    NOW = "((julianday('now') - 2440587.5) * 86400.0)"
    SHARED = False  # whether several serving control planes (replicas) may share the database
    TOKEN = False  # whether _token tells another connection's commits apart (else every write checks the tables)
    # A statement that tells the database's other sessions the change log moved, run in each commit's
    # transaction (PostgreSQL's NOTIFY: replicas learn of a write at once, not at their next poll; watch_log).
    LOG_MOVED: str | None = None

    path: str
    head: tuple[int, str]

    def _open(self) -> None:
        """Migrate the schema and read the log's head: the subclass's __init__ calls it once connected."""
        # Reentrant: a compound call (commit_planned, load_at) holds the connection across the calls it makes.
        self._lock = threading.RLock()
        self._migrate()
        # The version token (_token) when the tables last matched the log (_UNBOUND: not checked, as for
        # a database opened only to be read or repaired).
        self._bound: object = _UNBOUND
        self._verified: Verified | None = None  # the log as last checked against the tables (verified_in)
        with self._lock, self._snapshot() as cur:
            # The change log's head (last record's sequence number and hash), as this store last wrote or read it.
            self.head = _head(cur)

    # What a subclass gives: its connection's transactions (entered with self._lock held), a version
    # token, and closing.

    def _transaction(self) -> contextlib.AbstractContextManager[Db]:
        """One write transaction, serialised with every other writer of the database: committed when the
        block ends, rolled back if it raises."""
        raise NotImplementedError

    def _snapshot(self) -> contextlib.AbstractContextManager[Db]:
        """One read transaction: every statement in it sees the same committed state."""
        raise NotImplementedError

    def _statement(self) -> contextlib.AbstractContextManager[Db]:
        """A cursor outside any transaction: each statement commits by itself."""
        raise NotImplementedError

    def _token(self) -> object:
        """A value that changes when another connection commits to the database and not when this one
        does; None if the database has none (then every write and load checks the tables again)."""
        return None

    def _close(self) -> None:
        raise NotImplementedError

    def _migrate(self) -> None:
        """Bring the schema to the newest version this control plane knows, in one write transaction
        (so two control planes starting on one database migrate it once); a database of a newer
        version than that is refused, not written by code that does not know its tables."""
        with self._lock, self._transaction() as cur:
            cur.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied TEXT NOT NULL)"
            )
            row = cur.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = int(row[0]) if row and row[0] is not None else 0
            if version > len(self.MIGRATIONS):
                raise sqlite3.DatabaseError(
                    f"{self.path}: schema version {version} is newer than this control plane's "
                    f"({len(self.MIGRATIONS)}); run the version that wrote it"
                )
            for step in range(version, len(self.MIGRATIONS)):
                self.MIGRATIONS[step](cur)
                cur.execute(
                    "INSERT INTO schema_version(version, applied) VALUES (?, ?)",
                    (step + 1, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
                )

    def schema_version(self) -> int:
        """The schema version the database is at."""
        with self._lock, self._snapshot() as cur:
            return int(cur.execute("SELECT MAX(version) FROM schema_version").fetchone()[0])

    def close(self) -> None:
        """Close the database (and give up its lock), once no thread is in a transaction."""
        with self._lock:  # a write a cancelled task left running in a thread may still be in it
            self._close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Db]:
        """One write transaction under the lock (the connection is used by one thread at a time)."""
        with self._lock, self._transaction() as cur:
            yield cur

    def commit(self, changes: list[Change], actor: str = "local", expect_head: tuple[int, str] | None = None) -> int:
        """Store every change and its audit record in one transaction (all or none); returns the new generation.

        With `expect_head`, only if the change log's head is still that one, the head of the state the changes
        were planned against (else StateStale, nothing written)."""
        todo = [c for c in changes if c.verb != "unchanged"]
        if not todo:  # nothing to record: a new generation without a record would not replay
            with self._lock, self._snapshot() as cur:
                row = cur.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
            return int(row[0]) if row else 0
        with self._writing() as cur:
            self._still_bound(cur)
            gen = self._bump(cur)
            # The head as committed, read after the transaction's write lock is taken: another writer of
            # the database (another replica) may have appended since this store last wrote.
            head = _head(cur)
            if expect_head is not None and head != expect_head:
                raise StateStale(f"{self.path}: the change log moved from record {expect_head[0]} to {head[0]}")
            before = head
            # In the changes' order, a run of the same statement at a time (a fleet's write is 40,000 rows:
            # one call per row costs more than the rows do), then the change log's records, chained in order.
            records, payloads = [], []
            for sql, run in itertools.groupby(map(_change_sql, todo), key=lambda x: x[0]):
                steps = list(run)
                cur.executemany(sql, [params for _, params, _ in steps])
                for _, _, (action, obj, payload) in steps:
                    payload["generation"] = gen  # each change's payload is made for it (_change_sql)
                    head, record = _audit_row(head, actor, action, obj, payload)
                    records.append(record)
                    payloads.append(payload)
            cur.executemany(AUDIT_INSERT, records)
            if self.LOG_MOVED is not None:
                cur.execute(self.LOG_MOVED)  # delivered as the transaction commits, and only if it does
        self.head = head
        if not self.TOKEN and self._verified is not None and self._verified.head == before:
            # Without a token the next write checks again. The tables matched the log when this transaction
            # began and it wrote rows and records together: that check goes on from here instead of reading
            # this write's records back. (With a token only another writer's commit makes a check, once.)
            written = [audit.AuditRecord(*r[:5], p, *r[6:]) for r, p in zip(records, payloads, strict=True)]
            self._verified = Verified(replay.replay(written, self._verified.logged), head)
        return gen

    @staticmethod
    def _bump(cur: Db) -> int:
        row = cur.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
        gen = int(row[0]) + 1 if row else 1
        cur.execute(
            "INSERT INTO meta(key, value) VALUES ('generation', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (str(gen),),
        )
        return gen

    def audit_records(self) -> list[audit.AuditRecord]:
        """Every audit record, oldest first."""
        with self._lock, self._snapshot() as cur:
            return audit_rows(cur)

    def verify_state(self, anchor: str | None = None) -> audit.Verdict:
        """Check the audit chain and that the tables are what it says (what the control plane
        checks before it starts). Once they match, every later write and load first checks again
        if another connection wrote the database meanwhile, and refuses if they no longer match."""
        with self._lock:
            token = self._token()  # read first: a write in between only makes us check again
            with self._snapshot() as cur:
                verdict, self._verified = verified_in(cur, anchor)
            if verdict.ok:
                self._bound = token
            return verdict

    def _still_bound(self, cur: Db) -> None:
        """In a transaction: the tables still match the log, or StateMismatch. A row edited in the
        database while the control plane runs is neither written over nor read into what it enforces."""
        if self._bound is _UNBOUND:
            return
        token = self._token()
        if token is not None and token == self._bound:  # nobody else committed (our own commits leave it)
            return
        # Another writer, or only a checkpoint (or a database with no token): check, from the last check on.
        verdict, self._verified = verified_in(cur, None, self._verified)
        if not verdict.ok:
            raise StateMismatch(self.path, verdict, "refusing to use it")
        self._bound = token

    def put_pod(self, pod: Pod, actor: str = "local") -> int:
        """Insert or replace a pod; returns the new generation."""
        return self.commit([Change("update", "pod", pod.name, after=pod)], actor)

    def add_dpu(self, dpu: Dpu, actor: str = "local") -> int:
        """Insert a DPU (sqlite3.IntegrityError if the name exists, from either database)."""
        return self.commit([Change("create", "dpu", dpu.name, after=dpu)], actor)

    def put_cap(self, pod: str, cap: Cap, actor: str = "local") -> int:
        """Insert or replace a pod's cap."""
        return self.commit([Change("update", "cap", pod, after=cap)], actor)

    def load_at(self) -> tuple[DesiredState, tuple[int, str]]:
        """The desired state and the change log's head it was read at (one hold of the connection)."""
        with self._lock:
            return self.load(), self.head

    def load(self) -> DesiredState:
        """Read the whole desired state (and, in the same snapshot, the change log's head: `head`)."""
        with self._lock, self._snapshot() as cur:
            self._still_bound(cur)
            state = self._read(cur)
            self.head = _head(cur)
            return state

    # Replicas (replicas.py): each serving control plane's lease, on the database's clock, and the election
    # ids they bid at DPUs. Statements of their own (no write lock): a fleet's long write must not hold a
    # renewal back.

    def renew_replica(
        self,
        replica: str,
        address: str,
        lease_s: float,
        session: Session | None = None,
        join: bool = True,
        dpu_lease_s: float | None = None,
    ) -> list[tuple[str, str]]:
        """Extend `replica`'s lease to `lease_s` from now on the database's clock (joining if it has no row),
        writing through `session` (its service's Store.session) and giving DPUs leases of `dpu_lease_s`; returns
        the live replicas (live_replicas), as (id, address). Without `join` a lease that ended (it ran out, or
        ran out its grace once its session ended: PgStore._live) is not extended: the others may have taken
        the DPUs of a replica that held them; it must not come back to life behind their backs, but find itself
        not live, stop writing, and join again. A lease still running is extended, naming the new session (a
        replica whose session the database ended, back within its grace, holds on)."""
        pid, epoch = session if session is not None else (None, None)
        with self._lock, self._statement() as cur:
            cur.execute(
                "INSERT INTO replicas(id, address, lease_until, joined, session_pid, session_epoch, lease_s, "
                f"dpu_lease_s) VALUES (?, ?, {self.NOW} + ?, {self.NOW}, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET address = excluded.address, "
                f"lease_until = CASE WHEN ? OR replicas.lease_until > {self.NOW} "
                "THEN excluded.lease_until ELSE replicas.lease_until END, "
                "session_pid = excluded.session_pid, session_epoch = excluded.session_epoch, "
                "lease_s = excluded.lease_s, dpu_lease_s = excluded.dpu_lease_s",
                (replica, address, lease_s, pid, epoch, lease_s, dpu_lease_s, join),
            )
            return self._live(cur)

    def live_replicas(self) -> list[tuple[str, str]]:
        """Every replica whose lease is running on the database's clock, as (id, address). (PostgreSQL's first
        cuts the lease of a replica whose session it shows ended to SESSION_GRACE_S: PgStore._live.)"""
        with self._lock, self._statement() as cur:
            return self._live(cur)

    def _live(self, cur: Db) -> list[tuple[str, str]]:
        rows = cur.execute(f"SELECT id, address FROM replicas WHERE lease_until > {self.NOW} ORDER BY id")
        return [(r[0], r[1]) for r in rows.fetchall()]

    def longest_leases(self) -> tuple[float, float]:
        """The longest replica lease and DPU lease any replica's renewal named (0 where none did), in seconds."""
        with self._lock, self._statement() as cur:
            row = cur.execute("SELECT MAX(lease_s), MAX(dpu_lease_s) FROM replicas").fetchone()
        return (float(row[0] or 0.0), float(row[1] or 0.0)) if row else (0.0, 0.0)

    def session_ended(self, replica: str) -> bool:
        """Whether the database shows the session `replica` last renewed through ended (a file: never)."""
        return False

    def watch_log(self, moved: Callable[[], None], stop: threading.Event) -> None:
        """Call `moved` whenever another session commits to the change log, until `stop` is set (blocking: a
        thread's; PostgreSQL's listens for LOG_MOVED; a file has no other sessions to hear of)."""

    def session(self) -> Session | None:
        """This store's database session (the server process's id, and when the server started, in seconds
        since the epoch), or None where the database has none to show (SQLite)."""
        return None

    def pin_session(self) -> None:
        """Replace a broken session only through new_session (PostgreSQL's; a file has no sessions)."""

    def session_broken(self) -> bool:
        """Whether the session is known to have ended."""
        return False

    def new_session(self) -> None:
        """Open another session in place of this one."""

    def leave_replica(self, replica: str) -> None:
        """Give `replica`'s lease up (a replica that stops): the others take its DPUs at once."""
        with self._lock, self._statement() as cur:
            cur.execute("DELETE FROM replicas WHERE id = ?", (replica,))
            # Rows of replicas long gone (killed: nobody deleted them) are forgotten too.
            cur.execute(f"DELETE FROM replicas WHERE lease_until < {self.NOW} - 3600")

    def next_election_id(self) -> int:
        """A number larger than any this database gave before (P4Runtime election ids: the newest primary
        of a DPU outbids every earlier one, whichever replica that was)."""
        with self._writing() as cur:
            row = cur.execute("SELECT value FROM meta WHERE key = 'election'").fetchone()
            value = int(row[0]) + 1 if row else 1
            cur.execute(
                "INSERT INTO meta(key, value) VALUES ('election', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (str(value),),
            )
            return value

    def try_planning_lock(self) -> bool:
        """Take the database's planning lock if it is free (True): a writer holds it from its plan to its commit,
        so that no other replica commits in between. A SQLite file has one writer: it is always free."""
        return True

    def release_planning_lock(self) -> None:
        """Give the planning lock up."""

    def commit_planned(
        self, changes: list[Change], actor: str, planned_at: tuple[int, str], unplan: bool
    ) -> tuple[int, tuple[int, str]]:
        """Commit a write planned against the state of change log head `planned_at` (shared: refused as
        StateStale if a replica appended since), then, if `unplan`, give the planning lock up in the same hold
        of the connection (not queued behind other threads' transactions); returns the new generation and the
        change log's head it made. A release that fails leaves the write done (StateStale is not raised)."""
        with self._lock:
            gen = self.commit(changes, actor, planned_at if self.SHARED else None)
            head = self.head
            if unplan:
                try:
                    self.release_planning_lock()
                except Exception as exc:  # the write is stored all the same; a broken session took the lock along
                    LOG.warning("giving the planning lock up after a commit: %s", exc)
            return gen, head

    def log_head(self) -> tuple[int, str]:
        """The change log's head as committed now (another replica may have appended since `head`)."""
        with self._lock, self._statement() as cur:
            return _head(cur)

    # Grants and growth holds: each DPU's share as granted, and, while a pod's shares move, until when
    # (wall clock) a DPU of it may still pass an old, larger share (or its bytes count in the window).
    # Not desired state and not audited: what a control plane started after a crash resumes from and
    # waits for, since it has nothing else of its predecessor's grants.

    def save_shares(self, writes: list[Grant | GrowthHold]) -> list[int | None]:
        """Record grants and growth holds in one transaction (a later grant of a DPU replaces an earlier one);
        returns each hold's id, None for a grant. A share pass that shrinks stores both before it tells any
        DPU: one commit, not one each."""
        grants = [(w.dpu, _share_json(w.share)) for w in writes if isinstance(w, Grant)]
        with self._writing() as cur:
            if grants:
                cur.executemany(
                    "INSERT INTO grants(dpu, share) VALUES (?, ?) ON CONFLICT(dpu) DO UPDATE SET share=excluded.share",
                    grants,
                )
            # Holds in statements of HOLDS_PER_STATEMENT rows, not a round trip each (a fleet's shrink stores one
            # per pod). RETURNING gives no order: each id goes back to a hold of its values (two holds alike are
            # alike to release too).
            holds = [w for w in writes if isinstance(w, GrowthHold)]
            ids: dict[tuple[str, float], list[int]] = {}
            for at in range(0, len(holds), HOLDS_PER_STATEMENT):
                chunk = holds[at : at + HOLDS_PER_STATEMENT]
                rows = ", ".join(["(?, ?)"] * len(chunk))
                sql = f"INSERT INTO growth_holds(pod, until) VALUES {rows} RETURNING id, pod, until"
                for hold_id, pod, until in cur.execute(sql, [v for h in chunk for v in (h.pod, h.until)]).fetchall():
                    ids.setdefault((pod, until), []).append(int(hold_id))
            return [ids[(w.pod, w.until)].pop() if isinstance(w, GrowthHold) else None for w in writes]

    def hold_leases(self, holds: list[tuple[str, float]]) -> list[None]:
        """Record, in one transaction, that each (dpu, until) DPU may hold no lease before `until`
        (seconds since the epoch; the later of two holds stands): a window change's hold, for a control plane
        restarted before it ends."""
        with self._writing() as cur:
            cur.executemany(
                "INSERT INTO lease_holds(dpu, until) VALUES (?, ?) "
                f"ON CONFLICT(dpu) DO UPDATE SET until = {self.GREATEST}(lease_holds.until, excluded.until)",
                holds,
            )
        return [None] * len(holds)

    def lease_holds(self, now: float) -> dict[str, float]:
        """Each DPU's lease hold still running at `now` (seconds since the epoch); the ended ones are forgotten."""
        with self._lock, self._statement() as cur:
            cur.execute("DELETE FROM lease_holds WHERE until <= ?", (now,))
            rows = cur.execute("SELECT dpu, until FROM lease_holds").fetchall()
        return {dpu: until for dpu, until in rows}

    def record_epochs(self, rows: list[tuple[str, int, float | None]]) -> list[None]:
        """Record, in one transaction, each (dpu, epoch, lost_at): the pipeline instance its holder found on it,
        and when (seconds since the epoch; None: never) its state was lost then, for the DPU's next holder."""
        with self._writing() as cur:
            cur.executemany(
                "INSERT INTO dpu_epochs(dpu, epoch, lost_at) VALUES (?, ?, ?) "
                # For the same instance, when its state was lost never moves back (nor to never): a holder
                # that judged it from less (an echo's arm time) must not shorten the hold a later loss began.
                "ON CONFLICT(dpu) DO UPDATE SET epoch = excluded.epoch, lost_at = CASE "
                "WHEN dpu_epochs.epoch = excluded.epoch AND dpu_epochs.lost_at IS NOT NULL "
                "AND (excluded.lost_at IS NULL OR excluded.lost_at < dpu_epochs.lost_at) "
                "THEN dpu_epochs.lost_at ELSE excluded.lost_at END",
                [(dpu, str(epoch), lost_at) for dpu, epoch, lost_at in rows],
            )
        return [None] * len(rows)

    def epochs_of(self, dpus: list[str]) -> list[tuple[int, float | None] | None]:
        """For each DPU, the pipeline instance its last holder recorded (record_epochs) and when its state was
        lost then, or None."""
        wanted = set(dpus)
        with self._lock, self._statement() as cur:
            rows = cur.execute("SELECT dpu, epoch, lost_at FROM dpu_epochs").fetchall()
        recorded = {dpu: (int(epoch), lost_at) for dpu, epoch, lost_at in rows if dpu in wanted}
        return [recorded.get(d) for d in dpus]

    def release_growth(self, holds: list[int]) -> list[None]:
        """Forget holds whose wait is over (one transaction)."""
        with self._writing() as cur:
            cur.executemany("DELETE FROM growth_holds WHERE id = ?", [(h,) for h in holds])
        return [None] * len(holds)

    def load_grants(self) -> dict[str, Cap | None]:
        """Each DPU's share as last granted."""
        with self._lock, self._statement() as cur:
            rows = cur.execute("SELECT dpu, share FROM grants").fetchall()
        out: dict[str, Cap | None] = {}
        for dpu, share in rows:
            fields = json.loads(share)
            out[dpu] = None if fields is None else Cap(**fields)
        return out

    def growth_holds(self, now: float) -> dict[str, float]:
        """Each pod's latest hold still running at `now` (seconds since the epoch); the ended ones are forgotten."""
        with self._lock, self._statement() as cur:
            cur.execute("DELETE FROM growth_holds WHERE until <= ?", (now,))
            rows = cur.execute("SELECT pod, MAX(until) FROM growth_holds GROUP BY pod").fetchall()
        return {pod: until for pod, until in rows}

    @staticmethod
    def _read(cur: Db) -> DesiredState:
        """The whole desired state, read in the caller's transaction."""
        state = DesiredState()
        for name, prefixes in cur.execute("SELECT name, ipv4_prefixes FROM pods"):
            state.pods[name] = Pod(name, tuple(json.loads(prefixes)))
        for row in cur.execute(
            "SELECT name, p4runtime_address, device_id, pod, role, host_port, uplink_port, buffer_bytes, node_mac, "
            "seal_port FROM dpus"
        ):
            seal = None if row[9] is None else int(row[9])
            state.dpus[row[0]] = Dpu(
                row[0], row[1], int(row[2]), row[3], Role(row[4]), int(row[5]), int(row[6]), int(row[7]), row[8], seal
            )
        for pod, e, i, w, b, r, m in cur.execute(
            "SELECT pod, egress_bps, ingress_bps, window_s, burst_bytes, rebalance, mode FROM caps"
        ):
            state.caps[pod] = Cap(e, i, w, int(b), bool(r), m)
        for name, pods in cur.execute("SELECT name, pods FROM routers"):
            state.routers[name] = Router(name, tuple(json.loads(pods)))
        row = cur.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
        state.generation = int(row[0]) if row else 0
        return state


class StateInUse(OSError):
    """Another control plane holds the state file."""


class StateStale(sqlite3.OperationalError):
    """Another replica wrote the database since this one last read it: a write planned against what this one
    held is not stored (the service reads the state again and plans anew; after too many tries the API
    answers UNAVAILABLE, as for a busy database)."""


def _head(cur: Db) -> tuple[int, str]:
    """The change log's last record's sequence number and hash, read in `cur`'s transaction."""
    row = cur.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    return (int(row[0]), str(row[1])) if row else (0, audit.GENESIS)


# json.dumps(..., sort_keys=True) with one encoder for every record (a fleet's write stores thousands).
SORTED_JSON = json.JSONEncoder(sort_keys=True)


@functools.lru_cache(maxsize=4096)
def _share_json(share: Cap | None) -> str:
    """A granted share as the grants table stores it (a fleet's pods share a few caps: each encoded once)."""
    return SORTED_JSON.encode(None if share is None else dataclasses.asdict(share))


AUDIT_INSERT = "INSERT INTO audit(seq, ts, actor, action, object, payload, prev, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def _audit_row(
    head: tuple[int, str], actor: str, action: str, obj: str, payload: dict[str, Any]
) -> tuple[tuple[int, str], tuple[int, float, str, str, str, str, str, str]]:
    """The record after `head` (the last record's sequence number and hash): the new head, and the row."""
    seq, prev = head[0] + 1, head[1]
    ts = time.time()
    text = audit.compact_json(payload)  # encoded once: hashed and stored
    digest = audit.seal_encoded(seq, ts, actor, action, obj, text, prev)
    return (seq, digest), (seq, ts, actor, action, obj, text, prev, digest)


def _upsert(table: str, key: str, columns: list[str]) -> str:
    """Insert a row or replace its values, in the syntax SQLite and PostgreSQL share (INSERT OR REPLACE is
    SQLite's own)."""
    values = ", ".join("?" * (1 + len(columns)))
    sets = ", ".join(f"{c}=excluded.{c}" for c in columns)
    return f"INSERT INTO {table}({key}, {', '.join(columns)}) VALUES ({values}) ON CONFLICT({key}) DO UPDATE SET {sets}"


_DPU_COLUMNS = [
    "p4runtime_address", "device_id", "pod", "role", "host_port", "uplink_port", "buffer_bytes", "node_mac", "seal_port"
]  # fmt: skip
DPU_UPSERT = _upsert("dpus", "name", _DPU_COLUMNS)
DPU_INSERT = DPU_UPSERT.partition(" ON CONFLICT")[0]
CAP_UPSERT = _upsert("caps", "pod", ["egress_bps", "ingress_bps", "window_s", "burst_bytes", "rebalance", "mode"])


def _change_sql(c: Change) -> tuple[str, tuple[Any, ...], tuple[str, str, dict[str, Any]]]:
    """One change's SQL and its parameters, with its audit action, object and payload."""
    if c.verb == "delete":
        table, key = {
            "pod": ("pods", "name"),
            "dpu": ("dpus", "name"),
            "cap": ("caps", "pod"),
            "router": ("routers", "name"),
        }[c.kind]
        return f"DELETE FROM {table} WHERE {key}=?", (c.name,), (f"delete-{c.kind}", _object(c.kind, c.name), {})
    if isinstance(c.after, Pod):
        prefixes = list(c.after.ipv4_prefixes)
        return (
            "INSERT INTO pods(name, ipv4_prefixes) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET ipv4_prefixes=excluded.ipv4_prefixes",
            (c.name, json.dumps(prefixes)),
            ("apply-pod", _object("pod", c.name), {"ipv4_prefixes": prefixes}),
        )
    if isinstance(c.after, Router):
        pods = list(c.after.pods)
        return (
            "INSERT INTO routers(name, pods) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET pods=excluded.pods",
            (c.name, json.dumps(pods)),
            ("apply-router", _object("router", c.name), {"pods": pods}),
        )
    if isinstance(c.after, Dpu):
        d = c.after
        payload: dict[str, Any] = d.as_dict()
        del payload["name"]
        # A new DPU is inserted (a duplicate name fails the transaction); a changed one replaced.
        return (
            DPU_INSERT if c.verb == "create" else DPU_UPSERT,
            (d.name, *payload.values()),
            (("register-dpu" if c.verb == "create" else "update-dpu"), _object("dpu", c.name), payload),
        )
    assert isinstance(c.after, Cap)
    cap = c.after
    return (
        CAP_UPSERT,
        (c.name, cap.egress_bps, cap.ingress_bps, cap.window_s, cap.burst_bytes, int(cap.rebalance), cap.mode),
        (
            "set-cap",
            _object("cap", c.name),
            {
                "egress_bps": cap.egress_bps,
                "ingress_bps": cap.ingress_bps,
                "window_s": cap.window_s,
                "burst_bytes": cap.burst_bytes,
                "rebalance": cap.rebalance,
                "mode": cap.mode,
            },
        ),
    )


def _object(kind: str, name: str) -> str:
    """The audit log's name for an object (a cap is its pod's)."""
    return f"pod/{name}/cap" if kind == "cap" else f"{kind}/{name}"


def verify_in(db: Db, anchor: str | None) -> audit.Verdict:
    """The chain of the records in `db`, its anchor if given, and its tables against the chain."""
    return verified_in(db, anchor)[0]


@dataclasses.dataclass(frozen=True)
class Verified:
    """A change log as checked: the replay of its records, and its last record's sequence number and hash."""

    logged: replay.Logged
    head: tuple[int, str]


def verified_in(db: Db, anchor: str | None = None, since: Verified | None = None) -> tuple[audit.Verdict, Verified]:
    """`verify_in`, and the log as checked (for the next check's `since`). Given `since` (a check of this
    database's log before, without an anchor), only the records after it are read, chained and replayed, as
    long as its last record is still there unchanged (else the whole log is): a running control plane's
    check grows with what was written since, not with the log. The tables are compared whole either way."""
    start = Verified(replay.Logged(), (0, audit.GENESIS))
    if since is not None and anchor is None:
        row = db.execute("SELECT hash FROM audit WHERE seq = ?", (since.head[0],)).fetchone()
        if since.head[0] == 0 or (row is not None and row[0] == since.head[1]):
            start = since
    try:
        records = audit_rows(db, after=start.head[0])
    except ValueError as exc:  # a payload that is not JSON: no store writes one
        return audit.Verdict(False, 0, audit.GENESIS, str(exc), "chain"), start
    verdict = audit.verify(records, anchor, after=start.head)
    if not verdict.ok:
        return verdict, start
    try:
        logged = replay.replay(records, start.logged)
    except replay.LogError as exc:
        return dataclasses.replace(verdict, ok=False, problem=str(exc), check="chain"), start
    found = replay.differences(db, logged)
    if not found:
        return verdict, Verified(logged, (verdict.records, verdict.head))
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return dataclasses.replace(verdict, ok=False, problem=found[0] + more, check="state"), start


def audit_rows(db: Db, after: int = 0) -> list[audit.AuditRecord]:
    """The change log's records as stored in `db` (those after sequence number `after`), refusing columns and
    payloads no store writes."""
    rows = db.execute(
        "SELECT seq, ts, actor, action, object, payload, prev, hash FROM audit WHERE seq > ? ORDER BY seq", (after,)
    ).fetchall()
    out = []
    types: tuple[type | tuple[type, ...], ...] = (int, (int, float), str, str, str, str, str, str)
    for r in rows:
        # Columns of the wrong type (an actor stored as a SQLite BLOB) are edits, not records.
        if not all(isinstance(v, t) and not isinstance(v, bool) for v, t in zip(r, types, strict=True)):
            raise ValueError(f"record {r[0]!r}: a column holds a value of the wrong type (edited)")
        try:
            payload = json.loads(r[5])
        except (TypeError, ValueError):
            raise ValueError(f"record {r[0]}: the payload is not JSON") from None
        # The hash covers the payload's values; its stored text must be a canonical form of them (compact,
        # as written now, or with spaces, as control planes before 2026-12-03 wrote it), so that no reader
        # of the file (jq, json_extract) sees what the hash does not cover (a key twice).
        if r[5] != audit.compact_json(payload) and r[5] != SORTED_JSON.encode(payload):
            raise ValueError(f"record {r[0]}: the payload's text is not its canonical form (edited)")
        out.append(audit.AuditRecord(r[0], r[1], r[2], r[3], r[4], payload, r[6], r[7]))
    return out
