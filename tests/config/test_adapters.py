"""inferd.config.adapters: a model's `lora_adapters` (every backend), its LRU keys, and trtllm's older spelling."""
from __future__ import annotations

import pytest

from inferd.config import served_adapters
from inferd.config.root import ConfigError, load_config, parse_config


def errors_of(model: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config({"models": {"m": model}})
    return info.value.errors


def test_adapter_sources_resolve_against_the_config_dir_and_a_sim_needs_none(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[models.r]\nlora_adapters = { a = "/abs/a", b = "rel/b" }\nmax_loaded_adapters = 2\n'
                    'adapter_idle_unload_s = 60.0\n[models.s]\nbackend = "sim"\nlora_adapters = { sql = "" }\n')
    cfg = load_config(path)
    r = cfg.models["r"]
    assert r.lora_adapters == {"a": "/abs/a", "b": str(tmp_path / "rel/b")}
    assert (r.max_loaded_adapters, r.adapter_idle_unload_s) == (2, 60.0)
    assert cfg.models["s"].lora_adapters == {"sql": ""}


def test_adapter_names_are_plain_and_the_lru_keys_positive():
    assert errors_of({"lora_adapters": {"a:b": "x", "v@1": "y", "": "z", "ok": ""}, "max_loaded_adapters": 0,
                      "adapter_idle_unload_s": 0.0}) == [
        "models.m.lora_adapters.a:b: an adapter name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ "
        "(requests name it as model:adapter, so no ':', '@' or spaces)",
        "models.m.lora_adapters.v@1: an adapter name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ "
        "(requests name it as model:adapter, so no ':', '@' or spaces)",
        "models.m.lora_adapters.: an adapter name must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ "
        "(requests name it as model:adapter, so no ':', '@' or spaces)",
        "models.m.lora_adapters.ok: must name the adapter's directory (only the sim reads no files)",
        "models.m.max_loaded_adapters: must be >= 1, got 0",
        "models.m.adapter_idle_unload_s: must be > 0 seconds (leave it out: never), got 0.0",
    ]
    assert errors_of({"lora_adapters": {"a": 3}}) == ["models.m.lora_adapters.a: expected str, got int"]


def test_trtllm_takes_either_key_but_not_both():
    top = parse_config({"models": {"t": {"backend": "trtllm", "lora_adapters": {"a": "/a"}}}}).models["t"]
    nested = parse_config({"models": {"t": {"backend": "trtllm", "trtllm": {"lora_adapters": {"b": "/b"}}}}}).models["t"]
    assert served_adapters(top) == {"a": "/a"} and served_adapters(nested) == {"b": "/b"}
    assert errors_of({"backend": "trtllm", "lora_adapters": {"a": "/a"}, "trtllm": {"lora_adapters": {"b": "/b"}}}) == [
        "models.m.trtllm.lora_adapters: adapters are set in models.m.lora_adapters too; keep one table "
        "(models.m.lora_adapters serves every backend)"]
