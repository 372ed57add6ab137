"""The tables of the store, for both dialects, and the migrations between schema versions.

Every migration is a tuple of statement templates; `{blob}` and `{seq}` are filled per dialect (the only
types that differ). The database records the versions it has applied in `schema_version`, one row each;
`upgrade` gives the statements that bring it from its version to SCHEMA_VERSION, to run in ONE
transaction. A later table (files, batches) is a new tuple appended to _MIGRATIONS, never an edit of an
old one. Columns use portable types only: BIGINT, DOUBLE PRECISION, TEXT and the blob type; booleans are
stored as BIGINT 0/1 (the repositories convert), UTC days as TEXT 'YYYY-MM-DD' computed in Python.
"""
from __future__ import annotations

from inferd.store.db import StoreError

_TYPES = {
    "sqlite": {"blob": "BLOB", "seq": "INTEGER PRIMARY KEY AUTOINCREMENT"},
    "postgres": {"blob": "BYTEA", "seq": "BIGSERIAL PRIMARY KEY"},
}

VERSION_TABLE = ("CREATE TABLE IF NOT EXISTS schema_version "
                 "(version BIGINT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
VERSION_QUERY = "SELECT MAX(version) FROM schema_version"
_RECORD_VERSION = "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)"

_LEDGER = """CREATE TABLE IF NOT EXISTS ledger (
    seq {seq},
    request_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    node TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    stream BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    status BIGINT NOT NULL,
    finish_reason TEXT,
    queue_s DOUBLE PRECISION,
    prefill_s DOUBLE PRECISION,
    decode_s DOUBLE PRECISION,
    total_s DOUBLE PRECISION NOT NULL,
    cost DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION NOT NULL,
    day TEXT NOT NULL
)"""

_IDEMPOTENCY = """CREATE TABLE IF NOT EXISTS idempotency (
    tenant TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    body_sha256 {blob} NOT NULL,
    owner TEXT NOT NULL,
    state TEXT NOT NULL,
    held_until DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    status BIGINT,
    headers TEXT,
    body {blob},
    stream BIGINT,
    PRIMARY KEY (tenant, idem_key)
)"""

# Files of the Batch API: uploads (purpose "batch") and what batches write (purpose "batch_output").
# `seq` orders them (lists are newest first); `id` is the public "file-<hex>".
_FILES = """CREATE TABLE IF NOT EXISTS files (
    seq {seq},
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    status TEXT NOT NULL,
    content {blob} NOT NULL
)"""

# One row per batch; lease_owner/lease_until say which runner (process, node) works on it until when.
_BATCHES = """CREATE TABLE IF NOT EXISTS batches (
    seq {seq},
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    in_progress_at DOUBLE PRECISION,
    finalizing_at DOUBLE PRECISION,
    completed_at DOUBLE PRECISION,
    failed_at DOUBLE PRECISION,
    expired_at DOUBLE PRECISION,
    cancelling_at DOUBLE PRECISION,
    cancelled_at DOUBLE PRECISION,
    expires_at DOUBLE PRECISION NOT NULL,
    total BIGINT NOT NULL,
    completed BIGINT NOT NULL,
    failed BIGINT NOT NULL,
    output_file_id TEXT,
    error_file_id TEXT,
    metadata TEXT,
    errors TEXT,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION
)"""

# A batch line's outcome, recorded once (the primary key) as soon as it is known; the output and error
# files are written from these, ordered by idx, when the batch ends.
_BATCH_RESULTS = """CREATE TABLE IF NOT EXISTS batch_results (
    batch_id TEXT NOT NULL,
    idx BIGINT NOT NULL,
    custom_id TEXT NOT NULL,
    ok BIGINT NOT NULL,
    body {blob} NOT NULL,
    PRIMARY KEY (batch_id, idx)
)"""

# The text of a tenant's requests, kept only for tenants with a retention period, deleted once
# expires_at passes (inferd.store.transcripts).
_TRANSCRIPTS = """CREATE TABLE IF NOT EXISTS transcripts (
    seq {seq},
    request_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    prompt TEXT NOT NULL,
    completion TEXT NOT NULL
)"""

# Responses API objects kept for `store` (inferd.store.responses): the response as served and the
# conversation it ends (chat messages, JSON) that `previous_response_id` continues; per tenant, deleted
# once expires_at (its creation plus the tenant's retention period) passes.
_RESPONSES = """CREATE TABLE IF NOT EXISTS responses (
    seq {seq},
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    previous_response_id TEXT,
    response TEXT NOT NULL,
    conversation TEXT NOT NULL
)"""

# A file's content in order, one row per chunk of at most inferd.store.files.CHUNK_BYTES, written while
# the upload arrives; the `files` row (content left empty) is inserted only once every chunk is, so a
# file is visible whole or not at all. Rows of `files` written before this table keep their `content`.
# Chunks with no `files` row older than an upload may take are an aborted upload's (a crash) and purged.
_FILE_CHUNKS = """CREATE TABLE IF NOT EXISTS file_chunks (
    file_id TEXT NOT NULL,
    idx BIGINT NOT NULL,
    data {blob} NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (file_id, idx)
)"""

# _MIGRATIONS[i] takes a database from version i to version i + 1.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        _LEDGER,
        "CREATE INDEX IF NOT EXISTS ledger_tenant_finished ON ledger (tenant, finished_at)",
        "CREATE INDEX IF NOT EXISTS ledger_day ON ledger (day)",
        _IDEMPOTENCY,
        "CREATE INDEX IF NOT EXISTS idempotency_expires ON idempotency (expires_at)",
    ),
    (   # 2: the Batch API (inferd.store.files, inferd.store.batches)
        _FILES,
        "CREATE INDEX IF NOT EXISTS files_tenant ON files (tenant, seq)",
        _BATCHES,
        "CREATE INDEX IF NOT EXISTS batches_tenant ON batches (tenant, seq)",
        "CREATE INDEX IF NOT EXISTS batches_status ON batches (status)",
        _BATCH_RESULTS,
    ),
    (   # 3: transcripts, for tenants with a retention period (inferd.store.transcripts)
        _TRANSCRIPTS,
        "CREATE INDEX IF NOT EXISTS transcripts_expires ON transcripts (expires_at)",
        "CREATE INDEX IF NOT EXISTS transcripts_tenant ON transcripts (tenant, seq)",
    ),
    (   # 4: stored responses of the Responses API (inferd.store.responses)
        _RESPONSES,
        "CREATE INDEX IF NOT EXISTS responses_expires ON responses (expires_at)",
        "CREATE INDEX IF NOT EXISTS responses_tenant ON responses (tenant, seq)",
    ),
    (   # 5: files stored in chunks, uploads streamed (inferd.store.files)
        _FILE_CHUNKS,
        "CREATE INDEX IF NOT EXISTS file_chunks_created ON file_chunks (created_at)",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)


