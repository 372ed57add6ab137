"""The front-end benches' load generator: a raw SSE client connection, and the load and TTFT phases that
bench/frontend.py runs in a process of their own (pinned to the client's CPU).

A raw asyncio protocol rather than an HTTP client library: the client gets one core, and a
library's per-chunk parsing would make it, not the server, the bottleneck. It speaks just enough
HTTP/1.1 (keep-alive, chunked responses) and counts SSE frame terminators as bytes arrive. A response that
says `Connection: close` (a server that ends the connection with the stream) is followed by a new
connection for the next request (`reuse`), as an HTTP client library would open one.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import time


DRAIN_BOUND_S = 30.0     # how long the requests running at the window's end may take to finish


class Refused(Exception):
    """A response other than 200 (a refusal: 429, 503, ...), read whole: its status, Retry-After, body."""

    def __init__(self, status: int, retry_after: float | None, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode(errors='replace')}")
        self.status, self.retry_after, self.body = status, retry_after, body

    @property
    def wait_s(self) -> float:
        """How long a client honouring Retry-After waits before trying again (0.5 s without one; 50 ms..2 s)."""
        return min(2.0, max(0.05, self.retry_after or 0.5))


class SseClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future | None = None
        self.frames = 0
        self.first_frame: float | None = None
        self.tail = b""
        self.window = (0.0, 0.0)
        self.closes = False          # the last response said Connection: close
        self.status_line = b""       # the current response's first line, for the error of one cut short
        self._refusal: tuple[bytes, bytes] | None = None     # a non-200 response's head and body so far
        self._head = b""             # the response's header bytes until their end is seen (None after)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def start(self, request: bytes) -> asyncio.Future:
        self.done = asyncio.get_running_loop().create_future()
        self.frames = 0
        self.first_frame = None
        self.tail = b""
        self.closes, self._head = False, b""
        self.status_line = b""
        self._refusal: tuple[bytes, bytes] | None = None
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        joined = self.tail[-1:] + data        # a frame terminator split across reads counts once
        n = joined.count(b"\n\n")
        if n:
            now = time.monotonic()
            if self.first_frame is None and b"data: {" in data:
                self.first_frame = now
            if self.window[0] <= now < self.window[1]:
                self.frames += n
        self._received(data)

    def _received(self, data: bytes) -> None:
        """Keep the tail; the response is complete at the chunked body's terminator (a refusal: at the end
        of its Content-Length body)."""
        if self._refusal is not None:
            self._refusal = (self._refusal[0], self._refusal[1] + data)
            self._check_refusal()
            return
        if self._head is not None:
            self._head += data
            self.status_line = self._head[:self._head.find(b"\r\n")] if b"\r\n" in self._head else self._head[:80]
            end = self._head.find(b"\r\n\r\n")
            if end >= 0:
                head = self._head[:end + 2].lower()
                self.closes = b"\r\nconnection: close\r\n" in head
                body, self._head = self._head[end + 4:], None
                if not head.startswith((b"http/1.1 200", b"http/1.0 200")):
                    self._refusal = (head, body)
                    self._check_refusal()
                    return
        self.tail = (self.tail + data)[-600:]
        if self.tail.endswith(b"\r\n0\r\n\r\n") and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _check_refusal(self) -> None:
        """End the request with Refused once the refusal's body is whole."""
        head, body = self._refusal
        length = re.search(rb"\r\ncontent-length: *(\d+)", head)
        if length and len(body) >= int(length.group(1)) and self.done is not None and not self.done.done():
            retry = re.search(rb"\r\nretry-after: *([0-9.]+)", head)
            self.done.set_exception(Refused(int(head.split(b" ", 2)[1]), float(retry.group(1)) if retry else None,
                                            body))

    def connection_lost(self, exc) -> None:
        if self.done is not None and not self.done.done():
            got = (f"after {self.status_line.decode(errors='replace')!r}, last bytes {self.tail[-300:]!r}"
                   if self.status_line else "before any response")
            self.done.set_exception(ConnectionError(f"server closed the connection {got}"))


async def reuse(proto: SseClient, factory, port: int) -> SseClient:
    """`proto` for the next request, or a new connection (made by `factory`, with proto's window) when the
    last response closed this one."""
    if not proto.closes and not proto.transport.is_closing():
        return proto
    proto.transport.close()
    _, fresh = await asyncio.get_running_loop().create_connection(factory, "127.0.0.1", port)
    fresh.window = proto.window
    return fresh


