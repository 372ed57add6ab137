"""POST /v1/embeddings through the real daemon with the official SDK: shapes, unit vectors, base64,
Matryoshka truncation, token-id inputs, the same vector alone or batched, and every refusal naming
its field; embedding and generation models refuse each other's endpoint."""
from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import numpy as np
import openai
import pytest
from openai import AsyncOpenAI

from tests.daemon.harness import running, sim_model, write_config

DIMS = 256                      # the tiny sim profile: 8 heads x 32

SIM_EMBED = """backend = "sim"
task = "embed"
max_batch_size = 8
max_num_tokens = 512
[MODEL.sim]
profile = "tiny"
time_scale = 0.01
max_model_len = 64
[MODEL.batching]
latency_target_ms = 50
"""


@pytest.fixture
async def served(tmp_path):
    path = write_config(tmp_path / "c.toml", {"emb": SIM_EMBED, "chat": sim_model()})
    async with running(path) as (daemon, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            async with aiohttp.ClientSession() as http:
                yield daemon, url, sdk, http


async def post(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict]:
    async with http.post(url + "/v1/embeddings", json=body) as resp:
        return resp.status, await resp.json()


async def test_the_sdk_gets_one_unit_vector_per_input_with_usage(served):
    _, _, sdk, _ = served
    got = await sdk.embeddings.create(model="emb", input=["the first text", "a second, longer text here"])
    assert [d.index for d in got.data] == [0, 1] and got.object == "list"
    vectors = np.array([d.embedding for d in got.data])
    assert vectors.shape == (2, DIMS)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(vectors[0], vectors[1])
    assert got.usage.prompt_tokens > 2 and got.usage.total_tokens == got.usage.prompt_tokens
    assert got.model.startswith("emb@sim-embed-")


async def test_base64_is_the_float_vector_as_little_endian_float32(served):
    _, url, _, http = served
    status, floats = await post(http, url, {"model": "emb", "input": "some text", "encoding_format": "float"})
    status64, b64 = await post(http, url, {"model": "emb", "input": "some text", "encoding_format": "base64"})
    assert status == status64 == 200
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(floats["data"][0]["embedding"], dtype=np.float32))


async def test_dimensions_truncates_and_renormalizes(served):
    _, _, sdk, _ = served
    full = np.array((await sdk.embeddings.create(model="emb", input="matryoshka")).data[0].embedding)
    short = np.array((await sdk.embeddings.create(model="emb", input="matryoshka", dimensions=64)).data[0].embedding)
    assert short.shape == (64,)
    np.testing.assert_allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)


async def test_the_same_input_gives_the_same_vector_alone_or_batched(served):
    _, _, sdk, _ = served
    alone = (await sdk.embeddings.create(model="emb", input="steady")).data[0].embedding
    crowd = await asyncio.gather(*[sdk.embeddings.create(model="emb", input=[f"other {i}", "steady"])
                                   for i in range(6)])
    for got in crowd:
        np.testing.assert_allclose(got.data[1].embedding, alone, atol=1e-6)


