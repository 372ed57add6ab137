"""api/pipeline/guided.py through the app (the `grammar` stage): a request's grammar compiles off the loop
before it is charged or queued; what the engine cannot serve is a 400 naming the field, a compile past the
deadline a 504.

The engine's `grammars` is swapped for a stand-in that records or refuses (and hands anything else to the
engine's own, when it has one), so these tests pin the stage, not xgrammar.
"""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from inferd.api.pipeline.guided import GRAMMAR_POOL
from inferd.api.pipeline.prompt_tokens import OFF_LOOP_MESSAGES, POOL
from inferd.config import TenantConfig
from inferd.engine import GrammarError, GrammarUnavailable
from inferd.types import GuidedDecoding

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class StandIn:
    """A Grammars that records its compiles (thread name, grammar), raises `error` if set, and blocks on `gate`
    if set; the rest of the engine's Grammars interface goes to `inner` (None before a real one exists)."""

    def __init__(self, inner, error: Exception | None = None, gate: threading.Event | None = None,
                 cached: bool = False) -> None:
        self.inner, self.error, self.gate, self.is_cached = inner, error, gate, cached
        self.calls: list[tuple[str, GuidedDecoding]] = []       # (thread name, grammar)
        self.entered = threading.Event()

    def compile(self, guided: GuidedDecoding):
        self.calls.append((threading.current_thread().name, guided))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.error is not None:
            raise self.error
        return self.inner.compile(guided) if self.inner is not None else None

    def cached(self, guided: GuidedDecoding) -> bool:
        return self.is_cached

    def cached_matcher(self, guided: GuidedDecoding):
        # The sim builds its matcher from the cache (else it compiles, through compile() above): "compiled
        # already" has to hold there too, or the sim's own compile counts as the pipeline's.
        return self.inner.matcher(guided) if self.is_cached else self.inner.cached_matcher(guided)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@pytest.fixture
def stand_in(served):
    engine = served.engine
    own = engine.grammars

    def install(**kwargs) -> StandIn:
        engine.grammars = StandIn(own, **kwargs)
        return engine.grammars
    yield install
    engine.grammars = own


async def post(served, body: dict, path: str = "chat/completions") -> tuple[int, dict, dict]:
    async with served.http.post(f"{served.base_url}/v1/{path}", json=body) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def test_the_grammar_compiles_in_the_pool_not_on_the_event_loop(served, stand_in):
    fake = stand_in()
    status, _, body = await post(served, {**CHAT, "response_format": FORMAT})
    assert status == 200, body
    # GRAMMAR_POOL's threads are named "inferd-grammar_<n>" (ThreadPoolExecutor's thread_name_prefix)
    assert fake.calls and all(thread.startswith("inferd-grammar_") for thread, _ in fake.calls), fake.calls
    guided = fake.calls[0][1]
    assert guided.kind == "json_schema" and guided.spec == '{"type":"object","properties":{"ok":{"type":"boolean"}},' \
                                                           '"required":["ok"]}'


async def test_a_grammar_compiled_already_goes_straight_on_without_the_pool(served, stand_in):
    # compiled already for the engine too, so nothing but the stage could call compile()
    spec = json.dumps(SCHEMA, separators=(",", ":"))
    await asyncio.to_thread(served.engine.grammars.compile, GuidedDecoding(kind="json_schema", spec=spec))
    fake = stand_in(cached=True)
    assert (await post(served, {**CHAT, "response_format": FORMAT}))[0] == 200
    assert fake.calls == []


async def test_a_request_without_a_grammar_compiles_nothing(served, stand_in):
    fake = stand_in()
    assert (await post(served, {**CHAT, "response_format": {"type": "text"}}))[0] == 200
    assert fake.calls == []


async def test_a_refused_grammar_is_a_400_naming_the_field_that_asked_before_any_quota_or_queue(served, stand_in):
    stand_in(error=GrammarError("the regex was refused: unbalanced parenthesis"))
    status, _, body = await post(served, {"model": "sim", "prompt": "x", "structured_outputs": {"regex": "(a"}},
                                 path="completions")
    assert status == 400
    assert body["error"]["param"] == "structured_outputs.regex" and body["error"]["code"] == "invalid_regex"
    assert "unbalanced parenthesis" in body["error"]["message"]
    assert served.engine.stats().steps_total == 0


@pytest.mark.parametrize(("response_format", "param", "code"), [
    (FORMAT, "response_format.json_schema.schema", "invalid_schema"),
    ({"type": "json_object"}, "response_format", "invalid_schema")])
async def test_a_refused_schema_is_invalid_schema(served, stand_in, response_format, param, code):
    stand_in(error=GrammarError("the json schema is longer than 65536 bytes"))
    status, _, body = await post(served, {**CHAT, "response_format": response_format})
    assert status == 400 and (body["error"]["param"], body["error"]["code"]) == (param, code)


async def test_without_xgrammar_the_400_says_to_install_the_structured_extra(served, stand_in):
    stand_in(error=GrammarUnavailable("structured output needs xgrammar, which is not installed"))
    status, _, body = await post(served, {**CHAT, "response_format": FORMAT})
    assert status == 400 and "inferd[structured]" in body["error"]["message"]
    assert body["error"]["param"] == "response_format.json_schema.schema"


