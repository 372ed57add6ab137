"""HTTPS through the real daemon: the official SDK over TLS with a test CA, refusals of plain HTTP and of
unverified clients, certificate reload on SIGHUP that keeps open connections, and mTLS.

Certificates come from a CA made at test time (tests/daemon/tls_certs.py, the `openssl` CLI).
"""
from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import httpx
import openai
import pytest
from openai import AsyncOpenAI

from inferd.api.auth import rfc4514
from inferd.config.root import load_config
from inferd.daemon.lifecycle import Daemon
from tests.daemon.harness import running, sim_model, write_config
from tests.daemon.test_reload import reload_counts
from tests.daemon.tls_certs import Issued, TestCA, needs_openssl, rfc2253_subject

pytestmark = needs_openssl

FIRST_SERIAL, SECOND_SERIAL = 0x1001, 0x2002


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "pki")


@pytest.fixture
def server_cert(ca: TestCA) -> Issued:
    return ca.issue("server", serial=FIRST_SERIAL)


def tls_config(tmp_path: Path, extra: str = "") -> Path:
    """A daemon config serving model `m` over TLS; paths relative to the config file, as users write them."""
    return write_config(tmp_path / "c.toml", {"m": sim_model()},
                        '[server.tls]\ncert_file = "pki/server.pem"\nkey_file = "pki/server.key"\n' + extra)


def https(daemon: Daemon) -> str:
    return f"https://127.0.0.1:{daemon.port}"


@contextlib.asynccontextmanager
async def sdk(daemon: Daemon, verify: ssl.SSLContext | bool) -> AsyncIterator[AsyncOpenAI]:
    async with httpx.AsyncClient(verify=verify) as http:
        yield AsyncOpenAI(base_url=https(daemon) + "/v1", api_key="unused", http_client=http, max_retries=0)


