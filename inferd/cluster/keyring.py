"""The cluster's keys (memberlist's keyring): several accepted at once, the first one used to send.

The key file holds one key a line (at least 64 hex digits; blank lines and `#` comments are ignored),
or, as a single key, at least 32 raw bytes. The FIRST key is the primary: it encrypts every datagram
and signs every forwarded identity. EVERY key in the file decrypts and verifies. A key that leaves the
file on a reload is still accepted for `key_grace_s`. So a rotation is three reloads on every node,
each finished everywhere before the next starts: install (the new key as a second line: everyone
accepts it), use (it moves to the first line: everyone sends with it), remove (the old line goes).
No node ever sends with a key another node does not accept.

Datagrams are AES-256-GCM under a key derived from each cluster key (HKDF-SHA256, its own label), so
the same secret never serves two algorithms; forwarded identities are HMAC-SHA256 under the key
itself with a length-prefixed purpose label.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
from collections.abc import Callable, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAC_BYTES = 32
NONCE_BYTES = 12                   # AES-GCM's standard nonce, random per datagram
TAG_BYTES = 16
SEAL_OVERHEAD = NONCE_BYTES + TAG_BYTES
FORWARD = b"forward"               # Keyring.mac purpose of forwarded requests' identity
AES_INFO = b"inferd gossip aes-256-gcm v1"

_MIN_RAW_KEY = 32
_MIN_HEX_KEY = 64
_HEX = re.compile(rb"[0-9a-fA-F]+")


class ClusterKeyError(Exception):
    """The key file is missing, unreadable or holds a bad key; the message names the file (and line)."""


def load_keys(path: str) -> list[bytes]:
    """The keys in `path`, primary first. Raises ClusterKeyError naming the file (and the line).

    A file where no line is a hex key is one raw key (all of it, surrounding whitespace stripped), as
    before keyrings; a file with hex keys must have nothing else but blank lines and comments."""
    raw = _read(path)
    if not raw.strip():
        raise ClusterKeyError(f"cluster key file {path}: is empty (need at least {_MIN_HEX_KEY} hex digits "
                              f"or {_MIN_RAW_KEY} bytes)")
    lines = [(n, line.strip()) for n, line in enumerate(raw.split(b"\n"), 1)]
    key_lines = [(n, line) for n, line in lines if line and not line.startswith(b"#")]
    if not any(_is_hex_key(line) for _, line in key_lines):
        single = raw.strip()
        if len(single) < _MIN_RAW_KEY:
            raise ClusterKeyError(f"cluster key file {path}: too short ({len(single)} bytes; need at least "
                                  f"{_MIN_HEX_KEY} hex digits or {_MIN_RAW_KEY} bytes)")
        return [single]
    keys: list[bytes] = []
    for n, line in key_lines:
        if not _is_hex_key(line):
            raise ClusterKeyError(f"cluster key file {path}, line {n}: expected a key of at least {_MIN_HEX_KEY} "
                                  f"hex digits (an even number), got {len(line)} characters")
        key = bytes.fromhex(line.decode("ascii"))
        if key in keys:
            raise ClusterKeyError(f"cluster key file {path}, line {n}: the same key as line "
                                  f"{key_lines[keys.index(key)][0]}")
        keys.append(key)
    return keys


def _is_hex_key(line: bytes) -> bool:
    return len(line) >= _MIN_HEX_KEY and len(line) % 2 == 0 and _HEX.fullmatch(line) is not None


def load_key(path: str) -> bytes:
    """The primary key of `path` (load_keys' first)."""
    return load_keys(path)[0]


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ClusterKeyError(f"cluster key file {path}: does not exist") from None
    except IsADirectoryError:
        raise ClusterKeyError(f"cluster key file {path}: is a directory, not a file") from None
    except PermissionError:
        raise ClusterKeyError(f"cluster key file {path}: not readable (permission denied)") from None
    except OSError as e:
        raise ClusterKeyError(f"cluster key file {path}: cannot be read ({e.strerror or e})") from None


def fingerprint(key: bytes) -> str:
    """A short name for a key in logs (a hash of it under its own label; never the key)."""
    return hashlib.sha256(b"inferd key fingerprint\x00" + key).hexdigest()[:12]


class _Key:
    """One key: its HMAC state with each purpose prefix already fed in, and its AES-GCM cipher."""

    __slots__ = ("key", "aead", "_base", "_by_purpose")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._base = hmac.new(key, digestmod=hashlib.sha256)
        self._by_purpose: dict[bytes, hmac.HMAC] = {}
        aes_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=AES_INFO).derive(key)
        self.aead = AESGCM(aes_key)

    def mac(self, purpose: bytes, data: bytes) -> bytes:
        purpose = bytes(purpose)
        h = self._by_purpose.get(purpose)
        if h is None:
            if len(purpose) > 0xFFFF:
                raise ValueError("MAC purpose longer than 65535 bytes")
            h = self._base.copy()
            h.update(len(purpose).to_bytes(2, "big") + purpose)
            self._by_purpose[purpose] = h
        h = h.copy()
        h.update(data)
        return h.digest()

    def decrypt(self, aad: bytes, data: bytes) -> bytes | None:
        try:
            return self.aead.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], aad)
        except InvalidTag:
            return None


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"cluster key must be bytes, not {type(key).__name__}")
    if not key:
        raise ValueError("cluster key is empty")
    return bytes(key)


