"""PostgreSQL-specific behaviour of inferd.store.postgres: the shared store several nodes write at once.

The behaviour every backend shares (ledger, idempotency) is tested through the `db` fixture; this file
covers what only a server has: connecting, several nodes on one database, connection loss.
"""
from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")

import psycopg  # noqa: E402

from inferd.store.db import COMMIT_BUCKETS, StoreError, StoreUnavailable  # noqa: E402
from inferd.store.ledger import _INSERT, Ledger, UsageFilter, _values  # noqa: E402
from inferd.store.postgres import ORDERED_WRITE_LOCK, PostgresDatabase, redact, to_pyformat  # noqa: E402
from inferd.store.schema import SCHEMA_VERSION  # noqa: E402
from tests.pg_server import free_port  # noqa: E402
from tests.store.test_ledger import row  # noqa: E402

TABLE = "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BYTEA, n BIGINT)"


@pytest.fixture
async def node(pg_dsn: str):
    """An open PostgresDatabase on a fresh database, with a `kv` table; closed after the test."""
    db = PostgresDatabase(pg_dsn)
    await db.open()
    await db.execute(TABLE)
    yield db
    await db.close()


def test_placeholders_become_pyformat_outside_quotes_and_percent_is_escaped():
    assert to_pyformat("SELECT * FROM t WHERE a = ? AND b LIKE 'x?%' AND \"c?\" = ?") == \
        "SELECT * FROM t WHERE a = %s AND b LIKE 'x?%%' AND \"c?\" = %s"
    assert to_pyformat("SELECT 'it''s ?', ? -- a comment? 5%\n") == "SELECT 'it''s ?', %s -- a comment? 5%%\n"


def test_where_is_the_dsn_without_its_password():
    assert redact("postgresql://inferd:s3cret@db.example:5432/inferd?sslmode=require&password=x") == \
        "postgresql://inferd@db.example:5432/inferd?sslmode=require"
    assert redact("host=db.example password='s3 cret' dbname=inferd") == "host=db.example dbname=inferd"
    assert redact("postgresql://inferd@db.example/inferd") == "postgresql://inferd@db.example/inferd"


def test_bad_settings_raise_value_error():
    with pytest.raises(ValueError, match="max_pending_writes"):
        PostgresDatabase("postgresql://x@127.0.0.1/x", max_pending_writes=0)


async def test_unreachable_server_raises_unavailable_naming_the_host_not_the_password():
    port = free_port()      # nothing listens there
    db = PostgresDatabase(f"postgresql://inferd:s3cret@127.0.0.1:{port}/inferd")
    with pytest.raises(StoreUnavailable) as caught:
        await db.open()
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    with pytest.raises(StoreError, match="not open"):
        await db.execute("SELECT 1")
    await db.close()


async def test_two_nodes_on_one_database_see_each_others_committed_writes(node: PostgresDatabase, pg_dsn: str):
    other = PostgresDatabase(pg_dsn)
    await other.open()
    try:
        await node.execute("INSERT INTO kv (k, v) VALUES (?, ?)", ("a", b"\x00from a"))
        assert await other.query("SELECT v FROM kv WHERE k = ?", ("a",)) == [(b"\x00from a",)]
        await other.execute_many("INSERT INTO kv (k, n) VALUES (?, ?)", [("b", 1), ("c", 2)])
        assert await node.query("SELECT k, n FROM kv WHERE n IS NOT NULL ORDER BY k") == [("b", 1), ("c", 2)]
    finally:
        await other.close()


