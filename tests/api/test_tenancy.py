"""Tenancy through the real daemon: API keys and scopes, tenant quotas, the admission queue's bounds and
deadlines, as an OpenAI SDK client (or a raw HTTP client, for headers) sees them.

The daemon serves the sim engine's tiny profile with one sequence slot, so a single long stream keeps
the engine busy and whatever comes next waits in admission. Quota tests freeze the buckets' clock.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import openai
import pytest
from openai import AsyncOpenAI

from inferd.config.root import parse_config
from inferd.daemon.lifecycle import Daemon
from inferd.tenancy.keys import KeyHasher, create_key, revoke_key
from inferd.tenancy.quota import Quota
from tests.api.conftest import AdmissionEntries
from tests.daemon.harness import running_daemon, until

SIM = {"backend": "sim", "max_batch_size": 1, "max_num_tokens": 256, "num_kv_blocks": 256,
       "sim": {"profile": "tiny", "time_scale": 1.0, "max_model_len": 4096}}


class Node(msgspec.Struct, kw_only=True):
    daemon: Daemon
    url: str
    http: aiohttp.ClientSession
    keys_file: Path
    clients: list

    def sdk(self, key: str | None = "none") -> AsyncOpenAI:
        client = AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)
        self.clients.append(client)
        return client

    def key(self, tenant: str, *scopes: str) -> str:
        return create_key(self.keys_file, KeyHasher(None), tenant, scopes or ("inference",))[1]

    async def inference_keys(self, *tenants: str) -> list[str]:
        """An inference key per tenant, in effect at once (the daemon re-reads the keys file)."""
        keys = [self.key(t) for t in tenants]
        await refresh(self)
        return keys

    @property
    def tenancy(self):
        return self.daemon.state.tenancy

    def queued(self) -> int:
        return sum(q.snapshot()["queued"] for _, _, q in self.tenancy.queues())

    def admission_entries(self) -> AdmissionEntries:
        """Counts requests entering the sim's admission queue from now on (an event per entry)."""
        engine = self.daemon.state.engines["sim"]
        return AdmissionEntries(self.tenancy.queue_for("sim", engine))

    async def post_entered(self, entries: AdmissionEntries, key: str, body: dict) -> asyncio.Task:
        """Start a POST and return once it has entered admission (queued, or refused at its door)."""
        task = asyncio.ensure_future(post(self, key, body))
        await entries.reached(entries.count + 1)
        return task

    async def metrics(self, key: str | None = None) -> str:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with self.http.get(self.url + "/metrics", headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.text()


@contextlib.asynccontextmanager
async def node(tmp_path: Path, *, auth: str = "api_key", tenants: dict | None = None,
               admission: dict | None = None, models: tuple[str, ...] = ("sim",), model: dict | None = None,
               **server) -> AsyncIterator[Node]:
    raw = {"server": {"port": 0, "drain_grace_s": 0, **server}, "models": {m: {**SIM, **(model or {})} for m in models},
           "auth": {"mode": auth, "keys_file": "keys.jsonl"}, "tenants": tenants or {},
           "admission": admission or {}, "audit": {"path": "audit.jsonl"}}   # under tmp_path
    async with running_daemon(parse_config(raw, base_dir=tmp_path)) as (daemon, task, url), \
            aiohttp.ClientSession() as http:
        n = Node(daemon=daemon, url=url, http=http, keys_file=tmp_path / "keys.jsonl", clients=[])
        try:
            yield n
        finally:
            for client in n.clients:
                await client.close()
    assert task.result() in (0, 1)


async def refresh(n: Node) -> None:
    """Keys created or revoked while serving: the daemon re-reads the keys file (as on SIGHUP)."""
    await n.tenancy.refresh_keys()


def freeze_quota(n: Node) -> list[float]:
    """Replace the quota state with one on a clock the test moves (before any request)."""
    now = [1000.0]
    n.tenancy.quota = Quota(n.tenancy.tenants, clock=lambda: now[0])
    return now


async def hold_engine(n: Node, key: str, tokens: int = 3000) -> tuple[asyncio.Task, asyncio.Event]:
    """Start a long stream that occupies the engine's only slot; returns (task, first token seen)."""
    first = asyncio.Event()

    async def run() -> None:
        stream = await n.sdk(key).completions.create(model="sim", prompt="hold", max_tokens=tokens, stream=True)
        async for _ in stream:
            first.set()

    task = asyncio.ensure_future(run())
    await asyncio.wait({task, asyncio.ensure_future(first.wait())}, return_when=asyncio.FIRST_COMPLETED)
    assert first.is_set(), task.exception() if task.done() else "no token"
    return task, first


async def post(n: Node, key: str | None, body: dict, headers: dict | None = None) -> aiohttp.ClientResponse:
    h = {"Authorization": f"Bearer {key}"} if key else {}
    h.update(headers or {})
    resp = await n.http.post(n.url + "/v1/completions", json=body, headers=h)
    await resp.read()
    return resp


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def cancel(*tasks: asyncio.Task) -> None:
    for t in tasks:
        t.cancel()


# -- keys and scopes ------------------------------------------------------------------------------


async def test_missing_unknown_wrong_and_revoked_keys_get_401_with_a_bearer_challenge(tmp_path):
    async with node(tmp_path) as n:
        good = n.key("acme")
        await refresh(n)
        body = {"model": "sim", "prompt": "hi", "max_tokens": 2}
        missing = await post(n, None, body)
        assert missing.status == 401
        assert missing.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await missing.json())["error"]["code"] == "missing_api_key"
        key_id = good.split("_")[1]
        for bad in (good[:-4] + "AAAA",                 # right id, wrong secret
                    "inf_" + "0" * 12 + good[16:],      # unknown id
                    "sk-not-even-ours"):
            with pytest.raises(openai.AuthenticationError) as exc:
                await n.sdk(bad).completions.create(**body)
            assert exc.value.body["code"] == "invalid_api_key"
            assert exc.value.body["type"] == "invalid_request_error"
            assert exc.value.response.headers["WWW-Authenticate"].startswith("Bearer")
        ok = await n.sdk(good).completions.create(**body)
        assert ok.usage.completion_tokens == 2
        revoke_key(n.keys_file, key_id)
        await refresh(n)
        with pytest.raises(openai.AuthenticationError):
            await n.sdk(good).completions.create(**body)


