"""SSE framing on the wire, heartbeats, disconnects and abnormal stream ends."""
from __future__ import annotations

import asyncio
import json
import re
import socket
from types import SimpleNamespace

import aiohttp
import openai
import pytest

from inferd.api import appkeys
from inferd.api.streaming.accepted import SocketAccepted
from inferd.api.streaming.inflight import Flusher
from inferd.api.streaming.sse import Sender
from inferd.engine.sim.engine import SimEngine
from inferd.types import Delta
from tests.api.conftest import metric_value, sim_engine


async def raw_post(base_url: str, path: str, body: dict) -> bytes:
    """One HTTP/1.1 request on a bare socket; returns the de-chunked response body (and checks that
    nothing follows the last chunk: a second response written into the stream would)."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    data = await reader.read(-1)
    writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"content-type: text/event-stream" in head.lower()
    assert b"transfer-encoding: chunked" in head.lower()
    body_bytes = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", rest
            return body_bytes
        body_bytes += rest[:size]
        rest = rest[size + 2:]


async def test_raw_sse_frames_are_data_lines_ending_with_done(served):
    body = await raw_post(served.base_url, "/v1/completions",
                          {"model": "sim", "prompt": "hi", "max_tokens": 8, "stream": True,
                           "stream_options": {"include_usage": True}})
    frames = body.split(b"\n\n")
    assert frames[-1] == b"" and frames[-2] == b"data: [DONE]"
    # the per-stage breakdown of Server-Timing, as a comment (clients skip it) just before [DONE]
    assert re.fullmatch(rb": server-timing api;dur=[0-9.]+, queue;dur=[0-9.]+, engine_queue;dur=[0-9.]+, "
                        rb"prefill;dur=[0-9.]+, decode;dur=[0-9.]+, write;dur=[0-9.]+, total;dur=[0-9.]+", frames[-3])
    events = [json.loads(f.removeprefix(b"data: ")) for f in frames[:-3]]
    assert all(f.startswith(b"data: ") for f in frames[:-3])
    content, usage = events[:-1], events[-1]
    assert [e["choices"][0]["finish_reason"] for e in content] == [None] * (len(content) - 1) + ["length"]
    assert all(e["object"] == "text_completion" and e["usage"] is None for e in content)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert len({e["id"] for e in events}) == 1


async def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(served):
    body = await raw_post(served.base_url, "/v1/completions",
                          {"model": "sim", "prompt": "hi", "max_tokens": 12, "stream": True,
                           "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    events = [json.loads(f.removeprefix(b"data: ")) for f in body.split(b"\n\n")[:-2] if f.startswith(b"data: ")]
    content, final = events[:-1], events[-1]
    prompt = final["usage"]["prompt_tokens"]
    counts = [e["usage"]["completion_tokens"] for e in content]
    assert all(e["usage"]["prompt_tokens"] == prompt for e in content)
    assert all(e["usage"]["total_tokens"] == prompt + e["usage"]["completion_tokens"] for e in content)
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 12
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 12


async def test_continuous_usage_of_a_batch_counts_every_choice(served):
    stream = await served.sdk.completions.create(
        model="sim", prompt=["a", "b"], max_tokens=5, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = [c async for c in stream]
    assert all(c.usage is not None for c in chunks)
    assert chunks[-2].usage.completion_tokens == 10 and chunks[-1].usage.completion_tokens == 10


async def test_heartbeat_comment_while_no_token_is_ready(serve):
    # ~0.25 s per simulated step: the first token takes a while, heartbeats every 0.05 s fill the gap.
    served = await serve({"sim": sim_engine(time_scale=100.0)}, heartbeat_interval_s=0.05)
    body = await raw_post(served.base_url, "/v1/completions",
                          {"model": "sim", "prompt": "hi", "max_tokens": 1, "stream": True})
    assert body.startswith(b": ping\n\n")
    assert body.rstrip().endswith(b"data: [DONE]")


@pytest.mark.parametrize("handler_cancellation", [False, True])
@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_aborts_and_frees_kv_blocks(serve, stream, handler_cancellation):
    # 500 tokens at ~5 ms per step take 2.5 s; the blocks must come back long before that.
    served = await serve({"sim": sim_engine(time_scale=2.0)}, handler_cancellation=handler_cancellation)
    idle = await served.free_kv_blocks()
    body = {"model": "sim", "prompt": "hello", "max_tokens": 500, "stream": stream}
    if stream:
        resp = await served.http.post(served.base_url + "/v1/completions", json=body)
        await resp.content.readuntil(b"\n\n")           # generation is under way
        assert await served.free_kv_blocks() < idle
        resp.close()                                    # drop the connection mid-stream
    else:
        with pytest.raises(asyncio.TimeoutError):
            await served.http.post(served.base_url + "/v1/completions", json=body,
                                   timeout=aiohttp.ClientTimeout(total=0.2))

    # The request ends when its abort is noticed (a failed write, the watchdog, or handler
    # cancellation); the sim frees an aborted request's blocks in abort() itself.
    assert await served.state.wait_idle(timeout=1.0)
    assert await served.free_kv_blocks() == idle
    assert served.engine.stats().running == 0


async def test_a_client_that_stops_reading_pauses_its_stream_and_gets_everything_merged_once_it_reads(serve):
    # In process (it shrinks this process's transport buffer): tests/daemon/test_writers.py has the writers' own.
    served = await serve({"sim": sim_engine(max_model_len=8192, time_scale=0.2)}, front_processes=0)  # ~0.5 ms/token
    host, port = served.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps({"model": "sim", "prompt": "x", "max_tokens": 3000, "stream": True,
                          "stream_options": {"include_usage": True}}).encode()
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    inflight = served.app[appkeys.INFLIGHT]

    async def until(condition) -> None:
        while not condition():
            await asyncio.sleep(0.005)

    # Loopback's socket buffers hold megabytes; shrink the server side's so a client that does not
    # read fills it within a few frames, as a slow client on a real network does.
    await asyncio.wait_for(until(lambda: any(e.sender is not None for e in inflight.entries)), 5.0)
    (entry,) = inflight.entries
    transport = entry.request.transport
    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    transport.set_write_buffer_limits(high=4096)
    await asyncio.wait_for(until(lambda: entry.sender.blocked), 5.0)      # past the high-water mark: paused
    data = await asyncio.wait_for(reader.read(-1), 20.0)   # reading lets the transport drain: writing resumes
    writer.close()
    await writer.wait_closed()
    body = data.partition(b"\r\n\r\n")[2]
    frames = [f for f in body.split(b"\n\n") if b"data: {" in f]
    usage = json.loads(frames[-1].partition(b"data: ")[2])["usage"]
    assert usage["completion_tokens"] == 3000 and b"data: [DONE]" in body[-40:]
    assert len(frames) - 1 < 3000                             # tokens merged while the client did not read


async def test_server_side_abort_ends_stream_with_an_error_the_sdk_raises(serve):
    served = await serve({"sim": sim_engine(time_scale=1.0)})
    stream = await served.sdk.completions.create(model="sim", prompt="a", max_tokens=400, stream=True)
    with pytest.raises(openai.APIError) as exc:
        async for chunk in stream:
            served.engine.abort(chunk.id)
    assert exc.value.body["code"] == "request_aborted"


async def test_deadline_ends_stream_with_deadline_error_and_non_stream_with_504(serve):
    # 400 tokens at 10 ms each take 4 s; the 1 s deadline leaves a loaded CI machine ample time to
    # start the stream (0.2 s did not: the request was sometimes dropped in the queue with a 504).
    served = await serve({"sim": sim_engine(time_scale=4.0)}, request_timeout_s=1.0)
    stream = await served.sdk.completions.create(model="sim", prompt="a", max_tokens=400, stream=True)
    with pytest.raises(openai.APIError) as exc:
        async for _ in stream:
            pass
    assert exc.value.body["code"] == "deadline_exceeded"
    with pytest.raises(openai.APIStatusError) as exc:
        await served.sdk.completions.create(model="sim", prompt="a", max_tokens=400)
    assert exc.value.status_code == 504


async def test_tokens_faster_than_frames_merge_into_fewer_frames(served):
    whole = await served.sdk.completions.create(model="sim", prompt="m", max_tokens=60, temperature=0)
    stream = await served.sdk.completions.create(model="sim", prompt="m", max_tokens=60, temperature=0, stream=True)
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert len(chunks) < 30                      # the sim at time_scale 0 produces 60 tokens in far less
    assert chunks[-1].choices[0].finish_reason == "length"


class UnencodableOutputEngine(SimEngine):
    """Pushes a delta the SSE writer cannot encode: stands in for a bug in the writing path."""

    def submit(self, request):
        stream = super().submit(request)
        asyncio.get_running_loop().call_soon(stream.push, Delta(token_ids=[7], text=object()))
        return stream


async def test_a_bug_while_streaming_ends_the_stream_with_an_error_frame_not_a_second_response(serve):
    served = await serve({"sim": UnencodableOutputEngine("tiny", time_scale=1.0, max_model_len=512)})
    body = await raw_post(served.base_url, "/v1/completions",
                          {"model": "sim", "prompt": "hi", "max_tokens": 50, "stream": True})
    frames = body.split(b"\n\n")
    assert frames[-2:] == [b"data: [DONE]", b""]
    error = json.loads(frames[-3].removeprefix(b"data: "))["error"]
    assert error["code"] == "internal_error" and error["type"] == "server_error"
    with pytest.raises(openai.APIError) as exc:                  # the SDK raises on it
        async for _ in await served.sdk.completions.create(model="sim", prompt="hi", max_tokens=50, stream=True):
            pass
    assert exc.value.body["code"] == "internal_error"
    text = await served.metrics_text()
    assert metric_value(text, "inferd_requests_total", model="sim", status="500") == 2


async def test_a_client_hanging_up_after_the_final_frames_is_not_counted_as_gone(serve):
    # The SDK closes the connection as soon as it reads the final frames; when the watchdog scans
    # before the handler resumes, it must not turn the request's outcome (here 504) into 499.
    # 400 tokens at 10 ms each take 4 s; the 1 s deadline leaves a loaded CI machine ample time to
    # start the stream (0.2 s did not: the request was sometimes dropped in the queue with a 504).
    served = await serve({"sim": sim_engine(time_scale=4.0)}, request_timeout_s=1.0)
    inflight = served.app[appkeys.INFLIGHT]

    class HangUpAfterFinalFrames(Flusher):
        def _run(self) -> None:
            entries = list(inflight.entries)
            super()._run()
            for entry in entries:
                if entry.closing:
                    entry.request.transport.close()     # written data is still delivered
                    inflight.scan(heartbeat=15.0)

    inflight.flusher = HangUpAfterFinalFrames()
    stream = await served.sdk.completions.create(model="sim", prompt="a", max_tokens=400, stream=True)
    with pytest.raises(openai.APIError) as exc:
        async for _ in stream:
            pass
    assert exc.value.body["code"] == "deadline_exceeded"
    assert await served.state.wait_idle(timeout=1.0)
    text = await served.metrics_text()
    assert metric_value(text, "inferd_requests_total", model="sim", status="504") == 1
    assert metric_value(text, "inferd_requests_total", model="sim", status="499") == 0


def test_an_empty_frame_writes_nothing_not_the_chunked_bodys_end():
    """A tool-call encoder holding text back returns b"": as a chunk it would be `0\\r\\n\\r\\n`, the body's end."""
    written: list[bytes] = []
    transport = SimpleNamespace(is_closing=lambda: False, write=written.append, get_extra_info=lambda _: None,
                                get_write_buffer_size=lambda: 0)
    writer = SimpleNamespace(transport=transport, protocol=SimpleNamespace(writing_paused=False), chunked=True)
    entry = SimpleNamespace(stream=None, accepted=SocketAccepted())
    sender = Sender(entry, writer, encoder=SimpleNamespace(content=None), include_usage=False,
                    obs=SimpleNamespace(on_tokens=None))
    teed: list[bytes] = []
    sender.tee = teed.append
    sender.send(b"")
    sender.send(b"data: x\n\n")
    assert written == [b"9\r\ndata: x\n\n\r\n"] and teed == [b"data: x\n\n"]
