"""What the Files and Batches routes share: the caller's tenant, the store, paging parameters, JSON answers."""
from __future__ import annotations

import re

import orjson
from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.auth import authenticate
from inferd.api.errors import NOT_FOUND, ApiError, invalid, unavailable
from inferd.store import Database

_INT = re.compile(r"-?[0-9]{1,12}")


def caller_store(request: web.Request) -> tuple[str, Database]:
    """(tenant, open store) for a Files/Batches request: 401/403 first, then 503 when this server keeps
    no store (an embedder's app, or a daemon before its store opened)."""
    tenant = authenticate(request, "inference").tenant
    db = request.app[keys.STATE].store
    if db is None:
        raise unavailable("Files and batches need the durable store, which this server has not opened.",
                          retry_after_s=5, code="store_unavailable")
    return tenant, db


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def not_found(kind: str, object_id: str, param: str) -> ApiError:
    """The same answer for an unknown id and another tenant's: ids cannot be probed across tenants."""
    return ApiError(404, f"No such {kind}: {object_id!r}.", type=NOT_FOUND, param=param, code=f"{param}_not_found")


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not _INT.fullmatch(text):
        raise invalid(f"{name}: expected an integer from {low} to {high}, got {text[:40]!r}.", param=name)
    value = int(text)
    if not low <= value <= high:
        raise invalid(f"{name}: expected an integer from {low} to {high}, got {value}.", param=name)
    return value


def list_page(data: list[dict], limit: int) -> dict:
    """OpenAI's list envelope over `data`, fetched with limit + 1 rows to tell whether there are more."""
    page = data[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(data) > limit}
