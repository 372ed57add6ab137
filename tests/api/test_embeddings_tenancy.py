"""Embeddings share the tenancy of generation: one tenant's flood of inputs waits in the weighted-fair
queue while another tenant's request goes through, quotas refuse with 429, and every request is a
ledger row of endpoint `embeddings`."""
from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.api.test_tenancy import freeze_quota, node, refresh

EMBED = {"task": "embed", "max_batch_size": 8, "max_num_tokens": 512,
         "sim": {"profile": "tiny", "time_scale": 1.0, "max_model_len": 256}}


async def test_a_flood_of_inputs_from_one_tenant_does_not_hold_up_another(tmp_path):
    async with node(tmp_path, model=EMBED) as n:
        flood, light = n.key("flood"), n.key("light")
        await refresh(n)
        engine = n.daemon.state.engines["sim"]
        batches, serving = [], asyncio.Event()
        inner = engine.batch_observer

        def observe(record) -> None:
            batches.append(record)
            inner(record)
            if len(batches) >= 3:                       # the flood is being served
                serving.set()

        engine.batch_observer = observe
        big = asyncio.ensure_future(n.sdk(flood).embeddings.create(model="sim", input=[f"t {i}" for i in range(800)]))
        await serving.wait()
        got = await n.sdk(light).embeddings.create(model="sim", input="me too")
        assert len(got.data) == 1
        assert not big.done() and len(batches) < 100    # served within a few batches, not after 100
        assert len((await big).data) == 800
        queued = n.tenancy.queue_for("sim", engine).snapshot()["queued"]
        assert queued == 0


async def test_quota_refuses_embeddings_with_429_and_every_request_is_a_ledger_row(tmp_path):
    async with node(tmp_path, model=EMBED, tenants={"acme": {"requests_per_minute": 2}}) as n:
        acme, ops = n.key("acme"), n.key("ops", "admin")
        await refresh(n)
        freeze_quota(n)
        ok = await n.sdk(acme).embeddings.create(model="sim", input=["one", "two words"])
        await n.sdk(acme).embeddings.create(model="sim", input="three")
        with pytest.raises(openai.RateLimitError) as exc:
            await n.sdk(acme).embeddings.create(model="sim", input="four")
        assert exc.value.body["code"] == "quota_rpm"
        async with n.http.get(n.url + "/admin/usage", params={"rows": "true", "format": "jsonl"},
                              headers={"Authorization": f"Bearer {ops}"}) as resp:
            rows = [json.loads(line) for line in (await resp.text()).splitlines()]
    assert [(r["endpoint"], r["status"], r["tenant"]) for r in rows] == [("embeddings", 200, "acme")] * 2
    assert rows[0]["prompt_tokens"] == ok.usage.prompt_tokens and rows[0]["completion_tokens"] == 0


async def test_a_request_let_in_is_not_refused_partway_by_its_tenants_queue_bound(tmp_path):
    # Eight inputs are in flight at once (the batch size) but a batch holds only a few (16 tokens), so
    # several wait in admission, beyond the tenant's queue bound of one: the first input is held to the
    # bound, the rest follow it in.
    async with node(tmp_path, model={**EMBED, "max_num_tokens": 16, "sim": {**EMBED["sim"], "time_scale": 5.0}},
                    tenants={"acme": {"max_queued_requests": 1}}) as n:
        acme = n.key("acme")
        await refresh(n)
        got = await n.sdk(acme).embeddings.create(model="sim", input=[f"input {i}" for i in range(40)])
        assert len(got.data) == 40
        assert n.tenancy.queue_for("sim", n.daemon.state.engines["sim"]).snapshot()["queued"] == 0
