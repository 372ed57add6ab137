"""Signed artifacts: an ed25519 signature over an artifact's manifest, in `manifest.sig` beside it.

The manifest lists every file's sha256, so one signature over its bytes covers every file: checking
a signed artifact is checking the signature, then every file against the manifest
(artifacts.verify_artifact). The crypto is the `cryptography` package's; none of it is ours.

Keys (`inferd engines keygen`): the private key is PKCS#8 PEM, unencrypted, mode 0600 (an
unencrypted OpenSSH ed25519 key from `ssh-keygen -t ed25519 -N ''` is accepted too); the public key
is one OpenSSH line, `ssh-ed25519 AAAA... comment`. A key's fingerprint is OpenSSH's: `SHA256:` and
the unpadded base64 of the sha256 of the key's wire blob, so `ssh-keygen -lf KEY.pub` prints the same.

`manifest.sig` is TOML: `format`, `algorithm = "ed25519"`, `signer` (the fingerprint), `public_key`
(the OpenSSH line) and `signature` (base64, over SIGNED_PREFIX + the manifest's bytes; the prefix
keeps a signature made here from meaning anything anywhere else the key is used). The public key
travels with the signature, so any signature can be checked and its signer named with no trust
list; trust is whether that signer is in one (`trusted_keys`).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from inferd import tomllib
from inferd.artifacts.manifest import (
    MANIFEST_FILE,
    SIGNATURE_FILE,
    ArtifactError,
    Manifest,
    parse_manifest,
    verify_artifact,
)

SIGNATURE_FORMAT = 1
SIGNED_PREFIX = b"inferd artifact manifest v1\n"
PRIVATE_SUFFIX = ".key"
PUBLIC_SUFFIX = ".pub"


class SigningKeyError(Exception):
    """A key file that cannot be read, or is not an ed25519 key of the expected kind; names the file."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)