class RawConnection:
    """One kept-alive TLS connection, to show which certificate it got and that it survives a reload."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, daemon: Daemon, ctx: ssl.SSLContext) -> RawConnection:
        return cls(*await asyncio.open_connection("127.0.0.1", daemon.port, ssl=ctx))

    @property
    def serial(self) -> int:
        return int(self.writer.get_extra_info("ssl_object").getpeercert()["serialNumber"], 16)

    async def get(self, path: str) -> int:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n".encode())
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode()
        length = next(int(line.split(":", 1)[1]) for line in head.split("\r\n")
                      if line.lower().startswith("content-length:"))
        await self.reader.readexactly(length)
        return int(head.split(" ", 2)[1])

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()


async def test_a_completion_over_https_with_the_test_ca_works(tmp_path, ca, server_cert):
    async with running(tls_config(tmp_path)) as (daemon, _), sdk(daemon, ca.client_context()) as client:
        resp = await client.completions.create(model="m", prompt="hello", max_tokens=4)
        assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 4
        models = await client.models.list()
        assert [m.id for m in models.data] == ["m"]


async def test_plain_http_to_the_tls_port_fails_and_the_port_keeps_serving_https(tmp_path, ca, server_cert):
    async with running(tls_config(tmp_path)) as (daemon, _):
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{daemon.port}/healthz") as resp:
                    await resp.read()
        conn = await RawConnection.open(daemon, ca.client_context())
        assert await conn.get("/healthz") == 200
        await conn.close()


async def test_a_client_without_the_test_ca_fails_certificate_verification(tmp_path, ca, server_cert):
    async with running(tls_config(tmp_path)) as (daemon, _), sdk(daemon, True) as client:   # system CAs only
        with pytest.raises(openai.APIConnectionError) as exc:
            await client.completions.create(model="m", prompt="hello", max_tokens=4)
        assert "CERTIFICATE_VERIFY_FAILED" in repr(exc.value.__cause__)


async def test_sighup_serves_a_new_certificate_to_new_connections_and_keeps_open_ones(tmp_path, ca, server_cert):
    async with running(tls_config(tmp_path)) as (daemon, _):
        before = await RawConnection.open(daemon, ca.client_context())
        assert before.serial == FIRST_SERIAL and await before.get("/healthz") == 200
        ca.issue("server", serial=SECOND_SERIAL)        # renewed in place, as certbot does
        result = await daemon.reload()
        assert result.ok and reload_counts(daemon)["success"] == 1
        assert await before.get("/readyz") == 200 and before.serial == FIRST_SERIAL   # the old connection lives on
        after = await RawConnection.open(daemon, ca.client_context())
        assert after.serial == SECOND_SERIAL and await after.get("/healthz") == 200
        async with sdk(daemon, ca.client_context()) as client:
            resp = await client.completions.create(model="m", prompt="hello", max_tokens=2)
            assert resp.usage.completion_tokens == 2
        await before.close()
        await after.close()


async def test_a_certificate_that_fails_to_load_on_reload_changes_nothing_and_counts_an_error(
        tmp_path, ca, server_cert):
    async with running(tls_config(tmp_path)) as (daemon, _):
        config_before = daemon.state.config
        # A new certificate beside the old key: the pair does not match, so loading it must fail as a whole.
        other = ca.issue("other", serial=SECOND_SERIAL)
        server_cert.cert.write_bytes(other.cert.read_bytes())
        result = await daemon.reload()
        assert not result.ok and result.errors[0].startswith("server.tls.cert_file / key_file: cannot load")
        assert reload_counts(daemon) == {"success": 0, "error": 1}
        assert daemon.state.config is config_before
        conn = await RawConnection.open(daemon, ca.client_context())
        assert conn.serial == FIRST_SERIAL and await conn.get("/healthz") == 200
        await conn.close()
        server_cert.cert.write_text("not a certificate\n")     # garbage, not only a mismatch
        assert not (await daemon.reload()).ok and reload_counts(daemon)["error"] == 2


async def test_a_certificate_that_does_not_load_fails_the_start_naming_the_key(tmp_path, ca, server_cert, caplog):
    server_cert.key.write_text("not a key\n")
    assert await Daemon(load_config(tls_config(tmp_path))).run() == 1
    (failure,) = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "startup_failed"]
    assert failure["error_type"] == "TlsError" and failure["error"].startswith("server.tls.cert_file / key_file")


async def test_mtls_refuses_a_client_without_a_certificate_and_serves_one_with(tmp_path, ca, server_cert):
    client_cert = ca.issue("alice", serial=0x3003, server=False)
    path = tls_config(tmp_path, 'client_ca_file = "pki/ca.pem"\n')
    async with running(path) as (daemon, _):
        async with sdk(daemon, ca.client_context()) as client:
            with pytest.raises(openai.APIConnectionError):
                await client.completions.create(model="m", prompt="hello", max_tokens=2)
        anonymous = await RawConnection.open(daemon, ca.client_context())   # TLS 1.3: refused after the hello
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError, ssl.SSLError)):
            await anonymous.get("/healthz")
        await anonymous.close()
        async with sdk(daemon, ca.client_context(client_cert)) as client:
            resp = await client.completions.create(model="m", prompt="hello", max_tokens=2)
            assert resp.usage.completion_tokens == 2
        stranger = TestCA(tmp_path / "other-ca").issue("mallory", serial=0x3006, server=False)
        async with sdk(daemon, ca.client_context(stranger)) as client:     # only client_ca_file is trusted
            with pytest.raises(openai.APIConnectionError):
                await client.completions.create(model="m", prompt="hello", max_tokens=2)


async def test_optional_client_certificates_accept_clients_without_one(tmp_path, ca, server_cert):
    path = tls_config(tmp_path, 'client_ca_file = "pki/ca.pem"\nclient_cert = "optional"\n')
    async with running(path) as (daemon, _), sdk(daemon, ca.client_context()) as client:
        resp = await client.completions.create(model="m", prompt="hello", max_tokens=2)
        assert resp.usage.completion_tokens == 2


async def test_a_reload_cannot_turn_tls_off_or_change_the_client_ca_it_needs_a_restart(tmp_path, ca, server_cert):
    path = tls_config(tmp_path)
    async with running(path) as (daemon, _):
        text = path.read_text()
        path.write_text(text.partition("[server.tls]")[0])      # the table is last: drop it
        assert (await daemon.reload()).ok
        assert daemon.state.config.server.tls is not None
        path.write_text(text + 'client_ca_file = "pki/ca.pem"\n')
        assert (await daemon.reload()).ok
        assert daemon.state.config.server.tls.client_ca_file is None
        conn = await RawConnection.open(daemon, ca.client_context())     # still HTTPS, still no client cert
        assert await conn.get("/healthz") == 200
        await conn.close()


async def test_a_mapped_client_certificate_is_its_tenant_when_the_request_has_no_api_key(tmp_path, ca, server_cert):
    alice = ca.issue("alice", serial=0x3003, server=False)
    bob = ca.issue("bob", serial=0x3004, server=False)
    path = tls_config(tmp_path, 'client_ca_file = "pki/ca.pem"\ntenant_by_subject = { "CN=alice" = "acme" }\n'
                                '[auth]\nmode = "api_key"\n[tenants.acme]\nweight = 2.0\n')
    no_key = {"Authorization": openai.omit}      # the SDK sends `Bearer <api_key>` unless told not to
    async with running(path) as (daemon, _):
        async with sdk(daemon, ca.client_context(alice)) as client:
            resp = await client.completions.create(model="m", prompt="hello", max_tokens=2, extra_headers=no_key)
            assert resp.usage.completion_tokens == 2
            assert tenant_requests(daemon) == {("acme", "200"): 1}
            with pytest.raises(openai.AuthenticationError):     # a key, when sent, decides: this one is wrong
                await client.completions.create(model="m", prompt="hello", max_tokens=2)
            async with httpx.AsyncClient(verify=ca.client_context(alice)) as http:   # a certificate: inference only
                assert (await http.get(https(daemon) + "/metrics")).status_code == 403
        async with sdk(daemon, ca.client_context(bob)) as client:      # verified, but its subject is not mapped
            with pytest.raises(openai.AuthenticationError):
                await client.completions.create(model="m", prompt="hello", max_tokens=2, extra_headers=no_key)


def tenant_requests(daemon: Daemon) -> dict[tuple[str, str], float]:
    counter = daemon.state.metrics.tenant_requests_total
    return {(s.labels["tenant"], s.labels["status"]): s.value for m in counter.collect() for s in m.samples
            if s.name.endswith("_total")}


def test_subjects_are_written_as_openssl_prints_them_for_rfc2253(ca):
    odd = ca.issue("odd", serial=0x3005, server=False, subject="/C=FR/O=Acme, Inc./OU=ml;ops/CN=alice")
    decoded = ssl._ssl._test_decode_cert(str(odd.cert))     # what getpeercert() returns for this certificate
    assert rfc4514(decoded["subject"]) == rfc2253_subject(odd.cert) == "CN=alice,OU=ml\\;ops,O=Acme\\, Inc.,C=FR"


async def test_the_consoles_session_cookie_is_secure_over_tls(tmp_path, ca, server_cert):
    """auth.mode is "none" here: any key signs in; what matters is the cookie's Secure flag on HTTPS."""
    async with running(tls_config(tmp_path)) as (daemon, _), httpx.AsyncClient(verify=ca.client_context()) as http:
        resp = await http.post(https(daemon) + "/admin/ui/login", data={"key": "any"})
        assert resp.status_code == 303
        cookie = resp.headers["set-cookie"]
        assert "inferd_console=" in cookie and "Secure" in cookie and "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
