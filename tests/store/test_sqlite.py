"""SqliteDatabase: group commit, per-write failures, backpressure, the lock, the integrity check, durability."""
from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from inferd.config import StoreConfig
from inferd.store import (
    Ledger,
    SqliteDatabase,
    StoreCorrupt,
    StoreError,
    StoreLocked,
    StoreTimeout,
    StoreUnavailable,
    open_database,
)
from inferd.store.db import COMMIT_BUCKETS
from inferd.store.schema import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
KV = "CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB)"


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "state" / "inferd.db")


@pytest.fixture
async def sdb(path: str):
    db = SqliteDatabase(path)
    await db.open()
    await db.execute(KV)
    yield db
    await db.close()


def peek(path: str, sql: str, params=()) -> list[tuple]:
    """What another connection (another process, say) sees in the file."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


async def test_a_write_is_committed_when_execute_returns(sdb, path):
    assert await sdb.execute("INSERT INTO kv VALUES (?, ?)", ("a", b"1")) == 1
    assert peek(path, "SELECT k, v FROM kv") == [("a", b"1")]
    await sdb.execute_many("INSERT INTO kv VALUES (?, ?)", [("b", None), ("c", None)])
    assert await sdb.transaction([("DELETE FROM kv WHERE k = ?", ("a",)), ("UPDATE kv SET v = ?", (b"2",))]) == [1, 2]
    assert peek(path, "SELECT k, v FROM kv ORDER BY k") == [("b", b"2"), ("c", b"2")]
    assert await sdb.query("SELECT COUNT(*) FROM kv") == [(2,)]


async def test_the_state_directory_is_created_private(sdb, path):
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) & 0o077 == 0
    assert peek(path, "PRAGMA journal_mode") == [("wal",)]


async def test_concurrent_writes_share_commits(sdb):
    await asyncio.gather(*(sdb.execute("INSERT INTO kv VALUES (?, NULL)", (f"k{i}",)) for i in range(300)))
    stats = sdb.stats()
    assert stats.rows_written == 301 and stats.pending_writes == 0 and stats.errors == 0
    assert 1 <= stats.commits < 300
    assert list(stats.commit_buckets) == list(COMMIT_BUCKETS)
    counts = list(stats.commit_buckets.values())
    assert counts == sorted(counts) and counts[-1] <= stats.commits and stats.commit_seconds_sum > 0


async def test_a_failing_write_raises_only_in_its_caller(sdb, path):
    await sdb.execute("INSERT INTO kv VALUES ('dup', NULL)")
    keys = [f"k{i}" for i in range(50)]
    keys.insert(25, "dup")
    results = await asyncio.gather(*(sdb.execute("INSERT INTO kv VALUES (?, NULL)", (k,)) for k in keys),
                                   return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(failed) == 1 and results[25] is failed[0]
    assert type(failed[0]) is StoreError and "UNIQUE" in str(failed[0]) and path in str(failed[0])
    assert peek(path, "SELECT COUNT(*) FROM kv") == [(51,)]


async def test_a_failing_execute_many_or_transaction_leaves_nothing_behind(sdb, path):
    await sdb.execute("INSERT INTO kv VALUES ('dup', NULL)")
    with pytest.raises(StoreError, match="UNIQUE"):
        await sdb.execute_many("INSERT INTO kv VALUES (?, NULL)", [("x",), ("y",), ("dup",), ("z",)])
    with pytest.raises(StoreError, match="UNIQUE"):
        await sdb.transaction([("INSERT INTO kv VALUES ('x', NULL)", ()), ("INSERT INTO kv VALUES ('dup', NULL)", ())])
    with pytest.raises(StoreError, match="no such table"):
        await sdb.execute("INSERT INTO nowhere VALUES (1)")
    assert peek(path, "SELECT k FROM kv") == [("dup",)]
    assert sdb.stats().errors == 3


async def test_a_failed_commit_fails_its_group_and_the_writer_goes_on(sdb, path):
    # a deferred foreign key is only checked at COMMIT: the commit of the group holding the orphan fails
    await sdb.execute("CREATE TABLE child (k TEXT REFERENCES kv (k) DEFERRABLE INITIALLY DEFERRED)")
    writes = [sdb.execute("INSERT INTO kv VALUES (?, NULL)", (f"k{i}",)) for i in range(20)]
    writes.insert(10, sdb.execute("INSERT INTO child VALUES ('orphan')"))
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert isinstance(results[10], StoreUnavailable) and "FOREIGN KEY" in str(results[10])
    committed = {k for (k,) in peek(path, "SELECT k FROM kv")}
    for i, result in enumerate(r for j, r in enumerate(results) if j != 10):
        assert (f"k{i}" in committed) == (result == 1)         # raised exactly when it was not committed
    assert peek(path, "SELECT COUNT(*) FROM child") == [(0,)]
    assert await sdb.execute("INSERT INTO kv VALUES ('after', NULL)") == 1


async def test_a_full_disk_raises_store_unavailable_and_the_writer_goes_on(sdb):
    await sdb.execute("PRAGMA max_page_count = 64")      # the writer's connection: the file can't grow past 256 KiB
    with pytest.raises(StoreUnavailable, match="full"):
        for i in range(100):
            await sdb.execute("INSERT INTO kv VALUES (?, ?)", (f"big{i}", os.urandom(8192)))
    await sdb.execute("PRAGMA max_page_count = 1000000")
    assert await sdb.execute("INSERT INTO kv VALUES ('small', NULL)") == 1


async def test_a_full_disk_marks_the_store_down_until_a_ping_finds_room_again(sdb):
    await sdb.ping(2.0)
    await sdb.execute("PRAGMA max_page_count = 64")
    with pytest.raises(StoreUnavailable, match="full"):
        for i in range(1000):          # small rows: the last one fails with the file at its limit
            await sdb.execute("INSERT INTO kv VALUES (?, ?)", (f"big{i}", os.urandom(1000)))
    assert "full" in sdb.health.failure                     # the failed commit marked it
    with pytest.raises(StoreUnavailable, match="full"):
        await sdb.ping(2.0)                                 # the file still cannot grow
    await sdb.execute("PRAGMA max_page_count = 1000000")
    await sdb.ping(2.0)                                     # room again


async def test_writers_wait_for_room_and_nothing_is_lost(path):
    db = SqliteDatabase(path, max_pending_writes=3)
    await db.open()
    await db.execute(KV)
    writes = asyncio.gather(*(db.execute("INSERT INTO kv VALUES (?, NULL)", (f"k{i}",)) for i in range(100)))
    await asyncio.sleep(0)          # every writer has run up to its first wait
    assert db.stats().pending_writes <= 3
    assert await writes == [1] * 100
    await db.execute_many("INSERT INTO kv VALUES (?, NULL)", [(f"m{i}",) for i in range(10)])    # > the bound
    assert (await db.query("SELECT COUNT(*) FROM kv")) == [(110,)]
    await db.close()


async def test_a_file_that_is_not_a_database_is_refused_and_left_alone(path):
    os.makedirs(os.path.dirname(path))
    garbage = b"this is not an sqlite file " * 300
    Path(path).write_bytes(garbage)
    for _ in range(2):          # the failed open released its lock
        with pytest.raises(StoreCorrupt, match="refusing to start") as info:
            await SqliteDatabase(path).open()
        assert path in str(info.value)
    assert Path(path).read_bytes() == garbage and not os.path.exists(f"{path}-wal")


async def test_a_damaged_database_fails_its_integrity_check(path):
    db = SqliteDatabase(path)
    await db.open()
    await db.execute(KV)
    await db.execute_many("INSERT INTO kv VALUES (?, ?)", [(f"k{i}", os.urandom(100)) for i in range(500)])
    await db.close()
    page = peek(path, "PRAGMA page_size")[0][0]
    with open(path, "r+b") as f:       # scribble over the header of the last b-tree page
        f.seek(os.path.getsize(path) - page)
        f.write(b"\x07" * 64)
    damaged = Path(path).read_bytes()
    with pytest.raises(StoreCorrupt, match="refusing to start"):
        await SqliteDatabase(path).open()
    assert Path(path).read_bytes() == damaged


async def test_a_second_database_on_the_same_file_is_locked_out(sdb, path):
    with pytest.raises(StoreLocked, match="another inferd") as info:
        await SqliteDatabase(path).open()
    assert path in str(info.value) and f"pid {os.getpid()}" in str(info.value)
    await sdb.close()
    again = SqliteDatabase(path)
    await again.open()
    await again.close()


async def test_reopen_after_close_and_close_is_idempotent(path):
    db = SqliteDatabase(path)
    await db.open()
    await db.execute(KV)
    await db.execute("INSERT INTO kv VALUES ('a', NULL)")
    await db.close()
    await db.close()
    with pytest.raises(StoreError, match="closed"):
        await db.execute("INSERT INTO kv VALUES ('b', NULL)")
    await db.open()
    assert await db.query("SELECT k FROM kv") == [("a",)]
    versions = peek(path, "SELECT version FROM schema_version ORDER BY version")
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]        # each applied once
    await db.close()
    with pytest.raises(StoreError, match="not open"):
        await SqliteDatabase(path).query("SELECT 1")


async def test_a_database_of_a_newer_inferd_is_refused(path):
    db = SqliteDatabase(path)
    await db.open()
    await db.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    await db.close()
    with pytest.raises(StoreError, match="newer inferd"):
        await db.open()


async def test_readonly_reads_beside_the_writer(sdb, path):
    await sdb.execute("INSERT INTO kv VALUES ('a', NULL)")
    reader = SqliteDatabase(path, readonly=True)
    await reader.open()
    assert await reader.query("SELECT k FROM kv") == [("a",)]
    with pytest.raises(StoreError, match="read-only"):
        await reader.execute("INSERT INTO kv VALUES ('b', NULL)")
    await reader.close()
    with pytest.raises(StoreUnavailable, match="no database"):
        await SqliteDatabase(path + ".missing", readonly=True).open()


def test_open_database_builds_an_unopened_sqlite_database(path):
    db = open_database(StoreConfig(path=path, synchronous="full", max_pending_writes=7))
    assert isinstance(db, SqliteDatabase) and db.dialect == "sqlite" and db.where == path
    assert not os.path.exists(path)
    with pytest.raises(ValueError, match="synchronous"):
        SqliteDatabase(path, synchronous="off")


CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys
    from inferd.store import Ledger, LedgerRow, SqliteDatabase

    async def main(path, workers, each, kill_after):
        db = SqliteDatabase(path)
        await db.open()
        ledger, done = Ledger(db), 0

        async def one(i):
            nonlocal done
            await ledger.record(LedgerRow(
                request_id=f"r{i}", tenant="t", key_id=None, model="m", version="1", node="n", endpoint="completions",
                stream=False, prompt_tokens=1, cached_tokens=0, completion_tokens=1, status=200, finish_reason="stop",
                queue_s=None, prefill_s=None, decode_s=None, total_s=0.1, cost=0.0, finished_at=1.7e9))
            os.write(1, f"r{i}\\n".encode())        # the caller learns the row is committed
            done += 1
            if done == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)        # with other records still in flight

        async def worker(w):            # one request after another, like a client's connection
            for j in range(each):
                await one(w * each + j)

        await asyncio.gather(*(worker(w) for w in range(workers)))

    asyncio.run(main(sys.argv[1], *map(int, sys.argv[2:])))
""")


