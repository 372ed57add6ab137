"""End to end through the official OpenAI SDK against the real app over the sim engine."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import msgspec
import openai
import pytest

from inferd.api import appkeys
from inferd.engine.sim.engine import SimEngine
from inferd.engine.sim.profiles import get_profile
from inferd.models import Breakers
from inferd.types import Delta, FinishReason
from tests.api.conftest import metric_value, sim_engine


class FailingEngine(SimEngine):
    """A sim engine that fails every request it accepts, as an engine reports a failure: a final
    delta with FinishReason.ERROR (the real generation is aborted when the API cancels the stream)."""

    def submit(self, request):
        stream = super().submit(request)
        asyncio.get_running_loop().call_soon(
            stream.push, Delta(token_ids=[], finish_reason=FinishReason.ERROR, error="injected failure"))
        return stream


class RolloutRecorder:
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, bool]] = []

    def record(self, key, ok, ttft, itl, prompt, completion) -> None:
        self.outcomes.append((str(key), ok))


async def test_completion_returns_text_usage_and_versioned_model(served):
    raw = await served.sdk.completions.with_raw_response.create(model="sim", prompt="hello world", max_tokens=6)
    resp = raw.parse()
    info = served.engine.info
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.model == f"sim@{info.version}+simulated"
    assert resp.choices[0].finish_reason == "length" and resp.choices[0].text
    assert resp.usage.completion_tokens == 6
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 6
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    assert raw.headers["X-Inferd-Simulated"] == "true"
    assert raw.headers["X-Inferd-Model-Version"] == f"{info.version}+simulated"
    timing = raw.headers["Server-Timing"]
    for part in ("queue;dur=", "prefill;dur=", "decode;dur=", "total;dur="):
        assert part in timing


async def test_chat_completion_uses_the_chat_template(served):
    resp = await served.sdk.chat.completions.create(
        model="sim", messages=[{"role": "system", "content": "terse"}, {"role": "user", "content": "hi"}],
        max_completion_tokens=4)
    tok = served.engine.tokenizer
    expected_prompt = tok.encode(tok.apply_chat_template(
        [{"role": "system", "content": "terse"}, {"role": "user", "content": "hi"}]), add_special_tokens=False)
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content
    assert resp.usage.prompt_tokens == len(expected_prompt)
    assert resp.usage.completion_tokens == 4


async def test_streamed_completion_matches_non_streamed_and_ends_with_usage(served):
    whole = await served.sdk.completions.create(model="sim", prompt="abc", max_tokens=12, temperature=0)
    stream = await served.sdk.completions.create(model="sim", prompt="abc", max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


async def test_streamed_chat_announces_role_once_and_omits_usage_unless_asked(served):
    stream = await served.sdk.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True)
    chunks = [c async for c in stream]
    roles = [c.choices[0].delta.role for c in chunks if c.choices[0].delta.role]
    assert roles == ["assistant"]
    assert all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason == "length"
    assert len({c.id for c in chunks}) == 1


async def test_stop_string_ends_generation_before_it(served):
    whole = await served.sdk.completions.create(model="sim", prompt="xyz", max_tokens=20, temperature=0)
    words = whole.choices[0].text.split(" ")
    stop = " " + words[3]
    resp = await served.sdk.completions.create(model="sim", prompt="xyz", max_tokens=20, temperature=0, stop=[stop])
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].text == whole.choices[0].text[: whole.choices[0].text.index(stop)]


async def test_same_seed_reproduces_and_another_seed_differs(served):
    async def sample(seed):
        r = await served.sdk.completions.create(model="sim", prompt="p", max_tokens=16, temperature=1.0, seed=seed)
        return r.choices[0].text
    assert await sample(7) == await sample(7)
    assert await sample(7) != await sample(8)


async def test_prompt_as_token_ids(served):
    resp = await served.sdk.completions.create(model="sim", prompt=[300, 301, 302], max_tokens=3)
    assert resp.usage.prompt_tokens == 3


async def test_name_at_version_routes_and_unknown_version_is_404(served):
    info = served.engine.info
    resp = await served.sdk.completions.create(model=f"sim@{info.version}", prompt="a", max_tokens=1)
    assert resp.usage.completion_tokens == 1
    with pytest.raises(openai.NotFoundError) as exc:
        await served.sdk.completions.create(model="sim@nope", prompt="a", max_tokens=1)
    assert exc.value.body["param"] == "model"


async def test_errors_surface_as_typed_sdk_exceptions(served):
    with pytest.raises(openai.NotFoundError):
        await served.sdk.completions.create(model="missing", prompt="a")
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.completions.create(model="sim", prompt="a", extra_body={"mirostat": 2})
    assert exc.value.body["param"] == "mirostat"
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.chat.completions.create(model="sim", messages=[{"role": "user", "content": "a"}], n=17)
    assert exc.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.completions.create(model="sim", prompt=[5000], max_tokens=1)
    assert exc.value.body["code"] == "invalid_token_id"


async def test_context_limits_are_stated(serve):
    served = await serve({"small": sim_engine(max_model_len=64)})
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.completions.create(model="small", prompt=[300] * 64, max_tokens=1)
    assert exc.value.body["param"] == "prompt" and "64" in exc.value.body["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.completions.create(model="small", prompt=[300] * 60, max_tokens=5)
    assert exc.value.body["param"] == "max_tokens" and "at most 4" in exc.value.body["message"]
    chat = await served.sdk.chat.completions.create(model="small", messages=[{"role": "user", "content": "a"}])
    assert chat.usage.total_tokens == 64     # chat defaults to the rest of the context


async def test_long_prompt_is_tokenized_off_the_loop_with_the_same_result(serve):
    served = await serve({"sim": sim_engine(max_model_len=8192)})
    text = "lorem ipsum " * 400
    resp = await served.sdk.completions.create(model="sim", prompt=text, max_tokens=1)
    assert resp.usage.prompt_tokens == len(served.engine.tokenizer.encode(text))


async def test_draining_server_answers_503_with_retry_after(served):
    served.state.draining = True
    with pytest.raises(openai.InternalServerError) as exc:
        await served.sdk.completions.create(model="sim", prompt="a")
    assert exc.value.status_code == 503 and exc.value.response.headers["Retry-After"]


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_failure_is_counted_as_500_and_reported_to_rollouts(serve, stream):
    served = await serve({"sim": FailingEngine("tiny", time_scale=1.0, max_model_len=512)})
    rollouts = RolloutRecorder()
    served.state.control = SimpleNamespace(rollouts=rollouts, breakers=Breakers({}))
    with pytest.raises(openai.APIError) as exc:
        if stream:
            async for _ in await served.sdk.completions.create(model="sim", prompt="a", max_tokens=50, stream=True):
                pass
        else:
            await served.sdk.completions.create(model="sim", prompt="a", max_tokens=50)
    assert exc.value.body["code"] == "engine_error"
    text = await served.metrics_text()
    assert metric_value(text, "inferd_requests_total", model="sim", status="500") == 1
    assert metric_value(text, "inferd_requests_total", model="sim", status="499") == 0
    assert rollouts.outcomes == [(f"sim@{served.engine.info.version}", False)]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failure_right_after_admission_aborts_the_engine_request(serve, stream):
    # 400 tokens at ~5 ms per step: a request left generating unread would run for ~2 s.
    served = await serve({"sim": sim_engine(time_scale=2.0)})
    engine = served.engine
    submitted = []
    submit = engine.submit
    engine.submit = lambda request: submitted.append(submit(request)) or submitted[-1]

    def broken_add(*args, **kwargs):
        raise RuntimeError("bug between admission and streaming")

    served.app[appkeys.INFLIGHT].add = broken_add
    with pytest.raises(openai.InternalServerError):
        await served.sdk.completions.create(model="sim", prompt="a", max_tokens=400, stream=stream)
    (engine_stream,) = submitted
    final = await asyncio.wait_for(engine_stream.collect(), timeout=1.0)   # the engine ends it: aborted
    assert final.finish_reason is FinishReason.ABORT
    assert metric_value(await served.metrics_text(), "inferd_requests_total", model="sim", status="500") == 1


async def test_many_messages_are_templated_off_the_loop_and_too_many_are_refused(serve):
    # Empty messages carry no text, yet each costs templating and tokens: 2,000 take tens of ms.
    served = await serve({"sim": sim_engine(max_model_len=8192)})
    tok = served.engine.tokenizer
    threads = []
    template = tok.apply_chat_template

    def recording_template(*args, **kwargs):
        threads.append(threading.current_thread())
        return template(*args, **kwargs)

    tok.apply_chat_template = recording_template
    many = [{"role": "assistant"}] * 300 + [{"role": "user", "content": "hi"}]
    resp = await served.sdk.chat.completions.create(model="sim", messages=many, max_completion_tokens=1)
    assert resp.usage.completion_tokens == 1
    assert threads and threads[-1] is not threading.main_thread()
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.chat.completions.create(model="sim", messages=[{"role": "assistant"}] * 2049,
                                                 max_completion_tokens=1)
    assert exc.value.body["param"] == "messages" and "2048" in exc.value.body["message"]


async def test_stream_options_on_a_non_streamed_request_is_a_400_naming_it(served):
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.completions.create(model="sim", prompt="a", max_tokens=1,
                                            stream_options={"include_usage": True})
    assert exc.value.body["param"] == "stream_options"
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.chat.completions.create(
            model="sim", max_completion_tokens=1,
            messages=[{"role": "user", "content": [{"type": "text", "text": "a", "image_url": {"url": "http://x"}}]}])
    assert exc.value.body["param"] == "messages[0].content[0].image_url"


async def test_a_stop_string_longer_than_the_limit_is_a_400_naming_stop(served):
    ok = await served.sdk.completions.create(model="sim", prompt="a", max_tokens=1, stop=["x" * 256])
    assert ok.usage.completion_tokens == 1
    for stop in ("x" * 257, ["a", "y" * 5000]):
        with pytest.raises(openai.BadRequestError) as exc:
            await served.sdk.completions.create(model="sim", prompt="a", max_tokens=1, stop=stop)
        assert exc.value.body["param"] == "stop" and "256" in exc.value.body["message"]


async def test_ignore_eos_generates_exactly_max_tokens_where_eos_would_end_it_early(serve):
    eager = msgspec.structs.replace(get_profile("tiny"), eos_probability=0.3)   # EOS within a few tokens
    served = await serve({"sim": SimEngine(eager, time_scale=0.0, max_model_len=512, model_name="sim", seed=0)})
    early = await served.sdk.completions.create(model="sim", prompt="p", max_tokens=64, temperature=0)
    assert early.choices[0].finish_reason == "stop" and early.usage.completion_tokens < 64
    full = await served.sdk.completions.create(model="sim", prompt="p", max_tokens=64, temperature=0,
                                               extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 64
    chat = await served.sdk.chat.completions.create(model="sim", messages=[{"role": "user", "content": "p"}],
                                                    max_completion_tokens=64, extra_body={"ignore_eos": True})
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 64
