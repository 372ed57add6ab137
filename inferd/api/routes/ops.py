"""Operational routes: /healthz, /readyz, /metrics, /v1/models (and one model), /openapi.json."""
from __future__ import annotations

import orjson
from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.auth import require_scope
from inferd.api.errors import model_not_found
from inferd.api.routes.openapi import openapi_document
from inferd.api.pipeline.versioned import model_rows, versions_status


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    """The process is alive and its event loop answers."""
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 when the daemon should get traffic; 503 naming every reason it should not."""
    state = request.app[keys.STATE]
    if state.ready():
        return _json({"status": "ready", **versions_status(state)})
    reasons = []
    if not state.started:
        reasons.append("engines are still starting")
    if state.draining:
        reasons.append("draining")
    if not state.engines and state.lifecycle is None:
        reasons.append("no models loaded")
    reasons += [f"model {name}: engine unhealthy" for name, e in state.engines.items() if not e.healthy]
    if state.ledger_failing():
        reasons.append(f"usage ledger: {state.ledger.failure}")
    if (failure := state.store_failure()) is not None:
        reasons.append(f"store_unavailable: {failure}")
    resp = _json({"status": "not_ready", "reasons": reasons or ["not ready"], **versions_status(state)}, status=503)
    resp.headers["Retry-After"] = "1"
    return resp


async def metrics(request: web.Request) -> web.Response:
    principal = require_scope(request, "metrics")       # 401/403 with auth on; open with auth = "none"
    state = request.app[keys.STATE]
    # A tenant's key reads its own per-tenant series and the node's; another tenant's only with `admin`.
    # A tenant whose series are pooled under `other` (not configured) reads no tenant's.
    label = state.tenancy.tenants.label(principal.tenant)
    body, content_type = state.metrics.render(every_tenant="admin" in principal.scopes,
                                              tenant=label if label == principal.tenant else None)
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = content_type     # carries version and charset parameters
    return resp


async def list_models(request: web.Request) -> web.Response:
    """OpenAI's list format; `id` is what requests send, the extra fields say what is loaded.
    Only what the caller's tenant may use (its allowed_models) is listed."""
    principal = require_scope(request, "inference")
    state = request.app[keys.STATE]
    created = int(state.started_at)
    tenant = state.tenancy.tenants.get(principal.tenant)
    return _json({"object": "list", "data": model_rows(state, created, tenant.allows_model)})


async def retrieve_model(request: web.Request) -> web.Response:
    """GET /v1/models/{model} (the SDK's models.retrieve): the object GET /v1/models lists for that id; 404
    model_not_found for any other, one the tenant may not use included (the list leaves it out too)."""
    principal = require_scope(request, "inference")
    state = request.app[keys.STATE]
    model = request.match_info["model"]
    tenant = state.tenancy.tenants.get(principal.tenant)
    row = next((r for r in model_rows(state, int(state.started_at), tenant.allows_model) if r["id"] == model), None)
    if row is None:
        raise model_not_found(model)
    return _json(row)


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_document(), content_type="application/json")
