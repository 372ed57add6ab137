"""PostgreSQL connections that notice a dead server: the ping's own connection, the pooled connections'
statement_timeout and the libpq parameters that bound connects and detect a silent peer."""
from __future__ import annotations

import asyncio
import socket

import pytest

pytest.importorskip("psycopg")

from inferd.store import StoreUnavailable  # noqa: E402
from inferd.store.postgres import PostgresDatabase  # noqa: E402
from inferd.store.postgres_conn import Pinger, connection_kwargs  # noqa: E402
from tests.pg_server import pg_dsn, pg_server  # noqa: E402,F401  (fixtures)


def test_connections_bound_their_connect_and_detect_a_silent_peer():
    kw = connection_kwargs(5.0)
    assert kw["connect_timeout"] == 5 and kw["keepalives"] == 1 and kw["tcp_user_timeout"] == 5000
    assert connection_kwargs(0.5)["connect_timeout"] == 2       # libpq's least


async def test_a_ping_of_a_live_server_succeeds_and_keeps_its_connection(pg_dsn):  # noqa: F811
    pinger = Pinger(pg_dsn, "test", 2.0, str)
    try:
        await pinger.ping(2.0)
        first = pinger._conn
        await pinger.ping(2.0)
        assert first is not None and pinger._conn is first
    finally:
        await pinger.close()


async def test_a_server_that_accepts_but_never_answers_fails_the_ping_within_its_timeout():
    silent = socket.socket()                # the kernel accepts connections; nothing ever answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    pinger = Pinger(f"postgresql://u:sekrit@127.0.0.1:{port}/db", "test", 5.0, str)
    try:
        with pytest.raises(StoreUnavailable, match="no answer to a ping within 0.3 s"):
            await asyncio.wait_for(pinger.ping(0.3), 5)
    finally:
        await pinger.close()
        silent.close()


async def test_a_refused_ping_names_the_server_without_its_password():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]           # closed again: nothing listens there
    dsn = f"postgresql://u:sekrit@127.0.0.1:{port}/db"
    db = PostgresDatabase(dsn)
    with pytest.raises(StoreUnavailable) as caught:
        await Pinger(dsn, db.where, 2.0, db._message).ping(5.0)
    assert "sekrit" not in str(caught.value) and db.where in str(caught.value)


async def test_pooled_connections_have_a_statement_timeout(pg_dsn):  # noqa: F811
    db = PostgresDatabase(pg_dsn, timeout_s=3)
    await db.open()
    try:
        assert await db.query("SHOW statement_timeout") == [("3s",)]
    finally:
        await db.close()
