"""Request-side glue for versioned models: route `model` through the registry (past open circuit
breakers), report outcomes to rollouts and breakers, mirror to shadows, and what /v1/models and /readyz
show of the loaded versions.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from inferd.api.errors import NOT_FOUND, UNAVAILABLE, ApiError
from inferd.api.state import ServerState
from inferd.config import served_adapters
from inferd.engine import DEAD_END, AdapterHost, AdapterInfo, Engine
from inferd.models import BreakerOpen, Route, RoutingError, RoutingTable
from inferd.types import Delta, FinishReason, ModelVersion, SamplingParams

SIMULATED_SUFFIX = "+simulated"   # responses echo sim versions as `<version>+simulated`; pins may too


def route_request(state: ServerState, model_field: str, tenant: str, user: str | None, request_id: str,
                  batch: bool = False) -> Route:
    """`model` (alias, name or name@version, each optionally `:adapter`) -> Route, as an ApiError
    when it cannot be routed. An adapter must be one the routed version's engine serves (adapter_infos).
    The request's priority class (`batch`: a batch job's, else its tenant's) picks a split's precision tier."""
    base, colon, adapter = model_field.partition(":")
    if base.endswith(SIMULATED_SUFFIX) and "@" in base:
        model_field = base[: -len(SIMULATED_SUFFIX)] + colon + adapter
    try:
        priority = priority_class(state, tenant, batch)
        route = state.registry.resolve(model_field, tenant, user, request_id=request_id, priority=priority)
    except RoutingError as e:
        headers = {"Retry-After": str(e.retry_after_s)} if e.retry_after_s else None
        kind = UNAVAILABLE if e.status == 503 else NOT_FOUND if e.status == 404 else "invalid_request_error"
        raise ApiError(e.status, e.message, type=kind, param=e.param, code=e.code, headers=headers) from None
    if route.lora is not None and adapter_info(state, route.target.model, state.registry.table.engine(route.target),
                                               route.lora) is None:
        raise ApiError(404, f"The model `{route.target.model}` has no LoRA adapter `{route.lora}`; "
                       "GET /v1/models lists them.", type=NOT_FOUND, param="model", code="model_not_found")
    return route


def priority_class(state: ServerState, tenant: str, batch: bool) -> str:
    """The class a request's precision tier is chosen by: a batch job's lines are batch, else the tenant's."""
    return "batch" if batch else state.tenancy.tenants.get(tenant).priority.value


def check_breaker(state: ServerState, route: Route, tenant: str, user: str | None, request_id: str) -> Route:
    """`route`, or its model's breaker fallback while the routed version's breaker is open; else a
    quick 503 circuit_open with Retry-After until the breaker probes again (inferd.models.breaker).
    A precision tier's request first falls back to its alias's split, as it does while its version is not
    ready: the same model at another price beats another model or a refusal."""
    breakers = state.control.breakers
    try:
        breakers.check(route.target)
        return route
    except BreakerOpen as exc:
        refused = exc
    if route.tier is not None and route.alias is not None and route.lora is None:
        try:
            alt = state.registry.resolve(route.alias, tenant, user, request_id=request_id, tiers=False)
            return check_breaker(state, alt, tenant, user, request_id)
        except (RoutingError, ApiError):
            pass
    fallback = breakers.fallback(route.target.model)
    if fallback is not None and route.lora is None:     # an adapter request is not served without its adapter
        try:
            alt = state.registry.resolve(fallback, tenant, user, request_id=request_id)
            breakers.check(alt.target)
            # still judged against the SLOs of the name the client asked for (Route.alias)
            return msgspec.structs.replace(route, target=alt.target, shadow=None, lora=None, tier=None,
                                           alias=route.alias or route.target.model)
        except (RoutingError, BreakerOpen):
            pass
    raise ApiError(503, f"The model version `{route.target}` is failing and its circuit breaker is open; retry "
                   f"after {math.ceil(refused.retry_after_s)} s.", type=UNAVAILABLE, code="circuit_open",
                   headers={"Retry-After": str(max(1, math.ceil(refused.retry_after_s)))})


