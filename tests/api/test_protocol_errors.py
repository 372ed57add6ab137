"""Requests the HTTP parser refuses, through the real daemon over raw sockets: the OpenAI envelope with
the right 4xx, a `Server` header without versions, one short rate-limited log line and a counter,
never a traceback."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from inferd.config.root import parse_config
from inferd.daemon.lifecycle import Daemon
from inferd.daemon.listener import PROTOCOL_LOG_PER_S
from tests.daemon.harness import running_daemon

SIM = {"backend": "sim", "max_batch_size": 4, "max_num_tokens": 256, "num_kv_blocks": 256,
       "sim": {"profile": "tiny", "time_scale": 0.0, "max_model_len": 2048}}


@contextlib.asynccontextmanager
async def listening(tmp_path: Path) -> AsyncIterator[Daemon]:
    raw = {"server": {"port": 0, "drain_grace_s": 0}, "models": {"sim": SIM}, "audit": {"path": "audit.jsonl"}}
    async with running_daemon(parse_config(raw, base_dir=tmp_path)) as (daemon, _task, _url):
        yield daemon


async def exchange(daemon: Daemon, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes; the status, headers (lower-case names) and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
    writer.write(raw)

    async def read_all() -> bytes:
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(65536):
                data += chunk
        return data
    try:
        data = await asyncio.wait_for(read_all(), 5.0)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def errors_counted(daemon: Daemon, reason: str) -> float:
    return daemon.state.metrics.registry.get_sample_value("inferd_http_protocol_errors_total",
                                                          {"reason": reason}) or 0.0


MALFORMED = [
    ("bad_request_line", 400, "invalid_request_line", b"GARBAGE\r\n\r\n"),
    ("bad_request_line", 400, "invalid_request_line", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),
    ("uri_too_long", 414, "uri_too_long", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("header_too_large", 431, "request_header_too_large",
     b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n"),
    ("invalid_header", 400, "invalid_header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n"),
    ("invalid_framing", 400, "invalid_message_framing",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n"),
    ("invalid_framing", 400, "invalid_message_framing",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
]


@pytest.mark.parametrize("reason, status, code, raw", MALFORMED,
                         ids=["request_line", "tls_on_plain_port", "long_uri", "big_header", "bad_header_name",
                              "cl_and_te", "two_content_lengths"])
async def test_a_request_the_parser_refuses_gets_the_json_envelope_and_no_traceback(tmp_path, caplog, reason,
                                                                                    status, code, raw):
    caplog.set_level(logging.DEBUG)
    async with listening(tmp_path) as daemon:
        got_status, headers, body = await exchange(daemon, raw)
        assert got_status == status
        assert headers["content-type"].startswith("application/json")
        assert headers["server"] == "inferd"
        error = orjson.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error" and error["code"] == code
        assert b"b" * 100 not in body and b"a" * 100 not in body    # the client's bytes are never echoed
        assert errors_counted(daemon, reason) == 1
    assert not [r for r in caplog.records if r.exc_info or r.name.startswith("aiohttp")]
    lines = [r for r in caplog.records if r.getMessage() == "http_protocol_error"]
    assert len(lines) == 1 and len(r"{}".format(lines[0].fields)) < 200


async def test_a_flood_of_malformed_requests_logs_a_few_lines_and_counts_them_all(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    async with listening(tmp_path) as daemon:
        for _ in range(30):
            status, _, _ = await exchange(daemon, b"GARBAGE\r\n\r\n")
            assert status == 400
        assert errors_counted(daemon, "bad_request_line") == 30
    lines = [r for r in caplog.records if r.getMessage() == "http_protocol_error"]
    # At most PROTOCOL_LOG_PER_S a second (the flood may straddle a few one-second windows on a slow runner).
    assert PROTOCOL_LOG_PER_S <= len(lines) < 30
    assert sum(r.fields.get("suppressed", 0) for r in lines) <= 30 - len(lines)


async def test_the_server_header_names_no_python_or_aiohttp_version(tmp_path):
    async with listening(tmp_path) as daemon:
        body = b'{"model": "sim", "prompt": "hi", "max_tokens": 2, "stream": true}'
        requests = [
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
        ]
        for raw in requests:
            status, headers, _ = await exchange(daemon, raw)
            assert status in (200, 404)
            assert headers["server"] == "inferd", headers
