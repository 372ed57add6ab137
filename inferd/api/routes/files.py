"""The Files API, as much of it as the Batch API needs (OpenAI's wire shapes; `inference` scope).

  POST   /v1/files                  multipart form: `file` (JSON lines) and `purpose` ("batch"); at most
                                    store.max_file_bytes (413 past it, counted while reading); each line is
                                    checked (inferd.api.routes.batch_input) and a 400 names the first bad one.
                                    Streamed: each chunk is checked (off the loop) and committed as it
                                    arrives, the file row last; a refused or broken upload leaves nothing.
                                    Per tenant: max_concurrent_uploads (429), max_stored_file_bytes (413),
                                    inferd.api.routes.upload_gate
  GET    /v1/files                  the caller's files, newest first: purpose, limit, after, order
  GET    /v1/files/{file_id}        a File object
  GET    /v1/files/{file_id}/content   its bytes (a batch's output: JSON lines), sent chunk by chunk
  DELETE /v1/files/{file_id}

A tenant sees only its own files; another tenant's id is a 404, as an unknown one.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import BodyPartReader, http_exceptions, web

from inferd.api import appkeys as keys
from inferd.api.routes.batch_input import BatchLine, InputError, check_models
from inferd.api.routes.line_worker import LINE_WORKER, LineWorker, RemoteChecker
from inferd.api.errors import ApiError, invalid
from inferd.api.routes.stored import caller_store, json_response, list_page, not_found, query_int
from inferd.config import Config
from inferd.api.routes.upload_gate import UPLOADS, UploadBytes, UploadGate
from inferd.store import CHUNK_BYTES, FileStore, Upload

PURPOSES = ("batch",)               # what may be uploaded; batches write "batch_output"
LIST_PURPOSES = ("batch", "batch_output")
MAX_FILENAME = 255
_READ = 256 * 1024                  # bytes asked of the socket at a time
_LINE_SLACK = 4096                  # a batch line's custom_id, method and url, beyond the body
_FIELD_LIMIT = 1024                 # bytes of a text field (purpose)
T = TypeVar("T")
_MULTIPART_SLACK = 64 * 1024        # part headers and the other fields, beyond the file itself


def add_routes(app: web.Application) -> None:
    app[UPLOADS] = UploadGate()
    app[LINE_WORKER] = worker = LineWorker()
    app.on_cleanup.append(worker.close)
    app.router.add_post("/v1/files", upload_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", get_file)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"The file is larger than the server's limit of {limit} bytes (store.max_file_bytes).",
                    param="file", code="file_too_large")


async def upload_file(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    state = request.app[keys.STATE]
    limit = state.config.store.max_file_bytes
    if not request.content_type.startswith("multipart/form-data"):
        raise ApiError(415, "Content-Type must be multipart/form-data (fields `file` and `purpose`).",
                       code="unsupported_media_type")
    if request.content_length is not None and request.content_length > limit + _MULTIPART_SLACK:
        raise _too_large(limit)
    tenant_cfg = state.tenancy.tenants.get(tenant)
    gate = request.app[UPLOADS]
    with gate.slot(tenant, tenant_cfg.max_concurrent_uploads) as counted:
        counted.cap = tenant_cfg.max_stored_file_bytes
        counted.stored, _ = await FileStore(db).usage(tenant)
        if request.content_length is not None:
            counted.check(max(0, request.content_length - _MULTIPART_SLACK))
        upload = Upload(db, tenant)
        reads_body = getattr(request.protocol, "handler_reads_body", None)     # inferd.daemon.listener's
        if reads_body is not None:
            reads_body()
        checker = RemoteChecker(request.app[LINE_WORKER], state.config.server.max_body_bytes + _LINE_SLACK)
        try:
            record = await _receive(request, _Sink(upload, counted, limit, checker, gate, state.config))
        except BaseException:
            checker.discard()
            await upload.abort()
            raise
    return json_response(record.to_openai())


class _Sink:
    """Where the `file` part goes: counted (size limit, tenant quota), cut into chunks, each checked line
    by line in the uploads' worker process (inferd.api.routes.line_worker) while it is committed to the store."""

    def __init__(self, upload: Upload, counted: UploadBytes, limit: int, checker: RemoteChecker,
                 gate: UploadGate, config: Config) -> None:
        self.upload, self.counted, self.limit, self.gate = upload, counted, limit, gate
        self.rate, self.read_timeout_s = config.store.upload_bytes_per_s, config.server.body_timeout_s
        self.checker = checker
        self.first_of_model: dict[str, BatchLine] = {}      # what check_models needs, not every line
        self.received = False

    async def take(self, part: BodyPartReader) -> None:
        self.received = True
        buf = bytearray()
        while chunk := await self._read(part):
            if self.counted.size + len(chunk) > self.limit:
                raise _too_large(self.limit)
            self.counted.add(len(chunk))
            buf += chunk
            while len(buf) >= CHUNK_BYTES:
                piece = bytes(buf[:CHUNK_BYTES])
                del buf[:CHUNK_BYTES]
                await self._put(piece)
        if buf:
            await self._put(bytes(buf))
        self._lines(await self.checker.finish())

    async def _read(self, part: BodyPartReader) -> bytes:
        return await self.within(part.read_chunk(_READ))

    async def within(self, read: Awaitable[T]) -> T:
        """One read of the form, bounded by the body's timeout: the whole body has none here (the node's
        upload pace may stretch it), so a client that stops sending is cut per read, and its tenant's
        max_concurrent_uploads bounds how many such uploads it holds."""
        try:
            return await asyncio.wait_for(read, self.read_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"No upload bytes arrived for {self.read_timeout_s:g} s (server.body_timeout_s).",
                           param="file", code="request_timeout") from None

    async def _put(self, piece: bytes) -> None:
        # Both run off the loop (the worker process, the store's writer) at once; both end before either
        # error counts, so nothing is still being written when the upload is aborted.
        async with self.gate.lane:
            await self.gate.paced(len(piece), self.rate)
            parsed, written = await asyncio.gather(self.checker.feed(piece), self.upload.write(piece, now=time.time()),
                                                   return_exceptions=True)
        for outcome in (parsed, written):
            if isinstance(outcome, BaseException):
                raise outcome
        self._lines(parsed)

    def _lines(self, lines: list[BatchLine]) -> None:
        for line in lines:
            self.first_of_model.setdefault(line.model, line)


