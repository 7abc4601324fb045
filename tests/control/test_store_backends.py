"""The store's semantics on both databases (the `db` fixture: SQLite and PostgreSQL): versioned schema,
grants and holds, the tables bound to the change log, one control plane per database, and two writers
on one database keeping one linear change log."""

from __future__ import annotations

import itertools
import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from dpu_limiter.audit import verify
from dpu_limiter.models import Cap, Change, Dpu, Pod
from dpu_limiter.store import Grant, GrowthHold, StateInUse, StateMismatch, Store, is_url
from dpu_limiter.stores import open_store, read_audit, verify_file
from helpers.processes import cli
from helpers.stores import behind

pytestmark = pytest.mark.timeout(120)


def _fleet(s: Store) -> None:
    s.commit(
        [
            Change("create", "pod", "a", after=Pod("a", ("10.0.1.0/24",))),
            Change("create", "dpu", "dpu-a", after=Dpu("dpu-a", "127.0.0.1:9559", 1, "a")),
            Change("create", "cap", "a", after=Cap(8e6, 8e6, 10.0, 100_000)),
        ],
        "verifier:test",
    )


def test_the_schema_is_versioned_and_a_newer_one_refused(db: str) -> None:
    s = open_store(db)
    # 2: the replicas table (and, on PostgreSQL, the election id sequence); 3: the replicas' sessions; 4: the
    # DPUs' pipeline instances
    assert s.schema_version() == 4
    assert s.renew_replica("r1", "127.0.0.1:1", 60.0) == [("r1", "127.0.0.1:1")]
    assert s.longest_leases() == (60.0, 0.0)  # (no DPU lease named)
    s.renew_replica("r2", "127.0.0.1:2", 6.0, dpu_lease_s=30.0)
    assert s.longest_leases() == (60.0, 30.0)
    s.leave_replica("r2")
    s.close()
    s = open_store(db)  # opening again migrates nothing
    assert s.schema_version() == 4
    assert s.live_replicas() == [("r1", "127.0.0.1:1")]
    s.close()
    behind(db, "INSERT INTO schema_version(version, applied) VALUES (5, 'by a newer control plane')")
    with pytest.raises(sqlite3.DatabaseError, match="schema version 5 is newer than this control plane's"):
        open_store(db)


def test_holds_stored_in_bulk_each_get_the_id_of_their_own_row(db: str) -> None:
    # 1,201 holds (over three statements), most alike another, at times of 17 significant digits as the clock
    # gives them: each id names a row of its hold's pod and time.
    s = open_store(db)
    times = [time.time() + 30 + k / 7 for k in range(3)]
    holds = [GrowthHold(f"p{i % 7}", times[i % 3]) for i in range(1201)]
    stored = s.save_shares([Grant("d1", None), *holds])
    ids = stored[1:]
    assert stored[0] is None and None not in ids and len(set(ids)) == len(holds)
    s.release_growth([i for h, i in zip(holds, ids, strict=True) if h.pod == "p0" or h.until == times[2]])
    assert s.growth_holds(0.0) == {f"p{k}": times[1] for k in range(1, 7)}
    s.close()


def test_grants_and_holds(db: str) -> None:
    s = open_store(db)
    assert s.save_shares([Grant("d1", Cap(1e6, 1e6, 1.0)), Grant("d2", None)]) == [None, None]
    s.save_shares([Grant("d1", Cap(2e6, 2e6, 1.0))])  # replaced, not added
    assert s.load_grants() == {"d1": Cap(2e6, 2e6, 1.0), "d2": None}
    stored = s.save_shares([GrowthHold("a", 100.0), Grant("d2", Cap(3e6, 3e6, 1.0)), GrowthHold("a", 300.0)])
    stored += s.save_shares([GrowthHold("b", 50.0)])
    ids = [i for i in stored if i is not None]
    assert stored[1] is None and len(set(ids)) == 3
    assert s.load_grants() == {"d1": Cap(2e6, 2e6, 1.0), "d2": Cap(3e6, 3e6, 1.0)}
    # A later grant of a DPU in the same transaction stands.
    s.save_shares([Grant("d1", None), Grant("d1", Cap(4e6, 4e6, 1.0))])
    assert s.load_grants()["d1"] == Cap(4e6, 4e6, 1.0)
    assert s.growth_holds(60.0) == {"a": 300.0}  # b's is over (and forgotten)
    s.release_growth(ids[1:2])
    assert s.growth_holds(60.0) == {"a": 100.0}
    s.hold_leases([("d1", 30.0), ("d1", 20.0), ("d2", 5.0)])  # the later of two holds stands
    assert s.lease_holds(10.0) == {"d1": 30.0}
    # Pipeline instances: 64-bit epochs whole (past a signed 64-bit column), the last one per DPU stands.
    s.record_epochs([("d1", 2**64 - 1, None), ("d2", 7, 12.5)])
    s.record_epochs([("d2", 8, None)])
    assert s.epochs_of(["d2", "d3", "d1"]) == [(8, None), None, (2**64 - 1, None)]
    # For the same instance, when its state was lost never moves back, nor to never: a successor that judged
    # it from an echo's arm time (earlier) must not shorten the hold a later loss began. A new one starts afresh.
    s.record_epochs([("d2", 8, 20.0)])
    s.record_epochs([("d2", 8, 15.0), ("d1", 2**64 - 1, 3.0)])
    s.record_epochs([("d2", 8, None)])
    assert s.epochs_of(["d2", "d1"]) == [(8, 20.0), (2**64 - 1, 3.0)]
    s.record_epochs([("d2", 8, 25.0)])
    assert s.epochs_of(["d2"]) == [(8, 25.0)]
    s.record_epochs([("d2", 9, 1.0)])
    assert s.epochs_of(["d2"]) == [(9, 1.0)]
    s.close()


