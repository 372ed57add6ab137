"""API keys: creation, revocation, the in-memory key store, and `Authorization: Bearer` checks.

A key is `inf_<key id>_<secret>`: the prefix makes leaked keys recognisable to secret scanners, the
key id (12 hex) is public (logs, `keys list`, revocation) and the secret is 256 bits. Only a hash of
the whole key is stored: HMAC-SHA256 under a server secret read from `auth.secret_file`, or plain
SHA-256 when none is configured. Verification looks the record up by key id and always computes and
compares one hash in constant time; an unknown id is compared against a dummy hash, so an unknown
key costs the same as a wrong one and timing tells nothing about which ids exist.

The file itself (format, atomic writes, locking) is inferd.tenancy.keys_file; `inferd keys create|list|revoke`
is inferd.tenancy.keys_cli.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec

from inferd.config import DEFAULT_STATE_DIR, KEYS_FILE, TENANT_NAME_RE, AuthConfig
from inferd.tenancy.keys_file import (
    FileLock,
    KeyFileError,
    KeyFileUnchanged,
    KeyRecord,
    Stamp,
    load_records,
    parse_records,
    read_stamped,
    write_records,
)

KEY_PREFIX = "inf_"
KEY_ID_HEX = 12
SCOPES = ("inference", "admin", "metrics")


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who is calling. The tenant comes only from the key (or from auth = "none")."""

    tenant: str
    key_id: str | None               # None when auth is off
    scopes: frozenset[str]


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


def create_key(path: Path, hasher: KeyHasher, tenant: str, scopes: Iterable[str] = ("inference",),
               now: float | None = None) -> tuple[KeyRecord, str]:
    """Add a key for `tenant`; returns its record and the key itself (shown once, never stored)."""
    if not TENANT_NAME_RE.match(tenant):
        raise ValueError(f"tenant: must match {TENANT_NAME_RE.pattern}, got {tenant!r}")
    scopes = tuple(dict.fromkeys(scopes))
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise ValueError(f"scope: expected some of {', '.join(SCOPES)}, got {', '.join(bad) or 'none'}")
    with FileLock(path):
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
    with FileLock(path):
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
    """The keys file in memory, re-read on demand (`reread`; inferd.tenancy.key_reload polls it)."""

    def __init__(self, path: Path, hasher: KeyHasher) -> None:
        self.path = path
        self.hasher = hasher
        self._records: dict[str, KeyRecord] = {}
        self._stamp: Stamp | None = None
        self._read_once = False
        self._bad: tuple[Stamp | None, str] | None = None   # the malformed file last seen, and why
        self._settling: Stamp | None = None                  # an in-place rewrite seen once (see reread)
        # Compared against when the key id is unknown, so the work done does not depend on it.
        self._dummy = hasher.digest(new_key()[1])
        self.reload()

    def _file_stamp(self) -> Stamp | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def reread(self, *, settle: bool = False) -> tuple[dict[str, KeyRecord], dict[str, KeyRecord]] | None:
        """If the file changed since last read, swap in its records and return (old, new) by key id;
        else None. Blocking: call off the loop. A malformed file raises KeyFileError and keeps the old
        keys; asking again while that same file is unchanged raises KeyFileUnchanged.

        `settle` (the poll): a file rewritten in place (same inode; a shell redirect, some editors) is
        read only once its stamp is the same at two calls in a row, so a poll landing mid-write does
        not take a truncated or half-written file for the new keys. A file replaced by rename (`inferd
        keys`, atomic) is read at once."""
        stamp = self._file_stamp()
        if self._read_once and stamp == self._stamp:
            return None
        in_place = stamp is not None and self._stamp is not None and stamp[0] == self._stamp[0]
        if settle and in_place and stamp != self._settling:
            self._settling = stamp
            return None
        if self._bad is not None and stamp == self._bad[0]:
            raise KeyFileUnchanged(self._bad[1])
        stamp, data = read_stamped(self.path)
        try:
            records = parse_records(self.path, data)
        except KeyFileError as exc:
            self._bad = (stamp, str(exc))
            raise
        old, self._records = self._records, {r.key_id: r for r in records}
        self._stamp, self._bad, self._read_once = stamp, None, True
        return old, self._records

    def reload(self) -> bool:
        """Re-read the file if it changed (blocking: call off the loop, see `refresh`). True if re-read."""
        return self.reread() is not None

    async def refresh(self) -> bool:
        return await asyncio.to_thread(self.reload)

    def records(self) -> dict[str, KeyRecord]:
        return self._records

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
        self._static = auth.static_key_sha256 if auth.mode == "api_key" else None   # serve --model --api-key

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
        if record is None and self._static is not None and hmac.compare_digest(
                hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest(), self._static):
            return self._anonymous          # the one key the command line gave: every scope, as vLLM's
        if record is None:
            raise InvalidApiKey("invalid API key")
        if scope not in record.scopes:
            raise InsufficientScope(f"this key lacks the {scope!r} scope")
        return Principal(tenant=record.tenant, key_id=record.key_id, scopes=frozenset(record.scopes))


def load_authenticator(auth: AuthConfig, base_dir: Path) -> Authenticator:
    """Build the Authenticator for a config; file paths are relative to the config's directory."""
    if auth.mode == "none":
        return Authenticator(auth)
    keys_file = auth.keys_file or Path(DEFAULT_STATE_DIR) / KEYS_FILE   # parse_config fills it in; code may not
    return Authenticator(auth, KeyStore(base_dir / keys_file, hasher_for(auth, base_dir)))


def hasher_for(auth: AuthConfig, base_dir: Path) -> KeyHasher:
    """The hasher of a config: HMAC under its secret_file (relative to `base_dir`), else plain SHA-256."""
    return KeyHasher(read_secret(base_dir / auth.secret_file) if auth.secret_file else None)
