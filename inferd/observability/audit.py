"""The append-only audit log: one JSON object per line for every change to routing or rollouts.

`append()` never blocks the event loop: it stamps the record and hands it to a writer thread,
which writes whatever has queued up as one batch with a single `write()` on an O_APPEND descriptor,
then flushes and fsyncs before it counts the batch as durable. `close()` drains the queue first, so
a normal shutdown loses nothing; `flush()` waits until every record appended so far is on disk.

Record fields: `time` (unix seconds), `seq` (per process, increasing), `actor` (API key id, or
"system" for automatic decisions), `action` (e.g. "rollout.rollback"), `target` (alias, model or
version), `before` / `after` (JSON-able state), `reason`, and optional `detail` (evidence).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("inferd.audit")

SYSTEM_ACTOR = "system"


class AuditLogClosed(RuntimeError):
    """append() after close(): the record would be lost, so refuse loudly."""


class AuditWriteError(OSError):
    """The writer thread could not make records durable (disk full, file removed, ...)."""


class AuditLog:
    """Append-only JSON-lines file written by a background thread."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time,
                 retry_interval_s: float = 0.5) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        self._clock = clock
        self._retry_interval_s = retry_interval_s
        self._cond = threading.Condition()
        self._pending: list[bytes] = []
        self._seq = 0                  # records appended
        self._durable = 0              # records fsync'd
        self._closing = False
        self._closed = False
        self.last_error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="inferd-audit", daemon=True)
        self._thread.start()

    def append(self, actor: str, action: str, *, target: str | None = None, before: Any = None,
               after: Any = None, reason: str | None = None, detail: Any = None) -> int:
        """Queue one record; returns its sequence number. Safe from any thread; never blocks on I/O."""
        with self._cond:
            if self._closing:
                raise AuditLogClosed(f"audit log {self.path} is closed; record {action!r} refused")
            self._seq += 1
            record = {"time": self._clock(), "seq": self._seq, "actor": actor, "action": action,
                      "target": target, "before": before, "after": after, "reason": reason}
            if detail is not None:
                record["detail"] = detail
            self._pending.append(orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS) + b"\n")
            self._cond.notify_all()
            return self._seq

    def flush(self, timeout: float | None = 10.0) -> None:
        """Block until every record appended so far is fsync'd (call off the loop, or via to_thread)."""
        with self._cond:
            target = self._seq
            ok = self._cond.wait_for(lambda: self._durable >= target or self._closed, timeout)
            if self._durable < target:
                raise AuditWriteError(f"audit log {self.path}: {target - self._durable} record(s) not durable"
                                      + (f": {self.last_error}" if self.last_error else "")
                                      + ("" if ok else " (timed out)"))

    async def aflush(self) -> None:
        import asyncio
        await asyncio.to_thread(self.flush)

    def close(self, timeout: float | None = 10.0) -> None:
        """Write everything queued, then stop the thread and close the file. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            lost = self._seq - self._durable
            self._closed = True
            self._cond.notify_all()
        if not self._thread.is_alive():
            os.close(self._fd)
        if lost:
            raise AuditWriteError(f"audit log {self.path}: {lost} record(s) could not be written: {self.last_error}")

    async def aclose(self) -> None:
        import asyncio
        await asyncio.to_thread(self.close)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        data, count = b"", 0           # the batch in hand: bytes not yet written, records in it
        while True:
            if not count:
                with self._cond:
                    self._cond.wait_for(lambda: self._pending or self._closing)
                    if not self._pending:
                        return             # closing and nothing left
                    data, count = b"".join(self._pending), len(self._pending)
                    self._pending = []
            try:
                while data:  # one write() normally; after a short write or an error, only the rest
                    data = data[os.write(self._fd, data):]
                os.fsync(self._fd)
            except OSError as exc:
                log.error("audit write failed: %s", exc, extra={"path": str(self.path)})
                with self._cond:
                    self.last_error = exc
                    if self._closing:
                        return
                    self._cond.wait(self._retry_interval_s)
                continue
            with self._cond:
                self._durable += count
                count = 0
                self.last_error = None
                self._cond.notify_all()


def read_audit(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record in the file (a torn last line from a crash is skipped)."""
    records = []
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break
            try:
                records.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                log.warning("skipping a malformed audit line", extra={"path": str(path)})
    return records