def adapter_info(state: ServerState, model: str, engine: Engine | None, name: str) -> AdapterInfo | None:
    """Adapter `name` of a version of `model`, as adapter_infos would list it; None when it serves none
    of that name. One lookup, not the whole list: the request path asks this for every adapter request."""
    if isinstance(engine, AdapterHost):
        return engine.adapter(name)
    return next((a for a in adapter_infos(state, model, engine) if a.name == name), None)


def adapter_infos(state: ServerState, model: str, engine: Engine | None) -> list[AdapterInfo]:
    """The LoRA adapters a version of `model` serves, by name: its engine's own list when it is an
    AdapterHost (reference, sim, trtllm: what it was built with, whatever a reload has changed in the
    config since), else the model's configured `lora_adapters`, shown as not loaded."""
    if isinstance(engine, AdapterHost):
        return engine.adapters()
    cfg = state.config.models.get(model)
    sources = served_adapters(cfg) if cfg is not None else {}
    return [AdapterInfo(name=name, source=source, loaded=False) for name, source in sorted(sources.items())]


def record_outcome(state: ServerState, key: ModelVersion, last: Delta | None, status: int, ttft_s: float | None,
                   *, adapter: str | None = None, judged: bool = True) -> None:
    """Feed a finished live request to the rollouts watching its version and to its circuit breaker.
    Client aborts, deadlines and client errors say nothing about the version and are skipped; so, for
    the breaker, does a request that named a LoRA `adapter` (a bad adapter fails its own requests, not
    the base model's). `judged=False` (a precision tier's request): the breaker only, since a tier's
    class mix (batch prompts, their queueing) would skew a rollout's comparison of the split's arms."""
    control = state.control
    if last is None:
        if status == 503:           # the engine refused it at submit: the version's failure
            if judged:
                control.rollouts.record(key, False, None, None, 0, 0)
            if adapter is None:
                control.breakers.record(key, False, None)
        return
    reason = last.finish_reason
    if reason in (FinishReason.ABORT, FinishReason.DEADLINE) or status in (499, 504) or last.error == DEAD_END:
        return                      # DEAD_END: the client's grammar failed it, not the version
    usage, timing = last.usage, last.timing
    # The breaker's slow_ttft_s is the engine's own time to a first token: admission's queue is overload,
    # which degradation and shedding handle; a breaker opened by it would turn overload into an outage.
    engine_ttft = timing.first_token - timing.submitted if timing is not None and timing.first_token else None
    if adapter is None:
        control.breakers.record(key, reason is not FinishReason.ERROR, engine_ttft)
    prompt = usage.prompt_tokens if usage else 0
    completion = usage.completion_tokens if usage else len(last.token_ids)
    itl = None
    if timing is not None and timing.first_token is not None and timing.finished is not None and completion > 1:
        itl = (timing.finished - timing.first_token) / (completion - 1)
    if judged:
        control.rollouts.record(key, reason is not FinishReason.ERROR, ttft_s, itl, prompt, completion)


def make_room_for_live(state: ServerState, engine: Engine, prompt_len: int, sampling: SamplingParams) -> None:
    state.shadows.make_room(engine, prompt_len, sampling.max_tokens)


def mirror_to_shadow(state: ServerState, route: Route, live_engine: Engine, prompt_ids, sampling: SamplingParams,
                     tenant: str) -> None:
    """Mirror to the route's shadow when it has spare room; its output never reaches the client.
    Token ids are mirrored as they are, so only a shadow with the same vocabulary qualifies."""
    shadows = state.shadows
    if route.shadow is None:
        return
    table = state.registry.table
    if not table.is_ready(route.shadow):
        shadows.recorder.dropped(route.shadow)
        return
    engine = table.engine(route.shadow)
    if engine.tokenizer.vocab_size != live_engine.tokenizer.vocab_size or not _takes_grammar(engine, sampling):
        shadows.recorder.dropped(route.shadow)
        return
    shadows.mirror(route.shadow, engine, prompt_ids, sampling, tenant)


