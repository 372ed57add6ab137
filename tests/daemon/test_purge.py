"""inferd.daemon.purge through the real daemon: what outlived its period is deleted on the purge's schedule."""
from __future__ import annotations

import asyncio
import time

import aiohttp

from inferd.config.root import load_config
from tests.daemon.harness import running_daemon, sim_model, write_config

BODY = {"model": "sim", "prompt": "hello there", "max_tokens": 5, "temperature": 0}
WAIT_S = 10.0


async def records(daemon) -> list[tuple]:
    """(key, state, whether a response is kept) for every Idempotency-Key record in the store."""
    return [tuple(row) for row in await daemon.state.store.query(
        "SELECT idem_key, state, body IS NOT NULL FROM idempotency ORDER BY idem_key")]


async def test_an_expired_idempotency_record_and_its_kept_response_are_gone_after_the_purge_runs(tmp_path):
    cfg = load_config(write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)}))
    async with running_daemon(cfg, purge_every_s=0.01) as (daemon, _, url), aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json=BODY, headers={"Idempotency-Key": "k-1"}) as resp:
            assert resp.status == 200
        purger = daemon.purger
        await asyncio.wait_for(purger.next_pass(), WAIT_S)
        assert await records(daemon) == [("k-1", "done", 1)]      # not expired: kept for replay
        ttl_s = cfg.store.idempotency_ttl_s
        purger.clock = lambda: time.time() + ttl_s + 60            # a minute past its TTL
        await asyncio.wait_for(purger.next_pass(), WAIT_S)
        assert await records(daemon) == []
        async with http.post(url + "/v1/completions", json=BODY, headers={"Idempotency-Key": "k-1"}) as resp:
            assert resp.status == 200 and "Idempotent-Replayed" not in resp.headers     # runs afresh


async def test_a_stored_response_past_its_tenants_retention_is_gone_after_the_purge_runs(tmp_path):
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)},
                        '[tenants.local]\nretention = "1h"\n')
    body = {"model": "sim", "input": "keep me", "max_output_tokens": 3}
    async with running_daemon(load_config(path), purge_every_s=0.01) as (daemon, _, url), \
            aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/responses", json=body) as resp:
            made = await resp.json()
        purger = daemon.purger
        await asyncio.wait_for(purger.next_pass(), WAIT_S)
        assert await daemon.state.store.query("SELECT id FROM responses") == [(made["id"],)]
        purger.clock = lambda: time.time() + 3600 + 60             # a minute past its period
        await asyncio.wait_for(purger.next_pass(), WAIT_S)
        assert await daemon.state.store.query("SELECT id FROM responses") == []
