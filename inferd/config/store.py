"""The `[store]` table: where inferd keeps durable state (usage ledger, idempotency keys, files, batches).

SQLite in the state directory is the default (one node, nothing to install); PostgreSQL (psycopg 3) is
the shared store of a cluster. Only the table and its checks live here; inferd.store does the rest.
Everything here needs a restart (logged when a reload changes it).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from inferd.config.walk import ConfigTable

StoreBackend = Literal["sqlite", "postgres"]
Synchronous = Literal["normal", "full"]
DB_FILE = "inferd.db"          # under server.state_dir unless store.path says otherwise


class StoreConfig(ConfigTable):
    backend: StoreBackend = "sqlite"
    path: str | None = None                 # sqlite: default <server.state_dir>/inferd.db
    dsn: str | None = None                  # postgres: "postgresql://user@host:5432/inferd" (required for it)
    # SQLite's synchronous: "normal" in WAL mode survives a killed process (the promise in docs/store.md);
    # "full" also survives power loss, at a higher commit cost.
    synchronous: Synchronous = "normal"
    commit_interval_ms: float = 50.0        # group commit: writes wait at most this long to be committed...
    commit_rows: int = 1000                 # ... or until this many are pending
    max_pending_writes: int = 20_000        # the writer's queue bound: beyond it writers wait (backpressure)
    idempotency_ttl_s: float = 86_400.0     # Idempotency-Key records expire after this long
    max_file_bytes: int = 104_857_600       # POST /v1/files upload limit (100 MiB)
    # What all uploads on this node together are read, checked and written at: a flood of uploads takes
    # at most this much of the daemon's loop and store writer, whatever their number (TCP backpressure
    # slows the uploaders). 8 MiB/s: a 100 MiB file in about 13 s.
    upload_bytes_per_s: int = 8_388_608
    # After a ledger commit fails for the store's sake (disk full, server gone), new requests get 503
    # store_unavailable for this long before one is let through to try again: none runs unbilled.
    unavailable_retry_s: float = 5.0
    # Every store call gives up after this long (inside a request: sooner, before the request's deadline)
    # with 503 store_unavailable: a store that hangs (a partitioned server) fails requests, never holds them.
    timeout_s: float = 5.0
    # A background ping every ping_interval_s (each given ping_timeout_s): /readyz is 503 store_unavailable
    # from a failed ping or a write failed for the store's sake until a ping succeeds.
    ping_interval_s: float = 1.0
    ping_timeout_s: float = 2.0


def store_errors(s: StoreConfig, path: str = "store") -> list[str]:
    errors: list[str] = []
    if s.backend == "postgres" and not s.dsn:
        errors.append(f"{path}.dsn: required with backend = \"postgres\" "
                      f"(e.g. \"postgresql://inferd@10.0.0.5/inferd\")")
    if s.backend == "sqlite" and s.dsn:
        errors.append(f"{path}.dsn: only with backend = \"postgres\"")
    if s.backend == "postgres" and s.path:
        errors.append(f"{path}.path: only with backend = \"sqlite\"")
    for key in ("commit_interval_ms", "commit_rows", "max_pending_writes", "idempotency_ttl_s", "max_file_bytes",
                "upload_bytes_per_s", "unavailable_retry_s", "timeout_s", "ping_interval_s", "ping_timeout_s"):
        if not getattr(s, key) > 0:
            errors.append(f"{path}.{key}: must be > 0, got {getattr(s, key)}")
    return errors


def resolve_store_paths(s: StoreConfig, resolve: Callable[[str], str], state_dir: str) -> StoreConfig:
    """The SQLite file's path made absolute (default: in the state directory)."""
    if s.backend != "sqlite":
        return s
    return msgspec.structs.replace(s, path=resolve(s.path) if s.path else f"{state_dir}/{DB_FILE}")
