"""The listener's guards through the real daemon, with raw sockets: slow or silent clients are cut after
the configured deadline and counted, the connection cap refuses at accept, probes keep a reserve.

Timeouts are configured small (0.3 s) so the tests are quick; each waits for the server to close the
connection (a read returning b"", bounded by asyncio.wait_for), never for a fixed time.
"""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from inferd.config.root import ConfigError, parse_config
from inferd.daemon.lifecycle import Daemon
from inferd.daemon.listener import RateLimitedLog
from tests.daemon.harness import running_daemon

SIM = {"backend": "sim", "max_batch_size": 4, "max_num_tokens": 256, "num_kv_blocks": 256,
       "sim": {"profile": "tiny", "time_scale": 0.0, "max_model_len": 2048}}
FAST = {"header_timeout_s": 0.3, "body_timeout_s": 0.3, "idle_timeout_s": 0.3}
UPPER_BOUND_S = 5.0        # a cut that takes longer than this failed, whatever the configured timeout


@contextlib.asynccontextmanager
async def listening(tmp_path: Path, **server) -> AsyncIterator[Daemon]:
    raw = {"server": {"port": 0, "drain_grace_s": 0, **server}, "models": {"sim": SIM},
           "audit": {"path": "audit.jsonl"}}
    async with running_daemon(parse_config(raw, base_dir=tmp_path)) as (daemon, _task, _url):
        yield daemon


def cut(daemon: Daemon, reason: str) -> float:
    value = daemon.state.metrics.registry.get_sample_value("inferd_http_connections_cut_total", {"reason": reason})
    return value or 0.0


async def connect(daemon: Daemon) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", daemon.port)


async def read_until_closed(reader: asyncio.StreamReader, timeout: float = UPPER_BOUND_S) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    async def drain() -> bytes:
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(65536):
                data += chunk
        return data
    return await asyncio.wait_for(drain(), timeout)


