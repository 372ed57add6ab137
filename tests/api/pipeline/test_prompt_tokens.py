"""api/pipeline/prompt_tokens.py through the app: cheap refusals come before any tokenization, and long prompts are
tokenized in a pool of fixed size that drops work whose client left.

The sim engine's tokenizer cannot list its vocabulary, so its bound is MAX_CHARS_PER_TOKEN; the
synthetic byte-level tokenizer's is its longest entry. Tokenizer calls are counted by wrapping
`encode`; blocked workers wait on threading events the test sets.
"""
from __future__ import annotations

import asyncio
import math
import threading

import pytest

from inferd.api.pipeline import prompt_tokens as tokenize
from inferd.api.pipeline.prompt_tokens import MAX_CHARS_PER_TOKEN, TokenizerPool, chars_per_token
from inferd.config.tenants import TenantConfig
from tests.api.conftest import Served, metric_value

CONTEXT = 512                                   # the sim engine's max_model_len in conftest
OVERSIZED = "x" * (CONTEXT * MAX_CHARS_PER_TOKEN)   # at least CONTEXT tokens, whatever the tokenizer


_WRAPPED: list = []


@pytest.fixture(autouse=True)
def _unwrap_tokenizers():
    """Put every wrapped encode back after the test: the sim engines share one tokenizer per vocabulary
    size, so a wrapper left behind (its loop closed) would answer a later test's long prompt with a 500."""
    yield
    while _WRAPPED:
        wrapper = _WRAPPED.pop()
        wrapper.tok.encode = wrapper._encode


