import tomllib
from pathlib import Path

import msgspec
import pytest

from inferd.config.aliases import AliasConfig, alias_errors, split_from_config
from inferd.types import ModelVersion

V1 = ModelVersion("llama", "aaaa1111")
V2 = ModelVersion("llama", "bbbb2222")
V3 = ModelVersion("llama", "cccc3333")


def test_alias_config_decodes_and_reports_every_bad_target():
    cfg = msgspec.convert({"split": {"llama": 95, "llama@bbbb2222": 5}, "shadow": "llama@cccc3333",
                           "shadow_fraction": 0.1}, AliasConfig)
    s = split_from_config(cfg, {"llama": V1.version})
    assert [a.target for a in s.arms] == [V1, V2] and s.shadow == V3
    bad = AliasConfig(split={"gpt": 1.0, "qwen@x": 1.0})
    errors = alias_errors("chat", bad, {"llama": V1.version})
    assert len(errors) == 2 and all(e.startswith("aliases.chat: target") for e in errors)
    assert alias_errors("chat", cfg, {"llama": V1.version}) == []
    with pytest.raises(msgspec.ValidationError, match="wieght"):
        msgspec.convert({"split": {"llama": 1}, "wieght": 1}, AliasConfig)


def tiered(**tables) -> AliasConfig:
    return msgspec.convert({"split": {"llama": 1.0}, **tables}, AliasConfig)


def test_a_tier_may_name_one_version_or_a_weighted_split_of_versions():
    cfg = tiered(tiers={"batch": {"llama@bbbb2222": 3, "llama@cccc3333": 1}, "interactive": "llama"},
                 tenants={"acme": "llama@cccc3333"})
    assert alias_errors("chat", cfg, {"llama": V1.version}) == []
    s = split_from_config(cfg, {"llama": V1.version})
    rules = dict(s.tiers)
    assert [(a.target, a.weight) for a in rules["batch"].arms] == [(V2, 3.0), (V3, 1.0)]
    assert rules["batch"].key == "tiers.batch" and [a.target for a in rules["interactive"].arms] == [V1]
    assert s.tier_rule("acme", "batch").key == "tenants.acme"          # a tenant's rule wins over its class's
    assert s.tier_rule("globex", "batch").key == "tiers.batch"
    assert s.tier_rule("globex", "standard") is None


@pytest.mark.parametrize("tables, message", [
    ({"tiers": {"batch": {"llama@bbbb2222": 0}}}, "aliases.chat.tiers.batch: a split needs a positive total weight"),
    ({"tiers": {"batch": {"llama@bbbb2222": -1, "llama": 2}}},
     "aliases.chat.tiers.batch: a split needs at least one arm and finite weights >= 0"),
    ({"tiers": {"batch": {"llama": 1, "llama@aaaa1111": 1}}},
     "aliases.chat.tiers.batch: a split names the same version twice"),
    ({"tenants": {"-acme": "llama"}}, "aliases.chat.tenants.-acme: tenant name must match"),
    ({"tiers": {"batch": "llama@dddd4444"}},
     "aliases.chat.tiers.batch: target 'llama@dddd4444': version 'dddd4444' is not configured in [models.llama]"),
    ({"tenants": {"acme": {"qwen@x1": 1.0}}},
     "aliases.chat.tenants.acme: target 'qwen@x1' is not a version of a model this alias splits (llama)"),
])
def test_a_tier_that_cannot_route_is_refused_naming_its_key(tables, message):
    configured = {"llama": (V1.version, V2.version, V3.version), "qwen": ("x1",)}
    errors = alias_errors("chat", tiered(**tables), {"llama": V1.version, "qwen": "x1"}, configured=configured)
    assert any(e.startswith(message) for e in errors), errors


def test_a_tier_version_is_not_checked_against_a_latest_default():
    """A "latest" default is resolved at load: the config cannot list that model's versions."""
    cfg = tiered(tiers={"batch": "llama@ffff9999"})
    assert alias_errors("chat", cfg, {"llama": "latest"}, configured={}) == []


def test_the_precision_tiers_example_in_docs_models_md_validates():
    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    section = text.split("## Precision tiers", 1)[1]
    doc = tomllib.loads(section.split("```toml\n", 1)[1].split("```", 1)[0])
    model = doc["models"]["small"]
    configured = {"small": (model["version"], *model["versions"])}
    cfg = msgspec.convert(doc["aliases"]["chat"], AliasConfig)
    assert alias_errors("chat", cfg, {"small": model["version"]}, configured=configured) == []
    rules = dict(split_from_config(cfg, {"small": model["version"]}).tiers)
    assert sorted(a.weight for a in rules["batch"].arms) == [0.1, 0.9]
    assert set(doc["prices"]) == {f"small@{v}" for v in configured["small"]}    # every tier's version priced
