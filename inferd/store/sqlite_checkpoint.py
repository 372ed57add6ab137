"""The SQLite WAL's checkpoints, on a thread and connection of their own.

SQLite's automatic checkpoint runs inside the COMMIT that pushes the WAL past ~4 MB, on the writer
thread: every write queued behind that commit (a ledger row) waits while the WAL's pages are copied into
the database file and synced. The writer turns it off (`wal_autocheckpoint = 0`) and this thread does the
work instead: after commits it runs PASSIVE checkpoints, which copy what they can without taking the
write lock, so commits go on meanwhile. The WAL stays bounded: once a PASSIVE checkpoint has copied every
frame, the writer's next transaction starts the WAL over from its beginning; when the writer is idle a
TRUNCATE checkpoint empties the file; and if PASSIVE checkpoints fall behind (a long read holding old
frames) past `HARD_PAGES`, a RESTART checkpoint waits for the writer between transactions and resets it.

Durability is unchanged: a commit is in the WAL (synced there under synchronous = "full") before the
write returns; a checkpoint only moves committed pages into the database file, whoever runs it.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time

log = logging.getLogger("inferd.store")

HARD_PAGES = 16384              # ~64 MB of WAL: past it, a RESTART checkpoint (see the module's text)
IDLE_S = 1.0                    # no commit for this long: TRUNCATE the WAL to zero bytes
MIN_GAP_S = 0.1                 # at most ~10 checkpoints a second under load: each one syncs the file
# A RESTART or TRUNCATE holds the write lock while it waits for readers: give up well before the writer's
# own busy timeout (sqlite_writer.BUSY_TIMEOUT_MS), so a write is delayed, never refused, by one.
BUSY_TIMEOUT_MS = 100


class Checkpointer:
    """Started by the writer once its connection is set up; `committed()` after each commit (any thread);
    `stop()` before the writer's connection closes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._wake = threading.Event()
        self._stopping = False
        self._conn: sqlite3.Connection | None = None
        self._thread = threading.Thread(target=self._run, name="inferd-store-checkpoint", daemon=True)
        self.checkpoints = 0            # how many ran (tests)
        self.wal_pages = 0              # the WAL's frames after the last checkpoint

    def start(self) -> None:
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._conn.execute("PRAGMA wal_autocheckpoint = 0")
        self._thread.start()

    def committed(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _run(self) -> None:
        quiet_since = time.monotonic()
        while not self._stopping:
            if self._wake.wait(IDLE_S / 4):
                self._wake.clear()
                if self._stopping:
                    return
                self._checkpoint("PASSIVE")
                if self.wal_pages >= HARD_PAGES:
                    self._checkpoint("RESTART")
                quiet_since = time.monotonic()
                time.sleep(MIN_GAP_S)
            elif self.wal_pages and time.monotonic() - quiet_since >= IDLE_S:
                self._checkpoint("TRUNCATE")

    def _checkpoint(self, mode: str) -> None:
        try:
            busy, log_pages, _ = self._conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        except sqlite3.Error as exc:        # the writer reports the store's health; here, try again later
            log.warning("checkpoint %s of %s failed: %s", mode, self.path, exc)
            return
        self.checkpoints += 1
        if not busy:
            self.wal_pages = max(0, log_pages)
