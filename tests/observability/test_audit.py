import errno
import fcntl
import hashlib
import os
import threading

import pytest

from inferd.observability import audit as audit_mod
from inferd.observability.audit import GENESIS, AuditLog, AuditLogClosed, AuditWriteError, read_audit


@pytest.fixture
def make_log(tmp_path):
    logs = []

    def make(**kw):
        log = AuditLog(tmp_path / "audit" / "audit.jsonl", clock=lambda: 1700000000.0, **kw)
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()


def test_records_are_json_lines_with_every_field_in_order(make_log):
    log = make_log()
    log.append("key_ops", "rollout.start", target="chat", before={"phase": "idle"}, after={"phase": "running"},
               reason="ship v2")
    log.append("system", "rollout.rollback", target="chat", reason="error_rate", detail={"n": 200})
    log.flush()
    first, second = read_audit(log.path)
    assert first == {"time": 1700000000.0, "seq": 1, "actor": "key_ops", "action": "rollout.start",
                     "target": "chat", "before": {"phase": "idle"}, "after": {"phase": "running"},
                     "reason": "ship v2", "prev": GENESIS}
    assert second["seq"] == 2 and second["detail"] == {"n": 200} and second["actor"] == "system"
    assert second["prev"] == hashlib.sha256(log.path.read_bytes().splitlines(keepends=True)[0]).hexdigest()


def test_file_is_opened_append_only_and_reopening_keeps_old_records(make_log):
    log = make_log()
    assert fcntl.fcntl(log._fd, fcntl.F_GETFL) & os.O_APPEND
    log.append("a", "one")
    log.close()
    again = make_log()
    again.append("a", "two")
    again.close()
    assert [r["action"] for r in read_audit(again.path)] == ["one", "two"]
    assert oct(os.stat(again.path).st_mode & 0o777) == "0o600"


def test_close_writes_every_queued_record(make_log):
    log = make_log()
    for i in range(500):
        log.append("system", "rollout.step", reason=str(i))
    log.close()
    records = read_audit(log.path)
    assert [r["reason"] for r in records] == [str(i) for i in range(500)]
    with pytest.raises(AuditLogClosed):
        log.append("system", "late")


def test_append_never_waits_for_the_disk(make_log, monkeypatch):
    release, in_fsync = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        in_fsync.set()
        release.wait(5)
        real_fsync(fd)

    monkeypatch.setattr(audit_mod.os, "fsync", slow_fsync)
    log = make_log()
    log.append("system", "first")
    assert in_fsync.wait(5)                      # the writer is stuck on the disk...
    for i in range(100):                         # ...and appends still return at once
        log.append("system", "queued", reason=str(i))
    with pytest.raises(AuditWriteError, match="timed out"):
        log.flush(timeout=0.05)
    release.set()
    log.flush()
    assert len(read_audit(log.path)) == 101


def test_a_failed_write_is_retried_without_duplicating_or_tearing_records(make_log, monkeypatch):
    real_write, calls = os.write, []

    def flaky_write(fd, data):
        calls.append(len(data))
        if len(calls) == 1:      # half a batch lands, then the disk fills
            return real_write(fd, bytes(data[: len(data) // 2]))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(audit_mod.os, "write", flaky_write)
    log = make_log(retry_interval_s=0.01)
    log.append("system", "one", reason="x" * 100)
    log.flush()
    log.append("system", "two")
    log.flush()
    assert [r["action"] for r in read_audit(log.path)] == ["one", "two"]
    assert log.last_error is None


def test_reader_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"seq": 1, "action": "a"}\n{"seq": 2, "act')
    assert read_audit(path) == [{"seq": 1, "action": "a"}]