def _types(dialect: str) -> dict[str, str]:
    try:
        return _TYPES[dialect]
    except KeyError:
        raise ValueError(f"unknown SQL dialect {dialect!r} (expected one of {sorted(_TYPES)})") from None


def ddl(dialect: str) -> list[str]:
    """Every statement creating the current schema from nothing (each one IF NOT EXISTS)."""
    types = _types(dialect)
    return [VERSION_TABLE, *(sql.format(**types) for step in _MIGRATIONS for sql in step)]


def upgrade(dialect: str, current: int | None, *, now: float, where: str) -> list[tuple[str, tuple]]:
    """The statements (with their parameters) that take a database at version `current` (None or 0: no
    tables yet) to SCHEMA_VERSION, recording each version applied; empty when it is up to date. Run them
    in one transaction, after VERSION_TABLE and VERSION_QUERY. A database of a newer inferd is refused."""
    types = _types(dialect)
    current = current or 0
    if current > SCHEMA_VERSION:
        raise StoreError(f"{where}: schema version {current} was written by a newer inferd (this one knows up to "
                         f"{SCHEMA_VERSION}); refusing to use it")
    statements: list[tuple[str, tuple]] = []
    for version in range(current + 1, SCHEMA_VERSION + 1):
        statements.extend((sql.format(**types), ()) for sql in _MIGRATIONS[version - 1])
        statements.append((_RECORD_VERSION, (version, now)))
    return statements
