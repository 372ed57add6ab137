"""SSE writer processes ([server] front_processes): a stream handed to a writer process after its headers."""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferd.config.root import load_config
from tests.daemon.harness import running, running_daemon, sim_model, until, write_config
from tests.daemon.test_tls import ca, sdk, server_cert, tls_config  # noqa: F401 (fixtures)

openai = pytest.importorskip("openai")


def writers_config(tmp_path, time_scale: float = 0.0):
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=time_scale)})
    path.write_text(path.read_text().replace("[server]\n", "[server]\nfront_processes = 1\n", 1))
    return load_config(path)


async def usage_rows(url: str) -> list[dict]:
    async with aiohttp.ClientSession() as http, \
            http.get(url + "/admin/usage", params={"rows": "true", "format": "jsonl"}) as resp:
        return [json.loads(line) for line in (await resp.text()).splitlines()]


async def test_a_chat_stream_is_written_by_a_writer_process_in_order_with_usage_and_done_after_its_row(tmp_path):
    cfg = writers_config(tmp_path)
    async with running_daemon(cfg) as (daemon, _, url):
        writers = daemon_writers(daemon)
        assert len(writers.links) == 1
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            messages = [{"role": "user", "content": "hi"}]
            whole = await sdk.chat.completions.create(model="sim", messages=messages, max_tokens=40, temperature=0)
            stream = await sdk.chat.completions.create(model="sim", messages=messages, max_tokens=40, temperature=0,
                                                       stream=True, stream_options={"include_usage": True})
            chunks = [c async for c in stream]
            # [DONE] came: the ledger has the row already, not eventually
            rows = await usage_rows(url)
        assert writers.handed == 1
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
        assert chunks[0].choices[0].delta.role == "assistant"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        assert len(rows) == 2 and {r["status"] for r in rows} == {200}


def daemon_writers(daemon):
    from inferd.api import appkeys as keys
    return daemon._ctx.runner.app[keys.WRITERS]


async def test_a_client_that_leaves_a_handed_over_stream_has_its_engine_request_aborted(tmp_path):
    cfg = writers_config(tmp_path, time_scale=1.0)
    async with running_daemon(cfg) as (daemon, _, url):
        body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "stream": True}
        async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.headers.get("Connection") != "close"     # kept alive: the writer hands the socket back
            first = await resp.content.readuntil(b"\n\n")
            assert first.startswith(b"data: ") and b'"role":"assistant"' in first
            resp.connection.transport.abort()           # the client leaves mid-stream
        assert daemon_writers(daemon).handed == 1

        async def recorded() -> bool:
            return bool(await usage_rows(url))
        await until(recorded, "the left stream's ledger row")
        [row] = await usage_rows(url)
        assert row["status"] == 499 and row["completion_tokens"] < 1000


async def test_continuous_usage_counts_every_token_of_a_handed_over_stream(tmp_path):
    async with running_daemon(writers_config(tmp_path)) as (daemon, _, url), \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        stream = await sdk.completions.create(model="sim", prompt="hello", max_tokens=30, stream=True,
                                              stream_options={"include_usage": True, "continuous_usage_stats": True})
        chunks = [c async for c in stream]
        assert daemon_writers(daemon).handed == 1
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert counts == sorted(counts) and counts[-1] == chunks[-1].usage.completion_tokens
    assert chunks[-1].usage.completion_tokens == 30


async def test_a_tls_stream_stays_in_process_with_writers_configured(tmp_path, ca, server_cert):  # noqa: F811
    path = tls_config(tmp_path)
    path.write_text(path.read_text().replace("[server]\n", "[server]\nfront_processes = 1\n", 1))
    async with running(path) as (daemon, _), sdk(daemon, ca.client_context()) as client:
        stream = await client.completions.create(model="m", prompt="hello", max_tokens=8, stream=True)
        chunks = [c async for c in stream]
        assert chunks[-1].choices[0].finish_reason == "length"
        assert daemon_writers(daemon).handed == 0          # an SSL socket cannot be handed over


async def test_a_drain_lets_a_handed_over_stream_finish(tmp_path):
    async with running_daemon(writers_config(tmp_path, time_scale=1.0), drain=True) as (daemon, _, url):
        body = {"model": "sim", "prompt": "hello", "max_tokens": 60, "stream": True}
        async with aiohttp.ClientSession() as http, http.post(url + "/v1/completions", json=body) as resp:
            await resp.content.readuntil(b"\n\n")
            daemon.request_stop()                   # drains: the stream in flight runs to its end
            rest = await resp.content.read()
        assert rest.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"length"' in rest
        assert daemon_writers(daemon).handed == 1


async def test_a_deadline_mid_stream_on_a_handed_over_stream_is_a_504_though_the_client_hangs_up_on_its_frame(
        tmp_path):
    async with running_daemon(writers_config(tmp_path, time_scale=1.0)) as (daemon, _, url), \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        # cut by it: 2000 tokens would take several seconds and end "length"
        stream = await sdk.completions.create(model="sim", prompt="x", max_tokens=2000, stream=True,
                                              extra_headers={"X-Request-Timeout": "1.0"})
        text = []
        with pytest.raises(openai.APIError) as exc:     # the SDK hangs up as soon as it reads the error frame
            async for chunk in stream:
                text.append(chunk.choices[0].text if chunk.choices else "")
        assert exc.value.body["code"] == "deadline_exceeded" and "".join(text)
        assert await daemon.state.wait_idle(timeout=1.0)
        assert daemon.state.engines["sim"].stats().kv_blocks_used == 0
        [row] = await usage_rows(url)
        async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
            metrics = await resp.text()
    assert daemon_writers(daemon).handed == 1
    assert row["status"] == 504
    # the request's own status too (a handed-over stream's client leaving after its final frames is done, not gone)
    answered = {s.labels["status"] for f in text_string_to_metric_families(metrics)
                if f.name == "inferd_tenant_requests" for s in f.samples if s.value and s.name.endswith("_total")}
    assert answered == {"504"}


