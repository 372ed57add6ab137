"""ReferenceEngine with LoRA adapters, end to end on the tiny model: batching, lazy loads, slots, admin."""
from __future__ import annotations

import asyncio
import shutil

import pytest

from inferd.engine.adapters import AdapterBusy, AdapterHost, AdapterLoadError, UnknownAdapter
from inferd.engine.base import InvalidRequest
from inferd.engine.reference.engine import ReferenceEngine
from inferd.types import FinishReason, GenerationRequest, SamplingParams
from inferd.artifacts.build.lora import synthetic_adapter_tensors, write_peft_adapter
from inferd.artifacts.build.reference import read_json_object
from tests.engine.backends import json_log, started_engines

TEXTS = ["the quick brown fox", "we said", "one of the most common words in the language is the", "how"]
LONG = 480      # tokens: a request that outlasts the test's checks (most tests abort it before it ends)


@pytest.fixture
async def make_engine(tiny_artifact, tiny_adapters):
    def build(**kwargs) -> ReferenceEngine:
        kwargs.setdefault("num_kv_blocks", 256)
        kwargs.setdefault("block_size", 4)
        kwargs.setdefault("lora_adapters", tiny_adapters)
        return ReferenceEngine(tiny_artifact, **kwargs)

    async with started_engines(build) as make:
        yield make


def req(engine, rid: str, text: str, lora: str | None, max_tokens: int = 10) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(engine.tokenizer.encode(text)), lora=lora,
                             sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


def loaded(engine) -> dict[str, int]:
    """Loaded adapters -> sequences holding them."""
    return {info.name: info.in_use for info in engine.adapters() if info.loaded}


async def test_a_batch_mixing_two_adapters_and_none_gives_each_sequence_its_solo_output(make_engine):
    engine = await make_engine(max_num_tokens=16)       # prefill chunks share steps with decodes
    work = [(text, lora) for text in TEXTS for lora in (None, "all", "qvd")]
    solo = [(await engine.submit(req(engine, f"solo{i}", t, lora)).collect()).token_ids
            for i, (t, lora) in enumerate(work)]

    streams = [engine.submit(req(engine, f"mixed{i}", t, lora)) for i, (t, lora) in enumerate(work)]
    mixed = [(await s.collect()).token_ids for s in streams]

    assert mixed == solo
    for i in range(0, len(work), 3):                    # each adapter changes the text (one prompt may not)
        assert len({tuple(solo[i]), tuple(solo[i + 1]), tuple(solo[i + 2])}) >= 2
    assert {tuple(solo[i]) for i in range(len(work)) if work[i][1] == "all"} != \
        {tuple(solo[i]) for i in range(len(work)) if work[i][1] is None}


async def test_an_adapter_loads_on_first_use_and_is_let_go_when_its_requests_end(make_engine):
    engine = await make_engine()
    assert isinstance(engine, AdapterHost) and loaded(engine) == {}

    # long enough that it is still running when its first token reaches the loop, even on a loaded machine
    # (the step thread runs on while the loop waits its turn: 30 tokens were all done by then in one run)
    stream = engine.submit(req(engine, "r", TEXTS[0], "qvd", max_tokens=400))
    await stream.__anext__()
    assert loaded(engine) == {"qvd": 1}
    await stream.collect()

    assert loaded(engine) == {"qvd": 0}
    info = engine.adapters()[1]
    assert (info.name, info.rank, info.version) == ("qvd", 2, None) and info.idle_s >= 0


async def test_an_unknown_adapter_is_an_invalid_request_naming_model(make_engine, tiny_artifact):
    engine = await make_engine()
    with pytest.raises(InvalidRequest, match="unknown LoRA adapter 'nope'; this model serves: all, qvd") as caught:
        engine.submit(req(engine, "r", TEXTS[0], "nope"))
    assert caught.value.param == "model"

    plain = await make_engine(lora_adapters=None)
    with pytest.raises(InvalidRequest, match="serves no LoRA adapters"):
        plain.submit(req(plain, "r", TEXTS[0], "all"))


async def test_with_one_slot_a_second_adapter_waits_for_the_first_to_be_let_go(make_engine):
    engine = await make_engine(max_loaded_adapters=1)
    solo = {lora: (await engine.submit(req(engine, f"solo-{lora}", TEXTS[2], lora)).collect()).token_ids
            for lora in ("all", "qvd")}
    await engine.unload_adapter("qvd")

    first = engine.submit(req(engine, "first", TEXTS[2], "all", max_tokens=LONG))
    await first.__anext__()
    second = engine.submit(req(engine, "second", TEXTS[2], "qvd"))
    await asyncio.sleep(0.02)                           # the adapter is read; no slot is free
    assert loaded(engine) == {"all": 1} and engine.capacity().waiting == 1

    engine.abort("first")
    assert (await second.collect()).token_ids == solo["qvd"]
    assert (await first.collect()).finish_reason is FinishReason.ABORT and loaded(engine) == {"qvd": 0}


async def test_a_held_adapter_gets_the_slot_when_its_holder_finishes_on_its_own(make_engine):
    # no abort, no command: the step that ends the holder must hand the slot on, not go to sleep
    engine = await make_engine(max_loaded_adapters=1)
    first = engine.submit(req(engine, "first", TEXTS[2], "all", max_tokens=LONG))
    await first.__anext__()
    second = engine.submit(req(engine, "second", TEXTS[2], "qvd"))
    held, reason = False, None
    async for delta in first:                           # one delta a step, to the natural end
        held = held or engine._waits.has_held            # qvd read, no slot: held (only while first runs)
        reason = delta.finish_reason
    assert held, "qvd was not read before the first request ended: the test proves nothing"
    assert reason is FinishReason.LENGTH

    done = await asyncio.wait_for(second.collect(), timeout=5)
    assert done.finish_reason is FinishReason.LENGTH and loaded(engine) == {"qvd": 0}


