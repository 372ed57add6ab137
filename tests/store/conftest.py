"""The `db` fixture: an open, empty Database of each backend, closed after the test.

Repository tests (ledger, idempotency) take `db` and so run on every backend in BACKENDS; a backend
is added by naming it there and building it in `make_database`.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inferd.store import Database, SqliteDatabase
from tests.pg_server import pg_dsn, pg_server  # noqa: F401  (fixtures: a throwaway PostgreSQL server)

BACKENDS = ["sqlite", "postgres"]


def make_database(backend: str, tmp_path: Path, *, dsn: str | None = None, **options) -> Database:
    """A new, not yet opened Database of `backend` whose data lives only for this test (postgres: `dsn`
    names a fresh database, the pg_dsn fixture)."""
    if backend == "sqlite":
        return SqliteDatabase(str(tmp_path / "state" / "inferd.db"), **options)
    if backend == "postgres" and dsn:
        from inferd.store.postgres import PostgresDatabase

        return PostgresDatabase(dsn, **options)
    raise ValueError(f"unknown backend {backend!r}")


@pytest.fixture(params=BACKENDS)
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    dsn = request.getfixturevalue("pg_dsn") if request.param == "postgres" else None
    database = make_database(request.param, tmp_path, dsn=dsn)
    await database.open()
    try:
        yield database
    finally:
        await database.close()
