"""SIGHUP: re-read the config and apply the difference without interrupting a stream.

1. Parse and validate the whole new file (off the loop), then re-read the keys file (off the loop).
   Invalid config or a malformed keys file: nothing changes (the old keys stay); the errors are
   logged, audited (`config.reload_failed`) and `inferd_config_reload_total{result="error"}` counts it.
2. Phase 1, one step on the loop: the new Config object (tenants, quotas, server timeouts) and
   the new routes and weights go live together in one routing-table swap. A route whose new
   targets are not loaded yet keeps its current split until they are (never a 503 gap).
3. New versions load and warm in the background (verified first; a failing one is refused alone).
4. Phase 2, one swap: the final routes, with every rollout's current weights re-applied on top
   (`RolloutManager.overlay`), so a reload never undoes a canary step or a rollback.
5. Versions no longer in the config are retired: no new requests from this instant; each closes
   when its last stream has finished (`VersionManager.retire`).

With `[server.tls]`, step 1 also loads the new certificate and key into a scratch context: one that
does not load refuses the whole reload like an invalid file. Just before phase 1 they go into the
listener's live context (inferd.daemon.tls): new handshakes get the new certificate, open connections
keep theirs.

With `[cluster]`, step 1 also re-reads the cluster key file (one that cannot be read refuses the
reload); the new key and settings apply with phase 1, the old key still accepted for key_grace_s.

Settings that need a restart (listen address, engines_root, the SSE writer processes, TLS on or off, the
client CA, a loaded version's pool sizes, joining or leaving a cluster, the gossip address and node id,
[store], a memory budget turned on or off) are logged as such and otherwise left as they were.

The Reloader knows no subsystem: it runs each step's `check` (off the loop, all before anything
changes; a refusal raises), then each step's `reconfigure`, in the order of `reload_steps`
(inferd.daemon.reload_steps).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec

from inferd.api import ServerState
from inferd.cluster import ClusterKeyError
from inferd.config import CLUSTER_RESTART_ONLY, Config, ConfigError, RoutingConfigError, load_config
from inferd.daemon.tls import RESTART_ONLY_TLS, TlsError
from inferd.observability import SYSTEM_ACTOR, get_logger
from inferd.safety import ClassifierError
from inferd.tenancy import KeyFileError

log = get_logger("inferd.reload")

RESTART_ONLY = ("host", "port", "engines_root", "front_processes")   # writers start with the app
T = TypeVar("T", bound=msgspec.Struct)


class ReloadResult(msgspec.Struct, frozen=True):
    ok: bool
    errors: tuple[str, ...] = ()
    loaded: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()


async def read_config(path: str | Path, current: Config) -> Config:
    """The new file, validated; what needs a restart (the listen address, engines_root, TLS on or off,
    the client-certificate settings) stays as running, and is logged."""
    new = await asyncio.to_thread(load_config, path)
    server, kept = _as_running(new.server, current.server, RESTART_ONLY, "server")
    old_tls, new_tls = current.server.tls, server.tls
    if (old_tls is None) != (new_tls is None):
        server, kept = msgspec.structs.replace(server, tls=old_tls), [*kept, "server.tls"]
    elif old_tls is not None and new_tls is not None:
        tls, kept_tls = _as_running(new_tls, old_tls, RESTART_ONLY_TLS, "server.tls")
        server, kept = msgspec.structs.replace(server, tls=tls), kept + kept_tls
    if (current.server.model_memory_bytes is None) != (server.model_memory_bytes is None):
        # a memory budget on or off changes how every version loads: a restart; a new size applies now
        server = msgspec.structs.replace(server, model_memory_bytes=current.server.model_memory_bytes)
        kept = [*kept, "server.model_memory_bytes"]
    cluster = new.cluster
    if (current.cluster is None) != (cluster is None):      # joining or leaving a cluster: a restart
        cluster, kept = current.cluster, [*kept, "cluster"]
    elif cluster is not None and current.cluster is not None:
        cluster, kept_cluster = _as_running(cluster, current.cluster, CLUSTER_RESTART_ONLY, "cluster")
        kept += kept_cluster
    store = new.store
    if store != current.store:          # the database stays the one opened at start
        store, kept = current.store, [*kept, "store"]
    if kept:
        log.warning("reload_needs_restart", settings=kept,
                    message="these settings apply at the next restart; kept as running")
    return msgspec.structs.replace(new, server=server, cluster=cluster, store=store)


def _as_running(new: T, old: T, keys: tuple[str, ...], path: str) -> tuple[T, list[str]]:
    """`new` with `keys` put back to their running values, and the paths of those that differed."""
    changed = [k for k in keys if getattr(new, k) != getattr(old, k)]
    if changed:
        new = msgspec.structs.replace(new, **{k: getattr(old, k) for k in changed})
    return new, [f"{path}.{k}" for k in changed]


class Reloadable(Protocol):
    """One step of a reload: a service that follows the config."""

    async def check(self, new: Config) -> Any:
        """Validate what `new` asks of this service, off the loop where it reads files, changing nothing;
        raise to refuse the reload. What it returns is passed to `reconfigure`."""

    async def reconfigure(self, new: Config, checked: Any = None) -> dict[str, tuple[str, ...]] | None:
        """Apply `new`; `checked`: what `check` returned, or None when the config was not checked here
        (`Reloader.apply`). May return ReloadResult fields (loaded, failed, retired)."""


class Reloader:
    """Applies reloads one at a time (a SIGHUP during a reload waits for it)."""

    def __init__(self, state: ServerState, steps: Sequence[Reloadable],
                 wait_retired: Callable[[], Awaitable[None]]) -> None:
        self.state = state
        self.steps = tuple(steps)
        self.wait_retired = wait_retired    # tests and shutdown: until every retired version has unloaded
        self._lock = asyncio.Lock()

    async def reload(self, path: str | Path) -> ReloadResult:
        async with self._lock:
            t0 = time.monotonic()
            try:
                new = await read_config(path, self.state.config)
                checked = [await step.check(new) for step in self.steps]
            except ClassifierError as exc:
                return self._refused([f"policies: {exc}"], str(path))
            except ConfigError as exc:
                return self._refused(list(exc.errors), exc.source)
            except KeyFileError as exc:
                return self._refused([f"auth keys: {exc}"], str(path))
            except (RoutingConfigError, TlsError, ClusterKeyError) as exc:
                return self._refused([str(exc)], str(path))
            return await self._apply(new, t0, checked)

    def _refused(self, errors: list[str], source: str) -> ReloadResult:
        log.error("reload_failed", source=source, errors=errors,
                  message="config unchanged; the daemon keeps running as before")
        self.state.control.audit.append(SYSTEM_ACTOR, "config.reload_failed", target="config", reason="SIGHUP",
                                        detail={"source": source, "errors": errors})
        self.state.metrics.config_reloaded(False)
        return ReloadResult(False, tuple(errors))

    async def apply(self, new: Config) -> ReloadResult:
        """Apply a config already validated (no step's `check` runs)."""
        return await self._apply(new, time.monotonic(), [None] * len(self.steps))

    async def _apply(self, new: Config, t0: float, checked: list[Any]) -> ReloadResult:
        changes: dict[str, tuple[str, ...]] = {}
        for step, ready in zip(self.steps, checked):
            changes.update(await step.reconfigure(new, ready) or {})
        self.state.metrics.config_reloaded(True)
        result = ReloadResult(True, (), **changes)
        log.info("reloaded", loaded=list(result.loaded), failed=list(result.failed), retired=list(result.retired),
                 seconds=round(time.monotonic() - t0, 3))
        return result
