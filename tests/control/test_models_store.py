"""Validation names the field and value; the store keeps acknowledged state across reopen."""

import sqlite3
from pathlib import Path

import pytest

from dpu_limiter.models import Cap, Dpu, InvalidArgument, Pod, Role, check_address
from dpu_limiter.store import Grant, GrowthHold
from dpu_limiter.stores import open_store


def test_pod_prefixes_are_normalised_and_checked() -> None:
    pod = Pod.validated("a", ["10.0.2.0/24", "10.0.1.0/24", "10.0.1.0/24"])
    assert pod.ipv4_prefixes == ("10.0.1.0/24", "10.0.2.0/24")
    with pytest.raises(InvalidArgument, match=r"pod.ipv4_prefixes\[0\].*10.0.1.1/24"):
        Pod.validated("a", ["10.0.1.1/24"])  # host bits set
    with pytest.raises(InvalidArgument, match="pod.name"):
        Pod.validated("Bad Name", ["10.0.1.0/24"])


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("cap.egress_bps", {"egress_bps": 0.0}),
        ("cap.egress_bps", {"egress_bps": -5.0}),
        ("cap.ingress_bps", {"ingress_bps": float("inf")}),
        ("cap.window_s", {"window_s": 0.0}),
        ("cap.burst_bytes", {"burst_bytes": 1 << 33}),
    ],
)
def test_cap_errors_name_the_field(field: str, kwargs: dict[str, float]) -> None:
    base = {"egress_bps": 1e9, "ingress_bps": 1e9, "window_s": 60.0, "burst_bytes": 0}
    base.update(kwargs)
    with pytest.raises(InvalidArgument) as err:
        Cap.validated(Cap(**base))  # type: ignore[arg-type]
    assert err.value.field == field
    assert repr(kwargs[next(iter(kwargs))]) in str(err.value)


def test_cap_default_burst() -> None:
    assert Cap.validated(Cap(1e9, 1e9, 60)).burst_bytes == 12_500_000


@pytest.mark.parametrize(
    "addr", ["localhost", "1.2.3.4", "1.2.3.4:0", "1.2.3.4:70000", "300.1.1.1:9559", "[::1:9559", "a b:1"]
)
def test_malformed_addresses(addr: str) -> None:
    with pytest.raises(InvalidArgument, match="dpu.p4runtime_address"):
        check_address("dpu.p4runtime_address", addr)


def test_good_addresses() -> None:
    for addr in ("127.0.0.1:9559", "dpu-7.rack3:9559", "[::1]:50051"):
        assert check_address("x", addr) == addr


def test_dpu_ports() -> None:
    with pytest.raises(InvalidArgument, match="dpu.uplink_port"):
        Dpu.validated(Dpu("d", "127.0.0.1:1", 1, "a", Role.POD_UPLINK, 0, 0))
    with pytest.raises(InvalidArgument, match="dpu.host_port"):
        Dpu.validated(Dpu("d", "127.0.0.1:1", 1, "a", Role.POD_UPLINK, 511, 0))


def test_store_round_trip_and_durability(db: str) -> None:
    s = open_store(db)
    s.put_pod(Pod("a", ("10.0.1.0/24",)))
    s.add_dpu(Dpu("dpu-a", "127.0.0.1:9559", 1, "a"))
    gen = s.put_cap("a", Cap(20e6, 10e6, 10.0, 2_500_000))
    s.close()
    state = open_store(db).load()
    assert state.generation == gen == 3
    assert state.pods["a"].ipv4_prefixes == ("10.0.1.0/24",)
    assert state.dpus["dpu-a"].p4runtime_address == "127.0.0.1:9559"
    assert state.caps["a"] == Cap(20e6, 10e6, 10.0, 2_500_000)


def test_store_refuses_duplicates_without_losing_state(db: str) -> None:
    # The same error from either database (the PostgreSQL store raises sqlite3's, as the API expects).
    s = open_store(db)
    s.put_pod(Pod("a", ("10.0.1.0/24",)))
    s.add_dpu(Dpu("dpu-a", "127.0.0.1:9559", 1, "a"))
    with pytest.raises(sqlite3.IntegrityError):
        s.add_dpu(Dpu("dpu-a", "127.0.0.1:9560", 2, "a"))
    state = s.load()
    assert list(state.dpus) == ["dpu-a"] and state.dpus["dpu-a"].device_id == 1
    assert state.generation == 2
    s.close()


def test_a_state_file_from_before_new_columns_opens_with_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE pods (name TEXT PRIMARY KEY, ipv4_prefixes TEXT NOT NULL);
        CREATE TABLE dpus (name TEXT PRIMARY KEY, p4runtime_address TEXT NOT NULL, device_id INTEGER NOT NULL,
            pod TEXT NOT NULL REFERENCES pods(name), role TEXT NOT NULL,
            host_port INTEGER NOT NULL, uplink_port INTEGER NOT NULL);
        CREATE TABLE caps (pod TEXT PRIMARY KEY REFERENCES pods(name), egress_bps REAL NOT NULL,
            ingress_bps REAL NOT NULL, window_s REAL NOT NULL, burst_bytes INTEGER NOT NULL);
        INSERT INTO pods VALUES ('a', '["10.0.1.0/24"]');
        INSERT INTO dpus VALUES ('dpu-a', '127.0.0.1:9559', 1, 'a', 'pod-uplink', 0, 1);
        INSERT INTO caps VALUES ('a', 2e7, 2e7, 10.0, 100000);
        """
    )
    db.commit()
    db.close()
    store = open_store(path)
    assert store.schema_version() == 4  # files from before versions were counted are version 1, then migrated
    st = store.load()
    store.close()
    assert st.dpus["dpu-a"] == Dpu("dpu-a", "127.0.0.1:9559", 1, "a", Role.POD_UPLINK, 0, 1, buffer_bytes=0)
    assert st.caps["a"] == Cap(2e7, 2e7, 10.0, 100_000, rebalance=False, mode="rate")


def test_grants_and_holds_are_written_in_one_transaction(tmp_path: Path) -> None:
    # The connection autocommits: an executemany outside a transaction would commit (and fsync) each row,
    # which made a fleet's write of 20,000 grants take seconds.
    store = open_store(tmp_path / "state.db")
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    stored = store.save_shares(
        [
            *(Grant(f"dpu-{i}", Cap(1e6, 1e6, 1.0) if i % 2 else None) for i in range(500)),
            *(GrowthHold(f"pod-{i}", 1e12) for i in range(50)),
        ]
    )
    ids = [i for i in stored if i is not None]
    assert stored[:500] == [None] * 500 and len(set(ids)) == 50
    store.release_growth(ids[:25])
    store._db.set_trace_callback(None)
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"] * 2
    assert len(store.load_grants()) == 500 and len(store.growth_holds(0.0)) == 25
    store.close()
