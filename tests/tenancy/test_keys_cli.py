import stat
import types

import pytest

from inferd.config.tenants import AuthConfig
from inferd.tenancy.keys import InvalidApiKey, load_authenticator
from inferd.tenancy.keys_cli import keys_main


def test_cli_create_list_revoke_roundtrip(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text('[auth]\nmode = "api_key"\nkeys_file = "k/keys.jsonl"\nsecret_file = "secret"\n')
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
