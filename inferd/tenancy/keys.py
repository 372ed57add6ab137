"""API keys: creation, the keys file, and `Authorization: Bearer` checks.

A key is `inf_<key id>_<secret>`: the prefix makes leaked keys recognisable to secret scanners, the
key id (12 hex) is public (logs, `keys list`, revocation) and the secret is 256 bits. Only a hash of
the whole key is stored: HMAC-SHA256 under a server secret read from `auth.secret_file`, or plain
SHA-256 when none is configured. Verification looks the record up by key id and always computes and
compares one hash in constant time; an unknown id is compared against a dummy hash, so an unknown
key costs the same as a wrong one and timing tells nothing about which ids exist.

`inferd keys create|list|revoke` is inferd.tenancy.keys_cli.
"""
from __future__ import annotations

import asyncio
import fcntl
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec

from inferd.config import TENANT_NAME_RE, AuthConfig

KEY_PREFIX = "inf_"
KEY_ID_HEX = 12
SCOPES = ("inference", "admin", "metrics")


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the keys file (JSON lines)."""

    key_id: str
    tenant: str
    scopes: tuple[str, ...]
    alg: str                         # "hmac-sha256" | "sha256"
    hash: str                        # hex digest of the whole key
    created_at: float
    revoked_at: float | None = None


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who is calling. The tenant comes only from the key (or from auth = "none")."""

    tenant: str
    key_id: str | None               # None when auth is off
    scopes: frozenset[str]


class KeyFileError(Exception):
    """The keys file or the secret file cannot be read or is malformed (message names file and line)."""


class AuthError(Exception):
    """A request failed authentication. `status`, `code` and `type` fill the OpenAI error envelope."""

    status = 401
    code = "invalid_api_key"
    type = "invalid_request_error"


class MissingApiKey(AuthError):
    code = "missing_api_key"


class InvalidApiKey(AuthError):
    code = "invalid_api_key"


class InsufficientScope(AuthError):
    status = 403
    code = "insufficient_scope"
    type = "permission_error"


# -- hashing ---------------------------------------------------------------------------------


class KeyHasher:
    def __init__(self, secret: bytes | None) -> None:
        self._secret = secret
        self.alg = "hmac-sha256" if secret else "sha256"

    def digest(self, key: str) -> str:
        data = key.encode("utf-8", "surrogatepass")
        if self._secret:
            return hmac.new(self._secret, data, hashlib.sha256).hexdigest()
        return hashlib.sha256(data).hexdigest()


def read_secret(path: Path) -> bytes:
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise KeyFileError(f"auth.secret_file {path}: {exc.strerror}") from exc
    if len(secret) < 16:
        raise KeyFileError(f"auth.secret_file {path}: secret must be at least 16 bytes, got {len(secret)}")
    return secret


