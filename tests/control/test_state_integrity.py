"""The stored state is bound to the audit log: a table edited behind the log stops the control plane
from starting (naming the first difference), and `audit verify` reports it, with or without an anchor."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dpu_limiter._proto.limiter.v1 import limiter_pb2 as pb
from dpu_limiter.audit import GENESIS, seal
from dpu_limiter.client import LimiterClient
from dpu_limiter.models import Cap, Change, Dpu, Role
from dpu_limiter.server import ControlPlane
from dpu_limiter.store import StateMismatch, is_url
from dpu_limiter.stores import open_store
from helpers.processes import cli, free_port
from helpers.stores import behind

pytestmark = pytest.mark.timeout(120)


async def _legit_state(db: str) -> str:
    """A state (a SQLite file or a PostgreSQL database) written through real Apply and Delete RPCs on a real
    control plane: creates, updates in place and deletes of every kind (the DPUs' addresses answer nothing:
    not needed here)."""
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:

            def dpu(name: str, pod: str, port: int, uplink_port: int = 1) -> pb.Dpu:
                return pb.Dpu(
                    name=name, p4runtime_address=f"127.0.0.1:{port}", device_id=1, pod=pod, uplink_port=uplink_port
                )

            def cap(pod: str, rate: float) -> pb.PodCap:
                return pb.PodCap(pod=pod, cap=pb.Cap(egress_bps=rate, ingress_bps=rate, window_s=10.0))

            buffered, node = dpu("dpu-a", "a", 1), dpu("n1", "c", 3)
            buffered.buffer_bytes = 3000
            node.role, node.node_mac = pb.DPU_ROLE_NODE, "02:00:00:00:00:01"
            rebalanced, windowed = cap("b", 16e6), cap("c", 4e6)
            rebalanced.cap.rebalance, windowed.cap.mode = True, pb.CAP_MODE_WINDOW
            await c.stub.Apply(
                pb.ApplyRequest(
                    pods=[
                        pb.Pod(name="a", ipv4_prefixes=["10.0.1.0/24"]),
                        pb.Pod(name="b", ipv4_prefixes=["10.0.2.0/24", "10.0.3.0/24"]),
                        pb.Pod(name="c", ipv4_prefixes=["10.0.4.0/24"]),
                    ],
                    dpus=[buffered, dpu("dpu-b", "b", 2), node],
                    caps=[cap("a", 8e6), rebalanced, windowed],
                    routers=[pb.Router(name="r1", pods=["a", "b"])],
                )
            )
            await c.stub.Apply(pb.ApplyRequest(caps=[cap("a", 9e6)], dpus=[dpu("dpu-a", "a", 4, uplink_port=2)]))
            await c.stub.Delete(pb.DeleteRequest(dpus=["n1"], pods=["c"], routers=["r1"]))
            await c.stub.Delete(pb.DeleteRequest(caps=["b"]))
            await c.stub.Apply(pb.ApplyRequest(routers=[pb.Router(name="r2", pods=["b"])]))
    finally:
        await plane.stop()
    return db


def _head(db: str | Path) -> str:
    res = cli("audit", "verify", "--db", str(db), "--json")
    assert res.returncode == 0, res.stderr
    return str(json.loads(res.stdout)["head"])


def _serve(db: str | Path) -> subprocess.CompletedProcess[str]:
    """`dpu-limiter serve` on the file, as an operator starts it (expected to exit at once)."""
    listen = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", str(db), "--listen", listen]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _refused(db: str, where: str, anchor: str) -> None:
    """Everything that reads the file says `where` differs: the server (in process and as a command)
    and `audit verify` with and without the anchor (text and JSON)."""
    with pytest.raises(StateMismatch, match=rf"{where}\b") as exc:
        ControlPlane(db, "127.0.0.1:0")
    assert str(db) in str(exc.value)
    res = _serve(db)
    assert res.returncode == 1, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(db) in lines[0] and where in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    for extra in ((), ("--anchor", anchor)):
        res = cli("audit", "verify", "--db", str(db), *extra)
        assert res.returncode == 1 and "TAMPERED" in res.stderr and where in res.stderr, res
        res = cli("audit", "verify", "--db", str(db), "--json", *extra)
        verdict = json.loads(res.stdout)
        assert res.returncode == 1 and not verdict["ok"] and where in verdict["problem"], res


async def test_a_legit_state_verifies_and_restarts(db: str) -> None:
    await _legit_state(db)
    head = _head(db)
    res = cli("audit", "verify", "--db", str(db), "--anchor", head)
    assert res.returncode == 0 and "stored state matches" in res.stdout, res
    plane = ControlPlane(db, "127.0.0.1:0")  # starts: the tables are what the log says
    await plane.start()
    try:
        st = plane.service.state
        assert sorted(st.pods) == ["a", "b"] and sorted(st.dpus) == ["dpu-a", "dpu-b"] and list(st.caps) == ["a"]
        assert st.caps["a"].egress_bps == 9e6 and st.dpus["dpu-a"].uplink_port == 2
        assert st.dpus["dpu-a"].buffer_bytes == 0  # the in-place update wrote the DPU whole
        assert list(st.routers) == ["r2"] and st.generation == 5
    finally:
        await plane.stop()
    assert _head(db) == head  # a restart writes nothing


async def test_a_cap_raised_in_the_table_is_refused(db: str) -> None:
    await _legit_state(db)
    head = _head(db)
    behind(db, "UPDATE caps SET egress_bps = 1e12 WHERE pod = 'a'")
    _refused(db, "caps/a.egress_bps", head)
    with pytest.raises(StateMismatch, match=r"caps/a\.egress_bps: stored 1e\+12, the log says 9e\+06 \(record \d+\)"):
        ControlPlane(db, "127.0.0.1:0")


async def test_a_deleted_dpu_row_is_refused(db: str) -> None:
    await _legit_state(db)
    head = _head(db)
    behind(db, "DELETE FROM dpus WHERE name = 'dpu-b'")
    _refused(db, "dpus/dpu-b", head)
    with pytest.raises(StateMismatch, match=r"dpus/dpu-b: not stored, but the log has it \(record \d+\)"):
        ControlPlane(db, "127.0.0.1:0")


async def test_a_pod_row_not_in_the_log_is_refused(db: str) -> None:
    await _legit_state(db)
    head = _head(db)
    behind(db, """INSERT INTO pods VALUES ('x', '["10.9.0.0/16"]')""", """INSERT INTO pods VALUES ('c', '[]')""")
    _refused(db, "pods/c", head)  # the first difference, in name order
    with pytest.raises(StateMismatch, match=r"pods/c: stored, but the log deleted it \(record \d+\) \(and 1 more\)"):
        ControlPlane(db, "127.0.0.1:0")
    behind(db, "DELETE FROM pods WHERE name = 'c'")
    with pytest.raises(StateMismatch, match=r"pods/x: stored, but no record in the log writes it"):
        ControlPlane(db, "127.0.0.1:0")


async def test_a_changed_generation_is_refused(db: str) -> None:
    await _legit_state(db)
    head = _head(db)
    behind(db, "UPDATE meta SET value = '99' WHERE key = 'generation'")
    _refused(db, "meta/generation", head)
    with pytest.raises(StateMismatch, match=r"meta/generation: stored 99, the log says 5 \(record \d+\)"):
        ControlPlane(db, "127.0.0.1:0")


async def test_a_row_edited_with_its_record_breaks_the_chain(db: str) -> None:
    await _legit_state(db)
    behind(
        db,
        "UPDATE caps SET egress_bps = 1e12 WHERE pod = 'a'",
        "UPDATE audit SET payload = replace(payload, '9000000.0', '1000000000000.0') WHERE action = 'set-cap'",
    )
    with pytest.raises(StateMismatch, match=r"audit log.*record \d+: contents do not match its hash"):
        ControlPlane(db, "127.0.0.1:0")
    res = _serve(db)
    assert res.returncode == 1 and "edited" in res.stderr and "Traceback" not in res.stderr, res


async def test_a_trigger_is_refused(tmp_path: Path) -> None:
    db = await _legit_state(str(tmp_path / "state.db"))
    behind(db, "CREATE TRIGGER raise_a AFTER INSERT ON audit BEGIN UPDATE caps SET egress_bps = 1e12; END")
    with pytest.raises(StateMismatch, match=r"trigger 'raise_a'"):
        ControlPlane(db, "127.0.0.1:0")
    res = cli("audit", "verify", "--db", str(db))
    assert res.returncode == 1 and "raise_a" in res.stderr, res


async def test_a_value_of_the_wrong_type_is_refused_without_a_traceback(tmp_path: Path) -> None:
    db = await _legit_state(str(tmp_path / "state.db"))
    behind(db, "UPDATE dpus SET device_id = 'x' WHERE name = 'dpu-a'")
    with pytest.raises(StateMismatch, match=r"dpus/dpu-a\.device_id: stored 'x', the log says 1"):
        ControlPlane(db, "127.0.0.1:0")
    res = _serve(db)
    assert res.returncode == 1 and "dpus/dpu-a.device_id" in res.stderr and "Traceback" not in res.stderr, res


async def test_a_row_edited_while_running_is_never_enforced(db: str) -> None:
    await _legit_state(db)
    plane = ControlPlane(db, "127.0.0.1:0")
    await plane.start()
    try:
        async with LimiterClient(plane.address) as c:
            # Another reader, even one that checkpoints the WAL, is looked at once and let be.
            assert cli("audit", "verify", "--db", str(db)).returncode == 0
            if not is_url(db):
                behind(db, "PRAGMA wal_checkpoint(TRUNCATE)")
            await c.set_pod_cap("a", 10e6, 10e6, 10.0)
            behind(db, "UPDATE caps SET egress_bps = 1e12 WHERE pod = 'a'")
            with pytest.raises(grpc.aio.AioRpcError) as exc:  # the next write is refused, and stores nothing
                await c.set_pod_cap("b", 10e6, 10e6, 10.0)
            assert exc.value.code() == grpc.StatusCode.DATA_LOSS
            assert "caps/a.egress_bps: stored 1e+12, the log says 1e+07" in str(exc.value.details())
            assert str(db) not in str(exc.value.details())  # where the server keeps its files is its own
            assert plane.service.state.caps["a"].egress_bps == 10e6 and "b" not in plane.service.state.caps
            with pytest.raises(StateMismatch, match="refusing to use it"):
                plane.store.load()
    finally:
        await plane.stop()
    with pytest.raises(StateMismatch, match=r"caps/a\.egress_bps"):
        ControlPlane(db, "127.0.0.1:0")


def _old_state(path: Path) -> None:
    """A state file as the first versions with an audit log wrote it: no routers table, no later
    columns, and payloads without the keys those columns added."""
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE pods (name TEXT PRIMARY KEY, ipv4_prefixes TEXT NOT NULL);
        CREATE TABLE dpus (name TEXT PRIMARY KEY, p4runtime_address TEXT NOT NULL, device_id INTEGER NOT NULL,
            pod TEXT NOT NULL REFERENCES pods(name), role TEXT NOT NULL,
            host_port INTEGER NOT NULL, uplink_port INTEGER NOT NULL);
        CREATE TABLE audit (seq INTEGER PRIMARY KEY, ts REAL NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
            object TEXT NOT NULL, payload TEXT NOT NULL, prev TEXT NOT NULL, hash TEXT NOT NULL);
        CREATE TABLE caps (pod TEXT PRIMARY KEY REFERENCES pods(name), egress_bps REAL NOT NULL,
            ingress_bps REAL NOT NULL, window_s REAL NOT NULL, burst_bytes INTEGER NOT NULL);
        INSERT INTO pods VALUES ('a', '["10.0.1.0/24"]');
        INSERT INTO dpus VALUES ('dpu-a', '127.0.0.1:9559', 1, 'a', 'pod-uplink', 0, 1);
        INSERT INTO caps VALUES ('a', 2e7, 2e7, 10.0, 100000);
        INSERT INTO meta VALUES ('generation', '4');
        """
    )
    records = [
        ("apply-pod", "pod/a", {"ipv4_prefixes": ["10.0.1.0/24"]}),
        (
            "register-dpu",
            "dpu/dpu-a",
            {"p4runtime_address": "127.0.0.1:9559", "device_id": 1, "pod": "a", "role": "pod-uplink"}
            | {"host_port": 0, "uplink_port": 1},
        ),
        ("set-cap", "pod/a/cap", {"egress_bps": 1e9, "ingress_bps": 1e9, "window_s": 60, "burst_bytes": 100000}),
        ("set-cap", "pod/a/cap", {"egress_bps": 2e7, "ingress_bps": 2e7, "window_s": 10, "burst_bytes": 100000}),
    ]
    prev = GENESIS
    for seq, (action, obj, payload) in enumerate(records, start=1):
        payload = {**payload, "generation": seq}
        digest = seal(seq, 1.7e9 + seq, "api", action, obj, payload, prev)
        db.execute(
            "INSERT INTO audit VALUES (?, ?, 'api', ?, ?, ?, ?, ?)",
            (seq, 1.7e9 + seq, action, obj, json.dumps(payload, sort_keys=True), prev, digest),
        )
        prev = digest
    db.commit()
    db.close()