class Signature(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    algorithm: str
    signer: str
    public_key: str
    signature: str


# --- keys ------------------------------------------------------------------------------------

def _openssh_line(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """OpenSSH's SHA256 fingerprint (what `ssh-keygen -lf` prints)."""
    blob = base64.b64decode(_openssh_line(public_key).split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _parse_public_line(line: str) -> Ed25519PublicKey:
    """An OpenSSH public key line; ValueError saying what is wrong with it."""
    fields = line.split()
    if not fields or fields[0] != "ssh-ed25519":
        raise ValueError("not an OpenSSH ed25519 public key (expected a line `ssh-ed25519 AAAA...`)")
    try:
        key = serialization.load_ssh_public_key(" ".join(fields[:2]).encode())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"not a valid ssh-ed25519 public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an ed25519 public key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SigningKeyError(path, f"cannot read the public key: {getattr(exc, 'strerror', None) or exc}") from None
    if "PRIVATE KEY" in text:
        raise SigningKeyError(path, "this is a private key; trusted keys are the .pub files")
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 1:
        raise SigningKeyError(path, f"expected one `ssh-ed25519 AAAA...` line, found {len(lines)}")
    try:
        return _parse_public_line(lines[0])
    except ValueError as exc:
        raise SigningKeyError(path, str(exc)) from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SigningKeyError(path, f"cannot read the private key: {exc.strerror or exc}") from None
    if data.lstrip().startswith(b"ssh-"):
        raise SigningKeyError(path, "this is a public key; signing needs the private key file")
    loader = serialization.load_ssh_private_key if b"OPENSSH PRIVATE KEY" in data else \
        serialization.load_pem_private_key
    try:
        key = loader(data, password=None)
    except TypeError:                   # cryptography's word for "encrypted, and no password given"
        raise SigningKeyError(path, "the private key is encrypted; inferd reads unencrypted keys only") from None
    except (ValueError, UnsupportedAlgorithm):
        raise SigningKeyError(path, "not a PEM (PKCS#8) or OpenSSH private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(path, f"not an ed25519 private key (a {type(key).__name__})")
    return key


def load_trusted_keys(paths: Iterable[str]) -> dict[str, str]:
    """Fingerprint -> the .pub file it came from, for every path; SigningKeyError names a bad one."""
    return {fingerprint(load_public_key(p)): str(p) for p in paths}


def generate_key_pair(out_dir: str | Path, name: str) -> tuple[Path, Path]:
    """Write `<name>.key` (0600) and `<name>.pub` into `out_dir`; never overwrites either."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    private_path, public_path = out_dir / f"{name}{PRIVATE_SUFFIX}", out_dir / f"{name}{PUBLIC_SUFFIX}"
    for path in (private_path, public_path):
        if path.exists():
            raise SigningKeyError(path, "already exists; not overwriting a key (move it away or pick --name)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    _write_new(private_path, pem, 0o600)
    _write_new(public_path, f"{_openssh_line(key.public_key())} {name}\n".encode(), 0o644)
    return private_path, public_path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise SigningKeyError(path, "already exists; not overwriting a key") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


# --- signing ---------------------------------------------------------------------------------

def sign_artifact(artifact_dir: str | Path, key: Ed25519PrivateKey, *, check_files: bool = True) -> str:
    """Write `manifest.sig` for the artifact's manifest as it is on disk; returns the signer's fingerprint.
    `check_files` first verifies every file against the manifest (never sign what was tampered with);
    a build that has just hashed them skips it."""
    artifact_dir = Path(artifact_dir)
    manifest_path = artifact_dir / MANIFEST_FILE
    try:
        data = manifest_path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{manifest_path}: unreadable: {exc.strerror or exc}", MANIFEST_FILE) from None
    manifest = parse_manifest(data, manifest_path)
    if check_files:
        verify_artifact(artifact_dir, manifest)
    public_key = key.public_key()
    signer = fingerprint(public_key)
    signature = base64.b64encode(key.sign(SIGNED_PREFIX + data)).decode()
    text = (f"# ed25519 signature over {MANIFEST_FILE} (inferd.artifacts.signing)\n"
            f"format = {SIGNATURE_FORMAT}\nalgorithm = \"ed25519\"\nsigner = \"{signer}\"\n"
            f"public_key = \"{_openssh_line(public_key)}\"\nsignature = \"{signature}\"\n")
    tmp = artifact_dir / f".{SIGNATURE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, artifact_dir / SIGNATURE_FILE)
    return signer


# --- verifying -------------------------------------------------------------------------------

def read_signature(artifact_dir: str | Path) -> Signature | None:
    """The artifact's signature, None when it has none; ArtifactError when the file does not parse."""
    path = Path(artifact_dir) / SIGNATURE_FILE
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable signature: {exc}", SIGNATURE_FILE) from None
    try:
        sig = msgspec.convert(raw, Signature)
    except msgspec.ValidationError as exc:
        raise ArtifactError(f"{path}: not a signature file: {exc}", SIGNATURE_FILE) from None
    if sig.format != SIGNATURE_FORMAT or sig.algorithm != "ed25519":
        raise ArtifactError(f"{path}: format {sig.format}, algorithm {sig.algorithm!r} is not supported "
                            f"(expected {SIGNATURE_FORMAT}, 'ed25519')", SIGNATURE_FILE)
    return sig


def check_signature(artifact_dir: str | Path, data: bytes, sig: Signature) -> str:
    """That `sig` signs the manifest bytes `data`; returns the signer's fingerprint."""
    path = Path(artifact_dir) / SIGNATURE_FILE
    try:
        public_key = _parse_public_line(sig.public_key)
        raw = base64.b64decode(sig.signature, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise ArtifactError(f"{path}: {exc}", SIGNATURE_FILE) from None
    signer = fingerprint(public_key)
    if signer != sig.signer:
        raise ArtifactError(f"{path}: signer {sig.signer} is not the fingerprint of its public key ({signer})",
                            SIGNATURE_FILE)
    try:
        public_key.verify(raw, SIGNED_PREFIX + data)
    except InvalidSignature:
        raise ArtifactError(f"{Path(artifact_dir)}: {MANIFEST_FILE} does not match its signature by {signer} "
                            f"(changed after signing)", MANIFEST_FILE) from None
    return signer


def trusted_list(trusted: Mapping[str, str]) -> str:
    """`fingerprint (path), ...`: what refusals say would have been trusted."""
    return ", ".join(f"{fp} ({path})" for fp, path in trusted.items())


def verify_signed_artifact(artifact_dir: str | Path, trusted: Mapping[str, str] | None = None, *,
                           check_files: bool = True) -> tuple[Manifest, str | None]:
    """The manifest and its signer (None: unsigned). Checks the signature when there is one; with
    `trusted` (fingerprint -> .pub path) non-empty, refuses an unsigned artifact or an unknown signer;
    then, with `check_files`, every file against the manifest. ArtifactError names what failed."""
    artifact_dir = Path(artifact_dir)
    manifest_path = artifact_dir / MANIFEST_FILE
    try:
        data = manifest_path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{artifact_dir}: no {MANIFEST_FILE} (not an artifact directory)", MANIFEST_FILE) from None
    except OSError as exc:
        raise ArtifactError(f"{manifest_path}: unreadable: {exc.strerror or exc}", MANIFEST_FILE) from None
    sig = read_signature(artifact_dir)
    signer = check_signature(artifact_dir, data, sig) if sig is not None else None
    if trusted:
        if signer is None:
            raise ArtifactError(f"{artifact_dir}: unsigned, and trusted_keys requires a signature by one of: "
                                f"{trusted_list(trusted)}", SIGNATURE_FILE)
        if signer not in trusted:
            raise ArtifactError(f"{artifact_dir}: signed by {signer}, which is not a trusted key "
                                f"(trusted: {trusted_list(trusted)})", SIGNATURE_FILE)
    manifest = parse_manifest(data, manifest_path)
    if check_files:
        verify_artifact(artifact_dir, manifest)
    return manifest, signer