class Keyring:
    """The keys in use (primary first) and those that left the file, each until its grace period ends."""

    def __init__(self, keys: bytes | Sequence[bytes], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys = self._make(keys)
        self._retired: list[tuple[_Key, float]] = []       # (key, accepted until)

    @staticmethod
    def _make(keys: bytes | Sequence[bytes]) -> list[_Key]:
        listed = [keys] if isinstance(keys, (bytes, bytearray)) else list(keys)
        if not listed:
            raise ValueError("a keyring needs at least one key")
        return [_Key(_check_key(k)) for k in listed]

    @property
    def primary_fingerprint(self) -> str:
        return fingerprint(self._keys[0].key)

    def fingerprints(self) -> list[str]:
        """Every key in use, primary first, then those in their grace period (for logs)."""
        return [fingerprint(k.key) for k in self._keys] + [fingerprint(k.key) for k, _ in self._live_retired()]

    def update(self, keys: bytes | Sequence[bytes], grace_s: float) -> bool:
        """The key file's keys after a reload: the first becomes primary, every one is accepted; a key no
        longer listed is still accepted for `grace_s`. False (nothing changes) when the list is the same."""
        new = self._make(keys)
        if [k.key for k in new] == [k.key for k in self._keys]:
            return False
        listed = {k.key for k in new}
        until = self._clock() + max(0.0, grace_s)
        kept = [(k, t) for k, t in self._live_retired() if k.key not in listed]
        self._retired = kept + [(k, until) for k in self._keys if k.key not in listed]
        self._keys = new
        return True

    def mac(self, purpose: bytes, data: bytes) -> bytes:
        """HMAC-SHA256 under the primary key of `purpose` (length-prefixed) + `data`: MAC_BYTES bytes."""
        return self._keys[0].mac(purpose, data)

    def verify(self, purpose: bytes, data: bytes, mac: bytes) -> bool:
        """Constant-time check against every key in use and those within their grace period."""
        if len(mac) != MAC_BYTES:
            return False
        return any(hmac.compare_digest(k.mac(purpose, data), mac) for k in self._accepted())

    def encrypt(self, aad: bytes, plaintext: bytes) -> bytes:
        """Random nonce + AES-256-GCM ciphertext and tag of `plaintext` under the primary key (SEAL_OVERHEAD
        bytes longer than `plaintext`); `aad` is authenticated, not sent."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._keys[0].aead.encrypt(nonce, plaintext, aad)

    def decrypt(self, aad: bytes, data: bytes) -> bytes | None:
        """The plaintext of `encrypt`'s output under any accepted key with this `aad`; None if none opens it."""
        if len(data) < SEAL_OVERHEAD:
            return None
        for key in self._accepted():
            plaintext = key.decrypt(aad, data)
            if plaintext is not None:
                return plaintext
        return None

    def _accepted(self) -> list[_Key]:
        return self._keys + [k for k, _ in self._live_retired()]

    def _live_retired(self) -> list[tuple[_Key, float]]:
        if self._retired:
            now = self._clock()
            self._retired = [(k, t) for k, t in self._retired if now < t]     # grace over: forgotten
        return self._retired


__all__ = ["FORWARD", "MAC_BYTES", "SEAL_OVERHEAD", "ClusterKeyError", "Keyring", "fingerprint", "load_key",
           "load_keys"]