async def get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> bytes:
    """One keep-alive GET; returns the status line and headers (bodies here are small and length-framed)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), UPPER_BOUND_S)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    await asyncio.wait_for(reader.readexactly(length), UPPER_BOUND_S)
    return head


async def test_a_connection_dripping_its_headers_is_cut_at_the_header_timeout(tmp_path):
    async with listening(tmp_path, **{**FAST, "idle_timeout_s": 30.0}) as daemon:
        reader, writer = await connect(daemon)
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        started = time.monotonic()
        closed = False
        for _ in range(100):                 # one byte every 0.1 s: the slowloris pace, scaled down
            writer.write(b"X")
            try:
                closed = await asyncio.wait_for(reader.read(1), 0.1) == b""
            except asyncio.TimeoutError:
                continue
            except ConnectionResetError:
                closed = True
            break
        elapsed = time.monotonic() - started
        writer.close()
        assert closed
        assert 0.25 <= elapsed < UPPER_BOUND_S      # at the header deadline, not the (30 s) idle one
        assert cut(daemon, "header_timeout") == 1


async def test_a_promised_body_never_sent_is_cut_at_the_body_timeout(tmp_path):
    async with listening(tmp_path, **FAST) as daemon:
        reader, writer = await connect(daemon)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\": ")
        started = time.monotonic()
        assert await read_until_closed(reader) == b""
        assert time.monotonic() - started >= 0.25
        writer.close()
        assert cut(daemon, "body_timeout") == 1
        assert daemon.state.in_flight == 0


async def test_a_silent_connection_is_closed_at_the_idle_timeout(tmp_path):
    async with listening(tmp_path, **FAST) as daemon:
        reader, writer = await connect(daemon)
        assert await read_until_closed(reader) == b""
        writer.close()
        assert cut(daemon, "idle") == 1


async def test_an_idle_keep_alive_connection_is_closed_after_its_response(tmp_path):
    async with listening(tmp_path, **FAST) as daemon:
        reader, writer = await connect(daemon)
        head = await get(reader, writer, "/healthz")
        assert head.startswith(b"HTTP/1.1 200")
        assert await read_until_closed(reader) == b""
        writer.close()
        assert cut(daemon, "idle") == 1
        assert cut(daemon, "header_timeout") == cut(daemon, "body_timeout") == 0


async def test_a_streaming_response_longer_than_every_timeout_is_not_cut(tmp_path):
    async with listening(tmp_path, **FAST) as daemon:
        reader, writer = await connect(daemon)
        body = b'{"model": "sim", "prompt": "hi", "max_tokens": 4, "stream": true}'
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), UPPER_BOUND_S)
        assert head.startswith(b"HTTP/1.1 200")
        stream = await asyncio.wait_for(reader.readuntil(b"data: [DONE]\n\n"), UPPER_BOUND_S)
        assert b'"finish_reason"' in stream
        writer.close()
        assert cut(daemon, "header_timeout") == cut(daemon, "body_timeout") == 0


async def test_over_the_cap_a_new_connection_is_refused_while_open_ones_work(tmp_path):
    async with listening(tmp_path, max_connections=2, probe_connections=0, idle_timeout_s=30.0) as daemon:
        held = [await connect(daemon) for _ in range(2)]
        for reader, writer in held:                  # both accepted and serving
            assert (await get(reader, writer, "/healthz")).startswith(b"HTTP/1.1 200")
        reader, writer = await connect(daemon)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await read_until_closed(reader) == b""   # closed at accept: no response at all
        writer.close()
        assert cut(daemon, "over_cap") == 1
        assert daemon.state.metrics.registry.get_sample_value("inferd_http_connections_open") == 2
        reader, writer = held[0]
        assert (await get(reader, writer, "/v1/models")).startswith(b"HTTP/1.1 200")
        for _, writer in held:
            writer.close()


@pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's ss reads a listening socket's queue length")
async def test_the_listen_queue_holds_every_connection_the_listener_takes(tmp_path):
    # aiohttp's default of 128 dropped the handshakes of a larger burst: those clients hung for seconds.
    async with listening(tmp_path, max_connections=1500, probe_connections=8) as daemon:
        listed = subprocess.run(["ss", "-Hltn", f"sport = :{daemon.port}"], capture_output=True, text=True,
                                check=True).stdout.split()
        kernel_cap = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert listed[0] == "LISTEN" and int(listed[2]) == min(1508, kernel_cap)    # Send-Q: the queue's length


async def test_at_the_cap_a_slow_client_that_never_finished_a_request_gives_its_slot_to_a_newcomer(tmp_path):
    async with listening(tmp_path, max_connections=2, probe_connections=0, idle_timeout_s=30.0,
                         header_timeout_s=30.0) as daemon:
        served_reader, served_writer = await connect(daemon)
        assert (await get(served_reader, served_writer, "/healthz")).startswith(b"HTTP/1.1 200")
        slow_reader, slow_writer = await connect(daemon)
        slow_writer.write(b"GET /heal")                  # a request it never finishes
        await slow_writer.drain()
        reader, writer = await connect(daemon)           # the cap is full: the slow one is evicted
        assert (await get(reader, writer, "/readyz")).startswith(b"HTTP/1.1 200")
        assert await read_until_closed(slow_reader) == b""
        assert (await get(served_reader, served_writer, "/healthz")).startswith(b"HTTP/1.1 200")  # kept
        assert cut(daemon, "over_cap") == 1
        for w in (served_writer, slow_writer, writer):
            w.close()


async def test_probe_slots_beyond_the_cap_answer_health_probes_only(tmp_path):
    async with listening(tmp_path, max_connections=1, probe_connections=1, idle_timeout_s=30.0) as daemon:
        reader, writer = await connect(daemon)
        assert (await get(reader, writer, "/healthz")).startswith(b"HTTP/1.1 200")
        for path, status in (("/readyz", b"200"), ("/v1/models", b"503"), ("/healthz", b"200")):
            probe_reader, probe_writer = await connect(daemon)
            probe_writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = await read_until_closed(probe_reader)   # one request, then the slot is freed
            probe_writer.close()
            assert answer.startswith(b"HTTP/1.1 " + status), answer
            if status == b"503":
                assert b'"code":"too_many_connections"' in answer
        assert cut(daemon, "over_cap") == 1
        assert (await get(reader, writer, "/healthz")).startswith(b"HTTP/1.1 200")
        writer.close()


async def test_new_limits_apply_to_connections_accepted_after_a_reload(tmp_path):
    async with listening(tmp_path, max_connections=1, probe_connections=0, idle_timeout_s=30.0) as daemon:
        reader, writer = await connect(daemon)
        assert (await get(reader, writer, "/healthz")).startswith(b"HTTP/1.1 200")
        cfg = daemon.state.config
        daemon.state.config = msgspec.structs.replace(
            cfg, server=msgspec.structs.replace(cfg.server, max_connections=2))
        second_reader, second_writer = await connect(daemon)
        assert (await get(second_reader, second_writer, "/healthz")).startswith(b"HTTP/1.1 200")
        for w in (writer, second_writer):
            w.close()


@pytest.mark.parametrize("key, value", [("header_timeout_s", 0), ("body_timeout_s", -1.0),
                                        ("idle_timeout_s", float("inf")), ("max_connections", 0),
                                        ("probe_connections", -1)])
def test_listener_limits_are_validated_naming_the_key(tmp_path, key, value):
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {key: value}}, base_dir=tmp_path)
    assert any(line.startswith(f"server.{key}:") for line in info.value.errors), info.value.errors


def test_the_protocol_log_allows_n_lines_a_second_and_reports_what_it_dropped():
    now = [0.0]
    limit = RateLimitedLog(2, clock=lambda: now[0])
    assert [limit.allow() for _ in range(5)] == [0, 0, None, None, None]
    now[0] = 1.0
    assert limit.allow() == 3
    assert limit.allow() == 0