async def _receive(request: web.Request, sink: _Sink):
    state = request.app[keys.STATE]
    try:
        purpose, filename = await _read_form(request, sink)
    except InputError as err:
        raise err.api_error() from None
    if purpose is None:
        raise invalid("Missing required parameter: purpose.", param="purpose", code="missing_required_parameter")
    if not sink.received:
        raise invalid("Missing required parameter: file.", param="file", code="missing_required_parameter")
    check_models(state, sink.upload.tenant, list(sink.first_of_model.values()))
    return await sink.upload.finish(purpose, filename or "upload.jsonl", now=time.time())


async def _read_form(request: web.Request, sink: _Sink) -> tuple[str | None, str | None]:
    try:
        reader = await request.multipart()
    except _MALFORMED:
        raise _malformed() from None
    purpose = filename = None
    try:
        while (part := await sink.within(reader.next())) is not None:
            if not isinstance(part, BodyPartReader):        # a nested multipart/mixed
                raise _malformed()
            name = part.name
            if name == "purpose":
                purpose = _purpose(await sink.within(_read_field(part, _FIELD_LIMIT + 1)))
            elif name == "file":
                if sink.received:
                    raise invalid("Only one `file` per upload.", param="file")
                filename = (part.filename or "")[:MAX_FILENAME]
                await sink.take(part)
            else:
                raise invalid(f"Unrecognized form field supplied: {str(name)[:64]!r}; fields are `file` and "
                              "`purpose`.", param=str(name)[:64], code="unknown_parameter")
    except _MALFORMED:
        raise _malformed() from None
    return purpose, filename


# What aiohttp's multipart reader raises for a body that is not a well-formed form.
_MALFORMED = (ValueError, AssertionError, KeyError, http_exceptions.HttpProcessingError)


def _malformed() -> ApiError:
    # The parser's own text may quote what the client sent, which is never echoed: say what kind of problem.
    return invalid("Malformed multipart/form-data body (its boundary, a part's headers or its framing).",
                   param="file", code="invalid_multipart")


async def _read_field(part: BodyPartReader, limit: int) -> bytes:
    """A text field's first `limit` bytes (the rest is read and dropped)."""
    chunks, size = [], 0
    while chunk := await part.read_chunk(_READ):
        size += len(chunk)
        if size > limit:
            chunks.append(chunk[: len(chunk) - (size - limit)])
            await part.release()
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _purpose(raw: bytes) -> str:
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        text = ""
    if text not in PURPOSES:
        raise invalid(f"purpose: this server accepts uploads for {', '.join(map(repr, PURPOSES))} only, "
                      f"got {text[:64]!r}.", param="purpose", code="invalid_value")
    return text


async def list_files(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    purpose = request.query.get("purpose")
    if purpose is not None and purpose not in LIST_PURPOSES:
        raise invalid(f"purpose: expected one of {', '.join(LIST_PURPOSES)}, got {purpose[:64]!r}.", param="purpose")
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid(f"order: expected asc or desc, got {order[:64]!r}.", param="order")
    limit = query_int(request, "limit", 10_000, 1, 10_000)
    found = await FileStore(db).list(tenant, purpose=purpose, after=request.query.get("after"), limit=limit + 1,
                                     newest_first=order == "desc")
    return json_response(list_page([f.to_openai() for f in found], limit))


async def get_file(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    file_id = request.match_info["file_id"]
    record = await FileStore(db).get(tenant, file_id)
    if record is None:
        raise not_found("file", file_id, "file_id")
    return json_response(record.to_openai())


async def file_content(request: web.Request) -> web.StreamResponse:
    tenant, db = caller_store(request)
    file_id = request.match_info["file_id"]
    files = FileStore(db)
    record = await files.get(tenant, file_id)
    chunks = None if record is None else await files.chunks(tenant, file_id)
    if chunks is None:
        raise not_found("file", file_id, "file_id")
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.content_length = record.bytes
    await resp.prepare(request)
    async for chunk in chunks:          # one chunk held at a time, each sent before the next is read
        await resp.write(chunk)
    await resp.write_eof()
    return resp


async def delete_file(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    file_id = request.match_info["file_id"]
    if not await FileStore(db).delete(tenant, file_id):
        raise not_found("file", file_id, "file_id")
    return json_response({"id": file_id, "object": "file", "deleted": True})
