from pathlib import Path

import msgspec
import pytest

from inferd import tomllib
from inferd.config.aliases import AliasConfig, alias_errors
from inferd.config.rollouts import PriceConfig, RolloutConfig, RolloutThresholds, rollout_errors


def test_rollout_config_decodes_from_toml_and_bad_fields_are_named():
    doc = tomllib.loads("""
        [rollouts.chat]
        stable = "llama"
        candidate = "llama@bbbb2222"
        steps = [0.01, 0.05, 0.25, 1.0]
        min_dwell_s = 300
        [rollouts.chat.thresholds]
        max_ttft_p95_ratio = 1.5
        min_samples = 100
    """)
    cfg = msgspec.convert(doc["rollouts"]["chat"], RolloutConfig)
    defaults = {"llama": "aaaa1111"}
    assert rollout_errors("chat", cfg, defaults, ["chat"]) == []
    assert (cfg.min_dwell_s, cfg.thresholds.max_ttft_p95_ratio, cfg.thresholds.min_samples) == (300, 1.5, 100)
    bad = RolloutConfig(stable="llama", candidate="gpt@x", steps=(0.5, 0.2),
                        thresholds=RolloutThresholds(max_cost_ratio=0.9, min_samples=0))
    errors = rollout_errors("chat", bad, defaults, ["chat"])
    for field in ("candidate", "steps", "thresholds.max_cost_ratio", "thresholds.min_samples"):
        assert any(e.startswith(f"rollouts.chat.{field}:") for e in errors), (field, errors)
    assert rollout_errors("nope", cfg, defaults, ["chat"])[0].startswith("rollouts.nope: no alias")
    with pytest.raises(msgspec.ValidationError, match="dwell"):
        msgspec.convert({"stable": "a", "candidate": "b", "dwell": 1}, RolloutConfig)


def test_the_config_example_in_docs_models_md_decodes_and_validates():
    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    doc = tomllib.loads(text.split("```toml\n", 1)[1].split("```", 1)[0])
    defaults = {"llama3": doc["models"]["llama3"]["version"]}
    aliases = {n: msgspec.convert(a, AliasConfig) for n, a in doc["aliases"].items()}
    assert all(alias_errors(n, a, defaults) == [] for n, a in aliases.items())
    for name, raw in doc["rollouts"].items():
        assert rollout_errors(name, msgspec.convert(raw, RolloutConfig), defaults, list(aliases)) == []
    prices = msgspec.convert(doc["prices"], dict[str, PriceConfig])
    assert prices["llama3"].completion_per_1k == 0.0015