class CountedEncode:
    """Wraps a tokenizer's encode: records every text; texts longer than `block_over` wait for `release`."""

    def __init__(self, tok, block_over: int | None = None) -> None:
        self.texts: list[str] = []
        self.release = threading.Event()
        self.started = asyncio.Event()      # set (on the loop) whenever a blocked call starts
        self.blocked = 0
        self._loop = asyncio.get_running_loop()
        self._encode = tok.encode
        self._block_over = block_over
        self.tok = tok
        tok.encode = self
        _WRAPPED.append(self)

    def __call__(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.texts.append(text)
        if self._block_over is not None and len(text) > self._block_over:
            self._loop.call_soon_threadsafe(self._started)
            assert self.release.wait(10), "the test never released the worker"
        return self._encode(text, add_special_tokens=add_special_tokens)

    def _started(self) -> None:
        self.blocked += 1
        self.started.set()

    async def blocked_reached(self, n: int) -> None:
        while self.blocked < n:
            self.started.clear()
            await asyncio.wait_for(self.started.wait(), 5)


class WatchedPool(TokenizerPool):
    """A test's own pool, with an event on every submit and every job dropped before it ran."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.changed = asyncio.Event()
        self.dropped = 0
        self._loop = asyncio.get_running_loop()

    def submit(self, work):
        fut = super().submit(work)      # counted in `queued` before it returns
        self.changed.set()
        return fut

    def _cancelled(self, fut) -> None:
        super()._cancelled(fut)
        if fut.cancelled():
            self._loop.call_soon_threadsafe(self._dropped)

    def _dropped(self) -> None:
        self.dropped += 1
        self.changed.set()

    async def until(self, test) -> None:
        while not test():
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)


@pytest.fixture
async def pool(monkeypatch):
    p = WatchedPool(2)
    monkeypatch.setattr(tokenize, "POOL", p)
    yield p
    p.shutdown()


async def post(served: Served, path: str, body: dict, **headers: str):
    async with served.http.post(served.base_url + path, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_a_prompt_far_over_the_context_is_refused_from_its_length_without_tokenizing(served: Served):
    calls = CountedEncode(served.engine.tokenizer)
    status, body = await post(served, "/v1/completions", {"model": "sim", "prompt": OVERSIZED})
    assert status == 400
    err = body["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert "judged from its length" in err["message"] and f"context is {CONTEXT} tokens" in err["message"]
    status, body = await post(served, "/v1/chat/completions",
                              {"model": "sim", "messages": [{"role": "system", "content": "be brief"},
                                                            {"role": "user", "content": OVERSIZED}]})
    assert (status, body["error"]["code"], body["error"]["param"]) == (400, "context_length_exceeded", "messages")
    # A list of prompts: one oversized part refuses the request before any part is tokenized.
    status, body = await post(served, "/v1/completions", {"model": "sim", "prompt": ["hi", OVERSIZED]})
    assert (status, body["error"]["code"]) == (400, "context_length_exceeded")
    assert calls.texts == []


async def test_a_long_prompt_under_the_bound_is_tokenized_and_judged_exactly(served: Served):
    calls = CountedEncode(served.engine.tokenizer)
    prompt = "x" * (CONTEXT * MAX_CHARS_PER_TOKEN - MAX_CHARS_PER_TOKEN)   # could still be CONTEXT - 1 tokens
    status, body = await post(served, "/v1/completions", {"model": "sim", "prompt": prompt})
    assert (status, body["error"]["code"]) == (400, "context_length_exceeded")
    assert "judged from its length" not in body["error"]["message"]
    assert calls.texts == [prompt]
    # Whitespace a chat template may trim does not count towards the bound: it is tokenized too.
    spaces = " " * len(OVERSIZED)
    status, body = await post(served, "/v1/chat/completions",
                              {"model": "sim", "messages": [{"role": "user", "content": "hi" + spaces}]})
    assert status == 400 and "judged from its length" not in body["error"]["message"]
    assert len(calls.texts) == 2


async def test_token_id_prompts_over_the_context_are_refused_before_the_vocabulary_scan(served: Served):
    status, body = await post(served, "/v1/completions", {"model": "sim", "prompt": [10**9] * CONTEXT})
    assert (status, body["error"]["code"]) == (400, "context_length_exceeded")    # not invalid_token_id


async def test_a_tenant_over_its_rate_limit_gets_429_before_its_prompt_is_read_or_tokenized(serve):
    served = await serve(tenants={"local": TenantConfig(requests_per_minute=1)})
    calls = CountedEncode(served.engine.tokenizer)
    status, _ = await post(served, "/v1/completions", {"model": "sim", "prompt": "hi", "max_tokens": 1})
    assert status == 200 and calls.texts == ["hi"]
    for prompt in ("hi", "y" * 100_000):
        async with served.http.post(served.base_url + "/v1/completions",
                                    json={"model": "sim", "prompt": prompt}) as resp:
            assert resp.status == 429
            assert (await resp.json())["error"]["code"] == "quota_rpm"
            assert 0 < int(resp.headers["Retry-After"]) <= 60
            assert resp.headers["X-RateLimit-Remaining-Requests"] == "0"
    assert calls.texts == ["hi"]
    text = await served.metrics_text()
    assert metric_value(text, "inferd_tenant_rejections_total", tenant="local", reason="quota_rpm") == 2


async def test_long_prompts_queue_for_a_worker_while_short_ones_are_served_inline(served: Served, pool):
    calls = CountedEncode(served.engine.tokenizer, block_over=tokenize.OFF_LOOP_BYTES)
    big = [{"model": "sim", "prompt": c * 3000, "max_tokens": 1} for c in "abc"]
    first = [asyncio.ensure_future(post(served, "/v1/completions", b)) for b in big[:2]]
    await calls.blocked_reached(2)                  # both workers are busy
    third = asyncio.ensure_future(post(served, "/v1/completions", big[2]))
    await pool.until(lambda: pool.queued == 1)
    assert pool.running == 2
    status, body = await post(served, "/v1/completions", {"model": "sim", "prompt": "hi", "max_tokens": 1})
    assert status == 200 and body["usage"]["completion_tokens"] == 1
    assert "c" * 3000 not in calls.texts
    calls.release.set()
    for task in first + [third]:
        status, body = await task
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"   # 3000 tokens: too long
    assert "c" * 3000 in calls.texts and (pool.running, pool.queued) == (0, 0)


async def test_a_client_that_leaves_while_waiting_for_a_worker_is_never_tokenized(serve, pool):
    served = await serve(handler_cancellation=True)     # as the daemon runs
    calls = CountedEncode(served.engine.tokenizer, block_over=tokenize.OFF_LOOP_BYTES)
    busy = [asyncio.ensure_future(post(served, "/v1/completions", {"model": "sim", "prompt": c * 3000}))
            for c in "ab"]
    await calls.blocked_reached(2)
    leaving = asyncio.ensure_future(post(served, "/v1/completions", {"model": "sim", "prompt": "z" * 3000}))
    await pool.until(lambda: pool.queued == 1)
    leaving.cancel()                                 # closes its connection
    await pool.until(lambda: pool.dropped == 1)
    calls.release.set()
    for task in busy:
        await task
    assert "z" * 3000 not in calls.texts and pool.queued == 0


async def test_a_deadline_that_passes_while_waiting_for_a_worker_is_504_untokenized(served: Served, pool):
    calls = CountedEncode(served.engine.tokenizer, block_over=tokenize.OFF_LOOP_BYTES)
    busy = [asyncio.ensure_future(post(served, "/v1/completions", {"model": "sim", "prompt": c * 3000}))
            for c in "ab"]
    await calls.blocked_reached(2)
    status, body = await post(served, "/v1/completions", {"model": "sim", "prompt": "z" * 3000},
                              **{"X-Request-Timeout": "0.2"})
    assert (status, body["error"]["code"]) == (504, "deadline")
    calls.release.set()
    for task in busy:
        await task
    assert "z" * 3000 not in calls.texts and (pool.queued, pool.dropped) == (0, 1)


async def test_the_bound_for_a_byte_level_tokenizer_is_its_longest_entry(tiny_tokenizer):
    per_token = await chars_per_token(tiny_tokenizer, math.inf)
    longest = max(len(tiny_tokenizer.id_to_token(i) or "") for i in range(tiny_tokenizer.vocab_size))
    assert per_token == longest < MAX_CHARS_PER_TOKEN
    # No text packs more characters into a token than that: the bound never overstates.
    for text in ("<|im_start|>" * 50, " " * 5000, "the model " * 500, "你好🙂" * 300, "-" * 4000):
        assert math.ceil(len(text) / per_token) <= len(tiny_tokenizer.encode(text, add_special_tokens=False))