async def test_an_old_format_state_file_still_starts(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _old_state(db)
    res = cli("audit", "verify", "--db", str(db))  # read-only: the file is not migrated
    assert res.returncode == 0 and "stored state matches" in res.stdout, res
    plane = ControlPlane(db, "127.0.0.1:0")  # migrates, then checks with the migrations' defaults
    await plane.start()
    try:
        st = plane.service.state
        assert st.dpus["dpu-a"] == Dpu("dpu-a", "127.0.0.1:9559", 1, "a", Role.POD_UPLINK, 0, 1, 0, "")
        assert st.caps["a"] == Cap(2e7, 2e7, 10.0, 100_000, rebalance=False, mode="rate") and st.generation == 4
        async with LimiterClient(plane.address) as c:  # and takes new writes on top
            await c.set_pod_cap("a", 3e7, 3e7, 10.0)
    finally:
        await plane.stop()
    assert cli("audit", "verify", "--db", str(db)).returncode == 0
    behind(db, "UPDATE caps SET mode = 'window'")
    with pytest.raises(StateMismatch, match=r"caps/a\.mode: stored 'window', the log says 'rate'"):
        ControlPlane(db, "127.0.0.1:0")


def test_a_state_without_records_or_rows_starts_and_verifies(db: str) -> None:
    s = open_store(db)
    assert s.commit([Change("unchanged", "pod", "a")]) == 0  # nothing recorded, no new generation either
    s.close()
    assert open_store(db).verify_state().ok
    res = cli("audit", "verify", "--db", str(db))
    assert res.returncode == 0, res


async def test_a_payload_text_the_hash_does_not_cover_is_refused(db: str) -> None:
    """Review: a key written twice in a payload's text verified (the hash covers the parsed values),
    so jq or json_extract could read a cap the log never sealed."""
    await _legit_state(db)
    head = _head(db)
    behind(
        db,
        """UPDATE audit SET payload = '{"egress_bps": 1600000000000.0, ' || substr(payload, 2) """
        """WHERE seq = (SELECT min(seq) FROM audit WHERE action = 'set-cap')""",
    )
    _refused(db, "the payload's text is not its canonical form", head)


async def test_a_column_of_the_wrong_type_is_refused_in_one_line(tmp_path: Path) -> None:
    """Review: an actor stored as a BLOB (the same bytes) crashed `serve` and `audit verify` with a traceback."""
    db = await _legit_state(str(tmp_path / "state.db"))
    head = _head(db)
    behind(db, "UPDATE audit SET actor = CAST(actor AS BLOB) WHERE seq = 1")
    _refused(db, "record 1: a column holds a value of the wrong type", head)