def test_a_row_edited_behind_the_log_is_refused(db: str) -> None:
    s = open_store(db)
    _fleet(s)
    assert s.verify_state().ok
    behind(db, "UPDATE caps SET egress_bps = 1e12 WHERE pod = 'a'")
    with pytest.raises(StateMismatch, match=r"caps/a\.egress_bps: stored 1e\+12, the log says 8e\+06"):
        s.put_pod(Pod("b", ("10.0.2.0/24",)))
    with pytest.raises(StateMismatch, match=r"caps/a\.egress_bps"):
        s.load()
    s.close()
    verdict = verify_file(db)
    assert not verdict.ok and verdict.check == "state" and "caps/a.egress_bps" in verdict.problem
    assert [r.action for r in read_audit(db)] == ["apply-pod", "register-dpu", "set-cap"]  # nothing more
    res = cli("audit", "verify", "--db", db, "--json")
    assert res.returncode == 1 and "caps/a.egress_bps" in json.loads(res.stdout)["problem"], res


def test_a_trigger_is_a_difference(db: str) -> None:
    s = open_store(db)
    _fleet(s)
    s.close()
    if is_url(db):
        behind(db, "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'")
        behind(db, "CREATE TRIGGER sneak BEFORE UPDATE ON caps FOR EACH ROW EXECUTE FUNCTION f()")
    else:
        behind(db, "CREATE TRIGGER sneak AFTER UPDATE ON caps BEGIN SELECT 1; END")
    verdict = verify_file(db)
    assert not verdict.ok and "trigger 'sneak' on caps" in verdict.problem


def test_one_control_plane_per_sqlite_file_any_number_per_postgres_database(db: str) -> None:
    first = open_store(db, exclusive=True)
    if is_url(db):  # replicas (replicas.py) share a PostgreSQL database
        open_store(db, exclusive=True).close()
        first.close()
        return
    with pytest.raises(StateInUse, match="in use by another control plane"):
        open_store(db, exclusive=True)
    first.close()
    open_store(db, exclusive=True).close()  # given up on close


def test_replica_leases_are_on_the_database_s_clock_and_election_ids_only_grow(db: str) -> None:
    """A lease runs for its length on the database's clock; one given up is gone at once; election ids taken
    through two connections (two replicas) never repeat and only grow."""
    stores = [open_store(db), open_store(db)]
    assert stores[0].renew_replica("r1", "a:1", 60.0) == [("r1", "a:1")]
    assert stores[1].renew_replica("r2", "a:2", 0.2) == [("r1", "a:1"), ("r2", "a:2")]
    time.sleep(0.3)
    assert stores[0].live_replicas() == [("r1", "a:1")]  # r2's lease ended by the database's clock
    assert stores[1].renew_replica("r2", "a:2", 60.0) == [("r1", "a:1"), ("r2", "a:2")]  # joined again
    stores[0].leave_replica("r1")
    assert stores[1].live_replicas() == [("r2", "a:2")]
    ids = [stores[i % 2].next_election_id() for i in range(10)]
    assert ids == sorted(set(ids))
    for s in stores:
        s.close()


def test_two_writers_keep_one_linear_change_log(db: str) -> None:
    """Two stores on one database (two replicas' connections) write at once: every acknowledged write is
    there, each with its own generation, and the change log is one chain that verifies."""
    open_store(db).close()  # the schema first: not what this test is about
    writers = [open_store(db), open_store(db)]
    per_writer = 40
    generations: list[list[int]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def write(i: int) -> None:
        try:
            start.wait()
            for n in range(per_writer):
                pod = Pod(f"w{i}-{n}", (f"10.{i}.{n}.0/24",))
                generations[i].append(writers[i].put_pod(pod, actor=f"writer-{i}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=100)
    assert not errors, errors
    acknowledged = sorted(generations[0] + generations[1])
    assert acknowledged == list(range(1, 2 * per_writer + 1))  # each write its own generation
    records = writers[0].audit_records()
    assert verify(records).ok and len(records) == 2 * per_writer
    assert {r.actor for r in records} == {"writer-0", "writer-1"}
    interleaved = sum(a.actor != b.actor for a, b in itertools.pairwise(records))
    state = writers[1].load()
    assert len(state.pods) == 2 * per_writer and state.generation == 2 * per_writer
    assert writers[1].verify_state().ok
    for w in writers:
        w.close()
    assert verify_file(db).ok
    assert interleaved >= 1  # the two really wrote at once (else the test proved nothing)


def test_a_sqlite_url_is_a_file(tmp_path: Path) -> None:
    s = open_store(f"sqlite://{tmp_path / 'state.db'}")  # sqlite:///abs/path
    _fleet(s)
    s.close()
    assert type(s).__name__ == "SqliteStore" and (tmp_path / "state.db").is_file()
    assert verify_file(tmp_path / "state.db").ok
