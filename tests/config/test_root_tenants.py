"""The [auth], [tenants.*] and [admission] tables in inferd.config.root: every bad key named at once."""
from __future__ import annotations

from pathlib import Path

import pytest

from inferd.config.root import ConfigError, check_config_main, load_config, parse_config, with_overrides
from inferd.config.tenants import PriorityClass

ROOT = Path(__file__).resolve().parents[2]


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    return exc.value.errors


def test_bad_tenant_keys_are_all_named_with_their_path():
    errors = errors_of({"tenants": {
        "acme": {"wieght": 2, "priority": "urgent"},
        "beta": {"weight": 0, "requests_per_minute": -1, "allowed_models": ["nope"]},
        "bad name": {}}})
    assert any(e.startswith("tenants.acme.wieght: unknown key") for e in errors)
    assert "tenants.acme.priority: expected one of 'interactive', 'standard', 'batch', got 'urgent'" in errors
    assert "tenants.beta.weight: must be > 0, got 0.0" in errors
    assert any(e.startswith("tenants.beta.requests_per_minute: must be > 0") for e in errors)
    assert any(e.startswith("tenants.beta.allowed_models[0]: no model or alias named 'nope'") for e in errors)
    assert any(e.startswith("tenants.bad name: tenant name must match") for e in errors)


def test_bad_auth_and_admission_keys_are_named():
    errors = errors_of({"auth": {"mode": "password"}, "admission": {"batch_ttl_s": 0, "extra": 1}})
    assert "auth.mode: expected one of 'none', 'api_key', got 'password'" in errors
    assert any(e.startswith("admission.extra: unknown key") for e in errors)
    errors = errors_of({"admission": {"batch_ttl_s": 0}})
    assert errors == ["admission.batch_ttl_s: must be > 0, got 0.0"]


def test_tenants_decode_with_defaults_for_what_they_leave_out():
    cfg = parse_config({"tenants": {"acme": {"priority": "batch", "tokens_per_minute": 1000}}})
    acme = cfg.tenants["acme"]
    assert acme.priority is PriorityClass.BATCH and acme.tokens_per_minute == 1000
    assert acme.weight == 1.0 and acme.requests_per_minute is None and acme.allowed_models == ("*",)
    assert cfg.auth.mode == "none"


def test_auth_off_is_refused_on_a_reachable_address_unless_allowed():
    plain = {"host": "0.0.0.0", "allow_plaintext_non_loopback": True}   # TLS: tests/config/test_tls.py
    errors = errors_of({"server": plain})
    assert len(errors) == 1 and errors[0].startswith("auth.mode: server.host = '0.0.0.0' is not a loopback")
    parse_config({"server": plain, "auth": {"allow_unauthenticated_non_loopback": True}})
    parse_config({"server": plain, "auth": {"mode": "api_key"}})
    with pytest.raises(ConfigError) as exc:                       # `serve --host 0.0.0.0`
        with_overrides(parse_config({}), host="0.0.0.0")
    assert exc.value.errors[0].startswith("auth.mode:")


def test_key_and_secret_files_resolve_against_the_config_directory(tmp_path):
    path = tmp_path / "conf" / "inferd.toml"
    path.parent.mkdir()
    path.write_text('[auth]\nmode = "api_key"\nkeys_file = "keys.jsonl"\nsecret_file = "/etc/inferd/secret"\n')
    cfg = load_config(path)
    assert cfg.auth.keys_file == str(tmp_path / "conf" / "keys.jsonl")
    assert cfg.auth.secret_file == "/etc/inferd/secret"


def test_shipped_config_example_tenants_decode_when_uncommented(tmp_path, capsys):
    text = (ROOT / "config.toml").read_text()
    start = text.index("# [auth]")                      # the examples close the file
    block = "\n".join(line[2:] if line.startswith("# ") else line for line in text[start:].splitlines())
    path = tmp_path / "config.toml"
    path.write_text(text[:start] + block)
    assert check_config_main(str(path)) == 0, capsys.readouterr().err
    cfg = load_config(path)
    assert cfg.auth.mode == "api_key" and set(cfg.tenants) >= {"acme", "default"}


def test_runtime_state_defaults_to_a_state_directory_never_loose_in_the_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    cfg = parse_config({"auth": {"mode": "api_key"}}, base_dir=tmp_path)
    assert cfg.server.state_dir == str(tmp_path / "state")
    assert cfg.auth.keys_file == str(tmp_path / "state" / "keys.jsonl")
    assert cfg.audit.path == str(tmp_path / "state" / "audit.jsonl")
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/inferd")          # what systemd's StateDirectory= sets
    cfg = parse_config({}, base_dir=tmp_path)
    assert (cfg.auth.keys_file, cfg.audit.path) == ("/var/lib/inferd/keys.jsonl", "/var/lib/inferd/audit.jsonl")
    cfg = parse_config({"server": {"state_dir": "run"}, "auth": {"keys_file": "k.jsonl"}}, base_dir=tmp_path)
    assert cfg.audit.path == str(tmp_path / "run" / "audit.jsonl")     # server.state_dir wins over systemd's
    assert cfg.auth.keys_file == str(tmp_path / "k.jsonl")             # a path in the file is kept as written

