"""The audit log's hash chain: seq continues across opens, `prev` links each record to the line before,
`verify_audit` finds the first edited, deleted or torn record, and a torn tail is dropped at open."""
import hashlib
import json

import pytest

from inferd.__main__ import main
from inferd.observability.audit import GENESIS, AuditLog, read_audit, verify_audit


@pytest.fixture
def path(tmp_path):
    return tmp_path / "audit.jsonl"


def write(path, *actions: str) -> None:
    with AuditLog(path) as log:
        for action in actions:
            log.append("system", action, target="chat", reason="test")


def lines(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_seq_and_chain_continue_across_opens(path):
    write(path, "one", "two")
    reopened = AuditLog(path)
    assert reopened.seq == 2
    reopened.append("system", "three")
    reopened.close()
    records = read_audit(path)
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert records[0]["prev"] == GENESIS
    assert records[2]["prev"] == hashlib.sha256(lines(path)[1]).hexdigest()
    verdict = verify_audit(path)
    assert verdict.ok and verdict.records == 3 and verdict.last_seq == 3


def test_verify_names_the_record_after_a_modified_one(path):
    write(path, "one", "two", "three")
    data = lines(path)
    data[1] = data[1].replace(b'"reason":"test"', b'"reason":"edit"')
    path.write_bytes(b"".join(data))
    verdict = verify_audit(path)
    assert not verdict.ok and (verdict.line, verdict.seq) == (3, 3)
    assert "changed or removed" in str(verdict)


def test_verify_detects_a_deleted_record(path):
    write(path, "one", "two", "three")
    data = lines(path)
    path.write_bytes(data[0] + data[2])
    verdict = verify_audit(path)
    assert not verdict.ok and (verdict.line, verdict.seq) == (2, 3)
    assert "expected seq 2" in verdict.problem


def test_verify_detects_a_deleted_first_record(path):
    write(path, "one", "two")
    path.write_bytes(lines(path)[1])
    verdict = verify_audit(path)
    assert not verdict.ok and verdict.seq == 2 and "genesis" in verdict.problem


def test_verify_reports_a_truncated_final_line(path):
    write(path, "one", "two")
    path.write_bytes(path.read_bytes()[:-20])
    verdict = verify_audit(path)
    assert not verdict.ok and verdict.line == 2 and "truncated final line" in verdict.problem


def test_open_drops_a_torn_tail_and_records_that_it_did(path):
    write(path, "one", "two")
    intact = lines(path)
    torn = b'{"time":1.0,"seq":3,"act'
    path.write_bytes(b"".join(intact) + torn)
    log = AuditLog(path)
    log.append("system", "after")
    log.close()
    records = read_audit(path)
    assert [r["action"] for r in records] == ["one", "two", "audit.torn_tail_dropped", "after"]
    assert [r["seq"] for r in records] == [1, 2, 3, 4]
    assert records[2]["detail"] == {"bytes": len(torn), "sha256": hashlib.sha256(torn).hexdigest()}
    assert verify_audit(path).ok


def test_records_written_before_the_chain_are_accepted_as_a_prefix(path):
    legacy = [json.dumps({"time": 1.0, "seq": s, "actor": "system", "action": "old"}).encode() + b"\n"
              for s in (1, 2, 1)]                        # per-process seqs, as before the chain
    path.write_bytes(b"".join(legacy))
    write(path, "new")
    records = read_audit(path)
    assert records[-1]["seq"] == 2 and records[-1]["prev"] == hashlib.sha256(legacy[-1]).hexdigest()
    verdict = verify_audit(path)
    assert verdict.ok and verdict.legacy == 3 and "predate" in str(verdict)


def test_a_record_without_prev_after_chained_ones_is_a_break(path):
    write(path, "one")
    with open(path, "ab") as fh:
        fh.write(b'{"time":1.0,"seq":2,"actor":"x","action":"forged"}\n')
    verdict = verify_audit(path)
    assert not verdict.ok and verdict.line == 2 and "no prev" in verdict.problem


def test_cli_verify_exit_codes(path, tmp_path, capsys):
    write(path, "one", "two")
    assert main(["audit", "verify", str(path)]) == 0
    assert "2 records, chain intact" in capsys.readouterr().out
    config = tmp_path / "c.toml"
    config.write_text('[audit]\npath = "audit.jsonl"\n')
    assert main(["audit", "verify", "--config", str(config)]) == 0
    assert "2 records" in capsys.readouterr().out
    path.write_bytes(lines(path)[1])
    assert main(["audit", "verify", str(path)]) == 1
    assert "chain broken at line 1 (seq 2)" in capsys.readouterr().err


def test_cli_verify_of_a_missing_file_is_an_error(tmp_path, capsys):
    assert main(["audit", "verify", str(tmp_path / "nope.jsonl")]) == 1
    assert "nope.jsonl" in capsys.readouterr().err




def test_cli_verify_on_a_fresh_install_with_no_audit_log_yet_says_so_and_succeeds(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text("")                         # the config's own path: <state>/audit.jsonl, not written yet
    assert main(["audit", "verify", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "no audit log yet" in out and str(tmp_path / "state" / "audit.jsonl") in out
