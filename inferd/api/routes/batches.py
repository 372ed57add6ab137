"""The Batch API's routes (OpenAI's wire shapes; `inference` scope). The batches themselves are run by
inferd.jobs.batch_runner, in the background, through this server's own completion routes.

  POST /v1/batches                   {"input_file_id", "endpoint", "completion_window": "24h", "metadata"?}
  GET  /v1/batches                   the caller's batches, newest first: after, limit (1-100, default 20)
  GET  /v1/batches/{batch_id}
  POST /v1/batches/{batch_id}/cancel a validating or in-progress batch goes `cancelling`, then `cancelled`
                                     with the lines finished so far; a cancelling or cancelled one is
                                     returned as it is; a batch that already ended is a 409

A tenant sees only its own batches; another tenant's id is a 404, as an unknown one.
"""
from __future__ import annotations

import re
import time

import msgspec
from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.pipeline import idempotency
from inferd.api.routes.batch_input import URLS, InputError, stored_lines
from inferd.api.pipeline.body import check_json_content_type, read_body
from inferd.api.errors import ApiError, invalid
from inferd.api.wire.json_depth import depth_exceeds, too_deep_message
from inferd.api.routes.stored import caller_store, json_response, list_page, not_found, query_int
from inferd.store import BatchStore, FileStore

COMPLETION_WINDOWS = {"24h": 24 * 3600.0}
MAX_BODY = 64 * 1024
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
_PATH = re.compile(r"at `\$\.([^`\[]+)")


class CreateBatch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)


async def create_batch(request: web.Request) -> web.Response:
    """POST /v1/batches; with an Idempotency-Key, a retry gets the batch the first created (inferd.api.pipeline.idempotency)."""
    tenant, db = caller_store(request)
    body = await _read_json(request)
    state = request.app[keys.STATE]
    replayed = await idempotency.claim(request, state, tenant, body, time.monotonic() + CREATE_DEADLINE_S)
    if replayed is not None:
        return replayed
    response = None
    try:
        response = await _create(request, tenant, db, body)
        return response
    finally:
        await idempotency.settle(request, state, response)


async def _create(request: web.Request, tenant: str, db, body: bytes) -> web.Response:
    req = _decode(body)
    if req.endpoint not in URLS:
        raise invalid(f"endpoint: this server runs batches for {', '.join(URLS)}, got {req.endpoint[:80]!r}.",
                      param="endpoint", code="invalid_value")
    if req.completion_window not in COMPLETION_WINDOWS:
        raise invalid(f"completion_window: only \"24h\" is supported, got {req.completion_window[:40]!r}.",
                      param="completion_window", code="invalid_value")
    _check_metadata(req.metadata)
    files = FileStore(db)
    record = await files.get(tenant, req.input_file_id)
    if record is None:
        raise not_found("file", req.input_file_id, "input_file_id")
    if record.purpose != "batch":
        raise invalid(f"input_file_id: file {req.input_file_id!r} has purpose {record.purpose!r}; a batch's input "
                      "is uploaded with purpose \"batch\".", param="input_file_id", code="invalid_file_purpose")
    try:
        lines = await stored_lines(files, tenant, req.input_file_id)
    except InputError as err:      # checked at upload; only an upload of an older inferd could fail here
        raise invalid(f"input_file_id: {err.message}", param="input_file_id", code="invalid_batch_input") from None
    if lines is None:       # deleted just now
        raise not_found("file", req.input_file_id, "input_file_id")
    for line in lines:
        if line.url != req.endpoint:
            raise invalid(f"input_file_id: line {line.idx + 1}: url {line.url!r} does not match the batch's "
                          f"endpoint {req.endpoint!r}; every line must use the batch's endpoint.",
                          param="endpoint", code="mismatched_endpoint")
    batch = await BatchStore(db).create(tenant, req.endpoint, req.input_file_id, req.completion_window,
                                        total=len(lines), metadata=req.metadata, now=time.time(),
                                        window_s=COMPLETION_WINDOWS[req.completion_window])
    _wake_runners(request.app[keys.STATE])
    return json_response(batch.to_openai())


async def _read_json(request: web.Request) -> bytes:
    check_json_content_type(request)
    return await read_body(request, MAX_BODY)


CREATE_DEADLINE_S = 30.0       # how long a crashed first attempt holds its Idempotency-Key (plus a margin)


def _decode(body: bytes) -> CreateBatch:
    if not body.strip():
        raise invalid("Request body is empty; expected a JSON object.", code="invalid_json")
    if depth_exceeds(body):
        raise invalid(too_deep_message(), code="invalid_json")
    try:
        return msgspec.json.decode(body, type=CreateBatch)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = _PATH.search(text)
        field = m.group(1) if m else None
        if field is None and (found := re.search(r"field `([^`]+)`", text)):
            field = found.group(1)
        raise invalid(f"Invalid request: {text}", param=field, code="invalid_value") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"Request body is not valid JSON: {exc}", code="invalid_json") from None


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise invalid(f"metadata: at most {MAX_METADATA_KEYS} keys, got {len(metadata)}.", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise invalid(f"metadata: keys are at most {MAX_METADATA_KEY} characters.", param="metadata")
        if len(value) > MAX_METADATA_VALUE:
            raise invalid(f"metadata[{key!r}]: values are at most {MAX_METADATA_VALUE} characters.",
                          param="metadata")


async def list_batches(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    limit = query_int(request, "limit", 20, 1, 100)
    found = await BatchStore(db).list(tenant, after=request.query.get("after"), limit=limit + 1)
    return json_response(list_page([b.to_openai() for b in found], limit))


async def get_batch(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    batch_id = request.match_info["batch_id"]
    batch = await BatchStore(db).get(tenant, batch_id)
    if batch is None:
        raise not_found("batch", batch_id, "batch_id")
    return json_response(batch.to_openai())


async def cancel_batch(request: web.Request) -> web.Response:
    tenant, db = caller_store(request)
    batch_id = request.match_info["batch_id"]
    batch = await BatchStore(db).request_cancel(tenant, batch_id, now=time.time())
    if batch is None:
        raise not_found("batch", batch_id, "batch_id")
    if batch.status not in ("cancelling", "cancelled"):
        raise ApiError(409, f"Batch {batch_id!r} is {batch.status}; only a validating or in-progress batch can be "
                       "cancelled.", param="batch_id", code="batch_not_cancellable")
    _wake_runners(request.app[keys.STATE], cancelled=batch_id)
    return json_response(batch.to_openai())


def _wake_runners(state, *, cancelled: str | None = None) -> None:
    """A batch was created (look now, not at the next poll) or `cancelled` (stop starting its lines)."""
    for runner in list(state.batch_runners):
        runner.wake(cancelled)
