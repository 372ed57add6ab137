"""Routing glue (inferd/api/pipeline/versioned.py) through the app: LoRA adapters named `model:adapter`."""
from __future__ import annotations

import openai
import pytest

from inferd.config.root import ModelConfig, TrtllmConfig
from tests.trtllm_double.harness import make_lora_dir, trtllm_on_double


@pytest.fixture
async def lora_served(serve, tiny_artifact, tmp_path):
    """The trtllm backend (on its test double) built with the LoRA plugin, serving adapter `support`."""
    adapter = make_lora_dir(tmp_path / "loras" / "support")
    async with trtllm_on_double(tiny_artifact, tmp_path, engine_dir_kwargs={"lora": True},
                                lora_adapters={"support": str(adapter)}) as engine:
        from tensorrt_llm._double import controls

        models = {"t": ModelConfig(backend="trtllm", trtllm=TrtllmConfig(lora_adapters={"support": str(adapter)}))}
        served = await serve({"t": engine}, models=models)
        controls.calls.clear()
        yield served, controls, adapter


def lora_requests(controls) -> list:
    return [kwargs["lora_request"] for name, kwargs in controls.calls if name == "generate_async"]


async def test_a_request_for_model_colon_adapter_runs_with_that_adapter(lora_served):
    served, controls, adapter = lora_served
    version = served.engine.info.version
    resp = await served.sdk.completions.create(model="t:support", prompt="hello", max_tokens=3)
    assert resp.model == f"t@{version}:support" and resp.usage.completion_tokens == 3
    pinned = await served.sdk.chat.completions.create(model=f"t@{version}:support", max_completion_tokens=2,
                                                      messages=[{"role": "user", "content": "hi"}])
    assert pinned.usage.completion_tokens == 2
    await served.sdk.completions.create(model="t", prompt="hello", max_tokens=1)
    first, second, base = lora_requests(controls)
    assert (first.lora_name, first.lora_path) == ("support", str(adapter)) and second.lora_name == "support"
    assert base is None


async def test_adapters_are_listed_and_an_unknown_adapter_is_404_naming_model(lora_served):
    served, _, _ = lora_served
    ids = [m.id for m in (await served.sdk.models.list()).data]
    assert ids == ["t", "t:support"]
    with pytest.raises(openai.NotFoundError) as exc:
        await served.sdk.completions.create(model="t:nope", prompt="hello", max_tokens=1)
    assert exc.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.completions.create(model="t:", prompt="hello", max_tokens=1)
    assert exc.value.body["param"] == "model"


async def test_an_adapter_on_a_model_without_adapters_is_404(served):
    with pytest.raises(openai.NotFoundError) as exc:
        await served.sdk.completions.create(model="sim:support", prompt="hello", max_tokens=1)
    assert exc.value.body["param"] == "model"


async def test_admin_adapters_loads_and_unloads_a_trtllm_adapter_and_v1_models_shows_it(lora_served):
    served, controls, adapter = lora_served

    async def admin(action: str) -> tuple[int, dict]:
        async with served.http.post(served.base_url + "/admin/adapters",
                                    json={"model": "t", "adapter": "support", "action": action}) as resp:
            return resp.status, await resp.json()

    async def listed_loaded() -> bool:
        rows = {m.id: m for m in (await served.sdk.models.list()).data}
        return rows["t:support"].model_extra["loaded"]

    assert await listed_loaded() is True
    status, body = await admin("unload")
    assert status == 200 and body["unloaded"] is True and body["loaded"] is False
    assert await listed_loaded() is False
    with pytest.raises(openai.BadRequestError, match="'support' is not loaded") as exc:
        await served.sdk.completions.create(model="t:support", prompt="hello", max_tokens=1)
    assert exc.value.body["param"] == "model"
    status, body = await admin("load")
    assert status == 200 and body["loaded"] is True and body["rank"] == 2 and body["source"] == str(adapter)
    assert (await served.sdk.completions.create(model="t:support", prompt="hello", max_tokens=2)).usage.completion_tokens == 2
    assert await listed_loaded() is True


class _Grammars:
    def __init__(self, verdict):
        self._verdict = verdict

    def verdict(self, guided):
        return self._verdict


def _mirror(shadow_engine, sampling):
    """mirror_to_shadow with stand-ins for the state; returns (mirrored, dropped) counts."""
    from types import SimpleNamespace

    from inferd.api.pipeline.versioned import mirror_to_shadow

    counts = {"mirrored": 0, "dropped": 0}
    shadows = SimpleNamespace(
        recorder=SimpleNamespace(dropped=lambda key: counts.__setitem__("dropped", counts["dropped"] + 1)),
        mirror=lambda *a: counts.__setitem__("mirrored", counts["mirrored"] + 1))
    table = SimpleNamespace(is_ready=lambda key: True, engine=lambda key: shadow_engine)
    state = SimpleNamespace(shadows=shadows, registry=SimpleNamespace(table=table))
    live = SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=100))
    mirror_to_shadow(state, SimpleNamespace(shadow="m@shadow"), live, (1, 2), sampling, "t")
    return counts["mirrored"], counts["dropped"]


@pytest.mark.parametrize("verdict, compiles_missed, mirrored", [
    ("", False, True),           # the shadow compiled it before: TensorRT-LLM takes it
    (None, False, False),        # never compiled there, and trtllm refuses that: dropped, counted
    (None, True, True),          # reference/sim compile it off their step
    ("refused: bad", True, False),
])
def test_a_guided_request_is_mirrored_only_to_a_shadow_that_can_run_its_grammar(verdict, compiles_missed, mirrored):
    from types import SimpleNamespace

    from inferd.types import GuidedDecoding, SamplingParams

    shadow = SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=100), grammars=_Grammars(verdict),
                             compiles_missed_grammars=compiles_missed)
    guided = SamplingParams(max_tokens=4, guided=GuidedDecoding(kind="regex", spec="a+"))
    assert _mirror(shadow, guided) == ((1, 0) if mirrored else (0, 1))
    assert _mirror(shadow, SamplingParams(max_tokens=4)) == (1, 0)          # without a grammar: as before
    assert _mirror(SimpleNamespace(tokenizer=shadow.tokenizer, grammars=None, compiles_missed_grammars=False),
                   guided) == (0, 1)
