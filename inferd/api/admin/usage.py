"""GET /admin/usage (admin scope): the usage ledger's totals or rows, with the filters of `inferd usage`.

Query: `tenant`, `model`, `since`, `until` (UTC date, ISO time or unix seconds), `format` (json, csv,
jsonl), and `rows=true` for ledger rows instead of daily totals, paged by `after` (the last `seq`
seen) and `limit` (at most 10,000); `by_version=true` for totals per model version too (each precision
tier's cost apart).
"""
from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.auth import require_scope
from inferd.api.errors import ApiError, invalid
from inferd.api.routes.stored import query_int
from inferd.store import Ledger, UsageArgumentError, rows_text, totals_text, usage_filter

MAX_ROWS = 10_000
MAX_SEQ = 10**12 - 1           # query_int's bound: far past any ledger's row count
CONTENT_TYPES = {"json": "application/json", "csv": "text/csv", "jsonl": "application/x-ndjson"}


async def get_usage(request: web.Request) -> web.Response:
    require_scope(request, "admin")
    ledger: Ledger | None = request.app[keys.STATE].ledger
    if ledger is None:
        raise ApiError(404, "This server keeps no usage ledger (no store is open).", type="not_found_error",
                       code="no_ledger")
    q = request.query
    fmt = q.get("format") or "json"          # an empty parameter is an absent one
    if fmt not in CONTENT_TYPES:
        raise invalid(f"format: expected one of {', '.join(CONTENT_TYPES)}, got {fmt[:20]!r}.", param="format")
    try:
        f = usage_filter(q.get("tenant"), q.get("model"), q.get("since"), q.get("until"))
    except UsageArgumentError as exc:
        raise invalid(f"{exc}.", param=str(exc).split(":", 1)[0]) from None
    rows, by_version = _flag(q, "rows"), _flag(q, "by_version")
    # checked either way
    after, limit = _int(request, "after", 0, 0, MAX_SEQ), _int(request, "limit", 1000, 1, MAX_ROWS)
    if rows:
        text = rows_text(await ledger.rows(f, limit=limit, after=after), fmt)
    else:
        text = totals_text(await ledger.totals(f, by_version=by_version), fmt, by_version=by_version)
    return web.Response(text=text, content_type=CONTENT_TYPES[fmt])


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name) or "false"          # an empty parameter is an absent one
    if value not in ("true", "false"):
        raise invalid(f"{name}: expected true or false, got {value[:20]!r}.", param=name)
    return value == "true"


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter (an empty one is absent), as the Files and Batches routes read theirs."""
    return query_int(request, name, default, low, high) if request.query.get(name) else default
