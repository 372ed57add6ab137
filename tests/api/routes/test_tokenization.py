"""vLLM's tokenizer routes through the real app: POST /tokenize, POST /detokenize, GET /tokenizer_info.

The ids agree with what the completions and chat routes count as the prompt; the calls are the ones
lm-evaluation-harness's remote tokenizer makes (lm_eval/utils.py RemoteTokenizer and
check_remote_tokenizer_support: /tokenizer_info with no model and an `eos_token` key, then /tokenize with
`{"prompt", "add_special_tokens": false}` and /detokenize with `{"tokens"}`, neither naming a model).
Each is an inference request for the tenant: its scope, its model permissions, one request of its RPM.
"""
from __future__ import annotations

import json
from urllib.parse import quote

import aiohttp
import jsonschema_rs  # installed with schemathesis (the test extra); validates OpenAPI 3.1 schemas
import pytest

from inferd.api.pipeline import prompt_tokens
from inferd.api.pipeline.prompt_tokens import OFF_LOOP_BYTES, TokenizerPool
from inferd.config.tenants import TenantConfig
from inferd.engine.reference.engine import ReferenceEngine
from tests.api.conftest import Served, sim_engine
from tests.api.test_embeddings import SIM_EMBED
from tests.api.test_tenancy import node, refresh
from tests.daemon.harness import running, sim_model, write_config

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


async def call(http: aiohttp.ClientSession, url: str, path: str, body: dict | None = None,
               **headers: str) -> tuple[int, dict, dict]:
    method = http.get if body is None else http.post
    async with method(url + path, **({} if body is None else {"json": body}), headers=headers) as resp:
        return resp.status, await resp.json(), resp.headers


async def post(served: Served, path: str, body: dict | None = None, **headers: str) -> tuple[int, dict, dict]:
    return await call(served.http, served.base_url, path, body, **headers)


# -- what the routes answer --------------------------------------------------------------------------------


async def test_tokenize_a_prompt_gives_the_ids_a_completion_counts_as_its_prompt(served):
    tok = served.engine.tokenizer
    status, body, _ = await post(served, "/tokenize", {"model": "sim", "prompt": "Hello tokenizer world"})
    assert status == 200
    assert body == {"count": len(body["tokens"]), "max_model_len": 512, "tokens": tok.encode("Hello tokenizer world"),
                    "token_strs": None}
    assert body["tokens"][0] == tok.bos_token_id          # a prompt gets the special tokens by default, as vLLM
    done = await served.sdk.completions.create(model="sim", prompt="Hello tokenizer world", max_tokens=1)
    assert done.usage.prompt_tokens == body["count"]
    status, plain, _ = await post(served, "/tokenize", {"model": "sim", "prompt": "Hello tokenizer world",
                                                        "add_special_tokens": False})
    assert plain["tokens"] == body["tokens"][1:]


async def test_tokenize_messages_renders_the_chat_template_with_the_generation_prompt(served):
    tok = served.engine.tokenizer
    status, body, _ = await post(served, "/tokenize", {"model": "sim", "messages": CHAT})
    assert status == 200
    assert body["tokens"] == tok.encode(tok.apply_chat_template(CHAT, add_generation_prompt=True),
                                        add_special_tokens=False)     # the template wrote the special tokens
    done = await served.sdk.chat.completions.create(model="sim", messages=CHAT, max_completion_tokens=1)
    assert done.usage.prompt_tokens == body["count"]
    _, bare, _ = await post(served, "/tokenize", {"model": "sim", "messages": CHAT, "add_generation_prompt": False})
    assert bare["tokens"] == tok.encode(tok.apply_chat_template(CHAT, add_generation_prompt=False),
                                        add_special_tokens=False) and bare["count"] < body["count"]
    # content parts and the developer role, as the chat route takes them
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, CHAT[1]]
    assert (await post(served, "/tokenize", {"model": "sim", "messages": parts}))[1]["tokens"] == body["tokens"]


async def test_detokenize_round_trips_the_ids_with_their_special_tokens(served):
    _, ids, _ = await post(served, "/tokenize", {"model": "sim", "prompt": "round trip, héllo"})
    status, body, _ = await post(served, "/detokenize", {"model": "sim", "tokens": ids["tokens"]})
    assert status == 200 and body == {"prompt": "<|begin_of_text|>round trip, héllo"}
    assert (await post(served, "/detokenize", {"tokens": []}))[1] == {"prompt": ""}


