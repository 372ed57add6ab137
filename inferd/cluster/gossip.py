"""The gossip node: one UDP socket, the SWIM probe loop, dissemination, push-pull sync and load reports.

Every `probe_interval_s` the next member (inferd.cluster.membership.Membership.next_probe) gets a Ping;
no Ack within `probe_timeout_s` sends a PingReq to `indirect_probes` helpers, who ping it for us and
relay its Ack (or a Nack); no Ack by the end of the interval: `probe_failed` (suspect). Pending
membership updates piggyback on every datagram sent, and every `gossip_interval_s` go to
`gossip_nodes` random peers in a Broadcast. Joining push-pulls with every seed, and partition healing
re-joins seeds and push-pulls with dead members (inferd.cluster.joining); every `sync_interval_s` one
random known member (dead included) gets a full push-pull, and a member this node hears of from a
third node (new, or back from dead) gets one too, so a cold start converges in one round. Every
`load_interval_s` this node's own load report goes to every live peer, split into parts that fit a
datagram. Datagrams are sealed (encrypted for the node id they are sent to) and opened by
inferd.cluster.wire: a bad one is counted by reason and dropped; nothing a peer sends can raise out
of the receive path.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inferd.cluster.joining import Joiner
from inferd.cluster.membership import Membership, MembershipStats
from inferd.cluster.messages import (
    Ack,
    Body,
    Broadcast,
    Leave,
    Load,
    Nack,
    Packet,
    Ping,
    PingReq,
    State,
    Sync,
    TenantDemand,
    VersionLoad,
)
from inferd.cluster.probe import (RTT_BUCKETS, Endpoint, Prober, address, cancel_all, host_port, load_parts, log,
                                 pack)
from inferd.cluster.wire import REJECT_REASONS, Keyring, Opener, Rejected, Sealer
from inferd.config import ClusterConfig

LoadReport = Callable[[], tuple[tuple[VersionLoad, ...], tuple[TenantDemand, ...]]]
LoadSink = Callable[[str, Load], None]        # (sender node id, one part of its report)

GOSSIP_TO_DEAD_PROBES = 30     # broadcasts still reach a dead member this many probe intervals (so it can refute)


PUSH_PULL_REASONS = ("join", "periodic", "reconnect", "new_member")


class GossipStats(MembershipStats):
    """Plain counters (the metrics collector reads them at scrape time); the membership's own included."""

    def __init__(self) -> None:
        super().__init__()
        self.push_pulls = dict.fromkeys(PUSH_PULL_REASONS, 0)   # Syncs sent wanting a reply, by why
        self.sent = 0
        self.received = 0
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)   # reason -> n (every reason, so metrics show zeros)
        self.probes = 0
        self.indirect_probes = 0
        self.probe_failures = 0
        self.probe_rtt_count = 0                    # acked direct probes, and the sum of their round trips
        self.probe_rtt_sum_s = 0.0
        self.probe_rtt_buckets: dict[float, int] = dict.fromkeys(RTT_BUCKETS, 0)  # upper bound (s) -> acked at or under


