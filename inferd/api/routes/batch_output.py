"""The lines of a batch's output and error files, in OpenAI's format, and the files themselves.

  output: {"id": "batch_req_...", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}
  error:  {"id", "custom_id", "response": {"status_code", "request_id", "body"} or null, "error": {"code", "message"}}
"""
from __future__ import annotations

import secrets
from collections.abc import Iterable

import orjson

from inferd.api.routes.batch_input import BatchLine
from inferd.store import BatchResult, FileRecord, file_insert_statements

OUTPUT_PURPOSE = "batch_output"


def _request_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


def http_result(line: BatchLine, status: int, request_id: str | None, raw: bytes) -> BatchResult:
    """What the daemon answered a line: a 200 is an output line, anything else an error line."""
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = raw.decode(errors="replace")
    response = {"status_code": status, "request_id": request_id, "body": body}
    error = None
    if status != 200:
        detail = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
        error = {"code": detail.get("code") or f"http_{status}",
                 "message": detail.get("message") or f"The request failed with HTTP status {status}."}
    out = {"id": _request_id(), "custom_id": line.custom_id, "response": response, "error": error}
    return BatchResult(idx=line.idx, custom_id=line.custom_id, ok=status == 200, body=orjson.dumps(out))


def failed_result(line: BatchLine, code: str, message: str) -> BatchResult:
    """A line that got no HTTP answer (it was never run: the batch expired first)."""
    out = {"id": _request_id(), "custom_id": line.custom_id, "response": None,
           "error": {"code": code, "message": message}}
    return BatchResult(idx=line.idx, custom_id=line.custom_id, ok=False, body=orjson.dumps(out))


def expired_results(lines: Iterable[BatchLine], recorded: set[int]) -> list[BatchResult]:
    """Error lines for every line the batch did not get to before its completion window ended."""
    return [failed_result(line, "batch_expired", "This request could not be executed before the batch's "
                          "completion window ended.") for line in lines if line.idx not in recorded]


def output_files(batch_id: str, tenant: str, results: list[BatchResult], *,
                 now: float) -> tuple[list[tuple[str, tuple]], FileRecord | None, FileRecord | None]:
    """(INSERT statements, output file, error file) for `results`, each file ordered by line index; a
    file with no lines is not written (its id stays null, as OpenAI's)."""
    ordered = sorted(results, key=lambda r: r.idx)
    statements: list[tuple[str, tuple]] = []
    made: list[FileRecord | None] = []
    for ok, suffix in ((True, "output"), (False, "error")):
        lines = [r.body for r in ordered if r.ok is ok]
        if not lines:
            made.append(None)
            continue
        record, inserts = file_insert_statements(tenant, OUTPUT_PURPOSE, f"{batch_id}_{suffix}.jsonl",
                                                 b"\n".join(lines) + b"\n", now=now)
        statements.extend(inserts)
        made.append(record)
    return statements, made[0], made[1]
