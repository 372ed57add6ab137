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
