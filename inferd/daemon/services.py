"""The daemon's services beside the request path: the durable store, the Batch API's runner, the cluster.

Lifecycle (inferd.daemon.lifecycle) opens the store before anything that records into it and starts
the rest once the listener is bound (the runner posts to it; peers forward to it). Each is released
on the lifecycle's exit stack, in reverse: the cluster is left, the runner stops, and the store
closes last, after every request that records a row has ended.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from inferd.api import ServerState
from inferd.jobs import BatchRunner, listener_url
from inferd.cluster import Cluster
from inferd.config import Config
from inferd.observability import get_logger
from inferd.store import Database, Transcripts, open_database
from inferd.tenancy import load_spend

PURGE_INTERVAL_S = 60.0      # how often expired transcripts are deleted (retention periods are hours or days)

log = get_logger("inferd.daemon")


async def open_store(stack: contextlib.AsyncExitStack, config: Config) -> Database | None:
    """The [store] database, open (StoreCorrupt / StoreLocked / StoreError name it), closed last."""
    if config.store.backend == "sqlite" and not config.store.path:
        # A Config built in code, without a file (embedders, tests): no state directory to put it in.
        log.warning("store_disabled", message="no state directory: no usage ledger, budgets from zero, "
                    "no Idempotency-Key or Batch API")
        return None
    store = open_database(config.store)
    await store.open()
    stack.push_async_callback(store.close)      # last out: requests still finishing record their rows
    log.info("store_opened", backend=store.dialect, where=store.where)
    return store


async def start_services(stack: contextlib.AsyncExitStack, state: ServerState, host: str, port: int, tls: bool,
                         *, run_batches: bool = True) -> None:
    """The batch runner, the cluster (with [cluster]) and the budgets' spend so far, once the listener serves."""
    cfg = state.config
    server_tls = cfg.server.tls
    mtls_required = (server_tls is not None and server_tls.client_ca_file is not None
                     and server_tls.client_cert == "required")
    # The runner posts each line to this listener; it has no client certificate of its own.
    if state.store is not None and run_batches and not mtls_required:
        metrics = state.metrics
        batches = BatchRunner(state, listener_url(host, port, tls=tls), ssl_context=False if tls else None,
                              on_result=lambda batch_id, result: metrics.count_batch_line(result.ok),
                              on_end=lambda batch_id, status: metrics.count_batch_end(status))
        await batches.start()
        stack.push_async_callback(batches.close)    # closes after the drain, before the listener and store
    elif state.store is not None and mtls_required:
        log.warning("batch_runner_off", message="the listener requires client certificates, which the "
                    "Batch API's runner has none of: batches are accepted but not run on this node")
    if cfg.cluster is not None:
        url_host = cfg.cluster.advertise_host or host
        url_host = f"[{url_host}]" if ":" in url_host else url_host
        cluster = Cluster(cfg.cluster, state.tenancy, http_url=f"{'https' if tls else 'http'}://{url_host}:{port}")
        stack.push_async_callback(cluster.close)
        await cluster.start()
        state.cluster = cluster
    if state.transcripts is not None:      # retention: expired transcripts go, whichever node wrote them
        purger = asyncio.ensure_future(purge_transcripts(
            state.transcripts, retention_of=lambda tenant: state.tenancy.tenants.get(tenant).retention_s))
        stack.callback(purger.cancel)
    sweeper = asyncio.ensure_future(sweep_cache(state))     # cached text never outlives [cache] ttl_s
    stack.callback(sweeper.cancel)
    if state.ledger is not None:
        await load_spend(state.tenancy.budgets, state.ledger, state.node_name)    # budgets survive restarts


async def purge_transcripts(transcripts: Transcripts, every_s: float = PURGE_INTERVAL_S, *,
                            retention_of: Callable[[str], float] | None = None, clock=time.time) -> None:
    """Delete transcripts past their period, now and every `every_s` seconds: by the expiry each was
    written with, and by each tenant's retention now (`retention_of(tenant)`, 0 for "none"), so a
    shortened period or a tenant back on "none" takes effect at the next pass."""
    while True:
        try:
            gone = await transcripts.purge(clock(), retention_of=retention_of)
            if gone:
                log.info("transcripts_purged", rows=gone)
        except Exception as exc:  # noqa: BLE001 - the purge must outlive any one failure
            log.warning("transcripts_purge_failed", error=str(exc), error_type=type(exc).__name__)
        await asyncio.sleep(every_s)


async def sweep_cache(state: ServerState, every_s: float = PURGE_INTERVAL_S) -> None:
    while True:
        await asyncio.sleep(every_s)
        state.response_cache.sweep()
