"""inferd.store.sqlite_checkpoint: the WAL checkpointed by a thread of its own, bounded while writes go on."""
from __future__ import annotations

import os
import sqlite3
import threading

from inferd.store import sqlite_checkpoint
from inferd.store.sqlite_checkpoint import Checkpointer


def _writer(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")        # as the store's writer: only the checkpointer does it
    conn.execute("CREATE TABLE t (data BLOB)")
    return conn


def test_commits_go_on_while_the_checkpointer_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_checkpoint, "MIN_GAP_S", 0.0)
    path = str(tmp_path / "db.sqlite")
    conn = _writer(path)
    checkpointer = Checkpointer(path)
    checkpointer.start()
    try:
        blob = os.urandom(64 * 1024)
        for _ in range(600):                              # ~38 MB written, in 64 KiB commits
            conn.execute("INSERT INTO t VALUES (?)", (blob,))
            conn.execute("DELETE FROM t WHERE rowid < (SELECT MAX(rowid) FROM t) - 8")
            checkpointer.committed()
        assert checkpointer.checkpoints > 0           # beside the writer's commits, none of them refused
        assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 9
    finally:
        checkpointer.stop()
        conn.close()


def test_an_idle_store_gets_its_wal_truncated(tmp_path):
    path = str(tmp_path / "db.sqlite")
    conn = _writer(path)
    checkpointer = Checkpointer(path)
    checkpointer.start()
    try:
        conn.execute("INSERT INTO t VALUES (?)", (os.urandom(256 * 1024),))
        checkpointer.committed()
        done = threading.Event()
        while not done.wait(0.05):                        # the idle TRUNCATE comes about a second later
            if os.path.getsize(path + "-wal") == 0:
                done.set()
            assert checkpointer.checkpoints < 1000        # a hang guard, not a timing
        assert os.path.getsize(path + "-wal") == 0
    finally:
        checkpointer.stop()
        conn.close()
