"""inferd.engine.trtllm.loras through TrtllmEngine on the test double: the engine is an AdapterHost; load
checks the directory (HF/PEFT LoRA, signature with trusted keys) and gives the adapter a fresh LoRARequest;
unload refuses new requests naming it; a bad adapter is refused alone while the base model serves."""
from __future__ import annotations

import asyncio

import pytest

from inferd.engine import AdapterHost, AdapterLoadError, AdapterSignatureError, UnknownAdapter
from inferd.engine.base import InvalidRequest
from inferd.artifacts.build.lora import pack_peft
from inferd.artifacts.signing import fingerprint, generate_key_pair, load_private_key, load_public_key, sign_artifact
from inferd.types import FinishReason, GenerationRequest, SamplingParams
from tests.trtllm_double.harness import make_lora_dir, trtllm_on_double

PROMPT = "Paged attention keeps the KV cache in blocks of tokens"


def request(engine, rid: str, lora: str | None) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode(PROMPT)), lora=lora,
                             sampling=SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))


async def run(engine, req: GenerationRequest):
    return await asyncio.wait_for(engine.submit(req).collect(), 20.0)


def sent_loras(controls) -> list:
    return [kwargs["lora_request"] for name, kwargs in controls.calls if name == "generate_async"]


async def test_adapters_are_listed_loaded_and_a_bad_one_is_refused_alone_until_a_load_succeeds(
        tiny_artifact, tmp_path):
    good = make_lora_dir(tmp_path / "good", rank=4)
    bad = tmp_path / "bad"
    bad.mkdir()                                       # no adapter_config.json: not an HF/PEFT LoRA directory
    async with trtllm_on_double(tiny_artifact, tmp_path, engine_dir_kwargs={"lora": True},
                                lora_adapters={"good": str(good), "bad": str(bad)}) as engine:
        from tensorrt_llm._double import controls

        assert isinstance(engine, AdapterHost)
        assert [(i.name, i.loaded, i.rank) for i in engine.adapters()] == [("bad", False, None), ("good", True, 4)]
        with pytest.raises(InvalidRequest) as refused:
            engine.submit(request(engine, "b", "bad"))
        assert refused.value.param == "model" and "'bad' could not be loaded" in str(refused.value)
        assert "adapter_config.json" in str(refused.value)
        assert (await run(engine, request(engine, "base", None))).finish_reason is FinishReason.LENGTH
        assert (await run(engine, request(engine, "g", "good"))).finish_reason is FinishReason.LENGTH

        with pytest.raises(AdapterLoadError) as caught:
            await engine.load_adapter("bad")
        assert caught.value.adapter == "bad" and caught.value.file == str(bad / "adapter_config.json")
        with pytest.raises(UnknownAdapter):
            await engine.load_adapter("nope")

        make_lora_dir(bad)                           # fixed on disk: a load now lets requests through
        info = await engine.load_adapter("bad")
        assert (info.loaded, info.rank) == (True, 2)
        controls.calls.clear()
        assert (await run(engine, request(engine, "b2", "bad"))).finish_reason is FinishReason.LENGTH
        (sent,) = sent_loras(controls)
        assert (sent.lora_name, sent.lora_path) == ("bad", str(bad))


async def test_unload_refuses_new_requests_and_a_new_load_sends_a_fresh_adapter_id(tiny_artifact, tmp_path):
    adapter = make_lora_dir(tmp_path / "support")
    async with trtllm_on_double(tiny_artifact, tmp_path, engine_dir_kwargs={"lora": True},
                                lora_adapters={"support": str(adapter)}) as engine:
        from tensorrt_llm._double import controls

        controls.calls.clear()
        await run(engine, request(engine, "a", "support"))
        assert await engine.unload_adapter("support") is True
        assert await engine.unload_adapter("support") is False
        assert engine.adapters()[0].loaded is False
        with pytest.raises(InvalidRequest, match="'support' is not loaded"):
            engine.submit(request(engine, "b", "support"))
        assert (await engine.load_adapter("support")).loaded is True
        await run(engine, request(engine, "c", "support"))
        first, again = sent_loras(controls)
        assert again.lora_int_id != first.lora_int_id      # TensorRT-LLM reads the files anew, not its cached copy
        assert again.lora_path == first.lora_path == str(adapter)


async def test_with_trusted_keys_only_a_signed_adapter_artifact_loads(tiny_artifact, tmp_path):
    release, release_pub = generate_key_pair(tmp_path, "release")
    team, _ = generate_key_pair(tmp_path, "team")
    signed = pack_peft(make_lora_dir(tmp_path / "peft-a"), tiny_artifact, "signed", tmp_path / "engines")
    foreign = pack_peft(make_lora_dir(tmp_path / "peft-b"), tiny_artifact, "foreign", tmp_path / "engines")
    sign_artifact(signed, load_private_key(release))
    sign_artifact(foreign, load_private_key(team))
    plain = make_lora_dir(tmp_path / "plain")
    trusted = {fingerprint(load_public_key(release_pub)): str(release_pub)}
    sources = {"signed": str(tmp_path / "engines" / "signed"), "foreign": str(foreign), "plain": str(plain)}
    async with trtllm_on_double(tiny_artifact, tmp_path, engine_dir_kwargs={"lora": True}, lora_adapters=sources,
                                adapter_trusted_keys=trusted) as engine:
        assert {i.name: i.loaded for i in engine.adapters()} == {"foreign": False, "plain": False, "signed": True}
        assert engine.adapters()[2].version == signed.name
        with pytest.raises(AdapterSignatureError) as caught:
            await engine.load_adapter("foreign")
        assert caught.value.signer == fingerprint(load_public_key(team.with_suffix(".pub")))
        assert caught.value.file == str(foreign / "manifest.sig") and "'foreign'" in str(caught.value)
        with pytest.raises(AdapterSignatureError, match=r"unsigned \(signer: none\)"):
            await engine.load_adapter("plain")
        with pytest.raises(InvalidRequest, match="not signed|not a trusted key"):
            engine.submit(request(engine, "f", "foreign"))
        assert (await run(engine, request(engine, "s", "signed"))).finish_reason is FinishReason.LENGTH
        assert (await run(engine, request(engine, "base", None))).finish_reason is FinishReason.LENGTH
