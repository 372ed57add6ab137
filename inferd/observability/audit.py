"""The append-only audit log: one JSON object per line for every change to routing or rollouts.

`append()` never blocks the event loop: it stamps the record and hands it to a writer thread,
which writes whatever has queued up as one batch with a single `write()` on an O_APPEND descriptor,
then flushes and fsyncs before it counts the batch as durable. `close()` drains the queue first, so
a normal shutdown loses nothing; `flush()` waits until every record appended so far is on disk.

Record fields: `time` (unix seconds), `seq` (increasing by one, continuing across restarts), `actor`
(API key id, or "system" for automatic decisions), `action` (e.g. "rollout.rollback"), `target`
(alias, model or version), `before` / `after` (JSON-able state), `reason`, optional `detail`
(evidence), and `prev`: the sha256 of the previous record's exact line (GENESIS for the first), so
editing or deleting a record breaks the chain that `verify_audit` (`inferd audit verify`) walks.

Opening reads only the file's last complete line (a bounded read from the end) to continue `seq` and
the chain. A torn last line (a crash mid-write: never fsync'd, so never reported durable) is cut off
at open and an `audit.torn_tail_dropped` record says how many bytes went, with their hash.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("inferd.audit")

SYSTEM_ACTOR = "system"
GENESIS = "0" * 64               # `prev` of the first record of a new file
_TAIL_BLOCK = 4096


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
        try:
            last_line, end, size = _last_line(self.path)
            if size > end:             # torn tail: appending after it would glue two records together
                torn = _read_range(self.path, end, size)
                os.ftruncate(self._fd, end)
                log.warning("audit_torn_tail_dropped", extra={"path": str(self.path), "bytes": size - end})
        except OSError:
            os.close(self._fd)
            raise
        self._clock = clock
        self._retry_interval_s = retry_interval_s
        self._cond = threading.Condition()
        self._pending: list[bytes] = []
        self._seq = _seq_of(last_line, self.path)   # the last record's seq (continues the file's)
        self._appended = 0             # records appended by this process
        self._prev = hashlib.sha256(last_line).hexdigest() if last_line else GENESIS
        self._durable = 0              # records fsync'd
        self._closing = False
        self._closed = False
        self.last_error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="inferd-audit", daemon=True)
        self._thread.start()
        if size > end:
            self.append(SYSTEM_ACTOR, "audit.torn_tail_dropped", target=self.path.name,
                        reason="the last line was incomplete at open (a crash mid-write)",
                        detail={"bytes": size - end, "sha256": hashlib.sha256(torn).hexdigest()})

    @property
    def seq(self) -> int:
        """The sequence number of the last record appended (or found at open)."""
        return self._seq

    def append(self, actor: str, action: str, *, target: str | None = None, before: Any = None,
               after: Any = None, reason: str | None = None, detail: Any = None) -> int:
        """Queue one record; returns its sequence number. Safe from any thread; never blocks on I/O."""
        with self._cond:
            if self._closing:
                raise AuditLogClosed(f"audit log {self.path} is closed; record {action!r} refused")
            self._seq += 1
            self._appended += 1
            record = {"time": self._clock(), "seq": self._seq, "actor": actor, "action": action,
                      "target": target, "before": before, "after": after, "reason": reason}
            if detail is not None:
                record["detail"] = detail
            record["prev"] = self._prev
            line = orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS) + b"\n"
            self._prev = hashlib.sha256(line).hexdigest()
            self._pending.append(line)
            self._cond.notify_all()
            return self._seq

    def flush(self, timeout: float | None = 10.0) -> None:
        """Block until every record appended so far is fsync'd (call off the loop, or via to_thread)."""
        with self._cond:
            target = self._appended
            ok = self._cond.wait_for(lambda: self._durable >= target or self._closed, timeout)
            if self._durable < target:
                raise AuditWriteError(f"audit log {self.path}: {target - self._durable} record(s) not durable"
                                      + (f": {self.last_error}" if self.last_error else "")
                                      + ("" if ok else " (timed out)"))

    def close(self, timeout: float | None = 10.0) -> None:
        """Write everything queued, then stop the thread and close the file. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            lost = self._appended - self._durable
            self._closed = True
            self._cond.notify_all()
        if not self._thread.is_alive():
            os.close(self._fd)
        if lost:
            raise AuditWriteError(f"audit log {self.path}: {lost} record(s) could not be written: {self.last_error}")

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


# -- the chain ---------------------------------------------------------------------------------


def _last_line(path: Path) -> tuple[bytes, int, int]:
    """(last complete line with its newline or b"", offset just past it, file size): reads back from
    the end in growing blocks, so opening costs one record's bytes, not the file's."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        block = _TAIL_BLOCK
        while True:
            start = max(0, size - block)
            fh.seek(start)
            data = fh.read(size - start)
            last = data.rfind(b"\n")
            if last < 0 and start == 0:
                return b"", 0, size                     # not one complete line
            if last >= 0:
                before = data.rfind(b"\n", 0, last)
                if before >= 0 or start == 0:
                    return data[before + 1:last + 1], start + last + 1, size
            block *= 4