async def test_scopes_guard_inference_and_metrics_and_health_stays_open(tmp_path):
    async with node(tmp_path) as n:
        inference, metrics_only = n.key("acme"), n.key("ops", "metrics")
        await refresh(n)
        with pytest.raises(openai.PermissionDeniedError) as exc:
            await n.sdk(metrics_only).completions.create(model="sim", prompt="hi", max_tokens=2)
        assert exc.value.body["code"] == "insufficient_scope"
        with pytest.raises(openai.PermissionDeniedError):
            await n.sdk(metrics_only).models.list()
        assert [m.id async for m in n.sdk(inference).models.list()] == ["sim"]
        for key, status in ((None, 401), (inference, 403)):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with n.http.get(n.url + "/metrics", headers=headers) as resp:
                assert resp.status == status
        assert "inferd_build_info" in await n.metrics(metrics_only)
        for path in ("/healthz", "/readyz"):
            async with n.http.get(n.url + path) as resp:
                assert resp.status == 200


async def test_tenant_comes_from_the_key_and_disallowed_models_get_403(tmp_path):
    tenants = {"acme": {"allowed_models": ["sim"]}}
    async with node(tmp_path, tenants=tenants, models=("sim", "sim2")) as n:
        acme, ops = n.key("acme"), n.key("ops", "metrics", "admin")
        await refresh(n)
        await n.sdk(acme).completions.create(model="sim", prompt="hi", max_tokens=2, user="someone-else")
        with pytest.raises(openai.PermissionDeniedError) as exc:
            await n.sdk(acme).completions.create(model="sim2", prompt="hi", max_tokens=2)
        assert exc.value.body["code"] == "model_not_allowed" and exc.value.body["param"] == "model"
        text = await n.metrics(ops)
        assert metric(text, "inferd_tenant_requests_total", tenant="acme", status="200") == 1
        assert metric(text, "inferd_tenant_requests_total", tenant="acme", status="403") == 1
        assert metric(text, "inferd_tenant_rejections_total", tenant="acme", reason="model_not_allowed") == 1
        assert "someone-else" not in text


async def test_auth_off_every_request_is_tenant_local(tmp_path):
    async with node(tmp_path, auth="none") as n:
        await n.sdk().completions.create(model="sim", prompt="hi", max_tokens=2)
        text = await n.metrics()
        assert metric(text, "inferd_tenant_requests_total", tenant="local", status="200") == 1


