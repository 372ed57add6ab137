"""A reserve of disk space beside the SQLite file, so that deleting files works on a full disk.

On a full disk SQLite cannot commit even a DELETE: the WAL must grow by the pages the delete changes
(a few per file, its chunks' pages go to the free list). The store keeps `<db>.reserve`, RESERVE_BYTES
of allocated blocks, from its start; a delete that fails for want of space frees it and tries once more,
and the space the delete frees inside the database file is what later writes use. The reserve is made
again (best effort) whenever a file write or delete succeeds and the disk has room for it.
PostgreSQL keeps no reserve: its server owns its disk.
"""
from __future__ import annotations

import asyncio
import os

from inferd.store.db import Database

RESERVE_BYTES = 8 * 1024 * 1024
SUFFIX = ".reserve"


def reserve_path(db: Database) -> str | None:
    """The reserve file of `db` (None: a store without one)."""
    return f"{db.where}{SUFFIX}" if db.dialect == "sqlite" else None


def _make(path: str, size: int) -> bool:
    """Allocate `path` (its blocks, not a sparse file); False when the disk has no room for it now."""
    if os.path.exists(path):
        return True
    tmp = f"{path}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


async def ensure_reserve(db: Database, size: int = RESERVE_BYTES) -> bool:
    """Make `db`'s reserve if it has none and the disk has room (off the loop); True when it is there."""
    path = reserve_path(db)
    if path is None:
        return False
    return await asyncio.to_thread(_make, path, size)


async def release_reserve(db: Database) -> bool:
    """Free `db`'s reserve; True when there was one to free."""
    path = reserve_path(db)
    if path is None:
        return False
    try:
        await asyncio.to_thread(os.unlink, path)
        return True
    except FileNotFoundError:
        return False
