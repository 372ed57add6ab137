"""`inferd usage`: usage totals per tenant, model and UTC day, or every row, from the store the daemon writes;
`--files`: each tenant's stored files (bytes, count) and batches.

Reads the database the config names (the daemon may be running: SQLite is opened read-only beside it).
Exit 1 naming the problem when the config or the database cannot be read.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from inferd.store.db import StoreError
from inferd.store.file_usage import tenant_files, tenant_files_text
from inferd.store.ledger import Ledger
from inferd.store.usage_export import FORMATS, UsageArgumentError, rows_text, totals_text, usage_filter

PAGE = 10_000


def add_usage_parser(sub) -> None:
    usage = sub.add_parser("usage", help="usage totals per tenant/model/day, or every ledger row (CSV/JSONL)")
    usage.add_argument("--config", default="config.toml")
    usage.add_argument("--tenant")
    usage.add_argument("--model")
    usage.add_argument("--since", help="UTC date (2026-11-01), ISO time or unix seconds; inclusive")
    usage.add_argument("--until", help="the same; exclusive")
    usage.add_argument("--rows", action="store_true", help="every row instead of daily totals (for billing)")
    usage.add_argument("--by-version", action="store_true",
                       help="daily totals per model version too (each precision tier's cost apart)")
    usage.add_argument("--files", action="store_true",
                       help="per tenant: bytes and count of stored files (max_stored_file_bytes counts these), batches")
    usage.add_argument("--format", choices=FORMATS, default="table")


def usage_main(args: argparse.Namespace) -> int:
    from inferd.config import ConfigError, load_config
    from inferd.store import open_database

    try:
        config = load_config(args.config)
        f = usage_filter(args.tenant, args.model, args.since, args.until)
        return asyncio.run(_print(open_database(config.store, readonly=True), f, args))
    except ConfigError as exc:
        sys.stderr.write(exc.report())
    except (UsageArgumentError, StoreError) as exc:
        print(f"inferd usage: {exc}", file=sys.stderr)
    return 1


async def _print(db, f, args: argparse.Namespace) -> int:
    await db.open()
    try:
        if args.files:
            sys.stdout.write(tenant_files_text(await tenant_files(db, args.tenant), args.format))
            return 0
        ledger = Ledger(db)
        # Rows are paged out: formats that stream (CSV, JSON lines) only.
        fmt = {"table": "csv", "json": "jsonl"}.get(args.format, args.format) if args.rows else args.format
        if not args.rows:
            sys.stdout.write(totals_text(await ledger.totals(f, by_version=args.by_version), fmt,
                                         by_version=args.by_version))
            return 0
        after, first = 0, True
        while True:             # page through: an export of millions of rows never sits in memory at once
            page = await ledger.rows(f, limit=PAGE, after=after)
            text = rows_text(page, fmt)
            if not first and fmt == "csv":
                text = text.split("\n", 1)[1]      # one header line for the whole export
            sys.stdout.write(text)
            first = False
            if len(page) < PAGE:
                return 0
            after = page[-1][0]
    finally:
        await db.close()
