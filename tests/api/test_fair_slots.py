"""Sequence slots are fair through the real app: a tenant arriving at a node whose every slot another
tenant's long streams hold gets its first token while those streams still run (inferd.admission.slots
has the newest one yield its slot; it resumes later, its stream only paused)."""
from __future__ import annotations

import asyncio

from inferd.config.tenants import AuthConfig, TenantConfig
from inferd.tenancy.keys import KeyHasher, create_key
from tests.api.conftest import metric_value, sim_engine


async def _first_data_line(resp) -> None:
    async for line in resp.content:
        if line.startswith(b"data: {"):
            return


async def test_a_tenant_gets_its_first_token_while_another_ones_long_streams_hold_every_slot(serve, tmp_path):
    keys_file = tmp_path / "keys.jsonl"
    alpha, beta = (create_key(keys_file, KeyHasher(None), t, ("inference",))[1] for t in ("alpha", "beta"))
    ops = create_key(keys_file, KeyHasher(None), "ops", ("metrics",))[1]
    # Two slots; beta's streams run ~4,000 paced steps, far longer than alpha's one-token request.
    engine = sim_engine(max_batch_size=2, time_scale=1.0, max_model_len=4096, num_kv_blocks=1024)
    served = await serve({"sim": engine}, auth=AuthConfig(mode="api_key", keys_file=str(keys_file)),
                         tenants={"alpha": TenantConfig(), "beta": TenantConfig()})
    url = served.base_url + "/v1/completions"
    long_body = {"model": "sim", "prompt": "tell me everything", "max_tokens": 4000, "ignore_eos": True,
                 "stream": True}
    hog = [await served.http.post(url, json=long_body, headers={"Authorization": f"Bearer {beta}"})
           for _ in range(2)]
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
