"""A Batch API input file: JSON lines, each one request, checked line by line; errors name the line.

Each line is `{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions" |
"/v1/embeddings", "body": {...}}`: custom_id a non-empty string unique in the file, body a request that
endpoint accepts (decoded and checked by the same code as a live request, inferd.api.wire.openai and
inferd.api.wire.embedding_format), not streamed. `LineChecker` takes
a file in pieces as it arrives (an upload, a file read chunk by chunk), holding at most one line beyond
the piece; it and `parse_lines` are pure and CPU-bound: callers run them off the event loop, a piece at
a time. `check_models` (on the loop) checks that every
model named routes on this server and that the tenant may use it.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec

from inferd.api.wire import embedding_format
from inferd.api.errors import ApiError, invalid
from inferd.api.wire.json_depth import depth_exceeds, too_deep_message
from inferd.api.wire.openai import decode, prepare
from inferd.api.wire.strict import show_value
from inferd.api.state import ServerState
from inferd.api.pipeline.versioned import route_request
from inferd.store import FileStore

URLS = {"/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/embeddings": "embedding"}
MAX_LINES = 50_000                  # OpenAI's limit per batch
MAX_CUSTOM_ID = 512
_FIELDS = ("custom_id", "method", "url", "body")


class BatchLine(msgspec.Struct, frozen=True, kw_only=True):
    idx: int                        # 0-based; the file's line idx + 1
    custom_id: str
    url: str
    body: bytes                     # the request body, re-encoded
    model: str


class InputError(Exception):
    """The file is not a valid batch input; the message names the line (1-based) and the field."""

    def __init__(self, message: str, line: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.line, self.param = message, line, param

    def __reduce__(self):          # raised in the uploads' worker process, re-raised in the daemon
        return (InputError, (self.message, self.line, self.param))

    def api_error(self) -> ApiError:
        return invalid(self.message, param=self.param or "file", code="invalid_batch_input")


_decoder = msgspec.json.Decoder()


def parse_lines(content: bytes) -> list[BatchLine]:
    """Every line of `content`, checked; InputError naming the first bad line. Blank lines are refused
    (a line's index is its position), except at the end of the file."""
    checker = LineChecker()
    return checker.feed(content) + checker.finish()


async def stored_lines(files: FileStore, tenant: str, file_id: str) -> list[BatchLine] | None:
    """A stored file's lines (None: the tenant has no such file), read and checked a chunk at a time, each
    off the loop: the file's bytes are never held whole, only its lines. InputError as parse_lines."""
    chunks = await files.chunks(tenant, file_id)
    if chunks is None:
        return None
    checker, lines, pause = LineChecker(), [], gil_yielder()
    async for chunk in chunks:
        lines += await asyncio.to_thread(checker.feed, chunk, pause)
    return lines + checker.finish()


def gil_yielder(every_s: float = 0.0005) -> Callable[[], None]:
    """A `pause` for LineChecker.feed in a thread: every `every_s` of work it lets the GIL go, so the event
    loop waits for it that long at most (not the interpreter's 5 ms switch interval)."""
    last = [time.perf_counter()]

    def pause() -> None:
        now = time.perf_counter()
        if now - last[0] >= every_s:
            time.sleep(0)       # releases the GIL: a waiting thread (the loop) takes it
            last[0] = time.perf_counter()
    return pause


class LineChecker:
    """The lines of a file fed in pieces, each checked by `_parse_line` as soon as it is whole, custom_ids
    unique, at most MAX_LINES; a line longer than `max_line_bytes` (None: no bound) is refused before it is
    whole, so what is held is bounded by the piece plus one line."""

    def __init__(self, max_line_bytes: int | None = None) -> None:
        self.max_line_bytes = max_line_bytes
        self.count = 0                  # requests so far
        self._rest = b""                # the unfinished last line
        self._n = 0                     # lines so far, blank ones included
        self._blank: int | None = None  # the first of the blank lines seen since the last request
        self._seen: dict[str, int] = {}

    def feed(self, data: bytes, pause: Callable[[], None] | None = None) -> list[BatchLine]:
        """The requests that `data` completes, checked; `pause()` between lines (a thread yielding the GIL)."""
        parts = (self._rest + data if self._rest else data).split(b"\n")
        self._rest = parts.pop()
        lines = []
        for raw in parts:
            if (line := self._line(raw)) is not None:
                lines.append(line)
            if pause is not None:
                pause()
        if self.max_line_bytes is not None and len(self._rest) > self.max_line_bytes:
            n = self._n + 1
            raise InputError(f"line {n}: longer than {self.max_line_bytes} bytes (a request body is at most "
                             "server.max_body_bytes).", n)
        return lines

    def finish(self) -> list[BatchLine]:
        """The last line (without its newline), checked; InputError when the file had no request."""
        rest, self._rest = self._rest, b""
        last = self._line(rest) if rest else None
        if not self.count:
            raise InputError("The file has no requests: expected one JSON object per line.")
        return [] if last is None else [last]

    def _line(self, raw: bytes) -> BatchLine | None:
        self._n += 1
        n = self._n
        if not raw.strip():             # refused only if a request follows: blank lines may end a file
            self._blank = n if self._blank is None else self._blank
            return None
        if self._blank is not None:
            _parse_line(self._blank, b"")       # raises: the empty line's error
        self.count += 1
        if self.count > MAX_LINES:
            raise InputError(f"The file has more than {MAX_LINES} lines; a batch holds at most {MAX_LINES} "
                             "requests.", n)
        line = _parse_line(n, raw)
        first = self._seen.setdefault(line.custom_id, n)
        if first != n:
            raise InputError(f"line {n}: custom_id {line.custom_id!r} is already used on line {first}; "
                             "each custom_id must be unique in the file.", n, "custom_id")
        return msgspec.structs.replace(line, idx=n - 1) if line.idx != n - 1 else line


def _parse_line(n: int, raw: bytes) -> BatchLine:
    if not raw.strip():
        raise InputError(f"line {n}: empty line; expected one JSON object per line.", n)
    if depth_exceeds(raw):          # before decoding to Any, which recurses once per level
        raise InputError(f"line {n}: {too_deep_message('the line')}", n)
    try:
        obj = _decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"line {n}: not valid JSON ({exc}).", n) from None
    except RecursionError:          # only malformed text can get past depth_exceeds this deep
        raise InputError(f"line {n}: {too_deep_message('the line')}", n) from None
    if not isinstance(obj, dict):
        raise InputError(f"line {n}: expected a JSON object, got {type(obj).__name__}.", n)
    unknown = sorted(set(obj) - set(_FIELDS))
    if unknown:
        raise InputError(f"line {n}: unknown field {unknown[0]!r}; a line has {', '.join(_FIELDS)}.", n, unknown[0])
    for name in _FIELDS:
        if name not in obj:
            raise InputError(f"line {n}: missing required field {name!r}.", n, name)
    custom_id, method, url, body = (obj[name] for name in _FIELDS)
    if not isinstance(custom_id, str) or not custom_id.strip() or len(custom_id) > MAX_CUSTOM_ID:
        raise InputError(f"line {n}: custom_id must be a non-empty string of at most {MAX_CUSTOM_ID} characters.",
                         n, "custom_id")
    if method != "POST":
        raise InputError(f"line {n}: method must be \"POST\", got {show_value(method)}.", n, "method")
    if url not in URLS:
        raise InputError(f"line {n}: url must be one of {', '.join(URLS)}, got {show_value(url)}.", n, "url")
    if not isinstance(body, dict):
        raise InputError(f"line {n}: body must be a JSON object (the request for {url}).", n, "body")
    if body.get("stream"):
        raise InputError(f"line {n}: body.stream: batch requests cannot stream.", n, "body.stream")
    encoded = msgspec.json.encode(body)
    kind = URLS[url]
    try:
        if kind == "embedding":
            embedding_format.inputs(embedding_format.decode(encoded))
        else:
            prepare(kind, decode(kind, encoded))
    except ApiError as err:
        param = f"body.{err.param}" if err.param else "body"
        raise InputError(f"line {n}: {param}: {err.message}", n, param) from None
    return BatchLine(idx=n - 1, custom_id=custom_id, url=url, body=encoded, model=body["model"])


def check_models(state: ServerState, tenant: str, lines: list[BatchLine]) -> None:
    """400 naming the first line whose model this server does not route, or the tenant may not use.
    A model whose version is still loading (503 when routed now) is accepted: it will be by the time."""
    first: dict[str, int] = {}
    for line in lines:
        first.setdefault(line.model, line.idx + 1)
    tenant_cfg = state.tenancy.tenants.get(tenant)
    for model, n in first.items():
        try:
            route = route_request(state, model, tenant, None, f"batch-check-{n}", batch=True)
        except ApiError as err:
            if err.status == 503:
                continue
            raise InputError(f"line {n}: body.model: {err.message}", n, "body.model").api_error() from None
        name = model.partition(":")[0].partition("@")[0]
        if not (tenant_cfg.allows_model(route.target.model) or tenant_cfg.allows_model(name)):
            raise InputError(f"line {n}: body.model: tenant {tenant!r} may not use the model `{model}`.", n,
                             "body.model").api_error()
