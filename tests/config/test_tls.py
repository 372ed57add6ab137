"""`[server.tls]` and the refusal of plain HTTP on a reachable address (inferd.config.tls, via the root parser)."""
from __future__ import annotations

import pytest

from inferd.config.root import ConfigError, load_config, parse_config, with_overrides
from inferd.config.tenants import InsecureBindError
from inferd.config.tls import TlsConfig, check_tls_binding

KEYED = {"mode": "api_key"}     # auth on, so only the TLS check can object to a reachable address
TLS = {"cert_file": "server.pem", "key_file": "server.key"}


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    return exc.value.errors


def test_a_non_loopback_host_without_tls_is_an_error_naming_server_tls():
    errors = errors_of({"server": {"host": "0.0.0.0"}, "auth": KEYED})
    assert len(errors) == 1 and errors[0].startswith("server.tls: server.host = '0.0.0.0' is not a loopback")
    assert "allow_plaintext_non_loopback" in errors[0]


def test_plain_http_on_a_reachable_host_is_allowed_only_when_said_so_or_with_tls():
    parse_config({"server": {"host": "10.0.0.5", "allow_plaintext_non_loopback": True}, "auth": KEYED})
    cfg = parse_config({"server": {"host": "0.0.0.0", "tls": TLS}, "auth": KEYED})
    assert cfg.server.tls == TlsConfig(cert_file="server.pem", key_file="server.key")


def test_loopback_needs_no_tls_and_tls_is_off_by_default():
    for host in ("127.0.0.1", "::1"):
        assert parse_config({"server": {"host": host}}).server.tls is None
    check_tls_binding(None, "127.0.0.1", False)
    with pytest.raises(InsecureBindError):
        check_tls_binding(None, "192.168.1.10", False)


def test_bad_tls_keys_are_all_named_with_their_path():
    errors = errors_of({"server": {"tls": {"client_cert": "sometimes", "ca": "x"}}})
    assert "server.tls.client_cert: expected one of 'required', 'optional', got 'sometimes'" in errors
    assert any(e.startswith("server.tls.ca: unknown key") for e in errors)
    errors = errors_of({"server": {"tls": {"client_ca_file": ""}}})
    assert any(e.startswith("server.tls.cert_file: required") for e in errors)
    assert any(e.startswith("server.tls.key_file: required") for e in errors)
    assert any(e.startswith("server.tls.client_ca_file: must not be empty") for e in errors)
    assert errors_of({"server": {"tls": {"cert_file": 3, "key_file": "k"}}}) == [
        "server.tls.cert_file: expected str, got int"]


def test_tls_files_resolve_against_the_config_directory(tmp_path):
    path = tmp_path / "conf" / "inferd.toml"
    path.parent.mkdir()
    path.write_text('[server.tls]\ncert_file = "pki/server.pem"\nkey_file = "/etc/inferd/server.key"\n'
                    'client_ca_file = "pki/clients.pem"\nclient_cert = "optional"\n')
    tls = load_config(path).server.tls
    assert tls.cert_file == str(tmp_path / "conf" / "pki" / "server.pem")
    assert tls.key_file == "/etc/inferd/server.key"
    assert tls.client_ca_file == str(tmp_path / "conf" / "pki" / "clients.pem") and tls.client_cert == "optional"


def test_serve_host_override_to_a_reachable_address_needs_tls():
    keyed = parse_config({"auth": KEYED})
    with pytest.raises(ConfigError) as exc:                       # `serve --host 0.0.0.0`
        with_overrides(keyed, host="0.0.0.0")
    assert [e.partition(":")[0] for e in exc.value.errors] == ["server.tls"]
    with_overrides(parse_config({"auth": KEYED, "server": {"tls": TLS}}), host="0.0.0.0")


def test_tenant_by_subject_needs_a_client_ca_and_plain_names():
    errors = errors_of({"server": {"tls": {**TLS, "tenant_by_subject": {"alice": "acme", "CN=bob": "bad name"}}}})
    assert any(e.startswith("server.tls.tenant_by_subject: needs client_ca_file") for e in errors)
    assert any(e.startswith("server.tls.tenant_by_subject.alice: expected an RFC 4514 subject") for e in errors)
    assert any(e.startswith("server.tls.tenant_by_subject.CN=bob: tenant name must match") for e in errors)
    cfg = parse_config({"server": {"tls": {**TLS, "client_ca_file": "ca.pem",
                                           "tenant_by_subject": {"CN=alice,O=acme": "acme"}}}})
    assert cfg.server.tls.tenant_by_subject == {"CN=alice,O=acme": "acme"}
