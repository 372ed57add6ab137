"""Admin routes (admin scope) for rollouts and shadow stats. Every change goes to the audit log with
the caller's key id as the actor (inferd.models.rollout writes the record).

  GET  /admin/rollouts                   every rollout's state
  GET  /admin/rollouts/{name}            one rollout's state (phase, step, weights, both windows, reason)
  POST /admin/rollouts/{name}/start      body (optional): {"reason"} for a configured rollout, or
                                         {"stable", "candidate", "steps", "min_dwell_s", "thresholds",
                                          "window_size", "reason"} to define one over alias/model {name}
  POST /admin/rollouts/{name}/pause      {"reason"?}
  POST /admin/rollouts/{name}/resume     {"reason"?}
  POST /admin/rollouts/{name}/promote    {"reason"?}
  POST /admin/rollouts/{name}/rollback   {"reason"?}
  GET  /admin/shadow                     shadow traffic per version: mirrored, dropped, errors, latency, tokens
  POST /admin/adapters                   {"model", "adapter", "action": "load" | "unload", "reason"?}: a LoRA
                                         adapter, now (inferd.api.admin.adapters)
"""
from __future__ import annotations

import msgspec
from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.admin.adapters import post_adapters
from inferd.api.admin.usage import get_usage
from inferd.api.pipeline.body import read_body
from inferd.api.errors import NOT_FOUND, ApiError, invalid
from inferd.api.wire.json_depth import depth_exceeds, too_deep_message
from inferd.api.routes.stored import json_response
from inferd.config import RolloutConfig, rollout_errors
from inferd.models import ControlPlane, Rollout, RolloutError, RolloutNotFound

MAX_ADMIN_BODY = 16 * 1024


class _Reason(msgspec.Struct, forbid_unknown_fields=True):
    reason: str | None = None


class _StartBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: str | None = None
    stable: str | None = None
    candidate: str | None = None
    steps: tuple[float, ...] | None = None
    min_dwell_s: float | None = None
    window_size: int | None = None
    thresholds: dict | None = None


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/rollouts", list_rollouts)
    app.router.add_get("/admin/rollouts/{name}", get_rollout)
    app.router.add_post("/admin/rollouts/{name}/{action}", control_rollout)
    app.router.add_get("/admin/shadow", shadow_stats)
    app.router.add_get("/admin/peers", list_peers)
    app.router.add_get("/admin/usage", get_usage)
    app.router.add_post("/admin/adapters", post_adapters)


def _actor(request: web.Request) -> str:
    from inferd.api.auth import require_scope  # 401/403 envelopes, admin scope

    principal = require_scope(request, "admin")
    return principal.key_id or f"tenant:{principal.tenant}"


def _control(request: web.Request) -> ControlPlane:
    return request.app[keys.STATE].control



def _status_body(rollout: Rollout) -> dict:
    return msgspec.to_builtins(rollout.state())


async def _body(request: web.Request, cls: type):
    raw = await read_body(request, MAX_ADMIN_BODY)     # every chunk: content.read(n) would stop at the first
    if not raw.strip():
        return cls()
    if depth_exceeds(raw):
        raise invalid(f"body: {too_deep_message('the body')}", param="body", code="invalid_json")
    try:
        return msgspec.json.decode(raw, type=cls)
    except msgspec.ValidationError as exc:
        raise invalid(f"body: {exc}", param="body") from None
    except msgspec.DecodeError:
        raise invalid("body: not valid JSON", param="body") from None


def _rollout_error(exc: RolloutError) -> ApiError:
    if isinstance(exc, RolloutNotFound):
        return ApiError(404, str(exc), type=NOT_FOUND, code="rollout_not_found")
    return ApiError(409, str(exc), type="invalid_request_error", code="rollout_conflict")


async def list_rollouts(request: web.Request) -> web.Response:
    _actor(request)
    control = _control(request)
    return json_response({"object": "list", "data": [msgspec.to_builtins(s) for s in control.rollouts.states()]})


async def get_rollout(request: web.Request) -> web.Response:
    _actor(request)
    control = _control(request)
    try:
        return json_response(_status_body(control.rollouts.get(request.match_info["name"])))
    except RolloutError as exc:
        raise _rollout_error(exc) from None


async def shadow_stats(request: web.Request) -> web.Response:
    _actor(request)
    return json_response(_control(request).shadows.summary())


async def control_rollout(request: web.Request) -> web.Response:
    actor = _actor(request)
    control = _control(request)
    name, action = request.match_info["name"], request.match_info["action"]
    try:
        if action == "start":
            body = await _body(request, _StartBody)
            rollout = _define(control, name, body) if body.stable or body.candidate else control.rollouts.get(name)
            rollout.start(actor, body.reason)
        elif action in ("pause", "resume", "promote", "rollback"):
            body = await _body(request, _Reason)
            rollout = control.rollouts.get(name)
            if action == "rollback":
                rollout.rollback(actor, body.reason or "rolled back by an operator")
            else:
                getattr(rollout, action)(actor, body.reason)
        else:
            raise ApiError(404, f"unknown rollout action {action!r} (start, pause, resume, promote, rollback)",
                           type=NOT_FOUND, code="unknown_action")
    except RolloutError as exc:
        raise _rollout_error(exc) from None
    return json_response(_status_body(rollout))


def _define(control: ControlPlane, name: str, body: _StartBody) -> Rollout:
    """A rollout given in the request body (not in the config) over alias or model `name`."""
    if not body.stable or not body.candidate:
        raise invalid("body: a new rollout needs both `stable` and `candidate`", param="stable")
    fields = {k: v for k, v in msgspec.structs.asdict(body).items() if k != "reason" and v is not None}
    try:
        cfg = msgspec.convert(fields, RolloutConfig)
    except msgspec.ValidationError as exc:
        raise invalid(f"body: {exc}", param="body") from None
    table = control.registry.table
    defaults = dict(table.defaults)
    errors = rollout_errors(name, cfg, defaults, list(table.aliases), path="rollout")
    if errors:
        raise invalid("; ".join(errors), param="body")
    rollout = Rollout.from_config(name, cfg, control.registry, defaults=defaults, prices=control.config.prices,
                                  audit=control.audit)
    control.rollouts.add(rollout)
    return rollout


async def list_peers(request: web.Request) -> web.Response:
    """GET /admin/peers: this node and every member it knows, with their state and load hints."""
    _actor(request)
    cluster = request.app[keys.STATE].cluster
    if cluster is None:
        raise ApiError(404, "This node is not in a cluster (no [cluster] table in its config).",
                       type="not_found_error", code="not_clustered")
    return json_response(cluster.peers_view())
