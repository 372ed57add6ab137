"""The node's live tenancy objects: who a key belongs to, each tenant's quota, one admission queue per engine.

ServerState holds one `Tenancy`. The daemon builds it at startup (reading the keys file), creates the
queues of the engines it started, and closes it before the engines on shutdown (queued requests get
503 `draining`). Engines that appear later (a reload loading a new version) get their queue on first
use. A config reload calls `reconfigure`, which swaps tenants and policy without dropping anything
queued or any quota already charged. `start` also starts the keys-file poll (inferd.tenancy.key_reload):
keys created or revoked while serving take effect within about a second, no SIGHUP needed.

The request path (inferd.api.pipeline.admit) uses: `authenticator`, `tenants`, `quota` and `queue_for`.
Metrics read `metrics_snapshot()` at scrape time, so nothing here is counted twice on the hot path.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from inferd.admission import AdmissionQueue, AdmissionRejected
from inferd.config import DEFAULT_TENANT, TenantRegistry
from inferd.engine import Engine
from inferd.observability import get_logger
from inferd.tenancy.budget import Budgets
from inferd.tenancy.key_reload import AuditSink, KeyReloader
from inferd.tenancy.keys import Authenticator, KeyStore, load_authenticator
from inferd.tenancy.keys_file import KeyFileError
from inferd.tenancy.quota import Quota
from inferd.tenancy.refusals import MAX_WAIT_S, Pacer

if TYPE_CHECKING:
    from inferd.config import Config

Clock = Callable[[], float]
log = get_logger("inferd.tenancy")


def many_senders(config: Config) -> bool:
    """Whether requests may come from more than one tenant: API keys, client certificates naming a tenant
    other than the anonymous one, or cluster peers forwarding their callers'. With auth mode "none" and
    none of those, every request is the anonymous tenant's: admission keeps no slots for anyone else."""
    tls = config.server.tls
    named = set(tls.tenant_by_subject.values()) if tls is not None else set()
    return (config.auth.mode != "none" or bool(named - {config.auth.anonymous_tenant})
            or config.cluster is not None)


_UNBOUNDED = 2 ** 62


def tenant_registry(config: Config) -> TenantRegistry:
    """The config's tenants. On a node where every request is the anonymous tenant's (see many_senders),
    that tenant, unless configured by name, has no per-tenant caps on concurrency and queueing: it is the
    only sender, so they would refuse a single client's concurrency (an async SDK with 100 streams) that
    the node's own admission queue ([admission] max_queued_*) is there to bound."""
    shared = many_senders(config)
    tenants = dict(config.tenants)
    anonymous = config.auth.anonymous_tenant
    if not shared and anonymous not in tenants:
        base = tenants.get("default", DEFAULT_TENANT)
        # Queue bounds that never bind before the node's: a full node is its 503 node_full, not a tenant's 429
        tenants[anonymous] = msgspec.structs.replace(
            base, max_concurrent_requests=None, max_queued_requests=_UNBOUNDED, max_queued_tokens=_UNBOUNDED)
    return TenantRegistry(tenants, shared=shared)


class _Queue:
    __slots__ = ("model", "engine", "queue")

    def __init__(self, model: str, engine: Engine, queue: AdmissionQueue) -> None:
        self.model = model
        self.engine = engine
        self.queue = queue


