"""inferd.api.pipeline.idempotency through the real daemon (SQLite store in its state directory) and the openai SDK."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import aiohttp
from aiohttp import web
from openai import AsyncOpenAI

from inferd.api.pipeline.idempotency import CAPTURE, Capture, settle
from inferd.config.root import load_config
from tests.daemon.harness import running_daemon, sim_model, write_config
from tests.pg_server import pg_dsn, pg_server  # noqa: F401  (fixtures: a throwaway PostgreSQL server)

BODY = {"model": "sim", "prompt": "hello there", "max_tokens": 5, "temperature": 0}


def config(tmp_path, time_scale: float = 0.0, extra: str = ""):
    return load_config(write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=time_scale)}, extra))


async def post(http, url, body, key, **headers):
    async with http.post(url + "/v1/completions", json=body, headers={"Idempotency-Key": key, **headers}) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_a_replay_returns_the_stored_response_and_runs_nothing(tmp_path):
    async with running_daemon(config(tmp_path)) as (daemon, _, url), aiohttp.ClientSession() as http:
        status, headers, body = await post(http, url, BODY, "k-1")
        assert status == 200 and "Idempotent-Replayed" not in headers
        engine = daemon.state.engines["sim"]
        steps = engine.stats().steps_total
        again = await post(http, url, BODY, "k-1")
        assert again[0] == 200 and again[1]["Idempotent-Replayed"] == "true" and again[2] == body
        assert engine.stats().steps_total == steps               # nothing ran
        assert (await post(http, url, {**BODY, "max_tokens": 6}, "k-1"))[0] == 422
        other = await post(http, url, BODY, "k-2")               # another key runs again: a new id
        assert other[0] == 200 and other[2] != body


async def test_the_sdk_gets_the_same_completion_back_and_a_stream_replays_as_the_same_stream(tmp_path):
    async with running_daemon(config(tmp_path)) as (_, _, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            first = await sdk.completions.create(**BODY, extra_headers={"Idempotency-Key": "sdk-1"})
            second = await sdk.completions.create(**BODY, extra_headers={"Idempotency-Key": "sdk-1"})
            assert second.id == first.id and second.choices[0].text == first.choices[0].text
            chunks = [c async for c in await sdk.completions.create(
                **BODY, stream=True, extra_headers={"Idempotency-Key": "sdk-2"})]
            again = [c async for c in await sdk.completions.create(
                **BODY, stream=True, extra_headers={"Idempotency-Key": "sdk-2"})]
            assert [c.model_dump() for c in again] == [c.model_dump() for c in chunks]


async def test_a_replay_of_n_choices_returns_every_choice_as_first_answered(tmp_path):
    async with running_daemon(config(tmp_path)) as (_, _, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            body = {**BODY, "n": 3, "temperature": 1.0}
            first = await sdk.completions.create(**body, extra_headers={"Idempotency-Key": "n-1"})
            second = await sdk.completions.create(**body, extra_headers={"Idempotency-Key": "n-1"})
            assert len(first.choices) == 3 and second.model_dump() == first.model_dump()
            chunks = [c async for c in await sdk.completions.create(
                **body, stream=True, extra_headers={"Idempotency-Key": "n-2"})]
            again = [c async for c in await sdk.completions.create(
                **body, stream=True, extra_headers={"Idempotency-Key": "n-2"})]
            assert {c.choices[0].index for c in chunks if c.choices} == {0, 1, 2}
            assert [c.model_dump() for c in again] == [c.model_dump() for c in chunks]


async def test_a_key_in_flight_is_409_and_a_malformed_key_is_400(tmp_path):
    slow = {**BODY, "max_tokens": 200, "ignore_eos": True}
    async with running_daemon(config(tmp_path, time_scale=1.0)) as (daemon, _, url), aiohttp.ClientSession() as http:
        first = asyncio.ensure_future(post(http, url, slow, "busy"))
        engine = daemon.state.engines["sim"]
        for _ in range(500):                                      # until the first runs (it holds the key)
            if engine.stats().running:
                break
            await asyncio.sleep(0.01)
        status, headers, body = await post(http, url, slow, "busy")
        assert status == 409 and headers["Retry-After"] == "1" and b"idempotency_key_in_flight" in body
        assert (await first)[0] == 200
        assert (await post(http, url, slow, "busy"))[1]["Idempotent-Replayed"] == "true"
        status, _, body = await post(http, url, BODY, "bad key with spaces")
        assert status == 400 and b'"param":"Idempotency-Key"' in body


async def test_a_key_held_past_its_holders_deadline_says_when_it_lapses_and_another_nodes_claim_stays(tmp_path):
    """Past the first attempt's deadline only a dead holder still holds the key (here one on another node,
    which a restart of this node does not release): Retry-After is the time until its claim lapses."""
    import hashlib
    import time

    raw = json.dumps(BODY).encode()
    cfg = config(tmp_path)
    async with running_daemon(cfg) as (daemon, _, url):
        await daemon.state.idempotency.claim("local", "orphan", hashlib.sha256(raw).digest(),
                                             "peer-node/4242/b0.1/req-1", now=time.time(), hold_s=60.0, ttl_s=120.0)
    async with running_daemon(cfg) as (_, _, url), aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", data=raw, headers={
                "Idempotency-Key": "orphan", "Content-Type": "application/json"}) as resp:
            assert resp.status == 409 and 1 < int(resp.headers["Retry-After"]) <= 60


async def test_a_refused_first_attempt_releases_the_key_so_the_retry_runs(tmp_path):
    limited = "[tenants.local]\nmax_output_tokens = 4\n"
    async with running_daemon(config(tmp_path, extra=limited)) as (_, _, url), aiohttp.ClientSession() as http:
        status, _, _ = await post(http, url, BODY, "retry-me")       # max_tokens 5 > the tenant's 4: 400
        assert status == 400
        status, headers, _ = await post(http, url, {**BODY, "max_tokens": 4}, "retry-me")
        assert status == 200 and "Idempotent-Replayed" not in headers


async def test_keys_survive_a_restart(tmp_path):
    cfg = config(tmp_path)
    async with running_daemon(cfg) as (_, _, url), aiohttp.ClientSession() as http:
        first = await post(http, url, BODY, "durable")
    async with running_daemon(cfg) as (_, _, url), aiohttp.ClientSession() as http:
        again = await post(http, url, BODY, "durable")
    assert again[1]["Idempotent-Replayed"] == "true" and again[2] == first[2]


async def test_creating_a_batch_twice_with_one_key_gives_the_same_batch(tmp_path):
    import json

    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": BODY}) + "\n"
    async with running_daemon(config(tmp_path), run_batches=False) as (_, _, url):
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            made = await sdk.files.create(file=("in.jsonl", line.encode()), purpose="batch")
            create = dict(input_file_id=made.id, endpoint="/v1/completions", completion_window="24h",
                          extra_headers={"Idempotency-Key": "nightly-2026-11-24"})
            first = await sdk.batches.with_raw_response.create(**create)
            again = await sdk.batches.with_raw_response.create(**create)
            assert again.headers["Idempotent-Replayed"] == "true"
            assert again.parse().id == first.parse().id
            assert len((await sdk.batches.list()).data) == 1


class _RecordingStore:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def release(self, tenant, key, owner) -> None:
        self.calls.append("release")

    async def finish(self, tenant, key, owner, stored, *, now, ttl_s) -> None:
        self.calls.append("finish")


async def test_a_stream_that_ended_in_an_error_frame_is_not_kept_for_replay():
    """Only a stream that got its `[DONE]` is stored; one cut short (a bug, a ledger row that could not
    be committed) releases its key, so the retry runs."""
    for tail, kept in ((b'data: {"error": {"code": "store_unavailable"}}\n\n', "release"),
                       (b"data: [DONE]\n\n", "finish")):
        capture = Capture("k", "local", "owner")
        capture.add(b'data: {"choices": []}\n\n')
        capture.add(tail)
        state = SimpleNamespace(idempotency=_RecordingStore(),
                                config=SimpleNamespace(store=SimpleNamespace(idempotency_ttl_s=60.0)))
        await settle({CAPTURE: capture}, state, web.StreamResponse(status=200))
        assert state.idempotency.calls == [kept]


async def test_a_structured_output_request_replays_and_one_whose_grammar_is_refused_releases_its_key(tmp_path):
    guided = {**BODY, "max_tokens": 16, "structured_outputs": {"choice": ["yes", "no"]}}
    async with running_daemon(config(tmp_path)) as (_, _, url), aiohttp.ClientSession() as http:
        first = await post(http, url, guided, "g-1")
        again = await post(http, url, guided, "g-1")
        refused = await post(http, url, {**BODY, "structured_outputs": {"regex": "(unclosed"}}, "g-2")
        retried = await post(http, url, {**BODY, "structured_outputs": {"regex": "(unclosed"}}, "g-2")
    assert first[0] == 200 and json.loads(first[2])["choices"][0]["text"] in ("yes", "no")
    assert again[1]["Idempotent-Replayed"] == "true" and again[2] == first[2]
    assert refused[0] == retried[0] == 400 and "Idempotent-Replayed" not in retried[1]


async def test_a_claim_that_timed_out_behind_a_slow_postgres_does_not_hold_the_key_for_the_retry(
        tmp_path, pg_server, pg_dsn):  # noqa: F811
    import psycopg

    store = f'[store]\nbackend = "postgres"\ndsn = "{pg_dsn}"\ntimeout_s = 10\n'
    async with running_daemon(config(tmp_path, extra=store)) as (_, _, url), aiohttp.ClientSession() as http:
        locker = await psycopg.AsyncConnection.connect(pg_dsn)
        try:
            await locker.execute("LOCK TABLE idempotency IN EXCLUSIVE MODE")    # the claim waits on it
            status, _, body = await post(http, url, BODY, "slow-1", **{"X-Request-Timeout": "1"})
            assert status == 503 and json.loads(body)["error"]["code"] == "store_unavailable"
        finally:
            await locker.rollback()         # well within timeout_s: a claim left running would commit now
            await locker.close()
        status, headers, body = await post(http, url, BODY, "slow-1")
        assert status == 200, body          # not 409 for the claim's hold (the request's deadline + 60 s)
