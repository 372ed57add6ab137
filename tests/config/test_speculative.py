"""The `[models.X.speculative]` table: its defaults, what it refuses, and the engine settings it becomes."""
from __future__ import annotations

import pytest

from inferd.config.root import ConfigError, parse_config
from inferd.engine.speculative import Speculation
from inferd.config.root import ServerConfig
from inferd.models.factory import _speculation


def errors_of(model: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"models": {"m": model}})
    return info.value.errors


def test_prompt_lookup_with_four_drafts_is_the_default_and_reaches_the_engine_settings():
    model = parse_config({"models": {"m": {"speculative": {}}}}).models["m"]
    assert _speculation("m", model, ServerConfig()) == Speculation(method="ngram", num_tokens=4, min_n=2, max_n=4)
    assert _speculation("m", parse_config({"models": {"m": {}}}).models["m"], ServerConfig()) is None


def test_a_draft_models_artifact_is_resolved_under_engines_root_and_a_missing_one_is_named(copying_model, tmp_path):
    from inferd.models.factory import EngineConfigError

    artifact, _ = copying_model
    table = {"method": "draft_model", "draft_model": f"{artifact.parent.name}@{artifact.name}",
             "num_speculative_tokens": 3}
    model = parse_config({"models": {"m": {"speculative": table}}}).models["m"]
    got = _speculation("m", model, ServerConfig(engines_root=str(artifact.parent.parent)))
    assert (got.method, got.num_tokens, got.draft_dir) == ("draft_model", 3, str(artifact))
    with pytest.raises(EngineConfigError, match="speculative.draft_model"):
        _speculation("m", model, ServerConfig(engines_root=str(tmp_path)))


@pytest.mark.parametrize("table, message", [
    ({"num_speculative_tokens": 0}, "models.m.speculative.num_speculative_tokens: must be in [1, 16], got 0"),
    ({"num_speculative_tokens": 17}, "models.m.speculative.num_speculative_tokens: must be in [1, 16], got 17"),
    ({"prompt_lookup_min": 3, "prompt_lookup_max": 2},
     "models.m.speculative.prompt_lookup_min: need 1 <= prompt_lookup_min <= prompt_lookup_max, got 3 and 2"),
    ({"prompt_lookup_min": 0}, "models.m.speculative.prompt_lookup_min: need 1 <= prompt_lookup_min"),
    ({"method": "medusa"},
     "models.m.speculative.method: expected one of 'ngram', 'draft_model', 'eagle', got 'medusa'"),
    ({"draft": "x"}, "models.m.speculative.draft: unknown key"),
    ({"method": "draft_model"}, "models.m.speculative.draft_model: method \"draft_model\" needs the draft's"),
    ({"draft_model": "d"}, "models.m.speculative.draft_model: only methods \"draft_model\" and \"eagle\" take one"),
    ({"method": "eagle", "draft_model": "d"}, "models.m.speculative.method: \"eagle\" runs on the trtllm backend"),
])
def test_a_bad_speculative_setting_is_named(table, message):
    errors = errors_of({"speculative": table})
    assert any(e.startswith(message) for e in errors), errors


def test_trtllm_takes_eagle_and_refuses_the_drafters_its_tensorrt_backend_does_not_run():
    errors = errors_of({"backend": "trtllm", "speculative": {}})
    assert any(e.startswith("models.m.speculative.method: TensorRT-LLM's TensorRT backend runs \"eagle\"")
               for e in errors), errors
    errors = errors_of({"backend": "trtllm", "speculative": {"method": "eagle"}})
    assert "models.m.speculative.draft_model: method \"eagle\" needs the EAGLE head's directory" in errors
    table = {"method": "eagle", "draft_model": "/models/eagle", "num_speculative_tokens": 3}
    parse_config({"models": {"m": {"backend": "trtllm", "speculative": table}}})


def test_a_draft_model_on_the_sim_is_refused():
    errors = errors_of({"backend": "sim", "speculative": {"method": "draft_model", "draft_model": "d",
                                                           "acceptance_rate": 0.5}})
    assert "models.m.speculative.method: \"draft_model\" runs on the reference and torch backends (backend is " \
           "'sim')" in errors


def test_speculation_for_an_embedding_model_is_refused(tiny_embed_artifact):
    from inferd.models.factory import EngineConfigError, build_engine

    assert "models.m.speculative: an embedding model decodes no tokens to draft" in errors_of(
        {"task": "embed", "speculative": {}})
    root = tiny_embed_artifact.parent.parent
    cfg = parse_config({"server": {"engines_root": str(root)},
                        "models": {"m": {"artifact": "tiny-embed", "speculative": {}}}})
    with pytest.raises(EngineConfigError, match="embedding model"):
        build_engine("m", cfg.models["m"], cfg.server)
