"""The services that follow a reload, in the order the Reloader checks and then applies them.

    routes      phase 1: the new Config and the routes servable now, in one swap (inferd.daemon.version_reload)
    node        the response cache's size and opted-in tenants, the content policies, the SLOs, shadow prices
    tenancy     keys file re-read (or a new authenticator for a changed [auth]); tenants, quotas, admission,
                and the spend so far of budgets added or changed
    cluster     the key file re-read; timings, seeds, spillover and quota sharing; the old key accepted for
                key_grace_s
    versions    new versions load; phase 2; what left the config retires (inferd.daemon.version_reload)
    tls         the new certificate and key, into the listener's live context: new handshakes get them,
                open connections keep theirs

Every check runs before anything applies, so an invalid policy, keys file, cluster key or certificate
changes nothing. The TLS step is the one exception to "checks change nothing": it is the last check,
and loads the certificate into the live context once every other check has passed, so a file that
changes between its check and its use still refuses the whole reload.
"""
from __future__ import annotations

import asyncio
from typing import Any

from inferd.api import ServerState
from inferd.cluster import Cluster
from inferd.config import Config, TenantRegistry
from inferd.daemon.reload import Reloadable
from inferd.daemon.tls import ListenerTls
from inferd.daemon.version_reload import ModelsReload
from inferd.safety import Policies
from inferd.tenancy import load_spend


def reload_steps(state: ServerState, models: ModelsReload, tls: ListenerTls | None) -> list[Reloadable]:
    steps: list[Reloadable] = [models.routes, NodeReload(state), TenancyReload(state)]
    if state.cluster is not None:
        steps.append(ClusterReload(state.cluster))
    steps.append(models.versions)
    if tls is not None:     # last: its check puts the certificate live once every other check has passed
        steps.append(TlsReload(tls))
    return steps


class NodeReload:
    """What the state builds from the config itself: the response cache, the policies, the SLOs."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def _policies(self, new: Config) -> Policies:
        state = self.state
        return Policies(new.policies, lambda tenant: state.tenancy.tenants.get(tenant))

    async def check(self, new: Config) -> Policies:
        # Loading classifiers imports plugins (and maybe a model): off the loop. ClassifierError: one that
        # does not load refuses the reload.
        return await asyncio.to_thread(self._policies, new)

    async def reconfigure(self, new: Config, checked: Policies | None = None) -> None:
        state = self.state
        state.response_cache.resize(new.cache.max_bytes, new.cache.ttl_s)
        opted_in = TenantRegistry(new.tenants)          # a tenant that opted out takes its text with it
        state.response_cache.retain_tenants(lambda tenant: opted_in.get(tenant).cache_responses)
        state.safety = checked if checked is not None else self._policies(new)
        state.slos.reconfigure(new.slos)
        state.control.shadows.set_prices(new.prices)


class TenancyReload:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def check(self, new: Config) -> Any:
        """The keys file re-read now (KeyFileError refuses the reload), or a changed [auth]'s authenticator."""
        return await self.state.tenancy.check_keys(new)

    async def reconfigure(self, new: Config, checked: Any = None) -> None:
        state = self.state
        state.tenancy.reconfigure(new, checked)
        if state.ledger is not None:      # budgets added or changed: their spend so far
            await load_spend(state.tenancy.budgets, state.ledger, state.node_name)


class ClusterReload:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def check(self, new: Config) -> list[bytes]:
        return await self.cluster.read_key(new.cluster)     # ClusterKeyError refuses the reload

    async def reconfigure(self, new: Config, checked: list[bytes] | None = None) -> None:
        if checked is not None:         # Reloader.apply (a config not checked here) leaves the cluster be
            self.cluster.reconfigure(new.cluster, checked)


class TlsReload:
    def __init__(self, tls: ListenerTls) -> None:
        self.tls = tls

    async def check(self, new: Config) -> Any:
        if new.server.tls is not None:
            await self.tls.check(new.server.tls)
            self.tls.apply(new.server.tls)      # the last check: every other one has passed
        return None

    async def reconfigure(self, new: Config, checked: Any = None) -> None:
        return None
