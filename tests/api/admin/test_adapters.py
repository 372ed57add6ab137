"""LoRA adapters through the real daemon (inferd/api/admin/adapters.py, and versioned.py's routing and listing
for the reference and sim backends): `model: "small:ad1"` runs the adapter, /v1/models lists it,
POST /admin/adapters loads and unloads it (audited), and an adapter that does not fit the base model is
refused by name while the base model keeps serving."""
from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import openai
import pytest

from inferd.artifacts.build.lora import build_synthetic_adapter, synthetic_adapter_tensors, write_peft_adapter
from inferd.observability.audit import read_audit
from tests.daemon.harness import running, sim_model, write_config

REF = 'backend = "reference"\nartifact = "tiny"\nmax_batch_size = 4\nmax_num_tokens = 64\nnum_kv_blocks = 64\n'


@pytest.fixture(scope="module")
def adapters(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """"ad1": an adapter artifact for the tiny model; "wide": a PEFT directory for a model twice as wide."""
    root = tmp_path_factory.mktemp("loras")
    build_synthetic_adapter(tiny_artifact, "ad1", root, rank=4, seed=1, b_std=0.5)
    base = json.loads((tiny_artifact / "config.json").read_text())
    wide = {**base, "hidden_size": 2 * base["hidden_size"]}
    write_peft_adapter(root / "wide", synthetic_adapter_tensors(wide, rank=2, targets=("q_proj",)), rank=2,
                       alpha=4.0, targets=("q_proj",))
    return {"ad1": root / "ad1", "wide": root / "wide"}


def reference_config(tmp_path: Path, engines_root: Path, adapters: dict[str, Path], extra: str = "") -> Path:
    table = ", ".join(f'{name} = "{path}"' for name, path in adapters.items())
    path = write_config(tmp_path / "c.toml", {"small": REF + f"lora_adapters = {{ {table} }}\n" + extra})
    path.write_text(path.read_text().replace("[server]\n", f'[server]\nengines_root = "{engines_root}"\n'))
    return path


async def admin(http: aiohttp.ClientSession, url: str, **body) -> tuple[int, dict]:
    async with http.post(f"{url}/admin/adapters", json=body) as resp:
        return resp.status, await resp.json()


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def text_of(client: openai.AsyncOpenAI, model: str) -> str:
    resp = await client.completions.create(model=model, prompt="The adapter", max_tokens=8, temperature=0)
    return resp.choices[0].text


async def test_a_reference_model_serves_its_adapter_lists_it_and_loads_and_unloads_it_audited(
        tmp_path, tiny_engines_root, tiny_artifact, adapters):
    path = reference_config(tmp_path, tiny_engines_root, {"ad1": adapters["ad1"]}, "max_loaded_adapters = 2\n")
    async with running(path) as (_, url), aiohttp.ClientSession() as http, sdk(url) as client:
        listed = {m.id: m for m in (await client.models.list()).data}
        assert set(listed) == {"small", "small:ad1"}
        assert listed["small:ad1"].model_extra["parent"] == "small" and listed["small:ad1"].model_extra["loaded"] is False
        base, tuned = await text_of(client, "small"), await text_of(client, "small:ad1")
        assert tuned != base and await text_of(client, "small:ad1") == tuned    # its own output, deterministic
        assert await text_of(client, "small") == base
        listed = {m.id: m for m in (await client.models.list()).data}
        assert listed["small:ad1"].model_extra["loaded"] is True                # loaded by its first request
        status, body = await admin(http, url, model="small", adapter="ad1", action="unload", reason="make room")
        assert status == 200 and body["unloaded"] is True and body["loaded"] is False
        status, body = await admin(http, url, model="small", adapter="ad1", action="unload")
        assert status == 200 and body["unloaded"] is False                      # not loaded: nothing to do
        status, body = await admin(http, url, model="small", adapter="ad1", action="load")
        assert status == 200 and body["loaded"] is True and body["rank"] == 4 and body["name"] == "ad1"
        assert list(body["versions"]) == [f"small@{tiny_artifact.name}"]           # each ready version
        assert await text_of(client, "small:ad1") == tuned
    records = read_audit(tmp_path / "audit.jsonl")
    assert [r["action"] for r in records] == ["adapter.unload", "adapter.unload", "adapter.load"]
    assert {r["target"] for r in records} == {"small:ad1"} and records[0]["reason"] == "make room"
    assert list(records[0]["before"].values()) == [True] and list(records[0]["after"].values()) == [False]
    assert records[0]["actor"] == "tenant:local"


async def test_unknown_models_and_adapters_are_404_naming_the_field_and_bad_bodies_400(
        tmp_path, tiny_engines_root, adapters):
    path = reference_config(tmp_path, tiny_engines_root, {"ad1": adapters["ad1"]})
    async with running(path) as (_, url), aiohttp.ClientSession() as http, sdk(url) as client:
        with pytest.raises(openai.NotFoundError) as exc:
            await client.completions.create(model="small:nope", prompt="hi", max_tokens=1)
        assert exc.value.body["param"] == "model" and exc.value.body["code"] == "model_not_found"
        status, body = await admin(http, url, model="small", adapter="nope", action="load")
        assert (status, body["error"]["param"], body["error"]["code"]) == (404, "adapter", "adapter_not_found")
        status, body = await admin(http, url, model="large", adapter="ad1", action="load")
        assert (status, body["error"]["param"], body["error"]["code"]) == (404, "model", "model_not_found")
        status, body = await admin(http, url, model="small@0000", adapter="ad1", action="load")
        assert (status, body["error"]["param"]) == (404, "model")
        status, body = await admin(http, url, model="small", adapter="ad1", action="reload")
        assert (status, body["error"]["param"]) == (400, "action")
        status, body = await admin(http, url, model="small", action="load")
        assert (status, body["error"]["param"]) == (400, "adapter")
    assert not (tmp_path / "audit.jsonl").exists()        # nothing was acted on


# a random-weight model may sample its end token at once: these count the tokens a request is served
NO_EOS = {"ignore_eos": True}


async def test_an_adapter_that_does_not_fit_is_named_at_load_and_the_base_model_keeps_serving(
        tmp_path, tiny_engines_root, adapters):
    path = reference_config(tmp_path, tiny_engines_root, {"ad1": adapters["ad1"], "wide": adapters["wide"]})
    async with running(path) as (_, url), aiohttp.ClientSession() as http, sdk(url) as client:
        status, body = await admin(http, url, model="small", adapter="wide", action="load")
        assert (status, body["error"]["code"], body["error"]["param"]) == (422, "adapter_load_failed", "adapter")
        assert "adapter_model.safetensors" in body["error"]["message"]
        assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in body["error"]["message"]
        with pytest.raises(openai.InternalServerError, match="LoRA adapter 'wide' could not be loaded"):
            await client.completions.create(model="small:wide", prompt="hi", max_tokens=2)   # the log says why
        assert (await client.completions.create(model="small", prompt="hi", max_tokens=3, extra_body=NO_EOS)).usage.completion_tokens == 3
        assert (await client.completions.create(model="small:ad1", prompt="hi", max_tokens=3, extra_body=NO_EOS)).usage.completion_tokens == 3
    records = read_audit(tmp_path / "audit.jsonl")
    assert [r["action"] for r in records] == ["adapter.load_failed"]
    assert "adapter_model.safetensors" in records[0]["detail"]["error"]


async def test_a_sim_model_serves_its_adapter_names_and_loads_them_on_request(tmp_path):
    model = sim_model(time_scale=0.0).replace("[MODEL.sim]", 'lora_adapters = { sql = "", chat = "" }\n[MODEL.sim]')
    path = write_config(tmp_path / "c.toml", {"s": model})
    async with running(path) as (_, url), aiohttp.ClientSession() as http, sdk(url) as client:
        ids = [m.id for m in (await client.models.list()).data]
        assert ids == ["s", "s:chat", "s:sql"]
        sql = await text_of(client, "s:sql")
        assert sql != await text_of(client, "s:chat") and sql == await text_of(client, "s:sql")
        status, body = await admin(http, url, model="s", adapter="chat", action="load")
        assert status == 200 and body["loaded"] is True
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="s:nope", prompt="hi", max_tokens=1)
