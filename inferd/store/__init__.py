"""Durable state: the usage ledger, idempotency keys, files and batches, stored responses, on SQLite or PostgreSQL."""
from __future__ import annotations

from inferd.config import StoreConfig
from inferd.store.batches import BatchError, BatchRecord, BatchResult, BatchStore
from inferd.store.batches_cli import add_batches_parser, batches_main
from inferd.store.db import REQUEST_DEADLINE, Database, DbStats, StoreCorrupt, StoreError, StoreLocked, StoreUnavailable
from inferd.store.db import StoreTimeout
from inferd.store.disk_reserve import ensure_reserve
from inferd.store.file_upload import Upload
from inferd.store.files import CHUNK_BYTES, FileRecord, FileStore, file_insert_statements
from inferd.store.health import pinging
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
            "add_batches_parser", "batches_main", "file_insert_statements", "Transcript", "Transcripts"]
__all__ += ["ResponseStore", "StoredConversation", "process_owner", "REQUEST_DEADLINE", "pinging"]
__all__ += ["CHUNK_BYTES", "Upload", "ensure_reserve", "StoreTimeout"]


OFFLINE_TIMEOUT_S = 600.0


def open_database(config: StoreConfig, *, readonly: bool = False) -> Database:
    """The Database `config` ([store]) names, not opened yet: SQLite at config.path (already absolute),
    or PostgreSQL at config.dsn (psycopg is imported only then). `readonly` (SQLite): reads beside a
    running daemon, for `inferd usage`."""
    # An operator's command (`inferd usage`, `inferd batches`) may read the whole ledger: its reads are
    # bounded, but not by the request path's timeout.
    timeout_s = max(config.timeout_s, OFFLINE_TIMEOUT_S) if readonly else config.timeout_s
    if config.backend == "postgres":
        from inferd.store.postgres import PostgresDatabase

        return PostgresDatabase(config.dsn, max_pending_writes=config.max_pending_writes, timeout_s=timeout_s)
    if not config.path:
        raise StoreError("store.path: no SQLite file named (the config resolves it under server.state_dir)")
    return SqliteDatabase(config.path, synchronous=config.synchronous, commit_interval_ms=config.commit_interval_ms,
                          commit_rows=config.commit_rows, max_pending_writes=config.max_pending_writes,
                          readonly=readonly, timeout_s=timeout_s)