async def test_every_record_that_returned_survives_a_killed_process(path):
    run = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", CHILD, path, "20", "20", "150"], cwd=ROOT,
                                  capture_output=True, timeout=60)
    assert run.returncode == -9, run.stderr.decode()
    printed = set(run.stdout.decode().split())
    assert len(printed) >= 150
    db = SqliteDatabase(path)           # the dead process's lock went with it
    await db.open()
    from inferd.store import UsageFilter

    recorded = {row.request_id for _, row in await Ledger(db).rows(UsageFilter(), limit=1000)}
    await db.close()
    assert printed <= recorded


class Blocker:
    """`block()` in SQL on the writer's connection: the writer thread waits there until `release`."""

    def __init__(self, db: SqliteDatabase) -> None:
        import threading

        self.gate, self.entered = threading.Event(), threading.Event()

        def block() -> str:
            self.entered.set()
            self.gate.wait(30)
            return "blocked"

        db._writer.conn.create_function("block", 0, block)

    async def wait_entered(self) -> None:
        await asyncio.to_thread(self.entered.wait, 30)

    def release(self) -> None:
        self.gate.set()


async def test_a_write_whose_caller_timed_out_before_the_writer_took_it_is_never_written(path):
    db = SqliteDatabase(path, timeout_s=0.3)
    await db.open()
    try:
        await db.execute(KV)
        blocker = Blocker(db)
        stuck = asyncio.ensure_future(db.execute("INSERT INTO kv VALUES (block(), NULL)"))
        await blocker.wait_entered()
        with pytest.raises(StoreTimeout) as timed_out:
            await db.execute("INSERT INTO kv VALUES ('late', NULL)")
        assert timed_out.value.pending is None                      # withdrawn: "not written" is final
        with pytest.raises(StoreTimeout) as started:
            await stuck
        assert started.value.pending is not None                    # started: its outcome follows
        blocker.release()
        assert await started.value.pending == 1                     # it committed, and says so
        assert await db.execute("INSERT INTO kv VALUES ('after', NULL)") == 1
        assert sorted(k for (k,) in peek(path, "SELECT k FROM kv")) == ["after", "blocked"]
        assert db.health.ok                                         # slowness is not an outage
    finally:
        await db.close()


async def test_a_ping_queued_behind_writes_the_writer_is_getting_through_does_not_fail(sdb):
    def slow() -> int:
        time.sleep(0.01)
        return 1

    sdb._writer.conn.create_function("slow", 0, slow)
    writes = [asyncio.ensure_future(sdb.execute("INSERT INTO kv VALUES (?, slow())", (f"k{i}",)))
              for i in range(300)]                                  # about 3 s of work queued
    while sdb.stats().pending_writes < 300:                         # all queued before the ping
        await asyncio.sleep(0)
    await sdb.ping(0.5)                                             # behind it all: no answer, yet no failure
    assert sum(await asyncio.gather(*writes)) == 300


async def test_a_ping_fails_when_the_writer_is_stuck_on_one_op(sdb):
    blocker = Blocker(sdb)
    stuck = asyncio.ensure_future(sdb.execute("INSERT INTO kv VALUES (block(), NULL)"))
    await blocker.wait_entered()
    with pytest.raises(StoreTimeout, match="finished nothing"):
        await sdb.ping(0.3)
    blocker.release()
    assert await stuck == 1
    await sdb.ping(2.0)
