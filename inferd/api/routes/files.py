"""The Files API, as much of it as the Batch API needs (OpenAI's wire shapes; `inference` scope).

  POST   /v1/files                  multipart form: `file` (JSON lines) and `purpose` ("batch"); at most
                                    store.max_file_bytes (413 past it, counted while reading); each line is
                                    checked (inferd.api.routes.batch_input) and a 400 names the first bad one
  GET    /v1/files                  the caller's files, newest first: purpose, limit, after, order
  GET    /v1/files/{file_id}        a File object
  GET    /v1/files/{file_id}/content   its bytes (a batch's output: JSON lines)
  DELETE /v1/files/{file_id}

A tenant sees only its own files; another tenant's id is a 404, as an unknown one.
"""
from __future__ import annotations

import asyncio
import time

from aiohttp import BodyPartReader, http_exceptions, web

from inferd.api import appkeys as keys
from inferd.api.routes.batch_input import InputError, check_models, parse_lines
from inferd.api.errors import ApiError, invalid
from inferd.api.routes.stored import caller_store, json_response, list_page, not_found, query_int
from inferd.store import FileStore

PURPOSES = ("batch",)               # what may be uploaded; batches write "batch_output"
LIST_PURPOSES = ("batch", "batch_output")
MAX_FILENAME = 255
_CHUNK = 256 * 1024
_FIELD_LIMIT = 1024                 # bytes of a text field (purpose)
_MULTIPART_SLACK = 64 * 1024        # part headers and the other fields, beyond the file itself


def add_routes(app: web.Application) -> None:
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
    purpose, filename, content = await _read_form(request, limit)
    if purpose is None:
        raise invalid("Missing required parameter: purpose.", param="purpose", code="missing_required_parameter")
    if content is None:
        raise invalid("Missing required parameter: file.", param="file", code="missing_required_parameter")
    try:
        lines = await asyncio.to_thread(parse_lines, content)       # CPU-bound: off the loop
    except InputError as err:
        raise err.api_error() from None
    check_models(state, tenant, lines)
    record = await FileStore(db).create(tenant, purpose, filename or "upload.jsonl", content, now=time.time())
    return json_response(record.to_openai())


async def _read_form(request: web.Request, limit: int) -> tuple[str | None, str | None, bytes | None]:
    try:
        reader = await request.multipart()
    except _MALFORMED:
        raise _malformed() from None
    purpose = filename = content = None
    try:
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):        # a nested multipart/mixed
                raise _malformed()
            name = part.name
            if name == "purpose":
                purpose = _purpose(await _read_part(part, _FIELD_LIMIT + 1, None))
            elif name == "file":
                if content is not None:
                    raise invalid("Only one `file` per upload.", param="file")
                filename = (part.filename or "")[:MAX_FILENAME]
                content = await _read_part(part, limit, _too_large(limit))
            else:
                raise invalid(f"Unrecognized form field supplied: {str(name)[:64]!r}; fields are `file` and "
                              "`purpose`.", param=str(name)[:64], code="unknown_parameter")
    except _MALFORMED:
        raise _malformed() from None
    return purpose, filename, content


# What aiohttp's multipart reader raises for a body that is not a well-formed form.
_MALFORMED = (ValueError, AssertionError, KeyError, http_exceptions.HttpProcessingError)


def _malformed() -> ApiError:
    # The parser's own text may quote what the client sent, which is never echoed: say what kind of problem.
    return invalid("Malformed multipart/form-data body (its boundary, a part's headers or its framing).",
                   param="file", code="invalid_multipart")


async def _read_part(part: BodyPartReader, limit: int, too_large: ApiError | None) -> bytes:
    """A part's bytes, counted while reading: past `limit`, raise `too_large` (or keep the first `limit`)."""
    chunks, size = [], 0
    while chunk := await part.read_chunk(_CHUNK):
        size += len(chunk)
        if size > limit:
            if too_large is not None:
                raise too_large
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


async def file_content(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    file_id = request.match_info["file_id"]
    content = await FileStore(db).content(tenant, file_id)
    if content is None:
        raise not_found("file", file_id, "file_id")
    return web.Response(body=content, content_type="application/octet-stream")


async def delete_file(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    file_id = request.match_info["file_id"]
    if not await FileStore(db).delete(tenant, file_id):
        raise not_found("file", file_id, "file_id")
    return json_response({"id": file_id, "object": "file", "deleted": True})