def _read_range(path: Path, start: int, end: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(start)
        return fh.read(end - start)


def _seq_of(line: bytes, path: Path) -> int:
    if not line:
        return 0
    try:
        seq = orjson.loads(line).get("seq")
    except (orjson.JSONDecodeError, AttributeError):
        seq = None
    if not isinstance(seq, int):
        # Keep appending (losing records is worse); `inferd audit verify` will point at this line.
        log.error("audit_last_record_unreadable", extra={"path": str(path)})
        return 0
    return seq


class AuditVerdict:
    """What `verify_audit` found: `ok`, how many `records`, and for a break the `line`, `seq` and why."""

    def __init__(self, path: Path, records: int, legacy: int, last_seq: int | None, *, line: int | None = None,
                 seq: int | None = None, problem: str | None = None) -> None:
        self.path, self.records, self.legacy, self.last_seq = path, records, legacy, last_seq
        self.line, self.seq, self.problem = line, seq, problem

    @property
    def ok(self) -> bool:
        return self.problem is None

    def __str__(self) -> str:
        if not self.ok:
            at = f"line {self.line}" + (f" (seq {self.seq})" if self.seq is not None else "")
            return f"{self.path}: chain broken at {at}: {self.problem}"
        unchained = f"; the first {self.legacy} predate the hash chain (not verifiable)" if self.legacy else ""
        return f"{self.path}: {self.records} records, chain intact (last seq {self.last_seq}){unchained}"


def verify_audit(path: str | Path) -> AuditVerdict:
    """Walk the file: every record must be JSON on a complete line, carry `seq` one more than the
    previous record's, and `prev` equal to the sha256 of the previous line. Records written before
    the chain existed (no `prev`) are accepted only as a prefix. Blocking: a CLI or a thread."""
    path = Path(path)
    prev, last_seq, count, legacy = GENESIS, None, 0, 0

    def broken(lineno: int, seq: int | None, problem: str) -> AuditVerdict:
        return AuditVerdict(path, count, legacy, last_seq, line=lineno, seq=seq, problem=problem)

    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.endswith(b"\n"):
                return broken(lineno, None, f"truncated final line ({len(line)} bytes, no newline): a crash "
                                            f"mid-write, or the file was cut; the daemon drops it at its next open")
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                return broken(lineno, None, "not a JSON record")
            seq = record.get("seq") if isinstance(record, dict) else None
            if not isinstance(seq, int):
                return broken(lineno, None, "record has no integer seq")
            if "prev" not in record:
                if count > legacy:
                    return broken(lineno, seq, "record has no prev hash, after chained records")
                legacy += 1
            else:
                if last_seq is not None and seq != last_seq + 1:
                    gap = "missing" if seq > last_seq + 1 else "repeated or out of order"
                    return broken(lineno, seq, f"expected seq {last_seq + 1}: records {gap}")
                if record["prev"] != prev:
                    what = ("the previous record was changed or removed" if count
                            else "the first record's prev is not genesis (records before it removed?)")
                    return broken(lineno, seq, f"prev hash does not match: {what}")
            prev, last_seq, count = hashlib.sha256(line).hexdigest(), seq, count + 1
    return AuditVerdict(path, count, legacy, last_seq)


def audit_verify_main(path: str | Path, *, missing_ok: bool = False) -> int:
    """`inferd audit verify`: print the verdict; 0 if the chain is intact, 1 if broken or unreadable.
    `missing_ok` (the config's own path, not one the caller named): no file yet is a fresh install, 0."""
    if missing_ok and not Path(path).exists():
        print(f"no audit log yet at {path}: nothing to verify (the daemon starts it with "
              "the first change it audits)")
        return 0
    try:
        verdict = verify_audit(path)
    except OSError as exc:
        print(f"error: audit log {path}: {exc.strerror}", file=sys.stderr)
        return 1
    print(verdict, file=sys.stdout if verdict.ok else sys.stderr)
    return 0 if verdict.ok else 1