async def test_an_engine_that_cannot_constrain_is_a_400_naming_the_field_and_the_backend(served, stand_in):
    stand_in()
    served.engine.grammars = None           # the stand_in fixture puts the engine's own back
    status, _, body = await post(served, {**CHAT, "structured_outputs": {"choice": ["a", "b"]}})
    assert status == 400 and body["error"]["param"] == "structured_outputs.choice"
    assert "sim backend" in body["error"]["message"] and body["error"]["code"] == "unsupported_parameter"


async def test_a_compile_still_running_at_the_deadline_is_a_504(served, stand_in):
    gate = threading.Event()
    fake = stand_in(gate=gate)
    try:
        status, _, body = await post(served, {**CHAT, "response_format": FORMAT, "timeout": 0.2})
    finally:
        gate.set()
    assert fake.entered.is_set()
    assert status == 504 and body["error"]["code"] == "deadline" and "grammar" in body["error"]["message"]


async def test_compiles_past_their_deadline_hold_only_the_grammar_pool_not_tokenization(served, stand_in):
    """xgrammar cannot be interrupted: a compile outlives its request's 504. Two of them (as many as the
    tokenize pool has threads) must not leave a long prompt, which needs that pool, waiting until its 504."""
    gate = threading.Event()
    fake = stand_in(gate=gate)
    slow = [{**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": {
        "type": "string", "maxLength": i + 1}}}, "timeout": 0.2} for i in range(POOL.workers + 1)]
    try:
        answers = await asyncio.gather(*(post(served, body) for body in slow))
        assert [status for status, _, _ in answers] == [504] * len(slow)
        assert fake.entered.is_set() and GRAMMAR_POOL.running == len(fake.calls)    # still compiling
        long_chat = [{"role": "user", "content": "hi"}] * (OFF_LOOP_MESSAGES + 1)     # tokenized in POOL
        status, _, body = await post(served, {**CHAT, "messages": long_chat, "timeout": 5})
        assert status == 200, body
    finally:
        gate.set()
    assert len(fake.calls) <= GRAMMAR_POOL.workers      # the compile queued behind them was dropped, never run


async def test_a_refused_schema_sent_again_is_a_400_at_once_even_while_the_pool_is_busy(served):
    bad = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {
        "type": "integer", "minimum": 10, "maximum": 1}}}}
    assert (await post(served, bad))[0] == 400
    gate = threading.Event()
    held = [GRAMMAR_POOL.submit(lambda: gate.wait(10)) for _ in range(GRAMMAR_POOL.workers)]
    try:
        status, _, body = await post(served, {**bad, "timeout": 5})
    finally:
        gate.set()
    assert status == 400 and body["error"]["code"] == "invalid_schema", body
    assert "minimum greater than maximum" in body["error"]["message"]
    for fut in held:
        fut.result(10)


async def test_the_response_cache_key_holds_the_grammar(serve):
    served = await serve(tenants={"local": TenantConfig(cache_responses=True)})
    body = {**CHAT, "temperature": 0}
    other = {**SCHEMA, "properties": {"ok": {"type": "integer"}}}
    answers = []
    for extra in ({}, {"response_format": FORMAT}, {"response_format": FORMAT},
                  {"response_format": {**FORMAT, "json_schema": {"name": "answer", "schema": other}}},
                  {"structured_outputs": {"json": SCHEMA}}):
        status, headers, answer = await post(served, {**body, **extra})
        assert status == 200, answer
        answers.append(headers.get("X-Inferd-Cache"))
    # the same schema through vLLM's field is the same grammar: the same entry
    assert answers == ["miss", "miss", "hit", "miss", "hit"]


async def test_identical_requests_compiling_at_once_compile_once_and_wait_on_the_loop(served, monkeypatch):
    """The second request awaits the first's compile (Grammars.in_flight) on the event loop: one compile,
    one pool thread."""
    from inferd.api.pipeline import guided as guided_module

    grammars = served.engine.grammars
    entered, release, second = threading.Event(), threading.Event(), threading.Event()
    runs: list[str] = []
    real_run, real_wait = grammars._run_compiler, guided_module.wait

    def gated(compiler, guided):
        runs.append(guided.spec)
        (second if len(runs) > 1 else entered).set()
        release.wait(30)
        return real_run(compiler, guided)

    async def watched_wait(fut, deadline, **kw):
        second.set()
        return await real_wait(fut, deadline, **kw)

    monkeypatch.setattr(grammars, "_run_compiler", gated)
    monkeypatch.setattr(guided_module, "wait", watched_wait)
    fmt = {"type": "json_schema", "json_schema": {"name": "once", "schema": {
        "type": "object", "properties": {"once": {"type": "integer"}}, "required": ["once"]}}}
    first = asyncio.create_task(post(served, {**CHAT, "response_format": fmt}))
    assert await asyncio.to_thread(entered.wait, 30)
    other = asyncio.create_task(post(served, {**CHAT, "response_format": fmt}))
    assert await asyncio.to_thread(second.wait, 30)
    release.set()
    for status, _, body in await asyncio.gather(first, other):
        assert status == 200, body
    assert len(runs) == 1
