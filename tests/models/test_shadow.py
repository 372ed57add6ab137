"""Shadow traffic: never reaches the client, runs only with spare room, and is dropped first."""
from __future__ import annotations

import asyncio

import aiohttp

from inferd.engine.sim.engine import SimEngine
from inferd.models.shadow import ShadowDispatcher
from inferd.models.version_stats import ShadowRecorder
from inferd.types import GenerationRequest, ModelVersion, SamplingParams
from tests.daemon.harness import complete, running, sim_model, write_config

KEY = ModelVersion("m", "shadow")


async def test_shadows_take_only_spare_room_and_are_aborted_first_when_live_traffic_needs_it():
    engine = SimEngine("tiny", max_batch_size=4, time_scale=5.0, max_model_len=2048)
    await engine.start()
    recorder = ShadowRecorder()
    shadows = ShadowDispatcher(recorder, reserve_slots=1)
    sampling = SamplingParams(max_tokens=500, ignore_eos=True)
    try:
        # 4 slots, 1 reserved for live traffic: three shadows fit, the fourth is dropped, never queued.
        assert [shadows.mirror(KEY, engine, [1, 2, 3], sampling) for _ in range(4)] == [True, True, True, False]
        assert shadows.running == 3
        # A live request finds no spare room: every shadow on that engine is aborted before it goes in.
        assert shadows.make_room(engine, 3, 8) == 3
        live = engine.submit(GenerationRequest(request_id="live", prompt_token_ids=(1, 2, 3),
                                               sampling=SamplingParams(max_tokens=8, ignore_eos=True)))
        assert (await live.collect()).finish_reason.value == "length"
        while shadows.running:
            await asyncio.sleep(0)
        summary = recorder.summary()[str(KEY)]
        assert summary["mirrored"] == 3 and summary["dropped"] == 4 and summary["requests"] == 0
    finally:
        await shadows.close()
        await engine.close()


async def test_mirrored_request_is_recorded_apart_and_its_output_never_returned(tmp_path):
    extra = '[aliases.chat]\nsplit = { "m@live" = 1 }\nshadow = "m@shadow"\nshadow_fraction = 1.0\n'
    path = write_config(tmp_path / "c.toml", {"m": sim_model(["live", "shadow"], time_scale=0.0)}, extra)
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        shadow_engine = daemon.state.registry.table.engine(KEY)
        for i in range(5):
            status, headers, body = await complete(http, url, "chat", max_tokens=6, user=f"u{i}")
            assert status == 200 and headers["X-Inferd-Model-Version"] == "live+simulated"
            assert body["model"] == "m@live+simulated" and len(body["choices"]) == 1
        shadow_stats = daemon.control.shadows
        while shadow_stats.stats(KEY).requests < 5:       # shadow copies finish after the live answers
            await asyncio.sleep(0.01)
        summary = shadow_stats.summary()[str(KEY)]
        assert summary["mirrored"] == 5 and summary["errors"] == 0 and summary["completion_tokens"] == 30
        assert shadow_engine.stats().generation_tokens_total == 30
        # Live stats of the shadow version stay empty: a rollout never sees shadow results.
        assert daemon.state.versions.in_use(KEY) == 0
        async with http.get(f"{url}/admin/shadow") as resp:
            if resp.status == 200:
                assert (await resp.json())[str(KEY)]["mirrored"] == 5
