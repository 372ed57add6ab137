"""Operational routes and the OpenAPI document."""
from __future__ import annotations

import json

import aiohttp
import msgspec
import openai
import pytest

from inferd.api import make_app
from inferd.api.errors import ApiError
from inferd.api.wire.openai import ChatCompletionRequest, CompletionRequest, decode
from inferd.config.tenants import TenantConfig
from tests.api.conftest import metric_value, sim_engine
from tests.api.test_tenancy import node, refresh
from tests.daemon.harness import complete, running, sim_model, write_config


async def get(served, path: str):
    async with served.http.get(served.base_url + path) as resp:
        return resp.status, await resp.read(), resp.headers


async def test_healthz_and_readyz(served):
    assert (await get(served, "/healthz"))[0] == 200
    assert (await get(served, "/readyz"))[0] == 200
    served.state.draining = True
    status, body, headers = await get(served, "/readyz")
    assert status == 503 and b"draining" in body and headers["Retry-After"]
    assert (await get(served, "/healthz"))[0] == 200


async def test_health_answers_as_healthz_for_load_tools_built_for_vllm(served):
    status, body, _ = await get(served, "/health")
    assert status == 200 and (status, body) == (await get(served, "/healthz"))[:2]
    served.state.draining = True                        # liveness, not readiness: a draining node is alive
    assert (await get(served, "/health"))[0] == 200


async def test_readyz_names_an_unhealthy_engine(served):
    await served.engine.close()
    status, body, _ = await get(served, "/readyz")
    assert status == 503 and b"model sim: engine unhealthy" in body


async def test_metrics_expose_kv_blocks_and_request_counts(served):
    await served.sdk.completions.create(model="sim", prompt="a", max_tokens=2)
    status, body, headers = await get(served, "/metrics")
    text = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'inferd_kv_cache_blocks{' in text
    assert 'inferd_requests_total{backend="sim",model="sim",status="200"' in text


async def test_models_list_in_openai_format(served):
    page = await served.sdk.models.list()
    (model,) = page.data
    info = served.engine.info
    assert model.id == "sim" and model.object == "model"
    assert model.model_extra["version"] == f"{info.version}+simulated" and model.model_extra["simulated"] is True


async def test_models_retrieve_answers_the_object_the_list_holds_and_404_for_any_other(served):
    model = await served.sdk.models.retrieve("sim")
    (listed,) = (await served.sdk.models.list()).data
    assert model.id == "sim" and model.model_dump() == listed.model_dump()
    for unknown in ("nope", "sim@nope", "sim:nope"):
        with pytest.raises(openai.NotFoundError) as exc:
            await served.sdk.models.retrieve(unknown)
        assert exc.value.body["code"] == "model_not_found" and unknown in exc.value.body["message"]


async def test_models_retrieve_hides_a_model_the_tenant_may_not_use_as_the_list_does(serve):
    served = await serve(engines={"sim": sim_engine(), "sim2": sim_engine(model_name="sim2")},
                         tenants={"local": TenantConfig(allowed_models=["sim2"])})
    assert (await served.sdk.models.retrieve("sim2")).id == "sim2"
    with pytest.raises(openai.NotFoundError):
        await served.sdk.models.retrieve("sim")


async def test_models_retrieve_needs_the_inference_scope_as_the_list_does(tmp_path):
    async with node(tmp_path) as n:
        inference, metrics_only = n.key("acme"), n.key("ops", "metrics")
        await refresh(n)
        assert (await n.sdk(inference).models.retrieve("sim")).id == "sim"
        with pytest.raises(openai.PermissionDeniedError):
            await n.sdk(metrics_only).models.retrieve("sim")
        with pytest.raises(openai.AuthenticationError):
            await n.sdk("sk-not-ours").models.retrieve("sim")


async def test_openapi_documents_exactly_the_fields_the_decoder_accepts(served):
    status, body, _ = await get(served, "/openapi.json")
    doc = json.loads(body)
    assert status == 200 and doc["openapi"].startswith("3.1")
    schemas = doc["components"]["schemas"]
    for path, kind, struct in (("/v1/completions", "completion", CompletionRequest),
                               ("/v1/chat/completions", "chat", ChatCompletionRequest)):
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = schemas[ref.rsplit("/", 1)[1]]
        fields = msgspec.structs.fields(struct)
        assert set(schema["properties"]) == {f.encode_name for f in fields}
        assert set(schema["required"]) == {f.encode_name for f in fields if f.required}
        for name in schema["properties"]:            # each documented field gets past the decoder...
            assert _unknown_param(kind, {name: None}) is None
        assert _unknown_param(kind, {"undocumented": None}) == "undocumented"   # ...and nothing else does


def _unknown_param(kind: str, extra: dict) -> str | None:
    base = {"model": "m", "prompt": "x"} if kind == "completion" else {"model": "m", "messages": [
        {"role": "user", "content": "x"}]}
    try:
        decode(kind, msgspec.json.encode({**base, **extra}))
    except ApiError as err:
        return err.param if err.code == "unknown_parameter" else None
    return None


async def test_openapi_lists_every_route(served):
    doc = json.loads((await get(served, "/openapi.json"))[1])
    # the console's pages (/admin/ui) are for browsers, not part of the API: docs/console.md documents them
    routes = {r.resource.canonical for r in make_app(served.state).router.routes()
              if not r.resource.canonical.startswith("/admin/ui")}
    assert routes == set(doc["paths"])


async def test_request_series_carry_the_version_that_served_the_request(tmp_path):
    path = write_config(tmp_path / "c.toml", {"m": sim_model(["b"], version="a", time_scale=0.0)})
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        assert (await complete(http, url, "m@b"))[0] == 200
        assert (await complete(http, url, "m"))[0] == 200      # the default, a
        async with http.get(f"{url}/metrics") as resp:
            text = await resp.text()
    for version in ("a", "b"):
        assert metric_value(text, "inferd_requests_total", model="m", version=version, status="200") == 1
        assert metric_value(text, "inferd_generation_tokens_total", model="m", version=version) == 4


async def test_a_metrics_key_reads_its_own_tenants_series_and_the_nodes_and_admin_reads_every_tenants(tmp_path):
    async with node(tmp_path, tenants={"alpha": {}, "beta": {}}) as n:
        alpha, beta = await n.inference_keys("alpha", "beta")
        alpha_metrics, beta_metrics = n.key("alpha", "metrics"), n.key("beta", "metrics")
        admin, stranger = n.key("ops", "metrics", "admin"), n.key("ops", "metrics")
        await refresh(n)
        for key in (alpha, beta, beta):
            await n.sdk(key).completions.create(model="sim", prompt="hi", max_tokens=2)
        seen_by_alpha = await n.metrics(alpha_metrics)
        assert metric_value(seen_by_alpha, "inferd_tenant_requests_total", tenant="alpha", status="200") == 1
        assert 'tenant="beta"' not in seen_by_alpha
        assert "inferd_build_info" in seen_by_alpha and "inferd_kv_cache_blocks{" in seen_by_alpha    # the node's
        seen_by_beta = await n.metrics(beta_metrics)
        assert metric_value(seen_by_beta, "inferd_tenant_requests_total", tenant="beta", status="200") == 2
        assert 'tenant="alpha"' not in seen_by_beta
        assert 'tenant="' not in await n.metrics(stranger)      # an unconfigured tenant's series are pooled
        every = await n.metrics(admin)
        for tenant, count in (("alpha", 1), ("beta", 2)):
            assert metric_value(every, "inferd_tenant_requests_total", tenant=tenant, status="200") == count