async def test_a_request_aborted_while_its_adapter_waits_for_a_slot_ends_and_frees_its_place(make_engine):
    engine = await make_engine(max_loaded_adapters=1)
    first = engine.submit(req(engine, "first", TEXTS[2], "all", max_tokens=LONG))
    await first.__anext__()
    waiting = engine.submit(req(engine, "waiting", TEXTS[0], "qvd"))
    await asyncio.sleep(0.02)

    engine.abort("waiting")

    assert (await waiting.collect()).finish_reason is FinishReason.ABORT
    assert loaded(engine) == {"all": 1}
    engine.abort("first")
    await first.collect()
    assert engine.capacity().waiting == 0 and loaded(engine) == {"all": 0}   # nobody wants qvd now


async def test_an_adapter_that_fails_to_load_fails_its_requests_only(make_engine, tiny_adapters, tmp_path):
    broken = shutil.copytree(tiny_adapters["qvd"], tmp_path / "broken")
    (broken / "adapter_config.json").write_text('{"r": "four"}')
    engine = await make_engine(lora_adapters={**tiny_adapters, "broken": broken})

    with json_log("inferd.engine.step_engine") as lines:
        bad = await engine.submit(req(engine, "bad", TEXTS[0], "broken")).collect()
        good = await engine.submit(req(engine, "good", TEXTS[0], "all")).collect()

    assert bad.finish_reason is FinishReason.ERROR and "'broken' could not be loaded" in bad.error
    assert "four" not in bad.error                       # details go to the log, not to the client
    assert good.finish_reason is FinishReason.LENGTH
    (line,) = [line for line in lines if line.get("event") == "lora_adapter_load_failed"]
    assert line["adapter"] == "broken" and "r must be a positive integer" in line["error"]
    assert line["request_ids"] == ["bad"]


async def test_the_admin_methods_load_unload_and_refuse_with_typed_errors(make_engine, tiny_adapters, tmp_path):
    broken = shutil.copytree(tiny_adapters["qvd"], tmp_path / "broken")
    (broken / "adapter_model.safetensors").unlink()
    engine = await make_engine(lora_adapters={**tiny_adapters, "broken": broken})

    info = await engine.load_adapter("all")
    assert (info.loaded, info.rank, info.in_use) == (True, 4, 0) and info.version
    assert (await engine.load_adapter("all")) .loaded
    with pytest.raises(UnknownAdapter):
        await engine.load_adapter("nope")
    with pytest.raises(AdapterLoadError) as caught:
        await engine.load_adapter("broken")
    assert caught.value.file == "adapter_model.safetensors"

    stream = engine.submit(req(engine, "r", TEXTS[2], "all", max_tokens=LONG))
    await stream.__anext__()
    with pytest.raises(AdapterBusy):
        await engine.unload_adapter("all")
    engine.abort("r")
    await stream.collect()
    assert await engine.unload_adapter("all") is True
    assert await engine.unload_adapter("all") is False and loaded(engine) == {}


async def test_an_adapter_nobody_uses_unloads_after_the_idle_time(make_engine):
    engine = await make_engine(adapter_idle_unload_s=0.05)
    await engine.submit(req(engine, "r", TEXTS[1], "qvd", max_tokens=2)).collect()
    assert "qvd" in loaded(engine)

    for _ in range(100):
        if not loaded(engine):
            break
        await asyncio.sleep(0.01)
    assert loaded(engine) == {}


async def test_close_ends_a_request_still_waiting_for_its_adapter(make_engine):
    engine = await make_engine(max_loaded_adapters=1)
    first = engine.submit(req(engine, "first", TEXTS[2], "all", max_tokens=LONG))
    await first.__anext__()
    waiting = engine.submit(req(engine, "waiting", TEXTS[0], "qvd"))

    await engine.close()

    assert (await waiting.collect()).finish_reason is FinishReason.ABORT
    assert (await first.collect()).finish_reason is FinishReason.ABORT


async def test_a_reloaded_adapter_reuses_cached_prefixes_only_if_its_files_are_unchanged(make_engine, tiny_artifact,
                                                                                           tmp_path):
    config = read_json_object(tiny_artifact / "config.json")

    def write(seed: int) -> None:
        write_peft_adapter(tmp_path / "x", synthetic_adapter_tensors(config, rank=2, seed=seed, b_std=0.1),
                           rank=2, alpha=4, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                     "up_proj", "down_proj"))

    write(seed=7)
    engine = await make_engine(lora_adapters={"x": tmp_path / "x"})
    first = await engine.submit(req(engine, "first", TEXTS[2], "x")).collect()
    await engine.unload_adapter("x")
    again = await engine.submit(req(engine, "again", TEXTS[2], "x")).collect()
    assert again.token_ids == first.token_ids and again.usage.cached_tokens > 0

    await engine.unload_adapter("x")
    write(seed=8)
    changed = await engine.submit(req(engine, "changed", TEXTS[2], "x")).collect()
    fresh = await make_engine(lora_adapters={"x": tmp_path / "x"})
    expected = await fresh.submit(req(fresh, "fresh", TEXTS[2], "x")).collect()
    assert changed.usage.cached_tokens == 0 and changed.token_ids == expected.token_ids != first.token_ids
