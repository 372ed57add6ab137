"""logprobs / top_logprobs (chat) and logprobs / echo (completions) through the official SDK, streamed and not,
on the reference engine (the model's raw values) and the sim (synthetic ones), in OpenAI's shapes."""
from __future__ import annotations

import math

import openai
import pytest

from inferd.engine.reference.engine import ReferenceEngine
from tests.api.conftest import sim_engine

MESSAGES = [{"role": "user", "content": "hello there"}]
PROMPT = "the quick brown fox"


@pytest.fixture(params=["reference", "sim"])
async def api(request, serve, tiny_artifact):
    if request.param == "reference":
        engine = ReferenceEngine(tiny_artifact, num_kv_blocks=64, block_size=16, max_batch_size=4, max_num_tokens=64)
    else:
        engine = sim_engine()
    return await serve({"m": engine})


def bytes_fit(entry) -> bool:
    """A token's bytes are its text's UTF-8, or, for part of a character (text U+FFFD), that part's own bytes."""
    if "\ufffd" in entry.token:
        return 1 <= len(entry.bytes) <= 4 or entry.bytes == list(entry.token.encode())
    return entry.bytes == list(entry.token.encode("utf-8"))


def check_chat_entry(entry, k: int) -> None:
    assert entry.logprob <= 0 and bytes_fit(entry)
    assert len(entry.top_logprobs) == k
    values = [t.logprob for t in entry.top_logprobs]
    assert values == sorted(values, reverse=True) and sum(math.exp(v) for v in values) <= 1 + 1e-6
    assert all(bytes_fit(t) for t in entry.top_logprobs)
    assert values[0] >= entry.logprob            # greedy: the sampled token is the most likely


async def test_chat_logprobs_with_top_5_streamed_and_not(api):
    kw = dict(model="m", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=5)
    whole = await api.sdk.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        check_chat_entry(entry, 5)
    assert whole.choices[0].logprobs.refusal is None

    stream = await api.sdk.chat.completions.create(**kw, stream=True)
    streamed = [e for c in [c async for c in stream] if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]


async def test_chat_without_logprobs_answers_null_logprobs(api):
    whole = await api.sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)
    assert whole.choices[0].logprobs is None
    stream = await api.sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3, stream=True)
    assert all(c.choices[0].logprobs is None for c in [c async for c in stream] if c.choices)


async def test_completion_echo_with_logprobs_lists_prompt_tokens_first_streamed_and_not(api):
    kw = dict(model="m", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=1)
    whole = await api.sdk.completions.create(**kw)
    choice = whole.choices[0]
    lp = choice.logprobs
    prompt_len, out_len = whole.usage.prompt_tokens, whole.usage.completion_tokens
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) \
        == prompt_len + out_len
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    for token, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert 1 <= len(top) <= 2 and top.get(token, value) == value   # the most likely, and the scored one
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)

    stream = await api.sdk.completions.create(**kw, stream=True)
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        if c.choices and c.choices[0].logprobs is not None:
            for name, values in streamed.items():
                values.extend(getattr(c.choices[0].logprobs, name))
    assert streamed == {name: getattr(lp, name) for name in streamed}


async def test_completion_echo_alone_prepends_the_prompt_without_logprobs(api):
    whole = await api.sdk.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0, echo=True)
    plain = await api.sdk.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0)
    assert whole.choices[0].text == PROMPT + plain.choices[0].text and whole.choices[0].logprobs is None


async def test_completion_logprobs_without_echo_cover_the_output_only(api):
    whole = await api.sdk.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=0)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == 3 and all(v is not None for v in lp.token_logprobs)
    assert all(list(top) == [tok] for tok, top in zip(lp.tokens, lp.top_logprobs))   # k=0: the sampled one


@pytest.mark.parametrize("kind, body, param", [
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
    ("completion", {"logprobs": 6}, "logprobs"),
    ("completion", {"logprobs": -1}, "logprobs"),
    ("completion", {"echo": 1}, "echo"),
])
async def test_out_of_range_logprobs_settings_are_400s_naming_the_field(api, kind, body, param):
    if kind == "chat":
        call = api.sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, extra_body=body)
    else:
        call = api.sdk.completions.create(model="m", prompt=PROMPT, max_tokens=2, extra_body=body)
    with pytest.raises(openai.BadRequestError) as err:
        await call
    assert err.value.body["param"] == param


async def test_each_prompt_of_a_list_echoes_its_own_prompt_and_logprobs_streamed_and_not(api):
    prompts = ["the quick brown fox", "jumps over"]
    kw = dict(model="m", prompt=prompts, max_tokens=3, temperature=0, echo=True, logprobs=1)
    whole = await api.sdk.completions.create(**kw)
    by_index = {c.index: c for c in whole.choices}
    stream = await api.sdk.completions.create(**kw, stream=True)
    texts, tokens = {0: "", 1: ""}, {0: [], 1: []}
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            tokens[c.index] += c.logprobs.tokens if c.logprobs else []
    for i, prompt in enumerate(prompts):
        assert by_index[i].text.startswith(prompt) and texts[i] == by_index[i].text
        assert by_index[i].logprobs.token_logprobs[0] is None and tokens[i] == by_index[i].logprobs.tokens