async def test_auth_off_on_a_non_loopback_address_refuses_to_start():
    from inferd.config.root import Config, ModelConfig, ServerConfig
    built = []

    def factory(*args, **kwargs):
        built.append(args)
        raise AssertionError("no engine may start")

    # 192.0.2.1 (TEST-NET-1) is never bound: the refusal comes before engines or sockets.
    cfg = Config(server=ServerConfig(host="192.0.2.1", port=0), models={"sim": ModelConfig(backend="sim")})
    assert await Daemon(cfg, engine_factory=factory).run() == 1
    assert built == []


# -- quotas ---------------------------------------------------------------------------------------


async def test_over_requests_per_minute_is_429_with_retry_after_from_the_bucket(tmp_path):
    async with node(tmp_path, tenants={"acme": {"requests_per_minute": 2}}) as n:
        acme, ops = n.key("acme"), n.key("ops", "metrics", "admin")
        await refresh(n)
        now = freeze_quota(n)
        body = {"model": "sim", "prompt": "hi", "max_tokens": 2}
        first = await post(n, acme, body)
        assert first.status == 200
        assert first.headers["X-RateLimit-Limit-Requests"] == "2"
        assert first.headers["X-RateLimit-Remaining-Requests"] == "1"
        assert (await post(n, acme, body)).status == 200
        with pytest.raises(openai.RateLimitError) as exc:
            await n.sdk(acme).completions.create(**body)
        resp = exc.value.response
        assert exc.value.body["code"] == "quota_rpm"
        assert resp.headers["Retry-After"] == "30"          # 2 per minute: one request's room every 30 s
        assert resp.headers["X-RateLimit-Remaining-Requests"] == "0"
        assert resp.headers["X-RateLimit-Reset-Requests"] == "1m0s"
        now[0] += 29.0
        assert (await post(n, acme, body)).headers["Retry-After"] == "1"
        now[0] += 1.0
        assert (await post(n, acme, body)).status == 200
        text = await n.metrics(ops)
        assert metric(text, "inferd_tenant_rejections_total", tenant="acme", reason="quota_rpm") == 2
        assert metric(text, "inferd_tenant_requests_total", tenant="acme", status="429") == 2


async def test_over_tokens_per_minute_is_429_and_unused_tokens_are_refunded(tmp_path):
    async with node(tmp_path, tenants={"acme": {"tokens_per_minute": 600}}) as n:   # 10 tokens/s
        acme = n.key("acme")
        await refresh(n)
        freeze_quota(n)
        # The sim's words start with a space: stop=" " ends it after its first token, far below max_tokens.
        first = await post(n, acme, {"model": "sim", "prompt": "hi", "max_tokens": 300, "stop": [" "]})
        usage = (await first.json())["usage"]
        assert usage["completion_tokens"] < 300
        charged = usage["prompt_tokens"] + 300
        assert first.headers["X-RateLimit-Remaining-Tokens"] == str(600 - charged)   # charged up front
        level = 600 - usage["total_tokens"]                  # the unused part came back at completion
        assert n.tenancy.quota.headers("acme")["X-RateLimit-Remaining-Tokens"] == str(level)
        second = await n.sdk(acme).completions.create(model="sim", prompt="hi", max_tokens=250)
        level -= second.usage.total_tokens
        # A request 50 tokens bigger than what is left: room in 50 / 10 = 5 s (the clock is frozen).
        prompt = usage["prompt_tokens"]
        with pytest.raises(openai.RateLimitError) as exc:
            await n.sdk(acme).completions.create(model="sim", prompt="hi", max_tokens=level + 50 - prompt)
        assert exc.value.body["code"] == "quota_tpm"
        assert exc.value.response.headers["Retry-After"] == "5"
        assert exc.value.response.headers["X-RateLimit-Remaining-Tokens"] == str(level)
        # More than the whole bucket could ever hold: 400, not a 429 to retry forever.
        with pytest.raises(openai.BadRequestError) as exc:
            await n.sdk(acme).completions.create(model="sim", prompt="hi", max_tokens=700)
        assert exc.value.body["code"] == "request_too_large"


