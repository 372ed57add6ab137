"""The `[models.X.speculative]` table: its defaults, what it refuses, and the engine settings it becomes."""
from __future__ import annotations

import pytest

from inferd.config.root import ConfigError, parse_config
from inferd.engine.speculative import Speculation
from inferd.models.factory import _speculation


def errors_of(model: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"models": {"m": model}})
    return info.value.errors


def test_prompt_lookup_with_four_drafts_is_the_default_and_reaches_the_engine_settings():
    model = parse_config({"models": {"m": {"speculative": {}}}}).models["m"]
    assert _speculation(model) == Speculation(method="ngram", num_tokens=4, min_n=2, max_n=4)
    assert _speculation(parse_config({"models": {"m": {}}}).models["m"]) is None


@pytest.mark.parametrize("table, message", [
    ({"num_speculative_tokens": 0}, "models.m.speculative.num_speculative_tokens: must be in [1, 16], got 0"),
    ({"num_speculative_tokens": 17}, "models.m.speculative.num_speculative_tokens: must be in [1, 16], got 17"),
    ({"prompt_lookup_min": 3, "prompt_lookup_max": 2},
     "models.m.speculative.prompt_lookup_min: need 1 <= prompt_lookup_min <= prompt_lookup_max, got 3 and 2"),
    ({"prompt_lookup_min": 0}, "models.m.speculative.prompt_lookup_min: need 1 <= prompt_lookup_min"),
    ({"method": "eagle"}, "models.m.speculative.method: expected one of 'ngram', got 'eagle'"),
    ({"draft": "x"}, "models.m.speculative.draft: unknown key"),
])
def test_a_bad_speculative_setting_is_named(table, message):
    errors = errors_of({"speculative": table})
    assert any(e.startswith(message) for e in errors), errors


@pytest.mark.parametrize("backend", ["sim", "trtllm"])
def test_speculation_on_a_backend_that_cannot_do_it_is_refused_not_ignored(backend):
    errors = errors_of({"backend": backend, "speculative": {}})
    assert f"models.m.speculative: speculative decoding runs on the reference and torch backends (backend is " \
           f"'{backend}')" in errors
