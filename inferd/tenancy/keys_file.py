"""The keys file: JSON lines of KeyRecord, read with its stamp, replaced atomically, locked for writers.

Writers (`inferd keys`) hold an flock on `.<name>.lock` for read-modify-write and replace the file by
temp file + fsync + rename, so a reader (the daemon's poll, inferd.tenancy.key_reload) sees either the
old file or the new one, never half of one. The (inode, mtime_ns, size) stamp tells a reader whether
anything changed without reading the file.
"""
from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

import msgspec


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the keys file (JSON lines)."""

    key_id: str
    tenant: str
    scopes: tuple[str, ...]
    alg: str                         # "hmac-sha256" | "sha256"
    hash: str                        # hex digest of the whole key
    created_at: float
    revoked_at: float | None = None


class KeyFileError(Exception):
    """The keys file or the secret file cannot be read or is malformed (message names file and line)."""


class KeyFileUnchanged(KeyFileError):
    """The keys file is still the malformed one already reported (the old keys are still in effect)."""


# -- reading and writing -------------------------------------------------------------------


def load_records(path: Path) -> list[KeyRecord]:
    """All records in the file; a missing file is an empty store."""
    return parse_records(path, read_stamped(path)[1])


Stamp = tuple[int, int, int]        # (inode, mtime_ns, size): a rename or a rewrite changes it


def read_stamped(path: Path) -> tuple[Stamp | None, bytes]:
    """The file's stamp and bytes from one open (so they describe the same file); missing: (None, b"")."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            return (st.st_ino, st.st_mtime_ns, st.st_size), fh.read()
    except FileNotFoundError:
        return None, b""
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror}") from exc


def parse_records(path: Path, data: bytes) -> list[KeyRecord]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"{path}: not UTF-8 text: {exc.reason}") from exc
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


class FileLock:
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
