"""Statements run on a store's database behind the control plane's back, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dpu_limiter.store import is_url


def behind(db: str | Path, *statements: str) -> None:
    """Statements on the database from another connection, in one transaction, as an operator's sqlite3 or psql
    would run them."""
    if is_url(db):
        import psycopg

        with psycopg.connect(str(db)) as conn:  # commits on leaving
            for statement in statements:
                conn.execute(statement.encode())
        return
    con = sqlite3.connect(db)
    for statement in statements:
        con.execute(statement)
    con.commit()
    con.close()