async def test_return_token_strs_gives_one_string_per_token(served):
    _, body, _ = await post(served, "/tokenize", {"model": "sim", "prompt": "two words", "return_token_strs": True})
    assert len(body["token_strs"]) == body["count"] and "".join(body["token_strs"]) == "<|begin_of_text|>two words"


async def test_tokenizer_info_has_what_lm_eval_reads_and_its_eos_token_tokenizes_to_the_eos_id(served):
    tok = served.engine.tokenizer
    status, info, _ = await post(served, "/tokenizer_info")
    assert status == 200
    assert info["tokenizer_class"] == "SimTokenizer" and info["model"] == "sim"
    assert info["model_max_length"] == 512 and info["vocab_size"] == tok.vocab_size
    assert info["eos_token"] == "<|end_of_text|>" and info["bos_token"] == "<|begin_of_text|>"
    # lm-eval: eos_token_id = encode(eos_token)[0], through /tokenize without special tokens
    _, eos, _ = await post(served, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
    assert eos["tokens"] == [tok.eos_token_ids[0]]


async def test_the_calls_lm_eval_remote_tokenizer_makes_all_succeed_without_naming_a_model(served):
    base = served.base_url
    status, info, _ = await call(served.http, base, "/tokenizer_info")
    assert status == 200 and "eos_token" in info                     # check_remote_tokenizer_support
    status, probe, _ = await call(served.http, base, "/tokenize", {"prompt": "test", "add_special_tokens": False})
    assert status == 200 and isinstance(probe["tokens"], list)
    context, continuation = "The answer is", " forty two"
    _, whole, _ = await call(served.http, base, "/tokenize", {"prompt": context + continuation,
                                                              "add_special_tokens": False})
    _, text, _ = await call(served.http, base, "/detokenize", {"tokens": whole["tokens"]})
    assert text["prompt"] == context + continuation


async def test_a_long_input_is_tokenized_in_the_pool_and_a_short_one_inline(served, monkeypatch):
    pool = TokenizerPool(1)
    submitted: list = []
    submit = pool.submit
    monkeypatch.setattr(pool, "submit", lambda work: submitted.append(work) or submit(work))
    monkeypatch.setattr(prompt_tokens, "POOL", pool)
    try:
        assert (await post(served, "/tokenize", {"model": "sim", "prompt": "short"}))[0] == 200
        assert submitted == []
        long = "word " * (OFF_LOOP_BYTES // 4)
        status, body, _ = await post(served, "/tokenize", {"model": "sim", "prompt": long})
        assert status == 200 and body["tokens"] == served.engine.tokenizer.encode(long) and len(submitted) == 1
        status, _, _ = await post(served, "/detokenize", {"model": "sim", "tokens": body["tokens"]})
        assert status == 200 and len(submitted) == 2
    finally:
        pool.shutdown()


async def test_a_hugging_face_tokenizer_answers_with_its_vocabulary_entries_and_chat_template(serve, tiny_artifact):
    engine = ReferenceEngine(tiny_artifact, num_kv_blocks=64, block_size=16, max_batch_size=4, max_num_tokens=64)
    served = await serve({"tiny": engine})
    tok = engine.tokenizer
    status, info, _ = await post(served, "/tokenizer_info")
    assert status == 200 and info["tokenizer_class"] == "HFTokenizer" and info["model"] == "tiny"
    assert info["chat_template"] == tok.chat_template and info["eos_token"] == tok.eos_token
    _, body, _ = await post(served, "/tokenize", {"prompt": "hello there", "return_token_strs": True})
    assert body["tokens"] == tok.encode("hello there")
    assert body["token_strs"] == [tok.id_to_token(i) for i in body["tokens"]]
    _, chat, _ = await post(served, "/tokenize", {"messages": CHAT})
    done = await served.sdk.chat.completions.create(model="tiny", messages=CHAT, max_completion_tokens=1)
    assert chat["count"] == done.usage.prompt_tokens
    _, text, _ = await post(served, "/detokenize", {"tokens": chat["tokens"]})
    assert text["prompt"] == tok.decode(chat["tokens"], skip_special_tokens=False)


# -- models: routing, defaults, permissions ---------------------------------------------------------------------


async def test_model_names_route_as_on_completions_and_the_default_is_the_first_generative_model(tmp_path):
    shorter = sim_model().replace("max_model_len = 2048", "max_model_len = 1024")
    path = write_config(tmp_path / "c.toml", {"aemb": SIM_EMBED, "b": sim_model(), "c": shorter},
                        '[aliases.fast]\nsplit = { "c" = 1 }\n')
    async with running(path) as (_, url), aiohttp.ClientSession() as http:
        info = (await call(http, url, "/tokenizer_info"))[1]
        assert (info["model"], info["model_max_length"]) == ("b", 2048)   # aemb is an embedding model
        rows = (await call(http, url, "/v1/models"))[1]["data"]
        pinned = next(r["root"] for r in rows if r["id"] == "c")           # c@<version>+simulated
        for name in ("c", "fast", pinned):
            # quoted: a `+` in a query string is a space
            status, body, _ = await call(http, url, f"/tokenizer_info?model={quote(name)}")
            assert (status, body["model"], body["model_max_length"]) == (200, "c", 1024), name
            status, body, _ = await call(http, url, "/tokenize", {"model": name, "prompt": "x"})
            assert (status, body["max_model_len"]) == (200, 1024), name
        assert (await call(http, url, "/tokenize", {"prompt": "x"}))[1]["max_model_len"] == 2048
        status, body, _ = await call(http, url, "/tokenize", {"model": "aemb", "prompt": "x"})   # named: any model
        assert (status, body["max_model_len"]) == (200, 64)


async def test_an_unknown_model_is_a_404_on_every_route(served):
    for path, body in (("/tokenize", {"model": "nope", "prompt": "x"}),
                       ("/detokenize", {"model": "nope", "tokens": [1]}), ("/tokenizer_info?model=nope", None)):
        status, answer, _ = await post(served, path, body)
        assert status == 404 and answer["error"]["code"] == "model_not_found", path


async def test_a_model_the_tenant_may_not_use_is_a_403_and_the_default_skips_it(serve):
    served = await serve(engines={"sim": sim_engine(), "sim2": sim_engine(model_name="sim2")},
                         tenants={"local": TenantConfig(allowed_models=["sim2"])})
    status, answer, _ = await post(served, "/tokenize", {"model": "sim", "prompt": "x"})
    assert (status, answer["error"]["code"], answer["error"]["param"]) == (403, "model_not_allowed", "model")
    assert (await post(served, "/tokenizer_info"))[1]["model"] == "sim2"


async def test_each_call_is_one_request_of_the_tenants_rpm_and_holds_no_slot_after(serve):
    served = await serve(tenants={"local": TenantConfig(requests_per_minute=3)})
    _, _, headers = await post(served, "/tokenize", {"model": "sim", "prompt": "x"})
    assert headers["X-RateLimit-Remaining-Requests"] == "2"
    _, _, headers = await post(served, "/tokenizer_info")
    assert headers["X-RateLimit-Remaining-Requests"] == "1"
    assert (await post(served, "/detokenize", {"tokens": [5]}))[0] == 200
    status, answer, headers = await post(served, "/tokenize", {"model": "sim", "prompt": "x"})
    assert (status, answer["error"]["code"]) == (429, "quota_rpm") and int(headers["Retry-After"]) > 0
    snapshot = served.state.tenancy.quota.snapshot()["local"]
    assert snapshot["in_flight"] == 0 and snapshot["admitted"] == 3


async def test_the_inference_scope_is_required(tmp_path):
    async with node(tmp_path) as n:
        inference, metrics_only = n.key("acme"), n.key("ops", "metrics")
        await refresh(n)
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [5]}), ("/tokenizer_info", None)):
            assert (await call(n.http, n.url, path, body))[0] == 401, path
            status, answer, _ = await call(n.http, n.url, path, body, Authorization=f"Bearer {metrics_only}")
            assert (status, answer["error"]["code"]) == (403, "insufficient_scope"), path
            assert (await call(n.http, n.url, path, body, Authorization=f"Bearer {inference}"))[0] == 200, path


