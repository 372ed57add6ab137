"""inferd.api.wire.json_depth: the nesting bound every body obeys, unit by unit and through the real app: a body
nested 100,000 deep in any field (typed loosely or not) is a 400 that names the bound, with no traceback logged,
and the app goes on serving."""
from __future__ import annotations

import json
import logging
import random

import pytest

from inferd.api.wire.json_depth import MAX_DEPTH, depth_exceeds

DEEP = 100_000
ARRAY = "[" * DEEP + "]" * DEEP
OBJECT = '{"a":' * DEEP + "1" + "}" * DEEP
MESSAGES = '"messages":[{"role":"user","content":"hi"}]'


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _random_value(rng: random.Random, depth: int):
    pick = rng.random()
    if depth > 0 and pick < 0.35:
        return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    if depth > 0 and pick < 0.7:
        return {rng.choice(['k', '"[', '{\\', 'x]}']): _random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))}
    return rng.choice(["", "[[[", "}}]", '\\"[', "\\", '\\\\"{', 'a"b', "\u00e9[", 1, None, True, 2.5])


@pytest.mark.parametrize("seed", range(300))
def test_the_depth_matches_a_walk_of_the_decoded_value_whatever_the_strings_hold(seed):
    rng = random.Random(seed)
    value = _random_value(rng, rng.randint(0, 12))
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
    depth = _depth(value)
    for limit in range(0, 14):
        # below MAX_DEPTH brackets the answer is the cheap count's: the check for small limits is the full path
        assert depth_exceeds(text, limit) == (depth > limit), (text, limit)


def test_the_bound_is_128_levels_of_arrays_or_objects_and_strings_do_not_count():
    assert not depth_exceeds(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    assert depth_exceeds(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert depth_exceeds(OBJECT.encode())
    assert not depth_exceeds(json.dumps({"a": "[" * DEEP, "b": ["{" * DEEP]}).encode())
    assert not depth_exceeds(b"[]" * DEEP)              # wide, not deep


def _cases() -> list[tuple[str, str]]:
    cases = []
    for deep in (ARRAY, OBJECT):
        for field in ("response_format", "tools", "tool_choice", "prediction", "audio", "functions", "metadata",
                      "web_search_options", "logit_bias"):
            cases.append(("/v1/chat/completions", f'{{"model":"sim",{MESSAGES},"{field}":{deep}}}'))
        schema = '{"type":"object","properties":{"a":%s}}' % deep
        cases += [
            ("/v1/chat/completions", f'{{"model":"sim",{MESSAGES},"response_format":{{"type":"json_schema",'
                                     f'"json_schema":{{"name":"x","schema":{schema}}}}}}}'),
            ("/v1/chat/completions", f'{{"model":"sim",{MESSAGES},"tools":[{{"type":"function","function":'
                                     f'{{"name":"f","parameters":{schema}}}}}]}}'),
            ("/v1/completions", f'{{"model":"sim","prompt":"hi","metadata":{deep}}}'),
            ("/v1/responses", f'{{"model":"sim","input":{deep}}}'),
            ("/v1/responses", f'{{"model":"sim","input":"hi","tools":[{{"type":"function","name":"f",'
                              f'"parameters":{schema}}}]}}'),
            ("/v1/embeddings", f'{{"model":"sim","input":{deep}}}'),
            ("/tokenize", f'{{"model":"sim",{MESSAGES},"tools":{deep}}}'),
            ("/detokenize", f'{{"model":"sim","tokens":{deep}}}'),
        ]
        small = deep[:5_000] + deep[-5_000:] if deep is ARRAY else '{"a":' * 2_000 + "1" + "}" * 2_000
        cases += [      # admin bodies are refused past 16 KiB: 5,000 deep fits
            ("/admin/rollouts/sim/start", f'{{"reason":{small}}}'),
            ("/admin/adapters", f'{{"model":"sim","adapter":{small},"action":"load"}}'),
        ]
    return cases


async def test_a_body_nested_100000_deep_anywhere_is_a_400_naming_the_bound_and_logs_no_traceback(served, caplog):
    caplog.set_level(logging.INFO)
    for path, body in _cases():
        caplog.clear()
        async with served.http.post(served.base_url + path, data=body.encode(),
                                    headers={"Content-Type": "application/json"}) as resp:
            error = (await resp.json())["error"]
        where = (path, body[:80])
        assert resp.status == 400 and error["code"] == "invalid_json", (where, error)
        assert f"nested deeper than {MAX_DEPTH} levels" in error["message"], (where, error)
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], where
    answer = await served.sdk.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=2)
    assert answer.choices[0].message.content is not None        # still serving


async def test_json_inside_a_string_is_bounded_too(served, caplog):
    """structured_outputs.json as JSON text is refused; a past tool call's arguments nested past the bound go
    to the chat template as the text they came as (what the template gets for any non-object arguments)."""
    caplog.set_level(logging.INFO)
    schema = json.dumps('{"type":"object","properties":{"a":%s}}' % ARRAY)
    async with served.http.post(served.base_url + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                                data=f'{{"model":"sim",{MESSAGES},"structured_outputs":{{"json":{schema}}}}}') as resp:
        error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == "structured_outputs.json" and "128 levels" in error["message"]
    arguments = json.dumps('{"a":%s}' % ("[" * 5_000 + "]" * 5_000))
    messages = ('[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c","type":"function",'
                f'"function":{{"name":"f","arguments":{arguments}}}}}]}},'
                '{"role":"tool","tool_call_id":"c","content":"x"}]')
    async with served.http.post(served.base_url + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                                data=f'{{"model":"sim","messages":{messages},"max_tokens":2}}') as resp:
        error = (await resp.json())["error"]
    assert resp.status == 400 and error["code"] == "context_length_exceeded", error     # a long text, not a 500
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
