"""The control plane's tests' fixtures for the two stores: a throwaway PostgreSQL cluster (one per session,
a new database per test) and `db`, a store location parametrized over SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import postgres


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[postgres.Cluster]:
    """A PostgreSQL cluster of the session's own on loopback; skips, naming what is missing, where none can run."""
    why = postgres.unavailable()
    if why:
        pytest.skip(f"PostgreSQL store: {why}")
    with postgres.cluster() as c:
        yield c


@pytest.fixture
def pg_url(pg_cluster: postgres.Cluster) -> str:
    """A new, empty database on the session's cluster."""
    return pg_cluster.database()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store keeps its state: a SQLite file in the test's directory, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "state.db")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def other_db(request: pytest.FixtureRequest, db: str, tmp_path: Path) -> str:
    """A second store of the same kind as `db` (a second control plane's state of its own)."""
    if db.startswith("postgresql://"):
        cluster: postgres.Cluster = request.getfixturevalue("pg_cluster")
        return cluster.database()
    return str(tmp_path / "other.db")
