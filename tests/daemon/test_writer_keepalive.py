"""A stream handed to a writer process keeps its connection: the writer hands the socket back once the stream
is written, and the main process ends the body and reads the client's next request on it."""
from __future__ import annotations

import asyncio
import json
import socket

from tests.daemon.harness import running_daemon, until
from tests.daemon.test_writers import daemon_writers, writers_config

END = b"0\r\n\r\n"


def request(body: dict, extra: str = "") -> bytes:
    payload = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return sock


async def read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """`count` whole chunked responses read off `sock` (each up to its body's end), in order."""
    loop, data, out = asyncio.get_running_loop(), b"", []
    while len(out) < count:
        got = await asyncio.wait_for(loop.sock_recv(sock, 65536), 30)
        assert got, f"the connection closed after {len(out)} responses: {data[-300:]!r}"
        data += got
        while END in data and len(out) < count:
            whole, data = data.split(END, 1)
            out.append(whole + END)
    assert data == b""
    return out


def stream_text(response: bytes, *, closes: bool = False) -> str:
    """The text of a chunked SSE completion, checked to end with [DONE] (and to say whether the connection `closes`)."""
    head, body = response.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200") and (b"Connection: close" in head) is closes
    events, rest = [], body
    while True:
        size, rest = rest.split(b"\r\n", 1)
        if int(size, 16) == 0:
            break
        events.append(rest[:int(size, 16)])
        rest = rest[int(size, 16) + 2:]
    frames = [f for f in b"".join(events).split(b"\n\n") if f.startswith(b"data: ")]     # comments aside
    assert frames[-1] == b"data: [DONE]"
    return "".join(c["text"] for f in frames[:-1] for c in json.loads(f[6:])["choices"])


BODY = {"model": "sim", "prompt": "hello", "max_tokens": 12, "temperature": 0, "stream": True}


async def test_two_streams_in_turn_on_one_connection_are_both_written_by_the_writer(tmp_path):
    async with running_daemon(writers_config(tmp_path, time_scale=0.01)) as (daemon, _, url):
        sock = await connect(url)
        loop = asyncio.get_running_loop()
        texts = []
        for prompt in ("hello", "another prompt"):
            await loop.sock_sendall(sock, request({**BODY, "prompt": prompt}))
            [response] = await read_responses(sock, 1)
            texts.append(stream_text(response))
        sock.close()
        assert daemon_writers(daemon).handed == 2 and daemon_writers(daemon).kept == 0
        assert all(texts) and texts[0] != texts[1]


async def test_a_request_sent_before_the_stream_ended_is_served_after_it_on_the_same_connection(tmp_path):
    async with running_daemon(writers_config(tmp_path, time_scale=0.01)) as (daemon, _, url):
        sock = await connect(url)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, request({**BODY, "max_tokens": 200}))
        async def handed() -> bool:
            return daemon_writers(daemon).handed == 1
        await until(handed, "the first stream to be handed over")
        await loop.sock_sendall(sock, request(BODY))       # pipelined: the writer only peeks at it
        first, second = await read_responses(sock, 2)
        sock.close()
        assert len(stream_text(first)) > len(stream_text(second)) > 0
        assert daemon_writers(daemon).handed == 2


async def test_a_client_that_asks_to_close_has_its_connection_closed_after_the_stream(tmp_path):
    async with running_daemon(writers_config(tmp_path, time_scale=0.01)) as (daemon, _, url):
        sock = await connect(url)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, request(BODY, "Connection: close\r\n"))
        [response] = await read_responses(sock, 1)
        assert stream_text(response, closes=True)
        assert await asyncio.wait_for(loop.sock_recv(sock, 1024), 10) == b""     # closed once the stream ended, as asked
        sock.close()
        assert daemon_writers(daemon).handed == 1
