"""inferd.config.trust: `trusted_keys` in [server] and [models.<name>]: shape checks and path resolution."""
from __future__ import annotations

from pathlib import Path

import pytest

from inferd.config.root import ConfigError, load_config, parse_config
from inferd.config.trust import trust_list_errors


def test_empty_and_repeated_entries_are_named_by_index():
    assert trust_list_errors("server.trusted_keys", ("a.pub", "b.pub")) == []
    assert trust_list_errors("models.m.trusted_keys", ("a.pub", " ", "a.pub")) == [
        "models.m.trusted_keys[1]: must be the path of a .pub file, got ' '",
        "models.m.trusted_keys[2]: 'a.pub' is listed twice",
    ]


def test_both_tables_are_checked_and_a_wrong_type_is_named():
    with pytest.raises(ConfigError) as info:
        parse_config({"server": {"trusted_keys": [""]},
                      "models": {"m": {"trusted_keys": "release.pub"}}})
    errors = info.value.errors
    assert any(e.startswith("server.trusted_keys[0]: must be the path of a .pub file") for e in errors)
    assert any(e.startswith("models.m.trusted_keys") for e in errors)


def test_key_paths_resolve_against_the_config_files_directory(tmp_path: Path):
    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "config.toml"
    path.write_text('[server]\ntrusted_keys = ["keys/release.pub", "/abs/ops.pub"]\n'
                    '[models.m]\ntrusted_keys = ["team.pub"]\n')
    cfg = load_config(path)
    assert cfg.server.trusted_keys == (str(tmp_path / "etc" / "keys" / "release.pub"), "/abs/ops.pub")
    assert cfg.models["m"].trusted_keys == (str(tmp_path / "etc" / "team.pub"),)


def test_no_trusted_keys_is_the_default():
    cfg = parse_config({})
    assert cfg.server.trusted_keys == () and cfg.models["small"].trusted_keys == ()