async def test_token_id_inputs_are_embedded_as_given(served):
    daemon, _, sdk, _ = served
    ids = daemon.state.engines["emb"].tokenizer.encode("token ids")
    by_text = (await sdk.embeddings.create(model="emb", input="token ids")).data[0].embedding
    one = await sdk.embeddings.create(model="emb", input=ids)
    many = await sdk.embeddings.create(model="emb", input=[ids, ids[:2]])
    np.testing.assert_allclose(one.data[0].embedding, by_text, atol=1e-6)
    assert len(many.data) == 2 and one.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("body, param, code", [
    ({"input": []}, "input", "invalid_value"),
    ({"input": ["fine", ""]}, "input[1]", "invalid_value"),
    ({"input": ["x"] * 2049}, "input", "invalid_value"),
    ({"input": "word " * 400}, "input[0]", "context_length_exceeded"),
    ({"input": [[1, 2], [99999]]}, "input[1]", "invalid_token_id"),
    ({"input": "x", "dimensions": 512}, "dimensions", "invalid_value"),
    ({"input": "x", "dimensions": 8}, "dimensions", "invalid_value"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
    ({"input": "x", "temperature": 0}, "temperature", "unknown_parameter"),
    ({"input": "x", "model": "chat"}, "model", "model_not_embedding"),
])
async def test_bad_requests_are_400s_naming_the_field(served, body, param, code):
    _, url, _, http = served
    status, got = await post(http, url, {"model": "emb", **body})
    assert status == 400, got
    assert (got["error"]["param"], got["error"]["code"]) == (param, code)


async def test_an_embedding_model_refuses_generation_and_the_sdk_raises(served):
    _, _, sdk, _ = served
    with pytest.raises(openai.BadRequestError) as exc:
        await sdk.chat.completions.create(model="emb", messages=[{"role": "user", "content": "hi"}])
    assert exc.value.body["param"] == "model" and exc.value.body["code"] == "model_not_generative"
    with pytest.raises(openai.NotFoundError):
        await sdk.embeddings.create(model="nope", input="x")


async def test_batches_and_usage_are_in_the_metrics(served):
    _, url, sdk, http = served
    await asyncio.gather(*[sdk.embeddings.create(model="emb", input=[f"text {i}"] * 3) for i in range(4)])
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    sizes = [line for line in text.splitlines() if line.startswith("inferd_embedding_batch_size_sum")
             and 'model="emb"' in line]
    assert sizes and float(sizes[0].split()[-1]) == 12.0        # every input was in some batch
    ok = [line for line in text.splitlines() if line.startswith("inferd_requests_total")
          and 'model="emb"' in line and 'status="200"' in line]
    assert ok and float(ok[0].split()[-1]) == 4.0
    assert "inferd_embedding_compute_seconds_count" in text


async def test_the_model_list_says_which_models_embed_and_their_width(served):
    _, url, _, http = served
    async with http.get(url + "/v1/models") as resp:
        rows = {r["id"]: r for r in (await resp.json())["data"]}
    assert (rows["emb"]["task"], rows["emb"]["dimensions"], rows["emb"]["min_dimensions"]) == ("embed", DIMS, 32)
    assert rows["chat"]["task"] == "generate" and "dimensions" not in rows["chat"]


async def test_the_openapi_document_lists_the_endpoint(served):
    _, url, _, http = served
    async with http.get(url + "/openapi.json") as resp:
        spec = json.loads(await resp.text())
    assert "/v1/embeddings" in spec["paths"]


async def test_the_tenants_content_policy_applies_to_inputs(tmp_path):
    policy = '[tenants.local]\npolicy = "strict"\n[policies.strict.input]\nwords = ["forbidden phrase"]\n'
    path = write_config(tmp_path / "c.toml", {"emb": SIM_EMBED}, policy)
    async with running(path) as (_, url), aiohttp.ClientSession() as http:
        status, got = await post(http, url, {"model": "emb", "input": ["fine", "a forbidden phrase here"]})
        ok, _ = await post(http, url, {"model": "emb", "input": ["fine", "also fine"]})
    assert status == 400 and (got["error"]["code"], got["error"]["param"]) == ("content_filter", "input")
    assert "forbidden" not in got["error"]["message"] and ok == 200


BREAKER = (SIM_EMBED.replace("max_batch_size = 8", "max_batch_size = 4").replace("time_scale = 0.01", "time_scale = 1.0")
           + "[MODEL.breaker]\nmin_requests = 5\nwindow_s = 30\ncooldown_s = 30\n")


async def test_admission_refusals_under_overload_do_not_open_the_breaker(tmp_path):
    path = write_config(tmp_path / "c.toml", {"emb": BREAKER}, "[admission]\nmax_queued_requests = 2\n")
    async with running(path) as (_, url), aiohttp.ClientSession() as http:
        flood = await asyncio.gather(*[post(http, url, {"model": "emb", "input": [f"t {i} " * 30 for i in range(8)]})
                                       for _ in range(12)])
        status, got = await post(http, url, {"model": "emb", "input": "afterwards"})
    assert {s for s, _ in flood} == {200, 503}          # some were refused: node_full
    assert status == 200, got                           # ... which says nothing against the version


async def test_clients_sharing_an_x_request_id_do_not_collide(served):
    _, url, _, http = served
    headers = {"X-Request-Id": "trace-123"}

    async def one(i: int) -> int:
        async with http.post(url + "/v1/embeddings", json={"model": "emb", "input": [f"text {i}"] * 3},
                             headers=headers) as resp:
            return resp.status

    assert await asyncio.gather(*[one(i) for i in range(6)]) == [200] * 6


async def test_tenant_limits_apply_per_input_and_to_the_whole_request(tmp_path):
    limits = '[tenants.local]\nmax_prompt_tokens = 20\ntokens_per_minute = 60\n'   # "a few words": 9 tokens
    path = write_config(tmp_path / "c.toml", {"emb": SIM_EMBED}, limits)
    async with running(path) as (_, url), aiohttp.ClientSession() as http:
        long_one = await post(http, url, {"model": "emb", "input": ["short", "word " * 10]})     # 42 tokens
        too_many = await post(http, url, {"model": "emb", "input": ["a few words"] * 7})
        fine = await post(http, url, {"model": "emb", "input": ["a few words"] * 3})
    assert long_one[0] == 400 and long_one[1]["error"]["param"] == "input[1]"
    assert long_one[1]["error"]["code"] == "prompt_too_long"
    assert too_many[0] == 400 and (too_many[1]["error"]["param"], too_many[1]["error"]["code"]) == (
        "input", "request_too_large")
    assert fine[0] == 200