async def test_tenant_output_cap_is_the_default_max_tokens_and_a_larger_request_is_400(tmp_path):
    async with node(tmp_path, auth="none", tenants={"local": {"max_output_tokens": 5}}) as n:
        chat = await n.sdk().chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}])
        assert chat.usage.completion_tokens <= 5
        with pytest.raises(openai.BadRequestError) as exc:
            await n.sdk().chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}],
                                                  max_completion_tokens=6)
        assert exc.value.body["param"] == "max_completion_tokens"


# -- admission: bounds, shedding, deadlines -------------------------------------------------------


async def test_full_tenant_queue_is_429_and_full_node_is_503_at_once(tmp_path):
    tenants = {"a": {"max_queued_requests": 1}, "b": {}, "c": {}}
    async with node(tmp_path, tenants=tenants, admission={"max_queued_requests": 2}) as n:
        a, b, c = await n.inference_keys("a", "b", "c")
        holder, _ = await hold_engine(n, a)
        entries = n.admission_entries()
        body = {"model": "sim", "prompt": "x", "max_tokens": 4}
        queued_a = await n.post_entered(entries, a, body)
        assert n.queued() == 1
        # Refused at the door, not after waiting out the ~7 s hold: a queued request that waits too
        # long ends 503 ttl or 504, never 429 queue_full (or 503 node_full for a standard newcomer).
        full = await post(n, a, body)
        assert full.status == 429 and (await full.json())["error"]["code"] == "queue_full"
        assert int(full.headers["Retry-After"]) >= 1
        queued_b = await n.post_entered(entries, b, body)
        assert n.queued() == 2
        node_full = await post(n, c, body)
        assert node_full.status == 503 and (await node_full.json())["error"]["code"] == "node_full"
        assert int(node_full.headers["Retry-After"]) >= 1
        cancel(holder, queued_a, queued_b)


async def test_node_full_sheds_queued_batch_work_before_interactive(tmp_path):
    tenants = {"bulk": {"priority": "batch"}, "chat": {"priority": "interactive"}}
    async with node(tmp_path, tenants=tenants, admission={"max_queued_requests": 1}) as n:
        bulk, chat = await n.inference_keys("bulk", "chat")
        holder, _ = await hold_engine(n, chat)
        entries = n.admission_entries()
        body = {"model": "sim", "prompt": "x", "max_tokens": 4}
        batch_req = await n.post_entered(entries, bulk, body)
        assert n.queued() == 1
        interactive = asyncio.ensure_future(post(n, chat, body))
        shed = await batch_req
        assert shed.status == 503 and (await shed.json())["error"]["code"] == "node_full"
        assert "Retry-After" in shed.headers
        assert n.queued() == 1          # the interactive request took its place as it entered (shedding the other)
        assert not interactive.done()
        cancel(holder, interactive)


async def test_a_deadline_the_queue_cannot_meet_is_refused_at_once(tmp_path):
    async with node(tmp_path, tenants={"a": {}}) as n:
        (a,) = await n.inference_keys("a")
        holder, _ = await hold_engine(n, a)
        entries = n.admission_entries()
        body = {"model": "sim", "prompt": "x", "max_tokens": 1000}
        backlog = [await n.post_entered(entries, a, body) for _ in range(2)]
        assert n.queued() == 2
        queue = n.tenancy.queue_for("sim", n.daemon.state.engines["sim"])

        async def capacity_measured() -> bool:      # only a measured capacity refuses early
            return bool(queue._estimate.measured_rate)
        await until(capacity_measured, "admission to measure the engine's capacity while work waits")
        # Refused at once from the wait estimate: a 429 (its own backlog) with code deadline, not the
        # 504 of a request dropped when its deadline passed in the queue.
        with pytest.raises(openai.RateLimitError) as exc:
            await n.sdk(a).completions.create(model="sim", prompt="x", max_tokens=10,
                                              extra_headers={"X-Request-Timeout": "0.5"})
        assert exc.value.body["code"] == "deadline"
        assert int(exc.value.response.headers["Retry-After"]) >= 1
        cancel(holder, *backlog)