def new_key() -> tuple[str, str]:
    """A fresh (key_id, full key)."""
    key_id = secrets.token_hex(KEY_ID_HEX // 2)
    return key_id, f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def parse_key_id(key: str) -> str | None:
    """The key id of a well-formed key, else None. No secret-dependent branching."""
    if len(key) < len(KEY_PREFIX) + KEY_ID_HEX + 2 or not key.startswith(KEY_PREFIX):
        return None
    key_id = key[len(KEY_PREFIX):len(KEY_PREFIX) + KEY_ID_HEX]
    if key[len(KEY_PREFIX) + KEY_ID_HEX] != "_" or any(c not in "0123456789abcdef" for c in key_id):
        return None
    return key_id


# -- the keys file ---------------------------------------------------------------------------


def load_records(path: Path) -> list[KeyRecord]:
    """All records in the file; a missing file is an empty store."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror}") from exc
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(msgspec.json.decode(line, type=KeyRecord))
        except msgspec.DecodeError as exc:
            raise KeyFileError(f"{path}:{lineno}: {exc}") from exc
    return records


def write_records(path: Path, records: Iterable[KeyRecord]) -> None:
    """Replace the file atomically (temp file in the same directory, fsync, rename), mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            for r in records:
                f.write(msgspec.json.encode(r) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class _FileLock:
    """Serialises read-modify-write of the keys file between concurrent `inferd keys` runs."""

    def __init__(self, path: Path) -> None:
        self._path = path.with_name(f".{path.name}.lock")

    def __enter__(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def create_key(path: Path, hasher: KeyHasher, tenant: str, scopes: Iterable[str] = ("inference",),
               now: float | None = None) -> tuple[KeyRecord, str]:
    """Add a key for `tenant`; returns its record and the key itself (shown once, never stored)."""
    if not TENANT_NAME_RE.match(tenant):
        raise ValueError(f"tenant: must match {TENANT_NAME_RE.pattern}, got {tenant!r}")
    scopes = tuple(dict.fromkeys(scopes))
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise ValueError(f"scope: expected some of {', '.join(SCOPES)}, got {', '.join(bad) or 'none'}")
    with _FileLock(path):
        records = load_records(path)
        taken = {r.key_id for r in records}
        key_id, key = new_key()
        while key_id in taken:  # 48-bit ids: a clash is astronomically rare, but never reuse one
            key_id, key = new_key()
        record = KeyRecord(key_id=key_id, tenant=tenant, scopes=scopes, alg=hasher.alg,
                           hash=hasher.digest(key), created_at=time.time() if now is None else now)
        write_records(path, [*records, record])
    return record, key


def revoke_key(path: Path, key_id: str, now: float | None = None) -> KeyRecord:
    """Mark a key revoked (kept in the file for audit). Raises KeyError for an unknown id."""
    with _FileLock(path):
        records = load_records(path)
        for i, r in enumerate(records):
            if r.key_id == key_id:
                if r.revoked_at is None:
                    r = msgspec.structs.replace(r, revoked_at=time.time() if now is None else now)
                    records[i] = r
                    write_records(path, records)
                return r
    raise KeyError(key_id)


# -- verification ----------------------------------------------------------------------------


class KeyStore:
    """The keys file in memory, re-read on demand (`refresh`, e.g. on SIGHUP)."""

    def __init__(self, path: Path, hasher: KeyHasher) -> None:
        self.path = path
        self.hasher = hasher
        self._records: dict[str, KeyRecord] = {}
        self._stamp: tuple[int, int, int] | None = None
        # Compared against when the key id is unknown, so the work done does not depend on it.
        self._dummy = hasher.digest(new_key()[1])
        self.reload()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def reload(self) -> bool:
        """Re-read the file if it changed (blocking: call off the loop, see `refresh`). True if re-read."""
        stamp = self._file_stamp()
        if stamp == self._stamp and self._stamp is not None:
            return False
        records = load_records(self.path)   # a malformed file raises and keeps the old keys
        self._records = {r.key_id: r for r in records}
        self._stamp = stamp
        return True

    async def refresh(self) -> bool:
        return await asyncio.to_thread(self.reload)

    def __len__(self) -> int:
        return len(self._records)

    def verify(self, key: str) -> KeyRecord | None:
        """The record of a valid, unrevoked key, else None. One hash and one constant-time compare always."""
        key_id = parse_key_id(key)
        record = self._records.get(key_id) if key_id is not None else None
        expected = record.hash if record is not None and record.alg == self.hasher.alg else self._dummy
        ok = hmac.compare_digest(self.hasher.digest(key), expected)
        if not ok or record is None or record.revoked_at is not None:
            return None
        return record


class Authenticator:
    """Maps an `Authorization` header value to a Principal, or raises AuthError."""

    def __init__(self, auth: AuthConfig, store: KeyStore | None = None) -> None:
        if auth.mode == "api_key" and store is None:
            raise ValueError('auth.mode = "api_key" needs a KeyStore')
        self.auth = auth
        self.store = store
        self._anonymous = Principal(tenant=auth.anonymous_tenant, key_id=None, scopes=frozenset(SCOPES))

    def authenticate(self, header_value: str | None, scope: str = "inference") -> Principal:
        if self.auth.mode == "none":
            return self._anonymous
        if not header_value:
            raise MissingApiKey("missing API key: send `Authorization: Bearer <key>`")
        scheme, _, token = header_value.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise MissingApiKey("malformed Authorization header: expected `Bearer <key>`")
        record = self.store.verify(token) if self.store is not None else None
        if record is None:
            raise InvalidApiKey("invalid API key")
        if scope not in record.scopes:
            raise InsufficientScope(f"this key lacks the {scope!r} scope")
        return Principal(tenant=record.tenant, key_id=record.key_id, scopes=frozenset(record.scopes))


def load_authenticator(auth: AuthConfig, base_dir: Path) -> Authenticator:
    """Build the Authenticator for a config; file paths are relative to the config's directory."""
    if auth.mode == "none":
        return Authenticator(auth)
    return Authenticator(auth, KeyStore(base_dir / auth.keys_file, hasher_for(auth, base_dir)))


def hasher_for(auth: AuthConfig, base_dir: Path) -> KeyHasher:
    """The hasher of a config: HMAC under its secret_file (relative to `base_dir`), else plain SHA-256."""
    return KeyHasher(read_secret(base_dir / auth.secret_file) if auth.secret_file else None)
