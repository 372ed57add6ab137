"""Retention through the real daemon: no text is kept by default; a tenant with a period gets its
prompts and completions kept for it, and expired ones are purged."""
from __future__ import annotations

import asyncio
import time

from openai import AsyncOpenAI

from inferd.daemon.purge import purge_transcripts
from tests.daemon.harness import running, sim_model, until, write_config


async def test_text_is_kept_only_for_a_tenant_with_a_retention_period(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()})
    async with running(path) as (daemon, url):
        transcripts = daemon.state.transcripts
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            await sdk.completions.create(model="small", prompt="not kept", max_tokens=4)
            path.write_text(path.read_text() + '[tenants.local]\nretention = "1h"\n')
            assert (await daemon.reload()).ok
            kept = await sdk.chat.completions.create(model="small", max_tokens=5, stream=True, messages=[
                {"role": "user", "content": "please keep this"}])
            text = "".join([c.choices[0].delta.content or "" async for c in kept if c.choices])

        async def written() -> bool:
            return bool(await transcripts.for_tenant("local", time.time()))
        await until(written, "the transcript written")
        rows = await transcripts.for_tenant("local", time.time())
    assert [(r.prompt, r.completion) for r in rows] == [("please keep this", text)]
    assert 3599 < rows[0].expires_at - rows[0].created_at <= 3600


async def test_expired_transcripts_are_purged_by_the_background_task(tmp_path):
    path = write_config(tmp_path / "c.toml", {"small": sim_model()}, '[tenants.local]\nretention = "1m"\n')
    async with running(path) as (daemon, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            await sdk.completions.create(model="small", prompt="short-lived", max_tokens=3)
        transcripts = daemon.state.transcripts

        async def written() -> bool:
            return bool(await transcripts.for_tenant("local", time.time()))
        await until(written, "the transcript written")
        later = lambda: time.time() + 61                   # noqa: E731 - a minute on: its retention is over
        purger = asyncio.ensure_future(purge_transcripts(transcripts, every_s=3600, clock=later))
        await until(lambda: _empty(transcripts, time.time() - 120), "the expired transcript purged")
        purger.cancel()


async def _empty(transcripts, since: float) -> bool:
    return not await transcripts.for_tenant("local", since)