async def test_a_deadline_passing_mid_generation_ends_the_stream_and_frees_its_blocks(tmp_path):
    async with node(tmp_path, auth="none") as n:
        engine = n.daemon.state.engines["sim"]
        stream = await n.sdk().completions.create(model="sim", prompt="x", max_tokens=3000, stream=True,
                                                  extra_headers={"X-Request-Timeout": "1.0"})
        text = []
        with pytest.raises(openai.APIError) as exc:
            async for chunk in stream:
                text.append(chunk.choices[0].text if chunk.choices else "")
        # cut by it: 3000 tokens at 2.5 ms take 7.5 s and would end "length"; 1 s leaves a loaded
        # machine time to start the stream (a 504 in the queue is another test's subject)
        assert exc.value.body["code"] == "deadline_exceeded"
        assert "".join(text)                                 # it did generate before the deadline
        # the sim frees an aborted request's blocks in abort() itself: free once the request has ended
        assert await n.daemon.state.wait_idle(timeout=1.0)
        assert engine.stats().kv_blocks_used == 0
        with pytest.raises(openai.APIStatusError) as exc:    # non-streamed, the body's `timeout`: 504
            await n.sdk().completions.create(model="sim", prompt="x", max_tokens=3000,
                                             extra_body={"timeout": 1.0})
        assert exc.value.status_code == 504
        assert await n.daemon.state.wait_idle(timeout=1.0)
        assert engine.stats().kv_blocks_used == 0
        # both count as 504, the streamed one too (the SDK hangs up as soon as it reads the final chunk)
        text = await n.metrics()
        assert metric(text, "inferd_tenant_requests_total", tenant="local", status="504") == 2
        assert metric(text, "inferd_tenant_requests_total", tenant="local", status="499") == 0


async def test_admission_keeps_the_engines_own_queue_at_a_small_constant(tmp_path):
    async with node(tmp_path, tenants={"a": {}, "b": {}, "c": {}}, model={"max_batch_size": 16}) as n:
        keys = await n.inference_keys("a", "b", "c")
        engine = n.daemon.state.engines["sim"]
        waiting_after_submit = []
        submit = engine.submit

        def observed_submit(request):
            stream = submit(request)
            waiting_after_submit.append(engine.stats().waiting)
            return stream

        engine.submit = observed_submit
        body = {"model": "sim", "prompt": "x", "max_tokens": 8}
        answers = await asyncio.gather(*(post(n, keys[i % 3], body) for i in range(48)))
        assert [r.status for r in answers] == [200] * 48
        assert len(waiting_after_submit) == 48
        limit = n.daemon.state.config.admission.max_engine_waiting
        assert max(waiting_after_submit) <= limit          # the rest waited in admission, fairly
        assert n.queued() == 0


async def test_bad_request_timeout_header_is_400_naming_it(tmp_path):
    async with node(tmp_path, auth="none") as n:
        resp = await post(n, None, {"model": "sim", "prompt": "x", "max_tokens": 2}, {"X-Request-Timeout": "soon"})
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "X-Request-Timeout"



async def test_models_list_shows_only_the_models_the_tenant_may_use(tmp_path):
    async with node(tmp_path, tenants={"narrow": {"allowed_models": ["m1"]}, "wide": {}}, models=("m1", "m2")) as n:
        narrow, wide = n.key("narrow"), n.key("wide")
        await refresh(n)
        assert [m.id for m in (await n.sdk(narrow).models.list()).data] == ["m1"]
        assert [m.id for m in (await n.sdk(wide).models.list()).data] == ["m1", "m2"]
        with pytest.raises(openai.PermissionDeniedError):       # and what is not listed is refused
            await n.sdk(narrow).completions.create(model="m2", prompt="x", max_tokens=1)


async def test_without_auth_one_client_streams_300_at_once_with_no_429_and_the_node_queue_still_bounds(tmp_path):
    """auth "none": every request is `local`, whose per-tenant caps (64 concurrent, 256 queued) would refuse an
    async SDK client's burst; the node's admission queue is the bound instead."""
    fast = {"sim": {"profile": "tiny", "time_scale": 0.0, "max_model_len": 4096}, "max_batch_size": 8}
    async with node(tmp_path, auth="none", model=fast, admission={"max_queued_requests": 1000}) as n:
        sdk = n.sdk()

        async def one() -> int:
            stream = await sdk.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}],
                                                       max_tokens=4, stream=True)
            return len([c async for c in stream])
        counts = await asyncio.gather(*(one() for _ in range(300)))
        assert all(c > 0 for c in counts)
    async with node(tmp_path / "capped", auth="none", model=fast,
                    tenants={"local": {"max_concurrent_requests": 2}}) as n:   # a cap set by name still holds
        assert n.tenancy.tenants.get("local").max_concurrent_requests == 2