class Tenancy:
    """Authentication, tenant registry, quota and the admission queues of one node. Loop thread only
    (construction reads the keys file: do it at startup, or off the loop)."""

    def __init__(self, config: Config, *, authenticator: Authenticator | None = None,
                 quota_clock: Clock = time.monotonic, keys_poll_interval_s: float | None = None) -> None:
        self.config = config
        self.tenants = tenant_registry(config)
        # Config paths are already absolute (inferd.config.load_config resolves them); "." only matters for
        # a Config built in code with relative paths.
        self.authenticator = authenticator or load_authenticator(config.auth, Path("."))
        self.quota = Quota(self.tenants, clock=quota_clock)
        self.budgets = Budgets(self.tenants)         # spend loaded from the ledger by the daemon at start
        self.refusals = Pacer(0, 0, clock=quota_clock)   # refused requests paced (front-end fairness)
        self._pace(config)
        self._queues: dict[int, _Queue] = {}          # id(engine) -> its queue
        self._rejections: dict[str, dict[str, int]] = {}   # per label: refusals made before quota/admission
        self._closed = False
        self._tasks: set[asyncio.Task] = set()
        self.keys = KeyReloader(self._key_store, interval_s=keys_poll_interval_s)

    def _key_store(self) -> KeyStore | None:
        return self.authenticator.store

    # -- admission queues -------------------------------------------------------------------
    def start(self, engines: Mapping[str, Engine], *, audit: AuditSink | None = None) -> None:
        """Create (and start) the queues of these engines now, so metrics show them from the start, and
        start polling the keys file; key changes (and malformed files) are recorded in `audit`."""
        for model, engine in engines.items():
            self.queue_for(model, engine)
        if audit is not None:
            self.keys.audit = audit
        self.keys.start()

    def queue_for(self, model: str, engine: Engine) -> AdmissionQueue:
        """The admission queue in front of `engine` (created on first use; needs the running loop)."""
        entry = self._queues.get(id(engine))
        if entry is not None and entry.engine is engine:
            return entry.queue
        if self._closed:
            raise AdmissionRejected.draining()
        queue = AdmissionQueue(engine, self.config.admission, self.tenants)
        queue.start()
        self._queues[id(engine)] = _Queue(model, engine, queue)
        return queue

    def queues(self) -> Iterable[tuple[str, Engine, AdmissionQueue]]:
        return [(e.model, e.engine, e.queue) for e in self._queues.values()]

    async def close(self) -> None:
        """Stop every dispatcher; queued requests get 503 `draining`. Running streams are untouched.
        Idempotent."""
        self._closed = True
        await self.keys.close()
        for task in list(self._tasks):
            task.cancel()
        entries = list(self._queues.values())
        await asyncio.gather(*(e.queue.close() for e in entries), *self._tasks, return_exceptions=True)

    async def retire(self, engine: Engine) -> None:
        """An engine is being unloaded (reload): close its queue; its metrics totals are dropped."""
        entry = self._queues.pop(id(engine), None)
        if entry is not None and entry.engine is engine:
            await entry.queue.close()

    # -- reload -----------------------------------------------------------------------------
    def reconfigure(self, config: Config, authenticator: Authenticator | None = None) -> None:
        """Swap in a reloaded config's tenants and admission policy. Queued requests and charged quota
        carry over. Keys are re-read off the loop (new and revoked keys take effect a moment later);
        a changed [auth] table gets a new authenticator, also built off the loop, unless one is given."""
        old_auth = self.config.auth
        self.config = config
        self.tenants = tenant_registry(config)
        self.quota.set_tenants(self.tenants)
        self.budgets.tenants = self.tenants
        self._pace(config)
        for entry in self._queues.values():
            entry.queue.set_tenants(self.tenants)
            entry.queue.policy = config.admission
        if authenticator is not None:
            self._use(authenticator, "SIGHUP")
        elif config.auth != old_auth:
            self._background(self._swap_authenticator(config))
        else:
            self._background(self.refresh_keys("SIGHUP"))

    def _pace(self, config: Config) -> None:
        s = config.server
        # A paced request waits with its body unread: well inside the listener's body timeout.
        self.refusals.configure(s.refused_bytes_per_s, s.refused_burst_bytes, min(MAX_WAIT_S, s.body_timeout_s / 2))

    async def check_keys(self, config: Config) -> Authenticator | None:
        """Before a reload applies anything: re-read the keys file now (new and revoked keys take
        effect), or, when [auth] changed, build the new authenticator off the loop for `reconfigure`.
        Raises KeyFileError for a malformed keys file: the reload is refused and the old keys stay."""
        if config.auth != self.config.auth:
            return await asyncio.to_thread(load_authenticator, config.auth, Path("."))
        await self.keys.reload("SIGHUP")
        return None

    async def _swap_authenticator(self, config: Config) -> None:
        auth = await asyncio.to_thread(load_authenticator, config.auth, Path("."))
        if self.config is config:           # a newer reload did not overtake this one
            self._use(auth, "SIGHUP")

    def _use(self, authenticator: Authenticator, reason: str) -> None:
        old, self.authenticator = self.authenticator.store, authenticator
        self.keys.replaced(old, authenticator.store, reason)

    def _background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and isinstance(task.exception(), KeyFileError):
            return                          # the key reloader logged, counted and audited it
        if not task.cancelled() and task.exception() is not None:   # keep the old keys; say why
            log.error("keys_reload_failed", error=str(task.exception()),
                      message="the previous keys stay in effect")

    async def settled(self) -> None:
        """Wait until background work a reconfigure started (re-reading keys) is done."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def refresh_keys(self, reason: str = "refresh") -> bool:
        """Re-read the keys file now if it changed (new or revoked keys). True if re-read. Raises
        KeyFileError for a malformed file (the old keys stay)."""
        generation = self.keys.generation
        await self.keys.reload(reason)
        return self.keys.generation > generation

    # -- accounting -------------------------------------------------------------------------
    def count_rejection(self, tenant: str, reason: str) -> None:
        """A refusal decided before quota and admission (a tenant limit: `limit`, `model_not_allowed`)."""
        row = self._rejections.setdefault(self.tenants.label(tenant), {})
        row[reason] = row.get(reason, 0) + 1

    def _by_label(self, counts: dict[str, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for tenant, n in counts.items():
            label = self.tenants.label(tenant)
            out[label] = out.get(label, 0) + n
        return out

    def metrics_snapshot(self) -> dict:
        """Everything the per-tenant Prometheus series show (inferd.observability.tenant_metrics reads it at
        scrape time): `quota` (Quota.snapshot), `rejections` (label -> reason -> n, made here), `paced`
        (label -> refused body bytes and requests delayed by the refusal pacer), and `queues`:
        one (model, version, AdmissionQueue.snapshot()) per engine; `keys_reloads`: result -> n, the keys
        file re-reads that changed keys ("success") or found the file malformed ("error")."""
        queues = [(e.model, e.engine.info.version, e.queue.snapshot()) for e in self._queues.values()]
        budgets = {self.tenants.label(t): used for t, used in self.budgets.snapshot().items()}
        pacer = self.refusals
        paced = {"refused_bytes": self._by_label(pacer.refused_bytes), "delayed": self._by_label(pacer.delayed)}
        return {"paced": paced, "quota": self.quota.snapshot(),
                "rejections": {k: dict(v) for k, v in self._rejections.items()},
                "queues": queues, "keys_reloads": dict(self.keys.counts), "budgets": budgets}
