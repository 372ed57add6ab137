"""LoRA adapters in the simulated engine: which it serves, their listing, and the time they add to steps."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from inferd.engine.adapters import AdapterBusy, AdapterHost, UnknownAdapter
from inferd.engine.base import InvalidRequest
from inferd.engine.sim.engine import SimEngine
from inferd.engine.sim.lora import ADAPTER_OVERHEAD_S, SimAdapters, intermediate_size, lora_params
from inferd.engine.sim.profiles import PROFILES
from inferd.types import GenerationRequest, SamplingParams
from tests.engine.backends import started_engines

_ids = itertools.count()
PROMPT = tuple(range(300, 340))


@pytest.fixture
async def make_engine():
    def build(**kwargs) -> SimEngine:
        kwargs.setdefault("time_scale", 0.0)
        kwargs.setdefault("lora_adapters", ["sql", "chat"])
        return SimEngine("tiny", **kwargs)

    async with started_engines(build) as make:
        yield make


def submit(engine: SimEngine, lora: str | None, prompt=PROMPT, max_tokens: int = 8):
    return engine.submit(GenerationRequest(request_id=f"r{next(_ids)}", prompt_token_ids=prompt, lora=lora,
                                           sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                   ignore_eos=True)))


async def run(engine: SimEngine, loras: list[str | None]) -> list[list[int]]:
    outs = await asyncio.gather(*(submit(engine, lora).collect() for lora in loras))
    return [o.token_ids for o in outs]


def test_the_derived_mlp_width_is_llama3s():
    assert round(intermediate_size(PROFILES["llama3-8b-h100"])) == 14336
    assert abs(intermediate_size(PROFILES["llama3-70b-4xh100"]) - 28672) < 64


def test_an_adapter_costs_reading_its_weights_or_its_flops_whichever_is_slower():
    profile = PROFILES["llama3-8b-h100"]
    adapters = SimAdapters(["a"], profile, rank=16)
    read_s = lora_params(profile, 16) * 2 / (profile.hbm_bandwidth * profile.bandwidth_efficiency)

    assert adapters.adapter_time([]) == 0.0
    assert adapters.adapter_time([8]) == pytest.approx(read_s + ADAPTER_OVERHEAD_S)   # decode: bandwidth-bound
    assert adapters.adapter_time([8, 1]) == pytest.approx(2 * (read_s + ADAPTER_OVERHEAD_S))
    flops_s = 2 * lora_params(profile, 16) * 8192 / (profile.peak_flops * profile.flops_efficiency)
    assert adapters.adapter_time([8192]) == pytest.approx(flops_s + ADAPTER_OVERHEAD_S)  # prefill: compute-bound
    assert SimAdapters(["a"], profile, rank=64).adapter_time([8]) > 3 * adapters.adapter_time([8])


async def test_steps_with_adapters_take_longer_the_more_distinct_adapters_they_hold(make_engine):
    times = []
    for loras in ([None, None], ["sql", "sql"], ["sql", "chat"]):
        engine = await make_engine()
        await run(engine, loras)
        times.append(engine.sim_time)
    assert times[0] < times[1] < times[2]


async def test_each_adapter_generates_its_own_deterministic_tokens(make_engine):
    engine = await make_engine()
    first = await run(engine, [None, "sql", "chat"])
    assert len({tuple(t) for t in first}) == 3
    assert await run(engine, [None, "sql", "chat"]) == first


async def test_an_adapter_it_does_not_serve_is_an_invalid_request_naming_model(make_engine):
    engine = await make_engine()
    with pytest.raises(InvalidRequest, match="'nope'; this model serves: chat, sql") as caught:
        submit(engine, "nope")
    assert caught.value.param == "model"
    plain = await make_engine(lora_adapters=())
    with pytest.raises(InvalidRequest, match="serves no LoRA adapters"):
        submit(plain, "sql")


async def test_adapters_are_listed_loaded_on_first_use_and_unloaded_when_not_in_use(make_engine):
    engine = await make_engine(time_scale=1.0)
    assert isinstance(engine, AdapterHost)
    assert [(i.name, i.loaded) for i in engine.adapters()] == [("chat", False), ("sql", False)]

    stream = submit(engine, "sql", max_tokens=500)
    await stream.__anext__()
    sql = engine.adapters()[1]
    assert (sql.loaded, sql.in_use, sql.rank) == (True, 1, 16)
    with pytest.raises(AdapterBusy):
        await engine.unload_adapter("sql")
    engine.abort(stream.request_id)
    await stream.collect()

    assert engine.adapters()[1].in_use == 0
    assert await engine.unload_adapter("sql") is True and await engine.unload_adapter("sql") is False
    assert (await engine.load_adapter("chat")).loaded
    with pytest.raises(UnknownAdapter):
        await engine.load_adapter("nope")
