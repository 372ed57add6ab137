"""Durable state: the usage ledger, idempotency keys, files and batches, stored responses, on SQLite or PostgreSQL."""
from __future__ import annotations

from inferd.config import StoreConfig
from inferd.store.batches import BatchError, BatchRecord, BatchResult, BatchStore
from inferd.store.batches_cli import add_batches_parser, batches_main
from inferd.store.db import Database, DbStats, StoreCorrupt, StoreError, StoreLocked, StoreUnavailable
from inferd.store.files import FileRecord, FileStore, file_insert_statement
from inferd.store.idempotency import Claim, IdempotencyStore, StoredResponse
from inferd.store.owner import owner as process_owner
from inferd.store.ledger import Ledger, LedgerRow, UsageFilter, UsageTotal
from inferd.store.responses import ResponseStore, StoredConversation
from inferd.store.sqlite import SqliteDatabase
from inferd.store.transcripts import Transcript, Transcripts
from inferd.store.usage_cli import add_usage_parser, usage_main
from inferd.store.usage_export import UsageArgumentError, rows_text, totals_text, usage_filter

__all__ = [
    "Claim", "Database", "DbStats", "IdempotencyStore", "Ledger", "LedgerRow", "SqliteDatabase", "StoreCorrupt",
    "StoreError", "StoreLocked", "StoreUnavailable", "StoredResponse", "UsageArgumentError", "UsageFilter",
    "UsageTotal", "add_usage_parser", "open_database", "rows_text", "totals_text", "usage_filter", "usage_main",
]
__all__ += ["BatchError", "BatchRecord", "BatchResult", "BatchStore", "FileRecord", "FileStore",
            "add_batches_parser", "batches_main", "file_insert_statement", "Transcript", "Transcripts"]
__all__ += ["ResponseStore", "StoredConversation", "process_owner"]


def open_database(config: StoreConfig, *, readonly: bool = False) -> Database:
    """The Database `config` ([store]) names, not opened yet: SQLite at config.path (already absolute),
    or PostgreSQL at config.dsn (psycopg is imported only then). `readonly` (SQLite): reads beside a
    running daemon, for `inferd usage`."""
    if config.backend == "postgres":
        from inferd.store.postgres import PostgresDatabase

        return PostgresDatabase(config.dsn, max_pending_writes=config.max_pending_writes)
    if not config.path:
        raise StoreError("store.path: no SQLite file named (the config resolves it under server.state_dir)")
    return SqliteDatabase(config.path, synchronous=config.synchronous, commit_interval_ms=config.commit_interval_ms,
                          commit_rows=config.commit_rows, max_pending_writes=config.max_pending_writes,
                          readonly=readonly)
