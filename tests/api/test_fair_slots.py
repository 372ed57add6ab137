"""Sequence slots and KV are fair through the real app: a tenant arriving at a node whose every slot, or
whose whole KV cache, another tenant's long streams hold gets its first token while those streams still
run (inferd.admission.slots has the newest one yield; it resumes later, its stream only paused)."""
from __future__ import annotations

import asyncio

from inferd.config.tenants import AuthConfig, TenantConfig
from inferd.tenancy.keys import KeyHasher, create_key
from tests.api.conftest import metric_value, sim_engine


async def _first_data_line(resp) -> None:
    async for line in resp.content:
        if line.startswith(b"data: {"):
            return


async def _beta_streams(serve, engine, keys_file, beta: str, *, streams: int, max_tokens: int):
    """The app with tenants alpha and beta (auth on), and beta's long streams started (the responses)."""
    served = await serve({"sim": engine}, auth=AuthConfig(mode="api_key", keys_file=str(keys_file)),
                         tenants={"alpha": TenantConfig(), "beta": TenantConfig()})
    url = served.base_url + "/v1/completions"
    long_body = {"model": "sim", "prompt": "tell me everything", "max_tokens": max_tokens, "ignore_eos": True,
                 "stream": True}
    hog = [await served.http.post(url, json=long_body, headers={"Authorization": f"Bearer {beta}"})
           for _ in range(streams)]
    return served, url, hog


async def test_a_tenant_gets_its_first_token_while_another_ones_long_streams_hold_every_slot(serve, tmp_path):
    keys_file = tmp_path / "keys.jsonl"
    alpha, beta = (create_key(keys_file, KeyHasher(None), t, ("inference",))[1] for t in ("alpha", "beta"))
    ops = create_key(keys_file, KeyHasher(None), "ops", ("metrics",))[1]
    # Two slots; beta's streams run ~4,000 paced steps, far longer than alpha's one-token request.
    engine = sim_engine(max_batch_size=2, time_scale=1.0, max_model_len=4096, num_kv_blocks=1024)
    served, url, hog = await _beta_streams(serve, engine, keys_file, beta, streams=2, max_tokens=4000)
    reading: list[asyncio.Future] = []
    try:
        for resp in hog:
            assert resp.status == 200
            await _first_data_line(resp)                # both of beta's streams run: every slot is held
        assert served.engine.capacity().free_slots == 0
        reading += [asyncio.ensure_future(resp.content.read()) for resp in hog]   # to their ends
        async with served.http.post(url, json={"model": "sim", "prompt": "hi", "max_tokens": 1},
                                    headers={"Authorization": f"Bearer {alpha}"}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["usage"]["completion_tokens"] == 1
        assert not any(r.done() for r in reading)       # alpha did not wait for one of beta's to end
        async with served.http.get(served.base_url + "/metrics", headers={"Authorization": f"Bearer {ops}"}) as resp:
            text = await resp.text()
        assert metric_value(text, "inferd_engine_fairness_preemptions_total", model="sim") == 1
    finally:
        for task in reading:
            task.cancel()
        await asyncio.gather(*reading, return_exceptions=True)
        for resp in hog:
            resp.close()


async def test_a_tenant_gets_its_first_token_while_another_ones_long_streams_hold_the_kv_cache(serve, tmp_path):
    keys_file = tmp_path / "keys.jsonl"
    alpha, beta = (create_key(keys_file, KeyHasher(None), t, ("inference",))[1] for t in ("alpha", "beta"))
    # Eight slots, of which beta's three streams hold fewer than its share (4); but 64 KV blocks (1,024
    # tokens), which three streams of ~1,000 tokens each outgrow: the engine preempts for blocks.
    engine = sim_engine(max_batch_size=8, time_scale=1.0, max_model_len=1024, num_kv_blocks=64)
    served, url, hog = await _beta_streams(serve, engine, keys_file, beta, streams=3, max_tokens=1000)
    full = asyncio.Event()

    async def read_to_end(resp) -> None:
        async for _ in resp.content:
            if served.engine.capacity().free_kv_blocks == 0:
                full.set()

    reading = [asyncio.ensure_future(read_to_end(resp)) for resp in hog]
    asking: asyncio.Future | None = None
    try:
        assert all(resp.status == 200 for resp in hog)
        await asyncio.wait_for(full.wait(), 60)          # the KV cache is full of beta's contexts
        assert served.engine.capacity().free_slots >= 4 and not any(r.done() for r in reading)

        async def ask_alpha() -> dict:
            async with served.http.post(url, json={"model": "sim", "prompt": "hi", "max_tokens": 1},
                                        headers={"Authorization": f"Bearer {alpha}"}) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.json()

        asking = asyncio.ensure_future(ask_alpha())
        done, _ = await asyncio.wait([asking, *reading], return_when=asyncio.FIRST_COMPLETED)
        assert asking in done                             # not after one of beta's streams ended
        assert (await asking)["usage"]["completion_tokens"] == 1
        await asyncio.gather(*reading)                    # beta's streams end whole: only paused
    finally:
        for task in (*reading, *([asking] if asking is not None else [])):
            task.cancel()
        await asyncio.gather(*reading, *([asking] if asking is not None else []), return_exceptions=True)
        for resp in hog:
            resp.close()
