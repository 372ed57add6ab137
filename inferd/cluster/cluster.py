"""The node's cluster: gossip, peers' load hints, quota shares, and whom to spill a request to.

The daemon builds one Cluster when the config has a [cluster] table, starts it once its HTTP listener
is bound (peers forward to that address), reconfigures it on SIGHUP, and on SIGTERM announces its
departure before draining. The API asks it `peer_with_room` (spillover), signs and opens forwarded
requests' identity, and shows `peers_view` at /admin/peers; metrics read `stats` and `counts`.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from inferd.cluster.gossip import Gossip, GossipStats
from inferd.cluster.identity import ForwardedIdentity, UsedTokens, check_body, sign_identity, verify_token
from inferd.cluster.loads import PeerLoads, local_report
from inferd.cluster.membership import Member
from inferd.cluster.messages import Load, State, TenantDemand, VersionLoad
from inferd.cluster.reservations import Reservations
from inferd.cluster.shares import QuotaShares
from inferd.cluster.spends import PeerSpends
from inferd.cluster.keyring import Keyring, load_keys
from inferd.cluster.wire import Rejected
from inferd.config import ClusterConfig
from inferd.engine import Engine
from inferd.observability import get_logger
from inferd.tenancy import Tenancy

log = get_logger("inferd.cluster")
SPILL_CONNECTIONS = 256        # open connections to all peers together (a bound, as every pool has)


class Cluster:
    """One node's view of the cluster. Loop thread only."""

    def __init__(self, config: ClusterConfig, tenancy: Tenancy, *, http_url: str,
                 ready: Callable[[Engine], bool] = lambda engine: engine.healthy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.http_url = config.http_url or http_url
        self._tenancy = tenancy
        self._ready = ready
        self._clock = clock
        self.loads = PeerLoads(config.load_max_age_s, clock)
        self.spends = PeerSpends()
        self.keyring: Keyring | None = None
        self.gossip: Gossip | None = None
        self.http: aiohttp.ClientSession | None = None      # spillover's connections to peers
        self._used = UsedTokens()
        self.spillovers: dict[str, int] = {}       # outcome -> n (inferd.api.pipeline.spill counts them)
        # Peers' slots this node's forwards took since their last hints (inferd.api.pipeline.spill holds them).
        self.reservations = Reservations(lambda: self.loads.max_age_s, clock)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the keys (ClusterKeyError names the file), bind the gossip socket (OSError), join the seeds
        in the background, and take a share of each tenant's limits if quotas are shared."""
        self.keyring = Keyring(await asyncio.to_thread(load_keys, self.config.key_file), clock=self._clock)
        self.gossip = Gossip(self.config, self.keyring, http_url=self.http_url,
                             load_report=self._load_report, on_load=self._heard,
                             clock=self._clock)
        await self.gossip.start()
        self.gossip.membership.on_change = self._changed
        # Budgets count what every peer reported it spent (dead or alive), beside this node's own rows.
        self._tenancy.budgets.set_peers(self.spends.spend)
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=SPILL_CONNECTIONS),
                                          auto_decompress=False)
        self._share_quotas()
        log.info("cluster_started", node=self.node_id, gossip=f"{self.gossip.address[0]}:{self.gossip.address[1]}",
                 seeds=list(self.config.seeds), primary_key=self.keyring.primary_fingerprint,
                 keys=self.keyring.fingerprints())

    async def read_key(self, config: ClusterConfig) -> list[bytes]:
        """A reload's first step, off the loop: the keys in the file it names, primary first
        (ClusterKeyError refuses the reload)."""
        return await asyncio.to_thread(load_keys, config.key_file)

    def reconfigure(self, config: ClusterConfig, keys: list[bytes]) -> None:
        """SIGHUP: timings, seeds, spillover and quota settings, and the key file's keys: the first sends,
        every one is accepted, and one no longer in the file is still accepted for key_grace_s."""
        self.config = config
        self.loads.max_age_s = config.load_max_age_s
        if self.keyring is not None and self.keyring.update(keys, config.key_grace_s):
            log.info("cluster_keys_changed", primary_key=self.keyring.primary_fingerprint,
                     keys=self.keyring.fingerprints(), grace_s=config.key_grace_s)
        if self.gossip is not None:
            self.gossip.reconfigure(config)
        self._share_quotas()

    async def leave(self) -> None:
        """SIGTERM: tell the peers this node is going (they stop spilling to it at once)."""
        if self.gossip is not None:
            await self.gossip.leave()

    async def close(self) -> None:
        self._tenancy.quota.set_share(None)
        self._tenancy.budgets.set_peers(None)
        if self.http is not None:
            await self.http.close()
        if self.gossip is not None:
            await self.gossip.close()

    def _share_quotas(self) -> None:
        quota = self._tenancy.quota
        if not self.config.shared_quotas:
            quota.set_share(None)
            return
        # A reload keeps the shares (and with them this node's last reported demand).
        shares = quota.share if isinstance(quota.share, QuotaShares) else \
            QuotaShares(self.loads, lambda: [m.node for m in self._alive()], self._clock)
        quota.set_share(shares, concurrency=self.config.shared_concurrency)

    def _load_report(self) -> tuple[tuple[VersionLoad, ...], tuple[TenantDemand, ...]]:
        """The load report gossip sends now. Its tenants' demand is also this node's own in its quota
        shares from now on (the figure the peers compute theirs from), and the shares are applied at once."""
        versions, demand = local_report(self._tenancy, self._ready)
        quota = self._tenancy.quota
        if isinstance(quota.share, QuotaShares):
            quota.share.reported(demand)
            quota.reshare()
        return versions, demand

    # -- peers --------------------------------------------------------------------------------
    @property
    def node_id(self) -> str:
        return self.gossip.node_id if self.gossip is not None else "?"

    def _alive(self) -> list[Member]:
        if self.gossip is None:
            return []
        return [m for m in self.gossip.membership.live() if m.state is State.ALIVE]

    def _heard(self, node: str, load: Load) -> None:
        self.loads.heard(node, load)
        self.spends.heard(node, load)

    def _changed(self, member: Member, previous: State | None) -> None:
        if member.state in (State.DEAD, State.LEFT):
            self.loads.forget(member.node)
        log.info("cluster_member", node=member.node, state=member.state.name.lower(),
                 previous=previous.name.lower() if previous is not None else None, incarnation=member.incarnation)

    def peer_with_room(self, model: str, version: str | None, exclude: frozenset[str] = frozenset(),
                       within_s: float | None = None) -> Member | None:
        """The alive peer best placed to start a request for `model` at `version` now: its fresh hint,
        less the slots this node has taken there since (`reservations`), leaves a free sequence slot, and
        its estimated wait is at most `within_s` (default spill_wait_s; shortest wait first, then most
        free slots). `version` None: any version of `model` the peer has loaded (a model cold on this
        node under its memory budget). None when no peer has room."""
        limit = self.config.spill_wait_s if within_s is None else within_s
        now = self._clock()
        best, best_key = None, None
        for m in self._alive():
            if m.node in exclude:
                continue
            for hint, age in self.loads.versions(m.node):
                if hint.model != model or (version is not None and hint.version != version) \
                        or age > self.loads.max_age_s or not hint.ready or hint.est_wait_s > limit:
                    continue
                held = self.reservations.held(m.node, model, hint.version, now - age)
                free = hint.free_slots - held if held is not None else 0
                if free <= 0:
                    continue
                key = (hint.est_wait_s, -free)
                if best_key is None or key < best_key:
                    best, best_key = m, key
        return best

    # -- forwarded requests' identity ----------------------------------------------------------
    def sign(self, ident: ForwardedIdentity) -> str:
        return sign_identity(self._key(), ident)

    def verify(self, token: str) -> ForwardedIdentity:
        """The identity in a forwarded request's token (MAC, expiry and destination checked; its body not
        yet: call `check_body` once read). Raises inferd.cluster.wire.Rejected: "wrong_node" for a token
        sent to another node (a copy captured on its way there, replayed here)."""
        ident = verify_token(self._key(), token)
        if ident.destination != self.node_id:
            raise Rejected("wrong_node", f"the token was for {ident.destination}, not {self.node_id}")
        return ident

    def check_body(self, ident: ForwardedIdentity, body: bytes) -> None:
        """Rejected unless `body` is the one `ident` was signed for, or (replay) its request was already
        accepted: a token is good for one request, so a copy seen on the wire is refused."""
        check_body(ident, body)
        self._used.use(ident)

    def _key(self) -> Keyring:
        if self.keyring is None:
            raise RuntimeError("the cluster is not started")
        return self.keyring

    # -- operator surface ---------------------------------------------------------------------
    @property
    def stats(self) -> GossipStats | None:
        return self.gossip.stats if self.gossip is not None else None

    def queue_depth(self) -> int:
        """Membership claims waiting in the dissemination queue."""
        return self.gossip.membership.queue_depth() if self.gossip is not None else 0

    def counts(self) -> dict[str, int]:
        """Members by state (this node included)."""
        out = {s.name.lower(): 0 for s in State}
        if self.gossip is not None:
            for state, n in self.gossip.membership.counts().items():
                out[state.name.lower()] = n
        return out

    def peers_view(self) -> dict:
        """GET /admin/peers. Per peer: `age_s` since its newest load report was measured (null: none
        heard), `state_for_s` since its state last changed, and its models' hints."""
        now = self._clock()
        peers = []
        members = self.gossip.membership.members() if self.gossip is not None else []
        for m in sorted(members, key=lambda m: m.node):
            models: dict[str, dict] = {}
            for hint, age in self.loads.versions(m.node):
                models.setdefault(hint.model, {})[hint.version] = {
                    "ready": hint.ready, "free_slots": hint.free_slots, "free_kv_blocks": hint.free_kv_blocks,
                    "queued": dict(zip(("interactive", "standard", "batch"), hint.queued)),
                    "est_wait_s": round(hint.est_wait_s, 3), "tokens_per_s": round(hint.tokens_per_s, 1),
                    "age_s": round(age, 3), "stale": age > self.loads.max_age_s}
            age = self.loads.report_age(m.node)
            peers.append({"node_id": m.node, "address": m.addr, "http": m.http, "state": m.state.name.lower(),
                          "incarnation": m.incarnation, "state_for_s": round(now - m.since, 3),
                          "age_s": round(age, 3) if age is not None else None, "models": models})
        share = self._tenancy.quota.share
        shares = {t: round(share(t), 4) for t, _, _ in self._tenancy.quota.demand()} if share is not None else {}
        return {"self": self.node_id, "quota_shares": shares, "peers": peers}
