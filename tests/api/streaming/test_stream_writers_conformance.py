"""Streams handed to SSE writer processes ([server] front_processes) read as they do when written in process."""
from __future__ import annotations

import asyncio
import json

from inferd.api import appkeys as keys
from tests.api.conftest import metric_value, sim_engine

PROMPTS = [f"prompt number {i}" for i in range(24)]


async def stream_texts(sdk, prompts: list[str]) -> list[str]:
    async def one(prompt: str) -> str:
        stream = await sdk.completions.create(model="sim", prompt=prompt, max_tokens=30, temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])
    return list(await asyncio.gather(*(one(p) for p in PROMPTS)))


async def test_many_concurrent_streams_with_writers_match_the_in_process_ones(serve):
    in_process = await serve({"sim": sim_engine()}, front_processes=0)
    expected = await stream_texts(in_process.sdk, PROMPTS)
    written = await serve({"sim": sim_engine()}, front_processes=2)
    assert await stream_texts(written.sdk, PROMPTS) == expected
    assert written.app[keys.WRITERS].handed == len(PROMPTS)


async def test_the_sdk_streams_one_after_another_over_its_pool_with_every_stream_handed_over(serve):
    served = await serve({"sim": sim_engine()}, front_processes=1)
    for i in range(20):
        stream = await served.sdk.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": f"n{i}"}], max_tokens=8, stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert served.app[keys.WRITERS].handed == 20


async def test_an_http_1_0_client_gets_the_whole_stream(serve):
    served = await serve({"sim": sim_engine()}, front_processes=1)
    host, port = served.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps({"model": "sim", "prompt": "x", "max_tokens": 20, "stream": True}).encode()
    writer.write(f"POST /v1/completions HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    raw = await asyncio.wait_for(reader.read(-1), 10.0)       # HTTP/1.0: the body ends when the connection does
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head
    assert b"Transfer-Encoding: chunked" not in head, head      # a 1.0 client cannot read chunks
    assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]


async def test_logprobs_and_n_stay_in_process_and_still_stream_with_writers_on(serve):
    served = await serve({"sim": sim_engine()}, front_processes=1)
    stream = await served.sdk.completions.create(model="sim", prompt="x", max_tokens=6, n=2, logprobs=2,
                                                 stream=True)
    chunks = [c async for c in stream]
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    assert served.app[keys.WRITERS].handed == 0


async def test_a_client_leaving_a_handed_over_stream_aborts_its_engine_request(serve):
    served = await serve({"sim": sim_engine(time_scale=1.0)}, front_processes=1)
    host, port = served.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps({"model": "sim", "prompt": "x", "max_tokens": 500, "ignore_eos": True,
                          "stream": True}).encode()
    writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    await asyncio.wait_for(reader.readuntil(b"data: "), 10.0)     # the stream has begun
    writer.transport.abort()                                        # the client leaves mid-stream
    assert served.app[keys.WRITERS].handed == 1
    assert await served.state.wait_idle(timeout=5.0)
    assert served.engine.stats().running == 0
    # left, not finished: recorded as the client's close (499), not as a complete stream (200)
    metrics = await served.metrics_text()
    assert metric_value(metrics, "inferd_requests_total", status="499") == 1, metrics


async def test_continuous_usage_counts_up_by_the_tokens_each_handed_over_chunk_carries(serve):
    served = await serve({"sim": sim_engine()}, front_processes=1)
    stream = await served.sdk.completions.create(model="sim", prompt="x", max_tokens=25, stream=True,
                                                 stream_options={"include_usage": True,
                                                                 "continuous_usage_stats": True})
    chunks = [c async for c in stream]
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert counts == sorted(counts) and counts[-1] == chunks[-1].usage.completion_tokens
    assert served.app[keys.WRITERS].handed == 1
