import stat
import types

import pytest

from inferd.config.tenants import AuthConfig
from inferd.tenancy.keys import InvalidApiKey, load_authenticator
from inferd.tenancy.keys_cli import keys_main


def test_cli_create_list_revoke_roundtrip(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text('[auth]\nmode = "api_key"\nkeys_file = "k/keys.jsonl"\nsecret_file = "secret"\n')
    (tmp_path / "k").mkdir()
    args = types.SimpleNamespace(config=str(config), keys_command="create", tenant="acme", scope=None)
    assert keys_main(args) == 0
    key = capsys.readouterr().out.strip()
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    auth = load_authenticator(AuthConfig(mode="api_key", keys_file="k/keys.jsonl", secret_file="secret"), tmp_path)
    principal = auth.authenticate(f"Bearer {key}")
    assert principal.tenant == "acme"
    assert keys_main(types.SimpleNamespace(config=str(config), keys_command="list")) == 0
    listing = capsys.readouterr().out
    assert principal.key_id in listing and "active" in listing and key not in listing
    assert keys_main(types.SimpleNamespace(config=str(config), keys_command="revoke",
                                           key_id=principal.key_id)) == 0
    assert keys_main(types.SimpleNamespace(config=str(config), keys_command="revoke", key_id="nope")) == 1
    auth.store.reload()
    with pytest.raises(InvalidApiKey):
        auth.authenticate(f"Bearer {key}")


@pytest.mark.parametrize("command", ["create", "list", "revoke"])
def test_cli_with_a_missing_config_is_an_error_not_an_empty_table(tmp_path, capsys, command):
    args = types.SimpleNamespace(config=str(tmp_path / "nope.toml"), keys_command=command, tenant="a",
                                 scope=None, key_id="x")
    assert keys_main(args) == 1
    captured = capsys.readouterr()
    assert "nope.toml: no such config file" in captured.err and captured.out == ""


def test_cli_with_an_invalid_config_names_every_bad_key(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text('[auth]\nmode = "sometimes"\n[server]\nport = "x"\n')
    assert keys_main(types.SimpleNamespace(config=str(config), keys_command="list")) == 1
    err = capsys.readouterr().err
    assert "auth.mode" in err and "server.port" in err


def test_cli_refuses_a_keys_file_in_a_directory_that_does_not_exist(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text('[auth]\nmode = "api_key"\nkeys_file = "typo/keys.jsonl"\n')
    args = types.SimpleNamespace(config=str(config), keys_command="create", tenant="acme", scope=None)
    assert keys_main(args) == 1
    assert "auth.keys_file" in capsys.readouterr().err and not (tmp_path / "typo").exists()


def test_keys_create_makes_the_default_state_directory_private(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    config = tmp_path / "config.toml"
    config.write_text('[auth]\nmode = "api_key"\n')
    args = types.SimpleNamespace(config=str(config), keys_command="create", tenant="acme", scope=None)
    assert keys_main(args) == 0
    assert (tmp_path / "state" / "keys.jsonl").is_file()
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
