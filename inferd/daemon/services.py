"""The daemon's services, each an async context manager over the DaemonContext, and `SERVICES`: the one
list of them, in the order they start. Each sets up before its `yield` and tears down after it; the daemon
enters them in order and leaves them in reverse (aiohttp's cleanup_ctx habit), so the store that every
request records into closes last, and the engines close before the HTTP runner cleans up.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from inferd.api import StoreServices, build_state
from inferd.jobs import BatchRunner, listener_url
from inferd.cluster import Cluster
from inferd.daemon.context import DaemonContext
from inferd.daemon.engines import model_versions
from inferd.daemon.listen import http_runner, listen_socket, site
from inferd.daemon.purge import Purger
from inferd.daemon.reclaim import dead_claims
from inferd.daemon.starting import starting_site
from inferd.observability import Tracing, get_logger
from inferd.store import ensure_reserve, open_database, pinging
from inferd.tenancy import Tenancy, load_spend

log = get_logger("inferd.daemon")


@contextlib.asynccontextmanager
async def durable_store(ctx: DaemonContext) -> AsyncIterator[None]:
    """The [store] database, open (StoreCorrupt / StoreLocked / StoreError name it); closed last, after
    requests still finishing have recorded their rows."""
    config = ctx.config
    if config.store.backend == "sqlite" and not config.store.path:
        # A Config built in code, without a file (embedders, tests): no state directory to put it in.
        log.warning("store_disabled", message="no state directory: no usage ledger, budgets from zero, "
                    "no Idempotency-Key or Batch API")
        yield
        return
    database = open_database(config.store)
    await database.open()
    log.info("store_opened", backend=database.dialect, where=database.where)
    if not await ensure_reserve(database) and database.dialect == "sqlite":     # for deletes on a full disk
        log.warning("store_reserve_missing", where=database.where, message="no room for the disk reserve now")
    ctx.storage = StoreServices.over(database, config.store)
    try:
        async with pinging(database, config.store.ping_interval_s, config.store.ping_timeout_s):
            yield
    finally:
        await database.close()


@contextlib.asynccontextmanager
async def tracing(ctx: DaemonContext) -> AsyncIterator[None]:
    """[tracing]: spans leave from the SDK's thread; what is queued goes out at exit."""
    t = ctx.config.tracing
    if t is None:
        yield
        return
    ctx.tracing = Tracing(endpoint=t.endpoint, service_name=t.service_name, sample_ratio=t.sample_ratio,
                          headers=t.headers, timeout_s=t.timeout_s)
    try:
        yield
    finally:
        await asyncio.to_thread(ctx.tracing.shutdown)


@contextlib.asynccontextmanager
async def node_state(ctx: DaemonContext) -> AsyncIterator[None]:
    """The state, whole: the tenancy (a bad keys file fails the start, naming it), the routing control
    plane, the cluster (with [cluster]; it starts later). The audit log closes last of what records in it."""
    cfg = ctx.config
    tenancy = await asyncio.to_thread(Tenancy, cfg)
    cluster = None
    if cfg.cluster is not None:
        url_host = cfg.cluster.advertise_host or ctx.host
        url_host = f"[{url_host}]" if ":" in url_host else url_host
        scheme = "https" if ctx.tls is not None else "http"
        cluster = Cluster(cfg.cluster, tenancy, http_url=f"{scheme}://{url_host}:{ctx.port}")
    ctx.state = build_state(cfg, engine_factory=ctx.engine_factory, tenancy=tenancy, storage=ctx.storage,
                            cluster=cluster, tracing=ctx.tracing)
    try:
        yield
    finally:
        ctx.state.control.close()


@contextlib.asynccontextmanager
async def admission(ctx: DaemonContext) -> AsyncIterator[None]:
    """A queue per engine and the keys-file poll (audited); closed before the engines: requests still
    queued get 503 `draining`."""
    state = ctx.state
    state.tenancy.start(state.engines, audit=state.control.audit)
    try:
        yield
    finally:
        await state.tenancy.close()


@contextlib.asynccontextmanager
async def cluster(ctx: DaemonContext) -> AsyncIterator[None]:
    """[cluster]: gossip and spillover, started before the site so a request never sees it half started."""
    node = ctx.state.cluster
    if node is None:
        yield
        return
    try:
        await node.start()
        yield
    finally:
        await node.close()


@contextlib.asynccontextmanager
async def batch_runner(ctx: DaemonContext) -> AsyncIterator[None]:
    """The Batch API's runner, which posts each line to this node's listener (it has no client
    certificate of its own, so not where the listener requires one)."""
    state = ctx.state
    server_tls = state.config.server.tls
    mtls_required = (server_tls is not None and server_tls.client_ca_file is not None
                     and server_tls.client_cert == "required")
    if state.storage is None or not ctx.run_batches or mtls_required:
        if state.storage is not None and mtls_required:
            log.warning("batch_runner_off", message="the listener requires client certificates, which the "
                        "Batch API's runner has none of: batches are accepted but not run on this node")
        yield
        return
    metrics, tls = state.metrics, ctx.tls is not None
    runner = BatchRunner(state, listener_url(ctx.host, ctx.port, tls=tls), ssl_context=False if tls else None,
                         on_result=lambda batch_id, result: metrics.count_batch_line(result.ok),
                         on_end=lambda batch_id, status: metrics.count_batch_end(status))
    await runner.start()
    try:
        yield
    finally:
        await runner.close()


@contextlib.asynccontextmanager
async def purge(ctx: DaemonContext) -> AsyncIterator[None]:
    """Expired transcripts, idempotency records and cached responses (inferd.daemon.purge)."""
    ctx.purger = Purger(ctx.state, ctx.purge_every_s)
    async with _task(ctx.purger.run()):
        yield


@contextlib.asynccontextmanager
async def spend_so_far(ctx: DaemonContext) -> AsyncIterator[None]:
    """Budgets survive restarts: each tenant's spend this period, from the ledger."""
    state = ctx.state
    if state.ledger is not None:
        await load_spend(state.tenancy.budgets, state.ledger, state.node_name)
    yield


@contextlib.asynccontextmanager
async def watchdog(ctx: DaemonContext) -> AsyncIterator[None]:
    """systemd's watchdog, pinged from the loop itself (inferd.daemon.sdnotify)."""
    async with _task(ctx.notifier.watchdog_loop()):
        yield


@contextlib.asynccontextmanager
async def _task(coro) -> AsyncIterator[None]:
    task = asyncio.ensure_future(coro)
    try:
        yield
    finally:
        task.cancel()


SERVICES = (
    listen_socket,      # the address checks, TLS, the bound socket: a taken port fails the start at once
    starting_site,      # /healthz 200, /readyz 503 `starting` with each model's progress, until `site`
    durable_store,      # before anything that records into it; closed last
    tracing,
    node_state,         # tenancy, routing control plane, cluster (not started): the ServerState, whole
    http_runner,        # released after the engines close, so open streams end with a final chunk
    model_versions,     # engines loaded and warmed; closed after the queues
    admission,          # a queue per engine, the keys-file poll
    cluster,            # gossip; left during the drain, closed after it
    dead_claims,        # a crashed predecessor's Idempotency-Key claims and batch leases, released
    site,               # the app, listening: the batch runner posts here, peers forward here
    batch_runner,
    purge,
    spend_so_far,
    watchdog,
)
