"""The schema: the same tables on both dialects, upgrades that go forward one version at a time."""
from __future__ import annotations

import sqlite3

import pytest

from inferd.store import StoreError
from inferd.store.schema import SCHEMA_VERSION, VERSION_QUERY, VERSION_TABLE, ddl, upgrade


def test_ddl_differs_between_dialects_only_in_the_mapped_types():
    sqlite, postgres = ddl("sqlite"), ddl("postgres")
    assert len(sqlite) == len(postgres) and sqlite[0] == postgres[0] == VERSION_TABLE
    assert not any("{" in s or "}" in s for s in sqlite + postgres)
    assert "INTEGER PRIMARY KEY AUTOINCREMENT" in "".join(sqlite) and "BYTEA" not in "".join(sqlite)
    assert "BIGSERIAL PRIMARY KEY" in "".join(postgres) and "BYTEA" in "".join(postgres)
    assert not any(word in "".join(postgres) for word in ("AUTOINCREMENT", "BLOB"))
    normalised = [s.replace("BYTEA", "BLOB").replace("BIGSERIAL PRIMARY KEY", "INTEGER PRIMARY KEY AUTOINCREMENT")
                  for s in postgres]
    assert normalised == sqlite
    with pytest.raises(ValueError, match="dialect"):
        ddl("mysql")


def test_the_ddl_runs_on_sqlite_twice_and_makes_the_tables():
    conn = sqlite3.connect(":memory:")
    for _ in range(2):                  # IF NOT EXISTS everywhere
        for statement in ddl("sqlite"):
            conn.execute(statement)
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"schema_version", "ledger", "idempotency"} <= tables
    indexes = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"ledger_tenant_finished", "ledger_day", "idempotency_expires"} <= indexes


def test_upgrade_applies_each_missing_version_once_and_records_it():
    conn = sqlite3.connect(":memory:")
    conn.execute(VERSION_TABLE)
    steps = upgrade("sqlite", conn.execute(VERSION_QUERY).fetchone()[0], now=1.0, where="mem")
    for sql, params in steps:
        conn.execute(sql, params)
    assert conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == \
        [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    assert upgrade("sqlite", SCHEMA_VERSION, now=2.0, where="mem") == []
    with pytest.raises(StoreError, match="newer inferd"):
        upgrade("postgres", SCHEMA_VERSION + 1, now=2.0, where="db.example")
