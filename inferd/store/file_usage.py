"""What each tenant keeps in the store: bytes and count of its files (uploads and batch outputs, what
`max_stored_file_bytes` counts) and its batches, for `inferd usage --files` and GET /admin/usage readers."""
from __future__ import annotations

import msgspec

from inferd.store.db import Database


class TenantFiles(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    file_bytes: int
    files: int
    batches: int


async def tenant_files(db: Database, tenant: str | None = None) -> list[TenantFiles]:
    """Per tenant (or `tenant` alone), sorted by name; tenants with neither files nor batches are absent."""
    where, params = ("WHERE tenant = ? ", (tenant,)) if tenant is not None else ("", ())
    files = {t: (int(b), int(n)) for t, b, n in await db.query(
        f"SELECT tenant, COALESCE(SUM(bytes), 0), COUNT(*) FROM files {where}GROUP BY tenant", params)}
    batches = {t: int(n) for t, n in await db.query(f"SELECT tenant, COUNT(*) FROM batches {where}GROUP BY tenant",
                                                    params)}
    return [TenantFiles(tenant=t, file_bytes=files.get(t, (0, 0))[0], files=files.get(t, (0, 0))[1],
                        batches=batches.get(t, 0)) for t in sorted(set(files) | set(batches))]


def tenant_files_text(rows: list[TenantFiles], fmt: str) -> str:
    """`table` (aligned), `csv`, or `json`/`jsonl` (one object a line)."""
    fields = ("tenant", "file_bytes", "files", "batches")
    if fmt in ("json", "jsonl"):
        return "".join(msgspec.json.encode(r).decode() + "\n" for r in rows)
    table = [fields, *((r.tenant, str(r.file_bytes), str(r.files), str(r.batches)) for r in rows)]
    if fmt == "csv":
        return "".join(",".join(row) + "\n" for row in table)
    widths = [max(len(row[i]) for row in table) for i in range(len(fields))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n" for row in table)