# -- refusals, each naming its field -----------------------------------------------------------------------------

REFUSALS = [
    ("/tokenize", {"model": "sim"}, "prompt", "missing_required_parameter"),
    ("/tokenize", {"model": "sim", "prompt": "x", "messages": CHAT}, "messages", "invalid_value"),
    ("/tokenize", {"model": "sim", "prompt": "x", "add_generation_prompt": True}, "add_generation_prompt",
     "invalid_value"),
    ("/tokenize", {"model": "sim", "messages": CHAT, "continue_final_message": True}, "continue_final_message",
     "unsupported_parameter"),
    ("/tokenize", {"model": "sim", "prompt": "x", "temperature": 0}, "temperature", "unknown_parameter"),
    ("/tokenize", {"model": "sim", "prompt": 3}, "prompt", "invalid_value"),
    ("/tokenize", {"model": "sim", "messages": []}, "messages", "invalid_value"),
    ("/tokenize", {"model": "sim", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id",
     "missing_required_parameter"),
    ("/detokenize", {"model": "sim", "tokens": [1, 10**6]}, "tokens", "invalid_token_id"),
    ("/detokenize", {"model": "sim", "tokens": [-1]}, "tokens[0]", "invalid_value"),
    ("/detokenize", {"model": "sim"}, "tokens", "missing_required_parameter"),
    ("/tokenizer_info?model=sim&tokenizer=x", None, "tokenizer", "unknown_parameter"),
]


@pytest.mark.parametrize(("path", "body", "param", "code"), REFUSALS, ids=lambda v: json.dumps(v)[:60])
async def test_a_bad_request_is_a_400_naming_its_field(served, path, body, param, code):
    status, answer, _ = await post(served, path, body)
    assert (status, answer["error"]["param"], answer["error"]["code"]) == (400, param, code), answer


async def test_a_body_that_is_not_json_is_a_415(served):
    async with served.http.post(served.base_url + "/tokenize", data="prompt=x") as resp:
        assert resp.status == 415 and (await resp.json())["error"]["code"] == "unsupported_media_type"


# The published schema allows a body exactly when validation accepts it (model `m` is not served: an
# accepted body ends in routing's 404, a refused one in a 400), as tests/api/routes/test_openapi_strictness.py.
SCHEMA_CASES = [
    ("/tokenize", {"model": "m", "prompt": "x"}),
    ("/tokenize", {"model": "m", "prompt": ""}),
    ("/tokenize", {"model": "m", "messages": CHAT, "prompt": None}),
    ("/tokenize", {"model": "m", "prompt": "x", "messages": None, "add_special_tokens": False}),
    ("/tokenize", {"model": "m"}),
    ("/tokenize", {"model": "m", "prompt": None, "messages": None}),
    ("/tokenize", {"model": "m", "prompt": "x", "messages": CHAT}),
    ("/tokenize", {"model": "m", "prompt": "x", "add_generation_prompt": False}),
    ("/tokenize", {"model": "m", "prompt": "x", "continue_final_message": False}),
    ("/tokenize", {"model": "m", "messages": CHAT, "continue_final_message": False}),
    ("/tokenize", {"model": "m", "messages": CHAT, "continue_final_message": True}),
    ("/tokenize", {"model": "m", "messages": [{"role": "assistant"}]}),
    ("/tokenize", {"model": "m", "messages": [{"role": "user"}]}),
    ("/tokenize", {"model": "m", "messages": [{"role": "function", "content": "x"}]}),
    ("/tokenize", {"model": "", "prompt": "x"}),
    ("/tokenize", {"model": "m", "prompt": "x", "extra": 1}),
    ("/detokenize", {"model": "m", "tokens": [0, 1]}),
    ("/detokenize", {"model": "m", "tokens": [-1]}),
    ("/detokenize", {"model": "m", "tokens": None}),
    ("/detokenize", {"model": " ", "tokens": []}),
]


@pytest.mark.parametrize(("path", "body"), SCHEMA_CASES, ids=lambda v: json.dumps(v)[:80])
async def test_the_schema_allows_a_body_exactly_when_validation_accepts_it(served, path, body):
    doc = (await post(served, "/openapi.json"))[1]
    schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    allowed = jsonschema_rs.Draft202012Validator({"components": doc["components"], **schema}).is_valid(body)
    status, answer, _ = await post(served, path, body)
    assert status in (400, 404), answer
    assert (status == 404) == allowed, (allowed, answer)


async def test_a_draining_node_refuses_tokenizer_routes_as_it_refuses_completions(served):
    served.state.draining = True
    status, body, _ = await post(served, "/tokenize", {"prompt": "hello"})
    assert status == 503 and body["error"]["code"] == "draining"
