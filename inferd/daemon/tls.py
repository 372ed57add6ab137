"""The listener's TLS: one ssl.SSLContext for the life of the site, its certificate reloaded on SIGHUP.

The site keeps the SSLContext it was started with, so a reload cannot hand it a new one. Instead the
new certificate and key are loaded into that same context (`load_cert_chain`): handshakes after the
reload present the new certificate, connections already established keep their session untouched.
A failed `load_cert_chain` can leave a context half-changed (OpenSSL drops the old key once a
certificate it does not match is set), so a reload first loads the new files into a scratch context
off the event loop; only when that succeeds is the live context touched. What a live context cannot
change in place (TLS on or off, the client CA bundle and mode: CAs can only be added) needs a restart.
"""
from __future__ import annotations

import asyncio
import ssl

from inferd.config import TlsConfig

# Changing these on SIGHUP is logged as needing a restart and kept as running.
RESTART_ONLY_TLS = ("client_ca_file", "client_cert")


class TlsError(Exception):
    """A certificate, key or CA file that does not load; the message names its `server.tls.*` key."""


def build_context(cfg: TlsConfig) -> ssl.SSLContext:
    """A server context from `[server.tls]` (reads files: call off the event loop)."""
    ctx = _server_context()
    _load_chain(ctx, cfg)
    if cfg.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=cfg.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"server.tls.client_ca_file: cannot load {cfg.client_ca_file}: {_reason(exc)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.client_cert == "required" else ssl.CERT_OPTIONAL
    return ctx


def _server_context() -> ssl.SSLContext:
    # Not create_default_context(Purpose.CLIENT_AUTH): that also trusts the system CAs, and with mTLS any
    # publicly issued client certificate would then verify. Client certificates verify against
    # client_ca_file only. The constructor already sets no compression and server cipher preference.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _check_chain(cfg: TlsConfig) -> None:
    _load_chain(_server_context(), cfg)


def _load_chain(ctx: ssl.SSLContext, cfg: TlsConfig) -> None:
    try:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"server.tls.cert_file / key_file: cannot load the certificate {cfg.cert_file} "
                       f"with the key {cfg.key_file}: {_reason(exc)}") from None


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)


class ListenerTls:
    """The live context and the `[server.tls]` it was last loaded from."""

    def __init__(self, cfg: TlsConfig, context: ssl.SSLContext) -> None:
        self.config = cfg
        self.context = context

    @classmethod
    async def start(cls, cfg: TlsConfig) -> ListenerTls:
        return cls(cfg, await asyncio.to_thread(build_context, cfg))

    async def check(self, new: TlsConfig) -> None:
        """Raise TlsError if the new certificate and key would not load; touches nothing live."""
        await asyncio.to_thread(_check_chain, new)

    def apply(self, new: TlsConfig) -> None:
        """Load the new certificate and key into the live context, after `check` passed. Every reload
        loads them, same paths or not: renewal tools (certbot, cert-manager) replace files in place.

        On the loop, not in a thread: every handshake on the loop reads this context, and OpenSSL does
        not promise that changing it while another thread reads it is safe; it is two small local files.
        The files could still change between `check` and here; then this raises TlsError."""
        _load_chain(self.context, new)
        self.config = new
