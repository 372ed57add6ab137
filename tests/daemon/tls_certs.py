"""A throwaway CA and certificates for the TLS tests, made at test time with the `openssl` CLI.

EC P-256 keys (fast to generate), valid for a day, the server's for IP 127.0.0.1 (what the tests
dial), each with the serial number the caller picks so a test can tell which certificate it was served.
Call these from synchronous fixtures or helpers: they run `openssl` as a subprocess.
"""
from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="the openssl CLI makes the test certificates")

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    serial: int


def _openssl(*args: str | Path, cwd: Path) -> str:
    done = subprocess.run([OPENSSL, *map(str, args)], cwd=cwd, check=True, capture_output=True, timeout=30, text=True)
    return done.stdout


def rfc2253_subject(cert: Path) -> str:
    """The certificate's subject as `openssl x509 -subject -nameopt RFC2253` prints it (what operators copy)."""
    out = _openssl("x509", "-in", cert, "-noout", "-subject", "-nameopt", "RFC2253", cwd=cert.parent)
    return out.strip().removeprefix("subject=")


class TestCA:
    """A CA in `directory`: issue server and client certificates signed by it."""

    __test__ = False    # not a pytest test class, whatever its name

    def __init__(self, directory: Path, name: str = "inferd test CA") -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = directory / "ca.pem", directory / "ca.key"
        _openssl("req", "-x509", *_EC, "-keyout", self.key, "-out", self.cert, "-days", "1", "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 cwd=directory)

    def issue(self, name: str, *, serial: int, server: bool = True, subject: str | None = None) -> Issued:
        """A certificate and key `<name>.pem` / `<name>.key`: for a server on 127.0.0.1, or a client.
        `subject` in openssl's form ("/O=acme/CN=alice"); default CN=127.0.0.1 (server) or CN=<name>."""
        cert, key, csr, ext = (self.dir / f"{name}.{s}" for s in ("pem", "key", "csr", "ext"))
        subject = subject or f"/CN={'127.0.0.1' if server else name}"
        _openssl("req", "-new", *_EC, "-keyout", key, "-out", csr, "-subj", subject, cwd=self.dir)
        usage = "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n" if server \
            else "extendedKeyUsage=clientAuth\n"
        ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                       "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n" + usage)
        _openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key, "-set_serial", str(serial),
                 "-days", "1", "-extfile", ext, "-out", cert, cwd=self.dir)
        return Issued(cert, key, serial)

    def client_context(self, client: Issued | None = None) -> ssl.SSLContext:
        """What a client that trusts this CA uses (optionally presenting `client`'s certificate)."""
        ctx = ssl.create_default_context(cafile=str(self.cert))
        if client is not None:
            ctx.load_cert_chain(client.cert, client.key)
        return ctx
