"""Billing of streams handed to a writer process ([server] front_processes): as in process
(tests/api/streaming/test_accepted.py), a client that stops reading is billed what its socket acknowledged,
counted by the writer that writes it."""
from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios

import aiohttp
import pytest

from inferd.api import appkeys as keys
from inferd.config.root import load_config
from tests.api.pipeline.test_billing import settled_rows
from tests.api.pipeline.test_usage import PRICES
from tests.api.streaming.test_accepted import complete_events, raw_stream, stalled_on
from tests.daemon.harness import running_daemon, sim_model, until, write_config

GENERATED = 1900
# No logprobs (a stream with them is written in process); continuous usage stats: each chunk says its count.
BODY = {"model": "sim", "prompt": "hello there", "max_tokens": GENERATED, "ignore_eos": True, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
# Short enough that it is all generated at once; long enough that, however its writer merges it into frames
# (at least ~4 bytes a token), it is several times what the client's smallest receive window takes.
SHORT = {**BODY, "max_tokens": 1800}
SMALLEST_RCVBUF = 1


def writers_config(tmp_path, *, time_scale: float, ack_timeout_s: float | None = None):
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=time_scale)}, PRICES)
    server = "[server]\nfront_processes = 1\n"
    if ack_timeout_s is not None:
        server += f"stream_ack_timeout_s = {ack_timeout_s}\n"
    path.write_text(path.read_text().replace("[server]\n", server, 1))
    return load_config(path)


def frames_tokens(data: bytes) -> int:
    """The completion tokens counted by the last complete chunk of a chunked SSE response's start."""
    tokens = 0
    for event in complete_events(data):
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    return tokens


def unread(sock: socket.socket) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def handed(daemon) -> int:
    return daemon._ctx.runner.app[keys.WRITERS].handed


async def test_a_client_that_stops_reading_a_handed_over_stream_is_billed_for_what_its_socket_took(tmp_path):
    async with running_daemon(writers_config(tmp_path, time_scale=0.01, ack_timeout_s=1.0)) as (daemon, _, url), \
            aiohttp.ClientSession() as http:
        sock = await raw_stream(url, BODY)
        loop = asyncio.get_running_loop()
        got = b""
        while frames_tokens(got) < 3:               # a few frames, then it stops reading
            got += await loop.sock_recv(sock, 1024)
        assert handed(daemon) == 1
        waiting = await stalled_on(sock, daemon.state.engines["sim"])
        reached = got + sock.recv(waiting, socket.MSG_PEEK)     # all that reached the client's socket
        sock.close()                                            # with unread data: a reset
        [row] = await settled_rows(http, url, 1)
        assert row["status"] == 499 and row["stream"]
        assert 0 < row["completion_tokens"] <= frames_tokens(reached) < GENERATED


async def test_a_short_handed_over_stream_whose_client_stops_reading_is_499_billed_what_reached_it(tmp_path):
    cfg = writers_config(tmp_path, time_scale=0.01, ack_timeout_s=0.3)
    async with running_daemon(cfg) as (daemon, _, url), aiohttp.ClientSession() as http:
        sock = await raw_stream(url, SHORT, SMALLEST_RCVBUF)   # the kernel rounds it up to its minimum
        loop = asyncio.get_running_loop()
        got = b""
        while frames_tokens(got) < 3:           # a few frames, then it stops reading, its window full
            got += await loop.sock_recv(sock, 1024)
        [row] = await settled_rows(http, url, 1)    # the 0.3 s bound on the end's acknowledgement
        reached = got + sock.recv(unread(sock), socket.MSG_PEEK)
        sock.close()
        assert handed(daemon) == 1
        assert row["status"] == 499 and row["stream"]
        assert 0 < row["completion_tokens"] <= frames_tokens(reached) < SHORT["max_tokens"]


async def test_a_handed_over_stream_read_to_its_end_is_200_with_its_full_usage(tmp_path):
    async with running_daemon(writers_config(tmp_path, time_scale=0.01, ack_timeout_s=1.0)) as (daemon, _, url), \
            aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json=SHORT) as resp:
            body = await resp.read()
        assert body.rstrip().endswith(b"data: [DONE]") and handed(daemon) == 1
        [row] = await settled_rows(http, url, 1)
        assert row["status"] == 200 and row["completion_tokens"] == SHORT["max_tokens"]


async def test_a_client_that_leaves_a_handed_over_stream_has_its_row_count_against_its_tenants_spend(tmp_path):
    # Its writer reports it gone and this process closes its copy of the socket, which cancels the handler while
    # the row commits: the commit goes on (shielded), and what it bills counts in the budget and the metric too.
    async with running_daemon(writers_config(tmp_path, time_scale=0.01)) as (daemon, _, url), \
            aiohttp.ClientSession() as http:
        sock = await raw_stream(url, BODY)
        loop = asyncio.get_running_loop()
        got = b""
        while frames_tokens(got) < 3:
            got += await loop.sock_recv(sock, 1024)
        assert handed(daemon) == 1
        sock.close()
        [row] = await settled_rows(http, url, 1)
        assert row["status"] == 499 and row["cost"] > 0
        budgets = daemon.state.tenancy.budgets

        async def counted() -> bool:
            return budgets.own("local")[0] > 0
        await until(counted, "the abandoned stream's row in the tenant's spend")
        assert budgets.own("local") == (pytest.approx(row["cost"]), row["prompt_tokens"] + row["completion_tokens"])
        async with http.get(url + "/metrics") as resp:
            metrics = await resp.text()
        assert f'inferd_tenant_spend_total{{tenant="local"}} {row["cost"]}' in metrics