def sse_events(body: bytes) -> list[dict]:
    """The JSON events of a chunked SSE response (headers included), in order."""
    _, _, rest = body.partition(b"\r\n\r\n")
    payload = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if not size:
            break
        payload, rest = payload + rest[:size], rest[size + 2:]
    return [json.loads(line[6:]) for line in payload.split(b"\n") if line.startswith(b"data: {")]


async def test_a_client_that_stops_reading_pauses_its_text_until_drained_and_gets_every_token_in_order(tmp_path):
    from tests.api.streaming.test_accepted import raw_stream
    body = {"model": "sim", "prompt": "hello there", "max_tokens": 1900, "ignore_eos": True, "temperature": 0}
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    async with running_daemon(writers_config(tmp_path, time_scale=0.01)) as (daemon, _, url):
        async with aiohttp.ClientSession() as http, http.post(url + "/v1/completions", json=body) as resp:
            whole = (await resp.json())["choices"][0]["text"]
        from inferd.api import appkeys as keys
        inflight = daemon._ctx.runner.app[keys.INFLIGHT]
        sock = await raw_stream(url, streamed)      # a small receive buffer, and nothing read for now

        async def handed() -> bool:
            return any(e.sender is not None for e in inflight.entries)
        await until(handed, "the stream's headers")
        [entry] = inflight.entries
        # The connection's send buffer small (the writer's copy is the same socket), so it fills at once.
        entry.sender._transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

        async def blocked() -> bool:                # the writer reported BLOCKED: no more text is sent to it
            return any(getattr(e.sender, "paused", False) for e in inflight.entries)
        await until(blocked, "the writer to report its client blocked", timeout_s=30)
        loop, got = asyncio.get_running_loop(), b""
        while not got.endswith(b"\r\n0\r\n\r\n"):     # reads it all, to the body's end (the connection is
            data = await loop.sock_recv(sock, 1 << 16)       # kept open after it): DRAINED, the text resumes
            assert data, "the connection closed before the body's end"
            got += data
        sock.close()
    events = sse_events(got)
    assert daemon_writers(daemon).handed == 1
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == whole
    counts = [e["usage"]["completion_tokens"] for e in events if e.get("usage")]
    assert counts == sorted(counts) and counts[-1] == 1900


async def test_a_writer_that_dies_mid_stream_ends_it_as_a_disconnect_and_a_new_writer_takes_new_streams(tmp_path):
    async with running_daemon(writers_config(tmp_path, time_scale=1.0)) as (daemon, _, url):
        writers, engine = daemon_writers(daemon), daemon.state.engines["sim"]
        dead = writers.links[0]
        body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "stream": True}
        async with aiohttp.ClientSession() as http, http.post(url + "/v1/chat/completions", json=body) as resp:
            await resp.content.readuntil(b"\n\n")
            dead.process.kill()
            rest = b""
            with contextlib.suppress(aiohttp.ClientError):
                rest = await resp.content.read()
        assert b"[DONE]" not in rest

        async def recorded() -> bool:
            return bool(await usage_rows(url))
        await until(recorded, "the cut stream's ledger row")
        [row] = await usage_rows(url)
        assert row["status"] == 499 and row["completion_tokens"] < 1000

        async def aborted() -> bool:
            return engine.stats().running == 0
        await until(aborted, "its engine request to be aborted")

        async def replaced() -> bool:
            return writers.links[0] is not dead and not writers.links[0].down
        await until(replaced, "a new writer process")
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            stream = await sdk.completions.create(model="sim", prompt="hello", max_tokens=5, stream=True)
            chunks = [c async for c in stream]
        assert chunks[-1].choices[0].finish_reason == "length"
        assert writers.handed == 2 and writers.links[0].process.pid != dead.process.pid


async def test_the_daemon_serves_once_its_writer_processes_are_listening(tmp_path):
    # A stream handed to a writer still importing waited for it (most of a second): the first streams after a
    # start got their first token that late, and a queued stream behind one was admitted past its deadline.
    cfg = writers_config(tmp_path)
    async with running_daemon(cfg) as (daemon, _, url):
        writers = daemon_writers(daemon)
        assert all(link.ready.done() and not link.down for link in writers.links)
        for link in writers.links:      # named only once its imports are done, in main()
            with open(f"/proc/{link.process.pid}/comm") as comm:
                assert comm.read().strip() == "inferd-writer"


async def test_a_handed_over_streams_write_delays_and_itls_measured_by_its_writer_reach_the_daemons_metrics(tmp_path):
    # Real-time steps (about 2.5 ms each) over half a second: a fast stream's text can all merge into its final
    # frames (written as RAW, which carries no push time), so this one runs long enough to be stepped.
    async with running_daemon(writers_config(tmp_path, time_scale=1.0)) as (daemon, _, url), \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        stream = await sdk.completions.create(model="sim", prompt="hello", max_tokens=200, stream=True)
        chunks = [c async for c in stream]
        assert daemon_writers(daemon).handed == 1

        async def observed() -> bool:       # the writer reports them with its samples, a few times a second
            async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
                text = await resp.text()
            counts = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                      if s.name.endswith("_count") and s.labels.get("model") == "sim"}
            # every chunk's latency: the first's (TTFT) here, each later one's (ITL) as the writer's socket took it
            return (counts.get("inferd_stream_write_delay_seconds_count", 0) > 0
                    and counts.get("inferd_inter_token_latency_seconds_count", 0) >= len(chunks) // 2)
        await until(observed, "the writer's write delays and ITLs in /metrics")
