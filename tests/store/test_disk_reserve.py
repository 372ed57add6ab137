"""inferd.store.disk_reserve: the reserve file beside an SQLite store, made, freed and made again."""
from __future__ import annotations

import os

from inferd.store import SqliteDatabase
from inferd.store.disk_reserve import ensure_reserve, release_reserve, reserve_path


async def test_the_reserve_is_allocated_freed_once_and_made_again(tmp_path):
    db = SqliteDatabase(str(tmp_path / "inferd.db"))
    path = reserve_path(db)
    assert path == str(tmp_path / "inferd.db.reserve")
    assert await ensure_reserve(db, 1 << 20)
    assert os.stat(path).st_size == 1 << 20 and os.stat(path).st_blocks * 512 >= 1 << 20     # not sparse
    assert await release_reserve(db) and not os.path.exists(path)
    assert not await release_reserve(db)
    assert await ensure_reserve(db, 1 << 20) and os.path.exists(path)