async def test_concurrent_opens_create_the_schema_once_without_failing(pg_dsn: str):
    nodes = [PostgresDatabase(pg_dsn) for _ in range(4)]
    try:
        opened = await asyncio.gather(*(n.open() for n in nodes), return_exceptions=True)
        assert opened == [None] * len(nodes)
        tables = await nodes[0].query("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
        assert tables[0][0] > 0
        await asyncio.gather(*(n.close() for n in nodes))
        again = PostgresDatabase(pg_dsn)        # an upgrade over an existing schema is a no-op
        await again.open()
        assert await again.query("SELECT count(*) FROM information_schema.tables "
                                 "WHERE table_schema = 'public'") == tables
        await again.close()
    finally:
        await asyncio.gather(*(n.close() for n in nodes))


async def test_a_constraint_violation_fails_only_its_caller(node: PostgresDatabase):
    await node.execute("INSERT INTO kv (k, n) VALUES (?, ?)", ("taken", 0))
    results = await asyncio.gather(
        node.execute("INSERT INTO kv (k, n) VALUES (?, ?)", ("x1", 1)),
        node.execute("INSERT INTO kv (k, n) VALUES (?, ?)", ("taken", 2)),
        node.transaction([("INSERT INTO kv (k, n) VALUES (?, ?)", ("x2", 3)),
                          ("INSERT INTO kv (k, n) VALUES (?, ?)", ("taken", 4))]),
        node.execute("UPDATE kv SET n = n + 10 WHERE k = ?", ("taken",)),
        return_exceptions=True)
    assert results[0] == 1 and results[3] == 1
    for failed in (results[1], results[2]):
        assert isinstance(failed, StoreError) and not isinstance(failed, StoreUnavailable)
        assert "duplicate key" in str(failed)
    # the transaction is all or none: x2 is not there
    assert await node.query("SELECT k, n FROM kv ORDER BY k") == [("taken", 10), ("x1", 1)]
    assert node.stats().errors == 2


async def test_results_have_sqlite_types_and_percent_signs_pass_through(node: PostgresDatabase):
    await node.execute_many("INSERT INTO kv (k, n) VALUES (?, ?)", [("50%", 2**40), ("b", 3)])
    assert await node.query("SELECT sum(n), avg(n) FROM kv WHERE k LIKE '%'") == [(2**40 + 3, (2**40 + 3) / 2)]
    assert await node.query("SELECT k FROM kv WHERE k = '50%'") == [("50%",)]


async def test_stats_count_rows_commits_and_cumulative_buckets(node: PostgresDatabase):
    before = node.stats()
    await node.execute_many("INSERT INTO kv (k) VALUES (?)", [("r1",), ("r2",), ("r3",)])
    assert await node.transaction([("INSERT INTO kv (k) VALUES (?)", ("r4",)),
                                   ("UPDATE kv SET n = 1 WHERE k LIKE ?", ("r%",))]) == [1, 4]
    after = node.stats()
    assert after.rows_written - before.rows_written == 5
    assert after.commits - before.commits == 2
    assert after.commit_seconds_sum > before.commit_seconds_sum
    counts = [after.commit_buckets[b] for b in COMMIT_BUCKETS]
    assert counts == sorted(counts) and counts[-1] <= after.commits
    assert after.pending_writes == 0


async def test_writers_past_max_pending_wait_for_room(pg_dsn: str):
    db = PostgresDatabase(pg_dsn, max_pending_writes=2)
    await db.open()
    try:
        await db.execute(TABLE)
        seen: list[int] = []

        async def write(i: int) -> None:
            seen.append(db.stats().pending_writes)
            await db.execute("INSERT INTO kv (k) VALUES (?)", (f"k{i}",))

        await asyncio.gather(*(write(i) for i in range(20)))
        assert max(seen) <= 2
        assert await db.query("SELECT count(*) FROM kv") == [(20,)]
    finally:
        await db.close()


async def test_a_write_whose_caller_is_cancelled_still_commits(node: PostgresDatabase):
    write = asyncio.ensure_future(node.transaction([("SELECT pg_sleep(0.2)", ()),
                                                    ("INSERT INTO kv (k) VALUES (?)", ("kept",))]))
    await asyncio.sleep(0.05)
    write.cancel()
    with pytest.raises(asyncio.CancelledError):
        await write
    await node.close()          # waits for writes under way
    await node.open()
    assert await node.query("SELECT k FROM kv") == [("kept",)]


async def test_a_lost_connection_raises_unavailable_and_the_next_call_reconnects(node: PostgresDatabase):
    slow = asyncio.ensure_future(node.execute("INSERT INTO kv (k) SELECT 'never' FROM pg_sleep(5)"))
    for _ in range(100):
        busy = await node.query("SELECT pid FROM pg_stat_activity WHERE query LIKE 'INSERT INTO kv%pg_sleep%'")
        if busy:
            break
        await asyncio.sleep(0.02)
    try:
        assert await node.query("SELECT pg_terminate_backend(?)", (busy[0][0],)) == [(True,)]
    except StoreUnavailable:
        pass    # the terminated write marked the store down first, which gives up calls in flight (this one)
    with pytest.raises(StoreUnavailable, match="127.0.0.1"):
        await slow
    assert await node.execute("INSERT INTO kv (k) VALUES (?)", ("after",)) == 1
    assert await node.query("SELECT k FROM kv") == [("after",)]


async def test_close_is_idempotent_refuses_later_calls_and_reopens(node: PostgresDatabase):
    await node.execute("INSERT INTO kv (k) VALUES (?)", ("a",))
    await asyncio.gather(node.close(), node.close())
    with pytest.raises(StoreError, match="not open"):
        await node.query("SELECT k FROM kv")
    await node.open()
    assert await node.query("SELECT k FROM kv") == [("a",)]


async def test_a_database_of_a_newer_inferd_is_refused(node: PostgresDatabase, pg_dsn: str):
    await node.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (SCHEMA_VERSION + 1, 0.0))
    newer = PostgresDatabase(pg_dsn)
    with pytest.raises(StoreError, match="newer inferd"):
        await newer.open()


