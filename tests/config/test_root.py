from __future__ import annotations

from pathlib import Path

import pytest

from inferd.__main__ import main
from inferd.config.root import (
    Config,
    ConfigError,
    ModelConfig,
    ServerConfig,
    check_config_main,
    load_config,
    parse_config,
    with_overrides,
)
from tests.conftest import front_processes_for_tests

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def write_config(tmp_path):
    def write(text: str) -> Path:
        path = tmp_path / "config.toml"
        path.write_text(text)
        return path

    return write


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return info.value.errors


def test_empty_config_means_defaults_serving_reference_small():
    cfg = parse_config({})
    # (tests/conftest.py sets the suite's front_processes, whose product default is "auto")
    assert cfg.server == ServerConfig(front_processes=front_processes_for_tests())
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 8000
    assert list(cfg.models) == ["small"]
    assert cfg.models["small"].backend == "reference"


def test_shipped_config_validates_and_binds_loopback_reference_small():
    cfg = load_config(REPO_ROOT / "config.toml")
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8000)
    assert cfg.models["small"].backend == "reference"
    assert cfg.models["small"].artifact == "small"
    # relative paths resolve against the config file's directory, not the working directory
    assert Path(cfg.server.engines_root) == REPO_ROOT / "engines"


def test_shipped_config_matches_struct_defaults():
    shipped = load_config(REPO_ROOT / "config.toml")
    defaults = parse_config({}, base_dir=REPO_ROOT)
    assert shipped.server == defaults.server
    model = shipped.models["small"]
    assert model == ModelConfig(artifact="small", num_kv_blocks=2048, default_max_tokens=128)   # a CPU model: short answers


def test_unknown_key_is_named_with_its_path():
    errs = errors_of({"models": {"small": {"max_batch": 3}}})
    assert len(errs) == 1
    assert errs[0].startswith("models.small.max_batch: unknown key")


def test_unknown_top_level_table_is_an_error():
    assert errors_of({"sevrer": {}})[0].startswith("sevrer: unknown key")


def test_wrong_type_is_named_with_path_and_types():
    errs = errors_of({"models": {"small": {"max_batch_size": "32"}}})
    assert errs == ["models.small.max_batch_size: expected int, got str"]


def test_wrong_type_in_nested_backend_section():
    errs = errors_of({"models": {"s": {"backend": "sim", "sim": {"time_scale": "fast"}}}})
    assert errs == ["models.s.sim.time_scale: expected float, got str"]


def test_wrong_type_inside_a_map_names_the_entry():
    raw = {"models": {"t": {"backend": "trtllm", "trtllm": {"lora_adapters": {"support": 3}}}}}
    assert errors_of(raw) == ["models.t.trtllm.lora_adapters.support: expected str, got int"]


def test_bad_enum_value_lists_the_choices():
    errs = errors_of({"models": {"small": {"backend": "gpu"}}})
    assert errs == ["models.small.backend: expected one of 'reference', 'torch', 'sim', 'trtllm', got 'gpu'"]


def test_every_error_is_reported_not_just_the_first():
    raw = {
        "server": {"port": "80", "hots": "x", "drain_grace_s": -1},
        "models": {
            "a": {"max_batch_size": 0, "block_size": 12},
            "b": {"max_num_tokens": "many"},
            "c": {"backend": "reference", "sim": {"profile": "llama3-8b-h100"}},
        },
        "extra": 1,
    }
    errs = errors_of(raw)
    joined = "\n".join(errs)
    for expected in (
        "server.port: expected int, got str",
        "server.hots: unknown key",
        "server.drain_grace_s: must be >= 0",          # a semantic error beside the table's malformed keys
        "extra: unknown key",
        "models.a.max_batch_size: must be > 0",
        "models.a.block_size: must be a power of two",
        "models.b.max_num_tokens: expected int, got str",
        'models.c.sim: a [sim] section needs backend = "sim"',
    ):
        assert expected in joined
    assert len(errs) == 8


def test_localhost_is_accepted_as_the_loopback_host():
    assert parse_config({"server": {"host": "localhost"}}).server.host == "localhost"


