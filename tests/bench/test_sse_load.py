"""bench/sse_load.py's client: it counts a response's frames, and opens a new connection for the next request
when a response says `Connection: close` (a server that ends each stream's connection), reusing it otherwise."""
from __future__ import annotations

import asyncio

from aiohttp import web

from tests.bench.scripts import load_script


def load_bench():
    return load_script("sse_load")


async def serve(closes: bool):
    connections: set[tuple] = set()      # client addresses: one per connection

    async def stream(request: web.Request) -> web.StreamResponse:
        connections.add(request.transport.get_extra_info("peername"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if closes:
            response.force_close()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for text in ("a", "b"):
            await response.write(f'data: {{"text": "{text}"}}\n\n'.encode())
        await response.write(b'data: {"usage": {"completion_tokens":2}}\n\ndata: [DONE]\n\n')
        await response.write_eof()
        return response

    runner, port = await serving(stream)
    return runner, port, connections


async def serving(handler) -> tuple[web.AppRunner, int]:
    """A server whose POST /v1/completions is `handler`, on a free loopback port."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


async def requests_over(closes: bool) -> tuple[list[int], int]:
    sse = load_bench()
    runner, port, connections = await serve(closes)
    try:
        _, proto = await asyncio.get_running_loop().create_connection(sse.SseClient, "127.0.0.1", port)
        proto.window = (0.0, float("inf"))
        frames = []
        for _ in range(3):
            proto = await sse.reuse(proto, sse.SseClient, port)
            await asyncio.wait_for(proto.start(sse.http_post(port, {"stream": True})), 10)
            frames.append(proto.frames)
        proto.transport.close()
        return frames, len(connections)
    finally:
        await runner.cleanup()


async def test_a_keep_alive_server_serves_every_request_on_one_connection():
    frames, connections = await requests_over(closes=False)
    assert frames == [4, 4, 4] and connections == 1


async def test_a_response_that_closes_its_connection_is_followed_by_a_new_one():
    frames, connections = await requests_over(closes=True)
    assert frames == [4, 4, 4] and connections == 3


async def test_a_request_running_at_the_windows_end_counts_its_share_inside_the_window():
    # One stream whose response outlasts the window: read to its end, it counts the part of its tokens that
    # falls inside the window (they are taken as spread evenly over its life); cut off, it counted none.
    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'data: {"text": "a"}\n\n')
        await asyncio.sleep(0.6)                # twice the window: it ends after it
        await response.write(b'data: {"usage": {"completion_tokens":10}}\n\ndata: [DONE]\n\n')
        await response.write_eof()
        return response

    runner, port = await serving(slow)
    try:
        result = await load_bench().load(port, concurrency=1, max_tokens=10, warmup=0.0, seconds=0.3)
    finally:
        await runner.cleanup()
    assert result["requests"] == 1 and result["errors"] == 0 and result["drain_s"] > 0
    assert 0 < result["tokens_per_s"] * 0.3 < 10 and result["frames_per_s"] > 0