async def test_an_ordered_write_waits_for_another_nodes_open_one_so_paging_by_seq_passes_no_row(
        node: PostgresDatabase, pg_dsn: str):
    """Node A's ledger row takes seq 1 and has not committed; node B's row must not become visible with
    seq 2 before it, or an export paged by `after` would read seq 2 and never see seq 1."""
    ledger = Ledger(node)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as node_a:
        async with node_a.cursor() as cur:      # what node A's ordered write does, held open mid-way
            await cur.execute("SELECT pg_advisory_xact_lock(%s)", (ORDERED_WRITE_LOCK,))
            await cur.execute(to_pyformat(_INSERT), tuple(_values(row(request_id="from-a"))))
        from_b = asyncio.ensure_future(ledger.record(row(request_id="from-b")))
        done, _ = await asyncio.wait({from_b}, timeout=0.5)
        assert not done, "node B's row committed while node A's earlier one was still open"
        assert await ledger.rows(UsageFilter()) == []
        await node_a.commit()
        await from_b
    page = await ledger.rows(UsageFilter())
    assert [row.request_id for _, row in page] == ["from-a", "from-b"]
    assert page[0][0] < page[1][0]



async def test_a_claim_that_timed_out_behind_a_lock_is_rolled_back_so_the_retry_runs(node: PostgresDatabase,
                                                                                      pg_dsn: str):
    from inferd.store import REQUEST_DEADLINE, IdempotencyStore, StoreTimeout
    from inferd.store.db import MIN_CALL_S

    keys = IdempotencyStore(node)
    locker = await psycopg.AsyncConnection.connect(pg_dsn)
    try:
        await locker.execute("LOCK TABLE idempotency IN EXCLUSIVE MODE")    # the claim's INSERT waits on it
        token = REQUEST_DEADLINE.set(time.monotonic() + 0.1)       # a request near its deadline: MIN_CALL_S
        try:
            with pytest.raises(StoreTimeout) as timed_out:
                await keys.claim("acme", "k", b"sha", "n/1/1/r1", now=time.time(), hold_s=600, ttl_s=60)
        finally:
            REQUEST_DEADLINE.reset(token)
        assert timed_out.value.pending is None and f"{MIN_CALL_S:.2f} s" in str(timed_out.value)
    finally:
        await locker.rollback()                                     # the lock goes: a late claim would commit now
        await locker.close()
    retry = await keys.claim("acme", "k", b"sha", "n/1/1/r2", now=time.time(), hold_s=600, ttl_s=60)
    assert retry.outcome == "new"                                   # not 409: the first claim never committed
    assert node.health.ok                                           # a slow store is not a dead one
