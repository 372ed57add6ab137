"""The `[server.tls]` table and the refusal to serve plain HTTP on a reachable address.

Only the table and its checks live here; the listener's SSLContext (built from it, reloaded on SIGHUP)
is inferd.daemon.tls. Files are not read at validation time: loading them is the daemon's job, and a
certificate that fails to load fails the start (or the reload) naming the key.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from inferd.config.tenants import TENANT_NAME_RE, InsecureBindError, bind_errors, is_loopback
from inferd.config.walk import ConfigTable

ClientCertMode = Literal["required", "optional"]


class TlsConfig(ConfigTable):
    """`[server.tls]`: the listener speaks HTTPS only. Paths are relative to the config file's directory."""

    # Not msgspec-required: a missing key must be a `server.tls.cert_file: ...` line, not a decode crash.
    cert_file: str = ""                     # PEM: the server certificate, then any intermediates
    key_file: str = ""                      # PEM: its private key (unencrypted)
    client_ca_file: str | None = None       # PEM CA bundle: when set, clients present certificates (mTLS)
    client_cert: ClientCertMode = "required"   # with client_ca_file: "optional" also accepts no certificate
    # Client certificate subject (RFC 4514, "CN=alice,O=acme") -> tenant, for requests without an API key.
    tenant_by_subject: dict[str, str] = {}


def tls_errors(tls: TlsConfig, path: str = "server.tls") -> list[str]:
    errors = []
    for key in ("cert_file", "key_file"):
        if not getattr(tls, key):
            errors.append(f"{path}.{key}: required (a PEM file path) when [server.tls] is present")
    if tls.client_ca_file is not None and not tls.client_ca_file:
        errors.append(f"{path}.client_ca_file: must not be empty (omit it to accept clients without certificates)")
    if tls.tenant_by_subject and not tls.client_ca_file:
        errors.append(f"{path}.tenant_by_subject: needs client_ca_file (without it no client presents a certificate)")
    for subject, tenant in tls.tenant_by_subject.items():
        if "=" not in subject:
            errors.append(f"{path}.tenant_by_subject.{subject}: expected an RFC 4514 subject such as \"CN=alice\"")
        if not TENANT_NAME_RE.match(tenant):
            errors.append(f"{path}.tenant_by_subject.{subject}: tenant name must match {TENANT_NAME_RE.pattern}")
    return errors


def resolve_tls_paths(tls: TlsConfig, resolve: Callable[[str], str]) -> TlsConfig:
    """The same table with every file path passed through `resolve` (relative to the config file)."""
    return msgspec.structs.replace(
        tls, cert_file=resolve(tls.cert_file), key_file=resolve(tls.key_file),
        client_ca_file=resolve(tls.client_ca_file) if tls.client_ca_file else None)


def check_tls_binding(tls: TlsConfig | None, host: str, allow_plaintext: bool) -> None:
    """Refuse plain HTTP on a non-loopback address unless explicitly allowed (as check_auth_binding does
    for auth): API keys and prompts would cross the network in clear. Call at startup and on every load."""
    if tls is None and not is_loopback(host) and not allow_plaintext:
        raise InsecureBindError(
            f"server.host = {host!r} is not a loopback address but there is no [server.tls] table: API keys "
            "and prompts would cross the network unencrypted. Add [server.tls] with cert_file and key_file, "
            "or set server.allow_plaintext_non_loopback = true if TLS ends in front of inferd (a proxy)."
        )


def tls_binding_errors(tls: TlsConfig | None, host: str, allow_plaintext: bool) -> list[str]:
    return bind_errors("server.tls", lambda: check_tls_binding(tls, host, allow_plaintext))