def http_post(port: int, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


def _completion_tokens(tail: bytes) -> int | None:
    i = tail.rfind(b'"completion_tokens":')
    if i < 0:
        return None
    j = k = i + len(b'"completion_tokens":')
    while tail[k:k + 1].isdigit():
        k += 1
    return int(tail[j:k])


async def load(port: int, concurrency: int, max_tokens: int, warmup: float, seconds: float) -> dict:
    loop = asyncio.get_running_loop()
    request = http_post(port, {"model": "sim", "prompt": "benchmark prompt", "max_tokens": max_tokens,
                              "stream": True, "stream_options": {"include_usage": True}})
    t_start = time.monotonic()
    w0, w1 = t_start + warmup, t_start + warmup + seconds
    totals = {"frames": 0, "tokens": 0.0, "errors": 0, "requests": 0, "first_error": ""}

    async def worker() -> None:
        _, proto = await loop.create_connection(SseClient, "127.0.0.1", port)
        proto.window = (w0, w1)
        try:
            while time.monotonic() < w1:
                proto = await reuse(proto, SseClient, port)
                t0 = time.monotonic()
                try:
                    await proto.start(request)
                except Exception as exc:
                    totals["first_error"] = totals["first_error"] or repr(exc)[:300]
                    raise
                t1 = time.monotonic()
                totals["frames"] += proto.frames
                totals["requests"] += 1
                count = _completion_tokens(proto.tail)
                if count is None:
                    totals["errors"] += 1
                    totals["first_error"] = (totals["first_error"]
                                             or f"a response without its usage, ending {proto.tail[-200:]!r}")
                    continue
                # tokens are spread evenly over the request's lifetime; count the window's share
                overlap = max(0.0, min(t1, w1) - max(t0, w0))
                totals["tokens"] += count * overlap / max(t1 - t0, 1e-9)
        finally:
            proto.transport.close()

    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    await asyncio.sleep(w1 - time.monotonic())
    # No request starts after the window, and those running at its end are read to theirs: each then counts its
    # share inside the window, as those that started before it do. Cut off instead, they counted nothing, and
    # with many streams a request lasts seconds (2,048 x 256 tokens at 100k tokens/s: about 5 s), so a 6 s
    # window lost about 40% of its tokens and frames at 2,048 streams against 5% at 256: --scaling read low.
    await asyncio.wait(workers, timeout=DRAIN_BOUND_S)
    drain_s = time.monotonic() - w1
    for w in workers:          # past the bound: cut off, uncounted
        w.cancel()
    results = await asyncio.gather(*workers, return_exceptions=True)
    totals["errors"] += sum(1 for r in results if isinstance(r, Exception) and not isinstance(r, asyncio.CancelledError))
    return {"frames_per_s": totals["frames"] / seconds, "tokens_per_s": totals["tokens"] / seconds,
            "requests": totals["requests"], "errors": totals["errors"], "first_error": totals["first_error"],
            "drain_s": drain_s}


async def ttft(port: int, seconds: float) -> dict:
    loop = asyncio.get_running_loop()
    request = http_post(port, {"model": "sim", "prompt": "benchmark prompt", "max_tokens": 8, "stream": True})
    _, proto = await loop.create_connection(SseClient, "127.0.0.1", port)
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(samples) < 5000:
        proto = await reuse(proto, SseClient, port)
        t0 = time.monotonic()
        await proto.start(request)
        samples.append(proto.first_frame - t0)
    proto.transport.close()
    samples.sort()
    return {"n": len(samples), "p50_ms": samples[len(samples) // 2] * 1000,
            "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000}


def run_client(args: argparse.Namespace) -> None:
    import uvloop

    cpu0, t0 = time.process_time(), time.monotonic()
    print(json.dumps({"started": t0}), flush=True)      # the window opens --warmup seconds from here
    if args.phase == "load":
        result = uvloop.run(load(args.port, args.concurrency, args.max_tokens, args.warmup, args.seconds))
    else:
        result = uvloop.run(ttft(args.port, args.seconds))
    result["client_cpu_util"] = (time.process_time() - cpu0) / (time.monotonic() - t0)
    print(json.dumps(result), flush=True)