class Gossip:
    """One node of the cluster's gossip. Loop thread only; `start()` inside the running loop."""

    def __init__(self, config: ClusterConfig, keyring: Keyring, *, http_url: str,
                 load_report: LoadReport | None = None, on_load: LoadSink | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self._config = config
        self._keyring = keyring
        self._http_url = http_url
        self._load_report = load_report
        self._on_load = on_load
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()
        self.stats = GossipStats()
        self.drop_rate = 0.0
        self._node_id, self._host = config.node_id, config.advertise_host or config.bind_host   # restart-only
        self._address: tuple[str, int] = (config.bind_host, config.bind_port)
        self._opener = Opener(keyring, node_id=self._node_id or "", window_s=config.timestamp_window_s,
                              wall_clock=wall_clock)
        self._sealer: Sealer | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._protocol: Endpoint | None = None
        self._prober: Prober | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._joiner: Joiner | None = None
        self._leaving = False
        self._closed = False

    membership: Membership          # set by start() (the node id needs the bound port when bind_port = 0)
    stats: GossipStats
    drop_rate: float                # benchmarks only: this fraction of outgoing datagrams is dropped on purpose

    @property
    def node_id(self) -> str:
        """config.node_id, else "advertise_host:port" with the bound port."""
        return self._node_id or host_port(self._host, self._address[1])

    @property
    def address(self) -> tuple[str, int]:
        """The bound gossip socket (host, port)."""
        return self._address

    async def start(self) -> None:
        """Bind the socket (OSError if taken), create the membership, start the loops and join the seeds
        in the background (joining never blocks the start)."""
        if self._transport is not None or self._closed:
            raise RuntimeError("gossip: start() once, before close()")
        c, loop = self._config, asyncio.get_running_loop()
        transport, protocol = await loop.create_datagram_endpoint(
            lambda: Endpoint(self._receive), local_addr=(c.bind_host, c.bind_port))
        self._transport, self._protocol = transport, protocol
        self._address = tuple(transport.get_extra_info("sockname")[:2])
        self._opener.node_id = self.node_id         # with the bound port when node_id is not configured
        try:
            self._sealer = Sealer(self.node_id, self._keyring, wall_clock=self._wall_clock)
            self.membership = Membership(self.node_id, host_port(self._host, self._address[1]), self._http_url, c,
                                         clock=self._clock, rng=self._rng, stats=self.stats)
        except BaseException:
            transport.close()
            raise
        self._prober = Prober(self.membership, self._send, self.stats, config=lambda: self._config,
                              leaving=lambda: self._leaving, clock=self._clock, rng=self._rng)
        self._joiner = Joiner(self.membership, self._push_pull_to, own={self._address, (self._host, self._address[1])},
                              family=transport.get_extra_info("socket").family, config=lambda: self._config,
                              clock=self._clock, rng=self._rng)
        self._tasks = [
            loop.create_task(self._prober.loop(), name="gossip-probe"),
            loop.create_task(self._every(lambda: self._config.probe_interval_s / 2, self._tick), name="gossip-tick"),
            loop.create_task(self._every(lambda: self._config.gossip_interval_s, self._broadcast), name="gossip-bcast"),
            loop.create_task(self._every(lambda: self._config.sync_interval_s, self._joiner.push_pull),
                             name="gossip-sync"),
            loop.create_task(self._every(lambda: self._config.load_interval_s, self._send_load), name="gossip-load"),
            loop.create_task(self._every(lambda: self._config.reconnect_interval_s, self._joiner.reconnect),
                             name="gossip-reconnect"),
        ]
        self._joiner.join(c.seeds)
        log.info("gossip_started", node=self.node_id, address=host_port(*self._address), seeds=list(c.seeds))

    def reconfigure(self, config: ClusterConfig) -> None:
        """A reload: timings and multipliers apply from the next interval; new seeds are joined."""
        old, self._config = self._config, config
        self._opener.window_s = config.timestamp_window_s
        if self._transport is None or self._closed:
            return
        self.membership.config = config
        if self._joiner is not None:
            self._joiner.join([s for s in config.seeds if s not in old.seeds])

    async def leave(self, timeout_s: float = 1.0) -> None:
        """Announce a graceful departure: the `left` claim to every live peer (a Leave datagram each) and
        in the broadcast queue; returns after at most `timeout_s` of gossiping it.

        It returns early once every live peer got its Leave datagram and the claim has piggybacked its
        full retransmit count (left the dissemination queue). A leaving node probes and reports load no more."""
        if self._transport is None or self._closed:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if not self._leaving:
            self._leaving = True
            claim = self.membership.leave()
            for peer in self.membership.live():
                self._send(Leave(claim.incarnation), peer.addr, peer.node)

        def unsent() -> bool:                       # nobody left to tell, or the claim told its full count
            return bool(self.membership.live()) and any(u.node == self.node_id for u in self.membership.pending())

        while (left := deadline - loop.time()) > 0 and unsent():
            await asyncio.sleep(min(self._config.gossip_interval_s, left))

    async def close(self) -> None:
        """Stop the loops and close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await cancel_all(self._tasks)
        if self._joiner is not None:
            await self._joiner.close()
        if self._prober is not None:
            await self._prober.close()
        if self._transport is not None and self._protocol is not None:
            self._transport.close()
            await asyncio.wait([self._protocol.closed], timeout=1.0)

    # -- sending ------------------------------------------------------------------------------
    def _send(self, body: Body, to: str | tuple[str, int], receiver: str) -> None:
        """Seal `body` for node `receiver` (at address `to`) with as many pending updates as fit and send it
        (fire and forget). `receiver` "": only a Sync to a seed whose node id is not known yet."""
        addr = address(to) if isinstance(to, str) else to
        transport = self._transport
        if addr is None or transport is None or transport.is_closing() or self._sealer is None:
            return
        pending = self.membership.pending()
        try:
            data, n = self._sealer.seal(body, pending, receiver)
        except ValueError:
            log.debug("gossip_unsendable", body=type(body).__name__)
            return
        if n:
            self.membership.sent(pending[:n])
        if self.drop_rate and self._rng.random() < self.drop_rate:
            return
        transport.sendto(data, addr)
        self.stats.sent += 1

    def _fits(self, body: Body) -> bool:
        return self._sealer is not None and self._sealer.fits(body)

    def _send_sync(self, to: tuple[str, int] | str, receiver: str, *, reply: bool) -> None:
        members = self.membership.snapshot()
        for i, run in enumerate(pack(members, lambda run: Sync(tuple(run), reply), self._fits)):
            self._send(Sync(tuple(run), reply and i == 0), to, receiver)        # one reply is enough

    def _push_pull_to(self, to: tuple[str, int] | str, reason: str, receiver: str) -> None:
        """A Sync wanting the receiver's table back, counted by `reason` (PUSH_PULL_REASONS)."""
        self.stats.push_pulls[reason] += 1
        self._send_sync(to, receiver, reply=True)

    # -- receiving ----------------------------------------------------------------------------
    def _receive(self, data: bytes, source: Any) -> None:
        self.stats.received += 1                    # every datagram; those dropped are also in `rejected`
        try:
            packet = self._opener.open(data)
        except Rejected as e:
            self._reject(e.reason)
            return
        except Exception:                          # Opener promises only Rejected; never let it out anyway
            log.debug("gossip_open_failed", exc_info=True)
            self._reject("malformed")
            return
        if packet.sender == self.node_id or self._closed:
            return
        try:
            for update in packet.updates:
                self.membership.apply(update)
            self._handle(packet, (source[0], source[1]))
            if self._joiner is not None:
                self._joiner.arrivals(packet.sender)
        except Exception as e:
            log.debug("gossip_packet_failed", sender=packet.sender, body=type(packet.body).__name__, error=repr(e))
            self._reject("malformed")

    def _reject(self, reason: str) -> None:
        self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1

    def _handle(self, packet: Packet, source: tuple[str, int]) -> None:
        body, prober = packet.body, self._prober
        if prober is None:                         # not started: _receive runs only once the socket is bound
            return
        if isinstance(body, Ping):
            if body.target == self.node_id:         # a stale address may reach someone else: no ack then
                self._send(Ack(body.probe, self.node_id), source, packet.sender)
        elif isinstance(body, Ack):
            prober.acked(body, packet.sender)
        elif isinstance(body, PingReq):
            prober.relay(body, source, packet.sender)
        elif isinstance(body, Nack):
            prober.nacked(body)
        elif isinstance(body, Sync):
            for member in body.members:
                self.membership.apply(member)
            if body.reply:
                self._send_sync(_reply_address(packet.sender, body, source), packet.sender, reply=False)
            elif self._joiner is not None:
                self._joiner.answered(source, packet.sender)
        elif isinstance(body, Load):
            if self._on_load is not None:
                self._on_load(packet.sender, body)
        elif isinstance(body, Leave):
            self.membership.apply_leave(packet.sender, body.incarnation)
        # Broadcast: nothing but its updates, applied above

    # -- the periodic work --------------------------------------------------------------------
    async def _every(self, period: Callable[[], float], action: Callable[[], Awaitable[None] | None]) -> None:
        while True:
            await asyncio.sleep(period())
            try:
                done = action()
                if done is not None:        # an async action (reconnect) is awaited before the next period
                    await done
            except Exception:
                log.exception("gossip_loop_failed", action=action.__name__)

    def _tick(self) -> None:
        for node in self.membership.tick():
            log.info("gossip_member_dead", node=node)
        if self._joiner is not None:
            self._joiner.retry()

    def _broadcast(self) -> None:
        if not self.membership.pending():
            return
        now, recently = self._clock(), GOSSIP_TO_DEAD_PROBES * self._config.probe_interval_s
        peers = [m for m in self.membership.members()
                 if m.state in (State.ALIVE, State.SUSPECT) or (m.state == State.DEAD and now - m.since < recently)]
        for peer in self._rng.sample(peers, min(self._config.gossip_nodes, len(peers))):
            self._send(Broadcast(), peer.addr, peer.node)

    def _send_load(self) -> None:
        if self._load_report is None or self._leaving or not (peers := self.membership.live()):
            return
        bodies = load_parts(*self._load_report(), self._fits)
        for peer in peers:
            for body in bodies:
                self._send(body, peer.addr, peer.node)


def _reply_address(sender: str, sync: Sync, source: tuple[str, int]) -> str | tuple[str, int]:
    """Where a push-pull's answer goes: the address the sender claims for itself in it (a snapshot starts
    with the sender's own claim), not the datagram's source, which anyone can forge. A join to a seed
    names no receiver, so any node opens a captured copy: answered at its source, a copy replayed to
    every node with a victim's address would send the victim every node's table."""
    own = sync.members[0] if sync.members else None
    return own.addr if own is not None and own.node == sender else source