def test_semantic_errors_of_server():
    errs = errors_of({"server": {"host": "example.com", "port": 70000, "max_body_bytes": 0,
                                 "drain_grace_s": -1.0, "allow_plaintext_non_loopback": True},
                      "auth": {"allow_unauthenticated_non_loopback": True}})
    assert errs == [
        "server.host: expected an IP address such as 127.0.0.1 (or localhost), got 'example.com'",
        "server.port: must be in 0..65535 (0 = any free port), got 70000",
        "server.max_body_bytes: must be > 0, got 0",
        "server.drain_grace_s: must be >= 0, got -1.0",
    ]


def test_trtllm_section_needs_trtllm_backend():
    errs = errors_of({"models": {"m": {"backend": "sim", "trtllm": {}}}})
    assert errs == ["models.m.trtllm: a [trtllm] section needs backend = \"trtllm\" (backend is 'sim')"]


def test_unknown_sim_profile_is_named():
    errs = errors_of({"models": {"m": {"backend": "sim", "sim": {"profile": "nope"}}}})
    assert len(errs) == 1 and errs[0].startswith("models.m.sim.profile: unknown profile 'nope'")


def test_model_name_must_be_url_and_label_safe():
    errs = errors_of({"models": {"a@b": {}}})
    assert errs[0].startswith("models.a@b: model name must match")


def test_explicitly_empty_models_is_an_error():
    assert errors_of({"models": {}}) == ["models: at least one [models.<name>] table is required"]


def test_int_is_accepted_for_float_keys():
    assert parse_config({"server": {"drain_grace_s": 5}}).server.drain_grace_s == 5.0


def test_config_is_frozen():
    cfg = parse_config({})
    with pytest.raises(AttributeError):
        cfg.server.port = 1  # type: ignore[misc]


def test_toml_syntax_error_names_the_file(write_config):
    path = write_config("[server\nport = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.source == str(path)
    assert info.value.errors[0].startswith("TOML syntax:")


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml")
    assert "cannot read" in info.value.errors[0]


def test_overrides_apply_and_are_checked():
    cfg = with_overrides(Config(), host="::1", port=0)
    assert (cfg.server.host, cfg.server.port) == ("::1", 0)
    with pytest.raises(ConfigError) as info:
        with_overrides(Config(), port=-1)
    assert info.value.errors == ["server.port: must be in 0..65535 (0 = any free port), got -1"]


def test_trtllm_paths_resolve_against_config_dir(write_config):
    path = write_config(
        '[models.t]\nbackend = "trtllm"\n[models.t.trtllm]\nengine_dir = "eng"\n'
        'lora_adapters = { a = "/abs/a", b = "rel/b" }\n'
    )
    t = load_config(path).models["t"].trtllm
    assert t.engine_dir == str(path.parent / "eng")
    assert t.lora_adapters == {"a": "/abs/a", "b": str(path.parent / "rel/b")}


def test_check_config_exit_zero_for_valid(capsys):
    assert check_config_main(str(REPO_ROOT / "config.toml")) == 0
    assert "ok" in capsys.readouterr().out


def test_check_config_names_every_bad_key_and_exits_one(write_config, capsys):
    path = write_config('[server]\nport = "x"\nbogus = 1\n[models.small]\nmax_batch_size = -2\n')
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "3 error(s)" in err
    assert "server.port: expected int, got str" in err
    assert "server.bogus: unknown key" in err
    assert "models.small.max_batch_size: must be > 0, got -2" in err


def test_memory_budget_keys_are_checked_and_each_bad_one_named():
    bad = {"backend": "sim", "memory_bytes": -5, "prewarm_at": ["8:00", "24:00", "07:30"]}
    errors = errors_of({"server": {"model_memory_bytes": 0, "min_residency_s": -1}, "models": {"m": bad}})
    assert "server.model_memory_bytes: must be > 0 bytes (omit it for no budget), got 0" in errors
    assert "server.min_residency_s: must be >= 0 seconds, got -1.0" in errors
    assert "models.m.memory_bytes: must be > 0 bytes, got -5" in errors
    assert "models.m.prewarm_at[0]: expected a UTC time of day as HH:MM, got '8:00'" in errors
    assert "models.m.prewarm_at[1]: expected a UTC time of day as HH:MM, got '24:00'" in errors
    assert not any("prewarm_at[2]" in e for e in errors)
    cfg = parse_config({"server": {"model_memory_bytes": 10 ** 9},
                        "models": {"m": {"backend": "sim", "pinned": True, "prewarm_at": ["07:30"]}}})
    assert cfg.server.model_memory_bytes == 10 ** 9 and cfg.models["m"].prewarm_at == ("07:30",)
