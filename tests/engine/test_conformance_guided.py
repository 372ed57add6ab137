"""Structured output, one contract on every engine backend (backends.py): a grammar compiled through
`engine.grammars` (as the API's grammar stage does, off the loop) is obeyed, its end is a stop, a max_tokens
cut says length, and a refused grammar is the same GrammarError everywhere."""
from __future__ import annotations

import asyncio
import itertools
import json

import jsonschema
import pytest

from inferd.engine.base import Engine
from inferd.engine.grammar import GrammarError
from inferd.types import Delta, FinishReason, GenerationRequest, GuidedDecoding, SamplingParams
from tests.engine.backends import BACKENDS

TIMEOUT_S = 30.0
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                              "maximum": 9},
                                           "c": {"enum": ["red", "green"]}},
          "required": ["ok", "n", "c"], "additionalProperties": False}
JSON_SCHEMA = GuidedDecoding(kind="json_schema", spec=json.dumps(SCHEMA, separators=(",", ":"), sort_keys=True))
CHOICES = ["alpha", "beta gamma", "x.y"]
_ids = itertools.count()


@pytest.fixture(params=sorted(BACKENDS))
async def engine(request: pytest.FixtureRequest):
    async with BACKENDS[request.param](request) as started:
        yield started


async def generate(engine: Engine, guided: GuidedDecoding, **params) -> Delta:
    await asyncio.to_thread(engine.grammars.compile, guided)
    params.setdefault("max_tokens", 120)
    request = GenerationRequest(request_id=f"guided-{next(_ids)}", sampling=SamplingParams(guided=guided, **params),
                                prompt_token_ids=tuple(engine.tokenizer.encode("Answer in JSON:")))
    return await asyncio.wait_for(engine.submit(request).collect(), TIMEOUT_S)


async def test_a_choice_is_obeyed_and_ends_with_stop_even_with_ignore_eos(engine: Engine) -> None:
    guided = GuidedDecoding(kind="choice", spec=json.dumps(CHOICES))
    for seed in range(3):
        final = await generate(engine, guided, temperature=1.0, seed=seed, ignore_eos=True)
        assert final.finish_reason is FinishReason.STOP and final.text in CHOICES


async def test_json_schema_output_parses_and_validates(engine: Engine) -> None:
    final = await generate(engine, JSON_SCHEMA, temperature=0.0)
    assert final.finish_reason is FinishReason.STOP
    jsonschema.validate(json.loads(final.text), SCHEMA)


async def test_a_max_tokens_cut_says_length(engine: Engine) -> None:
    final = await generate(engine, JSON_SCHEMA, temperature=0.0, max_tokens=2, ignore_eos=True)
    assert final.finish_reason is FinishReason.LENGTH and len(final.token_ids) == 2


async def test_a_refused_grammar_is_the_same_error_on_every_backend(engine: Engine) -> None:
    bad = GuidedDecoding(kind="json_schema", spec='{"type":"integer","minimum":5,"maximum":3}')
    with pytest.raises(GrammarError, match="minimum greater than maximum"):
        await asyncio.to_thread(engine.grammars.compile, bad)
