"""The request checks all backends share (inferd/engine/validation.py)."""
from __future__ import annotations

import pytest

from inferd.engine.base import InvalidRequest
from inferd.engine.validation import seed64, validate_request
from inferd.types import GenerationRequest, SamplingParams

VOCAB, CONTEXT = 100, 64


def request(prompt=(1, 2, 3), **sampling) -> GenerationRequest:
    return GenerationRequest(request_id="r", prompt_token_ids=tuple(prompt), sampling=SamplingParams(**sampling))


def rejected(req: GenerationRequest, **limits) -> InvalidRequest:
    limits.setdefault("vocab_size", VOCAB)
    limits.setdefault("max_model_len", CONTEXT)
    with pytest.raises(InvalidRequest) as info:
        validate_request(req, **limits)
    return info.value


def test_a_well_formed_request_passes() -> None:
    validate_request(request(max_tokens=61, temperature=0.7, top_p=0.9, top_k=5, seed=-1, stop=("x",),
                             stop_token_ids=(99,), presence_penalty=-2, frequency_penalty=2.0, min_p=1.0,
                             repetition_penalty=0.5, logit_bias=((0, -100.0), (99, 100))),
                     vocab_size=VOCAB, max_model_len=CONTEXT, kv_capacity_tokens=64)


@pytest.mark.parametrize(("req", "param"), [
    (request(()), "prompt"),
    (request((1, VOCAB)), "prompt"),
    (request((-1, 2)), "prompt"),
    (request(max_tokens=0), "max_tokens"),
    (request(temperature=-0.1), "temperature"),
    (request(temperature=float("nan")), "temperature"),
    (request(temperature=float("inf")), "temperature"),
    (request(top_p=0.0), "top_p"),
    (request(top_p=1.5), "top_p"),
    (request(top_k=-1), "top_k"),
    (request(stop=("ok", "")), "stop"),
    (request(stop_token_ids=(VOCAB,)), "stop_token_ids"),
    (request(presence_penalty=2.5), "presence_penalty"),
    (request(frequency_penalty=-2.01), "frequency_penalty"),
    (request(frequency_penalty=float("nan")), "frequency_penalty"),
    (request(repetition_penalty=0.0), "repetition_penalty"),
    (request(repetition_penalty=float("inf")), "repetition_penalty"),
    (request(min_p=1.5), "min_p"),
    (request(logit_bias=((VOCAB, 1.0),)), "logit_bias"),
    (request(logit_bias=((-1, 1.0),)), "logit_bias"),
    (request(logit_bias=((5, 100.5),)), "logit_bias"),
    (request(logit_bias=tuple((i, 1.0) for i in range(301))), "logit_bias"),
])
def test_each_bad_field_is_named(req: GenerationRequest, param: str) -> None:
    assert rejected(req).param == param


def test_prompt_plus_max_tokens_beyond_the_context_names_max_tokens_and_the_limit() -> None:
    error = rejected(request(max_tokens=CONTEXT - 2))
    assert error.param == "max_tokens"
    assert f"maximum context length is {CONTEXT} tokens" in str(error) and f"{CONTEXT + 1}" in str(error)


def test_a_prompt_that_fills_the_context_alone_names_the_prompt() -> None:
    assert rejected(request(tuple(range(CONTEXT)), max_tokens=1)).param == "prompt"


def test_kv_capacity_bounds_the_request_when_given() -> None:
    validate_request(request(max_tokens=40), vocab_size=VOCAB, max_model_len=CONTEXT)
    error = rejected(request(max_tokens=40), kv_capacity_tokens=32)
    assert error.param == "max_tokens" and "holds 32 tokens" in str(error)


def test_seed64_maps_any_signed_seed_onto_64_bits() -> None:
    assert seed64(-1) == 2 ** 64 - 1
    assert seed64(-(2 ** 63)) == 2 ** 63
    assert seed64(2 ** 63 - 1) == 2 ** 63 - 1
    assert seed64(0) == 0
