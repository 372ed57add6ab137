"""`inferd batches list|show ID|cancel ID`: the Batch API's batches, from the store the daemon writes.

`list` and `show` read the database beside a running daemon (SQLite opened read-only, as `inferd usage`).
`cancel` must write, which SQLite allows one process at a time: the store is written directly when it
can be (PostgreSQL always: the runners of every node see the batch `cancelling` within their poll
interval; SQLite when no daemon holds the file: the next daemon's runner ends the batch `cancelled`).
When a running daemon holds the SQLite file, the cancel goes through that daemon's own API instead,
POST /v1/batches/{id}/cancel at --url (default: the config's server.host and port), with the batch's
tenant's key in --api-key or INFERD_API_KEY (none needed with auth.mode = "none").
Exit 1 naming the problem (config, database, unknown batch, a refused cancel).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from inferd.store.batches import BatchRecord, BatchStore
from inferd.store.db import StoreError, StoreLocked, StoreUnavailable

FORMATS = ("table", "json")
_TABLE = ("id", "tenant", "status", "endpoint", "total", "completed", "failed", "created")


class CliError(Exception):
    """What to tell the operator; exit 1."""


def add_batches_parser(sub) -> None:
    batches = sub.add_parser("batches", help="Batch API batches: list, show, cancel")
    batches_sub = batches.add_subparsers(dest="batches_command", required=True)
    list_ = batches_sub.add_parser("list", help="batches, newest first")
    list_.add_argument("--tenant")
    list_.add_argument("--limit", type=int, default=50)
    list_.add_argument("--format", choices=FORMATS, default="table")
    show = batches_sub.add_parser("show", help="one batch, as the API shows it (plus its tenant and lease)")
    show.add_argument("batch_id")
    cancel = batches_sub.add_parser("cancel", help="cancel a validating or in-progress batch")
    cancel.add_argument("batch_id")
    cancel.add_argument("--url", help="the daemon, when it holds the SQLite file (default: from the config)")
    cancel.add_argument("--api-key", default=os.environ.get("INFERD_API_KEY"),
                        help="the batch's tenant's key, for --url (default: $INFERD_API_KEY)")
    for p in (list_, show, cancel):
        p.add_argument("--config", default="config.toml")


def batches_main(args: argparse.Namespace) -> int:
    from inferd.config import ConfigError, load_config
    from inferd.store import open_database

    try:
        config = load_config(args.config)
        if args.batches_command == "cancel":
            print(json.dumps(asyncio.run(_cancel(config, args)), indent=2))
            return 0
        if args.batches_command == "list" and args.limit < 1:
            raise CliError(f"--limit must be >= 1, got {args.limit}")
        return asyncio.run(_read(open_database(config.store, readonly=True), args))
    except ConfigError as exc:
        sys.stderr.write(exc.report())
    except (CliError, StoreError) as exc:
        print(f"inferd batches: {exc}", file=sys.stderr)
    return 1


def describe(batch: BatchRecord) -> dict:
    return {**batch.to_openai(), "tenant": batch.tenant, "lease_owner": batch.lease_owner,
            "lease_until": batch.lease_until}


async def _read(db, args: argparse.Namespace) -> int:
    await db.open()
    try:
        store = BatchStore(db)
        if args.batches_command == "show":
            batch = await store.load(args.batch_id, counts=True)
            if batch is None:
                raise CliError(f"no batch {args.batch_id!r}")
            print(json.dumps(describe(batch), indent=2))
            return 0
        found = await store.list(args.tenant, limit=args.limit)
        if args.format == "json":
            for batch in found:
                print(json.dumps(describe(batch)))
            return 0
        print("\t".join(_TABLE))
        for b in found:
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(b.created_at))
            print("\t".join(map(str, (b.id, b.tenant, b.status, b.endpoint, b.total, b.completed, b.failed,
                                      created))))
        return 0
    finally:
        await db.close()


async def _cancel(config, args: argparse.Namespace) -> dict:
    from inferd.store import open_database

    if config.store.backend == "sqlite" and not os.path.isfile(config.store.path):
        # Opening it read-write would create an empty database where a wrong --config points.
        raise StoreUnavailable(f"{config.store.path}: no database here (has the daemon run with this state "
                               "directory?)")
    db = open_database(config.store)
    try:
        await db.open()
    except StoreLocked:
        return await _cancel_over_http(config, args)
    try:
        store = BatchStore(db)
        batch = await store.load(args.batch_id)
        if batch is None:
            raise CliError(f"no batch {args.batch_id!r}")
        batch = await store.request_cancel(batch.tenant, batch.id, now=time.time())
        if batch.status not in ("cancelling", "cancelled"):
            raise CliError(f"batch {batch.id} is {batch.status}; only a validating or in-progress batch can be "
                           "cancelled")
        return describe(batch)
    finally:
        await db.close()


async def _cancel_over_http(config, args: argparse.Namespace) -> dict:
    import aiohttp

    server = config.server
    url = args.url or f"{'https' if server.tls is not None else 'http'}://{_host(server.host)}:{server.port}"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    target = f"{url.rstrip('/')}/v1/batches/{args.batch_id}/cancel"
    try:
        async with aiohttp.ClientSession() as http, http.post(target, headers=headers) as resp:
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise CliError(f"the daemon holds {config.store.path}, and its API at {url} did not answer: {exc}") from None
    if resp.status != 200:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        hint = " (give the batch's tenant's key: --api-key or INFERD_API_KEY)" if resp.status == 401 else ""
        raise CliError(f"the daemon refused the cancel: HTTP {resp.status}: {message}{hint}")
    return body


def _host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
