"""Admin routes (admin scope) for the model lifecycle under a memory budget (`[server] model_memory_bytes`):

  GET  /admin/models                     every configured version: state (cold, loading, warming, hot,
                                         draining), bytes, pinned, requests in flight; the budget and its use
  POST /admin/models/{name}/load         load `name` (or `name@version`) now, ahead of traffic: 200 once it
                                         is hot, evicting the least recently used idle versions if need be
  POST /admin/models/{name}/unload       unload it now (its requests in flight finish first); 409 when it
                                         is pinned, in a rollout, or not loaded

Without `[server] model_memory_bytes` every version is loaded for good: these answer 404
`lifecycle_off`. Loads and unloads are audited with the caller's key id (inferd.models.memory_budget).
"""
from __future__ import annotations

import time

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.pipeline.cold_start import lifecycle_error
from inferd.api.errors import NOT_FOUND, ApiError
from inferd.api.routes.stored import json_response
from inferd.models import LifecycleError, ModelLifecycle

ACTIONS = ("load", "unload")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/models", list_models)
    app.router.add_post("/admin/models/{name}/{action}", control_model)


def _lifecycle(request: web.Request) -> tuple[ModelLifecycle, str]:
    from inferd.api.admin.rollouts import _actor      # admin scope: 401/403 before anything else

    actor = _actor(request)
    lifecycle = request.app[keys.STATE].lifecycle
    if lifecycle is None:
        raise ApiError(404, "This server has no memory budget ([server] model_memory_bytes): every configured "
                       "version is loaded for good.", type=NOT_FOUND, code="lifecycle_off")
    return lifecycle, actor


async def list_models(request: web.Request) -> web.Response:
    lifecycle, _ = _lifecycle(request)
    return json_response(lifecycle.snapshot())


async def control_model(request: web.Request) -> web.Response:
    lifecycle, actor = _lifecycle(request)
    name, action = request.match_info["name"], request.match_info["action"]
    if action not in ACTIONS:
        raise ApiError(404, f"Unknown action `{action}`; one of: {', '.join(ACTIONS)}.", type=NOT_FOUND,
                       code="unknown_action")
    key = lifecycle.spec_key(name)
    if key is None:
        raise ApiError(404, f"No configured model or version `{name}` on this server.", type=NOT_FOUND,
                       param="name", code="model_not_found")
    state = request.app[keys.STATE]
    try:
        if action == "load":
            await lifecycle.ensure(key, time.monotonic() + state.config.server.request_timeout_s,
                                   reason="admin", actor=actor)
        else:
            await lifecycle.unload(key, actor)
    except LifecycleError as exc:
        raise lifecycle_error(exc) from None
    row = lifecycle.snapshot()["versions"][f"{key[0]}@{key[1]}"]
    return json_response({"model": name, "action": action, **row})
