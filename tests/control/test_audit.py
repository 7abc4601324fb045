"""The audit log: every change is recorded in the same transaction, and tampering is detected."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpu_limiter.audit import GENESIS, seal, verify
from dpu_limiter.models import Cap, Dpu, Pod
from dpu_limiter.stores import open_store, read_audit
from helpers.stores import behind


def _state(db: str) -> str:
    s = open_store(db)
    s.put_pod(Pod("a", ("10.0.1.0/24",)))
    s.add_dpu(Dpu("dpu-a", "127.0.0.1:9559", 1, "a"))
    s.put_cap("a", Cap(20e6, 20e6, 10.0, 100_000))
    s.put_cap("a", Cap(1e9, 1e9, 60.0, 100_000))
    with pytest.raises(sqlite3.IntegrityError):
        s.add_dpu(Dpu("dpu-a", "127.0.0.1:9560", 2, "a"))  # refused: no record either
    s.close()
    return db


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpu_limiter.cli", *args], capture_output=True, text=True, timeout=60)


def test_every_change_is_recorded_and_chained(db: str) -> None:
    records = read_audit(_state(db))
    assert [(r.seq, r.action, r.object) for r in records] == [
        (1, "apply-pod", "pod/a"),
        (2, "register-dpu", "dpu/dpu-a"),
        (3, "set-cap", "pod/a/cap"),
        (4, "set-cap", "pod/a/cap"),
    ]
    assert records[0].prev == GENESIS
    assert records[3].payload["egress_bps"] == 1e9 and records[3].payload["generation"] == 4
    verdict = verify(records)
    assert verdict.ok and verdict.head == records[-1].hash


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("UPDATE audit SET payload = replace(payload, '1000000000.0', '9000000000.0') WHERE seq = 4", "edited"),
        ("DELETE FROM audit WHERE seq = 2", "missing"),
        ("UPDATE audit SET actor = 'operator' WHERE seq = 1", "edited"),
    ],
)
def test_tampering_is_detected(db: str, sql: str, problem: str) -> None:
    behind(_state(db), sql)
    verdict = verify(read_audit(db))
    assert not verdict.ok and problem in verdict.problem
    res = cli("audit", "verify", "--db", str(db))
    assert res.returncode == 1 and "TAMPERED" in res.stderr


def test_truncation_is_detected_with_an_anchor(db: str) -> None:
    head = json.loads(cli("audit", "verify", "--db", _state(db), "--json").stdout)["head"]
    behind(db, "DELETE FROM audit WHERE seq = 4")
    # The tables still hold what the cut record wrote: the stored state gives it away.
    res = cli("audit", "verify", "--db", str(db), "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["check"] == "state"
    assert "caps/a.egress_bps: stored 1e+09, the log says 2e+07 (record 3)" in json.loads(res.stdout)["problem"]
    # Rolled back to the state the shorter log says, the file is consistent again: only an anchor
    # (a head recorded earlier) tells that records were cut off.
    behind(
        db,
        "UPDATE caps SET egress_bps = 2e7, ingress_bps = 2e7, window_s = 10.0 WHERE pod = 'a'",
        "UPDATE meta SET value = '3' WHERE key = 'generation'",
    )
    assert cli("audit", "verify", "--db", str(db)).returncode == 0  # undetectable from the file alone
    res = cli("audit", "verify", "--db", str(db), "--anchor", head)
    assert res.returncode == 1 and "cut off" in res.stderr


def test_cli_log_and_missing_file(tmp_path: Path, db: str) -> None:
    out = cli("audit", "log", "--db", _state(db)).stdout
    assert "register-dpu" in out and "dpu/dpu-a" in out
    res = cli("audit", "verify", "--db", str(tmp_path / "nope.db"))
    assert res.returncode == 2 and "nope.db" in res.stderr


@settings(max_examples=300, deadline=None)
@given(
    seq=st.integers(1, 1 << 62),
    ts=st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(0, 1 << 40)),
    actor=st.text(max_size=20),
    obj=st.text(max_size=20),
    payload=st.dictionaries(
        st.text(max_size=8), st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=8), st.booleans())
    ),
)
def test_a_record_is_sealed_over_its_canonical_json(
    seq: int, ts: float, actor: str, obj: str, payload: dict[str, object]
) -> None:
    """The body put together around a payload encoded once is the record's canonical JSON, byte for byte."""
    body = json.dumps(
        {"seq": seq, "ts": ts, "actor": actor, "action": "set-cap", "object": obj, "payload": payload},
        sort_keys=True,
        separators=(",", ":"),
    )
    expected = hashlib.sha256((GENESIS + body).encode()).hexdigest()
    assert seal(seq, ts, actor, "set-cap", obj, payload, GENESIS) == expected


def test_records_written_with_spaces_before_still_verify(tmp_path: Path) -> None:
    """Control planes before 2026-12-03 stored payloads with spaces (json.dumps's default): still canonical. (Those
    were SQLite's only: PostgreSQL came after.)"""
    db = _state(str(tmp_path / "state.db"))
    con = sqlite3.connect(db)
    for seq, payload in con.execute("SELECT seq, payload FROM audit").fetchall():
        con.execute("UPDATE audit SET payload=? WHERE seq=?", (json.dumps(json.loads(payload), sort_keys=True), seq))
    con.commit()
    con.close()
    assert verify(read_audit(db)).ok
