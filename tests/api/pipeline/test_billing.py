"""What the ledger bills (inferd.api.pipeline.billing), through the real daemon: what the client received."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from inferd.config.root import load_config
from tests.api.conftest import AdmissionEntries
from tests.api.pipeline.test_usage import PRICES, rows
from tests.daemon.harness import running_daemon, sim_model, until, write_config

LONG = {"model": "sim", "prompt": "hello there", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}


def config(tmp_path, *, time_scale: float = 1.0, max_batch_size: int = 8, drain_grace_s: float = 10.0):
    return load_config(write_config(tmp_path / "inferd.toml",
                                    {"sim": sim_model(time_scale=time_scale, max_batch_size=max_batch_size)},
                                    PRICES, drain_grace_s=drain_grace_s))


def generating(engine):
    async def check() -> bool:
        return engine.stats().generation_tokens_total > 0
    return check


async def settled_rows(http, url, n: int) -> list[dict]:
    for _ in range(500):
        got = await rows(http, url)
        if len(got) >= n:
            return got
        await asyncio.sleep(0.02)
    raise AssertionError(f"expected {n} ledger rows, got {got}")


async def test_a_non_streamed_request_past_its_deadline_is_billed_no_completion_tokens(tmp_path):
    async with running_daemon(config(tmp_path)) as (_, _, url), aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json=LONG, headers={"X-Request-Timeout": "0.5"}) as resp:
            assert resp.status == 504, await resp.text()
        [row] = await settled_rows(http, url, 1)
        assert row["status"] == 504 and row["completion_tokens"] == 0 and row["prompt_tokens"] == 0
        assert row["cost"] == 0


async def test_a_request_abandoned_while_queued_gets_a_499_row_with_no_tokens(tmp_path):
    async with running_daemon(config(tmp_path, max_batch_size=1)) as (daemon, _, url), \
            aiohttp.ClientSession() as http:
        engine = daemon.state.engines["sim"]
        entries = AdmissionEntries(daemon.state.tenancy.queue_for("sim", engine))
        holder = await http.post(url + "/v1/completions", json={**LONG, "stream": True})
        await holder.content.readline()             # running: it holds the engine's only slot
        queued = asyncio.ensure_future(http.post(url + "/v1/completions", json={**LONG, "max_tokens": 5}))
        await entries.reached(2)
        queued.cancel()                             # the client hangs up while its request waits
        got = await settled_rows(http, url, 1)
        holder.close()
        [row] = got
        assert row["status"] == 499 and row["completion_tokens"] == 0 and row["prompt_tokens"] == 0


async def test_a_stream_abandoned_while_queued_gets_a_499_row_with_no_tokens(tmp_path):
    async with running_daemon(config(tmp_path, max_batch_size=1)) as (daemon, _, url), \
            aiohttp.ClientSession() as http:
        engine = daemon.state.engines["sim"]
        entries = AdmissionEntries(daemon.state.tenancy.queue_for("sim", engine))
        holder = await http.post(url + "/v1/completions", json={**LONG, "max_tokens": 1900, "stream": True})
        await holder.content.readline()             # running: it holds the engine's only slot
        queued = await http.post(url + "/v1/completions", json={**LONG, "max_tokens": 5, "stream": True})
        await entries.reached(2)                    # its headers went out while it waits in admission
        queued.close()
        got = await settled_rows(http, url, 1)
        holder.close()
        [row] = got
        assert row["status"] == 499 and row["completion_tokens"] == 0 and row["prompt_tokens"] == 0


async def test_a_non_streamed_request_aborted_at_drain_is_billed_no_completion_tokens(tmp_path):
    cfg = config(tmp_path, drain_grace_s=0.05)
    async with running_daemon(cfg, drain=True) as (daemon, task, url), aiohttp.ClientSession() as http:
        engine = daemon.state.engines["sim"]
        entries = AdmissionEntries(daemon.state.tenancy.queue_for("sim", engine))
        running = asyncio.ensure_future(http.post(url + "/v1/completions", json=LONG))
        await entries.reached(1)
        await until(generating(engine), "the request to be generating")
        daemon.request_stop()
        resp = await running
        assert resp.status == 503 and (await resp.json())["error"]["code"] == "request_aborted"
        assert await task == 0
    async with running_daemon(config(tmp_path)) as (_, _, url), aiohttp.ClientSession() as http:
        [row] = await rows(http, url)
        assert row["status"] == 503 and row["completion_tokens"] == 0 and row["prompt_tokens"] == 0


# Deadlines that fall at different points between two watchdog scans (every 0.25 s): the bill is read when the
# stream ends, not at the last scan.
@pytest.mark.parametrize("timeout_s", ["0.5", "0.2"])
async def test_a_stream_cut_by_its_deadline_is_504_billed_for_the_tokens_its_client_received(tmp_path, timeout_s):
    async with running_daemon(config(tmp_path)) as (_, _, url), aiohttp.ClientSession() as http:
        body = {**LONG, "stream": True, "logprobs": 1}
        per_frame = []
        async with http.post(url + "/v1/completions", json=body, headers={"X-Request-Timeout": timeout_s}) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    if chunk.get("choices"):
                        per_frame.append(len((chunk["choices"][0].get("logprobs") or {}).get("tokens", [])))
                    assert chunk.get("error", {}).get("code") in (None, "deadline_exceeded")
        [row] = await settled_rows(http, url, 1)
        received = sum(per_frame)
        assert row["status"] == 504 and row["stream"] and 0 < received < LONG["max_tokens"]
        # counted once acknowledged: all but the final frames, which go out as the row is written
        assert received - per_frame[-1] <= row["completion_tokens"] <= received
        assert row["prompt_tokens"] > 0
