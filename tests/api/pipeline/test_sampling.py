"""Penalties and filters through the official SDK against the real app: accepted on both endpoints (streamed
and not), refused out of range with a 400 naming the field, logit_bias's ids held to the model's vocabulary,
and on the reference engine a bias that decides the greedy token."""
from __future__ import annotations

import openai
import pytest

from inferd.api.pipeline.sampling import check_logit_bias
from inferd.api.wire.openai import Prepared
from inferd.engine.reference.engine import ReferenceEngine

MESSAGES = [{"role": "user", "content": "hello"}]
EVERY = dict(presence_penalty=0.5, frequency_penalty=-0.5, logit_bias={"7": 3.0, "300": -100},
             extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2})


@pytest.fixture
async def reference(serve, tiny_artifact):
    engine = ReferenceEngine(tiny_artifact, num_kv_blocks=64, block_size=16, max_batch_size=4, max_num_tokens=64)
    return await serve({"tiny": engine})


async def test_every_parameter_is_accepted_on_completions_and_chat_streamed_or_not(served):
    sdk = served.sdk
    done = await sdk.completions.create(model="sim", prompt="hi", max_tokens=4, temperature=0.7, seed=1, **EVERY)
    assert done.usage.completion_tokens > 0
    chat = await sdk.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=4, **EVERY)
    assert chat.choices[0].message.content is not None
    stream = await sdk.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=4, stream=True, **EVERY)
    assert [c async for c in stream][-1].choices[0].finish_reason is not None


async def test_the_sim_accepts_them_and_its_synthetic_tokens_do_not_change(served):
    plain = await served.sdk.completions.create(model="sim", prompt="hi", max_tokens=6, temperature=0)
    penalised = await served.sdk.completions.create(model="sim", prompt="hi", max_tokens=6, temperature=0, **EVERY)
    assert penalised.choices[0].text == plain.choices[0].text       # docs/sim.md says so


@pytest.mark.parametrize("field,value", [
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("top_k", -2), ("min_p", 1.5),
    ("repetition_penalty", 0), ("logit_bias", {"5": 101}), ("logit_bias", {"five": 1})])
async def test_out_of_range_values_are_a_400_naming_the_field(served, field, value):
    for call in (served.sdk.completions.create(model="sim", prompt="a", max_tokens=1, extra_body={field: value}),
                 served.sdk.chat.completions.create(model="sim", messages=MESSAGES, max_tokens=1,
                                                    extra_body={field: value})):
        with pytest.raises(openai.BadRequestError) as exc:
            await call
        assert exc.value.body["param"] == field and field in exc.value.body["message"]


async def test_a_logit_bias_token_outside_the_vocabulary_is_a_400_naming_logit_bias(served):
    vocab = served.engine.tokenizer.vocab_size
    with pytest.raises(openai.BadRequestError) as exc:
        await served.sdk.completions.create(model="sim", prompt="a", max_tokens=1, logit_bias={str(vocab): 1})
    assert exc.value.body["param"] == "logit_bias" and exc.value.body["code"] == "invalid_token_id"
    assert str(vocab) in exc.value.body["message"]
    await served.sdk.completions.create(model="sim", prompt="a", max_tokens=1, logit_bias={str(vocab - 1): 1})


def test_logit_bias_ids_are_checked_against_the_vocabulary_the_engine_states():
    check_logit_bias(Prepared(kind="completion", logit_bias=((0, 1.0), (511, -1.0))), 512)
    with pytest.raises(Exception, match="512"):
        check_logit_bias(Prepared(kind="completion", logit_bias=((512, 1.0),)), 512)


async def test_a_large_logit_bias_makes_its_token_the_greedy_choice_on_the_reference_engine(reference):
    tok = reference.engine.tokenizer
    sdk = reference.sdk
    plain = await sdk.completions.create(model="tiny", prompt="The cat sat", max_tokens=4, temperature=0,
                                         extra_body={"ignore_eos": True})
    token = tok.encode("Q", add_special_tokens=False)[-1]
    assert tok.decode([token]) == "Q" and "Q" not in plain.choices[0].text
    biased = await sdk.completions.create(model="tiny", prompt="The cat sat", max_tokens=4, temperature=0,
                                          logit_bias={str(token): 100}, extra_body={"ignore_eos": True})
    assert biased.choices[0].text == "QQQQ"
    stream = await sdk.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0,
                                               logit_bias={str(token): 100}, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "QQQ"


async def test_a_large_negative_logit_bias_keeps_a_token_out_on_the_reference_engine(reference):
    sdk = reference.sdk
    plain = await sdk.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=1, temperature=0,
                                         extra_body={"ignore_eos": True})
    (first,) = reference.engine.tokenizer.encode(plain.choices[0].text, add_special_tokens=False)
    banned = await sdk.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=1, temperature=0,
                                          logit_bias={str(first): -100}, extra_body={"ignore_eos": True})
    assert banned.choices[0].text != plain.choices[0].text


async def test_a_chat_without_max_tokens_gets_the_models_default_and_one_that_sets_it_wins(serve):
    from inferd.config.root import ModelConfig
    served = await serve(models={"sim": ModelConfig(backend="sim", default_max_tokens=5)})
    sdk, body = served.sdk, dict(model="sim", messages=MESSAGES, extra_body={"ignore_eos": True})
    assert (await sdk.chat.completions.create(**body)).usage.completion_tokens == 5
    assert (await sdk.chat.completions.create(**body, max_tokens=9)).usage.completion_tokens == 9
    streamed = await sdk.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    assert [c async for c in streamed][-1].usage.completion_tokens == 5
    responses = await sdk.responses.create(model="sim", input="hello")
    assert responses.usage.output_tokens <= 5
    # completions keep OpenAI's 16
    assert (await sdk.completions.create(model="sim", prompt="hi", extra_body={"ignore_eos": True})
            ).usage.completion_tokens == 16


def test_default_max_tokens_must_be_positive():
    from inferd.config import ConfigError
    from inferd.config.root import parse_config
    with pytest.raises(ConfigError, match="models.small.default_max_tokens"):
        parse_config({"models": {"small": {"default_max_tokens": 0}}})