def _takes_grammar(engine: Engine, sampling: SamplingParams) -> bool:
    """Whether the shadow can run the request's grammar without its own 400: the API compiled it with the
    live engine's grammars, not the shadow's. A shadow that compiled it before takes it; one that compiles
    a missed grammar itself, off its step (Engine.compiles_missed_grammars: reference, sim), takes it too;
    TensorRT-LLM refuses a grammar its grammars never compiled, so it is not mirrored there (dropped)."""
    guided = sampling.guided
    if guided is None:
        return True
    if engine.grammars is None:
        return False
    verdict = engine.grammars.verdict(guided)
    return verdict == "" or (verdict is None and engine.compiles_missed_grammars)


def model_rows(state: ServerState, created: int, allows: Callable[[str], bool] = lambda name: True) -> list[dict]:
    """GET /v1/models rows: every alias and model name a request may send, each with its split or
    its loaded versions (pin one as `model@version`). `allows(name)` filters by the tenant's
    allowed_models, as requests are checked (api.admit.check_model_allowed): an alias is listed when
    its own name is allowed, or every model its split can route to is."""
    table = state.registry.table
    rows = []
    for listing in table.list_models():
        if listing.kind == "version":
            continue
        if not allows(listing.id) and not (
                listing.kind == "alias" and listing.split
                and all(allows(a.target.partition("@")[0]) for a in listing.split)):
            continue
        row = {"id": listing.id, "object": "model", "created": created, "owned_by": "inferd",
               "kind": listing.kind, "routable": listing.routable}
        if listing.kind == "alias":
            row["split"] = [{"target": a.target, "weight": a.weight, "ready": a.ready} for a in listing.split]
            if listing.shadow:
                row["shadow"], row["shadow_fraction"] = listing.shadow, listing.shadow_fraction
        else:
            row["versions"] = [_version_row(table, k) for k in sorted(table.versions)
                               if k.model == listing.id and table.state(k) != "retired"]
            default = table.split_for(listing.id)
            engine = None
            if default is not None and len(default.arms) == 1 and default.arms[0].target in table.versions:
                engine = table.engine(default.arms[0].target)
            if engine is not None:
                info = engine.info
                label = f"{info.version}+simulated" if info.simulated else info.version
                row.update(root=f"{listing.id}@{label}", version=label, backend=info.backend,
                           max_model_len=info.max_model_len, simulated=info.simulated, task=info.task)
                if info.precision:
                    row["precision"] = info.precision
                if info.task == "embed":
                    row.update(dimensions=info.dimensions, min_dimensions=info.min_dimensions)
        if listing.kind == "model" and state.lifecycle is not None:   # under a memory budget: cold, loading, hot, ...
            row["residency"] = state.lifecycle.residency_of(listing.id)
        rows.append(row)
        if listing.kind == "model":       # `loaded`: in the default version's engine now (AdapterHost engines)
            rows += [{"id": f"{listing.id}:{a.name}", "object": "model", "created": created, "owned_by": "inferd",
                      "kind": "adapter", "parent": listing.id, "routable": listing.routable,
                      **({"loaded": a.loaded} if isinstance(engine, AdapterHost) else {})}
                     for a in adapter_infos(state, listing.id, engine)]
    return rows


def _version_row(table: RoutingTable, key: ModelVersion) -> dict:
    """One loaded version in a model's row: its precision too, which is what a precision tier routes to."""
    row = {"id": str(key), "version": key.version, "state": table.state(key)}
    precision = table.engine(key).info.precision
    if precision:
        row["precision"] = precision
    return row


def versions_status(state: ServerState) -> dict:
    """What /readyz shows of loaded versions: state per version, and refused versions with why."""
    table = state.registry.table
    out: dict = {"versions": {str(k): e.state if e.engine.healthy else "unhealthy"
                              for k, e in sorted(table.versions.items())}}
    if state.versions.failures:
        out["refused"] = dict(state.versions.failures)
    if breakers := state.control.breakers.open_versions():
        out["breakers"] = breakers          # versions resting (open) or being probed (half_open)
    if state.lifecycle is not None:        # what the memory budget holds
        snap = state.lifecycle.snapshot()
        out["residency"] = {"budget_bytes": snap["budget_bytes"], "used_bytes": snap["used_bytes"],
                            "versions": {k: v["state"] for k, v in snap["versions"].items()}}
    return out
