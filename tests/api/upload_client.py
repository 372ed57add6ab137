"""An upload the test paces: a multipart POST /v1/files whose file part is sent in pieces the test
releases (or never does, cancelling it: a client that left mid-upload)."""
from __future__ import annotations

import asyncio

import aiohttp

from tests.api.batch_harness import chat_line, jsonl

BOUNDARY = "inferd-test-boundary"


def big_jsonl(size: int, prefix: str = "r") -> bytes:
    """A valid batch file of at least `size` bytes (lines of about 1.1 KB)."""
    line = len(jsonl(chat_line(f"{prefix}-0", "x" * 1000)))
    return jsonl(*(chat_line(f"{prefix}-{i}", "x" * 1000) for i in range(size // line + 1)))


class PacedUpload:
    """POST `content` in `pieces`; the first is sent at once, each later one when `release()` is called."""

    def __init__(self, url: str, key: str, content: bytes, pieces: int, *, content_length: bool = True) -> None:
        self._content_length = content_length       # False: chunked, the server learns the size as it arrives
        step = -(-len(content) // pieces)
        self._pieces = [content[i:i + step] for i in range(0, len(content), step)]
        self._gate = asyncio.Semaphore(0)
        self._url, self._key = url, key
        self.task: asyncio.Task | None = None

    def start(self, http: aiohttp.ClientSession) -> PacedUpload:
        self.task = asyncio.ensure_future(self._post(http))
        return self

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._gate.release()

    _HEAD = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
             f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n"
             "Content-Type: application/jsonl\r\n\r\n").encode()
    _TAIL = f"\r\n--{BOUNDARY}--\r\n".encode()

    async def _body(self):
        yield self._HEAD
        for i, piece in enumerate(self._pieces):
            if i:
                await self._gate.acquire()
            yield piece
        yield self._TAIL

    async def _post(self, http: aiohttp.ClientSession) -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {self._key}",
                   "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
        if self._content_length:
            headers["Content-Length"] = str(len(self._HEAD) + sum(map(len, self._pieces)) + len(self._TAIL))
        async with http.post(self._url + "/v1/files", data=self._body(), headers=headers) as resp:
            return resp.status, await resp.json()
