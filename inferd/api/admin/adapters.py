"""POST /admin/adapters (admin scope): load or unload a model's LoRA adapter now; every action is audited.

Body: `{"model": "small", "adapter": "sql", "action": "load" | "unload", "reason"?: "..."}`. A model name
acts on each of its ready versions (so whichever one a request is routed to has it loaded);
`name@version` acts on that version only. The engines are AdapterHosts (inferd.engine.adapters: the
reference engine, the sim and trtllm, whose load checks the adapter and lets requests name it, its weights
entering TensorRT-LLM's cache on the first such request: inferd.engine.trtllm.loras).

The answer is the adapter as the default (or pinned) version's engine lists it after the action (the
fields of engine.AdapterInfo), with `object`, `model`, `action`, `unloaded` (unload: it was loaded) and
`versions` (each version acted on -> its AdapterInfo). Errors: 400 a body field (named), or an engine that
is no AdapterHost (`adapters_unsupported`; every backend here is one); 404 `model_not_found` /
`adapter_not_found`; 409 `adapter_busy` (in use, or every slot in use); 422 `adapter_load_failed` (the message names the file and the tensor);
503 no version ready. Audit records: `adapter.load` / `adapter.unload` (target `model:adapter`, before
and after: `loaded` per version), or `adapter.load_failed` / `adapter.unload_failed` with the error.
"""
from __future__ import annotations

import re

import msgspec
from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.auth import require_scope
from inferd.api.pipeline.body import read_body
from inferd.api.errors import NOT_FOUND, ApiError, invalid, model_not_found, unavailable
from inferd.api.routes.stored import json_response
from inferd.api.wire.admin_requests import AdapterAction
from inferd.api.wire.json_depth import depth_exceeds, too_deep_message
from inferd.api.pipeline.versioned import SIMULATED_SUFFIX
from inferd.engine import (
    AdapterBusy,
    AdapterError,
    AdapterHost,
    AdapterInfo,
    AdapterLoadError,
    EngineUnavailable,
    UnknownAdapter,
)
from inferd.types import ModelVersion

MAX_BODY = 16 * 1024


async def post_adapters(request: web.Request) -> web.Response:
    principal = require_scope(request, "admin")
    actor = principal.key_id or f"tenant:{principal.tenant}"
    body = await _body(request)
    state = request.app[keys.STATE]
    hosts = _hosts(state, body.model)
    target = f"{body.model}:{body.adapter}"
    try:
        before = {str(k): _info(host, body.adapter).loaded for k, host in hosts}   # unknown: 404, nothing done
    except UnknownAdapter as exc:
        raise _api_error(exc) from None
    done: dict[str, AdapterInfo] = {}
    unloaded = False
    try:
        for key, host in hosts:
            if body.action == "load":
                done[str(key)] = await host.load_adapter(body.adapter)
            else:
                unloaded = await host.unload_adapter(body.adapter) or unloaded
                done[str(key)] = _info(host, body.adapter)
    except (AdapterError, EngineUnavailable) as exc:
        _audit(state, actor, f"adapter.{body.action}_failed", target, before,
               {str(k): _loaded(h, body.adapter) for k, h in hosts}, body.reason, str(exc))
        raise _api_error(exc) from None
    _audit(state, actor, f"adapter.{body.action}", target, before,
           {k: info.loaded for k, info in done.items()}, body.reason, None)
    first = next(iter(done.values()))
    answer = {"object": "lora_adapter", "model": body.model, "action": body.action, **msgspec.to_builtins(first),
              "versions": {k: msgspec.to_builtins(info) for k, info in done.items()}}
    if body.action == "unload":
        answer["unloaded"] = unloaded
    return json_response(answer)


async def _body(request: web.Request) -> AdapterAction:
    raw = await read_body(request, MAX_BODY)     # every chunk: content.read(n) would stop at the first
    if depth_exceeds(raw):
        raise invalid(f"body: {too_deep_message('the body')}", param="body", code="invalid_json")
    try:
        body = msgspec.json.decode(raw, type=AdapterAction)
    except msgspec.ValidationError as exc:
        field = re.search(r"`\$\.(\w+)`|field `(\w+)`", str(exc))
        raise invalid(f"body: {exc}", param=(field[1] or field[2]) if field else "body") from None
    except msgspec.DecodeError:
        raise invalid("body: expected a JSON object with `model`, `adapter` and `action`", param="body") from None
    for name in ("model", "adapter"):
        if not getattr(body, name):
            raise invalid(f"{name}: must not be empty", param=name)
    return body


def _hosts(state, model: str) -> list[tuple[ModelVersion, AdapterHost]]:
    """(version, engine) to act on: `model@version`, or each ready version of `model`, default first."""
    table = state.registry.table
    name, pinned, version = model.partition("@")
    if name not in table.models() or (pinned and not version):
        raise model_not_found(model)
    if pinned:
        key = ModelVersion(name, version.removesuffix(SIMULATED_SUFFIX))
        if not table.is_ready(key):
            raise ApiError(404, f"Version `{key}` is not loaded and ready on this server.", type=NOT_FOUND,
                           param="model", code="model_not_found")
        keys_ = [key]
    else:
        default = table.split_for(name)
        first = {a.target for a in default.arms} if default is not None else set()
        keys_ = sorted((k for k in table.versions if k.model == name and table.is_ready(k)),
                       key=lambda k: (k not in first, k))
        if not keys_:
            raise unavailable(f"No version of `{name}` is ready; retry shortly.", code="version_unavailable")
    engines = [(k, table.engine(k)) for k in keys_]
    if not all(isinstance(e, AdapterHost) for _, e in engines):
        raise invalid(f"The model `{model}` does not load adapters on request (its backend is "
                      f"{engines[0][1].info.backend}).", param="model", code="adapters_unsupported")
    return engines


def _info(host: AdapterHost, adapter: str) -> AdapterInfo:
    info = host.adapter(adapter)
    if info is None:
        raise UnknownAdapter(f"no LoRA adapter {adapter!r} is configured", adapter)
    return info


def _loaded(host: AdapterHost, adapter: str) -> bool:
    info = host.adapter(adapter)
    return info is not None and info.loaded


def _api_error(exc: AdapterError | EngineUnavailable) -> ApiError:
    if isinstance(exc, UnknownAdapter):
        return ApiError(404, f"{exc}; GET /v1/models lists each model's adapters.", type=NOT_FOUND,
                        param="adapter", code="adapter_not_found")
    if isinstance(exc, AdapterBusy):
        return ApiError(409, str(exc), param="adapter", code="adapter_busy")
    if isinstance(exc, AdapterLoadError):
        where = ", ".join(f"{k} {v}" for k, v in (("file", exc.file), ("tensor", exc.tensor)) if v)
        return ApiError(422, f"{exc}" + (f" ({where})" if where else ""), param="adapter",
                        code="adapter_load_failed")
    return unavailable(str(exc), code="engine_unavailable")


def _audit(state, actor: str, action: str, target: str, before: dict, after: dict, reason: str | None,
           error: str | None) -> None:
    state.control.audit.append(actor, action, target=target, before=before, after=after,
                               reason=reason, detail={"error": error} if error else None)
